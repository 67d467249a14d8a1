/*
 * core-args.c - command-line arguments checked against a workload's table,
 * and the one-line error (exit 2) for arguments or setups that cannot run.
 * One place decides what a valid value is, so `mmwork --check` and a real
 * run can never disagree.
 */
#define _GNU_SOURCE
#include "core-args.h"
#include "core-ctx.h"
#include "core-procfs.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const struct mm_param mm_harness_params[] = {
	{ "samples", MM_INT, "1", "measured samples to print, one JSON line each",
	  1, 100000, NULL },
	{ "warmups", MM_INT, NULL, "unmeasured samples run first (default: per workload)",
	  0, 1000, NULL },
	{ "check", MM_FLAG, NULL, "only check the arguments, run nothing", 0, 0, NULL },
	{ "no-probes", MM_FLAG, NULL, "no state probes (smaps, pagemap, /proc and sysfs reads): "
	  "samples carry timings, counts and rusage only", 0, 0, NULL },
	{ "insns", MM_FLAG, NULL, "count the instructions of each timed window: perf counters "
	  "where the CPU has them, markers for mmlab's QEMU plugin (core-insns.h)", 0, 0, NULL },
	{ "cpu-time", MM_FLAG, NULL, "take the CPU time each timed window's own thread ran, "
	  "outside its clock reads (core-insns.h)", 0, 0, NULL },
	{ "own-memcg", MM_FLAG, NULL, "the memory cgroup this process starts in is the trial's "
	  "own (the runner made it): its memory.stat is read around each sample, beside "
	  "/proc/vmstat's whole machine (core-memcg.h)", 0, 0, NULL },
	{ NULL },
};

void mm_die(const struct mm_ctx *c, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "mmwork: %s: ", c && c->wl ? c->wl->name : "error");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static int param_index(const struct mm_ctx *c, const char *name)
{
	for (int i = 0; i < c->nparams; i++)
		if (!strcmp(c->params[i]->name, name))
			return i;
	return -1;
}

static const char *param_value(const struct mm_ctx *c, const char *name)
{
	int i = param_index(c, name);
	if (i < 0) {
		fprintf(stderr, "mmwork: internal: no parameter '%s'\n", name);
		abort();
	}
	return c->values[i];
}

static int parse_bytes(const char *s, long *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || v <= 0 || !isdigit((unsigned char)s[0]))
		return -1;
	switch (toupper((unsigned char)*end)) {
	case 'K': v *= 1024; end++; break;
	case 'M': v *= 1024 * 1024; end++; break;
	case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
	}
	if (toupper((unsigned char)*end) == 'B' || toupper((unsigned char)*end) == 'I')
		end++;
	if (*end || v > 9e18)
		return -1;
	*out = (long)v;
	return 0;
}

long mm_arg_long(const struct mm_ctx *c, const char *name)
{
	const char *v = param_value(c, name);
	const struct mm_param *p = c->params[param_index(c, name)];
	long out = 0;
	if (p->type == MM_BYTES)
		parse_bytes(v, &out);
	else if (p->type == MM_FLAG)
		out = !strcmp(v, "1");
	else
		out = strtol(v, NULL, 10);
	return out;
}

double mm_arg_double(const struct mm_ctx *c, const char *name)
{
	return strtod(param_value(c, name), NULL);
}

const char *mm_arg_str(const struct mm_ctx *c, const char *name)
{
	return param_value(c, name);
}

/* Check one value against its declaration; returns an error text or NULL. */
static const char *check_value(const struct mm_param *p, const char *v,
			       char *why, size_t whylen)
{
	char *end;
	long l;
	switch (p->type) {
	case MM_INT:
	case MM_SIZE_KB:
		errno = 0;
		l = strtol(v, &end, 10);
		if (errno || end == v || *end) {
			snprintf(why, whylen, "'%s' is not a whole number", v);
			return why;
		}
		if (l < p->min || l > p->max) {
			snprintf(why, whylen, "%ld is outside %ld..%ld", l, p->min, p->max);
			return why;
		}
		if (p->type == MM_SIZE_KB) {
			long total = mm_meminfo_kb("MemTotal");
			if (total > 0 && l >= total) {
				snprintf(why, whylen,
					 "%ld KiB is not below this machine's memory (%ld KiB)",
					 l, total);
				return why;
			}
		}
		return NULL;
	case MM_BYTES:
		if (parse_bytes(v, &l)) {
			snprintf(why, whylen, "'%s' is not a positive size (e.g. 4096, 4K, 1M)", v);
			return why;
		}
		if (l < p->min || l > p->max) {
			snprintf(why, whylen, "%ld bytes is outside %ld..%ld", l, p->min, p->max);
			return why;
		}
		return NULL;
	case MM_FLOAT: {
		errno = 0;
		double d = strtod(v, &end);
		if (errno || end == v || *end || !(d > 0) || !isfinite(d)) {
			snprintf(why, whylen, "'%s' is not a positive number", v);
			return why;
		}
		return NULL;
	}
	case MM_CHOICE:
		for (int i = 0; p->choices[i]; i++)
			if (!strcmp(p->choices[i], v))
				return NULL;
		{
			size_t off = (size_t)snprintf(why, whylen, "'%s' is not one of", v);
			for (int i = 0; p->choices[i] && off < whylen; i++)
				off += (size_t)snprintf(why + off, whylen - off, " %s", p->choices[i]);
		}
		return why;
	case MM_PATH: {
		struct stat st;
		if (stat(v, &st) || !S_ISDIR(st.st_mode)) {
			snprintf(why, whylen, "'%s' is not an existing directory", v);
			return why;
		}
		return NULL;
	}
	case MM_FLAG:
		return NULL;
	}
	return "unknown parameter type";
}

void mm_parse_args(struct mm_ctx *c, int argc, char **argv)
{
	char why[256];

	for (const struct mm_param *p = mm_harness_params; p->name; p++)
		c->params[c->nparams++] = p;
	for (const struct mm_param *p = c->wl->params; p->name; p++) {
		if (c->nparams == MM_MAX_PARAMS + 8)
			mm_die(c, "internal: too many parameters");
		c->params[c->nparams++] = p;
	}
	for (int i = 0; i < c->nparams; i++) {
		const struct mm_param *p = c->params[i];
		const char *def = p->def;
		static char wbuf[16];
		if (!strcmp(p->name, "warmups") && !def) {
			snprintf(wbuf, sizeof(wbuf), "%d", c->wl->default_warmups);
			def = wbuf;
		}
		snprintf(c->values[i], sizeof(c->values[i]), "%s",
			 p->type == MM_FLAG ? "0" : def);
	}

	for (int a = 0; a < argc; a++) {
		char name[128];
		const char *arg = argv[a], *val = NULL, *eq;
		if (!strcmp(arg, "--")) {
			if (!c->wl->takes_command)
				mm_die(c, "takes no command after '--'");
			c->command = argv + a + 1;	/* argv is NULL-terminated */
			c->ncommand = argc - a - 1;
			break;
		}
		if (strncmp(arg, "--", 2))
			mm_die(c, "unexpected argument '%s' (options look like --name value)", arg);
		eq = strchr(arg, '=');
		snprintf(name, sizeof(name), "%.*s",
			 (int)(eq ? (size_t)(eq - arg - 2) : strlen(arg + 2)), arg + 2);
		int i = param_index(c, name);
		if (i < 0)
			mm_die(c, "unknown option '--%s' (see 'mmwork %s --help')", name, c->wl->name);
		const struct mm_param *p = c->params[i];
		if (p->type == MM_FLAG) {
			if (eq)
				mm_die(c, "--%s takes no value", name);
			snprintf(c->values[i], sizeof(c->values[i]), "1");
			continue;
		}
		if (eq)
			val = eq + 1;
		else if (a + 1 < argc)
			val = argv[++a];
		else
			mm_die(c, "--%s needs a value", name);
		const char *err = check_value(p, val, why, sizeof(why));
		if (err)
			mm_die(c, "--%s: %s", name, err);
		snprintf(c->values[i], sizeof(c->values[i]), "%s", val);
	}
	if (c->wl->takes_command && c->ncommand == 0)
		mm_die(c, "needs a command after '--' (mmwork %s [options] -- CMD ARGS...)",
		       c->wl->name);
	if (c->wl->validate && c->wl->validate(c))
		exit(2);
}

char *const *mm_command(const struct mm_ctx *c)
{
	return c->command;
}
