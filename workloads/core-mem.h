/*
 * core-mem.h - the memory operations several workloads share: a mapping
 * placed on a 2 MiB boundary or wherever mmap() puts it, and touching every
 * page (memory shared across fork is core-shm.h).
 *
 * Each workload then faults pages in the same way (one access per 4 KiB
 * page, through volatile so the compiler keeps every access), and places its
 * mappings the same way: whether a large mapping starts on a PMD boundary
 * decides whether THP can back it, so it is a page-state choice (--align).
 */
#ifndef MMWORK_CORE_MEM_H
#define MMWORK_CORE_MEM_H

#include <stddef.h>
#include <stdint.h>

/* An anonymous private mapping of `len` at an `align` boundary (e.g. a PMD
 * so that THP can back it), or NULL with the failure counted. */
void *mm_map_aligned(size_t len, size_t align);
/* mmap(NULL, len, prot, flags, fd, 0) started on an `align` boundary, or
 * where the kernel puts it when align is 0; NULL with the failure counted. */
void *mm_map(size_t len, size_t align, int prot, int flags, int fd);

/* --align: "pmd" (a 2 MiB boundary) or "none" (a plain mmap of the size, as
 * reproducers do; the kernel may still choose a boundary itself). */
extern const char *const mm_align_choices[];
size_t mm_align_bytes(const char *choice);
/* Where a mapping starts within its 2 MiB frame, in KiB (0: PMD-aligned). */
double mm_pmd_offset_kb(const void *p);
void mm_touch_write(char *p, size_t len, unsigned char value);
uint64_t mm_touch_read(const char *p, size_t len);

#endif
