/*
 * splitter.c - one anonymous mapping split the way seed 002 says real
 * programs split theirs, then held still for the census.
 *
 *   splitter PAGES PATTERN SECONDS
 *
 * PAGES pages are mapped, faulted in (which gives the mapping its anon_vma),
 * marked MADV_NOHUGEPAGE and MADV_MERGEABLE, and every other page then gets
 * PATTERN: guard (mprotect PROT_NONE: ksm-rmap's --pattern guard, JVM-style
 * guard pages), dontneed and free (madvise MADV_DONTNEED / MADV_FREE: what
 * seed 002 says databases do), mlock, nohugepage (madvise MADV_HUGEPAGE on
 * every other page), guard-install (MADV_GUARD_INSTALL, Linux 6.13+: guard
 * pages without VMAs).  A split VMA keeps its anon_vma, so the pieces are
 * one group.  Prints "ready" when done, then holds SECONDS (0: until stdin
 * closes).  A PROT_NONE page on each side keeps the mapping from merging
 * with a neighbour when it is mapped (a merged neighbour would lend it its
 * anon_vma, and stay in the group after the split).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

static int apply(const char *pattern, char *page, size_t size)
{
	if (!strcmp(pattern, "guard"))
		return mprotect(page, size, PROT_NONE);
	if (!strcmp(pattern, "dontneed"))
		return madvise(page, size, MADV_DONTNEED);
	if (!strcmp(pattern, "free"))
		return madvise(page, size, MADV_FREE);
	if (!strcmp(pattern, "mlock"))
		return mlock(page, size);
	if (!strcmp(pattern, "nohugepage"))
		return madvise(page, size, MADV_HUGEPAGE);
	if (!strcmp(pattern, "guard-install"))
		return madvise(page, size, MADV_GUARD_INSTALL);
	errno = EINVAL;
	return -1;
}

int main(int argc, char **argv)
{
	if (argc != 4 || atol(argv[1]) < 1) {
		fprintf(stderr, "usage: splitter PAGES guard|dontneed|free|mlock|nohugepage|"
			"guard-install SECONDS\n");
		return 2;
	}
	const long pages = atol(argv[1]), ps = sysconf(_SC_PAGESIZE);
	const size_t len = (size_t)pages * (size_t)ps;
	char *all = mmap(NULL, len + 2 * (size_t)ps, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *base = all + ps;
	if (all == MAP_FAILED || mprotect(base, len, PROT_READ | PROT_WRITE)) {
		perror("splitter: mmap");
		return 1;
	}
	madvise(base, len, MADV_NOHUGEPAGE);
	memset(base, 0x5a, len);
	madvise(base, len, MADV_MERGEABLE);	/* as ksm-rmap; EINVAL without KSM is fine */
	for (long i = 1; i < pages; i += 2)
		if (apply(argv[2], base + i * ps, (size_t)ps)) {
			fprintf(stderr, "splitter: %s on page %ld: %s\n", argv[2], i, strerror(errno));
			return 1;
		}
	printf("ready\n");
	fflush(stdout);
	if (atof(argv[3]) > 0)
		usleep((useconds_t)(atof(argv[3]) * 1e6));
	else
		while (getchar() != EOF)
			;
	return 0;
}
