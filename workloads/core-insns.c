/*
 * core-insns.c - instruction counts and CPU time of the timed windows: the
 * perf counter group each process reads around its windows, the thread's
 * CPU clock, the windows counted in memory that forked workers share, and
 * the per-unit metrics and counts a sample gets.  The markers a QEMU plugin
 * counts are the macros in core-insns.h; this file only adds the one that
 * closes a sample.
 */
#define _GNU_SOURCE
#include "core-insns.h"
#include "core-args.h"
#include "core-ctx.h"
#include "core-shm.h"
#include "core-record.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int mm_insns_on, mm_cputime_on;

/* Shared with forked workers: what every process's windows added up to. */
struct mm_insns_totals {
	uint64_t windows[MM_MAX_WINDOWS];
	uint64_t kernel[MM_MAX_WINDOWS], user[MM_MAX_WINDOWS];	/* perf only */
	uint64_t cpu_windows[MM_MAX_WINDOWS], cpu_ns[MM_MAX_WINDOWS];	/* --cpu-time */
	uint64_t all_windows[MM_MAX_WINDOWS];	/* --cpu-time: MM_WINDOW_BEGIN_ALL */
};
static struct mm_insns_totals *insns_totals;
static double insns_units[MM_MAX_WINDOWS];

/* This thread's perf group: -1 until opened, -2 when it cannot be.  The
 * counters count the thread that opened them, so a workload's threads
 * (page-fault --threads) each open and read their own. */
static __thread int insns_perf_fd = -1, insns_perf_member = -1;
static char insns_perf_why[160];
static __thread uint64_t insns_start_kernel[MM_MAX_WINDOWS], insns_start_user[MM_MAX_WINDOWS];

int mm_insns_counter(pid_t pid, int exclude_user, int group, int inherited)
{
	struct perf_event_attr a;
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.type = PERF_TYPE_HARDWARE;
	a.config = PERF_COUNT_HW_INSTRUCTIONS;
	a.exclude_user = (unsigned)exclude_user;
	a.exclude_kernel = (unsigned)!exclude_user;
	a.exclude_hv = 1;
	if (inherited) {	/* a group cannot be read once inherited: one counter */
		a.disabled = 1;
		a.enable_on_exec = 1;
		a.inherit = 1;
	} else {
		a.read_format = PERF_FORMAT_GROUP;
	}
	return (int)syscall(SYS_perf_event_open, &a, pid, -1, group, PERF_FLAG_FD_CLOEXEC);
}

/* A forked worker must count itself, not read its parent's counters. */
static void insns_perf_forget(void)
{
	if (insns_perf_fd >= 0) {
		close(insns_perf_member);
		close(insns_perf_fd);
	}
	insns_perf_fd = insns_perf_member = -1;
}

/* The group's leader counts kernel instructions, its member user ones. */
static int insns_perf_open(void)
{
	static int atfork;
	if (insns_perf_fd != -1)
		return insns_perf_fd;
	if (!atfork++)
		pthread_atfork(NULL, NULL, insns_perf_forget);
	int leader = mm_insns_counter(0, 1, -1, 0);
	int member = leader >= 0 ? mm_insns_counter(0, 0, leader, 0) : -1;
	if (leader < 0 || member < 0) {
		snprintf(insns_perf_why, sizeof(insns_perf_why),
			 "none (perf_event_open of the instructions "
			 "counter: %s)", strerror(errno));
		if (leader >= 0)
			close(leader);
		return insns_perf_fd = -2;
	}
	insns_perf_member = member;
	return insns_perf_fd = leader;
}

static int insns_perf_read(uint64_t *kernel, uint64_t *user)
{
	struct { uint64_t nr, v[2]; } g;
	if (insns_perf_open() < 0 ||
	    read(insns_perf_fd, &g, sizeof(g)) != (ssize_t)sizeof(g) || g.nr != 2)
		return -1;
	*kernel = g.v[0];
	*user = g.v[1];
	return 0;
}

void mm_insns_begin(int w)
{
	insns_perf_read(&insns_start_kernel[w], &insns_start_user[w]);
}

void mm_insns_end(int w)
{
	uint64_t k, u;
	__atomic_fetch_add(&insns_totals->windows[w], 1, __ATOMIC_RELAXED);
	if (insns_perf_read(&k, &u))
		return;
	__atomic_fetch_add(&insns_totals->kernel[w], k - insns_start_kernel[w], __ATOMIC_RELAXED);
	__atomic_fetch_add(&insns_totals->user[w], u - insns_start_user[w], __ATOMIC_RELAXED);
}

static __thread uint64_t cputime_start[MM_MAX_WINDOWS];

static uint64_t cputime_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

void mm_cputime_begin(int w)
{
	cputime_start[w] = cputime_now();
}

void mm_cputime_end(int w)
{
	const uint64_t ns = cputime_now() - cputime_start[w];
	__atomic_fetch_add(&insns_totals->cpu_ns[w], ns, __ATOMIC_RELAXED);
	__atomic_fetch_add(&insns_totals->cpu_windows[w], 1, __ATOMIC_RELAXED);
}

void mm_cputime_elsewhere(int w)
{
	__atomic_fetch_add(&insns_totals->all_windows[w], 1, __ATOMIC_RELAXED);
}

void mm_insns_other_begin(struct mm_insns_other *o, pid_t pid, int counted)
{
	o->kernel = o->user = -1;
	if (!mm_insns_on || !counted || insns_perf_open() < 0)
		return;
	o->kernel = mm_insns_counter(pid, 1, -1, 0);
	o->user = o->kernel >= 0 ? mm_insns_counter(pid, 0, o->kernel, 0) : -1;
	if (o->user < 0 && o->kernel >= 0) {
		close(o->kernel);
		o->kernel = -1;
	}
}

void mm_insns_other_end(struct mm_insns_other *o, int w)
{
	struct { uint64_t nr, v[2]; } g;
	if (o->kernel < 0)
		return;
	if (read(o->kernel, &g, sizeof(g)) == (ssize_t)sizeof(g) && g.nr == 2) {
		__atomic_fetch_add(&insns_totals->kernel[w], g.v[0], __ATOMIC_RELAXED);
		__atomic_fetch_add(&insns_totals->user[w], g.v[1], __ATOMIC_RELAXED);
	}
	close(o->user);
	close(o->kernel);
	o->kernel = o->user = -1;
}

void mm_window_units(struct mm_ctx *c, int w, double n)
{
	(void)c;
	insns_units[w] = n;
}

void mm_insns_metric(char *buf, size_t size, const struct mm_window *w, const char *side)
{
	snprintf(buf, size, "%s_%s_insns_per_%s", w->name, side, w->unit);
}

void mm_cputime_metric(char *buf, size_t size, const struct mm_window *w)
{
	snprintf(buf, size, "%s_cpu_ns_per_%s", w->name, w->unit);
}

void mm_insns_init(int insns, int cputime)
{
	mm_insns_on = insns;
	mm_cputime_on = cputime;
	if ((insns || cputime) && !insns_totals)
		insns_totals = mm_shared_alloc(sizeof(*insns_totals));
}

void mm_insns_sample_begin(void)
{
	if (!insns_totals)
		return;
	memset(insns_totals, 0, sizeof(*insns_totals));
	memset(insns_units, 0, sizeof(insns_units));
}

/* The mean window's CPU time per unit, where the window's own thread did
 * its work and it had units.  The table's `elsewhere` (what describe
 * declares) and the macro that timed the window (what the sample gets) are
 * two statements of one fact: a workload that says one and does the other
 * stops here, rather than declare a metric it never gives. */
static void cputime_add_window(struct mm_ctx *c, int w)
{
	const struct mm_window *win = &c->wl->windows[w];
	const double n = (double)insns_totals->cpu_windows[w];
	char name[64];
	if (win->elsewhere ? n > 0 : insns_totals->all_windows[w] > 0)
		mm_die(c, "window %s: its table says elsewhere = %d, but it was timed with "
		       "MM_WINDOW_BEGIN%s", win->name, win->elsewhere,
		       win->elsewhere ? "" : "_ALL");
	if (win->elsewhere || !n || insns_units[w] <= 0)
		return;
	mm_cputime_metric(name, sizeof(name), win);
	mm_metric(c, name, (double)insns_totals->cpu_ns[w] / n / insns_units[w]);
}

/* Per window: how many were counted and the units of one; with perf, the
 * mean window's instructions per unit. */
static void insns_add_window(struct mm_ctx *c, int w, int perf)
{
	const struct mm_window *win = &c->wl->windows[w];
	char name[64];
	double n = (double)insns_totals->windows[w];
	snprintf(name, sizeof(name), "%s_windows", win->name);
	mm_count(c, name, n);
	if (insns_units[w] <= 0)
		return;
	snprintf(name, sizeof(name), "%s_units", win->name);
	mm_count(c, name, insns_units[w]);
	if (!perf || !n)
		return;
	mm_insns_metric(name, sizeof(name), win, "kernel");
	mm_metric(c, name, (double)insns_totals->kernel[w] / n / insns_units[w]);
	mm_insns_metric(name, sizeof(name), win, "user");
	mm_metric(c, name, (double)insns_totals->user[w] / n / insns_units[w]);
}

void mm_insns_sample_end(struct mm_ctx *c, int warmup)
{
	if (mm_cputime_on && !warmup && c->wl->windows)
		for (int w = 0; w < MM_MAX_WINDOWS && c->wl->windows[w].name; w++)
			cputime_add_window(c, w);
	if (!mm_insns_on)
		return;
	if (warmup)
		MM_MARK(MM_MARK_WARMUP);
	else
		MM_MARK(MM_MARK_SAMPLE);
	if (warmup || !c->wl->windows)
		return;
	const int perf = insns_perf_open() >= 0;
	for (int w = 0; w < MM_MAX_WINDOWS && c->wl->windows[w].name; w++)
		insns_add_window(c, w, perf);
	mm_state_str(c, "insns_source", perf ? "perf" : insns_perf_why);
}
