/*
 * core-knobs.h - global kernel settings a workload changes, and putting
 * them back.
 *
 * The machine is shared and a benchmark must leave it as it found it:
 * mm_knob_set() records the old value the first time a path is written;
 * every recorded value is written back after each sample, at exit and on
 * SIGINT/SIGTERM/SIGHUP (only by the process that recorded it, never by
 * forked workers).
 */
#ifndef MMWORK_CORE_KNOBS_H
#define MMWORK_CORE_KNOBS_H

int mm_knob_set(const char *path, const char *value);
void mm_knobs_restore(void);
/* Restore at exit and on SIGINT/SIGTERM/SIGHUP; once, before the first sample. */
void mm_knobs_restore_on_exit(void);

#endif
