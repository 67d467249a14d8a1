/*
 * core-workload.h - what a workload is: the table it declares and the
 * signature of its sample function.
 *
 * A workload is a table (name, parameters, metrics, the mm paths it drives,
 * the /proc/vmstat counters that explain it) and one function that produces
 * one measured sample.  Every other part of the harness reads this table, so
 * it is kept apart from any of them.  Types only; no code.  A workload file
 * names its tables params, metrics, mm_paths, vmstat, tracepoints and
 * windows, which MM_WORKLOAD_TABLES puts in its `struct mm_workload`.
 */
#ifndef MMWORK_CORE_WORKLOAD_H
#define MMWORK_CORE_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MM_PAGE_SIZE 4096UL
#define MM_PMD_SIZE (2UL << 20)
#define MM_MAX_PARAMS 16
#define MM_MAX_WINDOWS 8

enum mm_param_type {
	MM_INT,		/* a whole number within [min, max] */
	MM_SIZE_KB,	/* a size in KiB; also checked against MemTotal */
	MM_BYTES,	/* a size in bytes, K/M/G suffixes accepted */
	MM_FLOAT,	/* a positive real number */
	MM_CHOICE,	/* one of choices[] */
	MM_FLAG,	/* present or not; takes no value */
	MM_PATH,	/* a directory that must exist */
};

struct mm_param {
	const char *name;		/* without the leading "--" */
	enum mm_param_type type;
	const char *def;		/* default, as it would be typed */
	const char *help;
	long min, max;			/* MM_INT / MM_SIZE_KB / MM_BYTES bounds */
	const char *const *choices;	/* MM_CHOICE, NULL-terminated */
};

struct mm_metric {
	const char *name;		/* the suffix is the unit: _ns, _per_s, ... */
	const char *unit;
	int higher_is_better;
	const char *help;
};

/* A timed window whose instructions can be counted (core-insns.h), in the
 * order of the ids the workload's MM_WINDOW_BEGIN/END calls give. */
struct mm_window {
	const char *name;	/* "advise": advise_kernel_insns_per_page, ... */
	const char *unit;	/* what one window works on: "page", "op" */
	const char *help;
	/* 1: another process or thread does its work (MM_WINDOW_BEGIN_ALL), so
	 * the caller's CPU clock cannot time it: no _cpu_ns_ metric. */
	int elsewhere;
};

/* The context of one run; workloads only pass it to the mm_* calls
 * (its fields are the harness's: core-ctx.h). */
struct mm_ctx;

struct mm_workload {
	const char *name;
	const char *seed;		/* which mailing-list report it reproduces */
	const char *summary;
	const struct mm_param *params;	/* terminated by a NULL name */
	const struct mm_metric *metrics;/* terminated by a NULL name */
	const char *const *mm_paths;	/* kernel functions it drives */
	const char *const *vmstat;	/* counters reported as deltas */
	const char *const *tracepoints;	/* tracefs event systems that explain it */
	const char *const *host_settings; /* global knobs it changes and restores */
	const struct mm_window *windows; /* timed windows, NULL name last (or none) */
	int default_warmups;
	/* 1: its files (--dir) must be on a filesystem whose page cache reclaim
	 * can drop; a guest, whose /var/tmp is in its initramfs (tmpfs), mounts
	 * one there for it (targets/qemu.py). */
	int scratch_disk;
	/* 1: takes a command after "--" (exec); the harness keeps it in the context. */
	int takes_command;
	/* Optional cross-parameter check; returns 0 or prints and returns -1. */
	int (*validate)(struct mm_ctx *ctx);
	/* Produce one sample: fill metrics/state through the mm_* calls. */
	int (*sample)(struct mm_ctx *ctx);
};

/* The tables of a workload file, in its `const struct mm_workload`. */
#define MM_WORKLOAD_TABLES \
	.params = params, .metrics = metrics, .mm_paths = mm_paths, .vmstat = vmstat, \
	.tracepoints = tracepoints, .windows = windows

#endif
