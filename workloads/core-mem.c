/*
 * core-mem.c - mappings placed on a boundary or not, and page touching,
 * used by several workloads; a failed mmap is counted (core-errno).
 */
#define _GNU_SOURCE
#include "core-mem.h"
#include "core-errno.h"
#include "core-workload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *mm_map_aligned(size_t len, size_t align)
{
	return mm_map(len, align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
}

const char *const mm_align_choices[] = { "pmd", "none", NULL };

size_t mm_align_bytes(const char *choice)
{
	return strcmp(choice, "pmd") ? 0 : MM_PMD_SIZE;
}

double mm_pmd_offset_kb(const void *p)
{
	return (double)((uintptr_t)p % MM_PMD_SIZE) / 1024;
}

void *mm_map(size_t len, size_t align, int prot, int flags, int fd)
{
	if (!align) {
		void *p = mmap(NULL, len, prot, flags, fd, 0);
		if (p == MAP_FAILED) {
			mm_error("mmap", errno);
			return NULL;
		}
		return p;
	}
	/* Reserve len + align of address space, map over the boundary inside
	 * it, give the rest back. */
	char *r = mmap(NULL, len + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (r == MAP_FAILED) {
		mm_error("mmap", errno);
		return NULL;
	}
	uintptr_t start = ((uintptr_t)r + align - 1) & ~(uintptr_t)(align - 1);
	size_t head = start - (uintptr_t)r, tail = align - head;
	char *p = mmap((void *)start, len, prot, flags | MAP_FIXED, fd, 0);
	if (p == MAP_FAILED) {
		mm_error("mmap", errno);
		munmap(r, len + align);
		return NULL;
	}
	if (head)
		munmap(r, head);
	if (tail)
		munmap(p + len, tail);
	return p;
}

void mm_touch_write(char *p, size_t len, unsigned char value)
{
	for (size_t off = 0; off < len; off += MM_PAGE_SIZE)
		((volatile char *)p)[off] = (char)value;
}

uint64_t mm_touch_read(const char *p, size_t len)
{
	uint64_t sum = 0;
	for (size_t off = 0; off < len; off += MM_PAGE_SIZE)
		sum += (unsigned char)((const volatile char *)p)[off];
	return sum;
}
