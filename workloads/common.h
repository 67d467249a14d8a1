/*
 * common.h - what a workload file includes: the calls a workload makes to
 * the harness, gathered from the core-*.h headers (one concern each).
 *
 * A workload is a table (core-workload.h) and one function that produces
 * one measured sample; the harness parses arguments against the table,
 * runs warm-ups and samples, snapshots rusage and /proc/vmstat around each
 * sample, adds the global page state (THP mode, swap, KSM) and prints one
 * JSON line per sample on stdout.  The fields of the run context
 * (core-ctx.h) are the harness's own, so it is not included here.
 */
#ifndef MMWORK_COMMON_H
#define MMWORK_COMMON_H

#include "core-workload.h"
#include "core-args.h"
#include "core-procfs.h"
#include "core-errno.h"
#include "core-mem.h"
#include "core-shm.h"
#include "core-knobs.h"
#include "core-rounds.h"
#include "core-insns.h"
#include "core-record.h"
#include "core-range.h"
#include "core-sample.h"

#endif
