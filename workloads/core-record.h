/*
 * core-record.h - what one sample reports: metrics, counts, page state and
 * an exec command's output, written into the sample's context.  The sample
 * driver (core-sample.h) prints the record; the probes that fill it
 * (core-state, core-procfs, core-insns) need only this file.
 */
#ifndef MMWORK_CORE_RECORD_H
#define MMWORK_CORE_RECORD_H

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

#endif
