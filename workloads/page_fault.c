/*
 * page_fault.c - first-touch faults of a fresh mapping, timed per page:
 * what one fault costs for each backing and access, and how faults of
 * several threads of one mm scale (will-it-scale's page_fault1/2/3).
 *
 * Every round maps a fresh range, lets --threads threads of this one
 * process touch disjoint contiguous slices of it (one access per 4 KiB
 * page), and unmaps it; only the touch is timed.  The fault path taken
 * depends on the backing and the access:
 *
 * - anon write: do_anonymous_page() allocates and zeroes a folio (with
 *   --thp hugepage on an aligned range, do_huge_pmd_anonymous_page() a
 *   whole PMD); anon read maps the shared zero page (the huge zero page
 *   with THP) and allocates nothing.
 * - file (MAP_SHARED of a file in --dir, written, synced and read once
 *   before the rounds, so its pages are cached and clean): a read fault is
 *   do_read_fault() -> do_fault_around() -> filemap_map_pages(), which maps
 *   up to fault_around_bytes of cached pages per fault; a write fault is
 *   do_shared_fault() (page_mkwrite, then the folio is dirtied).  Each such
 *   round ends with an untimed fdatasync(), so every round's write faults
 *   find clean pages.
 * - file-private (MAP_PRIVATE of the same file): a read fault maps the
 *   cached pages as above; a write fault is do_cow_fault(), which copies
 *   each page into a new anon folio.
 * - shmem (a memfd, MAP_SHARED): shmem_fault() allocates the folio on read
 *   and write alike; the memfd's pages are punched out after every round
 *   (untimed), so every round allocates again.
 *
 * With more than one thread, the faults share the VMA (per-VMA lock: the
 * mmap_lock is not taken), the page-table locks where slices share a page
 * table, and the mm's counters.  Each thread times its own slice.  What
 * backed the mapping is read from smaps on one extra untimed round after
 * the timed ones.  The populate of a MAP_POPULATE mapping (the same faults,
 * taken by the kernel) is populate-unmap's.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *const backing_choices[] = { "anon", "file", "file-private", "shmem", NULL };
static const char *const access_choices[] = { "write", "read", NULL };

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("size-kb", "4096", "mapping size in KiB (all threads' slices together)"),
	{ "backing", MM_CHOICE, "anon", "what backs the mapping: anon (private anonymous), file "
	  "(MAP_SHARED of a cached file in --dir), file-private (MAP_PRIVATE of it), shmem "
	  "(a memfd, emptied after every round)", 0, 0, backing_choices },
	{ "access", MM_CHOICE, "write", "how each page is first touched: write (allocating, "
	  "CoW or dirtying fault) or read", 0, 0, access_choices },
	MM_PARAM_THP("default", "mapping", ": hugepage lets anon (and shmem with "
		     "shmem_enabled=advise) fault whole PMDs"),
	{ "threads", MM_INT, "1", "threads of this one process, each touching its own contiguous "
	  "slice of the one mapping (they share the VMA, its lock and the mm)", 1, 1024, NULL },
	MM_PARAM_ALIGN("mapping", "all of it", ""),
	MM_PARAM_DIR("directory for the file of --backing file and file-private (created, "
		     "unlinked at once)"),
	MM_PARAM_ROUNDS("8", "minimum map/touch/unmap rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "fault_ns_per_page", "ns", 0, "first touch of every page of a thread's slice "
	  "(the faults) (median round of every thread, per page)" },
	{ "fault_ns_per_page_total", "ns", 0, "first touch of every page (the faults)" MM_TOTAL },
	{ "pages_per_s_real", "pages/s", 1, "pages faulted by all threads per second of the "
	  "rounds' wall time (first thread's start to last thread's end; all rounds)" },
	{ NULL },
};

/* The timed window, by id: one per thread and round. */
enum { PF_FAULT };
static const struct mm_window windows[] = {
	{ "fault", "page", "the first touch of a thread's slice (one access per page)" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"handle_mm_fault", "lock_vma_under_rcu", "do_anonymous_page",
	"do_huge_pmd_anonymous_page", "vma_alloc_folio_noprof", "folio_add_new_anon_rmap",
	"do_fault", "do_read_fault", "do_fault_around", "filemap_map_pages", "filemap_fault",
	"do_cow_fault", "do_shared_fault", "do_page_mkwrite", "fault_dirty_shared_page",
	"shmem_fault", "shmem_get_folio_gfp", "shmem_alloc_and_add_folio", "set_pte_range", NULL,
};

static const char *const vmstat[] = {
	"pgfault", "pgmajfault", "pgalloc_normal", "pgfree", "thp_fault_alloc",
	"thp_fault_fallback", "thp_file_alloc", "thp_file_mapped", "thp_zero_page_alloc",
	"nr_dirtied", "nr_written", NULL,
};

/* The threads and the round they work on. */
struct pf_slice {
	uint64_t begin, end;	/* this round's window */
	size_t pages;
};

static struct {
	pthread_barrier_t start, done;
	int threads;		/* the pool's, the calling thread included; 0: none yet */
	int write, timed;
	char *p;		/* this round's mapping */
	size_t pages;
	struct pf_slice *slice;
} pf;

/* Thread i's slice of the round's mapping, touched inside its window. */
static void pf_touch(int i)
{
	const size_t lo = pf.pages * (size_t)i / (size_t)pf.threads;
	const size_t hi = pf.pages * (size_t)(i + 1) / (size_t)pf.threads;
	char *s = pf.p + lo * MM_PAGE_SIZE;
	const size_t n = (hi - lo) * MM_PAGE_SIZE;

	uint64_t t0 = MM_WINDOW_BEGIN(PF_FAULT, pf.timed);
	if (pf.write)
		mm_touch_write(s, n, 1);
	else
		mm_touch_read(s, n);
	uint64_t t1 = MM_WINDOW_END(PF_FAULT, pf.timed);
	pf.slice[i] = (struct pf_slice){ t0, t1, hi - lo };
}

static void *pf_thread(void *arg)
{
	const int i = (int)(intptr_t)arg;
	for (;;) {
		pthread_barrier_wait(&pf.start);
		pf_touch(i);
		pthread_barrier_wait(&pf.done);
	}
	return NULL;
}

/*
 * Threads 1 .. n-1 (the calling thread is 0), started on the first sample
 * and kept for the life of the process: each opens its perf counters once,
 * in the warm-up, and no thread starts or ends beside a timed round.  They
 * block the signals the harness restores settings on, which stay the main
 * thread's.
 */
static int pf_pool(int n)
{
	sigset_t all, old;
	if (pf.threads)
		return 0;
	pf.slice = calloc((size_t)n, sizeof(*pf.slice));
	if (!pf.slice)
		return -1;
	if (n > 1) {
		pthread_barrier_init(&pf.start, NULL, (unsigned)n);
		pthread_barrier_init(&pf.done, NULL, (unsigned)n);
	}
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (int i = 1; i < n; i++) {
		pthread_t tid;
		int err = pthread_create(&tid, NULL, pf_thread, (void *)(intptr_t)i);
		if (err) {	/* the sample fails, and mmwork with it */
			mm_error("pthread_create", err);
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			return -1;
		}
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pf.threads = n;
	return 0;
}

/* The fd behind the mapping: -1 for anon, -2 when it cannot be made. */
static int pf_open_backing(struct mm_ctx *c, size_t len)
{
	const char *backing = mm_arg_str(c, "backing");
	int fd;

	if (!strcmp(backing, "anon"))
		return -1;
	if (!strcmp(backing, "shmem")) {
		fd = memfd_create("mmwork-page-fault", MFD_CLOEXEC);
		if (fd < 0) {
			mm_error("memfd_create", errno);
			return -2;
		}
		if (ftruncate(fd, (off_t)len)) {
			mm_error("ftruncate", errno);
			close(fd);
			return -2;
		}
		return fd;
	}
	fd = mm_open_unlinked(mm_arg_str(c, "dir"), "mmwork-page-fault");
	if (fd < 0) {
		mm_error("open", errno);
		return -2;
	}
	/* Write it, sync it (clean) and read it once: every page cached. */
	if (mm_fill(fd, len)) {
		close(fd);
		return -2;
	}
	if (fdatasync(fd))
		mm_error("fdatasync", errno);
	mm_pread_all(fd, len);
	return fd;
}

/*
 * One round: map, advise, every thread touches its slice (timed unless
 * `probe`), unmap, and put the backing back as the next round needs it.
 * With `probe` set, smaps is read between the touch and the unmap; that
 * round's times are never used.
 */
static int pf_round(struct mm_ctx *c, int fd, size_t len, struct mm_smaps *probe, char **start)
{
	const char *backing = mm_arg_str(c, "backing");
	const int shared = !strcmp(backing, "file") || !strcmp(backing, "shmem");
	const int flags = fd < 0 ? MAP_PRIVATE | MAP_ANONYMOUS : shared ? MAP_SHARED : MAP_PRIVATE;
	char *p = mm_map_range(c, len, flags, fd, start);
	if (!p)
		return -1;

	pf.p = p;
	pf.timed = !probe;
	if (pf.threads > 1)
		pthread_barrier_wait(&pf.start);
	pf_touch(0);
	if (pf.threads > 1)
		pthread_barrier_wait(&pf.done);

	if (probe)
		mm_smaps_range(p, len, probe);
	if (munmap(p, len))
		mm_error("munmap", errno);
	if (!strcmp(backing, "shmem") &&
	    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)len))
		mm_error("fallocate_punch_hole", errno);
	if (!strcmp(backing, "file") && pf.write && fdatasync(fd))
		mm_error("fdatasync", errno);
	return 0;
}

static int pf_validate(struct mm_ctx *c)
{
	const long pages = mm_arg_long(c, "size-kb") / 4, threads = mm_arg_long(c, "threads");
	if (threads > pages) {
		fprintf(stderr, "mmwork: page-fault: --threads %ld is more than the %ld pages of "
			"--size-kb\n", threads, pages);
		return -1;
	}
	return 0;
}

static long pf_minflt(void)
{
	struct rusage r;
	return getrusage(RUSAGE_SELF, &r) ? 0 : r.ru_minflt;
}

/* A timed round for mm_run_rounds: every thread's slice. */
struct pf_run {
	int fd;
	size_t len;
	struct mm_rounds fault_ps;	/* per thread and round: ps per page */
	uint64_t total_ns, span_ns;
};

static int pf_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct pf_run *r = arg;
	uint64_t lo = UINT64_MAX, hi = 0;
	if (pf_round(c, r->fd, r->len, NULL, start))
		return -1;
	for (int i = 0; i < pf.threads; i++) {
		const struct pf_slice *s = &pf.slice[i];
		mm_rounds_add(&r->fault_ps, (s->end - s->begin) * 1000 / s->pages);
		r->total_ns += s->end - s->begin;
		lo = s->begin < lo ? s->begin : lo;
		hi = s->end > hi ? s->end : hi;
	}
	r->span_ns += hi - lo;
	return 0;
}

static int pf_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "size-kb") * 1024 & ~(MM_PAGE_SIZE - 1);
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct pf_run r = { .len = len };
	struct mm_loop loop;

	if (pf_pool((int)mm_arg_long(c, "threads")))
		return 1;
	pf.write = !strcmp(mm_arg_str(c, "access"), "write");
	pf.pages = len / MM_PAGE_SIZE;
	const int fd = r.fd = pf_open_backing(c, len);
	if (fd == -2)
		return 1;

	/* The timed rounds read no state: rusage's fault count is taken
	 * around all of them. */
	const long flt0 = pf_minflt();
	const int rc = mm_run_rounds(c, MM_GIVE_UP, pf_timed, &r, &loop) ? 1 : 0;
	const long flt1 = pf_minflt();
	const long rounds = loop.timed;

	struct mm_smaps probe;
	int probed = 0;
	if (!rc && mm_probes(c))
		probed = !pf_round(c, fd, len, &probe, &loop.start);
	if (fd >= 0)
		close(fd);
	if (!rounds) {
		mm_rounds_free(&r.fault_ps);
		return 1;
	}

	const double all = pages * (double)rounds;
	mm_metric(c, "fault_ns_per_page", mm_rounds_median(&r.fault_ps) / 1000);
	mm_metric(c, "fault_ns_per_page_total", (double)r.total_ns / all);
	mm_metric(c, "pages_per_s_real", all / ((double)r.span_ns / 1e9));
	mm_rounds_free(&r.fault_ps);
	mm_count(c, "rounds", (double)rounds);
	mm_count(c, "pages", all);
	mm_count(c, "threads", pf.threads);
	/* Faults the kernel counted for this process over the timed rounds:
	 * 1 per page, 1/16 with 64 KiB fault-around, 1/512 with PMDs. */
	mm_count(c, "faults_per_page", (double)(flt1 - flt0) / all);
	mm_window_units(c, PF_FAULT, pages / pf.threads);
	/* Where the kernel put the mappings: a pointer, not a probe. */
	mm_state_placement(c, &loop);
	if (!mm_probes(c))
		return rc;
	if (probed) {
		const double huge_kb = (double)(probe.anon_huge_kb + probe.file_pmd_kb +
						probe.shmem_pmd_kb);
		mm_state_num(c, "thp_backed_fraction", huge_kb / ((double)len / 1024));
		mm_state_smaps(c, "after_fault_", &probe);
	}
	if (!strncmp(mm_arg_str(c, "backing"), "file", 4))
		mm_state_file_fs_magic(c, mm_arg_str(c, "dir"));
	return rc;
}

static const char *const tracepoints[] = { "exceptions", "mmap_lock", "huge_memory", NULL };

const struct mm_workload wl_page_fault = {
	.name = "page-fault",
	.seed = "none: a baseline of the fault path (will-it-scale page_fault1/2/3)",
	.summary = "fresh anon/file/shmem mapping, first read or write touch of every page by "
		   "1..N threads of one mm, timed per page (MAP_POPULATE's faults: populate-unmap)",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.validate = pf_validate,
	.sample = pf_sample,
};
