/*
 * uffd.c - userfaultfd resolving missing faults: UFFDIO_COPY or
 * UFFDIO_ZEROPAGE, one page per fault, as a post-copy migration or a
 * lazy-restore handler does.
 *
 * A handler thread reads the userfaultfd's fault messages and resolves each
 * with one ioctl for the faulting page: UFFDIO_COPY (mfill_atomic_copy:
 * allocate a page, copy the source buffer into it, map it) or
 * UFFDIO_ZEROPAGE (map the zero page), which also wakes the faulting
 * thread.  Each round maps --mapping-kb of anonymous memory fresh, registers
 * it (UFFDIO_REGISTER_MODE_MISSING) and times the main thread reading
 * every page: each read faults into handle_userfault(), which queues the
 * message and sleeps until the handler has resolved the page.  Per page is
 * one whole round trip (two wake-ups and the ioctl).  The window's markers
 * cover every vCPU and, with perf, the handler thread's instructions are
 * added to the faulting thread's (core-insns.h: MM_WINDOW_BEGIN_ALL).
 *
 * The handler stops when a fault arrives on a one-page doorbell range
 * registered with the same userfaultfd after the last round.  Creating a
 * userfaultfd needs root, /proc/sys/vm/unprivileged_userfaultfd = 1, or a
 * kernel that takes UFFD_USER_MODE_ONLY (5.11+, for faults from user space,
 * as here): --check tries.  What the range held after the faults (smaps) is
 * read on one extra untimed round.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

static const char *const resolve_choices[] = { "copy", "zeropage", NULL };

static const struct mm_param params[] = {
	{ "resolve", MM_CHOICE, "copy", "how the handler resolves each missing fault: "
	  "UFFDIO_COPY of a 4 KiB source page, or UFFDIO_ZEROPAGE", 0, 0, resolve_choices },
	MM_PARAM_SIZE_KB("mapping-kb", "2048", "anonymous range size in KiB (one fault per 4 KiB "
			 "page)"),
	MM_PARAM_ROUNDS("8", "minimum map/register/fault rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "fault_ns_per_page", "ns", 0, "a read of every page of the registered range, each "
	  "fault resolved by the handler thread" MM_MEDIAN },
	{ "fault_ns_per_page_total", "ns", 0, "a read of every page of the registered range, "
	  "each fault resolved by the handler thread" MM_TOTAL },
	{ NULL },
};

/* The timed window, by id. */
enum { UF_FAULT };
static const struct mm_window windows[] = {
	{ "fault", "page", "reading every page of the registered range, each missing fault "
	  "resolved by the handler (both threads)", 1 },
	{ NULL },
};

static const char *const mm_paths[] = {
	"handle_userfault", "userfaultfd_ioctl", "mfill_atomic_copy", "mfill_atomic_zeropage",
	"mfill_atomic_install_pte", "userfaultfd_read_iter", "userfaultfd_wake_function",
	"handle_mm_fault", NULL,
};

static const char *const vmstat[] = { "pgfault", "pgalloc_normal", "pgfree", NULL };

static const char *const tracepoints[] = { "sched", NULL };

/* A userfaultfd with the API handshake done, or -1 with errno set. */
static int uffd_open(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
	if (fd < 0 && errno == EINVAL)	/* before 5.11: no user-mode-only flag */
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct uffdio_api api = { .api = UFFD_API, .features = 0 };
	if (ioctl(fd, UFFDIO_API, &api)) {
		int err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

static int uf_validate(struct mm_ctx *c)
{
	(void)c;
	int fd = uffd_open();
	if (fd >= 0) {
		close(fd);
		return 0;
	}
	if (errno == ENOSYS)
		fprintf(stderr, "mmwork: uffd: this kernel has no userfaultfd (CONFIG_USERFAULTFD)\n");
	else
		fprintf(stderr, "mmwork: uffd: cannot create a userfaultfd (%s): run as root or set "
			"/proc/sys/vm/unprivileged_userfaultfd = 1\n", strerror(errno));
	return -1;
}

struct handler {
	pthread_t thread;
	int uffd, zeropage;
	char *src;			/* UFFDIO_COPY's source page */
	char *doorbell;			/* a fault here stops the handler */
	volatile pid_t tid;
	volatile long resolved;		/* fault messages answered */
	volatile int dead;		/* it stopped on an error and closed uffd */
};

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	h->tid = (pid_t)syscall(SYS_gettid);
	for (;;) {
		struct uffd_msg msg;
		ssize_t n = read(h->uffd, &msg, sizeof(msg));
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(msg)) {
			/* Closing the userfaultfd wakes every fault waiting on it
			 * (they then fault as usual): nothing hangs on a dead
			 * handler, and the next registration fails. */
			mm_error("uffd_read", n < 0 ? errno : EIO);
			h->dead = 1;
			close(h->uffd);
			return NULL;
		}
		if (msg.event != UFFD_EVENT_PAGEFAULT)
			continue;
		const uint64_t page = msg.arg.pagefault.address & ~(uint64_t)(MM_PAGE_SIZE - 1);
		const int stop = page == (uintptr_t)h->doorbell;
		int rc;
		if (!stop)
			h->resolved++;	/* before the ioctl, which wakes the faulting thread */
		if (h->zeropage || stop) {
			struct uffdio_zeropage z = { .range = { page, MM_PAGE_SIZE }, .mode = 0 };
			rc = ioctl(h->uffd, UFFDIO_ZEROPAGE, &z);
		} else {
			struct uffdio_copy cp = { .dst = page, .src = (uintptr_t)h->src,
						  .len = MM_PAGE_SIZE, .mode = 0 };
			rc = ioctl(h->uffd, UFFDIO_COPY, &cp);
		}
		if (rc && errno != EEXIST)	/* EEXIST: resolved already */
			mm_error(h->zeropage ? "uffdio_zeropage" : "uffdio_copy", errno);
		if (stop)
			return NULL;
	}
}

static int uffd_register(int uffd, void *p, size_t len)
{
	struct uffdio_register r = {
		.range = { (uintptr_t)p, len }, .mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
		mm_error("uffdio_register", errno);
		return -1;
	}
	return 0;
}

/*
 * One round: map, register, read every page (timed), unmap.  Returns the
 * window's ns, or 0 when the range could not be set up (counted).  With
 * `probe` set the window is not counted and smaps is read after it.
 */
static uint64_t uf_round(struct handler *h, size_t len, struct mm_smaps *probe)
{
	const int timed = !probe;
	char *p = mm_map_aligned(len, 0);
	if (!p)
		return 0;
	/* Small pages: a THP fault would ask the handler for the whole range
	 * anyway, page by page, and the advice keeps it out of the picture. */
	if (madvise(p, len, MADV_NOHUGEPAGE))
		mm_error("madvise_nohugepage", errno);
	if (uffd_register(h->uffd, p, len)) {
		munmap(p, len);
		return 0;
	}
	struct mm_insns_other other;
	mm_insns_other_begin(&other, h->tid, timed);
	uint64_t t0 = MM_WINDOW_BEGIN_ALL(UF_FAULT, timed);
	mm_touch_read(p, len);
	uint64_t t1 = MM_WINDOW_END_ALL(UF_FAULT, timed);
	mm_insns_other_end(&other, UF_FAULT);
	if (probe)
		mm_smaps_range(p, len, probe);
	munmap(p, len);		/* unregisters it too */
	return t1 - t0;
}

/* A timed round for mm_run_rounds. */
struct uf_run {
	struct handler *h;
	size_t len;
	struct mm_rounds faults;
};

static int uf_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct uf_run *r = arg;
	const uint64_t ns = uf_round(r->h, r->len, NULL);
	(void)c;
	(void)start;	/* wherever mmap() put it */
	if (ns)
		mm_rounds_add(&r->faults, ns);
	return ns == 0;
}

static int uf_sample(struct mm_ctx *c)
{
	const size_t len = (size_t)mm_arg_long(c, "mapping-kb") * 1024;
	const double pages = (double)(len / MM_PAGE_SIZE);
	struct handler h = { 0 };
	struct uf_run r = { &h, len, { 0 } };
	struct mm_loop loop;
	int rc = 1;

	h.zeropage = !strcmp(mm_arg_str(c, "resolve"), "zeropage");
	h.uffd = uffd_open();
	if (h.uffd < 0) {
		mm_error("userfaultfd", errno);
		return 1;
	}
	h.src = mm_map_aligned(MM_PAGE_SIZE, 0);
	h.doorbell = mm_map_aligned(MM_PAGE_SIZE, 0);
	if (!h.src || !h.doorbell || uffd_register(h.uffd, h.doorbell, MM_PAGE_SIZE))
		goto out;
	memset(h.src, 0x5a, MM_PAGE_SIZE);
	if (pthread_create(&h.thread, NULL, handler_main, &h)) {
		mm_error("pthread_create", EAGAIN);
		goto out;
	}
	while (!h.tid)
		sched_yield();

	mm_run_rounds(c, mm_arg_long(c, "rounds"), uf_timed, &r, &loop);
	const long resolved = h.resolved;	/* by the timed rounds */
	struct mm_smaps probe = { 0 };
	const int probed = r.faults.n && mm_probes(c) && uf_round(&h, len, &probe) != 0;

	/* Stop the handler: its last fault. */
	if (!h.dead)
		mm_touch_read(h.doorbell, MM_PAGE_SIZE);
	pthread_join(h.thread, NULL);
	if (!r.faults.n)
		goto out;

	mm_metric_rounds(c, "fault_ns_per_page", &r.faults, pages);
	mm_count(c, "rounds", (double)r.faults.n);
	mm_count(c, "pages", pages * (double)r.faults.n);
	mm_count(c, "faults_resolved", (double)resolved);	/* one per page */
	mm_window_units(c, UF_FAULT, pages);
	rc = 0;
	if (probed) {
		mm_state_smaps(c, "after_fault_", &probe);
		/* UFFDIO_COPY maps new pages; the zero page is not in Rss. */
		mm_state_num(c, "after_fault_rss_fraction", (double)probe.rss_kb / ((double)len / 1024));
	}
out:
	mm_rounds_free(&r.faults);
	if (h.src)
		munmap(h.src, MM_PAGE_SIZE);
	if (h.doorbell)
		munmap(h.doorbell, MM_PAGE_SIZE);
	if (!h.dead)
		close(h.uffd);
	return rc;
}

const struct mm_workload wl_uffd = {
	.name = "uffd",
	.seed = "none: a baseline of userfaultfd missing-fault resolution",
	.summary = "register a fresh anon range with userfaultfd and time reading every page, "
		   "a handler thread resolving each missing fault with UFFDIO_COPY or "
		   "UFFDIO_ZEROPAGE",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.validate = uf_validate,
	.sample = uf_sample,
};
