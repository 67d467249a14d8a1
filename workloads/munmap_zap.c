/*
 * munmap_zap.c - tearing down a populated anonymous range, timed per page:
 * munmap() of it, or madvise(MADV_DONTNEED), which zaps the same pages
 * but keeps the VMA and its page tables.
 *
 * Both go through unmap_page_range() -> zap_pte_range() (zap_huge_pmd()
 * for a THP mapped by PMD) and free the folios in batches through the
 * mmu_gather (tlb_finish_mmu -> free_pages_and_swap_cache ->
 * folios_put_refs); munmap also detaches and frees the VMA and frees the
 * page tables (free_pgtables).  With --thp hugepage on an aligned range a
 * zap frees 512 pages per PMD, so the per-page cost is mostly the
 * freeing.
 *
 * Each round maps and write-touches a fresh range (untimed), so every zap
 * finds the same pages.  What backed the range before the zap and what
 * was left after it are read from smaps on one extra untimed round after
 * the timed ones.  populate-unmap (seed 000) times munmap of small,
 * MAP_POPULATE'd mappings under contention; unmap-young the munmap of
 * young file and shmem pages; this one anon teardown alone, 4 KiB or THP.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

static const char *const op_choices[] = { "munmap", "dontneed", NULL };

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("size-kb", "4096", "mapping size in KiB"),
	{ "op", MM_CHOICE, "munmap", "munmap = unmap the range; dontneed = "
	  "madvise(MADV_DONTNEED): zap its pages, keep the VMA", 0, 0, op_choices },
	MM_PARAM_THP("default", "mapping", ""),
	MM_PARAM_ALIGN("mapping", "all of it", ""),
	MM_PARAM_ROUNDS("8", "minimum map/touch/zap rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "zap_ns_per_page", "ns", 0, "munmap() or madvise(MADV_DONTNEED) of the populated "
	  "range" MM_MEDIAN },
	{ "zap_ns_per_page_total", "ns", 0, "munmap() or madvise(MADV_DONTNEED) of the "
	  "range" MM_TOTAL },
	{ NULL },
};

enum { MZ_ZAP };
static const struct mm_window windows[] = {
	{ "zap", "page", "munmap() or madvise(MADV_DONTNEED) of the populated range" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"unmap_page_range", "zap_pte_range", "zap_huge_pmd", "zap_page_range_single_batched",
	"madvise_dontneed_free", "do_vmi_align_munmap", "vms_complete_munmap_vmas",
	"free_pgtables", "tlb_finish_mmu", "free_pages_and_swap_cache", "folios_put_refs",
	"free_unref_folios", NULL,
};

static const char *const vmstat[] = {
	"pgfree", "thp_fault_alloc", "thp_fault_fallback", "thp_split_pmd",
	"thp_deferred_split_page", "pgfault", NULL,
};

struct mz_probe {
	struct mm_smaps before, after;
};

/*
 * One round: map, advise, write-touch, zap (timed), unmap.  With `probe`
 * set, smaps is read before and after the zap (after: DONTNEED only, the
 * munmapped range has none); that round's time is never used.  Returns 1
 * when the zap call failed (counted).
 */
static int mz_round(struct mm_ctx *c, size_t len, uint64_t *ns, struct mz_probe *probe,
		    char **start)
{
	const int dontneed = !strcmp(mm_arg_str(c, "op"), "dontneed");
	const int timed = !probe;
	int rc = 0;
	char *p = mm_map_range(c, len, MAP_PRIVATE | MAP_ANONYMOUS, -1, start);
	if (!p)
		return -1;
	mm_touch_write(p, len, 1);
	if (probe)
		mm_smaps_range(p, len, &probe->before);

	uint64_t t0 = MM_WINDOW_BEGIN(MZ_ZAP, timed);
	const int err = dontneed ? madvise(p, len, MADV_DONTNEED) : munmap(p, len);
	uint64_t t1 = MM_WINDOW_END(MZ_ZAP, timed);
	*ns = t1 - t0;
	if (err) {
		mm_error(dontneed ? "madvise_dontneed" : "munmap", errno);
		rc = 1;
	}
	if (probe && dontneed)
		mm_smaps_range(p, len, &probe->after);
	if ((dontneed || err) && munmap(p, len))
		mm_error("munmap", errno);
	return rc;
}

/* A timed round for mm_run_rounds. */
struct mz_run {
	size_t len;
	struct mm_rounds zap;
};

static int mz_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct mz_run *r = arg;
	uint64_t ns;
	const int rc = mz_round(c, r->len, &ns, NULL, start);
	if (!rc)
		mm_rounds_add(&r->zap, ns);
	return rc;
}

static int mz_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "size-kb") * 1024 & ~(MM_PAGE_SIZE - 1);
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct mz_run r = { .len = len };
	struct mm_loop loop;
	uint64_t ns;

	if (mm_run_rounds(c, MM_GIVE_UP, mz_timed, &r, &loop) || !loop.timed) {
		mm_rounds_free(&r.zap);
		return 1;	/* every zap failed */
	}

	mm_metric_rounds(c, "zap_ns_per_page", &r.zap, pages);
	mm_rounds_free(&r.zap);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "failed_calls", (double)loop.failed);
	mm_count(c, "pages", pages * (double)loop.timed);
	mm_window_units(c, MZ_ZAP, pages);
	mm_state_placement(c, &loop);
	if (!mm_probes(c))
		return 0;

	struct mz_probe probe = { 0 };
	if (mz_round(c, len, &ns, &probe, &loop.start))
		return 0;	/* no state: the failure is counted */
	mm_state_num(c, "thp_backed_fraction",
		     (double)probe.before.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "before_zap_", &probe.before);
	if (!strcmp(mm_arg_str(c, "op"), "dontneed")) {
		mm_state_num(c, "after_zap_vmas", (double)probe.after.vmas);
		mm_state_num(c, "after_zap_rss_kb", (double)probe.after.rss_kb);
	}
	return 0;
}

static const char *const tracepoints[] = { "mmap_lock", "tlb", NULL };

const struct mm_workload wl_munmap_zap = {
	.name = "munmap-zap",
	.seed = "none: a baseline of anon teardown (seed 000's small munmaps: populate-unmap)",
	.summary = "populated anon range (4 KiB or THP), munmap() or MADV_DONTNEED of it timed "
		   "per page",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.sample = mz_sample,
};
