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
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

static const char *const op_choices[] = { "mincore", "mlock", "munlock", "msync", NULL };
static const char *const backing_choices[] = { "auto", "anon", "shmem", "file", NULL };
static const char *const thp_choices[] = { "default", "hugepage", "nohugepage", NULL };

static const struct mm_param params[] = {
	{ "op", MM_CHOICE, "mincore", "what is timed: mincore(), mlock(), munlock() or "
	  "msync(MS_SYNC) of the whole range", 0, 0, op_choices },
	{ "backing", MM_CHOICE, "auto", "what the range maps: anon (private anonymous), shmem (a "
	  "shared memfd), file (a shared mapping of a file in --dir); auto = file for msync, "
	  "anon otherwise", 0, 0, backing_choices },
	{ "mapping-kb", MM_SIZE_KB, "4096", "size of the range in KiB", 64, 1L << 40, NULL },
	{ "thp", MM_CHOICE, "default", "THP advice for the range (madvise)", 0, 0, thp_choices },
	{ "align", MM_CHOICE, "pmd", "where the range starts: pmd = on a 2 MiB boundary, so THP "
	  "can back it; none = a plain mmap() of the size", 0, 0, mm_align_choices },
	{ "rounds", MM_INT, "16", "minimum rounds (one timed call each) per sample", 1, 1000000,
	  NULL },
	{ "min-ms", MM_INT, "200", "minimum measured time per sample in ms", 0, 3600000, NULL },
	{ "dir", MM_PATH, "/var/tmp", "directory for --backing file (a file created and "
	  "unlinked there)", 0, 0, NULL },
	{ NULL },
};

#define MEDIAN " (median round, per page)"
#define TOTAL " (total time over total pages: the mean, as reproducers and stress-ng report)"
static const struct mm_metric metrics[] = {
	{ "op_ns_per_page", "ns", 0, "the --op call (mincore, mlock, munlock or msync) over the "
	  "range" MEDIAN },
	{ "op_ns_per_page_total", "ns", 0, "the --op call over the range" TOTAL },
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
enum backing { B_ANON, B_SHMEM, B_FILE };

static enum op op_of(const struct mm_ctx *c)
{
	const char *o = mm_arg_str(c, "op");
	return !strcmp(o, "mincore") ? OP_MINCORE : !strcmp(o, "mlock") ? OP_MLOCK :
	       !strcmp(o, "munlock") ? OP_MUNLOCK : OP_MSYNC;
}

static enum backing backing_of(const struct mm_ctx *c)
{
	const char *b = mm_arg_str(c, "backing");
	if (!strcmp(b, "auto"))
		return op_of(c) == OP_MSYNC ? B_FILE : B_ANON;
	return !strcmp(b, "anon") ? B_ANON : !strcmp(b, "shmem") ? B_SHMEM : B_FILE;
}

static int mc_validate(struct mm_ctx *c)
{
	const enum op op = op_of(c);
	if (op == OP_MSYNC && backing_of(c) == B_ANON) {
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

static const char *fs_name(long magic)
{
	switch (magic) {
	case 0xEF53: return "ext4";
	case 0x01021994: return "tmpfs";
	case 0x58465342: return "xfs";
	case 0x9123683E: return "btrfs";
	case 0x794c7630: return "overlay";
	case 0x858458f6: return "ramfs";
	default: return "other";
	}
}

static int open_backing(struct mm_ctx *c, enum backing b, size_t len)
{
	char path[512];
	int fd;
	if (b == B_SHMEM) {
		fd = memfd_create("mmwork-mincore-mlock", MFD_CLOEXEC);
	} else {
		snprintf(path, sizeof(path), "%s/mmwork-mincore-mlock.%d", mm_arg_str(c, "dir"),
			 (int)getpid());
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		unlink(path);	/* gone when the sample closes it, whatever happens */
	}
	if (fd < 0) {
		mm_error("open", errno);
		return -1;
	}
	if (ftruncate(fd, (off_t)len)) {
		mm_error("ftruncate", errno);
		close(fd);
		return -1;
	}
	return fd;
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
	char *p;
	size_t len;
	unsigned char *vec;	/* mincore's */
};

/* Before the timed call: the state it acts on.  Returns 0, or -1 when the
 * preparation itself failed (counted). */
static int mc_prepare(enum op op, struct mc_range *r)
{
	if (op == OP_MUNLOCK && mlock(r->p, r->len)) {
		mm_error("mlock_prepare", errno);
		return -1;
	}
	if (op == OP_MSYNC)
		mm_touch_write(r->p, r->len, 2);	/* dirty every page */
	return 0;
}

/* The timed call; 0 on success. */
static int mc_call(enum op op, struct mc_range *r)
{
	switch (op) {
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
static void mc_restore(enum op op, struct mc_range *r)
{
	if (op == OP_MLOCK && munlock(r->p, r->len))
		mm_error("munlock_restore", errno);
}

static int mc_sample(struct mm_ctx *c)
{
	const enum op op = op_of(c);
	const enum backing b = backing_of(c);
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	const long min_rounds = mm_arg_long(c, "rounds");
	const double min_s = (double)mm_arg_long(c, "min-ms") / 1000.0;
	const char *thp = mm_arg_str(c, "thp");
	const size_t align = mm_align_bytes(mm_arg_str(c, "align"));
	static const char *const backing_names[] = { "anon", "shmem", "file" };
	struct mm_rounds ops = { 0 };
	struct mc_range r = { NULL, len, NULL };
	int fd = -1, rc = 1;
	long attempts = 0;

	if (b != B_ANON && (fd = open_backing(c, b, len)) < 0)
		return 1;
	r.p = b == B_ANON ? mm_map_aligned(len, align) :
	      mm_map(len, align, PROT_READ | PROT_WRITE, MAP_SHARED, fd);
	r.vec = malloc(len / MM_PAGE_SIZE);
	if (!r.p || !r.vec)
		goto out;
	if (!strcmp(thp, "hugepage") && madvise(r.p, len, MADV_HUGEPAGE))
		mm_error("madvise_hugepage", errno);
	if (!strcmp(thp, "nohugepage") && madvise(r.p, len, MADV_NOHUGEPAGE))
		mm_error("madvise_nohugepage", errno);
	mm_touch_write(r.p, len, 1);
	if (b == B_FILE && msync(r.p, len, MS_SYNC))	/* start every sample clean */
		mm_error("msync_prepare", errno);

	/* The timed rounds read no state at all. */
	const uint64_t t_start = mm_now_ns();
	while (attempts < min_rounds || !mm_deadline_passed(t_start, min_s)) {
		attempts++;
		if (mc_prepare(op, &r) == 0) {
			uint64_t t0 = MM_WINDOW_BEGIN(MC_OP, 1);
			int failed = mc_call(op, &r);
			uint64_t t1 = MM_WINDOW_END(MC_OP, 1);
			if (failed)
				mm_error(op_calls[op], errno);
			else
				mm_rounds_add(&ops, t1 - t0);
			mc_restore(op, &r);
		}
		if (!ops.n && attempts >= min_rounds)
			break;		/* every call failed */
	}
	if (!ops.n)
		goto out;

	const double all = pages * (double)ops.n;
	mm_metric(c, "op_ns_per_page", mm_rounds_median(&ops) / pages);
	mm_metric(c, "op_ns_per_page_total", mm_rounds_total(&ops) / all);
	mm_count(c, "rounds", (double)ops.n);
	mm_count(c, "pages", all);
	mm_window_units(c, MC_OP, pages);
	mm_state_str(c, "backing", backing_names[b]);
	mm_state_num(c, "mapping_start_mod_2m_kb", mm_pmd_offset_kb(r.p));
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* One extra untimed round: what the range was before and after the call. */
	struct mm_smaps before, after;
	long lck_before, lck_after;
	if (mc_prepare(op, &r))
		goto out;
	mm_smaps_range(r.p, len, &before);
	lck_before = vmlck_kb();
	if (mc_call(op, &r))
		mm_error(op_calls[op], errno);
	mm_smaps_range(r.p, len, &after);
	lck_after = vmlck_kb();
	if (mincore(r.p, len, r.vec))
		mm_error("mincore_probe", errno);
	else
		mm_state_num(c, "resident_fraction", resident_fraction(r.vec, len / MM_PAGE_SIZE));
	mc_restore(op, &r);
	mm_state_num(c, "thp_backed_fraction", (double)before.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "before_op_", &before);
	mm_state_num(c, "after_op_rss_kb", (double)after.rss_kb);
	mm_state_num(c, "before_op_vmlck_kb", (double)lck_before);
	mm_state_num(c, "after_op_vmlck_kb", (double)lck_after);
	if (b == B_FILE) {
		struct statfs fs;
		if (!fstatfs(fd, &fs))
			mm_state_str(c, "dir_fs", fs_name((long)fs.f_type));
	}
out:
	mm_rounds_free(&ops);
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
	.params = params,
	.metrics = metrics,
	.mm_paths = mm_paths,
	.vmstat = vmstat,
	.tracepoints = tracepoints,
	.windows = windows,
	.default_warmups = 1,
	.validate = mc_validate,
	.sample = mc_sample,
};
