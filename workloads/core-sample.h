/*
 * core-sample.h - one sample: what a workload reports into it, and running
 * it between snapshots of rusage and /proc/vmstat so that it is printed as
 * one JSON line on stdout.
 *
 * The workload measures; the harness adds what every sample must carry
 * (rusage, vmstat deltas, the global page state, errors), so no workload
 * can forget it.  Logs go to stderr; stdout carries samples only.
 */
#ifndef MMWORK_CORE_SAMPLE_H
#define MMWORK_CORE_SAMPLE_H

#include <stddef.h>

#include "core-workload.h"

/* What one sample reports. */
void mm_metric(struct mm_ctx *ctx, const char *name, double value);
void mm_count(struct mm_ctx *ctx, const char *name, double value);
void mm_state_num(struct mm_ctx *ctx, const char *name, double value);
void mm_state_str(struct mm_ctx *ctx, const char *name, const char *value);
int mm_is_warmup(const struct mm_ctx *ctx);
/* What a command run as the workload printed (exec): the sample carries it
 * as "output", for mmlab to read the command's own figures from. */
void mm_output(struct mm_ctx *ctx, const char *data, size_t len);
/*
 * Whether state probes run (0 with --no-probes).  A state probe (smaps,
 * pagemap, a /proc or sysfs read) walks or reads what the timed code then
 * touches, so it warms it: every probe sits outside the timed windows, on an
 * extra untimed round or after a round's timed sequence, never between two
 * timed phases of one round.  --no-probes removes them all, so that a paired
 * run can show they change no timing (tests/test_workloads.py).
 */
int mm_probes(const struct mm_ctx *ctx);

/* usr and sys seconds of all waited-for children so far. */
void mm_children_cpu_s(double *usr, double *sys);

/* Run the workload's sample function once and restore the knobs it set;
 * print the sample unless it is a warm-up.  Returns its non-zero result
 * when it failed. */
int mm_run_sample(struct mm_ctx *ctx, int index, int warmup);

#endif
