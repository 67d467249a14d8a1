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
 * accessed on zap.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef MADV_COLD
#define MADV_COLD 20
#endif

static const char *const backing_choices[] = { "file", "shmem", "anon", NULL };
static const char *const state_choices[] = { "cold", "warm", NULL };

static const struct mm_param params[] = {
	{ "size-kb", MM_SIZE_KB, "32768", "mapping size per worker in KiB", 64, 1L << 40, NULL },
	{ "backing", MM_CHOICE, "file", "what backs the mapping", 0, 0, backing_choices },
	{ "sequential", MM_FLAG, NULL, "madvise(MADV_SEQUENTIAL): VM_SEQ_READ skips the marking", 0, 0, NULL },
	{ "page-state", MM_CHOICE, "cold", "LRU state of the folios at unmap (see source)", 0, 0, state_choices },
	{ "workers", MM_INT, "1", "worker processes, each with its own file", 1, 4096, NULL },
	{ "rounds", MM_INT, "4", "minimum map/touch/unmap rounds per worker and sample", 1, 1000000, NULL },
	{ "min-ms", MM_INT, "100", "minimum measured time per worker and sample in ms", 0, 3600000, NULL },
	{ "dir", MM_PATH, "/var/tmp", "directory for --backing file", 0, 0, NULL },
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "unmap_ns_per_page", "ns", 0, "munmap of the young mapping, per page" },
	{ "touch_ns_per_page", "ns", 0, "read-touch that made the PTEs young, per page" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"zap_pte_range", "folio_mark_accessed", "folio_activate", "folio_batch_move_lru",
	"folio_lruvec_lock_irqsave", "tlb_finish_mmu", NULL,
};

static const char *const vmstat[] = {
	"pgactivate", "pgdeactivate", "pgfault", "pgmajfault", "pgpgin", NULL,
};

struct uy_result {
	long rounds;
	uint64_t unmap_ns, touch_ns;
	long file_pmd_kb, shmem_pmd_kb, anon_huge_kb;
};

static struct uy_result *res;

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
	char *chunk = malloc(1 << 20);
	memset(chunk, 0x5a, 1 << 20);
	for (size_t off = 0; off < len; off += 1 << 20) {
		size_t n = len - off < (1 << 20) ? len - off : (1 << 20);
		if (pwrite(fd, chunk, n, (off_t)off) != (ssize_t)n) {
			mm_error("pwrite", errno);
			free(chunk);
			close(fd);
			return -2;
		}
	}
	free(chunk);
	if (!strcmp(backing, "file") && fdatasync(fd))
		mm_error("fdatasync", errno);
	return fd;
}

/* Leave every folio inactive with PG_referenced set and its PTE young. */
static void make_cold_referenced(char *p, size_t len, int fd)
{
	if (madvise(p, len, MADV_COLD))
		mm_error("madvise_cold", errno);
	if (fd >= 0) {
		char *buf = malloc(1 << 20);
		for (size_t off = 0; off < len; off += 1 << 20)
			if (pread(fd, buf, 1 << 20, (off_t)off) < 0)
				mm_error("pread", errno);
		free(buf);
	}
}

static int uy_worker(struct mm_ctx *c, int index)
{
	const size_t len = (size_t)mm_arg_long(c, "size-kb") * 1024;
	const int seq = (int)mm_arg_long(c, "sequential");
	const int cold = !strcmp(mm_arg_str(c, "page-state"), "cold");
	const long min_rounds = mm_arg_long(c, "rounds");
	const double min_s = (double)mm_arg_long(c, "min-ms") / 1000.0;
	struct uy_result r = { 0 };
	int fd = open_backing(c, index, len);

	if (fd == -2)
		return 1;
	const uint64_t start = mm_now_ns();
	while (r.rounds < min_rounds || !mm_deadline_passed(start, min_s)) {
		char *p = fd >= 0 ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0)
				  : mmap(NULL, len, PROT_READ | PROT_WRITE,
					 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			mm_error("mmap", errno);
			return 1;
		}
		if (seq && madvise(p, len, MADV_SEQUENTIAL))
			mm_error("madvise_sequential", errno);
		if (fd < 0)
			mm_touch_write(p, len, 1);	/* anon: allocate real pages */
		if (cold) {
			mm_touch_read(p, len);
			make_cold_referenced(p, len, fd);
		}
		uint64_t t0 = mm_now_ns();
		mm_touch_read(p, len);
		uint64_t t1 = mm_now_ns();
		if (r.rounds == 0) {
			struct mm_smaps s;
			mm_smaps_range(p, len, &s);
			r.file_pmd_kb = s.file_pmd_kb;
			r.shmem_pmd_kb = s.shmem_pmd_kb;
			r.anon_huge_kb = s.anon_huge_kb;
		}
		uint64_t t2 = mm_now_ns();
		if (munmap(p, len))
			mm_error("munmap", errno);
		uint64_t t3 = mm_now_ns();
		r.touch_ns += t1 - t0;
		r.unmap_ns += t3 - t2;
		r.rounds++;
	}
	if (fd >= 0)
		close(fd);
	res[index] = r;
	return 0;
}

static int uy_sample(struct mm_ctx *c)
{
	const int workers = (int)mm_arg_long(c, "workers");
	const double pages_per_round = (double)mm_arg_long(c, "size-kb") * 1024 / MM_PAGE_SIZE;
	struct uy_result sum = { 0 };
	uint64_t real_ns;
	struct statfs fs;

	res = mm_shared_alloc((size_t)workers * sizeof(*res));
	int rc = mm_run_workers(c, workers, uy_worker, &real_ns);
	for (int i = 0; i < workers; i++) {
		sum.rounds += res[i].rounds;
		sum.unmap_ns += res[i].unmap_ns;
		sum.touch_ns += res[i].touch_ns;
	}
	sum.file_pmd_kb = res[0].file_pmd_kb;
	sum.shmem_pmd_kb = res[0].shmem_pmd_kb;
	sum.anon_huge_kb = res[0].anon_huge_kb;
	munmap(res, (size_t)workers * sizeof(*res));
	if (rc || !sum.rounds)
		return 1;

	const double pages = pages_per_round * (double)sum.rounds;
	mm_metric(c, "unmap_ns_per_page", (double)sum.unmap_ns / pages);
	mm_metric(c, "touch_ns_per_page", (double)sum.touch_ns / pages);
	mm_count(c, "rounds", (double)sum.rounds);
	mm_count(c, "pages", pages);
	mm_state_num(c, "file_pmd_mapped_kb", (double)sum.file_pmd_kb);
	mm_state_num(c, "shmem_pmd_mapped_kb", (double)sum.shmem_pmd_kb);
	mm_state_num(c, "anon_huge_kb", (double)sum.anon_huge_kb);
	if (!strcmp(mm_arg_str(c, "backing"), "file") && !statfs(mm_arg_str(c, "dir"), &fs)) {
		char magic[32];
		snprintf(magic, sizeof(magic), "0x%lx", (unsigned long)fs.f_type);
		mm_state_str(c, "file_fs_magic", magic);
	}
	return 0;
}

static const char *const tracepoints[] = { "vmscan", NULL };

const struct mm_workload wl_unmap_young = {
	.name = "unmap-young",
	.seed = "003: mm: drop mark_page_accessed from the unmap path",
	.summary = "map a file/shmem/anon range, read every page (young PTEs), time munmap",
	.params = params,
	.metrics = metrics,
	.mm_paths = mm_paths,
	.vmstat = vmstat,
	.tracepoints = tracepoints,
	.default_warmups = 1,
	.sample = uy_sample,
};
