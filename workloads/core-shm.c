/*
 * core-shm.c - memory shared across fork.  It depends on nothing else of
 * the harness, so the errno table can be allocated from it without a loop: a
 * failure here ends mmwork rather than being counted.
 */
#define _GNU_SOURCE
#include "core-shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *mm_shared_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmwork: mmap shared");
		exit(1);
	}
	memset(p, 0, len);
	return p;
}
