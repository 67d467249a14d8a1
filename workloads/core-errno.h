/*
 * core-errno.h - failed calls counted by call and errno, reported in each
 * sample's "errors" object as "call:ERRNO".
 *
 * A workload keeps going when one mmap or madvise fails, so the failures
 * have to be counted rather than printed; a sample that hit ENOMEM is then
 * visible as such.  A sample in which no operation succeeded measured
 * nothing: its workload fails it (mremap-churn, populate-unmap: no cycle
 * got its mapping), and the harness's one line on stderr names the calls
 * that failed, with errno and count (mm_errors_text), so the trial fails
 * saying why instead of storing a rate of 0.  The table sits in shared
 * memory created before any fork, so forked workers count into it too.
 */
#ifndef MMWORK_CORE_ERRNO_H
#define MMWORK_CORE_ERRNO_H

#include "core-json.h"

#include <stddef.h>

/* Count a failed call by errno.  Safe from forked workers. */
void mm_error(const char *call, int err);

/* Create the shared table; before the first sample and any fork. */
void mm_errors_init(void);
/* Forget what a warm-up counted. */
void mm_errors_clear(void);
/* Write the "errors" object of a sample, then clear the table. */
void mm_errors_json(struct jbuf *j);
/* The failed calls as text, "mmap ENOMEM x 100709, ..." (empty if none). */
void mm_errors_text(char *buf, size_t len);

#endif
