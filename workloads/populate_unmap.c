/*
 * populate_unmap.c - seed 000, the core of the mremap churn: a short-lived
 * mmap(MAP_POPULATE) and its munmap, each timed on its own.
 *
 * populate goes __mm_populate -> populate_vma_page_range -> lru_add_drain,
 * unmap goes zap_pte_range -> tlb_finish_mmu -> release_pages; both take the
 * lruvec lock, so their per-page cost rises with the number of workers.
 * No state is probed during a sample (the harness reads vmstat before and
 * after it), and mappings go wherever mmap() puts them: they are small.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <sys/mman.h>

static const struct mm_param params[] = {
	{ "workers", MM_INT, "2", "worker processes", 1, 65536, NULL },
	{ "bytes", MM_BYTES, "4096", "bytes per mapping", 4096, 1L << 36, NULL },
	{ "seconds", MM_FLOAT, "1", "measured run time per sample", 0, 0, NULL },
	{ NULL },
};

#define MEDIAN " (median mapping, per page)"
static const struct mm_metric metrics[] = {
	{ "populate_ns_per_page", "ns", 0, "mmap(MAP_POPULATE) time" MEDIAN },
	{ "unmap_ns_per_page", "ns", 0, "munmap time" MEDIAN },
	{ "ops_per_s_real", "ops/s", 1, "map+unmap pairs per second of wall time, all workers "
	  "(whole sample)" },
	{ "populate_ns_per_page_total", "ns", 0, "mmap(MAP_POPULATE) time" MM_TOTAL },
	{ "unmap_ns_per_page_total", "ns", 0, "munmap time" MM_TOTAL },
	{ NULL },
};

/* The timed windows, by id. */
enum { PU_POPULATE, PU_UNMAP };
static const struct mm_window windows[] = {
	{ "populate", "page", "mmap(MAP_POPULATE)" },
	{ "unmap", "page", "munmap" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"__mm_populate", "populate_vma_page_range", "lru_add_drain", "folio_batch_move_lru",
	"folio_lruvec_lock_irqsave", "zap_pte_range", "release_pages", "folios_put_refs",
	"native_queued_spin_lock_slowpath", NULL,
};

static const char *const vmstat[] = {
	"pgfault", "pgfree", "pgalloc_normal", "thp_fault_alloc", NULL,
};

/* Per mapping, pooled over the workers, in shared memory. */
static struct mm_hist *populate_hist, *unmap_hist;

/* The loop reads no state: nothing here probes between the timed calls. */
static int pu_worker(struct mm_ctx *c, int index)
{
	const size_t bytes = (size_t)mm_arg_long(c, "bytes") & ~(MM_PAGE_SIZE - 1);
	const double seconds = mm_arg_double(c, "seconds");
	static struct mm_hist populate, unmap;	/* this worker's */

	(void)index;
	/* Fault the histograms in before the first timed call, not during. */
	mm_hist_clear(&populate);
	mm_hist_clear(&unmap);
	const uint64_t start = mm_now_ns();
	while (!mm_deadline_passed(start, seconds)) {
		uint64_t t0 = MM_WINDOW_BEGIN(PU_POPULATE, 1);
		void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		uint64_t t1 = MM_WINDOW_END(PU_POPULATE, 1);
		if (p == MAP_FAILED) {
			mm_error("mmap", errno);
			continue;
		}
		uint64_t t2 = MM_WINDOW_BEGIN(PU_UNMAP, 1);
		if (munmap(p, bytes))
			mm_error("munmap", errno);
		uint64_t t3 = MM_WINDOW_END(PU_UNMAP, 1);
		mm_hist_add(&populate, t1 - t0);
		mm_hist_add(&unmap, t3 - t2);
	}
	mm_hist_merge(populate_hist, &populate);
	mm_hist_merge(unmap_hist, &unmap);
	return 0;
}

static int pu_sample(struct mm_ctx *c)
{
	const int workers = (int)mm_arg_long(c, "workers");
	const double pages_per_op = (double)((size_t)mm_arg_long(c, "bytes") / MM_PAGE_SIZE);
	uint64_t real_ns;

	populate_hist = mm_shared_alloc(2 * sizeof(struct mm_hist));
	unmap_hist = populate_hist + 1;
	int rc = mm_run_workers(c, workers, pu_worker, &real_ns);
	const long ops = (long)populate_hist->n;
	if (ops) {
		const double pages = pages_per_op * (double)ops;
		mm_metric(c, "populate_ns_per_page", mm_hist_median(populate_hist) / pages_per_op);
		mm_metric(c, "unmap_ns_per_page", mm_hist_median(unmap_hist) / pages_per_op);
		mm_metric(c, "ops_per_s_real", (double)ops / ((double)real_ns / 1e9));
		mm_metric(c, "populate_ns_per_page_total", (double)populate_hist->sum_ns / pages);
		mm_metric(c, "unmap_ns_per_page_total", (double)unmap_hist->sum_ns / pages);
		mm_count(c, "ops", (double)ops);
		mm_count(c, "pages", pages);
		mm_count(c, "workers", workers);
		mm_window_units(c, PU_POPULATE, pages_per_op);
		mm_window_units(c, PU_UNMAP, pages_per_op);
	}
	munmap(populate_hist, 2 * sizeof(struct mm_hist));
	return ops ? rc : 1;
}

static const char *const tracepoints[] = { "mmap_lock", NULL };

const struct mm_workload wl_populate_unmap = {
	.name = "populate-unmap",
	.seed = "000: the populate/unmap core of the stress-ng --mremap contention",
	.summary = "per worker: short-lived mmap(MAP_POPULATE) + munmap, each timed",
	MM_WORKLOAD_TABLES,
	.default_warmups = 0,
	.sample = pu_sample,
};
