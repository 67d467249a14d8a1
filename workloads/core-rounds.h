/*
 * core-rounds.h - how a workload times itself: per-round durations, their
 * median and their total, the monotonic clock, deadlines, and workers
 * released together.
 *
 * A per-page metric is reported twice: as the median round per page (the
 * one verdicts use, so that a round disturbed by an interrupt or a neighbour
 * cannot move it) and, with the suffix _total, as total time over total
 * pages (the mean, what reproducers and stress-ng print).  Workers start on
 * one edge so that contention between them is measured from the first
 * operation.
 */
#ifndef MMWORK_CORE_ROUNDS_H
#define MMWORK_CORE_ROUNDS_H

#include <stdint.h>

#include "core-workload.h"

/* Per-round durations of one phase. */
struct mm_rounds {
	uint64_t *ns;
	long n, cap;
};
void mm_rounds_add(struct mm_rounds *r, uint64_t ns);
double mm_rounds_median(const struct mm_rounds *r);
void mm_rounds_free(struct mm_rounds *r);

double mm_rounds_total(const struct mm_rounds *r);

/*
 * Round durations of forked workers, pooled: a log-linear histogram whose
 * buckets are 1/128 of a power of two wide (a median read from it is within
 * 0.4 %), filled privately by each worker and added into one in shared
 * memory when the worker is done.  A worker's own histogram must be cleared
 * (mm_hist_clear, which also faults its pages in) before its timed loop.
 */
#define MM_HIST_SUB_BITS 7
#define MM_HIST_MAX_BITS 41		/* up to 2^41 ns (36 min) a round */
#define MM_HIST_BUCKETS ((MM_HIST_MAX_BITS - MM_HIST_SUB_BITS + 1) << MM_HIST_SUB_BITS)
struct mm_hist {
	uint64_t n, sum_ns;
	uint32_t count[MM_HIST_BUCKETS];
};
void mm_hist_clear(struct mm_hist *h);
void mm_hist_add(struct mm_hist *h, uint64_t ns);
void mm_hist_merge(struct mm_hist *shared, const struct mm_hist *h);	/* atomic */
double mm_hist_median(const struct mm_hist *h);

/* Timing (CLOCK_MONOTONIC_RAW). */
uint64_t mm_now_ns(void);
int mm_deadline_passed(uint64_t start_ns, double seconds);

/* Run `fn(ctx, index)` in `n` forked workers released together; returns 0
 * when all exited 0.  Wall time from release to the last exit is stored in
 * *real_ns. */
int mm_run_workers(struct mm_ctx *ctx, int n,
		   int (*fn)(struct mm_ctx *ctx, int index), uint64_t *real_ns);

#endif
