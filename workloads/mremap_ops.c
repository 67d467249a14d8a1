/*
 * mremap_ops.c - one mremap() of a populated anonymous range, timed on its
 * own: a move to a new place, a grow in place, or a shrink.
 *
 * - move: mremap(MREMAP_MAYMOVE | MREMAP_FIXED) onto a reserved range.
 *   move_vma() -> move_page_tables() moves what the source maps: a THP's
 *   PMD as it is (move_huge_pmd), a whole page table when source and
 *   destination both sit on 2 MiB boundaries (move_normal_pmd), and
 *   otherwise PTE by PTE (move_ptes); the old range is then unmapped.
 *   --dst-offset-kb puts the destination that far past a 2 MiB boundary:
 *   0 lets whole page tables move, 4 forces every PTE to move on its own.
 * - grow: mremap() to twice the size with free address space behind it
 *   and no MREMAP_MAYMOVE, so the VMA is extended in place
 *   (vma_merge_extend): no page is touched, so it is timed per call.
 * - shrink: mremap() to half the size: the tail is unmapped
 *   (do_vmi_munmap), its pages zapped and freed.
 *
 * Each round maps and write-touches a fresh range (untimed).  What backed
 * it before and after the call is read from smaps on one extra untimed
 * round after the timed ones.  mremap-churn (seed 000) is the churn of
 * small MAP_POPULATE mappings halved and doubled with MREMAP_MAYMOVE; this
 * one times each kind of call alone on a larger range.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

static const char *const op_choices[] = { "move", "grow", "shrink", NULL };

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("size-kb", "4096", "mapping size in KiB before the call"),
	{ "op", MM_CHOICE, "move", "move = MREMAP_MAYMOVE|MREMAP_FIXED to a new place; grow = "
	  "to twice the size in place; shrink = to half the size", 0, 0, op_choices },
	MM_PARAM_THP("default", "mapping", ""),
	MM_PARAM_ALIGN("mapping", "all of it", ""),
	{ "dst-offset-kb", MM_INT, "0", "move: where the destination starts past a 2 MiB boundary "
	  "(0: on it, so whole page tables and PMDs can move; 4: every PTE moves alone)",
	  0, 2044, NULL },
	MM_PARAM_ROUNDS("8", "minimum map/touch/mremap/unmap rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "move_ns_per_page", "ns", 0, "--op move: the mremap() that moves the range" MM_MEDIAN },
	{ "grow_ns_per_op", "ns", 0, "--op grow: the mremap() that doubles the range in place "
	  "(median round)" },
	{ "shrink_ns_per_page", "ns", 0, "--op shrink: the mremap() that halves the range, per "
	  "page removed" MM_MEDIAN },
	{ "move_ns_per_page_total", "ns", 0, "--op move: the moving mremap()" MM_TOTAL },
	{ "grow_ns_per_op_total", "ns", 0, "--op grow: the growing mremap() (total time over all "
	  "calls: the mean)" },
	{ "shrink_ns_per_page_total", "ns", 0, "--op shrink: the halving mremap(), per page "
	  "removed" MM_TOTAL },
	{ NULL },
};

/* The timed windows, by id; a sample uses the one of its --op. */
enum { RM_MOVE, RM_GROW, RM_SHRINK };
static const struct mm_window windows[] = {
	{ "move", "page", "mremap(MREMAP_MAYMOVE|MREMAP_FIXED) of the range" },
	{ "grow", "op", "mremap() to twice the size, in place" },
	{ "shrink", "page", "mremap() to half the size (per page removed)" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"move_vma", "move_page_tables", "move_huge_pmd", "move_normal_pmd", "move_ptes",
	"mremap_to", "vma_merge_extend", "vma_expand", "do_vmi_munmap", "unmap_page_range",
	"zap_huge_pmd", "tlb_finish_mmu", "folios_put_refs", NULL,
};

static const char *const vmstat[] = {
	"thp_fault_alloc", "thp_fault_fallback", "thp_split_pmd", "thp_split_page",
	"thp_deferred_split_page", "pgfree", "pgfault", NULL,
};

/* What the probe round saw: the source after the touch, the result after. */
struct rm_probe {
	struct mm_smaps before, after;
};

/* Address space for the move's destination: `len` at `offset` past a 2 MiB
 * boundary, reserved PROT_NONE (MREMAP_FIXED replaces it). */
static char *rm_reserve_dst(size_t len, size_t offset)
{
	char *r = mm_map(len + MM_PMD_SIZE, MM_PMD_SIZE, PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1);
	if (!r)
		return NULL;
	if (offset && munmap(r, offset))
		mm_error("munmap", errno);
	if (munmap(r + offset + len, MM_PMD_SIZE - offset))
		mm_error("munmap", errno);
	return r + offset;
}

/*
 * One round: map (for grow: with free space behind), advise, write-touch,
 * the timed mremap(), unmap.  With `probe` set, smaps is read before and
 * after the call; that round's time is never used.  Returns the window's
 * time, or -1 when the call or its setup failed (counted).
 */
static int rm_round(struct mm_ctx *c, size_t len, uint64_t *ns, struct rm_probe *probe,
		    char **start)
{
	const char *op = mm_arg_str(c, "op");
	const size_t align = mm_align_bytes(mm_arg_str(c, "align"));
	const int grow = !strcmp(op, "grow"), move = !strcmp(op, "move");
	const int timed = !probe;
	char *dst = NULL, *q;
	int rc = 0;

	/* grow: map twice the size and give the second half back. */
	char *p = mm_map(grow ? 2 * len : len, align, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1);
	if (!p)
		return -1;
	if (grow && munmap(p + len, len)) {
		mm_error("munmap", errno);
		munmap(p, 2 * len);
		return -1;
	}
	*start = p;
	mm_advise_thp(c, p, len);
	mm_touch_write(p, len, 1);
	if (move && !(dst = rm_reserve_dst(len, (size_t)mm_arg_long(c, "dst-offset-kb") * 1024))) {
		munmap(p, len);
		return -1;
	}
	if (probe)
		mm_smaps_range(p, len, &probe->before);

	size_t now = len;	/* what is mapped at q afterwards */
	if (move) {
		uint64_t t0 = MM_WINDOW_BEGIN(RM_MOVE, timed);
		q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
		uint64_t t1 = MM_WINDOW_END(RM_MOVE, timed);
		*ns = t1 - t0;
	} else if (grow) {
		uint64_t t0 = MM_WINDOW_BEGIN(RM_GROW, timed);
		q = mremap(p, len, 2 * len, 0);
		uint64_t t1 = MM_WINDOW_END(RM_GROW, timed);
		*ns = t1 - t0;
		now = 2 * len;
	} else {
		uint64_t t0 = MM_WINDOW_BEGIN(RM_SHRINK, timed);
		q = mremap(p, len, len / 2, 0);
		uint64_t t1 = MM_WINDOW_END(RM_SHRINK, timed);
		*ns = t1 - t0;
		now = len / 2;
	}
	if (q == MAP_FAILED) {
		mm_error(move ? "mremap_move" : grow ? "mremap_grow" : "mremap_shrink", errno);
		rc = 1;		/* nothing moved: unmap what is there */
		q = p;
		now = len;
		if (dst)
			munmap(dst, len);
	}
	if (probe)
		mm_smaps_range(q, now, &probe->after);
	if (munmap(q, now))
		mm_error("munmap", errno);
	return rc;
}

/* A timed round for mm_run_rounds. */
struct rm_run {
	size_t len;
	struct mm_rounds times;
};

static int rm_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct rm_run *r = arg;
	uint64_t ns;
	const int rc = rm_round(c, r->len, &ns, NULL, start);
	if (!rc)
		mm_rounds_add(&r->times, ns);
	return rc;
}

static int rm_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "size-kb") * 1024 & ~(MM_PAGE_SIZE - 1);
	const char *op = mm_arg_str(c, "op");
	const int window = !strcmp(op, "move") ? RM_MOVE : !strcmp(op, "grow") ? RM_GROW : RM_SHRINK;
	/* What one call works on: the pages moved or removed, or the call. */
	const double units = window == RM_GROW ? 1 : window == RM_MOVE ?
		(double)(len / MM_PAGE_SIZE) : (double)((len - len / 2) / MM_PAGE_SIZE);
	struct rm_run r = { .len = len };
	struct mm_loop loop;
	uint64_t ns;

	if (mm_run_rounds(c, MM_GIVE_UP, rm_timed, &r, &loop) || !loop.timed) {
		mm_rounds_free(&r.times);
		return 1;	/* every call failed */
	}

	char name[64];
	snprintf(name, sizeof(name), "%s_ns_per_%s", op, window == RM_GROW ? "op" : "page");
	mm_metric_rounds(c, name, &r.times, units);
	mm_rounds_free(&r.times);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "failed_calls", (double)loop.failed);
	if (window != RM_GROW)
		mm_count(c, "pages", units * (double)loop.timed);
	mm_window_units(c, window, units);
	mm_state_placement(c, &loop);
	if (!mm_probes(c))
		return 0;

	struct rm_probe probe;
	if (rm_round(c, len, &ns, &probe, &loop.start))
		return 0;	/* no state: the failure is counted */
	mm_state_num(c, "thp_backed_fraction",
		     (double)probe.before.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "before_", &probe.before);
	mm_state_smaps(c, "after_", &probe.after);
	return 0;
}

static const char *const tracepoints[] = { "mmap_lock", "tlb", "huge_memory", NULL };

const struct mm_workload wl_mremap_ops = {
	.name = "mremap-ops",
	.seed = "none: a baseline of mremap move/grow/shrink (seed 000's churn is mremap-churn)",
	.summary = "populated anon range, one mremap() timed: move (MREMAP_FIXED), grow in place "
		   "or shrink by half; per page (grow: per call)",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.sample = rm_sample,
};
