/*
 * fork_cow.c - fork() of a process with a populated anonymous mapping, the
 * child's copy-on-write writes, and the exit of the child's large mm.
 *
 * Each round maps --mapping-kb of anonymous memory (placed by --align, THP
 * by --thp) and write-touches it; then three timed windows:
 *
 * - fork, in the parent: copy_process -> dup_mmap -> copy_page_range write-
 *   protects every PTE (or PMD: copy_huge_pmd) of the mapping in both mms
 *   and takes a reference and an rmap for every page;
 * - cow, in the child (--child write): a write to every page faults
 *   (do_wp_page -> wp_page_copy: allocate, copy, map); a THP's PMD is split
 *   first (do_huge_pmd_wp_page) and its pages copied one by one;
 * - exit, from the parent releasing the child to wait() returning: the
 *   child's exit_mmap() -> unmap_vmas zaps every PTE and frees what it
 *   copied (--child write) or drops the references it shared (--child
 *   exit, which skips the writes), then free_pgtables.  Its markers cover
 *   every vCPU and, with perf, the child's own instructions are added
 *   (core-insns.h: MM_WINDOW_BEGIN_ALL), since the work is the child's.
 *
 * The child waits on a pipe before its writes and before its exit, so no
 * window contains another's work.  Per page is per page of the mapping;
 * fork and exit also copy and tear down the rest of mmwork's small mm
 * (a fixed cost that a larger --mapping-kb dilutes).  What backed the
 * mapping (THP) in the parent and in the child after its writes is read on
 * one extra untimed round after the timed ones.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const child_choices[] = { "write", "exit", NULL };

static const struct mm_param params[] = {
	MM_PARAM_SIZE_KB("mapping-kb", "8192", "anonymous mapping size in KiB (the parent's; the "
			 "child copies as much again with --child write)"),
	{ "child", MM_CHOICE, "write", "what the child does before it exits: write = a write to "
	  "every page (copy-on-write, timed), then exit; exit = exit at once, its pages still "
	  "shared", 0, 0, child_choices },
	MM_PARAM_THP("default", "mapping", ""),
	MM_PARAM_ALIGN("mapping", "it", ""),
	MM_PARAM_ROUNDS("4", "minimum map/populate/fork/write/exit rounds per sample"),
	MM_PARAM_MIN_MS("100"),
	{ NULL },
};

#define MEDIAN MM_MEDIAN_PER("page of the mapping")
static const struct mm_metric metrics[] = {
	{ "fork_ns_per_page", "ns", 0, "fork() in the parent" MEDIAN },
	{ "cow_ns_per_page", "ns", 0, "the child's copy-on-write write to every page (--child "
	  "write)" MEDIAN },
	{ "exit_ns_per_page", "ns", 0, "the child's exit, from its release to the parent's "
	  "wait() returning" MEDIAN },
	{ "fork_ns_per_page_total", "ns", 0, "fork() in the parent" MM_TOTAL },
	{ "cow_ns_per_page_total", "ns", 0, "the child's copy-on-write writes" MM_TOTAL },
	{ "exit_ns_per_page_total", "ns", 0, "the child's exit to the parent's wait()" MM_TOTAL },
	{ NULL },
};

/* The timed windows, by id. */
enum { FC_FORK, FC_COW, FC_EXIT };
static const struct mm_window windows[] = {
	{ "fork", "page", "fork() in the parent" },
	{ "cow", "page", "the child's copy-on-write write to every page" },
	{ "exit", "page", "the child's exit to the parent's wait() (both processes)", 1 },
	{ NULL },
};

static const char *const mm_paths[] = {
	"copy_page_range", "copy_process", "dup_mmap", "copy_huge_pmd", "do_wp_page",
	"do_huge_pmd_wp_page", "__split_huge_pmd", "exit_mmap", "unmap_vmas", "unmap_page_range",
	"free_pgtables", "tlb_finish_mmu", "folios_put_refs", "free_pages_and_swap_cache", NULL,
};

static const char *const vmstat[] = {
	"pgfault", "pgalloc_normal", "pgfree", "thp_fault_alloc", "thp_split_pmd",
	"thp_split_page", "thp_deferred_split_page", NULL,
};

static const char *const tracepoints[] = { "huge_memory", "task", NULL };

/* What the child reports through shared memory. */
struct fc_shared {
	uint64_t cow_ns;
	int cow_done;
	struct mm_smaps child_after_cow;	/* probe round only */
	int child_probed;
};

static struct fc_shared *sh;

/* Block on `fd` until the parent writes a byte (or closes it). */
static void wait_byte(int fd)
{
	char b;
	while (read(fd, &b, 1) < 0 && errno == EINTR)
		;
}

static void put_byte(int fd)
{
	if (write(fd, "x", 1) != 1)
		mm_error("pipe_write", errno);
}

static __attribute__((noreturn)) void fc_child(char *p, size_t len, int write_pages,
					      int timed, int go_fd, int done_fd)
{
	wait_byte(go_fd);
	if (write_pages) {
		uint64_t t0 = MM_WINDOW_BEGIN(FC_COW, timed);
		mm_touch_write(p, len, 2);
		uint64_t t1 = MM_WINDOW_END(FC_COW, timed);
		sh->cow_ns = t1 - t0;
		sh->cow_done = 1;
	}
	if (!timed) {
		sh->child_probed = !mm_smaps_range(p, len, &sh->child_after_cow);
	}
	put_byte(done_fd);
	wait_byte(go_fd);
	_exit(0);
}

struct fc_ns {
	uint64_t fork, cow, exit;
};

/*
 * One round.  Returns 0, 1 when a call failed (counted), -1 without a
 * mapping.  With `probe` set no window is counted and the parent's smaps
 * are read after the populate, the child's after its writes.
 */
static int fc_round(struct mm_ctx *c, size_t len, struct fc_ns *ns, struct mm_smaps *probe,
		    char **start)
{
	const int timed = !probe, write_pages = !strcmp(mm_arg_str(c, "child"), "write");
	int go[2], done[2], status, rc = 1;
	char *p = mm_map_range(c, len, MAP_PRIVATE | MAP_ANONYMOUS, -1, start);
	if (!p)
		return -1;
	mm_touch_write(p, len, 1);
	if (probe)
		mm_smaps_range(p, len, probe);
	if (pipe2(go, O_CLOEXEC)) {
		mm_error("pipe", errno);
		munmap(p, len);
		return 1;
	}
	if (pipe2(done, O_CLOEXEC)) {
		mm_error("pipe", errno);
		goto close_go;
	}
	sh->cow_done = 0;

	uint64_t t0 = MM_WINDOW_BEGIN(FC_FORK, timed);
	pid_t pid = fork();
	if (pid == 0)
		fc_child(p, len, write_pages, timed, go[0], done[1]);
	uint64_t t1 = MM_WINDOW_END(FC_FORK, timed);
	if (pid < 0) {
		mm_error("fork", errno);
		goto close_done;
	}

	put_byte(go[1]);		/* write (or not) */
	wait_byte(done[0]);
	struct mm_insns_other other;
	mm_insns_other_begin(&other, pid, timed);
	uint64_t t2 = MM_WINDOW_BEGIN_ALL(FC_EXIT, timed);
	put_byte(go[1]);		/* exit */
	pid_t got;
	while ((got = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
		;
	uint64_t t3 = MM_WINDOW_END_ALL(FC_EXIT, timed);
	mm_insns_other_end(&other, FC_EXIT);
	if (got != pid) {
		mm_error("waitpid", errno);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	} else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
		   (write_pages && !sh->cow_done)) {
		mm_error("child", ECHILD);
	} else {
		*ns = (struct fc_ns){ t1 - t0, sh->cow_ns, t3 - t2 };
		rc = 0;
	}
close_done:
	close(done[0]);
	close(done[1]);
close_go:
	close(go[0]);
	close(go[1]);
	munmap(p, len);
	return rc;
}

/* A timed round for mm_run_rounds. */
struct fc_run {
	size_t len;
	struct mm_rounds fork_r, cow_r, exit_r;
};

static int fc_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct fc_run *r = arg;
	struct fc_ns ns;
	const int rc = fc_round(c, r->len, &ns, NULL, start);
	if (!rc) {
		mm_rounds_add(&r->fork_r, ns.fork);
		mm_rounds_add(&r->cow_r, ns.cow);
		mm_rounds_add(&r->exit_r, ns.exit);
	}
	return rc;
}

static int fc_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	const int write_pages = !strcmp(mm_arg_str(c, "child"), "write");
	struct fc_run r = { .len = len };
	struct mm_loop loop;
	struct fc_ns ns;
	int rc = 1;

	sh = mm_shared_alloc(sizeof(*sh));
	if (mm_run_rounds(c, mm_arg_long(c, "rounds"), fc_timed, &r, &loop) || !loop.timed)
		goto out;

	const double all = pages * (double)r.fork_r.n;
	mm_metric(c, "fork_ns_per_page", mm_rounds_median(&r.fork_r) / pages);
	mm_metric(c, "exit_ns_per_page", mm_rounds_median(&r.exit_r) / pages);
	mm_metric(c, "fork_ns_per_page_total", mm_rounds_total(&r.fork_r) / all);
	mm_metric(c, "exit_ns_per_page_total", mm_rounds_total(&r.exit_r) / all);
	mm_window_units(c, FC_FORK, pages);
	mm_window_units(c, FC_EXIT, pages);
	if (write_pages) {
		mm_metric_rounds(c, "cow_ns_per_page", &r.cow_r, pages);
		mm_window_units(c, FC_COW, pages);
	}
	mm_count(c, "rounds", (double)r.fork_r.n);
	mm_count(c, "pages", all);
	mm_state_placement(c, &loop);
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* What the memory was, from one extra round after the timed ones. */
	struct mm_smaps parent;
	sh->child_probed = 0;
	if (fc_round(c, len, &ns, &parent, &loop.start) < 0) {
		rc = 1;
		goto out;
	}
	mm_state_num(c, "thp_backed_fraction", (double)parent.anon_huge_kb / ((double)len / 1024));
	mm_state_smaps(c, "parent_", &parent);
	if (sh->child_probed) {
		mm_state_num(c, "child_after_cow_anon_kb", (double)sh->child_after_cow.anon_kb);
		mm_state_num(c, "child_after_cow_anon_huge_kb",
			     (double)sh->child_after_cow.anon_huge_kb);
	}
out:
	mm_rounds_free(&r.fork_r);
	mm_rounds_free(&r.cow_r);
	mm_rounds_free(&r.exit_r);
	munmap(sh, sizeof(*sh));
	return rc;
}

const struct mm_workload wl_fork_cow = {
	.name = "fork-cow",
	.seed = "none: a baseline of fork, copy-on-write and exit",
	.summary = "populate an anon mapping, fork, the child writes every page (copy-on-write) "
		   "and exits: fork, CoW and exit timed per page",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.sample = fc_sample,
};
