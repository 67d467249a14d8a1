/*
 * madvise.c - the madvise() advices that act on the pages of a range, and
 * process_madvise() through a pidfd of the process itself.
 *
 * Each round maps --mapping-kb fresh (anonymous memory by default, a memfd
 * or a file in --dir with --backing), puts it in the state the advice acts
 * on, outside the timed window, and times the one call over the whole
 * range:
 *
 * - dontneed: zaps the PTEs (zap_page_range_single_batched), freeing anon
 *   pages; free: MADV_FREE marks anon folios lazy-free (madvise_free_pte_range,
 *   moved to the file LRU, freed only under pressure; anon only);
 * - cold: deactivates (madvise_cold_or_pageout_pte_range, folio_deactivate);
 *   pageout: isolates and reclaims at once (reclaim_pages ->
 *   shrink_folio_list: without swap anon folios cannot go and are put back,
 *   clean file folios are dropped);
 * - willneed: on a file, readahead of what is not cached (the round drops
 *   the file's page cache first with POSIX_FADV_DONTNEED and waits for the
 *   reads after the window); on shmem or anon, swap-in of swapped-out pages
 *   only (a walk over present pages without swap);
 * - populate-read / populate-write: fault every page in (read: the zero page
 *   for anon; write: allocate), on a mapping left unpopulated;
 * - remove: MADV_REMOVE punches a hole in the shmem or file behind a shared
 *   range (vfs_fallocate -> shmem_fallocate or the filesystem's punch hole):
 *   the truncation path, unmap_mapping_range and the page cache's removal
 *   (shmem_undo_range; truncate_inode_pages_range on a disk filesystem);
 * - process-cold / process-pageout: the same two through process_madvise()
 *   on a pidfd of this process (vector_madvise), one iovec for the range.
 *
 * The populate step is a write-touch (anon, shmem) or a read-touch (file,
 * which keeps the page cache clean).  What backed the range, before and
 * after the advice, is read on one extra untimed round after the timed
 * ones: smaps and mincore walk the very page tables the advice walks.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif

static const char *const advice_choices[] = {
	"dontneed", "free", "cold", "pageout", "willneed", "populate-read", "populate-write",
	"process-cold", "process-pageout", "remove", NULL,
};

static const struct mm_param params[] = {
	{ "advice", MM_CHOICE, "dontneed", "what is timed: madvise(MADV_DONTNEED, _FREE, _COLD, "
	  "_PAGEOUT, _WILLNEED, _POPULATE_READ, _POPULATE_WRITE, _REMOVE) or "
	  "process_madvise(MADV_COLD or MADV_PAGEOUT) on a pidfd of this process", 0, 0,
	  advice_choices },
	MM_PARAM_BACKING("willneed and remove"),
	MM_PARAM_SIZE_KB("mapping-kb", "4096", "size of the range in KiB"),
	MM_PARAM_THP("default", "range", ", as pageout-refault"),
	MM_PARAM_ALIGN("range", "it", ""),
	MM_PARAM_ROUNDS("8", "minimum map/populate/advise rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	MM_PARAM_BACKING_DIR,
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "advise_ns_per_page", "ns", 0, "the madvise() or process_madvise() call over the "
	  "range" MM_MEDIAN },
	{ "advise_ns_per_page_total", "ns", 0, "the madvise() or process_madvise() call over the "
	  "range" MM_TOTAL },
	{ NULL },
};

/* The timed window, by id. */
enum { MA_ADVISE };
static const struct mm_window windows[] = {
	{ "advise", "page", "the madvise() or process_madvise() call over the range" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"madvise_vma_behavior", "zap_page_range_single_batched", "zap_page_range_single",
	"madvise_free_single_vma", "madvise_free_pte_range", "folio_mark_lazyfree",
	"madvise_cold_or_pageout_pte_range", "folio_deactivate", "reclaim_pages",
	"shrink_folio_list", "vfs_fadvise", "force_page_cache_ra", "page_cache_ra_unbounded",
	"swapin_walk_pmd_entry", "faultin_page_range", "__get_user_pages", "handle_mm_fault",
	"vector_madvise", "tlb_finish_mmu", "__split_huge_pmd", "vfs_fallocate",
	"unmap_mapping_range", "shmem_undo_range", "truncate_inode_pages_range", NULL,
};

static const char *const vmstat[] = {
	"pgfault", "pgmajfault", "pgfree", "pglazyfree", "pglazyfreed", "pgdeactivate",
	"pgactivate", "pgscan_anon", "pgsteal_anon", "pgscan_file", "pgsteal_file", "pswpout",
	"pgpgin", "thp_fault_alloc", "thp_split_pmd", "thp_split_page", "thp_deferred_split_page",
	"workingset_refault_file", NULL,
};

static const char *const tracepoints[] = { "vmscan", "huge_memory", "filemap", NULL };

struct ma_setup {
	int advice;		/* MADV_* */
	int process;		/* through process_madvise() */
	int populate;		/* the advice faults in: leave the range empty */
	int willneed_file;	/* drop the page cache before, wait for the reads after */
	enum mm_backing backing;
	int fd;			/* shmem or file, or -1 */
	int pidfd;		/* process_madvise, or -1 */
};

static enum mm_backing backing_of(const struct mm_ctx *c)
{
	const char *a = mm_arg_str(c, "advice");
	return mm_backing_of(c, !strcmp(a, "willneed") || !strcmp(a, "remove"));
}

static int ma_validate(struct mm_ctx *c)
{
	if (!strcmp(mm_arg_str(c, "advice"), "free") && backing_of(c) != MM_BACKING_ANON) {
		fprintf(stderr, "mmwork: madvise: --advice free acts on private anonymous memory "
			"only (the kernel refuses MADV_FREE elsewhere): use --backing anon\n");
		return -1;
	}
	if (!strcmp(mm_arg_str(c, "advice"), "remove") && backing_of(c) == MM_BACKING_ANON) {
		fprintf(stderr, "mmwork: madvise: --advice remove punches a hole in shmem or a file "
			"(the kernel refuses MADV_REMOVE on private memory): use --backing shmem or "
			"file\n");
		return -1;
	}
	return 0;
}

static void setup(struct mm_ctx *c, struct ma_setup *s)
{
	const char *a = mm_arg_str(c, "advice");
	memset(s, 0, sizeof(*s));
	s->fd = s->pidfd = -1;
	s->backing = backing_of(c);
	s->process = !strncmp(a, "process-", 8);
	if (s->process)
		a += 8;
	s->advice = !strcmp(a, "dontneed") ? MADV_DONTNEED : !strcmp(a, "free") ? MADV_FREE :
		    !strcmp(a, "cold") ? MADV_COLD : !strcmp(a, "pageout") ? MADV_PAGEOUT :
		    !strcmp(a, "willneed") ? MADV_WILLNEED :
		    !strcmp(a, "populate-read") ? MADV_POPULATE_READ :
		    !strcmp(a, "remove") ? MADV_REMOVE : MADV_POPULATE_WRITE;
	s->populate = s->advice == MADV_POPULATE_READ || s->advice == MADV_POPULATE_WRITE;
	s->willneed_file = s->advice == MADV_WILLNEED && s->backing == MM_BACKING_FILE;
}

/* Pages of [p, p + len) mincore() calls resident (a probe). */
static double resident_fraction(char *p, size_t len)
{
	const size_t n = len / MM_PAGE_SIZE;
	unsigned char *vec = malloc(n);
	size_t in = 0;
	if (!vec || mincore(p, len, vec)) {
		mm_error("mincore_probe", errno);
		free(vec);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		in += vec[i] & 1;
	free(vec);
	return (double)in / (double)n;
}

/* What the probe round saw, before and after the advice. */
struct ma_probe {
	struct mm_smaps before, after;
	double resident_before, resident_after;
};

/*
 * One round: map, THP advice, populate (or not), the timed advice, unmap.
 * Returns the call's ns, 0 when it failed (counted), -1 without a mapping.
 * With `probe` set the window is not counted and smaps and mincore are read
 * around the call; that round's time is never used.
 */
static int64_t ma_round(struct mm_ctx *c, const struct ma_setup *s, size_t len,
			struct ma_probe *probe, char **start)
{
	const int timed = !probe;
	const int anon = s->backing == MM_BACKING_ANON;
	char *p = mm_map_range(c, len, anon ? MAP_PRIVATE | MAP_ANONYMOUS : MAP_SHARED, s->fd,
			       start);
	if (!p)
		return -1;

	if (s->willneed_file) {
		/* Nothing of the file is mapped: the fadvise drops all of its
		 * (clean) page cache, so the readahead has everything to read. */
		if (posix_fadvise(s->fd, 0, (off_t)len, POSIX_FADV_DONTNEED))
			mm_error("fadvise_dontneed", errno);
	} else if (!s->populate) {
		if (s->backing == MM_BACKING_FILE)
			mm_touch_read(p, len);
		else
			mm_touch_write(p, len, 1);
	}
	if (probe) {
		mm_smaps_range(p, len, &probe->before);
		probe->resident_before = resident_fraction(p, len);
	}

	struct iovec iov = { p, len };
	uint64_t t0 = MM_WINDOW_BEGIN(MA_ADVISE, timed);
	long rc = s->process ? syscall(SYS_process_madvise, s->pidfd, &iov, 1UL, s->advice, 0U) :
		  madvise(p, len, s->advice);
	uint64_t t1 = MM_WINDOW_END(MA_ADVISE, timed);
	const int failed = s->process ? rc != (long)len : rc != 0;
	if (failed)
		mm_error(s->process ? "process_madvise" : "madvise", rc < 0 ? errno : EAGAIN);

	if (probe) {
		mm_smaps_range(p, len, &probe->after);
		probe->resident_after = resident_fraction(p, len);
		/* The readahead the call started completes later: what it
		 * brought in, once nothing more arrives (or after a second). */
		for (int i = 0; s->willneed_file && i < 100; i++) {
			const struct timespec tick = { 0, 10 * 1000000 };
			nanosleep(&tick, NULL);
			double now = resident_fraction(p, len);
			if (now == probe->resident_after && now > 0)
				break;
			probe->resident_after = now;
		}
	}
	if (s->willneed_file)
		mm_touch_read(p, len);	/* wait for the readahead: next round drops it all */
	munmap(p, len);
	return failed ? 0 : (int64_t)(t1 - t0);
}

/* A timed round for mm_run_rounds. */
struct ma_run {
	struct ma_setup s;
	size_t len;
	struct mm_rounds advise;
};

static int ma_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct ma_run *r = arg;
	const int64_t ns = ma_round(c, &r->s, r->len, NULL, start);
	if (ns > 0)
		mm_rounds_add(&r->advise, (uint64_t)ns);
	return ns < 0 ? -1 : ns == 0;
}

static int ma_sample(struct mm_ctx *c)
{
	struct ma_run r = { .len = (size_t)mm_arg_long(c, "mapping-kb") * 1024 };
	const size_t len = r.len;
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct ma_setup *s = &r.s;
	struct mm_loop loop;
	int rc = 1;

	setup(c, s);
	if (s->backing != MM_BACKING_ANON &&
	    (s->fd = mm_open_backing(c, s->backing, "mmwork-madvise", len, 1)) < 0)
		return 1;
	if (s->process && (s->pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0)) < 0) {
		mm_error("pidfd_open", errno);
		goto out;
	}

	if (mm_run_rounds(c, mm_arg_long(c, "rounds"), ma_timed, &r, &loop) || !loop.timed)
		goto out;

	mm_metric_rounds(c, "advise_ns_per_page", &r.advise, pages);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", pages * (double)loop.timed);
	mm_window_units(c, MA_ADVISE, pages);
	mm_state_str(c, "backing", mm_backing_names[s->backing]);
	mm_state_placement(c, &loop);
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* What the memory was, from one extra round after the timed ones. */
	struct ma_probe probe;
	if (ma_round(c, s, len, &probe, &loop.start) < 0) {
		rc = 1;
		goto out;
	}
	mm_state_num(c, "thp_backed_fraction",
		     (double)probe.before.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "before_advise_", &probe.before);
	mm_state_smaps(c, "after_advise_", &probe.after);
	mm_state_num(c, "before_advise_resident_fraction", probe.resident_before);
	mm_state_num(c, "after_advise_resident_fraction", probe.resident_after);
	if (s->backing == MM_BACKING_FILE)
		mm_state_dir_fs(c, s->fd);
out:
	mm_rounds_free(&r.advise);
	if (s->fd >= 0)
		close(s->fd);
	if (s->pidfd >= 0)
		close(s->pidfd);
	return rc;
}

const struct mm_workload wl_madvise = {
	.name = "madvise",
	.seed = "none: a baseline of madvise() and process_madvise()",
	.summary = "map a range, populate it, time one madvise() or process_madvise() advice "
		   "over it (DONTNEED, FREE, COLD, PAGEOUT, WILLNEED, POPULATE_READ/WRITE, REMOVE)",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.validate = ma_validate,
	.sample = ma_sample,
};
