/*
 * mincore_mlock.c - page-table walks that report or change the state of
 * every page of a populated range: mincore(), mlock(), munlock() and
 * msync(MS_SYNC).
 *
 * The range (--mapping-kb, anonymous by default, a memfd or a file in --dir
 * with --backing) is mapped and populated once per sample; each round then
 * puts it in the state the call acts on, outside the timed window, and
 * times the one call over the whole range:
 *
 * - mincore: residency of every page (mincore_pte_range; the range is
 *   populated, so every PTE is present); nothing to restore between rounds;
 * - mlock: mlock_fixup() sets VM_LOCKED, mlock_pte_range() moves every folio
 *   to the unevictable LRU (mlock_folio, batched), then __mm_populate()
 *   walks the range again; the round's munlock() is untimed;
 * - munlock: the reverse (munlock_folio back to the evictable LRU), after an
 *   untimed mlock();
 * - msync: MS_SYNC of a shared file mapping whose every page the round
 *   write-touched: writeback of the dirty pages and the wait for it
 *   (vfs_fsync_range; on tmpfs or shmem there is nothing to write).
 *
 * What the range was (smaps, VmLck, mincore residency) is read on one
 * extra untimed round after the timed ones.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *const op_choices[] = { "mincore", "mlock", "munlock", "msync", NULL };

static const struct mm_param params[] = {
	{ "op", MM_CHOICE, "mincore", "what is timed: mincore(), mlock(), munlock() or "
	  "msync(MS_SYNC) of the whole range", 0, 0, op_choices },
	MM_PARAM_BACKING("msync"),
	MM_PARAM_SIZE_KB("mapping-kb", "4096", "size of the range in KiB"),
	MM_PARAM_THP("default", "range", ""),
	MM_PARAM_ALIGN("range", "it", ""),
	MM_PARAM_ROUNDS("16", "minimum rounds (one timed call each) per sample"),
	MM_PARAM_MIN_MS("200"),
	MM_PARAM_BACKING_DIR,
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "op_ns_per_page", "ns", 0, "the --op call (mincore, mlock, munlock or msync) over the "
	  "range" MM_MEDIAN },
	{ "op_ns_per_page_total", "ns", 0, "the --op call over the range" MM_TOTAL },
	{ NULL },
};

/* The timed window, by id. */
enum { MC_OP };
static const struct mm_window windows[] = {
	{ "op", "page", "the --op call (mincore, mlock, munlock or msync) over the range" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"mlock_fixup", "mincore_pte_range", "apply_vma_lock_flags", "mlock_pte_range",
	"mlock_folio", "munlock_folio", "mlock_folio_batch", "__mm_populate",
	"populate_vma_page_range", "__get_user_pages", "vfs_fsync_range",
	"file_write_and_wait_range", "do_writepages", "__filemap_fdatawait_range", NULL,
};

static const char *const vmstat[] = {
	"unevictable_pgs_mlocked", "unevictable_pgs_munlocked", "unevictable_pgs_culled",
	"unevictable_pgs_rescued", "unevictable_pgs_cleared", "nr_dirtied", "nr_written",
	"pgpgout", "pgfault", "thp_split_pmd", NULL,
};

static const char *const tracepoints[] = { "writeback", "huge_memory", NULL };

enum op { OP_MINCORE, OP_MLOCK, OP_MUNLOCK, OP_MSYNC };

static enum op op_of(const struct mm_ctx *c)
{
	const char *o = mm_arg_str(c, "op");
	return !strcmp(o, "mincore") ? OP_MINCORE : !strcmp(o, "mlock") ? OP_MLOCK :
	       !strcmp(o, "munlock") ? OP_MUNLOCK : OP_MSYNC;
}

static enum mm_backing backing_of(const struct mm_ctx *c)
{
	return mm_backing_of(c, op_of(c) == OP_MSYNC);
}

static int mc_validate(struct mm_ctx *c)
{
	const enum op op = op_of(c);
	if (op == OP_MSYNC && backing_of(c) == MM_BACKING_ANON) {
		fprintf(stderr, "mmwork: mincore-mlock: --op msync writes back a shared file "
			"mapping: use --backing file (or shmem, which has nothing to write)\n");
		return -1;
	}
	if (op == OP_MLOCK || op == OP_MUNLOCK) {
		struct rlimit r;
		const unsigned long long len = (unsigned long long)mm_arg_long(c, "mapping-kb") * 1024;
		if (geteuid() != 0 && !getrlimit(RLIMIT_MEMLOCK, &r) && r.rlim_cur != RLIM_INFINITY &&
		    len > r.rlim_cur) {
			fprintf(stderr, "mmwork: mincore-mlock: --op %s of %llu KiB needs RLIMIT_MEMLOCK "
				"(ulimit -l) of that much or root (it is %llu KiB)\n", mm_arg_str(c, "op"),
				len / 1024, (unsigned long long)r.rlim_cur / 1024);
			return -1;
		}
	}
	return 0;
}

/* VmLck of this process in KiB, from /proc/self/status (a probe). */
static long vmlck_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %ld", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}

static double resident_fraction(const unsigned char *vec, size_t n)
{
	size_t in = 0;
	for (size_t i = 0; i < n; i++)
		in += vec[i] & 1;
	return (double)in / (double)n;
}

struct mc_range {
	enum op op;
	char *p;
	size_t len;
	unsigned char *vec;	/* mincore's */
	struct mm_rounds ops;	/* the timed calls */
};

/* Before the timed call: the state it acts on.  Returns 0, or -1 when the
 * preparation itself failed (counted). */
static int mc_prepare(const struct mc_range *r)
{
	if (r->op == OP_MUNLOCK && mlock(r->p, r->len)) {
		mm_error("mlock_prepare", errno);
		return -1;
	}
	if (r->op == OP_MSYNC)
		mm_touch_write(r->p, r->len, 2);	/* dirty every page */
	return 0;
}

/* The timed call; 0 on success. */
static int mc_call(const struct mc_range *r)
{
	switch (r->op) {
	case OP_MINCORE:
		return mincore(r->p, r->len, r->vec);
	case OP_MLOCK:
		return mlock(r->p, r->len);
	case OP_MUNLOCK:
		return munlock(r->p, r->len);
	default:
		return msync(r->p, r->len, MS_SYNC);
	}
}

static const char *const op_calls[] = { "mincore", "mlock", "munlock", "msync" };

/* After it: back to the state before (mlock's munlock). */
static void mc_restore(const struct mc_range *r)
{
	if (r->op == OP_MLOCK && munlock(r->p, r->len))
		mm_error("munlock_restore", errno);
}

/* One timed round for mm_run_rounds: prepare, the call (timed), restore. */
static int mc_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct mc_range *r = arg;
	(void)c;
	(void)start;	/* one mapping for the whole sample */
	if (mc_prepare(r))
		return 1;
	uint64_t t0 = MM_WINDOW_BEGIN(MC_OP, 1);
	int failed = mc_call(r);
	uint64_t t1 = MM_WINDOW_END(MC_OP, 1);
	if (failed)
		mm_error(op_calls[r->op], errno);
	else
		mm_rounds_add(&r->ops, t1 - t0);
	mc_restore(r);
	return failed != 0;
}

static int mc_sample(struct mm_ctx *c)
{
	const enum op op = op_of(c);
	const enum mm_backing b = backing_of(c);
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct mc_range r = { op, NULL, len, NULL, { 0 } };
	struct mm_loop loop;
	int fd = -1, rc = 1;

	if (b != MM_BACKING_ANON && (fd = mm_open_backing(c, b, "mmwork-mincore-mlock", len, 0)) < 0)
		return 1;
	r.p = mm_map_range(c, len, b == MM_BACKING_ANON ? MAP_PRIVATE | MAP_ANONYMOUS : MAP_SHARED,
			   fd, NULL);
	r.vec = malloc(len / MM_PAGE_SIZE);
	if (!r.p || !r.vec)
		goto out;
	mm_touch_write(r.p, len, 1);
	if (b == MM_BACKING_FILE && msync(r.p, len, MS_SYNC))	/* start every sample clean */
		mm_error("msync_prepare", errno);

	if (mm_run_rounds(c, mm_arg_long(c, "rounds"), mc_timed, &r, &loop) || !loop.timed)
		goto out;

	mm_metric_rounds(c, "op_ns_per_page", &r.ops, pages);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", pages * (double)loop.timed);
	mm_window_units(c, MC_OP, pages);
	mm_state_str(c, "backing", mm_backing_names[b]);
	mm_state_num(c, "mapping_start_mod_2m_kb", mm_pmd_offset_kb(r.p));
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* One extra untimed round: what the range was before and after the call. */
	struct mm_smaps before, after;
	long lck_before, lck_after;
	if (mc_prepare(&r))
		goto out;
	mm_smaps_range(r.p, len, &before);
	lck_before = vmlck_kb();
	if (mc_call(&r))
		mm_error(op_calls[op], errno);
	mm_smaps_range(r.p, len, &after);
	lck_after = vmlck_kb();
	if (mincore(r.p, len, r.vec))
		mm_error("mincore_probe", errno);
	else
		mm_state_num(c, "resident_fraction", resident_fraction(r.vec, len / MM_PAGE_SIZE));
	mc_restore(&r);
	mm_state_num(c, "thp_backed_fraction", (double)before.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "before_op_", &before);
	mm_state_num(c, "after_op_rss_kb", (double)after.rss_kb);
	mm_state_num(c, "before_op_vmlck_kb", (double)lck_before);
	mm_state_num(c, "after_op_vmlck_kb", (double)lck_after);
	if (b == MM_BACKING_FILE)
		mm_state_dir_fs(c, fd);
out:
	mm_rounds_free(&r.ops);
	if (r.p)
		munmap(r.p, len);
	free(r.vec);
	if (fd >= 0)
		close(fd);
	return rc;
}

const struct mm_workload wl_mincore_mlock = {
	.name = "mincore-mlock",
	.seed = "none: a baseline of mincore, mlock, munlock and msync",
	.summary = "populate a range once, then time mincore(), mlock(), munlock() or "
		   "msync(MS_SYNC) of it per round",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.validate = mc_validate,
	.sample = mc_sample,
};
