/*
 * core-procfs.h - reading the kernel's text files: /proc/meminfo,
 * /proc/vmstat, /proc/self/smaps, /proc/stat and sysfs values.
 *
 * What the memory really was is read from these files; parsing them in one
 * place means every sample and every workload reads them the same way.
 */
#ifndef MMWORK_CORE_PROCFS_H
#define MMWORK_CORE_PROCFS_H

#include <stddef.h>
#include <stdint.h>

#include "core-workload.h"

/* sysfs/procfs text files.  mm_write_text is open/write/close only, so a
 * signal handler may call it (core-knobs.c); -1 with errno set. */
int mm_read_text(const char *path, char *buf, size_t len);
int mm_write_text(const char *path, const char *value);
/* Online NUMA nodes, from /sys/devices/system/node/online (1 without it). */
int mm_online_nodes(void);
long mm_read_long(const char *path);
long mm_meminfo_kb(const char *key);
/* The bracketed word of a sysfs mode file such as THP's "always [madvise] never",
 * or "unavailable". */
void mm_read_bracketed(const char *path, char *out, size_t len);

/* /proc/vmstat counters named by `names` (NULL-terminated, at most 64);
 * -1 for a counter this kernel does not have. */
struct mm_vmstat_snap {
	long v[64];
};
void mm_vmstat_read(const char *const *names, struct mm_vmstat_snap *s);

/*
 * The machine's CPU time from /proc/stat, in USER_HZ ticks, -1 where not
 * reported: `busy` every CPU spent running anything (user, nice, system,
 * irq, softirq), `steal` the time the hypervisor ran something else.
 */
struct mm_cpu_ticks {
	long busy, steal;
};
void mm_cpu_ticks(struct mm_cpu_ticks *t);

/* A pressure stall's total ("some", in us) from /proc/pressure/<what>; -1
 * without PSI. */
long long mm_psi_some_us(const char *what);

/* smaps of every VMA overlapping [start, end), summed. */
struct mm_smaps {
	long vmas, rss_kb, anon_kb, anon_huge_kb, swap_kb;
	long file_pmd_kb, shmem_pmd_kb, kernel_page_kb;
};
int mm_smaps_range(const void *start, size_t len, struct mm_smaps *out);
/* The same from any smaps file (/proc/PID/smaps): VMAs overlapping [lo, hi). */
int mm_smaps_file(const char *path, uintptr_t lo, uintptr_t hi, struct mm_smaps *out);
/* Add the smaps totals to the sample state, keys prefixed by `prefix`. */
void mm_state_smaps(struct mm_ctx *ctx, const char *prefix,
		    const struct mm_smaps *s);

#endif
