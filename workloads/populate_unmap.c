/*
 * populate_unmap.c - seed 000, the core of the mremap churn: a short-lived
 * mmap(MAP_POPULATE) and its munmap, each timed on its own.
 *
 * populate goes __mm_populate -> populate_vma_page_range -> lru_add_drain,
 * unmap goes zap_pte_range -> tlb_finish_mmu -> release_pages; both take the
 * lruvec lock, so their per-page cost rises with the number of workers.
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

static const struct mm_metric metrics[] = {
	{ "populate_ns_per_page", "ns", 0, "mmap(MAP_POPULATE) time per page" },
	{ "unmap_ns_per_page", "ns", 0, "munmap time per page" },
	{ "ops_per_s_real", "ops/s", 1, "map+unmap pairs per second of wall time, all workers" },
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

struct pu_result {
	long ops;
	uint64_t populate_ns, unmap_ns;
};

static struct pu_result *res;	/* one per worker, in shared memory */

static int pu_worker(struct mm_ctx *c, int index)
{
	const size_t bytes = (size_t)mm_arg_long(c, "bytes") & ~(MM_PAGE_SIZE - 1);
	const double seconds = mm_arg_double(c, "seconds");
	const uint64_t start = mm_now_ns();
	struct pu_result r = { 0 };

	while (!mm_deadline_passed(start, seconds)) {
		uint64_t t0 = mm_now_ns();
		void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		uint64_t t1 = mm_now_ns();
		if (p == MAP_FAILED) {
			mm_error("mmap", errno);
			continue;
		}
		if (munmap(p, bytes))
			mm_error("munmap", errno);
		uint64_t t2 = mm_now_ns();
		r.populate_ns += t1 - t0;
		r.unmap_ns += t2 - t1;
		r.ops++;
	}
	res[index] = r;
	return 0;
}

static int pu_sample(struct mm_ctx *c)
{
	const int workers = (int)mm_arg_long(c, "workers");
	const double pages_per_op = (double)((size_t)mm_arg_long(c, "bytes") / MM_PAGE_SIZE);
	struct pu_result sum = { 0 };
	uint64_t real_ns;

	res = mm_shared_alloc((size_t)workers * sizeof(*res));
	int rc = mm_run_workers(c, workers, pu_worker, &real_ns);
	for (int i = 0; i < workers; i++) {
		sum.ops += res[i].ops;
		sum.populate_ns += res[i].populate_ns;
		sum.unmap_ns += res[i].unmap_ns;
	}
	munmap(res, (size_t)workers * sizeof(*res));
	if (!sum.ops)
		return 1;

	const double pages = pages_per_op * (double)sum.ops;
	mm_metric(c, "populate_ns_per_page", (double)sum.populate_ns / pages);
	mm_metric(c, "unmap_ns_per_page", (double)sum.unmap_ns / pages);
	mm_metric(c, "ops_per_s_real", (double)sum.ops / ((double)real_ns / 1e9));
	mm_count(c, "ops", (double)sum.ops);
	mm_count(c, "pages", pages);
	mm_count(c, "workers", workers);
	return rc;
}

static const char *const tracepoints[] = { "mmap_lock", NULL };

const struct mm_workload wl_populate_unmap = {
	.name = "populate-unmap",
	.seed = "000: the populate/unmap core of the stress-ng --mremap contention",
	.summary = "per worker: short-lived mmap(MAP_POPULATE) + munmap, each timed",
	.params = params,
	.metrics = metrics,
	.mm_paths = mm_paths,
	.vmstat = vmstat,
	.tracepoints = tracepoints,
	.default_warmups = 0,
	.sample = pu_sample,
};
