/*
 * core-range.h - what the workloads that map a range and time calls on it
 * share: their common parameter entries, the help of their per-page
 * metrics, the mapping itself (--align, --thp), the memfd or file behind
 * it, and the loop of timed rounds.
 *
 * Ten or so workloads (madvise, mprotect, page-fault, munmap-zap, ... and
 * the seeds pageout-refault and unmap-young) each map a range, place and
 * advise it the same way, and time rounds until --rounds and --min-ms are
 * both reached.  Written once here, they cannot drift apart: a workload
 * keeps only what it times.
 */
#ifndef MMWORK_CORE_RANGE_H
#define MMWORK_CORE_RANGE_H

#include <stddef.h>

#include "core-workload.h"
#include "core-mem.h"
#include "core-rounds.h"

/* The help suffixes of a per-page metric: the median round, or the mean. */
#define MM_MEDIAN_PER(unit) " (median round, per " unit ")"
#define MM_MEDIAN MM_MEDIAN_PER("page")
#define MM_TOTAL " (total time over total pages: the mean, as reproducers and stress-ng report)"

/* Entries of a `struct mm_param[]` initialiser. */
#define MM_PARAM_SIZE_KB(name, def, help) { name, MM_SIZE_KB, def, help, 64, 1L << 40, NULL }
/* --thp: "THP advice for the <object> (madvise)<more>". */
#define MM_PARAM_THP(def, object, more) \
	{ "thp", MM_CHOICE, def, "THP advice for the " object " (madvise)" more, 0, 0, \
	  mm_thp_choices }
/* --align: where the <object> starts, so THP can back <back>. */
#define MM_PARAM_ALIGN(object, back, more) \
	{ "align", MM_CHOICE, "pmd", "where the " object " starts: pmd = on a 2 MiB boundary, " \
	  "so THP can back " back "; none = a plain mmap() of the size" more, 0, 0, \
	  mm_align_choices }
#define MM_PARAM_ROUNDS(def, help) { "rounds", MM_INT, def, help, 1, 1000000, NULL }
#define MM_PARAM_MIN_MS(def) \
	{ "min-ms", MM_INT, def, "minimum measured time per sample in ms", 0, 3600000, NULL }
/* --backing of mm_backing_of: "auto" is a file for <auto_file>. */
#define MM_PARAM_BACKING(auto_file) \
	{ "backing", MM_CHOICE, "auto", "what the range maps: anon (private anonymous), shmem " \
	  "(a shared memfd), file (a shared mapping of a file in --dir); auto = file for " \
	  auto_file ", anon otherwise", 0, 0, mm_backing_choices }
#define MM_PARAM_DIR(help) { "dir", MM_PATH, "/var/tmp", help, 0, 0, NULL }
#define MM_PARAM_BACKING_DIR \
	MM_PARAM_DIR("directory for --backing file (a file created and unlinked there)")

extern const char *const mm_thp_choices[];	/* default, hugepage, nohugepage */

/* madvise(MADV_HUGEPAGE or MADV_NOHUGEPAGE) of [p, p + len) as --thp says. */
void mm_advise_thp(const struct mm_ctx *ctx, char *p, size_t len);
/* mmap(len, PROT_READ | PROT_WRITE, flags, fd) placed by --align and
 * advised by --thp, also stored in *start (a round's, for mm_run_rounds)
 * unless start is NULL; NULL with the failure counted. */
char *mm_map_range(const struct mm_ctx *ctx, size_t len, int flags, int fd, char **start);

/* --backing: what the range maps. */
enum mm_backing { MM_BACKING_ANON, MM_BACKING_SHMEM, MM_BACKING_FILE };
extern const char *const mm_backing_choices[];	/* auto, anon, shmem, file */
extern const char *const mm_backing_names[];	/* by enum mm_backing */
/* --backing; "auto" is a file when `auto_file`, anon otherwise. */
enum mm_backing mm_backing_of(const struct mm_ctx *ctx, int auto_file);
/* The shmem (a memfd) or file (in --dir, unlinked at once) behind a range
 * of `len`: filled (written through, a file then synced clean) or only
 * sized; -1 with the failure counted.  `name` names it: "mmwork-madvise". */
int mm_open_backing(const struct mm_ctx *ctx, enum mm_backing b, const char *name,
		    size_t len, int fill);
/* "<dir>/<name>.<pid>" created and unlinked at once (gone when closed); -1
 * with errno set. */
int mm_open_unlinked(const char *dir, const char *name);
/* Write `len` bytes of 0x5a (1 MiB a call), so every page exists; -1 with
 * the failure counted. */
int mm_fill(int fd, size_t len);
/* Read `len` bytes (1 MiB a call): into the page cache, or referenced. */
void mm_pread_all(int fd, size_t len);

/* A filesystem magic's name ("ext4", "tmpfs", ... or "other"). */
const char *mm_fs_name(long magic);
/* State "dir_fs": the name of the filesystem `fd` is on. */
void mm_state_dir_fs(struct mm_ctx *ctx, int fd);
/* State "file_fs_magic": the magic of the filesystem of `dir`, in hex. */
void mm_state_file_fs_magic(struct mm_ctx *ctx, const char *dir);

/*
 * One round, run by mm_run_rounds: 0 when it was timed (it keeps its own
 * times, in `arg`), 1 when its call failed (counted, not timed), -1 when it
 * could not run at all (the sample fails).  *start: where its mapping
 * starts.
 */
typedef int mm_round_fn(struct mm_ctx *ctx, void *arg, char **start);

/* What mm_run_rounds counted. */
struct mm_loop {
	long timed;	/* rounds timed */
	long failed;	/* rounds whose call failed */
	long aligned;	/* timed rounds whose mapping started on a 2 MiB boundary */
	char *start;	/* where the last round's mapping started */
};

/* Give up after 100 failed rounds and none timed. */
#define MM_GIVE_UP 101

/*
 * Rounds until --rounds of them ran and --min-ms passed, or until
 * `give_up` of them failed with none timed.  The rounds read no state.
 * Returns -1 when a round could not run, else 0 (l->timed says whether
 * anything was measured).
 */
int mm_run_rounds(struct mm_ctx *ctx, long give_up, mm_round_fn *round, void *arg,
		  struct mm_loop *l);

/* Metric `name`, the median round over `units`, and `name`_total, the
 * total time over units of every round. */
void mm_metric_rounds(struct mm_ctx *ctx, const char *name, struct mm_rounds *r, double units);
/* State: the fraction of timed rounds whose mapping was PMD-aligned, and
 * where the last one started (pointers, not probes). */
void mm_state_placement(struct mm_ctx *ctx, const struct mm_loop *l);

#endif
