/*
 * mprotect.c - mprotect() of a populated range to read-only and back,
 * each way timed, per page.
 *
 * change_protection() walks the range's page tables and rewrites every
 * present PTE (change_pte_range) or huge PMD (change_huge_pmd); what it
 * finds decides the cost:
 *
 * - --page-state dirty (write-touched) or clean (read-touched: a private
 *   mapping then maps the shared zero page, a shared one clean shmem
 *   folios).  On the way back to read-write, can_change_pte_writable()
 *   makes a PTE writable at once only for an exclusive anon page (private)
 *   or a dirty one (shared); the others stay read-only until a write
 *   fault.
 * - --mapping private (MAP_PRIVATE anonymous) or shared (MAP_SHARED
 *   anonymous, i.e. shmem).
 * - --thp hugepage on an aligned range: whole PMDs (the huge zero page when
 *   clean and private).
 * - --range full: one call each way, no VMA change beyond the flags;
 *   alternate: every other page on its own call, so each protect splits a
 *   VMA (vma_modify_flags -> __split_vma; a THP's PMD is split on the way)
 *   and each unprotect merges it back, leaving one VMA again.
 *
 * Each round maps and touches a fresh range (untimed), so every round
 * starts from the same page state.  What backed it and how many VMAs the
 * protect made are read from smaps on one extra untimed round after the
 * timed ones.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static const char *const mapping_choices[] = { "private", "shared", NULL };
static const char *const state_choices[] = { "dirty", "clean", NULL };
static const char *const range_choices[] = { "full", "alternate", NULL };

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("size-kb", "4096", "mapping size in KiB"),
	{ "mapping", MM_CHOICE, "private", "private (MAP_PRIVATE anonymous) or shared "
	  "(MAP_SHARED anonymous: shmem)", 0, 0, mapping_choices },
	{ "page-state", MM_CHOICE, "dirty", "how the pages were touched before the protect: "
	  "dirty = written, clean = read (private: the shared zero page)", 0, 0, state_choices },
	MM_PARAM_THP("default", "mapping", ": hugepage lets anon (and shmem with "
		     "shmem_enabled=advise) map whole PMDs"),
	{ "range", MM_CHOICE, "full", "full = one mprotect() of the whole range each way; "
	  "alternate = every other page on its own call (each protect splits the VMA, each "
	  "unprotect merges it back)", 0, 0, range_choices },
	MM_PARAM_ALIGN("mapping", "all of it", ""),
	MM_PARAM_ROUNDS("8", "minimum map/touch/protect/unprotect rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

#define MEDIAN MM_MEDIAN_PER("page of the mapping")
#define PER_CALL MM_MEDIAN_PER("mprotect() call")
static const struct mm_metric metrics[] = {
	{ "protect_ns_per_page", "ns", 0, "mprotect(PROT_READ) of the range" MEDIAN },
	{ "unprotect_ns_per_page", "ns", 0, "mprotect(PROT_READ|PROT_WRITE) back" MEDIAN },
	{ "protect_ns_per_page_total", "ns", 0, "mprotect(PROT_READ) of the range" MM_TOTAL },
	{ "unprotect_ns_per_page_total", "ns", 0, "mprotect(PROT_READ|PROT_WRITE) back" MM_TOTAL },
	{ "protect_ns_per_call", "ns", 0, "mprotect(PROT_READ)" PER_CALL },
	{ "unprotect_ns_per_call", "ns", 0, "mprotect(PROT_READ|PROT_WRITE)" PER_CALL },
	{ NULL },
};

/* The timed windows, by id; instructions are counted per page of each. */
enum { MP_PROTECT, MP_UNPROTECT };
static const struct mm_window windows[] = {
	{ "protect", "page", "mprotect(PROT_READ) of the range (one call or one per other page)" },
	{ "unprotect", "page", "mprotect(PROT_READ|PROT_WRITE) back" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"mprotect_fixup", "do_mprotect_pkey", "vma_modify_flags", "__split_vma",
	"vma_merge_existing_range", "change_protection", "change_pte_range", "change_huge_pmd",
	"__split_huge_pmd", "can_change_pte_writable", "tlb_finish_mmu", "flush_tlb_mm_range",
	NULL,
};

static const char *const vmstat[] = {
	"thp_split_pmd", "thp_fault_alloc", "thp_fault_fallback", "thp_zero_page_alloc",
	"pgfault", "pgalloc_normal", NULL,
};

/* What the probe round saw: after the touch, the protect and the unprotect. */
struct mp_probe {
	struct mm_smaps touched, protected, unprotected;
};

/* mprotect() of the range, whole or every other page; failed calls counted. */
static long mp_protect(char *p, size_t len, int alternate, int prot, long *failed)
{
	if (!alternate) {
		if (mprotect(p, len, prot)) {
			mm_error("mprotect", errno);
			(*failed)++;
		}
		return 1;
	}
	long calls = 0;
	for (size_t off = 0; off < len; off += 2 * MM_PAGE_SIZE, calls++)
		if (mprotect(p + off, MM_PAGE_SIZE, prot)) {
			mm_error("mprotect", errno);
			(*failed)++;
		}
	return calls;
}

/*
 * One round: map, advise, touch, protect (timed), unprotect (timed), unmap.
 * With `probe` set it reads smaps after each step; that round's times are
 * never used (a smaps walk warms the page tables the mprotect walks).
 */
static int mp_round(struct mm_ctx *c, size_t len, uint64_t ns[2], long *calls, long *failed,
		    struct mp_probe *probe, char **start)
{
	const int shared = !strcmp(mm_arg_str(c, "mapping"), "shared");
	const int alternate = !strcmp(mm_arg_str(c, "range"), "alternate");
	const int timed = !probe;
	const int flags = (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS;
	char *p = mm_map_range(c, len, flags, -1, start);
	if (!p)
		return -1;
	if (!strcmp(mm_arg_str(c, "page-state"), "dirty"))
		mm_touch_write(p, len, 1);
	else
		mm_touch_read(p, len);
	if (probe)
		mm_smaps_range(p, len, &probe->touched);

	uint64_t t0 = MM_WINDOW_BEGIN(MP_PROTECT, timed);
	*calls = mp_protect(p, len, alternate, PROT_READ, failed);
	uint64_t t1 = MM_WINDOW_END(MP_PROTECT, timed);
	if (probe)
		mm_smaps_range(p, len, &probe->protected);
	uint64_t t2 = MM_WINDOW_BEGIN(MP_UNPROTECT, timed);
	mp_protect(p, len, alternate, PROT_READ | PROT_WRITE, failed);
	uint64_t t3 = MM_WINDOW_END(MP_UNPROTECT, timed);
	if (probe)
		mm_smaps_range(p, len, &probe->unprotected);
	if (munmap(p, len))
		mm_error("munmap", errno);
	ns[0] = t1 - t0;
	ns[1] = t3 - t2;
	return 0;
}

static int mp_validate(struct mm_ctx *c)
{
	const long max_map = mm_read_long("/proc/sys/vm/max_map_count");
	const long vmas = mm_arg_long(c, "size-kb") / 4;
	if (!strcmp(mm_arg_str(c, "range"), "alternate") && max_map > 0 && vmas + 1000 > max_map) {
		fprintf(stderr, "mmwork: mprotect: --range alternate of %ld pages makes as many VMAs: "
			"needs vm.max_map_count above %ld (it is %ld)\n", vmas, vmas + 1000, max_map);
		return -1;
	}
	return 0;
}

/* The timed rounds, for mm_run_rounds: a failed mprotect() is counted,
 * the round still timed. */
struct mp_run {
	size_t len;
	long calls, failed;
	struct mm_rounds protect, unprotect;
};

static int mp_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct mp_run *r = arg;
	uint64_t ns[2];
	if (mp_round(c, r->len, ns, &r->calls, &r->failed, NULL, start))
		return -1;
	mm_rounds_add(&r->protect, ns[0]);
	mm_rounds_add(&r->unprotect, ns[1]);
	return 0;
}

static int mp_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "size-kb") * 1024 & ~(MM_PAGE_SIZE - 1);
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct mp_run r = { .len = len };
	struct mm_loop loop;
	uint64_t ns[2];
	int rc = 1;

	/* Every call failed: nothing was measured. */
	if (mm_run_rounds(c, MM_GIVE_UP, mp_timed, &r, &loop) ||
	    r.failed >= 2 * r.calls * loop.timed)
		goto out;

	const long calls = r.calls;
	const double all = pages * (double)loop.timed;
	mm_metric(c, "protect_ns_per_page", mm_rounds_median(&r.protect) / pages);
	mm_metric(c, "unprotect_ns_per_page", mm_rounds_median(&r.unprotect) / pages);
	mm_metric(c, "protect_ns_per_page_total", mm_rounds_total(&r.protect) / all);
	mm_metric(c, "unprotect_ns_per_page_total", mm_rounds_total(&r.unprotect) / all);
	mm_metric(c, "protect_ns_per_call", mm_rounds_median(&r.protect) / (double)calls);
	mm_metric(c, "unprotect_ns_per_call", mm_rounds_median(&r.unprotect) / (double)calls);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", all);
	mm_count(c, "calls_per_round", (double)calls);
	mm_window_units(c, MP_PROTECT, pages);
	mm_window_units(c, MP_UNPROTECT, pages);
	mm_state_placement(c, &loop);
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* What the memory was, from one extra round after the timed ones. */
	struct mp_probe probe;
	long probe_calls, probe_failed = 0;
	if (mp_round(c, len, ns, &probe_calls, &probe_failed, &probe, &loop.start)) {
		rc = 1;
		goto out;
	}
	const double huge_kb = (double)(probe.touched.anon_huge_kb + probe.touched.shmem_pmd_kb);
	mm_state_num(c, "thp_backed_fraction", huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "after_touch_", &probe.touched);
	mm_state_num(c, "after_protect_vmas", (double)probe.protected.vmas);
	mm_state_num(c, "after_protect_huge_kb",
		     (double)(probe.protected.anon_huge_kb + probe.protected.shmem_pmd_kb));
	mm_state_num(c, "after_unprotect_vmas", (double)probe.unprotected.vmas);
	mm_state_num(c, "after_unprotect_rss_kb", (double)probe.unprotected.rss_kb);
out:
	mm_rounds_free(&r.protect);
	mm_rounds_free(&r.unprotect);
	return rc;
}

static const char *const tracepoints[] = { "mmap_lock", "tlb", "huge_memory", NULL };

const struct mm_workload wl_mprotect = {
	.name = "mprotect",
	.seed = "none: a baseline of change_protection and VMA split/merge",
	.summary = "populated private/shared anon range, mprotect(PROT_READ) and back, whole or "
		   "every other page (split and merge), timed per page",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.validate = mp_validate,
	.sample = mp_sample,
};
