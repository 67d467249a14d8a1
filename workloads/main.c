/*
 * main.c - mmwork's command line: the list of workloads, `mmwork describe`
 * (the table the Python registry reads), the usage and --help texts, and
 * main(), which checks the arguments and runs the warm-ups and samples.
 * Everything it calls lives in the core-*.c files; this file only decides
 * what to run.
 */
#define _GNU_SOURCE
#include "core-args.h"
#include "core-ctx.h"
#include "core-errno.h"
#include "core-insns.h"
#include "core-json.h"
#include "core-knobs.h"
#include "core-memcg.h"
#include "core-sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct mm_workload wl_pageout_refault;
extern const struct mm_workload wl_mremap_churn;
extern const struct mm_workload wl_populate_unmap;
extern const struct mm_workload wl_unmap_young;
extern const struct mm_workload wl_ksm_rmap;
extern const struct mm_workload wl_page_fault;
extern const struct mm_workload wl_mprotect;
extern const struct mm_workload wl_mremap_ops;
extern const struct mm_workload wl_munmap_zap;
extern const struct mm_workload wl_exec;
extern const struct mm_workload wl_madvise;
extern const struct mm_workload wl_mincore_mlock;
extern const struct mm_workload wl_fork_cow;
extern const struct mm_workload wl_migrate;
extern const struct mm_workload wl_uffd;
extern const struct mm_workload wl_hugetlb_fault;
extern const struct mm_workload wl_reclaim;

#ifdef MMWORK_SINGLE
/*
 * A standalone reproducer: one workload, compiled from one file, with the
 * experiment's parameters as defaults (MMWORK_DEFAULT_ARGS) that arguments
 * given on the command line override.
 */
static const struct mm_workload *const workloads[] = { &MMWORK_SINGLE, NULL };
static const char *const default_args[] = { MMWORK_DEFAULT_ARGS NULL };
#else
static const struct mm_workload *const workloads[] = {
	&wl_pageout_refault, &wl_mremap_churn, &wl_populate_unmap,
	&wl_unmap_young, &wl_ksm_rmap, &wl_page_fault, &wl_mprotect, &wl_mremap_ops,
	&wl_munmap_zap, &wl_madvise, &wl_mincore_mlock, &wl_fork_cow,
	&wl_migrate, &wl_uffd, &wl_hugetlb_fault, &wl_reclaim, &wl_exec, NULL,
};
#endif

static const char *type_name(enum mm_param_type t)
{
	static const char *const names[] = {
		[MM_INT] = "int", [MM_SIZE_KB] = "size_kb", [MM_BYTES] = "bytes",
		[MM_FLOAT] = "float", [MM_CHOICE] = "choice", [MM_FLAG] = "flag",
		[MM_PATH] = "path",
	};
	return names[t];
}

static void describe_param(struct jbuf *j, const struct mm_param *p, int warmups)
{
	char wbuf[16];
	const char *def = p->def;
	if (!def) {
		snprintf(wbuf, sizeof(wbuf), "%d", warmups);
		def = wbuf;
	}
	jb_open(j, NULL);
	jb_key_str(j, "name", p->name);
	jb_key_str(j, "type", type_name(p->type));
	jb_key_str(j, "default", p->type == MM_FLAG ? "false" : def);
	jb_key_str(j, "help", p->help);
	if (p->type != MM_CHOICE && p->type != MM_FLAG && p->type != MM_PATH &&
	    p->type != MM_FLOAT) {
		jb_key_num(j, "min", (double)p->min);
		jb_key_num(j, "max", (double)p->max);
	}
	if (p->choices)
		jb_str_array(j, "choices", p->choices);
	jb_close(j);
}

/* A window metric's entry: lower is better for all of them. */
static void describe_lower(struct jbuf *j, const char *name, const char *unit, const char *help)
{
	jb_open(j, NULL);
	jb_key_str(j, "name", name);
	jb_key_str(j, "unit", unit);
	jb_key_str(j, "direction", "lower");
	jb_key_str(j, "help", help);
	jb_close(j);
}

/* Each timed window's CPU time metric (with --cpu-time, where its own
 * thread does its work) and instruction metrics (present with --insns
 * where a source counts them), after the workload's own metrics. */
static void describe_window_metrics(struct jbuf *j, const struct mm_workload *wl)
{
	static const char *const sides[] = { "kernel", "user" };
	char name[64], help[256];
	for (const struct mm_window *w = wl->windows; w && w->name; w++) {
		if (!w->elsewhere) {
			mm_cputime_metric(name, sizeof(name), w);
			snprintf(help, sizeof(help), "CPU time its own thread ran per %s of %s (the "
				 "mean window; with --cpu-time)", w->unit, w->help);
			describe_lower(j, name, "ns", help);
		}
		for (int s = 0; s < 2; s++) {
			mm_insns_metric(name, sizeof(name), w, sides[s]);
			snprintf(help, sizeof(help), "%s instructions per %s of %s (the mean window; "
				 "with instruction counting)", sides[s], w->unit, w->help);
			describe_lower(j, name, "insns", help);
		}
	}
}

/* The windows in id order, for mmlab to read a QEMU plugin's counts by. */
static void describe_windows(struct jbuf *j, const struct mm_workload *wl)
{
	jb_key(j, "windows");
	jb_raw(j, "[", 1);
	j->need_comma = 0;
	for (const struct mm_window *w = wl->windows; w && w->name; w++) {
		char name[64];
		jb_open(j, NULL);
		jb_key_str(j, "name", w->name);
		jb_key_str(j, "unit", w->unit);
		jb_key_str(j, "help", w->help);
		mm_insns_metric(name, sizeof(name), w, "kernel");
		jb_key_str(j, "kernel_metric", name);
		mm_insns_metric(name, sizeof(name), w, "user");
		jb_key_str(j, "user_metric", name);
		mm_cputime_metric(name, sizeof(name), w);
		jb_key_str(j, "cpu_metric", w->elsewhere ? "" : name);
		jb_close(j);
	}
	jb_raw(j, "]", 1);
	j->need_comma = 1;
}

static void describe(void)
{
	struct jbuf j = { 0 };
	jb_raw(&j, "[", 1);
	for (int w = 0; workloads[w]; w++) {
		const struct mm_workload *wl = workloads[w];
		jb_open(&j, NULL);
		jb_key_str(&j, "name", wl->name);
		jb_key_str(&j, "seed", wl->seed);
		jb_key_str(&j, "summary", wl->summary);
		jb_key(&j, "params");
		jb_raw(&j, "[", 1);
		j.need_comma = 0;
		for (const struct mm_param *p = mm_harness_params; p->name; p++)
			describe_param(&j, p, wl->default_warmups);
		for (const struct mm_param *p = wl->params; p->name; p++)
			describe_param(&j, p, wl->default_warmups);
		jb_raw(&j, "]", 1);
		j.need_comma = 1;
		jb_key(&j, "metrics");
		jb_raw(&j, "[", 1);
		j.need_comma = 0;
		for (const struct mm_metric *m = wl->metrics; m->name; m++) {
			jb_open(&j, NULL);
			jb_key_str(&j, "name", m->name);
			jb_key_str(&j, "unit", m->unit);
			jb_key_str(&j, "direction", m->higher_is_better ? "higher" : "lower");
			jb_key_str(&j, "help", m->help);
			jb_close(&j);
		}
		describe_window_metrics(&j, wl);
		jb_raw(&j, "]", 1);
		j.need_comma = 1;
		describe_windows(&j, wl);
		jb_str_array(&j, "mm_paths", wl->mm_paths);
		jb_str_array(&j, "vmstat", wl->vmstat);
		jb_str_array(&j, "tracepoints", wl->tracepoints);
		jb_str_array(&j, "host_settings", wl->host_settings);
		if (wl->scratch_disk)
			jb_key(&j, "scratch_disk"), jb_puts(&j, "true");
		if (wl->takes_command)
			jb_key(&j, "takes_command"), jb_puts(&j, "true");
		jb_close(&j);
	}
	jb_puts(&j, "]\n");
	fputs(j.s, stdout);
	free(j.s);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: mmwork WORKLOAD [--option value ...]\n"
		   "       mmwork exec [--option value ...] -- CMD ARGS...\n"
		   "       mmwork describe      (the workload table as JSON)\n"
		   "       mmwork WORKLOAD --help\nworkloads:");
	for (int w = 0; workloads[w]; w++)
		fprintf(f, " %s", workloads[w]->name);
	fputc('\n', f);
}

static void workload_help(const struct mm_workload *wl)
{
	printf("mmwork %s: %s\nreproduces: %s\noptions:\n", wl->name, wl->summary, wl->seed);
	for (int pass = 0; pass < 2; pass++)
		for (const struct mm_param *p = pass ? wl->params : mm_harness_params; p->name; p++)
			printf("  --%-16s %s (default %s)\n", p->name, p->help,
			       p->type == MM_FLAG ? "off" : p->def ? p->def : "per workload");
	printf("metrics:\n");
	for (const struct mm_metric *m = wl->metrics; m->name; m++)
		printf("  %-24s %s, %s is better\n", m->name, m->help,
		       m->higher_is_better ? "higher" : "lower");
}

#ifdef MMWORK_SINGLE
/* argv with the workload name and the default arguments put in front. */
static char **single_argv(int *argc, char **argv)
{
	int n = 0;
	while (default_args[n])
		n++;
	char **out = calloc((size_t)(*argc + n + 2), sizeof(*out));
	out[0] = argv[0];
	out[1] = (char *)workloads[0]->name;
	for (int i = 0; i < n; i++)
		out[2 + i] = (char *)default_args[i];
	for (int i = 1; i < *argc; i++)
		out[1 + n + i] = argv[i];
	*argc += n + 1;
	return out;
}
#endif

int main(int argc, char **argv)
{
	static struct mm_ctx ctx;
	const struct mm_workload *wl = NULL;

#ifdef MMWORK_SINGLE
	argv = single_argv(&argc, argv);
#endif
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "describe")) {
		describe();
		return 0;
	}
	for (int w = 0; workloads[w]; w++)
		if (!strcmp(workloads[w]->name, argv[1]))
			wl = workloads[w];
	if (!wl) {
		fprintf(stderr, "mmwork: unknown workload '%s' (known:", argv[1]);
		for (int w = 0; workloads[w]; w++)
			fprintf(stderr, " %s", workloads[w]->name);
		fprintf(stderr, ")\n");
		return 2;
	}
	for (int a = 2; a < argc; a++)
		if (!strcmp(argv[a], "--help")) {
			workload_help(wl);
			return 0;
		}
	ctx.wl = wl;
	mm_parse_args(&ctx, argc - 2, argv + 2);
	if (mm_arg_long(&ctx, "check"))
		return 0;
	ctx.probes = !mm_arg_long(&ctx, "no-probes");
	static struct mm_memcg_own own;
	if (mm_arg_long(&ctx, "own-memcg")) {
		char why[512];
		if (mm_memcg_own_find(&own, why, sizeof(why)))
			mm_die(&ctx, "%s", why);
		mm_memcg_trial = &own;
	}
	mm_insns_init((int)mm_arg_long(&ctx, "insns"), (int)mm_arg_long(&ctx, "cpu-time"));
	mm_errors_init();
	mm_knobs_restore_on_exit();

	long warmups = mm_arg_long(&ctx, "warmups"), samples = mm_arg_long(&ctx, "samples");
	for (long i = 0; i < warmups; i++)
		if (mm_run_sample(&ctx, (int)i, 1))
			return 1;
	for (long i = 0; i < samples; i++)
		if (mm_run_sample(&ctx, (int)i, 0))
			return 1;
	return 0;
}
