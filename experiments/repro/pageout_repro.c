/*
 * pageout_repro.c - seed 001's loop as a reporter would write it: one file,
 * no mmlab code.  Map 16 MiB of anonymous memory (plain mmap, default THP
 * policy), write-touch every page, madvise(MADV_PAGEOUT), write-touch again,
 * unmap; repeat.
 *
 * It prints key=value figures, each total time over total pages (the mean
 * over all timed rounds, the statistic reproducers and stress-ng report):
 *
 *   prefault_ns_per_page   the first write-touch
 *   advise_ns_per_page     madvise(MADV_PAGEOUT)
 *   post_touch_ns_per_page the write-touch after it (the refault)
 *   cycle_ns_per_page      pageout plus refault touch
 *   rounds, pages          how much was timed
 *
 * Before the timed rounds, untimed rounds run for --warmup-ms (faulting in
 * the page tables, the allocator and the caches once).  Nothing but the
 * clock is read between the timed phases.
 *
 * build: gcc -O2 -static -o pageout_repro pageout_repro.c
 * run:   ./pageout_repro [--mapping-kb 16384] [--rounds 8] [--min-ms 200] [--warmup-ms 200]
 * mmlab: mmlab run --source experiments/repro/pageout_repro.c --metrics-from key=value \
 *          --metric advise_ns_per_page:lower --metric cycle_ns_per_page:lower
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

#define PAGE 4096UL

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void touch(char *p, size_t len, char value)
{
	for (size_t off = 0; off < len; off += PAGE)
		((volatile char *)p)[off] = value;
}

struct phases {
	uint64_t prefault, advise, touch;
};

/* One round: map, touch, pageout, touch, unmap; the three phases timed. */
static int round_once(size_t len, struct phases *t)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		return -1;
	}
	uint64_t t0 = now_ns();
	touch(p, len, 1);
	uint64_t t1 = now_ns();
	if (madvise(p, len, MADV_PAGEOUT)) {
		perror("madvise(MADV_PAGEOUT)");
		munmap(p, len);
		return -1;
	}
	uint64_t t2 = now_ns();
	touch(p, len, 2);
	uint64_t t3 = now_ns();
	munmap(p, len);
	t->prefault += t1 - t0;
	t->advise += t2 - t1;
	t->touch += t3 - t2;
	return 0;
}

static long option(int argc, char **argv, const char *name, long def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name)) {
			char *end;
			long v = strtol(argv[i + 1], &end, 10);
			if (*end || v < 0) {
				fprintf(stderr, "%s: '%s' is not a whole number\n", name, argv[i + 1]);
				exit(2);
			}
			return v;
		}
	return def;
}

int main(int argc, char **argv)
{
	const size_t len = (size_t)option(argc, argv, "--mapping-kb", 16384) * 1024;
	const long min_rounds = option(argc, argv, "--rounds", 8);
	const uint64_t min_ns = (uint64_t)option(argc, argv, "--min-ms", 200) * 1000000ull;
	const uint64_t warm_ns = (uint64_t)option(argc, argv, "--warmup-ms", 200) * 1000000ull;
	struct phases t = { 0 }, ignored = { 0 };
	long rounds = 0;

	if (len < PAGE) {
		fprintf(stderr, "--mapping-kb: at least 4\n");
		return 2;
	}
	for (uint64_t start = now_ns(); now_ns() - start < warm_ns;)
		if (round_once(len, &ignored))
			return 1;
	for (uint64_t start = now_ns(); rounds < min_rounds || now_ns() - start < min_ns; rounds++)
		if (round_once(len, &t))
			return 1;

	const double pages = (double)(len / PAGE) * (double)rounds;
	printf("prefault_ns_per_page=%.3f\n", (double)t.prefault / pages);
	printf("advise_ns_per_page=%.3f\n", (double)t.advise / pages);
	printf("post_touch_ns_per_page=%.3f\n", (double)t.touch / pages);
	printf("cycle_ns_per_page=%.3f\n", (double)(t.advise + t.touch) / pages);
	printf("rounds=%ld pages=%.0f\n", rounds, pages);
	return 0;
}
