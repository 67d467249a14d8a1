/*
 * core-sample.h - one sample: running it between snapshots of rusage and
 * /proc/vmstat so that its record (core-record.h) is printed as one JSON
 * line on stdout.
 *
 * The workload measures; the harness adds what every sample must carry
 * (rusage, vmstat deltas, the global page state, errors), so no workload
 * can forget it.  Logs go to stderr; stdout carries samples only.
 */
#ifndef MMWORK_CORE_SAMPLE_H
#define MMWORK_CORE_SAMPLE_H

#include "core-workload.h"

/* usr and sys seconds of all waited-for children so far. */
void mm_children_cpu_s(double *usr, double *sys);

/* Run the workload's sample function once and restore the knobs it set;
 * print the sample unless it is a warm-up.  Returns its non-zero result
 * when it failed. */
int mm_run_sample(struct mm_ctx *ctx, int index, int warmup);

#endif
