/*
 * core-state.c - the global page state every sample carries (THP and mTHP
 * modes and counters, swap, KSM, MGLRU) and the kernel's own mm actors, read
 * in one place so that every workload's samples describe it alike and
 * src/mmlab/probe.py's mm_actors() reads the same facts the same way.
 */
#define _GNU_SOURCE
#include "core-state.h"
#include "core-procfs.h"
#include "core-record.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#define THP_DIR "/sys/kernel/mm/transparent_hugepage"
#define DAMON_KDAMONDS "/sys/kernel/mm/damon/admin/kdamonds"

/* Per-size anonymous counters, each reported as a delta over the sample when
 * the kernel has it: allocations at fault, fallbacks to a smaller size,
 * splits, swap-outs whole and swap-outs that had to split first. */
static const char *const mthp_counters[] = {
	"anon_fault_alloc", "anon_fault_fallback", "split", "swpout", "swpout_fallback", NULL,
};

static int state_by_size(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return x < y ? -1 : x > y;
}

void mm_mthp_read(struct mm_mthp_snap *s)
{
	char path[256];
	long sizes[MM_MTHP_MAX_SIZES];
	int n = 0;
	struct dirent *e;
	DIR *d = opendir(THP_DIR);

	memset(s, 0, sizeof(*s));
	if (!d)
		return;
	while ((e = readdir(d)) && n < MM_MTHP_MAX_SIZES) {
		long kb;
		char unit[4];
		struct stat st;
		if (sscanf(e->d_name, "hugepages-%ld%3s", &kb, unit) != 2 || strcmp(unit, "kB"))
			continue;
		/* A size without `enabled` is for shmem and files only, not anon. */
		snprintf(path, sizeof(path), THP_DIR "/%.64s/enabled", e->d_name);
		if (!stat(path, &st))
			sizes[n++] = kb;
	}
	closedir(d);
	qsort(sizes, (size_t)n, sizeof(*sizes), state_by_size);
	for (int i = 0; i < n; i++) {
		s->size_kb[i] = sizes[i];
		snprintf(path, sizeof(path), THP_DIR "/hugepages-%ldkB/enabled", sizes[i]);
		mm_read_bracketed(path, s->enabled[i], sizeof(s->enabled[i]));
		for (int k = 0; mthp_counters[k]; k++) {
			snprintf(path, sizeof(path), THP_DIR "/hugepages-%ldkB/stats/%s", sizes[i],
				 mthp_counters[k]);
			s->v[i][k] = mm_read_long(path);
		}
	}
	s->n = n;
}

/* mTHP: whether the kernel has it, every size's mode, and per-size counters
 * over the sample.  A kernel without it says "not available" rather than
 * reporting zeros it never counted. */
static void state_mthp(struct mm_ctx *c, const struct mm_mthp_snap *b,
		       const struct mm_mthp_snap *a)
{
	char k[96];
	long pmd = mm_read_long(THP_DIR "/hpage_pmd_size");

	if (pmd > 0)
		mm_state_num(c, "thp_pmd_size_kb", (double)(pmd / 1024));
	mm_state_str(c, "mthp", a->n ? "available" : "not available");
	for (int i = 0; i < a->n; i++) {
		snprintf(k, sizeof(k), "mthp_%ldkB_enabled", a->size_kb[i]);
		mm_state_str(c, k, a->enabled[i]);
		if (i >= b->n || b->size_kb[i] != a->size_kb[i])
			continue;	/* sizes changed under us: no delta to give */
		for (int n = 0; mthp_counters[n]; n++) {
			if (a->v[i][n] < 0 || b->v[i][n] < 0)
				continue;
			snprintf(k, sizeof(k), "mthp_%ldkB_%s", a->size_kb[i], mthp_counters[n]);
			mm_state_num(c, k, (double)(a->v[i][n] - b->v[i][n]));
		}
	}
}

static int state_digit_dir(const struct dirent *e)
{
	return e->d_name[0] >= '0' && e->d_name[0] <= '9';
}

static int state_damon_module(const struct dirent *e)
{
	return !strncmp(e->d_name, "damon_", 6);
}

/* Append "; "-separated `what` to out, cut at len. */
static void state_append(char *out, size_t len, const char *what)
{
	size_t used = strlen(out), sep = used ? 2 : 0, n = strlen(what);
	if (used + sep + 1 >= len)
		return;
	if (used + sep + n + 1 > len)
		n = len - used - sep - 1;
	memcpy(out + used, "; ", sep);
	memcpy(out + used + sep, what, n);
	out[used + sep + n] = '\0';
}

/*
 * Every DAMON worker running now, worded as probe.damon() words it:
 * "kdamond 0 (paddr: pageout)" per context of a running sysfs kdamond, and
 * "damon_reclaim enabled" per enabled DAMON module; "off" when none.  Each
 * one pages out, sorts LRUs or samples access bits on its own, under
 * whatever the workload measures.
 */
static void state_damon(char *out, size_t len)
{
	struct dirent **kd = NULL, **ctx = NULL, **sch = NULL, **mod = NULL;
	char path[512], val[64], ops[64], item[256];
	int nkd = scandir(DAMON_KDAMONDS, &kd, state_digit_dir, alphasort);

	out[0] = '\0';
	for (int i = 0; i < nkd; i++) {
		snprintf(path, sizeof(path), DAMON_KDAMONDS "/%.32s/state", kd[i]->d_name);
		if (mm_read_text(path, val, sizeof(val)) || strcmp(val, "on"))
			continue;
		snprintf(path, sizeof(path), DAMON_KDAMONDS "/%.32s/contexts", kd[i]->d_name);
		int nctx = scandir(path, &ctx, state_digit_dir, alphasort);
		for (int j = 0; j < nctx; j++) {
			char actions[160] = "";
			snprintf(path, sizeof(path), DAMON_KDAMONDS "/%.32s/contexts/%.32s/operations",
				 kd[i]->d_name, ctx[j]->d_name);
			if (mm_read_text(path, ops, sizeof(ops)))
				ops[0] = '\0';
			snprintf(path, sizeof(path), DAMON_KDAMONDS "/%.32s/contexts/%.32s/schemes",
				 kd[i]->d_name, ctx[j]->d_name);
			int nsch = scandir(path, &sch, state_digit_dir, alphasort);
			for (int s = 0; s < nsch; s++) {
				snprintf(path, sizeof(path),
					 DAMON_KDAMONDS "/%.32s/contexts/%.32s/schemes/%.32s/action",
					 kd[i]->d_name, ctx[j]->d_name, sch[s]->d_name);
				if (mm_read_text(path, val, sizeof(val)))
					val[0] = '\0';
				size_t used = strlen(actions);
				snprintf(actions + used, sizeof(actions) - used, "%s%s",
					 used ? ", " : "", val);
				free(sch[s]);
			}
			if (nsch > 0)
				free(sch);
			snprintf(item, sizeof(item), "kdamond %.32s (%.60s: %.150s)", kd[i]->d_name, ops,
				 actions[0] ? actions : "monitoring only");
			state_append(out, len, item);
			free(ctx[j]);
		}
		if (nctx > 0)
			free(ctx);
	}
	for (int i = 0; i < nkd; i++)
		free(kd[i]);
	if (nkd > 0)
		free(kd);

	int nmod = scandir("/sys/module", &mod, state_damon_module, alphasort);
	for (int i = 0; i < nmod; i++) {
		snprintf(path, sizeof(path), "/sys/module/%.64s/parameters/enabled", mod[i]->d_name);
		if (!mm_read_text(path, val, sizeof(val)) && !strcmp(val, "Y")) {
			snprintf(item, sizeof(item), "%.64s enabled", mod[i]->d_name);
			state_append(out, len, item);
		}
		free(mod[i]);
	}
	if (nmod > 0)
		free(mod);
	if (!out[0])
		snprintf(out, len, "off");
}

/* The kernel's own mm actors, keyed and worded as probe.mm_actors(). */
static void state_actors(struct mm_ctx *c)
{
	static const char *const khuge[] = {
		"defrag", "pages_to_scan", "scan_sleep_millisecs", "max_ptes_none", NULL,
	};
	char buf[256], val[64], path[160];
	struct stat st;

	state_damon(buf, sizeof(buf));
	mm_state_str(c, "damon", buf);
	if (stat(THP_DIR "/khugepaged", &st) || !S_ISDIR(st.st_mode)) {
		mm_state_str(c, "khugepaged", "absent");
	} else {
		buf[0] = '\0';
		for (int i = 0; khuge[i]; i++) {
			size_t used = strlen(buf);
			snprintf(path, sizeof(path), THP_DIR "/khugepaged/%s", khuge[i]);
			if (mm_read_text(path, val, sizeof(val)))
				snprintf(val, sizeof(val), "-");
			snprintf(buf + used, sizeof(buf) - used, "%s%s=%s", used ? " " : "",
				 khuge[i], val);
		}
		mm_state_str(c, "khugepaged", buf);
	}
	if (mm_read_text("/sys/kernel/mm/ksm/run", val, sizeof(val)))
		snprintf(val, sizeof(val), "absent");
	snprintf(buf, sizeof(buf), "run=%s", val);
	mm_state_str(c, "ksmd", buf);
	if (mm_read_text("/proc/sys/vm/compaction_proactiveness", val, sizeof(val)))
		snprintf(val, sizeof(val), "absent");
	mm_state_str(c, "compaction_proactiveness", val);
}

void mm_state_global(struct mm_ctx *c, const struct mm_mthp_snap *before,
		     const struct mm_mthp_snap *after)
{
	char buf[128];

	mm_read_bracketed(THP_DIR "/enabled", buf, sizeof(buf));
	mm_state_str(c, "thp_enabled", buf);
	mm_read_bracketed(THP_DIR "/defrag", buf, sizeof(buf));
	mm_state_str(c, "thp_defrag", buf);
	state_mthp(c, before, after);
	long total = mm_meminfo_kb("SwapTotal"), freekb = mm_meminfo_kb("SwapFree");
	mm_state_num(c, "swap_total_kb", (double)total);
	mm_state_num(c, "swap_used_kb", (double)(total - freekb));
	mm_state_num(c, "ksm_run", (double)mm_read_long("/sys/kernel/mm/ksm/run"));
	mm_state_num(c, "ksm_pages_sharing",
		     (double)mm_read_long("/sys/kernel/mm/ksm/pages_sharing"));
	mm_state_num(c, "mem_total_kb", (double)mm_meminfo_kb("MemTotal"));
	mm_state_num(c, "mem_free_kb", (double)mm_meminfo_kb("MemFree"));
	/* MGLRU changes what folio_mark_accessed() and reclaim do. */
	mm_state_num(c, "lru_gen_enabled",
		     (double)strtol(mm_read_text("/sys/kernel/mm/lru_gen/enabled", buf,
						 sizeof(buf)) ? "0" : buf, NULL, 0));
	state_actors(c);
}
