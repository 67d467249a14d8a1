/*
 * unmap_young.c - seed 003: the cost of marking pages accessed while
 * unmapping.
 *
 * zap_pte_range() calls folio_mark_accessed() for every young PTE of a file
 * (page cache or shmem) folio unless the VMA has VM_SEQ_READ (MADV_SEQUENTIAL).
 * On the classic LRU that is cheap when the folio is not yet referenced (it
 * sets PG_referenced) or already active, and expensive when it is referenced
 * and inactive: then it is activated through the per-CPU LRU batch and the
 * lruvec lock.  --page-state cold puts every folio in that expensive state
 * before the timed munmap (MADV_COLD deactivates and clears the references,
 * a read() sets PG_referenced again, the mapping is touched so its PTEs are
 * young); --page-state warm leaves the folios as the previous round left them
 * (active).  --backing anon is the control: anon folios are not marked
 * accessed on zap.  What backed the mapping (PMD-mapped or not) is read from
 * smaps on one extra untimed round once all timed rounds are over: a smaps
 * read between the touch and the munmap walks the PTEs the munmap zaps.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_COLD
#define MADV_COLD 20
#endif

static const char *const backing_choices[] = { "file", "shmem", "anon", NULL };
static const char *const state_choices[] = { "cold", "warm", NULL };

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("size-kb", "32768", "mapping size per worker in KiB"),
	{ "backing", MM_CHOICE, "file", "what backs the mapping", 0, 0, backing_choices },
	{ "sequential", MM_FLAG, NULL, "madvise(MADV_SEQUENTIAL): VM_SEQ_READ skips the marking", 0, 0, NULL },
	{ "page-state", MM_CHOICE, "cold", "LRU state of the folios at unmap (see source)", 0, 0, state_choices },
	{ "workers", MM_INT, "1", "worker processes, each with its own file", 1, 4096, NULL },
	MM_PARAM_ROUNDS("4", "minimum map/touch/unmap rounds per worker and sample"),
	{ "min-ms", MM_INT, "100", "minimum measured time per worker and sample in ms", 0, 3600000, NULL },
	MM_PARAM_DIR("directory for --backing file"),
	{ "align", MM_CHOICE, "none", "where the mapping starts: none = a plain mmap() of the size; "
	  "pmd = on a 2 MiB boundary, so THP (file, shmem or anon) can map it by PMD", 0, 0,
	  mm_align_choices },
	{ NULL },
};

#define MEDIAN " (median round of all workers, per page)"
static const struct mm_metric metrics[] = {
	{ "unmap_ns_per_page", "ns", 0, "munmap of the young mapping" MEDIAN },
	{ "touch_ns_per_page", "ns", 0, "read-touch that made the PTEs young" MEDIAN },
	{ "unmap_ns_per_page_total", "ns", 0, "munmap of the young mapping" MM_TOTAL },
	{ "touch_ns_per_page_total", "ns", 0, "read-touch that made the PTEs young" MM_TOTAL },
	{ NULL },
};

/* The timed windows, by id. */
enum { UY_TOUCH, UY_UNMAP };
static const struct mm_window windows[] = {
	{ "touch", "page", "the read-touch that made the PTEs young" },
	{ "unmap", "page", "munmap of the young mapping" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"zap_pte_range", "folio_mark_accessed", "folio_activate", "folio_batch_move_lru",
	"folio_lruvec_lock_irqsave", "tlb_finish_mmu", NULL,
};

static const char *const vmstat[] = {
	"pgactivate", "pgdeactivate", "pgfault", "pgmajfault", "pgpgin", NULL,
};

/* Shared between the workers and the parent. */
struct uy_shared {
	struct mm_hist unmap, touch;	/* round durations, pooled */
	int finished;			/* workers done with their timed rounds */
	long aligned_rounds, rounds;
	double start_mod_2m_kb;		/* worker 0's last mapping */
	struct mm_smaps probe;		/* worker 0's probe round */
	int probed;
};

static struct uy_shared *sh;

static int open_backing(struct mm_ctx *c, int index, size_t len)
{
	const char *backing = mm_arg_str(c, "backing");
	char path[512];
	int fd;

	if (!strcmp(backing, "anon"))
		return -1;
	if (!strcmp(backing, "shmem")) {
		fd = memfd_create("mmwork-unmap-young", MFD_CLOEXEC);
	} else {
		snprintf(path, sizeof(path), "%s/mmwork-unmap-young.%d.%d",
			 mm_arg_str(c, "dir"), (int)getppid(), index);
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		unlink(path);	/* gone when the worker exits, whatever happens */
	}
	if (fd < 0) {
		mm_error("open", errno);
		return -2;
	}
	/* Write the contents so they sit in the page cache (or shmem), clean. */
	if (mm_fill(fd, len)) {
		close(fd);
		return -2;
	}
	if (!strcmp(backing, "file") && fdatasync(fd))
		mm_error("fdatasync", errno);
	return fd;
}

/* Leave every folio inactive with PG_referenced set and its PTE young. */
static void make_cold_referenced(char *p, size_t len, int fd)
{
	if (madvise(p, len, MADV_COLD))
		mm_error("madvise_cold", errno);
	if (fd >= 0)
		mm_pread_all(fd, len);
}

/*
 * One round: map, put the folios in the --page-state, read-touch (timed),
 * munmap (timed).  With `probe` set it also reads smaps between the touch
 * and the munmap; such a round's times are never used, because the smaps
 * walk visits the very PTEs the munmap then zaps.
 */
static int uy_round(struct mm_ctx *c, int fd, size_t len, uint64_t *touch_ns,
		    uint64_t *unmap_ns, struct mm_smaps *probe, char **start)
{
	const int seq = (int)mm_arg_long(c, "sequential");
	const int cold = !strcmp(mm_arg_str(c, "page-state"), "cold");
	const size_t align = mm_align_bytes(mm_arg_str(c, "align"));
	char *p = fd >= 0 ? mm_map(len, align, PROT_READ, MAP_SHARED, fd)
			  : mm_map(len, align, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1);
	if (!p)
		return -1;
	*start = p;
	if (seq && madvise(p, len, MADV_SEQUENTIAL))
		mm_error("madvise_sequential", errno);
	if (fd < 0)
		mm_touch_write(p, len, 1);	/* anon: allocate real pages */
	if (cold) {
		mm_touch_read(p, len);
		make_cold_referenced(p, len, fd);
	}
	const int timed = !probe;
	uint64_t t0 = MM_WINDOW_BEGIN(UY_TOUCH, timed);
	mm_touch_read(p, len);
	uint64_t t1 = MM_WINDOW_END(UY_TOUCH, timed);
	if (probe)
		mm_smaps_range(p, len, probe);
	uint64_t t2 = MM_WINDOW_BEGIN(UY_UNMAP, timed);
	if (munmap(p, len))
		mm_error("munmap", errno);
	uint64_t t3 = MM_WINDOW_END(UY_UNMAP, timed);
	*touch_ns = t1 - t0;
	*unmap_ns = t3 - t2;
	return 0;
}

/* A worker's timed round, for mm_run_rounds. */
struct uy_run {
	int fd;
	size_t len;
	struct mm_hist *unmap, *touch;
};

static int uy_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct uy_run *r = arg;
	uint64_t touch_ns, unmap_ns;
	if (uy_round(c, r->fd, r->len, &touch_ns, &unmap_ns, NULL, start))
		return -1;
	mm_hist_add(r->touch, touch_ns);
	mm_hist_add(r->unmap, unmap_ns);
	return 0;
}

static int uy_worker(struct mm_ctx *c, int index)
{
	const size_t len = (size_t)mm_arg_long(c, "size-kb") * 1024;
	const int workers = (int)mm_arg_long(c, "workers");
	static struct mm_hist unmap, touch;	/* this worker's */
	uint64_t touch_ns, unmap_ns;
	struct mm_loop loop;
	int fd = open_backing(c, index, len);
	struct uy_run r = { fd, len, &unmap, &touch };

	if (fd == -2)
		return 1;
	/* Fault the histograms in before the first timed call, not during. */
	mm_hist_clear(&unmap);
	mm_hist_clear(&touch);
	if (mm_run_rounds(c, MM_GIVE_UP, uy_timed, &r, &loop))
		return 1;
	mm_hist_merge(&sh->unmap, &unmap);
	mm_hist_merge(&sh->touch, &touch);
	__atomic_fetch_add(&sh->rounds, loop.timed, __ATOMIC_RELAXED);
	__atomic_fetch_add(&sh->aligned_rounds, loop.aligned, __ATOMIC_RELAXED);
	__atomic_fetch_add(&sh->finished, 1, __ATOMIC_RELEASE);
	if (index == 0) {
		sh->start_mod_2m_kb = mm_pmd_offset_kb(loop.start);
		/* The state probe: one extra round, once every worker's timed
		 * rounds are over, so that it overlaps none of them. */
		if (mm_probes(c)) {
			const struct timespec ms = { 0, 1000000 };
			while (__atomic_load_n(&sh->finished, __ATOMIC_ACQUIRE) < workers)
				nanosleep(&ms, NULL);
			if (!uy_round(c, fd, len, &touch_ns, &unmap_ns, &sh->probe, &loop.start))
				sh->probed = 1;
		}
	}
	if (fd >= 0)
		close(fd);
	return 0;
}

static int uy_sample(struct mm_ctx *c)
{
	const int workers = (int)mm_arg_long(c, "workers");
	const double pages_per_round = (double)mm_arg_long(c, "size-kb") * 1024 / MM_PAGE_SIZE;
	uint64_t real_ns;

	sh = mm_shared_alloc(sizeof(*sh));
	int rc = mm_run_workers(c, workers, uy_worker, &real_ns);
	struct uy_shared r = *sh;
	munmap(sh, sizeof(*sh));
	if (rc || !r.rounds)
		return 1;

	const double pages = pages_per_round * (double)r.rounds;
	mm_metric(c, "unmap_ns_per_page", mm_hist_median(&r.unmap) / pages_per_round);
	mm_metric(c, "touch_ns_per_page", mm_hist_median(&r.touch) / pages_per_round);
	mm_metric(c, "unmap_ns_per_page_total", (double)r.unmap.sum_ns / pages);
	mm_metric(c, "touch_ns_per_page_total", (double)r.touch.sum_ns / pages);
	mm_count(c, "rounds", (double)r.rounds);
	mm_count(c, "pages", pages);
	mm_window_units(c, UY_TOUCH, pages_per_round);
	mm_window_units(c, UY_UNMAP, pages_per_round);
	/* Where the mappings started: pointers, not probes. */
	mm_state_num(c, "mapping_pmd_aligned_fraction", (double)r.aligned_rounds / (double)r.rounds);
	mm_state_num(c, "mapping_start_mod_2m_kb", r.start_mod_2m_kb);
	if (!mm_probes(c))
		return 0;
	if (r.probed) {
		mm_state_num(c, "file_pmd_mapped_kb", (double)r.probe.file_pmd_kb);
		mm_state_num(c, "shmem_pmd_mapped_kb", (double)r.probe.shmem_pmd_kb);
		mm_state_num(c, "anon_huge_kb", (double)r.probe.anon_huge_kb);
	}
	if (!strcmp(mm_arg_str(c, "backing"), "file"))
		mm_state_file_fs_magic(c, mm_arg_str(c, "dir"));
	return 0;
}

static const char *const tracepoints[] = { "vmscan", NULL };

const struct mm_workload wl_unmap_young = {
	.name = "unmap-young",
	.seed = "003: mm: drop mark_page_accessed from the unmap path",
	.summary = "map a file/shmem/anon range, read every page (young PTEs), time munmap",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.sample = uy_sample,
};
