/*
 * pageout_refault.c - seed 001: MADV_PAGEOUT of a write-touched anon mapping,
 * then write-touch it again.
 *
 * With no swap, reclaim_pages() -> shrink_folio_list() cannot get swap for an
 * anon folio (folio_alloc_swap() fails) and puts it back; whether the folio
 * was a THP (and gets split on the way) decides most of the cost.  So every
 * sample records how much of the mapping THP really backed and how many
 * splits and swap-outs happened, next to the timings.  Those state reads
 * (smaps) happen on one extra untimed round after the timed ones: a smaps
 * read between the prefault and the pageout warms the page tables the
 * pageout walks.
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
	{ "align", MM_CHOICE, "pmd", "where the mapping starts: pmd = on a 2 MiB boundary, so THP "
	  "can back all of it; none = a plain mmap() of the size, as the seed's reproducer maps "
	  "(the kernel then decides)", 0, 0, mm_align_choices },
	{ "rounds", MM_INT, "8", "minimum map/touch/pageout/touch rounds per sample", 1, 1000000, NULL },
	{ "min-ms", MM_INT, "200", "minimum measured time per sample in ms", 0, 3600000, NULL },
	{ NULL },
};

#define MEDIAN " (median round, per page)"
#define TOTAL " (total time over total pages: the mean, as reproducers and stress-ng report)"
static const struct mm_metric metrics[] = {
	{ "prefault_ns_per_page", "ns", 0, "first write-touch of every page (faults, THP allocation)" MEDIAN },
	{ "advise_ns_per_page", "ns", 0, "madvise(MADV_PAGEOUT) of the whole mapping" MEDIAN },
	{ "post_touch_ns_per_page", "ns", 0, "write-touch after the pageout (refaults)" MEDIAN },
	{ "cycle_ns_per_page", "ns", 0, "pageout plus refault touch" MEDIAN },
	{ "prefault_ns_per_page_total", "ns", 0, "first write-touch of every page" TOTAL },
	{ "advise_ns_per_page_total", "ns", 0, "madvise(MADV_PAGEOUT) of the whole mapping" TOTAL },
	{ "post_touch_ns_per_page_total", "ns", 0, "write-touch after the pageout" TOTAL },
	{ "cycle_ns_per_page_total", "ns", 0, "pageout plus refault touch" TOTAL },
	{ NULL },
};

/* The timed windows, by id; instructions are counted per page of each. */
enum { PO_PREFAULT, PO_ADVISE, PO_TOUCH };
static const struct mm_window windows[] = {
	{ "prefault", "page", "the first write-touch" },
	{ "advise", "page", "madvise(MADV_PAGEOUT)" },
	{ "post_touch", "page", "the write-touch after the pageout" },
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

/* What the probe round saw: smaps after its prefault and after its pageout. */
struct pageout_probe {
	struct mm_smaps after_fault, after_pageout;
};

struct pageout_ns {
	uint64_t prefault, advise, touch;
};

/*
 * One round: map, advise THP, write-touch (timed), MADV_PAGEOUT (timed),
 * write-touch again (timed), unmap.  With `probe` set it also reads smaps
 * after the prefault and after the pageout; that round's times are never
 * used, because a smaps read walks the page tables the pageout then walks
 * and warms them (5-7 % off the advise time, issue 12).
 */
static int pageout_round(struct mm_ctx *c, size_t len, struct pageout_ns *ns,
			 struct pageout_probe *probe, char **start)
{
	const char *thp = mm_arg_str(c, "thp");
	const int timed = !probe;
	char *p = mm_map_aligned(len, mm_align_bytes(mm_arg_str(c, "align")));
	if (!p)
		return -1;
	*start = p;
	if (!strcmp(thp, "hugepage") && madvise(p, len, MADV_HUGEPAGE))
		mm_error("madvise_hugepage", errno);
	if (!strcmp(thp, "nohugepage") && madvise(p, len, MADV_NOHUGEPAGE))
		mm_error("madvise_nohugepage", errno);

	uint64_t t0 = MM_WINDOW_BEGIN(PO_PREFAULT, timed);
	mm_touch_write(p, len, 1);
	uint64_t t1 = MM_WINDOW_END(PO_PREFAULT, timed);
	if (probe)
		mm_smaps_range(p, len, &probe->after_fault);
	uint64_t t2 = MM_WINDOW_BEGIN(PO_ADVISE, timed);
	if (madvise(p, len, MADV_PAGEOUT))
		mm_error("madvise_pageout", errno);
	uint64_t t3 = MM_WINDOW_END(PO_ADVISE, timed);
	if (probe)
		mm_smaps_range(p, len, &probe->after_pageout);
	uint64_t t4 = MM_WINDOW_BEGIN(PO_TOUCH, timed);
	mm_touch_write(p, len, 2);
	uint64_t t5 = MM_WINDOW_END(PO_TOUCH, timed);
	munmap(p, len);
	*ns = (struct pageout_ns){ t1 - t0, t3 - t2, t5 - t4 };
	return 0;
}

static int pageout_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	const long min_rounds = mm_arg_long(c, "rounds");
	const double min_s = (double)mm_arg_long(c, "min-ms") / 1000.0;
	struct mm_rounds prefault = { 0 }, advise = { 0 }, touch = { 0 }, cycle = { 0 };
	const uint64_t t_start = mm_now_ns();
	long rounds = 0, aligned = 0;
	struct pageout_ns ns;
	char *start = NULL;

	/* The timed rounds read no state at all. */
	while (rounds < min_rounds || !mm_deadline_passed(t_start, min_s)) {
		if (pageout_round(c, len, &ns, NULL, &start))
			return 1;
		mm_rounds_add(&prefault, ns.prefault);
		mm_rounds_add(&advise, ns.advise);
		mm_rounds_add(&touch, ns.touch);
		mm_rounds_add(&cycle, ns.advise + ns.touch);
		aligned += mm_pmd_offset_kb(start) == 0;
		rounds++;
	}

	/* Each phase per page: the median round, and total time over total pages. */
	const double all = pages * (double)rounds;
	mm_metric(c, "prefault_ns_per_page", mm_rounds_median(&prefault) / pages);
	mm_metric(c, "advise_ns_per_page", mm_rounds_median(&advise) / pages);
	mm_metric(c, "post_touch_ns_per_page", mm_rounds_median(&touch) / pages);
	mm_metric(c, "cycle_ns_per_page", mm_rounds_median(&cycle) / pages);
	mm_metric(c, "prefault_ns_per_page_total", mm_rounds_total(&prefault) / all);
	mm_metric(c, "advise_ns_per_page_total", mm_rounds_total(&advise) / all);
	mm_metric(c, "post_touch_ns_per_page_total", mm_rounds_total(&touch) / all);
	mm_metric(c, "cycle_ns_per_page_total", mm_rounds_total(&cycle) / all);
	mm_count(c, "rounds", (double)rounds);
	mm_count(c, "pages", all);
	for (int w = PO_PREFAULT; w <= PO_TOUCH; w++)
		mm_window_units(c, w, pages);
	mm_rounds_free(&prefault);
	mm_rounds_free(&advise);
	mm_rounds_free(&touch);
	mm_rounds_free(&cycle);
	/* Where the kernel put the mappings: a pointer, not a probe. */
	mm_state_num(c, "mapping_pmd_aligned_fraction", (double)aligned / (double)rounds);
	mm_state_num(c, "mapping_start_mod_2m_kb", mm_pmd_offset_kb(start));
	if (!mm_probes(c))
		return 0;

	/* What the memory really was, from one extra round after the timed
	 * ones: THP backing after the prefault, and how much of it left RAM on
	 * the pageout. */
	struct pageout_probe probe;
	if (pageout_round(c, len, &ns, &probe, &start))
		return 1;
	mm_state_num(c, "thp_backed_fraction",
		     (double)probe.after_fault.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "after_prefault_", &probe.after_fault);
	mm_state_num(c, "after_pageout_rss_kb", (double)probe.after_pageout.rss_kb);
	mm_state_num(c, "after_pageout_swap_kb", (double)probe.after_pageout.swap_kb);
	mm_state_num(c, "after_pageout_anon_huge_kb", (double)probe.after_pageout.anon_huge_kb);
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
	.windows = windows,
	.default_warmups = 1,
	.sample = pageout_sample,
};
