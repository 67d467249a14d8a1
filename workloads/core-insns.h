/*
 * core-insns.h - what each timed window executed: its kernel and user
 * instructions per unit of work, and the CPU time its thread ran, beside
 * its wall time.
 *
 * Time is noisy where instructions are not: the same kernel path executes
 * the same instructions whatever the machine is doing, which is why the
 * 0-day robot prints perf-stat instruction deltas next to every timing.  A
 * workload declares its timed windows (struct mm_window: "advise", per
 * "page") and brackets each with MM_WINDOW_BEGIN / MM_WINDOW_END, which
 * also take its time.  With --insns the harness then counts each window's
 * instructions from whichever source exists:
 *
 * - perf: a perf_event_open group (instructions, one counter excluding user
 *   and one excluding kernel) of the calling thread, read outside the timed
 *   part of the window: on a host with a PMU and in a KVM guest with a vPMU.
 *   The sample gets <window>_kernel_insns_per_<unit> and
 *   <window>_user_insns_per_<unit> (the mean window, per unit).
 * - markers: a 7-byte NOP (nopl disp32(%rax)) whose displacement says
 *   "begin window w", "end window w" or "sample done", executed inside the
 *   timed part so that the clock reads around it are not counted.  A NOP
 *   costs nothing natively and translates to nothing under TCG; mmlab's
 *   QEMU plugin (qemu-plugin/insns.c) recognises it and counts the guest's
 *   instructions between the two, and mmlab adds the same metrics to the
 *   sample from the plugin's record (mmwork cannot read them back: a 7.2
 *   plugin can neither write guest memory nor registers).
 *
 * Every sample carries, per window, how many windows were counted
 * (<window>_windows) and the units one window did (<window>_units), so the
 * plugin's counts can be turned into the same per-unit metrics and checked
 * against the number of windows.  Without a source the metrics are absent,
 * never zero.
 *
 * With --cpu-time the window's thread reads its own CPU clock
 * (CLOCK_THREAD_CPUTIME_ID: the time it ran, user and kernel) before the
 * start clock read and after the end one, and the sample gets
 * <window>_cpu_ns_per_<unit> (the mean window, per unit).  Wall time also
 * holds whatever the CPU ran instead of the window's thread: on a shared
 * machine, the neighbours' slices.  The thread clock has no vDSO path, so
 * each read is a system call: taken only when a profile judges CPU time.
 * A window whose work another thread or process does (MM_WINDOW_BEGIN_ALL,
 * struct mm_window's `elsewhere`) gets none: the caller's clock misses it.
 */
#ifndef MMWORK_CORE_INSNS_H
#define MMWORK_CORE_INSNS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core-rounds.h"
#include "core-workload.h"
#include "include/mmlab.h"

/*
 * The marker's encoding is mmlab.h's, the header a reporter's own program
 * includes to mark its windows: nopl MMLAB_MARK_MAGIC|kind|window(%rax).
 * Window 0 of an exec workload is the whole command (exec.c), whose markers
 * count every vCPU of the guest, not just the one that executed them.
 */
#define MM_MARK_MAGIC MMLAB_MARK_MAGIC
#define MM_MARK_BEGIN MMLAB_MARK_BEGIN
#define MM_MARK_END MMLAB_MARK_END
#define MM_MARK_SAMPLE 0x0300u		/* a measured sample is complete */
#define MM_MARK_WARMUP 0x0400u		/* a warm-up is complete: its windows are not a sample */
#define MM_MARK_BEGIN_ALL 0x0500u	/* a window over every vCPU begins */
#define MM_MARK_END_ALL 0x0600u		/* ... and ends */
#define MM_MARK_KIND 0xff00u
#define MM_MARK_WINDOW 0x00ffu
#define MM_MARK(code) MMLAB_MARK(code)

_Static_assert(MMLAB_MAX_WINDOWS == MM_MAX_WINDOWS, "mmlab.h's windows are mmwork's");

/* Whether this run counts instructions (--insns) and takes the windows'
 * CPU time (--cpu-time); the window macros read them. */
extern int mm_insns_on, mm_cputime_on;

/*
 * An instructions counter of `pid` (0: the caller), kernel only or user only:
 * in `group` (-1: a leader) read as a group; or, `inherited`, one counter
 * that starts at pid's exec and that every process it starts adds to.
 */
int mm_insns_counter(pid_t pid, int exclude_user, int group, int inherited);

/* Around window `w`, outside its clock reads: count it, read perf. */
void mm_insns_begin(int window);
void mm_insns_end(int window);

/* Around window `w`, outside the perf reads too: its thread's CPU clock. */
void mm_cputime_begin(int window);
void mm_cputime_end(int window);
/* A window timed with MM_WINDOW_BEGIN_ALL, noted so that a sample's end can
 * check it against its table's `elsewhere` (mm_insns_sample_end). */
void mm_cputime_elsewhere(int window);

/*
 * The start and end time of window `w` (a constant: it is encoded in the
 * marker), in ns.  `counted` is 0 on untimed rounds (a state probe round),
 * whose windows must not be counted.  perf is read outside the clock reads,
 * the marker inside them.
 */
#define MM_WINDOW_BEGIN(w, counted) __extension__ ({ \
	const int on_ = mm_insns_on && (counted); \
	if (mm_cputime_on && (counted)) \
		mm_cputime_begin(w); \
	if (on_) \
		mm_insns_begin(w); \
	const uint64_t t_ = mm_now_ns(); \
	if (on_) \
		MM_MARK(MM_MARK_BEGIN | (w)); \
	t_; })
#define MM_WINDOW_END(w, counted) __extension__ ({ \
	const int on_ = mm_insns_on && (counted); \
	if (on_) \
		MM_MARK(MM_MARK_END | (w)); \
	const uint64_t t_ = mm_now_ns(); \
	if (on_) \
		mm_insns_end(w); \
	if (mm_cputime_on && (counted)) \
		mm_cputime_end(w); \
	t_; })

/*
 * A window whose work another process does (fork-cow's exit: the parent
 * releases a child, the child exits, the parent reaps it).  Its markers
 * cover every vCPU, since the other process runs on any of them; with perf,
 * mm_insns_other_begin() opens a counter group on `pid` before the window
 * and mm_insns_other_end() adds what it counted to window `w` after it (a
 * reaped child's counters keep their final counts), so the window's
 * instructions are both processes'.  `counted` as for MM_WINDOW_BEGIN.
 */
#define MM_WINDOW_BEGIN_ALL(w, counted) __extension__ ({ \
	const int on_ = mm_insns_on && (counted); \
	if (mm_cputime_on && (counted)) \
		mm_cputime_elsewhere(w); \
	if (on_) \
		mm_insns_begin(w); \
	const uint64_t t_ = mm_now_ns(); \
	if (on_) \
		MM_MARK(MM_MARK_BEGIN_ALL | (w)); \
	t_; })
#define MM_WINDOW_END_ALL(w, counted) __extension__ ({ \
	const int on_ = mm_insns_on && (counted); \
	if (on_) \
		MM_MARK(MM_MARK_END_ALL | (w)); \
	const uint64_t t_ = mm_now_ns(); \
	if (on_) \
		mm_insns_end(w); \
	t_; })
struct mm_insns_other {
	int kernel, user;	/* the counter group on the other process, or -1 */
};
void mm_insns_other_begin(struct mm_insns_other *o, pid_t pid, int counted);
void mm_insns_other_end(struct mm_insns_other *o, int window);

/* How many units (pages, ops) one window of `w` works on in this sample;
 * a window without units gets no per-unit metrics. */
void mm_window_units(struct mm_ctx *ctx, int window, double units);

/* "<window>_<side>_insns_per_<unit>", side "kernel" or "user", and
 * "<window>_cpu_ns_per_<unit>": the metric names, for `mmwork describe` and
 * the samples alike. */
void mm_insns_metric(char *buf, size_t size, const struct mm_window *w, const char *side);
void mm_cputime_metric(char *buf, size_t size, const struct mm_window *w);

/* The harness's side: --insns and --cpu-time on or off, per-sample reset,
 * and the end of a sample (its marker, its window counts and, with perf or
 * the CPU clock, its metrics). */
void mm_insns_init(int insns, int cputime);
void mm_insns_sample_begin(void);
void mm_insns_sample_end(struct mm_ctx *ctx, int warmup);

#endif
