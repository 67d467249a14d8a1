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

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("mapping-kb", "16384", "anonymous mapping size in KiB"),
	MM_PARAM_THP("default", "mapping", ""),
	MM_PARAM_ALIGN("mapping", "all of it", ", as the seed's reproducer maps (the kernel then "
		       "decides)"),
	MM_PARAM_ROUNDS("8", "minimum map/touch/pageout/touch rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "prefault_ns_per_page", "ns", 0, "first write-touch of every page (faults, THP "
	  "allocation)" MM_MEDIAN },
	{ "advise_ns_per_page", "ns", 0, "madvise(MADV_PAGEOUT) of the whole mapping" MM_MEDIAN },
	{ "post_touch_ns_per_page", "ns", 0, "write-touch after the pageout (refaults)" MM_MEDIAN },
	{ "cycle_ns_per_page", "ns", 0, "pageout plus refault touch" MM_MEDIAN },
	{ "prefault_ns_per_page_total", "ns", 0, "first write-touch of every page" MM_TOTAL },
	{ "advise_ns_per_page_total", "ns", 0, "madvise(MADV_PAGEOUT) of the whole "
	  "mapping" MM_TOTAL },
	{ "post_touch_ns_per_page_total", "ns", 0, "write-touch after the pageout" MM_TOTAL },
	{ "cycle_ns_per_page_total", "ns", 0, "pageout plus refault touch" MM_TOTAL },
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
	const int timed = !probe;
	char *p = mm_map_range(c, len, MAP_PRIVATE | MAP_ANONYMOUS, -1, start);
	if (!p)
		return -1;

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

/* The timed rounds, for mm_run_rounds: each phase's, and the cycle's. */
struct pageout_run {
	size_t len;
	struct mm_rounds prefault, advise, touch, cycle;
};

static int pageout_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct pageout_run *r = arg;
	struct pageout_ns ns;
	if (pageout_round(c, r->len, &ns, NULL, start))
		return -1;
	mm_rounds_add(&r->prefault, ns.prefault);
	mm_rounds_add(&r->advise, ns.advise);
	mm_rounds_add(&r->touch, ns.touch);
	mm_rounds_add(&r->cycle, ns.advise + ns.touch);
	return 0;
}

static void pageout_free(struct pageout_run *r)
{
	mm_rounds_free(&r->prefault);
	mm_rounds_free(&r->advise);
	mm_rounds_free(&r->touch);
	mm_rounds_free(&r->cycle);
}

static int pageout_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct pageout_run r = { .len = len };
	struct mm_loop loop;
	struct pageout_ns ns;

	/* The timed rounds read no state at all. */
	if (mm_run_rounds(c, MM_GIVE_UP, pageout_timed, &r, &loop)) {
		pageout_free(&r);
		return 1;
	}

	/* Each phase per page: the median round, and total time over total pages. */
	const double all = pages * (double)loop.timed;
	mm_metric(c, "prefault_ns_per_page", mm_rounds_median(&r.prefault) / pages);
	mm_metric(c, "advise_ns_per_page", mm_rounds_median(&r.advise) / pages);
	mm_metric(c, "post_touch_ns_per_page", mm_rounds_median(&r.touch) / pages);
	mm_metric(c, "cycle_ns_per_page", mm_rounds_median(&r.cycle) / pages);
	mm_metric(c, "prefault_ns_per_page_total", mm_rounds_total(&r.prefault) / all);
	mm_metric(c, "advise_ns_per_page_total", mm_rounds_total(&r.advise) / all);
	mm_metric(c, "post_touch_ns_per_page_total", mm_rounds_total(&r.touch) / all);
	mm_metric(c, "cycle_ns_per_page_total", mm_rounds_total(&r.cycle) / all);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", all);
	for (int w = PO_PREFAULT; w <= PO_TOUCH; w++)
		mm_window_units(c, w, pages);
	pageout_free(&r);
	/* Where the kernel put the mappings: a pointer, not a probe. */
	mm_state_placement(c, &loop);
	if (!mm_probes(c))
		return 0;

	/* What the memory really was, from one extra round after the timed
	 * ones: THP backing after the prefault, and how much of it left RAM on
	 * the pageout. */
	struct pageout_probe probe;
	if (pageout_round(c, len, &ns, &probe, &loop.start))
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
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.sample = pageout_sample,
};
