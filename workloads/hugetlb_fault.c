/*
 * hugetlb_fault.c - faulting in and unmapping hugetlb pages from the
 * reserved pool.
 *
 * Each round maps --mapping-kb with MAP_HUGETLB (the default huge page
 * size, 2 MiB; private or shared anonymous memory, --sharing), then times
 * a write to every huge page (hugetlb_fault -> alloc_hugetlb_folio from the
 * pool -> folio_zero_user; a shared mapping also adds each folio to its
 * hugetlbfs page cache) and the munmap (__unmap_hugepage_range, the
 * folios back to the pool, and for a shared mapping the file's removal).
 * Per page is per 4 KiB page, so that the figures sit beside THP's.
 *
 * The pool is a global setting: a sample that finds fewer free huge pages
 * than the mapping needs raises /proc/sys/vm/nr_hugepages by the
 * difference before its first round (journaled, and put back after the
 * sample: core-knobs.h), so it needs root.  A pool that cannot grow
 * (fragmented memory) fails the sample with the reason on stderr.  How many
 * huge pages a round took from the pool is read on one extra untimed round
 * (/proc/meminfo's HugePages_Free before and after its faults).
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"
#define HUGE_SIZE (2UL << 20)

static const char *const sharing_choices[] = { "private", "shared", NULL };

static const struct mm_param params[] = {
	{ "sharing", MM_CHOICE, "private", "MAP_PRIVATE or MAP_SHARED anonymous hugetlb memory "
	  "(shared: each folio goes into the mapping's hugetlbfs page cache)", 0, 0,
	  sharing_choices },
	{ "mapping-kb", MM_SIZE_KB, "8192", "mapping size in KiB, a multiple of 2048 (one huge "
	  "page each; the pool grows by what it lacks)", 2048, 1L << 40, NULL },
	MM_PARAM_ROUNDS("8", "minimum map/fault/unmap rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

#define MEDIAN MM_MEDIAN_PER("4 KiB page")
static const struct mm_metric metrics[] = {
	{ "fault_ns_per_page", "ns", 0, "a write to every huge page of the mapping (allocation "
	  "from the pool and clearing)" MEDIAN },
	{ "unmap_ns_per_page", "ns", 0, "munmap of the faulted mapping (the folios back to the "
	  "pool)" MEDIAN },
	{ "fault_ns_per_page_total", "ns", 0, "a write to every huge page of the mapping" MM_TOTAL },
	{ "unmap_ns_per_page_total", "ns", 0, "munmap of the faulted mapping" MM_TOTAL },
	{ NULL },
};

/* The timed windows, by id. */
enum { HF_FAULT, HF_UNMAP };
static const struct mm_window windows[] = {
	{ "fault", "page", "a write to every huge page of the mapping" },
	{ "unmap", "page", "munmap of the faulted mapping" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"hugetlb_fault", "alloc_hugetlb_folio", "dequeue_hugetlb_folio_nodemask",
	"folio_zero_user", "hugetlb_add_to_page_cache", "hugetlb_reserve_pages",
	"__unmap_hugepage_range", "free_huge_folio", "hugetlb_vm_op_close",
	"remove_inode_hugepages", NULL,
};

static const char *const vmstat[] = {
	"pgfault", "htlb_buddy_alloc_success", "htlb_buddy_alloc_fail", NULL,
};

static const char *const tracepoints[] = { "hugetlbfs", NULL };

static const char *const host_settings[] = { NR_HUGEPAGES, NULL };

static int hf_validate(struct mm_ctx *c)
{
	const long kb = mm_arg_long(c, "mapping-kb");
	if (kb % (long)(HUGE_SIZE / 1024)) {
		fprintf(stderr, "mmwork: hugetlb-fault: --mapping-kb %ld is not a multiple of "
			"2048 (one 2 MiB huge page each)\n", kb);
		return -1;
	}
	if (mm_meminfo_kb("Hugepagesize") != (long)(HUGE_SIZE / 1024)) {
		fprintf(stderr, "mmwork: hugetlb-fault: needs 2048 kB default huge pages (this "
			"kernel's Hugepagesize is %ld kB, or it has no hugetlb)\n",
			mm_meminfo_kb("Hugepagesize"));
		return -1;
	}
	if (access(NR_HUGEPAGES, W_OK)) {
		fprintf(stderr, "mmwork: hugetlb-fault: reserves huge pages through " NR_HUGEPAGES
			" (run as root)\n");
		return -1;
	}
	return 0;
}

/* Free huge pages that no mapping has reserved (HugePages_Free - _Rsvd). */
static long pool_available(void)
{
	return mm_meminfo_kb("HugePages_Free") - mm_meminfo_kb("HugePages_Rsvd");
}

/* Grow the pool by what it lacks for `need` pages; 0 when it has them. */
static int reserve_pool(long need)
{
	const long lacking = need - pool_available();
	char value[32];
	if (lacking <= 0)
		return 0;
	snprintf(value, sizeof(value), "%ld", mm_read_long(NR_HUGEPAGES) + lacking);
	if (mm_knob_set(NR_HUGEPAGES, value)) {
		mm_error("nr_hugepages", errno);
		return -1;
	}
	if (pool_available() < need) {
		fprintf(stderr, "mmwork: hugetlb-fault: the huge page pool grew to %ld free pages, "
			"%ld needed (memory too fragmented?)\n", pool_available(), need);
		mm_error("nr_hugepages", ENOMEM);
		return -1;
	}
	return 0;
}

struct hf_ns {
	uint64_t fault, unmap;
};

/*
 * One round: map, write every huge page (timed), munmap (timed).  Returns
 * 0, or -1 when the mapping failed (counted).  With `probe` set no window
 * is counted and *probe gets the huge pages the faults took from the pool.
 */
static int hf_round(struct mm_ctx *c, size_t len, struct hf_ns *ns, long *probe)
{
	const int timed = !probe;
	const int flags = MAP_ANONYMOUS | MAP_HUGETLB |
			  (strcmp(mm_arg_str(c, "sharing"), "shared") ? MAP_PRIVATE : MAP_SHARED);
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED) {
		mm_error("mmap_hugetlb", errno);
		return -1;
	}
	const long free_before = probe ? mm_meminfo_kb("HugePages_Free") : 0;
	uint64_t t0 = MM_WINDOW_BEGIN(HF_FAULT, timed);
	for (size_t off = 0; off < len; off += HUGE_SIZE)
		((volatile char *)p)[off] = 1;
	uint64_t t1 = MM_WINDOW_END(HF_FAULT, timed);
	if (probe)
		*probe = free_before - mm_meminfo_kb("HugePages_Free");
	uint64_t t2 = MM_WINDOW_BEGIN(HF_UNMAP, timed);
	if (munmap(p, len))
		mm_error("munmap", errno);
	uint64_t t3 = MM_WINDOW_END(HF_UNMAP, timed);
	*ns = (struct hf_ns){ t1 - t0, t3 - t2 };
	return 0;
}

/* A timed round for mm_run_rounds: a mapping that failed is counted. */
struct hf_run {
	size_t len;
	struct mm_rounds fault, unmap;
};

static int hf_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct hf_run *r = arg;
	struct hf_ns ns;
	(void)start;	/* wherever mmap() put it */
	if (hf_round(c, r->len, &ns, NULL))
		return 1;
	mm_rounds_add(&r->fault, ns.fault);
	mm_rounds_add(&r->unmap, ns.unmap);
	return 0;
}

static int hf_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	const long need = (long)(len / HUGE_SIZE);
	struct hf_run r = { .len = len };
	struct mm_loop loop;
	struct hf_ns ns;
	int rc = 1;

	/* The pool, before anything is timed (a sysctl write and meminfo reads). */
	const long pool_before = mm_read_long(NR_HUGEPAGES);
	if (reserve_pool(need))
		return 1;

	if (mm_run_rounds(c, mm_arg_long(c, "rounds"), hf_timed, &r, &loop) || !loop.timed)
		goto out;

	const double all = pages * (double)loop.timed;
	mm_metric(c, "fault_ns_per_page", mm_rounds_median(&r.fault) / pages);
	mm_metric(c, "unmap_ns_per_page", mm_rounds_median(&r.unmap) / pages);
	mm_metric(c, "fault_ns_per_page_total", mm_rounds_total(&r.fault) / all);
	mm_metric(c, "unmap_ns_per_page_total", mm_rounds_total(&r.unmap) / all);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", all);
	mm_count(c, "huge_pages", (double)need * (double)loop.timed);
	mm_window_units(c, HF_FAULT, pages);
	mm_window_units(c, HF_UNMAP, pages);
	mm_state_num(c, "nr_hugepages_before", (double)pool_before);
	mm_state_num(c, "nr_hugepages_during", (double)mm_read_long(NR_HUGEPAGES));
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* How many huge pages a round's faults took, from one extra round. */
	long taken = 0;
	if (hf_round(c, len, &ns, &taken) == 0)
		mm_state_num(c, "huge_pages_faulted_fraction", (double)taken / (double)need);
out:
	mm_rounds_free(&r.fault);
	mm_rounds_free(&r.unmap);
	return rc;
}

const struct mm_workload wl_hugetlb_fault = {
	.name = "hugetlb-fault",
	.seed = "none: a baseline of hugetlb faults and unmap",
	.summary = "fault in every page of a MAP_HUGETLB mapping from the reserved pool and "
		   "unmap it, each timed per 4 KiB page (grows the pool through nr_hugepages)",
	MM_WORKLOAD_TABLES,
	.host_settings = host_settings,
	.default_warmups = 1,
	.validate = hf_validate,
	.sample = hf_sample,
};
