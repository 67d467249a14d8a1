/*
 * core-state.h - the global page state every sample carries: THP and
 * per-size (mTHP) modes with the per-size allocation counters over the
 * sample, swap, KSM, MGLRU, and the kernel's own mm actors (DAMON,
 * khugepaged, ksmd, proactive compaction).
 *
 * Two arms can differ in what the kernel did to their memory without any
 * axis asking for it; the same-state audit (src/mmlab/audit.py) can only see
 * that if each sample says what the state was.  Every read here is a state
 * probe: it runs before the workload's first timed window or after its last
 * (core-sample.c), never inside one, and not at all with --no-probes.
 */
#ifndef MMWORK_CORE_STATE_H
#define MMWORK_CORE_STATE_H

#include "core-workload.h"

#define MM_MTHP_MAX_SIZES 16
#define MM_MTHP_MAX_COUNTERS 8

/* /sys/kernel/mm/transparent_hugepage/hugepages-<N>kB/: every size that
 * anonymous memory can use (it has an `enabled` file), smallest first. */
struct mm_mthp_snap {
	int n;				/* 0: this kernel has no mTHP */
	long size_kb[MM_MTHP_MAX_SIZES];
	char enabled[MM_MTHP_MAX_SIZES][16];
	long v[MM_MTHP_MAX_SIZES][MM_MTHP_MAX_COUNTERS];	/* -1: counter absent */
};
void mm_mthp_read(struct mm_mthp_snap *s);

/* Put the global state into the sample: modes and actors as they are now,
 * mTHP counters as the difference between the two snapshots. */
void mm_state_global(struct mm_ctx *ctx, const struct mm_mthp_snap *before,
		     const struct mm_mthp_snap *after);

#endif
