/*
 * reclaim.c - page reclaim per page of a working set streamed through less
 * memory than it needs.
 *
 * The process makes a cgroup v2 group of its own (core-memcg.h) and streams
 * a working set --excess-kb larger than the memory it may use, pass after
 * pass, so that every pass finds the pages it needs reclaimed by the one
 * before and reclaims as many again:
 *
 * - --pressure memcg: the group's memory.max is --limit-kb.  A charge over
 *   it reclaims in the charging task itself (try_charge_memcg ->
 *   try_to_free_mem_cgroup_pages -> shrink_node_memcgs -> shrink_lruvec,
 *   or MGLRU's lru_gen_shrink_lruvec), never in kswapd.
 * - --pressure global: the group has no limit and the working set exceeds
 *   what the machine has available (MemAvailable when the sample starts):
 *   allocations wake kswapd (balance_pgdat), and reclaim in the task itself
 *   (try_to_free_pages) when kswapd falls behind.
 *
 * What is streamed, --memory:
 * - file: read() of a file in --dir, clean page cache that reclaim drops
 *   (__remove_mapping) and the next pass reads again (filemap_read,
 *   readahead, workingset_refault).  A file on tmpfs or ramfs would stay
 *   in memory, so such a --dir is refused; a guest mounts a disk-backed
 *   filesystem at /var/tmp for this workload (scratch_disk).
 * - anon: a write to every page of a private anonymous mapping: reclaim
 *   swaps pages out (shrink_folio_list -> add_to_swap, pageout) and the
 *   next pass faults them back (do_swap_page).  It needs swap.
 *
 * Each sample enters the group, prepares the working set, runs one untimed
 * pass (so that the timed ones start where they end, at the limit), then
 * times whole passes: window "reclaim".  The group's memory.stat is read
 * before the first timed pass and after the last, never inside one; its
 * pgscan, pgsteal and workingset_* per page streamed say what reclaim did
 * to this group's pages alone.  The window is per page reclaimed from the
 * group (pgsteal): under a memcg limit every pass reclaims the whole
 * working set, so that is per page of it; under global pressure a pass
 * reclaims a share that moves from run to run with how kswapd and the task
 * interleave (0.5-0.7 of it in a TCG guest), while the work per page
 * reclaimed does not.  The sample ends by leaving the group and undoing it.
 *
 * Counting: memcg reclaim runs in the task; kswapd runs on any CPU, and a
 * pass is long enough for the task to move between vCPUs.  So the window's
 * markers cover every vCPU (MM_WINDOW_BEGIN_ALL): the QEMU plugin counts
 * the task's work and whatever the kernel did beside it (kswapd, kworkers;
 * with one vCPU, that vCPU's whole time).  perf counts the task's own
 * instructions only, without kswapd's.
 */
#define _GNU_SOURCE
#include "common.h"
#include "core-memcg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#define RC_CHUNK (256UL << 10)		/* one read() of the file */

static const char *const pressure_choices[] = { "memcg", "global", NULL };
static const char *const memory_choices[] = { "file", "anon", NULL };

static const struct mm_param params[] = {
	{ "pressure", MM_CHOICE, "memcg", "what the working set exceeds: memcg = its own "
	  "cgroup's memory.max (--limit-kb), reclaimed by the task itself; global = the memory "
	  "the machine has available, reclaimed by kswapd (and the task when kswapd falls "
	  "behind)", 0, 0, pressure_choices },
	{ "memory", MM_CHOICE, "file", "what is streamed: file = read() of a file in --dir "
	  "(clean page cache, dropped by reclaim); anon = a write to every page of a private "
	  "anonymous mapping (swapped out: needs swap)", 0, 0, memory_choices },
	MM_PARAM_SIZE_KB("limit-kb", "32768", "the group's memory.max in KiB (--pressure memcg)"),
	MM_PARAM_SIZE_KB("excess-kb", "32768", "how much larger the working set is than the "
			 "memory it may use (--limit-kb, or MemAvailable when the sample starts "
			 "with --pressure global), in KiB"),
	MM_PARAM_THP("nohugepage", "anonymous working set", ""),
	MM_PARAM_ALIGN("anonymous working set", "it", ""),
	MM_PARAM_ROUNDS("3", "minimum timed passes over the working set per sample"),
	MM_PARAM_MIN_MS("200"),
	MM_PARAM_DIR("directory for --memory file (a file created and unlinked there), on a "
		     "filesystem whose page cache reclaim can drop: not tmpfs or ramfs"),
	{ NULL },
};

#define RC_PER_PAGE " (per page reclaimed from the group: all of the working set under a " \
	"memcg limit, the share kswapd and the task took under global pressure)"
static const struct mm_metric metrics[] = {
	{ "reclaim_ns_per_page", "ns", 0, "a pass over the working set, with the reclaim it "
	  "causes (median round)" RC_PER_PAGE },
	{ "reclaim_ns_per_page_total", "ns", 0, "a pass over the working set, with the reclaim "
	  "it causes (total time over total pages reclaimed: the mean)" },
	{ NULL },
};

/* The timed window, by id: one per pass. */
enum { RC_RECLAIM };
static const struct mm_window windows[] = {
	{ "reclaim", "page", "a pass over the working set (pages: those reclaimed from the "
	  "group; QEMU plugin: every vCPU, kswapd's work too)", 1 },
	{ NULL },
};

static const char *const mm_paths[] = {
	"try_to_free_mem_cgroup_pages", "try_charge_memcg", "do_try_to_free_pages",
	"shrink_node", "shrink_lruvec", "try_to_shrink_lruvec", "evict_folios", "isolate_folios",
	"shrink_inactive_list", "shrink_active_list", "shrink_folio_list", "folio_referenced",
	"try_to_unmap", "add_to_swap", "pageout", "swap_writepage", "__remove_mapping",
	"workingset_eviction", "workingset_refault", "do_swap_page", "swapin_readahead",
	"filemap_read", "page_cache_ra_unbounded", "filemap_add_folio", "wakeup_kswapd",
	"kswapd", "balance_pgdat", "try_to_free_pages", NULL,
};

/* Machine-wide.  Limit reclaim is in pgscan_anon/file, and in pgscan_direct
 * on some kernels only (7.3's, not 6.12's): the group's own figures are
 * memcg_stats below. */
static const char *const vmstat[] = {
	"pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd", "pgsteal_direct", "pgscan_anon",
	"pgscan_file", "pgsteal_anon", "pgsteal_file", "pswpin", "pswpout", "pgmajfault",
	"workingset_refault_anon", "workingset_refault_file", "workingset_activate_file",
	"allocstall_normal", "allocstall_movable", "pageoutrun", "pgpgin", NULL,
};

static const char *const tracepoints[] = { "vmscan", "filemap", NULL };

/* Undone after every sample (core-memcg.h). */
static const char *const host_settings[] = {
	"/sys/fs/cgroup (its own cgroup v2 group; cgroup2 mounted and memory enabled in the "
	"parent if they are not)", NULL,
};

/* The group's memory.stat counters a sample reports, per page streamed;
 * pgsteal first: the pages reclaimed are the window's unit. */
static const char *const memcg_stats[] = {
	"pgsteal", "pgscan", "pgscan_direct", "pgscan_kswapd", "pgsteal_direct",
	"pgsteal_kswapd", "pgrefill", "pgactivate", "pgdeactivate", "pgmajfault",
	"workingset_refault_anon", "workingset_refault_file", "workingset_activate_anon",
	"workingset_activate_file", "workingset_restore_anon", "workingset_restore_file", NULL,
};
#define RC_STATS (sizeof(memcg_stats) / sizeof(memcg_stats[0]) - 1)
enum { RC_PGSTEAL };

struct rc_run {
	int file, global;	/* --memory file, --pressure global */
	size_t len;		/* the working set */
	char *p;		/* anon: the mapping */
	int fd;			/* file: the file */
	char *buf;		/* file: where read() copies to */
	unsigned char value;	/* anon: what the last pass wrote */
	struct mm_rounds passes;	/* ns per timed pass */
};

/* Every chunk of the file, read into the run's buffer; 0 when a read
 * failed (counted). */
static int read_all(struct rc_run *r)
{
	for (size_t off = 0; off < r->len; off += RC_CHUNK) {
		const size_t n = r->len - off < RC_CHUNK ? r->len - off : RC_CHUNK;
		const ssize_t got = pread(r->fd, r->buf, n, (off_t)off);
		if (got <= 0) {
			mm_error("pread", got < 0 ? errno : EIO);
			return 0;
		}
	}
	return 1;
}

/* One pass over the working set: its ns, 0 when a read failed.  Every pass
 * writes another non-zero byte, so no page is all zeros (which swap would
 * keep without writing it). */
static uint64_t rc_pass(struct rc_run *r, int timed)
{
	int ok = 1;
	const uint64_t t0 = MM_WINDOW_BEGIN_ALL(RC_RECLAIM, timed);
	if (r->file)
		ok = read_all(r);
	else
		mm_touch_write(r->p, r->len, r->value = (unsigned char)(r->value % 255 + 1));
	const uint64_t t1 = MM_WINDOW_END_ALL(RC_RECLAIM, timed);
	return ok ? t1 - t0 : 0;
}

static int rc_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct rc_run *r = arg;
	(void)c;
	*start = r->p;
	const uint64_t ns = rc_pass(r, 1);
	if (ns)
		mm_rounds_add(&r->passes, ns);
	return !ns;
}

/* What the working set needs of this machine, refused in one line before
 * anything changes (as migrate refuses one NUMA node): swap for anon, for a
 * file a filesystem whose page cache can be dropped, and a group. */
static void rc_need(struct mm_ctx *c, const struct rc_run *r, struct mm_memcg *g)
{
	const long need_kb = (long)(r->len / 1024), swap_kb = mm_meminfo_kb("SwapFree");
	const char *dir = mm_arg_str(c, "dir");
	struct statfs fs;
	char why[512];
	if (!r->file && swap_kb < need_kb)
		mm_die(c, "--memory anon needs swap for its working set (%ld KiB free, %ld KiB "
		       "needed); in a guest, give the profile swap = \"zram:SIZE\"", swap_kb,
		       need_kb);
	const char *fs_name = r->file && !statfs(dir, &fs) ? mm_fs_name((long)fs.f_type) : "";
	if (!strcmp(fs_name, "tmpfs") || !strcmp(fs_name, "ramfs"))
		mm_die(c, "--memory file: --dir %s is %s, whose pages reclaim cannot drop; give a "
		       "directory on a disk-backed filesystem", dir, fs_name);
	if (mm_memcg_enter(g, "reclaim", why, sizeof(why)))
		mm_die(c, "%s", why);
}

/* The file, written and synced, its page cache dropped so that the passes
 * read every page; and the buffer read() copies to, faulted in now so that
 * a pass faults nothing but the file's page cache. */
static int rc_open_file(struct mm_ctx *c, struct rc_run *r)
{
	r->fd = mm_open_backing(c, MM_BACKING_FILE, "mmwork-reclaim", r->len, 1);
	if (r->fd < 0)
		return -1;
	if (posix_fadvise(r->fd, 0, 0, POSIX_FADV_DONTNEED))
		mm_error("fadvise_dontneed", errno);
	r->buf = malloc(RC_CHUNK);
	if (!r->buf)
		return -1;
	memset(r->buf, 0, RC_CHUNK);
	return 0;
}

/* State `name`: the group's `file`, a size in bytes, in KiB (when it has it). */
static void rc_state_kb(struct mm_ctx *c, const struct mm_memcg *g, const char *name,
			const char *file)
{
	const long long bytes = mm_memcg_read(g, file);
	if (bytes >= 0)
		mm_state_num(c, name, (double)bytes / 1024);
}

/* The group's memory.stat over the timed passes, per page streamed. */
static void rc_count_stats(struct mm_ctx *c, const long long *before, const long long *after,
			   double pages)
{
	char name[64];
	for (size_t i = 0; i < RC_STATS; i++) {
		if (before[i] < 0 || after[i] < 0)
			continue;	/* not in this kernel's memory.stat: absent, not 0 */
		snprintf(name, sizeof(name), "memcg_%s_per_page", memcg_stats[i]);
		mm_count(c, name, (double)(after[i] - before[i]) / pages);
	}
}

/*
 * The timed passes, in the group, and the sample's figures.  The group's
 * memory.stat is read before the first and after the last even with
 * --no-probes: the pages reclaimed from the group (pgsteal) are the
 * window's unit.  Without any, *why says why the sample measured nothing.
 */
static int rc_measure(struct mm_ctx *c, struct rc_run *r, const struct mm_memcg *g,
		      const char **why)
{
	const double pages = (double)(r->len / MM_PAGE_SIZE);
	long long before[RC_STATS], after[RC_STATS];
	struct mm_loop loop;

	rc_pass(r, 0);		/* to the steady state: at the limit, the rest reclaimed */
	mm_memcg_stat(g, memcg_stats, before);
	if (mm_run_rounds(c, mm_arg_long(c, "rounds"), rc_timed, r, &loop) || !loop.timed)
		return 1;
	mm_memcg_stat(g, memcg_stats, after);
	const double reclaimed = (double)(after[RC_PGSTEAL] - before[RC_PGSTEAL]);
	if (before[RC_PGSTEAL] < 0 || reclaimed <= 0) {
		*why = before[RC_PGSTEAL] < 0 ? "this kernel's memory.stat has no pgsteal" :
		       "the timed passes reclaimed nothing from the group (raise --excess-kb)";
		return 1;
	}
	const double per_pass = reclaimed / (double)loop.timed;
	mm_metric_rounds(c, "reclaim_ns_per_page", &r->passes, per_pass);
	mm_window_units(c, RC_RECLAIM, per_pass);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", pages * (double)loop.timed);
	mm_count(c, "pages_reclaimed", reclaimed);
	rc_count_stats(c, before, after, pages * (double)loop.timed);
	mm_state_num(c, "working_set_kb", (double)(r->len / 1024));
	if (!r->file)
		mm_state_placement(c, &loop);
	if (!mm_probes(c))
		return 0;
	rc_state_kb(c, g, "memcg_current_kb", "memory.current");
	rc_state_kb(c, g, "memcg_swap_current_kb", "memory.swap.current");
	if (r->file)
		mm_state_dir_fs(c, r->fd);
	return 0;
}

static int rc_sample(struct mm_ctx *c)
{
	struct rc_run r = { .fd = -1 };
	struct mm_memcg g;
	const char *why = NULL;
	int rc = 1;

	r.file = !strcmp(mm_arg_str(c, "memory"), "file");
	r.global = !strcmp(mm_arg_str(c, "pressure"), "global");
	const long room_kb = r.global ? mm_meminfo_kb("MemAvailable") : mm_arg_long(c, "limit-kb");
	r.len = (size_t)(room_kb + mm_arg_long(c, "excess-kb")) * 1024;
	rc_need(c, &r, &g);
	/* Prepared in the group before its limit: the file's writes are not
	 * throttled by it, and the group is known to work before they start. */
	int ready = r.file ? !rc_open_file(c, &r) :
		    !!(r.p = mm_map_range(c, r.len, MAP_PRIVATE | MAP_ANONYMOUS, -1, NULL));
	if (ready && !r.global)
		ready = !mm_memcg_limit(&g, (long long)room_kb * 1024);
	if (ready)
		rc = rc_measure(c, &r, &g, &why);
	mm_state_num(c, "memory_room_kb", (double)room_kb);
	/* Freed inside the group: the pages charged to it go with it. */
	if (r.p)
		munmap(r.p, r.len);
	if (r.fd >= 0)
		close(r.fd);
	free(r.buf);
	mm_rounds_free(&r.passes);
	mm_memcg_leave(&g);
	if (why)
		mm_die(c, "%s", why);
	return rc;
}

const struct mm_workload wl_reclaim = {
	.name = "reclaim",
	.seed = "none: a baseline of page reclaim (memcg limit, kswapd)",
	.summary = "stream a working set larger than its own cgroup's memory.max (reclaimed by "
		   "the task) or the machine's memory (kswapd), file page cache or swapped anon, "
		   "timed per page reclaimed",
	MM_WORKLOAD_TABLES,
	.host_settings = host_settings,
	.scratch_disk = 1,
	.default_warmups = 1,
	.sample = rc_sample,
};
