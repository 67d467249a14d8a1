/*
 * core-sample.c - one sample: the snapshots around it (rusage, /proc/vmstat,
 * steal time), the page state every sample carries, and the JSON line the
 * record (core-record.c) becomes.  Kept in one place so that every
 * workload's samples have the same shape.
 */
#define _GNU_SOURCE
#include "core-sample.h"
#include "core-record.h"
#include "core-args.h"
#include "core-ctx.h"
#include "core-errno.h"
#include "core-insns.h"
#include "core-json.h"
#include "core-knobs.h"
#include "core-memcg.h"
#include "core-procfs.h"
#include "core-state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifndef MMWORK_VERSION
#define MMWORK_VERSION "dev"
#endif

static void jb_kvset(struct jbuf *j, const char *key, const struct mm_kvset *s)
{
	jb_open(j, key);
	for (int i = 0; i < s->n; i++) {
		if (s->kv[i].is_str)
			jb_key_str(j, s->kv[i].name, s->kv[i].str);
		else
			jb_key_num(j, s->kv[i].name, s->kv[i].num);
	}
	jb_close(j);
}

static double tv_s(struct timeval tv) { return (double)tv.tv_sec + tv.tv_usec / 1e6; }

void mm_children_cpu_s(double *usr, double *sys)
{
	struct rusage r;
	getrusage(RUSAGE_CHILDREN, &r);
	*usr = tv_s(r.ru_utime);
	*sys = tv_s(r.ru_stime);
}

static void rusage_total(struct rusage *out)
{
	struct rusage self, kids;
	getrusage(RUSAGE_SELF, &self);
	getrusage(RUSAGE_CHILDREN, &kids);
	*out = self;
	timeradd(&self.ru_utime, &kids.ru_utime, &out->ru_utime);
	timeradd(&self.ru_stime, &kids.ru_stime, &out->ru_stime);
	out->ru_minflt += kids.ru_minflt;
	out->ru_majflt += kids.ru_majflt;
	out->ru_nvcsw += kids.ru_nvcsw;
	out->ru_nivcsw += kids.ru_nivcsw;
}

/* Where it ran: a syscall and the aux vector, no page state read. */
static void add_platform(struct mm_ctx *c)
{
	struct utsname u;
	mm_state_num(c, "page_size_kb", (double)(sysconf(_SC_PAGESIZE) / 1024));
	if (!uname(&u))
		mm_state_str(c, "kernel", u.release);
}

static void emit_sample(struct mm_ctx *c, int index, const struct rusage *r0,
			const struct rusage *r1, const struct mm_vmstat_snap *v0,
			const struct mm_vmstat_snap *v1)
{
	struct jbuf j = { 0 };
	jb_open(&j, NULL);
	jb_key_str(&j, "workload", c->wl->name);
	jb_key_num(&j, "sample", index);
	jb_key_str(&j, "mmwork_version", MMWORK_VERSION);
	jb_open(&j, "params");
	for (int i = 0; i < c->nparams; i++) {
		const struct mm_param *p = c->params[i];
		if (p->type == MM_FLAG)
			jb_key(&j, p->name), jb_puts(&j, strcmp(c->values[i], "1") ? "false" : "true");
		else if (p->type == MM_CHOICE || p->type == MM_PATH)
			jb_key_str(&j, p->name, c->values[i]);
		else if (p->type == MM_BYTES)
			jb_key_num(&j, p->name, (double)mm_arg_long(c, p->name));
		else
			jb_key_num(&j, p->name, strtod(c->values[i], NULL));
	}
	jb_close(&j);
	jb_kvset(&j, "metrics", &c->metrics);
	jb_kvset(&j, "counts", &c->counts);
	jb_open(&j, "rusage");
	jb_key_num(&j, "user_s", tv_s(r1->ru_utime) - tv_s(r0->ru_utime));
	jb_key_num(&j, "sys_s", tv_s(r1->ru_stime) - tv_s(r0->ru_stime));
	jb_key_num(&j, "minflt", (double)(r1->ru_minflt - r0->ru_minflt));
	jb_key_num(&j, "majflt", (double)(r1->ru_majflt - r0->ru_majflt));
	jb_key_num(&j, "nvcsw", (double)(r1->ru_nvcsw - r0->ru_nvcsw));
	jb_key_num(&j, "nivcsw", (double)(r1->ru_nivcsw - r0->ru_nivcsw));
	jb_close(&j);
	jb_open(&j, "vmstat_delta");
	for (int i = 0; c->wl->vmstat && c->wl->vmstat[i]; i++)
		if (v0->v[i] >= 0 && v1->v[i] >= 0)
			jb_key_num(&j, c->wl->vmstat[i], (double)(v1->v[i] - v0->v[i]));
	jb_close(&j);
	jb_kvset(&j, "state", &c->state);
	mm_errors_json(&j);
	if (c->output) {
		jb_key(&j, "output");
		jb_text(&j, c->output, c->output_len);
	}
	jb_close(&j);
	jb_puts(&j, "\n");
	fwrite(j.s, 1, j.len, stdout);
	fflush(stdout);
	free(j.s);
}

/*
 * What else ran beside the sample, from machine-wide readings around it:
 * the CPU time of everything but this process tree (a neighbour), the
 * hypervisor's steal, and the time tasks stalled on memory (PSI).  The
 * audit reads them to tell a neighbour's page-state events from the
 * trial's own (judge/audit.py).
 */
static void beside(struct mm_ctx *c, const struct mm_cpu_ticks *cpu0, long long psi0,
		   const struct rusage *r0, const struct rusage *r1, double wall_ms)
{
	const double tick_ms = 1000.0 / (double)sysconf(_SC_CLK_TCK);
	struct mm_cpu_ticks cpu1;
	long long psi1 = mm_psi_some_us("memory");
	mm_cpu_ticks(&cpu1);
	if (cpu0->steal >= 0 && cpu1.steal >= 0)
		mm_state_num(c, "steal_ms", (double)(cpu1.steal - cpu0->steal) * tick_ms);
	if (cpu0->busy >= 0 && cpu1.busy >= 0) {
		const double own_ms = 1000.0 * (tv_s(r1->ru_utime) - tv_s(r0->ru_utime) +
						tv_s(r1->ru_stime) - tv_s(r0->ru_stime));
		const double other = (double)(cpu1.busy - cpu0->busy) * tick_ms - own_ms;
		mm_state_num(c, "neighbour_cpu_ms", other > 0 ? other : 0);
		/* of all the CPU time the machine had while the sample ran */
		mm_state_num(c, "neighbour_cpu_share", other > 0 && wall_ms > 0 ?
			     other / (wall_ms * (double)sysconf(_SC_NPROCESSORS_ONLN)) : 0);
	}
	if (psi0 >= 0 && psi1 >= 0)
		mm_state_num(c, "psi_memory_some_ms", (double)(psi1 - psi0) / 1000.0);
}

/* The trial's own group's event counters (--own-memcg), as memory.stat
 * names them on cgroup v2; v1 has the fault counters alone, and a kernel
 * without one of them leaves it out. */
static const char *const own_events[] = {
	"thp_fault_alloc", "thp_swpout", "thp_swpout_fallback", "pswpout",
	"pgfault", "pgmajfault", NULL
};
#define OWN_EVENTS (sizeof(own_events) / sizeof(own_events[0]) - 1)

/* What the trial's own group counted over the sample, and holds after it:
 * memcg_<event> deltas, its anonymous THP and its swap in KiB. */
static void own_memcg(struct mm_ctx *c, const long long *e0, const long long *e1)
{
	const struct mm_memcg_own *o = mm_memcg_trial;
	const char *const sizes[] = { o->version == 1 ? "rss_huge" : "anon_thp",
				      o->version == 1 ? "swap" : NULL, NULL };
	long long v[2] = { -1, -1 };
	char name[64];
	mm_state_str(c, "memcg", o->version == 1 ? "v1 (no THP events)" : "v2");
	for (size_t i = 0; i < OWN_EVENTS; i++)
		if (e0[i] >= 0 && e1[i] >= 0) {
			snprintf(name, sizeof(name), "memcg_%s", own_events[i]);
			mm_state_num(c, name, (double)(e1[i] - e0[i]));
		}
	mm_memcg_stat(&o->g, sizes, v);
	if (o->version == 2)
		v[1] = mm_memcg_read(&o->g, "memory.swap.current");
	if (v[0] >= 0)
		mm_state_num(c, "memcg_anon_thp_kb", (double)v[0] / 1024);
	if (v[1] >= 0)
		mm_state_num(c, "memcg_swap_kb", (double)v[1] / 1024);
}

int mm_run_sample(struct mm_ctx *c, int index, int warmup)
{
	long long e0[OWN_EVENTS], e1[OWN_EVENTS];
	struct rusage r0, r1;
	struct mm_vmstat_snap v0 = { 0 }, v1 = { 0 };
	static struct mm_mthp_snap m0, m1;
	struct mm_cpu_ticks cpu0 = { -1, -1 };
	long long psi0 = -1;

	c->warmup = warmup;
	c->metrics.n = c->counts.n = c->state.n = 0;
	free(c->output);
	c->output = NULL;
	/* State probes before the workload's first timed window and after its
	 * last: reading these files must not warm what the workload times. */
	if (c->probes) {
		mm_cpu_ticks(&cpu0);
		psi0 = mm_psi_some_us("memory");
		mm_mthp_read(&m0);
		mm_vmstat_read(c->wl->vmstat, &v0);
		if (mm_memcg_trial)
			mm_memcg_stat(&mm_memcg_trial->g, own_events, e0);
	}
	const uint64_t t0 = mm_now_ns();
	rusage_total(&r0);
	mm_insns_sample_begin();
	int rc = c->wl->sample(c);
	mm_insns_sample_end(c, warmup);
	rusage_total(&r1);
	const double wall_ms = (double)(mm_now_ns() - t0) / 1e6;
	if (c->probes) {
		if (mm_memcg_trial)
			mm_memcg_stat(&mm_memcg_trial->g, own_events, e1);
		mm_vmstat_read(c->wl->vmstat, &v1);
		mm_mthp_read(&m1);
	} else {
		for (int i = 0; c->wl->vmstat && c->wl->vmstat[i]; i++)
			v0.v[i] = v1.v[i] = -1;	/* not read: no deltas */
	}
	mm_knobs_restore();
	if (rc) {
		char calls[256];
		mm_errors_text(calls, sizeof(calls));
		fprintf(stderr, "mmwork: %s: sample %d failed%s%s%s\n", c->wl->name, index,
			calls[0] ? " (failed calls: " : "", calls, calls[0] ? ")" : "");
		return rc;
	}
	if (warmup) {
		mm_errors_clear();
		return 0;
	}
	add_platform(c);
	if (c->probes) {
		mm_state_global(c, &m0, &m1);
		mm_state_num(c, "online_cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
		beside(c, &cpu0, psi0, &r0, &r1, wall_ms);
		if (mm_memcg_trial)
			own_memcg(c, e0, e1);
	}
	emit_sample(c, index, &r0, &r1, &v0, &v1);
	return 0;
}
