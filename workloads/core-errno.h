/*
 * core-errno.h - failed calls counted by call and errno, reported in each
 * sample's "errors" object as "call:ERRNO".
 *
 * A workload keeps going when one mmap or madvise fails, so the failures
 * have to be counted rather than printed; a sample that hit ENOMEM is then
 * visible as such.  The table sits in shared memory created before any
 * fork, so forked workers count into it too.
 */
#ifndef MMWORK_CORE_ERRNO_H
#define MMWORK_CORE_ERRNO_H

#include "core-json.h"

/* Count a failed call by errno.  Safe from forked workers. */
void mm_error(const char *call, int err);

/* Create the shared table; before the first sample and any fork. */
void mm_errors_init(void);
/* Forget what a warm-up counted. */
void mm_errors_clear(void);
/* Write the "errors" object of a sample, then clear the table. */
void mm_errors_json(struct jbuf *j);

#endif
