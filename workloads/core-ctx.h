/*
 * core-ctx.h - the context of one run: which workload, its parameter values,
 * and the key/value sets (metrics, counts, state) one sample fills.
 *
 * Harness-only.  Workloads get a `struct mm_ctx *` and go through the mm_*
 * calls (core-args.h, core-sample.h), so common.h does not include this and
 * the fields can change without touching a workload.
 */
#ifndef MMWORK_CORE_CTX_H
#define MMWORK_CORE_CTX_H

#include "core-workload.h"

/* Per set; the state carries every mTHP size's counters (core-state.c). */
#define MM_MAX_ENTRIES 160

struct mm_kv {
	char name[64];
	double num;
	char str[256];		/* DAMON's description can be long */
	int is_str;
};

struct mm_kvset {
	struct mm_kv kv[MM_MAX_ENTRIES];
	int n;
};

struct mm_ctx {
	const struct mm_workload *wl;
	const struct mm_param *params[MM_MAX_PARAMS + 8];
	char values[MM_MAX_PARAMS + 8][256];
	int nparams;
	int warmup;
	int probes;		/* 0 with --no-probes: no state probes at all */
	struct mm_kvset metrics, counts, state;
	char **command;		/* after "--", for a workload that takes one */
	int ncommand;
	char *output;		/* what the command printed, for the sample (exec) */
	size_t output_len;
};

#endif
