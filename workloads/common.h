/*
 * common.h - the small harness every mmwork workload stands on.
 *
 * A workload is a table (name, parameters, metrics, the mm paths it drives,
 * the /proc/vmstat counters that explain it) and one function that produces
 * one measured sample.  The harness parses arguments against the table, runs
 * warm-ups and samples, snapshots rusage and /proc/vmstat around each sample,
 * adds the global page state (THP mode, swap, KSM) and prints one JSON line
 * per sample on stdout.  Logs go to stderr; stdout carries samples only.
 */
#ifndef MMWORK_COMMON_H
#define MMWORK_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MM_PAGE_SIZE 4096UL
#define MM_PMD_SIZE (2UL << 20)
#define MM_MAX_PARAMS 16

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
	int default_warmups;
	/* Optional cross-parameter check; returns 0 or prints and returns -1. */
	int (*validate)(struct mm_ctx *ctx);
	/* Produce one sample: fill metrics/state through the mm_* calls. */
	int (*sample)(struct mm_ctx *ctx);
};

/* Parameter values, looked up by name (the tables are tiny). */
long mm_arg_long(const struct mm_ctx *ctx, const char *name);
double mm_arg_double(const struct mm_ctx *ctx, const char *name);
const char *mm_arg_str(const struct mm_ctx *ctx, const char *name);
int mm_is_warmup(const struct mm_ctx *ctx);

/* What one sample reports. */
void mm_metric(struct mm_ctx *ctx, const char *name, double value);
void mm_count(struct mm_ctx *ctx, const char *name, double value);
void mm_state_num(struct mm_ctx *ctx, const char *name, double value);
void mm_state_str(struct mm_ctx *ctx, const char *name, const char *value);

/*
 * Count a failed call by errno.  Safe from forked workers: the table lives in
 * shared memory created before any fork.
 */
void mm_error(const char *call, int err);

/* Per-round durations of one phase; a sample reports their median so that a
 * round disturbed by an interrupt or a neighbour cannot move it. */
struct mm_rounds {
	uint64_t *ns;
	long n, cap;
};
void mm_rounds_add(struct mm_rounds *r, uint64_t ns);
double mm_rounds_median(const struct mm_rounds *r);
void mm_rounds_free(struct mm_rounds *r);

/* Timing. */
uint64_t mm_now_ns(void);
int mm_deadline_passed(uint64_t start_ns, double seconds);

/* usr and sys seconds of all waited-for children so far. */
void mm_children_cpu_s(double *usr, double *sys);

/* Memory helpers. */
void *mm_map_aligned(size_t len, size_t align);
void mm_touch_write(char *p, size_t len, unsigned char value);
uint64_t mm_touch_read(const char *p, size_t len);
void *mm_shared_alloc(size_t len);
long mm_meminfo_kb(const char *key);

/* smaps of every VMA overlapping [start, end), summed. */
struct mm_smaps {
	long vmas, rss_kb, anon_kb, anon_huge_kb, swap_kb;
	long file_pmd_kb, shmem_pmd_kb, kernel_page_kb;
};
int mm_smaps_range(const void *start, size_t len, struct mm_smaps *out);
/* Add the smaps totals to the sample state, keys prefixed by `prefix`. */
void mm_state_smaps(struct mm_ctx *ctx, const char *prefix,
		    const struct mm_smaps *s);

/* sysfs/procfs text files. */
int mm_read_text(const char *path, char *buf, size_t len);
long mm_read_long(const char *path);

/*
 * Global kernel settings.  mm_knob_set() records the old value the first
 * time a path is written; every recorded value is written back at exit and
 * on SIGINT/SIGTERM/SIGHUP (only by the process that recorded it, never by
 * forked workers).
 */
int mm_knob_set(const char *path, const char *value);
void mm_knobs_restore(void);

/* Run `fn(ctx, index)` in `n` forked workers released together; returns 0
 * when all exited 0.  Wall time from release to the last exit is stored in
 * *real_ns. */
int mm_run_workers(struct mm_ctx *ctx, int n,
		   int (*fn)(struct mm_ctx *ctx, int index), uint64_t *real_ns);

/* Print a one-line error naming the workload and exit 2. */
void mm_die(const struct mm_ctx *ctx, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 2, 3)));

extern const struct mm_workload wl_pageout_refault;
extern const struct mm_workload wl_mremap_churn;
extern const struct mm_workload wl_populate_unmap;
extern const struct mm_workload wl_unmap_young;
extern const struct mm_workload wl_ksm_rmap;

#endif
