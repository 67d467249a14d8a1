/*
 * core-shm.h - memory shared across fork: the tables forked workers write
 * into (the errno table, instruction counts, a workload's op counts and
 * round times) are created before any fork, so every worker sees the same
 * pages.
 */
#ifndef MMWORK_CORE_SHM_H
#define MMWORK_CORE_SHM_H

#include <stddef.h>

/* Zeroed MAP_SHARED memory that forked workers see; exits on failure. */
void *mm_shared_alloc(size_t len);

#endif
