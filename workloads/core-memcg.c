/*
 * core-memcg.c - the process's own cgroup v2 group with the memory
 * controller (core-memcg.h): found or mounted, made, limited, entered, read,
 * and everything undone on the way out.
 */
#define _GNU_SOURCE
#include "core-memcg.h"
#include "core-errno.h"
#include "core-procfs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define CGROUP_DIR "/sys/fs/cgroup"
#define MEMCG_MAX_STATS 32

/* Whether the comma-separated super options `opts` hold `option`. */
static int has_option(char *opts, const char *option)
{
	for (char *save, *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save))
		if (!strcmp(o, option))
			return 1;
	return 0;
}

/* The mount point of a mount of `fstype` (NULL: any type) at `at` (NULL:
 * anywhere) whose super options hold `option` (NULL: any), from
 * /proc/self/mountinfo, into out; 0 when there is none. */
static int find_mount(const char *fstype, const char *at, const char *option,
		      char *out, size_t len)
{
	char line[2048], point[MM_MEMCG_PATH], type[64], opts[512];
	int found = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		const char *sep = strstr(line, " - ");
		opts[0] = '\0';
		if (!sep || sscanf(line, "%*s %*s %*s %*s %255s", point) != 1 ||
		    sscanf(sep + 3, "%63s %*s %511s", type, opts) < 1)
			continue;
		found = (!fstype || !strcmp(type, fstype)) && (!at || !strcmp(point, at)) &&
			(!option || has_option(opts, option));
	}
	fclose(f);
	if (found)
		snprintf(out, len, "%s", point);
	return found;
}

/* The process's cgroup v2 path ("0::<path>" in /proc/self/cgroup). */
static int own_cgroup(char *out, size_t len)
{
	char line[MM_MEMCG_PATH];
	int found = 0;
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		if (!strncmp(line, "0::", 3)) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(out, len, "%s", line + 3);
			found = 1;
		}
	fclose(f);
	return found;
}

/* Whether the space-separated list in `dir`/`file` holds `word`. */
static int lists(const char *dir, const char *file, const char *word)
{
	char path[4 * MM_MEMCG_PATH], text[512];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (mm_read_text(path, text, sizeof(text)))
		return 0;
	for (char *save, *w = strtok_r(text, " ", &save); w; w = strtok_r(NULL, " ", &save))
		if (!strcmp(w, word))
			return 1;
	return 0;
}

static int write_in(const char *dir, const char *file, const char *value)
{
	char path[4 * MM_MEMCG_PATH];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	return mm_write_text(path, value);
}

/* cgroup2's mount, mounted at /sys/fs/cgroup when nothing is mounted there
 * (a guest); 0, or -1 with the reason in why. */
static int find_or_mount(struct mm_memcg *g, char *why, size_t len)
{
	char other[MM_MEMCG_PATH];
	if (find_mount("cgroup2", NULL, NULL, g->mount, sizeof(g->mount)))
		return 0;
	if (find_mount(NULL, CGROUP_DIR, NULL, other, sizeof(other))) {
		snprintf(why, len, "needs the cgroup v2 memory controller, and this machine has "
			 "cgroup v1 at " CGROUP_DIR " and no cgroup2 mount; run it in a guest");
		return -1;
	}
	if (mount("cgroup2", CGROUP_DIR, "cgroup2", 0, NULL)) {
		snprintf(why, len, "mounting cgroup2 at " CGROUP_DIR ": %s (run it as root)",
			 strerror(errno));
		return -1;
	}
	snprintf(g->mount, sizeof(g->mount), CGROUP_DIR);
	g->mounted = 1;
	return 0;
}

/* The memory controller in the parent's subtree_control; 0, or -1 with
 * the reason in why. */
static int enable_memory(struct mm_memcg *g, char *why, size_t len)
{
	if (!lists(g->parent, "cgroup.controllers", "memory")) {
		snprintf(why, len, "needs the cgroup v2 memory controller, and %s has none (it is "
			 "bound to a cgroup v1 hierarchy, or disabled); run it in a guest", g->parent);
		return -1;
	}
	if (lists(g->parent, "cgroup.subtree_control", "memory"))
		return 0;
	if (write_in(g->parent, "cgroup.subtree_control", "+memory")) {
		snprintf(why, len, "enabling memory in %s/cgroup.subtree_control: %s (only the root "
			 "group may hold processes and enable it)", g->parent, strerror(errno));
		return -1;
	}
	g->enabled = 1;
	return 0;
}

/* The group made and entered; 0, or -1 with the reason in why. */
static int make_group(struct mm_memcg *g, const char *name, char *why, size_t len)
{
	char value[32];
	snprintf(g->group, sizeof(g->group), "%s/mmwork-%s.%d", g->parent, name, (int)getpid());
	if (mkdir(g->group, 0755)) {
		snprintf(why, len, "mkdir %s: %s", g->group, strerror(errno));
		g->group[0] = '\0';
		return -1;
	}
	snprintf(value, sizeof(value), "%d", (int)getpid());
	if (write_in(g->group, "cgroup.procs", value)) {
		snprintf(why, len, "moving into %s: %s", g->group, strerror(errno));
		return -1;
	}
	return 0;
}

const struct mm_memcg_own *mm_memcg_trial;

int mm_memcg_enter(struct mm_memcg *g, const char *name, char *why, size_t len)
{
	char own[MM_MEMCG_PATH];
	*g = (struct mm_memcg){ 0 };
	if (mm_memcg_trial && mm_memcg_trial->version == 2) {
		snprintf(g->group, sizeof(g->group), "%s", mm_memcg_trial->g.group);
		g->adopted = 1;
		return 0;
	}
	if (find_or_mount(g, why, len))
		return -1;
	if (!own_cgroup(own, sizeof(own))) {
		snprintf(why, len, "no cgroup v2 line in /proc/self/cgroup");
		mm_memcg_leave(g);
		return -1;
	}
	snprintf(g->parent, sizeof(g->parent), "%s%s", g->mount, strcmp(own, "/") ? own : "");
	if (enable_memory(g, why, len) || make_group(g, name, why, len)) {
		mm_memcg_leave(g);
		return -1;
	}
	return 0;
}

int mm_memcg_limit(const struct mm_memcg *g, long long max_bytes)
{
	char value[32];
	snprintf(value, sizeof(value), "%lld", max_bytes);
	if (write_in(g->group, "memory.max", value)) {
		mm_error("memory_max", errno);
		return -1;
	}
	return 0;
}

void mm_memcg_leave(struct mm_memcg *g)
{
	char pid[32];
	if (g->adopted) {
		if (write_in(g->group, "memory.max", "max"))
			mm_error("memory_max", errno);
		*g = (struct mm_memcg){ 0 };
		return;
	}
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	if (g->group[0] && write_in(g->parent, "cgroup.procs", pid))
		mm_error("cgroup_procs", errno);
	/* Pages still charged to it keep it as a dying group; rmdir succeeds. */
	if (g->group[0] && rmdir(g->group))
		mm_error("cgroup_rmdir", errno);
	if (g->enabled && write_in(g->parent, "cgroup.subtree_control", "-memory"))
		mm_error("cgroup_subtree_control", errno);
	if (g->mounted && umount(g->mount))
		mm_error("umount_cgroup2", errno);
	*g = (struct mm_memcg){ 0 };
}

long long mm_memcg_read(const struct mm_memcg *g, const char *file)
{
	char path[4 * MM_MEMCG_PATH];
	snprintf(path, sizeof(path), "%s/%s", g->group, file);
	return mm_read_long(path);
}

void mm_memcg_stat(const struct mm_memcg *g, const char *const *names, long long *v)
{
	char path[4 * MM_MEMCG_PATH], key[64];
	long long value;
	int n = 0;
	while (names[n] && n < MEMCG_MAX_STATS)
		v[n++] = -1;
	snprintf(path, sizeof(path), "%s/memory.stat", g->group);
	FILE *f = fopen(path, "re");
	if (!f)
		return;
	while (fscanf(f, "%63s %lld", key, &value) == 2)
		for (int i = 0; i < n; i++)
			if (!strcmp(key, names[i]))
				v[i] = value;
	fclose(f);
}

/* The process's path in the v1 hierarchy whose controllers include memory. */
static int own_v1_memory(char *out, size_t len)
{
	char line[MM_MEMCG_PATH + 64];
	int found = 0;
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		char *ctrl = strchr(line, ':'), *path = ctrl ? strchr(ctrl + 1, ':') : NULL;
		if (!path)
			continue;
		*path++ = '\0';
		found = has_option(ctrl + 1, "memory");
		if (found) {
			path[strcspn(path, "\n")] = '\0';
			snprintf(out, len, "%s", path);
		}
	}
	fclose(f);
	return found;
}

int mm_memcg_own_find(struct mm_memcg_own *o, char *why, size_t len)
{
	char mount[MM_MEMCG_PATH], own[MM_MEMCG_PATH], stat[4 * MM_MEMCG_PATH];
	*o = (struct mm_memcg_own){ 0 };
	if (find_mount("cgroup", NULL, "memory", mount, sizeof(mount)) &&
	    own_v1_memory(own, sizeof(own)))
		o->version = 1;
	else if (find_mount("cgroup2", NULL, NULL, mount, sizeof(mount)) &&
		 own_cgroup(own, sizeof(own)))
		o->version = 2;
	else {
		snprintf(why, len, "--own-memcg: no memory cgroup found in /proc/self/cgroup");
		return -1;
	}
	snprintf(o->g.group, sizeof(o->g.group), "%s%s", mount, strcmp(own, "/") ? own : "");
	snprintf(stat, sizeof(stat), "%s/memory.stat", o->g.group);
	if (access(stat, R_OK)) {
		snprintf(why, len, "--own-memcg: %s: %s (the memory controller is not enabled "
			 "for this group)", stat, strerror(errno));
		o->version = 0;
		return -1;
	}
	return 0;
}
