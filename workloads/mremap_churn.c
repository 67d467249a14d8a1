/*
 * mremap_churn.c - seed 000: stress-ng's mremap stressor, one bogo op per
 * cycle: mmap(MAP_POPULATE) of --bytes, shrink by halving with mremap(), grow
 * back by doubling, munmap.
 *
 * With small mappings (the report used 4 KiB) the cycle is mostly populate
 * and unmap: every populate drains the per-CPU LRU batch (lru_add_drain ->
 * folio_batch_move_lru) and every unmap frees through release_pages, both
 * under the lruvec lock, which is where many workers contend.  --numa-move
 * adds mbind(MPOL_MF_MOVE), which isolates the folios from the LRU first and
 * was seen to remove most of the system time.  Like stress-ng's
 * --mremap-numa it binds each mapping to another node in turn, so with two
 * or more nodes (a guest with numa_nodes = 2) every other mapping really
 * migrates; with one node the bind moves nothing.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_BIND_ 2
#define MPOL_MF_MOVE_ (1 << 1)

static const struct mm_param params[] = {
	{ "workers", MM_INT, "2", "worker processes", 1, 65536, NULL },
	{ "bytes", MM_BYTES, "4096", "bytes mapped per worker and cycle (stress-ng divides "
	  "--mremap-bytes by the instance count; this is the per-worker size)",
	  4096, 1L << 36, NULL },
	{ "seconds", MM_FLOAT, "2", "measured run time per sample", 0, 0, NULL },
	{ "numa-move", MM_FLAG, NULL, "mbind(MPOL_BIND, MPOL_MF_MOVE) each mapping to the next "
	  "NUMA node in turn", 0, 0, NULL },
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "ops_per_s_real", "ops/s", 1, "bogo ops per second of wall time (stress-ng 'real time'; "
	  "total ops over the whole sample)" },
	{ "ops_per_s_cpu", "ops/s", 1, "bogo ops per second of usr+sys time (stress-ng 'usr+sys "
	  "time'; total ops over total CPU time)" },
	{ "sys_s", "s", 0, "system time of all workers (whole sample)" },
	{ "usr_s", "s", 0, "user time of all workers (whole sample)" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"__mm_populate", "populate_vma_page_range", "lru_add_drain", "folio_batch_move_lru",
	"folio_lruvec_lock_irqsave", "release_pages", "folios_put_refs",
	"__page_cache_release", "native_queued_spin_lock_slowpath", "move_vma",
	"do_mbind", NULL,
};

static const char *const vmstat[] = {
	"pgfault", "pgfree", "pgalloc_normal", "pgactivate", "pgdeactivate", "pswpout",
	"pgmigrate_success", "pgmigrate_fail", "numa_pages_migrated", "thp_fault_alloc", NULL,
};

static long *ops;	/* one counter per worker, in shared memory */

static int remap(char **buf, size_t old_sz, size_t new_sz)
{
	char *p = mremap(*buf, old_sz, new_sz, MREMAP_MAYMOVE);
	if (p == MAP_FAILED) {
		mm_error("mremap", errno);
		return -1;
	}
	*buf = p;
	return 0;
}

static int churn_worker(struct mm_ctx *c, int index)
{
	const size_t bytes = (size_t)mm_arg_long(c, "bytes") & ~(MM_PAGE_SIZE - 1);
	const double seconds = mm_arg_double(c, "seconds");
	const int numa_move = (int)mm_arg_long(c, "numa-move");
	const int online = mm_online_nodes();
	const int nodes = online > 64 ? 64 : online;
	const uint64_t start = mm_now_ns();
	long n = 0;

	while (!mm_deadline_passed(start, seconds)) {
		size_t sz = bytes;
		char *buf = mmap(NULL, sz, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (buf == MAP_FAILED) {
			mm_error("mmap", errno);
			continue;
		}
		const unsigned long node = 1UL << ((n + index) % nodes);
		if (numa_move && syscall(SYS_mbind, buf, sz, MPOL_BIND_, &node,
					 sizeof(node) * 8, MPOL_MF_MOVE_))
			mm_error("mbind", errno);
		for (; sz / 2 > MM_PAGE_SIZE; sz /= 2)
			if (remap(&buf, sz, sz / 2))
				break;
		for (; sz * 2 <= bytes; sz *= 2)
			if (remap(&buf, sz, sz * 2))
				break;
		if (munmap(buf, sz))
			mm_error("munmap", errno);
		n++;
	}
	ops[index] = n;
	return 0;
}

static int churn_sample(struct mm_ctx *c)
{
	const int workers = (int)mm_arg_long(c, "workers");
	uint64_t real_ns;
	long total = 0;

	ops = mm_shared_alloc((size_t)workers * sizeof(*ops));
	double usr0, sys0, usr1, sys1;
	/* Nothing probes page state while the workers run; the harness reads
	 * vmstat before and after the sample. */
	mm_children_cpu_s(&usr0, &sys0);
	int rc = mm_run_workers(c, workers, churn_worker, &real_ns);
	mm_children_cpu_s(&usr1, &sys1);
	for (int i = 0; i < workers; i++)
		total += ops[i];
	munmap(ops, (size_t)workers * sizeof(*ops));

	const double usr = usr1 - usr0, sys = sys1 - sys0;
	const double real = (double)real_ns / 1e9;
	mm_metric(c, "ops_per_s_real", (double)total / real);
	mm_metric(c, "ops_per_s_cpu", usr + sys > 0 ? (double)total / (usr + sys) : 0);
	mm_metric(c, "sys_s", sys);
	mm_metric(c, "usr_s", usr);
	mm_count(c, "ops", (double)total);
	mm_count(c, "real_s", real);
	mm_count(c, "workers", workers);
	mm_state_num(c, "numa_nodes", (double)mm_online_nodes());
	return total ? rc : 1;	/* no cycle got its mapping: nothing measured (core-errno.h) */
}

static const char *const tracepoints[] = { "mmap_lock", "migrate", NULL };

const struct mm_workload wl_mremap_churn = {
	.name = "mremap-churn",
	.seed = "000: stress-ng --mremap lruvec lock contention in populate/unmap",
	.summary = "per worker: mmap(MAP_POPULATE), mremap shrink/grow, munmap, in a loop",
	.params = params,
	.metrics = metrics,
	.mm_paths = mm_paths,
	.vmstat = vmstat,
	.tracepoints = tracepoints,
	.default_warmups = 0,
	.sample = churn_sample,
};
