/*
 * mprotect_repro.c - a reporter's 30-line reproducer that marks its own
 * window with mmlab.h: flip the protection of every page of a 8 MiB
 * populated mapping, one mprotect() per page (each splits or merges a VMA).
 * Prints key=value figures: pages (the units of one window) and ns_per_page.
 * build by hand: gcc -O2 -static -I<dir of mmlab.h> -o mprotect_repro mprotect_repro.c
 * (`mmlab header > mmlab.h`); run by mmlab: source = "repro/mprotect_repro.c"
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include "mmlab.h"

int main(int argc, char **argv)
{
	size_t pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 2048;
	char *p = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	struct timespec t0, t1;
	if (p == MAP_FAILED)
		return perror("mmap"), 1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	MMLAB_BEGIN(1);
	for (size_t i = 0; i < pages; i += 2)
		mprotect(p + i * 4096, 4096, PROT_READ);
	for (size_t i = 0; i < pages; i += 2)
		mprotect(p + i * 4096, 4096, PROT_READ | PROT_WRITE);
	MMLAB_END(1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("pages=%zu\nns_per_page=%.1f\n", pages,
	       ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / pages);
	return munmap(p, pages * 4096);
}
