/*
 * core-memcg.h - a cgroup v2 group of the process's own, with the memory
 * controller: its own memory.max, and its own memory.stat to read.
 *
 * Reclaim under a memcg limit happens in the task that charges a page
 * (try_charge_memcg -> try_to_free_mem_cgroup_pages), and the group's
 * memory.stat counts what reclaim did to that group's pages alone, where
 * /proc/vmstat counts the whole machine (and leaves limit reclaim out of
 * its pgscan_direct).  So a workload that measures reclaim makes a group
 * for itself: cgroup2 mounted at /sys/fs/cgroup if nothing is mounted
 * there (a guest's initramfs mounts none), the memory controller enabled
 * in the parent's cgroup.subtree_control, a child group with its limit,
 * the process moved in; and all of it undone, in reverse, when it leaves.
 *
 * A machine whose memory controller is not on cgroup v2 (a cgroup v1
 * host) cannot give such a group: entering says why, in one line, and
 * changes nothing.
 */
#ifndef MMWORK_CORE_MEMCG_H
#define MMWORK_CORE_MEMCG_H

#include <stddef.h>

#define MM_MEMCG_PATH 256	/* a mount point, a cgroup's path in its hierarchy */

struct mm_memcg {
	char group[3 * MM_MEMCG_PATH];	/* the group made: <parent>/mmwork-<name>.<pid> */
	char parent[2 * MM_MEMCG_PATH];	/* the cgroup the process was in: <mount><path> */
	char mount[MM_MEMCG_PATH];	/* where cgroup2 is mounted */
	int mounted;			/* mounted here by mm_memcg_enter */
	int enabled;			/* memory enabled in the parent by mm_memcg_enter */
	int adopted;			/* the trial's own group (--own-memcg), not made here */
};

/*
 * Make the group "mmwork-<name>.<pid>" under the process's cgroup and move
 * the process into it, without a limit yet.  A process that started in a
 * cgroup v2 group of the trial's own (--own-memcg, mm_memcg_trial) takes
 * that group instead: cgroup v2 lets a group that holds processes have no
 * children with the memory controller, and the group is the trial's alone.
 * -1 with the reason in `why` (one line, for mm_die) when it cannot; what
 * was done by then is undone.
 */
int mm_memcg_enter(struct mm_memcg *g, const char *name, char *why, size_t len);
/* The group's memory.max; -1 with the failure counted. */
int mm_memcg_limit(const struct mm_memcg *g, long long max_bytes);
/* Back into the parent, the group removed, the controller and the mount as
 * they were; a step that fails is counted (core-errno.h). */
void mm_memcg_leave(struct mm_memcg *g);

/* A number from the group's file `file` ("memory.current"); -1 when absent. */
long long mm_memcg_read(const struct mm_memcg *g, const char *file);
/* The counters of the group's memory.stat named by `names` (NULL-terminated,
 * at most 32), into v[]; -1 for one this kernel does not have. */
void mm_memcg_stat(const struct mm_memcg *g, const char *const *names, long long *v);

/*
 * The memory cgroup the process started in, when the runner made it for
 * this trial alone (--own-memcg): a host trial's neighbours charge other
 * groups, so this group's memory.stat counts the trial's own faults, THP
 * and swap where /proc/vmstat counts the whole machine's.  Found on
 * cgroup v2 ("0::<path>") or on a v1 hierarchy that has the memory
 * controller ("<n>:...memory...:<path>"); v1 has no THP event counters.
 */
struct mm_memcg_own {
	struct mm_memcg g;	/* g.group: the group's directory */
	int version;		/* 1 or 2; 0: none found */
};

/* 0 with the group found, or -1 with the reason in `why`. */
int mm_memcg_own_find(struct mm_memcg_own *o, char *why, size_t len);
/* The group --own-memcg found, NULL without it (main.c sets it): what
 * each sample reads (core-sample.c) and reclaim's memcg pressure adopts. */
extern const struct mm_memcg_own *mm_memcg_trial;

#endif
