/*
 * pageout_refault.c - seed 001: MADV_PAGEOUT of a write-touched anon mapping,
 * then write-touch it again.
 *
 * With no swap, reclaim_pages() -> shrink_folio_list() cannot get swap for an
 * anon folio (folio_alloc_swap() fails) and puts it back; whether the folio
 * was a THP (and gets split on the way) decides most of the cost.  So every
 * sample records how much of the mapping THP really backed and how many
 * splits and swap-outs happened, next to the timings.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

static const char *const thp_choices[] = { "default", "hugepage", "nohugepage", NULL };

static const struct mm_param params[] = {
	{ "mapping-kb", MM_SIZE_KB, "16384", "anonymous mapping size in KiB", 64, 1L << 40, NULL },
	{ "thp", MM_CHOICE, "default", "THP advice for the mapping (madvise)", 0, 0, thp_choices },
	{ "rounds", MM_INT, "8", "minimum map/touch/pageout/touch rounds per sample", 1, 1000000, NULL },
	{ "min-ms", MM_INT, "200", "minimum measured time per sample in ms", 0, 3600000, NULL },
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "prefault_ns_per_page", "ns", 0, "first write-touch of every page (faults, THP allocation)" },
	{ "advise_ns_per_page", "ns", 0, "madvise(MADV_PAGEOUT) of the whole mapping" },
	{ "post_touch_ns_per_page", "ns", 0, "write-touch after the pageout (refaults)" },
	{ "cycle_ns_per_page", "ns", 0, "pageout plus refault touch (median round, as all four)" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"madvise_cold_or_pageout_pte_range", "reclaim_pages", "shrink_folio_list",
	"folio_alloc_swap", "split_folio_to_list", "do_anonymous_page",
	"do_huge_pmd_anonymous_page", "do_swap_page", NULL,
};

static const char *const vmstat[] = {
	"thp_fault_alloc", "thp_fault_fallback", "thp_split_page", "thp_split_pmd",
	"thp_swpout", "thp_swpout_fallback", "pswpout", "pswpin", "pgsteal_anon",
	"pgscan_anon", "pgactivate", "pgfault", "pgmajfault", "zswpout", NULL,
};

static int pageout_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	const char *thp = mm_arg_str(c, "thp");
	const long min_rounds = mm_arg_long(c, "rounds");
	const double min_s = (double)mm_arg_long(c, "min-ms") / 1000.0;
	struct mm_rounds prefault = { 0 }, advise = { 0 }, touch = { 0 }, cycle = { 0 };
	const uint64_t t_start = mm_now_ns();
	long rounds = 0;
	struct mm_smaps after_fault = { 0 }, after_pageout = { 0 };
	double huge_kb_sum = 0;

	while (rounds < min_rounds || !mm_deadline_passed(t_start, min_s)) {
		/* PMD-aligned so that THP can back the whole range when allowed. */
		char *p = mm_map_aligned(len, MM_PMD_SIZE);
		if (!p)
			return 1;
		if (!strcmp(thp, "hugepage") && madvise(p, len, MADV_HUGEPAGE))
			mm_error("madvise_hugepage", errno);
		if (!strcmp(thp, "nohugepage") && madvise(p, len, MADV_NOHUGEPAGE))
			mm_error("madvise_nohugepage", errno);

		uint64_t t0 = mm_now_ns();
		mm_touch_write(p, len, 1);
		uint64_t t1 = mm_now_ns();
		mm_smaps_range(p, len, &after_fault);
		uint64_t t2 = mm_now_ns();
		if (madvise(p, len, MADV_PAGEOUT))
			mm_error("madvise_pageout", errno);
		uint64_t t3 = mm_now_ns();
		mm_smaps_range(p, len, &after_pageout);
		uint64_t t4 = mm_now_ns();
		mm_touch_write(p, len, 2);
		uint64_t t5 = mm_now_ns();

		munmap(p, len);
		mm_rounds_add(&prefault, t1 - t0);
		mm_rounds_add(&advise, t3 - t2);
		mm_rounds_add(&touch, t5 - t4);
		mm_rounds_add(&cycle, (t3 - t2) + (t5 - t4));
		huge_kb_sum += (double)after_fault.anon_huge_kb;
		rounds++;
	}

	/* Median round of each phase, per page. */
	mm_metric(c, "prefault_ns_per_page", mm_rounds_median(&prefault) / pages);
	mm_metric(c, "advise_ns_per_page", mm_rounds_median(&advise) / pages);
	mm_metric(c, "post_touch_ns_per_page", mm_rounds_median(&touch) / pages);
	mm_metric(c, "cycle_ns_per_page", mm_rounds_median(&cycle) / pages);
	mm_count(c, "rounds", (double)rounds);
	mm_count(c, "pages", pages * (double)rounds);
	mm_rounds_free(&prefault);
	mm_rounds_free(&advise);
	mm_rounds_free(&touch);
	mm_rounds_free(&cycle);
	/* What the memory really was: THP backing after the prefault, and how
	 * much of it left RAM on the pageout (last round). */
	mm_state_num(c, "thp_backed_fraction", huge_kb_sum / ((double)len / 1024 * rounds));
	mm_state_smaps(c, "after_prefault_", &after_fault);
	mm_state_num(c, "after_pageout_rss_kb", (double)after_pageout.rss_kb);
	mm_state_num(c, "after_pageout_swap_kb", (double)after_pageout.swap_kb);
	mm_state_num(c, "after_pageout_anon_huge_kb", (double)after_pageout.anon_huge_kb);
	return 0;
}

static const char *const tracepoints[] = { "vmscan", "huge_memory", "thp", NULL };

const struct mm_workload wl_pageout_refault = {
	.name = "pageout-refault",
	.seed = "001: MADV_PAGEOUT THP/no-swap refault ~1.7x slower on v6.19 than v6.12",
	.summary = "map anon, write-touch, madvise(MADV_PAGEOUT), write-touch again",
	.params = params,
	.metrics = metrics,
	.mm_paths = mm_paths,
	.vmstat = vmstat,
	.tracepoints = tracepoints,
	.default_warmups = 1,
	.sample = pageout_sample,
};
