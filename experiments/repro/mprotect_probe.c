/*
 * mprotect_probe.c - a reporter's single-file probe, with no markers: fault
 * in every page of a shared anonymous mapping (write-touch), make the whole
 * mapping read-only with one mprotect() call, unmap it.  Its timed metric is
 * the protect call alone, as the reporter timed it.
 * Prints key=value figures: pages (the mapping's pages) and protect_ns_per_page.
 * build by hand: gcc -O2 -static -o mprotect_probe mprotect_probe.c
 * run by mmlab: source = "repro/mprotect_probe.c" (experiments/mprotect-probe.toml)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv)
{
	size_t pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 2048;
	size_t len = pages * 4096;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct timespec t0, t1;
	if (p == MAP_FAILED)
		return perror("mmap"), 1;
	for (size_t i = 0; i < pages; i++)
		p[i * 4096] = (char)i;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (mprotect(p, len, PROT_READ))
		return perror("mprotect"), 1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (munmap(p, len))
		return perror("munmap"), 1;
	printf("pages=%zu\nprotect_ns_per_page=%.1f\n", pages,
	       ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / pages);
	return 0;
}
