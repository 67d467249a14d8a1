/* SPDX-License-Identifier: 0BSD */
/*
 * mmlab.h - mark the windows of your own program that mmlab should count.
 *
 * Copy this one file next to a reproducer (or let mmlab compile it: a
 * `source = "repro.c"` program finds it as #include "mmlab.h") and put
 * the work you care about between a begin and an end of the same window:
 *
 *	#include "mmlab.h"
 *	...
 *	MMLAB_BEGIN(1);
 *	for (size_t i = 0; i < pages; i++)
 *		mprotect(p + i * 4096, 4096, PROT_READ);
 *	MMLAB_END(1);
 *	printf("pages=%zu\n", pages);
 *
 * and name the window in the profile (`[windows.protect] id = 1, per =
 * "pages"`): mmlab reports protect_kernel_insns_per_pages and
 * protect_user_insns_per_pages, the mean window's instructions per unit
 * of work one window did, as the program printed it.
 *
 * Windows are numbered 1 to 7 (0 is mmlab's own: the whole command).  A
 * window may run many times and in several threads: each begin is matched
 * by the next end of the same window on the same thread (CPU, in a guest).
 *
 * How they are counted, where mmlab runs the program with counting on:
 * - in a TCG guest, each macro is a marker: a 7-byte NOP whose
 *   displacement holds the window, which costs nothing on a CPU and which
 *   mmlab's QEMU plugin recognises, counting the guest's kernel and user
 *   instructions between the two on that vCPU;
 * - on a machine with a hardware instruction counter, the macros also read
 *   a perf counter group of the calling thread (kernel, user) outside the
 *   marked part, and at exit the totals go to the file mmlab names in
 *   MMLAB_INSNS.
 * Anywhere else - run by hand, without mmlab, on a CPU without counters -
 * the program runs unchanged: the markers are NOPs and no counter is
 * opened.  x86-64 only; elsewhere the macros do nothing.
 *
 * Permission to use, copy, modify, and/or distribute this file for any
 * purpose with or without fee is hereby granted.  THE SOFTWARE IS PROVIDED
 * "AS IS" AND THE AUTHOR DISCLAIMS ALL WARRANTIES WITH REGARD TO THIS
 * SOFTWARE.
 */
#ifndef MMLAB_H
#define MMLAB_H

#include <stdint.h>

/*
 * The marker: nopl MMLAB_MARK_MAGIC|kind|window(%rax).  mmlab's plugin
 * matches the bytes 0f 1f 80 and a displacement whose top half is the magic.
 */
#define MMLAB_MARK_MAGIC 0x4d4d0000u	/* "MM" */
#define MMLAB_MARK_BEGIN 0x0100u
#define MMLAB_MARK_END 0x0200u
#define MMLAB_MAX_WINDOWS 8		/* ids 1 .. 7 are the program's */

#if defined(__x86_64__)
#define MMLAB_MARK(code) \
	__asm__ __volatile__(".byte 0x0f, 0x1f, 0x80\n\t.long %c0" \
			     : : "i"(MMLAB_MARK_MAGIC | (code)) : "memory")
#else
#define MMLAB_MARK(code) do { } while (0)
#endif

#if defined(__linux__) && defined(__x86_64__)
#include <fcntl.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* What this process counted, per window, and where it goes at exit. */
struct mmlab_totals {
	uint64_t windows[MMLAB_MAX_WINDOWS], kernel[MMLAB_MAX_WINDOWS], user[MMLAB_MAX_WINDOWS];
	pid_t owner;			/* the process whose totals these are */
};

static inline struct mmlab_totals *mmlab_totals(void)
{
	static struct mmlab_totals totals;
	return &totals;
}

/* Append this process's windows to $MMLAB_INSNS: "id windows kernel user". */
static inline void mmlab_write(void)
{
	const struct mmlab_totals *t = mmlab_totals();
	const char *path = getenv("MMLAB_INSNS");
	char line[128];
	int fd = path && t->owner == getpid() ? open(path, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
	if (fd < 0)
		return;
	for (int w = 1; w < MMLAB_MAX_WINDOWS; w++) {
		uint64_t n = __atomic_load_n(&t->windows[w], __ATOMIC_RELAXED);
		if (!n)
			continue;
		int len = snprintf(line, sizeof(line), "%d %llu %llu %llu\n", w,
				   (unsigned long long)n, (unsigned long long)t->kernel[w],
				   (unsigned long long)t->user[w]);
		if (write(fd, line, (size_t)len) != len)
			break;
	}
	close(fd);
}

/*
 * The calling thread's counter group (kernel leader, user member), opened
 * on first use: -2 where it cannot be (no MMLAB_INSNS, no counter here).
 * A forked child opens its own (the group is per thread and `owner` differs).
 */
static inline int mmlab_group(void)
{
	static __thread int fd = -1;
	static __thread pid_t opened_by;
	struct perf_event_attr a;
	if (fd != -1 && opened_by == getpid())
		return fd;
	opened_by = getpid();
	fd = -2;
	if (!getenv("MMLAB_INSNS"))
		return fd;
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.type = PERF_TYPE_HARDWARE;
	a.config = PERF_COUNT_HW_INSTRUCTIONS;
	a.exclude_user = 1;
	a.exclude_hv = 1;
	a.read_format = PERF_FORMAT_GROUP;
	int leader = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
	a.exclude_user = 0;
	a.exclude_kernel = 1;
	int member = leader < 0 ? -1 :
		(int)syscall(SYS_perf_event_open, &a, 0, -1, leader, PERF_FLAG_FD_CLOEXEC);
	if (member < 0) {
		if (leader >= 0)
			close(leader);
		return fd;
	}
	struct mmlab_totals *t = mmlab_totals();
	if (t->owner != getpid()) {	/* this process's first window: count afresh */
		memset(t, 0, sizeof(*t));
		t->owner = getpid();
		atexit(mmlab_write);
	}
	return fd = leader;
}

/* The group's two counts into k and u; 0 when they could be read. */
static inline int mmlab_read(uint64_t *k, uint64_t *u)
{
	struct { uint64_t nr, v[2]; } g;
	int fd = mmlab_group();
	if (fd < 0 || read(fd, &g, sizeof(g)) != (ssize_t)sizeof(g) || g.nr != 2)
		return -1;
	*k = g.v[0];
	*u = g.v[1];
	return 0;
}

static inline void mmlab_begin(int w, uint64_t start[2])
{
	(void)w;
	if (mmlab_read(&start[0], &start[1]))
		start[0] = start[1] = UINT64_MAX;
}

static inline void mmlab_end(int w, const uint64_t start[2])
{
	struct mmlab_totals *t = mmlab_totals();
	uint64_t k, u;
	if (start[0] == UINT64_MAX || mmlab_read(&k, &u))
		return;
	__atomic_fetch_add(&t->windows[w], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&t->kernel[w], k - start[0], __ATOMIC_RELAXED);
	__atomic_fetch_add(&t->user[w], u - start[1], __ATOMIC_RELAXED);
}

/* Per thread and window: the counts at its begin. */
static inline uint64_t *mmlab_start(int w)
{
	static __thread uint64_t start[MMLAB_MAX_WINDOWS][2];
	return start[w];
}

/* The counters are read outside the marked part, the markers inside it. */
#define MMLAB_BEGIN(w) do { \
	_Static_assert((w) > 0 && (w) < MMLAB_MAX_WINDOWS, "mmlab windows are 1 to 7"); \
	mmlab_begin((w), mmlab_start(w)); \
	MMLAB_MARK(MMLAB_MARK_BEGIN | (w)); \
} while (0)
#define MMLAB_END(w) do { \
	_Static_assert((w) > 0 && (w) < MMLAB_MAX_WINDOWS, "mmlab windows are 1 to 7"); \
	MMLAB_MARK(MMLAB_MARK_END | (w)); \
	mmlab_end((w), mmlab_start(w)); \
} while (0)
#else
#define MMLAB_BEGIN(w) MMLAB_MARK(MMLAB_MARK_BEGIN | (w))
#define MMLAB_END(w) MMLAB_MARK(MMLAB_MARK_END | (w))
#endif

#endif
