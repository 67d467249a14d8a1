/*
 * core-rounds.c - round durations and their median, the monotonic clock,
 * and forked workers released together: the timing every workload shares,
 * so that all of them measure the same way.
 */
#define _GNU_SOURCE
#include "core-rounds.h"
#include "core-args.h"
#include "core-errno.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void mm_rounds_add(struct mm_rounds *r, uint64_t ns)
{
	if (r->n == r->cap) {
		r->cap = r->cap ? r->cap * 2 : 64;
		r->ns = realloc(r->ns, (size_t)r->cap * sizeof(*r->ns));
		if (!r->ns) {
			perror("mmwork: realloc");
			exit(1);
		}
	}
	r->ns[r->n++] = ns;
}

static int cmp_ns(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

double mm_rounds_median(const struct mm_rounds *r)
{
	if (!r->n)
		return NAN;
	qsort(r->ns, (size_t)r->n, sizeof(*r->ns), cmp_ns);
	return r->n % 2 ? (double)r->ns[r->n / 2]
			: ((double)r->ns[r->n / 2 - 1] + (double)r->ns[r->n / 2]) / 2;
}

double mm_rounds_total(const struct mm_rounds *r)
{
	double sum = 0;
	for (long i = 0; i < r->n; i++)
		sum += (double)r->ns[i];
	return sum;
}

/* Bucket of ns: exact below 2^(SUB_BITS+1), then SUB_BITS bits of mantissa. */
static unsigned hist_bucket(uint64_t ns)
{
	if (ns >= 1ULL << MM_HIST_MAX_BITS)
		ns = (1ULL << MM_HIST_MAX_BITS) - 1;
	if (ns < 2ULL << MM_HIST_SUB_BITS)
		return (unsigned)ns;
	unsigned shift = 63 - (unsigned)__builtin_clzll(ns) - MM_HIST_SUB_BITS;
	return (shift << MM_HIST_SUB_BITS) + (unsigned)(ns >> shift);
}

/* The middle of bucket b, in ns. */
static double hist_value(unsigned b)
{
	if (b < 2U << MM_HIST_SUB_BITS)
		return b;
	unsigned shift = (b >> MM_HIST_SUB_BITS) - 1;
	uint64_t low = (uint64_t)(b - (shift << MM_HIST_SUB_BITS)) << shift;
	return (double)low + (double)(1ULL << shift) / 2;
}

void mm_hist_clear(struct mm_hist *h)
{
	memset(h, 0, sizeof(*h));
}

void mm_hist_add(struct mm_hist *h, uint64_t ns)
{
	h->count[hist_bucket(ns)]++;
	h->n++;
	h->sum_ns += ns;
}

void mm_hist_merge(struct mm_hist *dst, const struct mm_hist *h)
{
	for (unsigned b = 0; b < MM_HIST_BUCKETS; b++)
		if (h->count[b])
			__atomic_fetch_add(&dst->count[b], h->count[b], __ATOMIC_RELAXED);
	__atomic_fetch_add(&dst->n, h->n, __ATOMIC_RELAXED);
	__atomic_fetch_add(&dst->sum_ns, h->sum_ns, __ATOMIC_RELAXED);
}

double mm_hist_median(const struct mm_hist *h)
{
	/* The two middle ranks (the same one when n is odd), averaged. */
	uint64_t lo = (h->n - 1) / 2, hi = h->n / 2, seen = 0;
	double vlo = NAN;
	if (!h->n)
		return NAN;
	for (unsigned b = 0; b < MM_HIST_BUCKETS; b++) {
		if (!h->count[b])
			continue;
		seen += h->count[b];
		if (isnan(vlo) && seen > lo)
			vlo = hist_value(b);
		if (seen > hi)
			return (vlo + hist_value(b)) / 2;
	}
	return vlo;
}

void mm_rounds_free(struct mm_rounds *r)
{
	free(r->ns);
	*r = (struct mm_rounds){ 0 };
}

uint64_t mm_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int mm_deadline_passed(uint64_t start_ns, double seconds)
{
	return (double)(mm_now_ns() - start_ns) >= seconds * 1e9;
}

int mm_run_workers(struct mm_ctx *c, int n, int (*fn)(struct mm_ctx *, int),
		   uint64_t *real_ns)
{
	int go[2], failed = 0;
	pid_t *pids = calloc((size_t)n, sizeof(*pids));
	if (!pids || pipe(go))
		mm_die(c, "cannot set up %d workers: %s", n, strerror(errno));
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			mm_error("fork", errno);
			n = i;
			failed = 1;
			break;
		}
		if (pids[i] == 0) {
			char b;
			close(go[1]);
			/* Wait for the release: every worker starts on the same edge. */
			if (read(go[0], &b, 1) < 0)
				_exit(1);
			_exit(fn(c, i) ? 1 : 0);
		}
	}
	close(go[0]);
	uint64_t t0 = mm_now_ns();
	close(go[1]);	/* EOF releases every worker at once */
	/* Reap in the order they end: once one worker fails (an OOM kill, say),
	 * the others are killed, since a worker that waits for its siblings
	 * (a probe round after everybody's timed rounds) would wait forever. */
	for (int left = n; left > 0; left--) {
		int st;
		pid_t pid = waitpid(-1, &st, 0);
		if (pid < 0)
			break;
		if (WIFEXITED(st) && !WEXITSTATUS(st))
			continue;
		if (WIFSIGNALED(st))
			fprintf(stderr, "mmwork: worker %d killed by signal %d\n", (int)pid,
				WTERMSIG(st));
		if (!failed)
			for (int i = 0; i < n; i++)
				if (pids[i] != pid)
					kill(pids[i], SIGKILL);
		failed = 1;
	}
	*real_ns = mm_now_ns() - t0;
	free(pids);
	return failed ? -1 : 0;
}
