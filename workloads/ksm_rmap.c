/*
 * ksm_rmap.c - seeds 002 and 004: a KSM rmap walk over an anon_vma shared
 * by many VMAs.
 *
 * One anonymous mapping is faulted in (creating its anon_vma), marked
 * MADV_MERGEABLE and split into --vmas VMAs.  A split clones the anon_vma
 * chain, so every piece hangs off the same anon_vma interval tree.  KSM then
 * merges the identical pages: at most max_page_sharing mappings per KSM page.
 * Writing /proc/sys/vm/compact_memory migrates the KSM pages; each migration
 * walks rmap_walk_ksm() for every rmap_item of the page, and before the fix
 * in seed 004 each of those walks visits the whole interval tree
 * (anon_vma_interval_tree_foreach over 0..ULONG_MAX) under the anon_vma
 * read lock, so the cost grows with items x VMAs: quadratically in --vmas.
 * A writer thread keeps splitting and re-merging one VMA of the same
 * anon_vma, which needs that lock for write, and records its longest stall.
 *
 * --trigger move migrates the KSM pages deterministically instead: one
 * move_pages(MPOL_MF_MOVE_ALL) call sends every data page to the next NUMA
 * node (a guest with numa_nodes = 2).  Compaction reaches our KSM pages only
 * when they sit in a block it chooses to empty; move_pages always moves all
 * of them, through the same rmap walks.  An address whose KSM page is
 * already on its way with an earlier address of the same call reports
 * EBUSY; those are counted (move_pages_busy), not failures.
 *
 * --pattern guard splits with mprotect(PROT_NONE) (JVM-style guard pages);
 * --pattern holes punches MADV_DONTNEED holes (DB-style), which does not
 * split VMAs at all; --pattern guard-install uses MADV_GUARD_INSTALL
 * (Linux 6.13+), guard pages without VMAs.  The VMA count actually reached is
 * in the state, so a reader sees which real-world patterns build the tree.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

#define KSM "/sys/kernel/mm/ksm/"
#define WRITER_PAGES 4
#define MPOL_MF_MOVE_ALL_ (1 << 2)

static const char *const pattern_choices[] = { "guard", "holes", "guard-install", NULL };
static const char *const trigger_choices[] = { "compact", "move", NULL };

static const struct mm_param params[] = {
	{ "vmas", MM_INT, "2000", "pages in the split range, one VMA each with --pattern guard "
	  "(cost grows ~quadratically: 4000 takes about 0.5 s, 40000 about 2 min)", 2, 1000000, NULL },
	{ "pattern", MM_CHOICE, "guard", "how the range is split", 0, 0, pattern_choices },
	{ "merge-timeout-s", MM_FLOAT, "60", "give up waiting for KSM after this long", 0, 0, NULL },
	{ "no-writer", MM_FLAG, NULL, "no concurrent VMA writer thread", 0, 0, NULL },
	{ "trigger", MM_CHOICE, "compact", "what migrates the KSM pages: compact_memory, or "
	  "move_pages() of every data page to the next NUMA node (needs 2+ nodes)", 0, 0,
	  trigger_choices },
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "walk_trigger_ms", "ms", 0, "the write to compact_memory or the move_pages() call "
	  "(migrations + rmap walks; one per sample)" },
	{ "ms_per_migrated_page", "ms", 0, "walk_trigger_ms per KSM page that the trigger moved (one walk: total time over "
	  "total pages; null with --no-probes, which cannot tell the pages moved)" },
	{ "writer_max_stall_ms", "ms", 0, "longest mprotect() of the concurrent writer (anon_vma lock wait; the "
	  "maximum over the walk)" },
	{ "pages_sharing", "pages", 1, "this process's pages merged by KSM (ksm_merging_pages)" },
	{ "ksm_merge_s", "s", 0, "time KSM took to merge the range (polled every 20 ms)" },
	{ NULL },
};

/* The timed window: the trigger, whose migrations walk the rmap. */
enum { KSM_WALK };
static const struct mm_window windows[] = {
	{ "walk", "migrated_page", "the trigger (compact_memory or move_pages: migrations and "
	  "rmap walks), per KSM page it moved (needs the probes)" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"rmap_walk_ksm", "anon_vma_interval_tree_iter_first", "anon_vma_interval_tree_iter_next",
	"try_to_migrate_one", "remove_migration_pte", "migrate_pages", "compact_zone",
	"anon_vma_lock_read", "down_write", "vma_prepare", NULL,
};

static const char *const vmstat[] = {
	"compact_migrate_scanned", "compact_free_scanned", "compact_isolated",
	"pgmigrate_success", "pgmigrate_fail", "compact_stall", "thp_split_page",
	"numa_pages_migrated", NULL,
};

static const char *const host_settings[] = {
	KSM "run", KSM "pages_to_scan", KSM "sleep_millisecs", "/proc/sys/vm/compact_memory (trigger)",
	NULL,
};

static int ksm_validate(struct mm_ctx *c)
{
	long max_map = mm_read_long("/proc/sys/vm/max_map_count");
	long vmas = mm_arg_long(c, "vmas");
	if (max_map > 0 && vmas + 1000 > max_map) {
		fprintf(stderr, "mmwork: ksm-rmap: --vmas %ld needs vm.max_map_count above %ld "
			"(it is %ld)\n", vmas, vmas + 1000, max_map);
		return -1;
	}
	if (access(KSM "run", W_OK) || access("/proc/sys/vm/compact_memory", W_OK)) {
		fprintf(stderr, "mmwork: ksm-rmap: needs write access to " KSM "run and "
			"/proc/sys/vm/compact_memory (run as root, on a kernel with KSM)\n");
		return -1;
	}
	return 0;
}

struct writer {
	pthread_t thread;
	char *page;
	volatile int stop, started;
	uint64_t max_ns;
	long ops;
};

/* Split and re-merge one VMA of the shared anon_vma, timing each mprotect. */
static void *writer_main(void *arg)
{
	struct writer *w = arg;
	const struct timespec pause = { 0, 200000 };
	w->started = 1;
	while (!w->stop) {
		for (int prot = 0; prot < 2; prot++) {
			uint64_t t0 = mm_now_ns();
			if (mprotect(w->page, MM_PAGE_SIZE, prot ? PROT_READ | PROT_WRITE : PROT_READ))
				mm_error("mprotect_writer", errno);
			uint64_t d = mm_now_ns() - t0;
			if (d > w->max_ns)
				w->max_ns = d;
			w->ops++;
		}
		nanosleep(&pause, NULL);
	}
	return NULL;
}

/* PFNs of the data pages (every other page), from /proc/self/pagemap. */
static int read_pfns(const char *base, long npages, uint64_t *pfn)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t *ent = malloc((size_t)npages * sizeof(*ent));
	off_t off = (off_t)((uintptr_t)base / MM_PAGE_SIZE * sizeof(uint64_t));
	ssize_t want = (ssize_t)((size_t)npages * sizeof(*ent));
	int rc = -1;
	if (fd >= 0 && ent && pread(fd, ent, (size_t)want, off) == want) {
		for (long i = 0; i < npages; i++)
			pfn[i] = (ent[i] >> 63) ? ent[i] & ((1ULL << 55) - 1) : 0;
		rc = 0;
	} else {
		mm_error("pagemap", errno);
	}
	free(ent);
	if (fd >= 0)
		close(fd);
	return rc;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static long count_distinct(uint64_t *v, long n)
{
	long d = 0;
	qsort(v, (size_t)n, sizeof(*v), cmp_u64);
	for (long i = 0; i < n; i++)
		d += v[i] && (i == 0 || v[i] != v[i - 1]);
	return d;
}

static void split_range(struct mm_ctx *c, char *base, long vmas, const char *pattern)
{
	for (long i = 1; i < vmas; i += 2) {
		char *pg = base + i * MM_PAGE_SIZE;
		if (!strcmp(pattern, "guard")) {
			if (mprotect(pg, MM_PAGE_SIZE, PROT_NONE))
				mm_error("mprotect", errno);
		} else if (!strcmp(pattern, "holes")) {
			if (madvise(pg, MM_PAGE_SIZE, MADV_DONTNEED))
				mm_error("madvise_dontneed", errno);
		} else if (madvise(pg, MM_PAGE_SIZE, MADV_GUARD_INSTALL)) {
			mm_error("madvise_guard_install", errno);
			if (errno == EINVAL)
				mm_die(c, "--pattern guard-install: MADV_GUARD_INSTALL needs Linux 6.13+");
		}
	}
}

/*
 * Send every data page (each maps a KSM page) to the node after the one it
 * is on.  MPOL_MF_MOVE_ALL: a KSM page is mapped many times, and plain
 * MPOL_MF_MOVE moves only pages mapped once.  Returns the timed call's ns.
 */
static uint64_t move_to_next_node(struct mm_ctx *c, char *base, long vmas, int nodes)
{
	const long n = (vmas + 1) / 2;
	void **pages = calloc((size_t)n, sizeof(*pages));
	int *target = calloc((size_t)n, sizeof(*target));
	int *status = calloc((size_t)n, sizeof(*status));
	uint64_t ns = 0;

	if (nodes < 2)
		mm_die(c, "--trigger move needs two NUMA nodes (this system has %d; in a guest, "
		       "set numa_nodes = 2)", nodes);
	for (long i = 0; i < n; i++)
		pages[i] = base + 2 * i * MM_PAGE_SIZE;
	if (syscall(SYS_move_pages, 0, n, pages, NULL, status, 0))
		mm_error("move_pages_query", errno);
	for (long i = 0; i < n; i++)
		target[i] = status[i] >= 0 ? (status[i] + 1) % nodes : 0;
	uint64_t t0 = MM_WINDOW_BEGIN(KSM_WALK, 1);
	if (syscall(SYS_move_pages, 0, n, pages, target, status, MPOL_MF_MOVE_ALL_))
		mm_error("move_pages", errno);
	ns = MM_WINDOW_END(KSM_WALK, 1) - t0;
	long busy = 0;
	for (long i = 0; i < n; i++) {
		if (status[i] == -EBUSY)
			busy++;
		else if (status[i] < 0)
			mm_error("move_pages_page", -status[i]);
	}
	mm_count(c, "move_pages_busy", (double)busy);
	free(pages);
	free(target);
	free(status);
	return ns;
}

/* Run ksmd flat out until this process's pages are merged or time is up. */
static double ksm_merge(struct mm_ctx *c, long want, long *merged)
{
	const double timeout = mm_arg_double(c, "merge-timeout-s");
	const struct timespec poll = { 0, 20 * 1000000 };
	const uint64_t t0 = mm_now_ns();
	char scan[32];

	snprintf(scan, sizeof(scan), "%ld", want < 1000 ? 1000 : want);
	if (mm_knob_set(KSM "sleep_millisecs", "0") || mm_knob_set(KSM "pages_to_scan", scan) ||
	    mm_knob_set(KSM "run", "1"))
		mm_die(c, "cannot start KSM through " KSM ": %s", strerror(errno));
	do {
		nanosleep(&poll, NULL);
		*merged = mm_read_long("/proc/self/ksm_merging_pages");
	} while (*merged < want && !mm_deadline_passed(t0, timeout));
	/* Stop ksmd so it does not compete with the walk; merged pages stay. */
	mm_knob_set(KSM "run", "0");
	if (*merged < want)
		mm_error("ksm_merge", ETIMEDOUT);
	return (double)(mm_now_ns() - t0) / 1e9;
}

static int ksm_sample(struct mm_ctx *c)
{
	const long vmas = mm_arg_long(c, "vmas");
	const char *pattern = mm_arg_str(c, "pattern");
	const long npages = vmas + WRITER_PAGES;
	const size_t len = (size_t)npages * MM_PAGE_SIZE;
	const long data = (vmas + 1) / 2;
	struct writer w = { 0 };
	struct mm_smaps sm = { 0 };
	long merged = 0;
	const long sharing_before = mm_read_long(KSM "pages_sharing") + mm_read_long(KSM "pages_shared");
	const int nodes = mm_online_nodes();	/* sysfs: read before anything is timed */

	char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED) {
		mm_error("mmap", errno);
		return 1;
	}
	/* Small pages only: KSM merges 4 KiB pages and a THP would be split. */
	if (madvise(base, len, MADV_NOHUGEPAGE))
		mm_error("madvise_nohugepage", errno);
	for (long i = 0; i < npages; i += (i < vmas ? 2 : 1))
		memset(base + i * MM_PAGE_SIZE, 0x5a, MM_PAGE_SIZE);
	if (madvise(base, len, MADV_MERGEABLE))
		mm_error("madvise_mergeable", errno);
	split_range(c, base, vmas, pattern);

	double merge_s = ksm_merge(c, data, &merged);

	uint64_t *before = calloc((size_t)vmas, sizeof(uint64_t));
	uint64_t *after = calloc((size_t)vmas, sizeof(uint64_t));
	uint64_t *moved = calloc((size_t)vmas, sizeof(uint64_t));
	/*
	 * The one probe inside the round (none with --no-probes): which KSM
	 * pages the walk moved can only be told from their PFNs after the merge
	 * and before the walk.  It reads this range's PTEs (a few page-table
	 * pages) while the walk migrates pages all over memory; the probes-off
	 * A/A in tests/test_workloads.py measures walk_trigger_ms with and
	 * without it.
	 */
	const int probes = mm_probes(c);
	if (probes)
		read_pfns(base, vmas, before);

	w.page = base + (vmas + 1) * MM_PAGE_SIZE;
	if (!mm_arg_long(c, "no-writer")) {
		pthread_create(&w.thread, NULL, writer_main, &w);
		while (!w.started)
			sched_yield();
	}
	uint64_t walk_ns;
	if (!strcmp(mm_arg_str(c, "trigger"), "move")) {
		walk_ns = move_to_next_node(c, base, vmas, nodes);
	} else {
		uint64_t t0 = MM_WINDOW_BEGIN(KSM_WALK, 1);
		int fd = open("/proc/sys/vm/compact_memory", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, "1", 1) != 1)
			mm_error("compact_memory", errno);
		if (fd >= 0)
			close(fd);
		walk_ns = MM_WINDOW_END(KSM_WALK, 1) - t0;
	}
	if (!mm_arg_long(c, "no-writer")) {
		w.stop = 1;
		pthread_join(w.thread, NULL);
	}
	/* State probes after the timed walk: PFNs, then the VMA count (the
	 * writer leaves its VMA as it found it). */
	if (probes) {
		read_pfns(base, vmas, after);
		mm_smaps_range(base, len, &sm);
	}

	/* Data pages whose PFN changed were remapped by migration. */
	long mappings_moved = 0, nmoved = 0;
	for (long i = 0; i < vmas; i += 2)
		if (before[i] && after[i] && before[i] != after[i]) {
			mappings_moved++;
			moved[nmoved++] = before[i];
		}
	long ksm_pages_moved = count_distinct(moved, nmoved);
	long data_pfns = 0;
	for (long i = 0; i < vmas; i += 2)
		before[data_pfns++] = before[i];
	long ksm_pages = count_distinct(before, data_pfns);

	const double walk_ms = (double)walk_ns / 1e6;
	mm_metric(c, "walk_trigger_ms", walk_ms);
	mm_metric(c, "ms_per_migrated_page",
		  ksm_pages_moved ? walk_ms / (double)ksm_pages_moved : NAN);
	mm_metric(c, "writer_max_stall_ms", (double)w.max_ns / 1e6);
	mm_metric(c, "pages_sharing", (double)merged);
	mm_metric(c, "ksm_merge_s", merge_s);
	mm_count(c, "writer_ops", (double)w.ops);
	mm_count(c, "data_pages", (double)data);
	mm_state_num(c, "ksm_merged_fraction", (double)merged / (double)data);
	if (probes) {
		mm_count(c, "ksm_pages", (double)ksm_pages);
		mm_count(c, "ksm_pages_migrated", (double)ksm_pages_moved);
		mm_count(c, "mappings_migrated", (double)mappings_moved);
		if (ksm_pages_moved)
			mm_window_units(c, KSM_WALK, (double)ksm_pages_moved);
		mm_state_num(c, "vmas_actual", (double)sm.vmas);
		mm_state_num(c, "ksm_max_page_sharing", (double)mm_read_long(KSM "max_page_sharing"));
		mm_state_num(c, "ksm_use_zero_pages", (double)mm_read_long(KSM "use_zero_pages"));
	}
	mm_state_num(c, "numa_nodes", (double)nodes);

	free(before);
	free(after);
	free(moved);
	munmap(base, len);
	/*
	 * With ksmd stopped nothing frees our rmap_items (and the stable nodes
	 * they pin) until it scans again.  When KSM held nothing before we
	 * started, run=2 unmerges and frees everything now; otherwise leave the
	 * other users' merged pages alone and let their ksmd clean up.
	 */
	if (sharing_before == 0 && mm_knob_set(KSM "run", "2"))
		mm_error("ksm_unmerge", errno);
	return 0;
}

static const char *const tracepoints[] = { "ksm", "compaction", "migrate", NULL };

const struct mm_workload wl_ksm_rmap = {
	.name = "ksm-rmap",
	.seed = "002/004: rmap_walk_ksm holds the anon_vma lock for 100s of ms with 20,000 VMAs",
	.summary = "split one anon mapping into many VMAs of one anon_vma, KSM-merge, compact, "
		   "time the walks and a concurrent writer's stalls",
	MM_WORKLOAD_TABLES,
	.host_settings = host_settings,
	.default_warmups = 0,
	.validate = ksm_validate,
	.sample = ksm_sample,
};
