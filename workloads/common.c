/*
 * common.c - argument parsing, sampling loop, state snapshots, JSON output
 * and global-setting restore shared by every mmwork workload.
 */
#define _GNU_SOURCE
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MMWORK_VERSION
#define MMWORK_VERSION "dev"
#endif

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
	&wl_unmap_young, &wl_ksm_rmap, NULL,
};
#endif

/* Options every workload takes, before its own. */
static const struct mm_param harness_params[] = {
	{ "samples", MM_INT, "1", "measured samples to print, one JSON line each",
	  1, 100000, NULL },
	{ "warmups", MM_INT, NULL, "unmeasured samples run first (default: per workload)",
	  0, 1000, NULL },
	{ "check", MM_FLAG, NULL, "only check the arguments, run nothing", 0, 0, NULL },
	{ NULL },
};

/* ---------------------------------------------------------------- JSON */

struct jbuf {
	char *s;
	size_t len, cap;
	int need_comma;
};

static void jb_raw(struct jbuf *j, const char *s, size_t n)
{
	if (j->len + n + 1 > j->cap) {
		j->cap = (j->len + n + 1) * 2;
		j->s = realloc(j->s, j->cap);
		if (!j->s) {
			perror("mmwork: realloc");
			exit(1);
		}
	}
	memcpy(j->s + j->len, s, n);
	j->len += n;
	j->s[j->len] = '\0';
}

static void jb_puts(struct jbuf *j, const char *s) { jb_raw(j, s, strlen(s)); }

static void jb_str(struct jbuf *j, const char *s)
{
	jb_raw(j, "\"", 1);
	for (; *s; s++) {
		char esc[8];
		if (*s == '"' || *s == '\\') {
			esc[0] = '\\'; esc[1] = *s;
			jb_raw(j, esc, 2);
		} else if ((unsigned char)*s < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", *s);
			jb_puts(j, esc);
		} else {
			jb_raw(j, s, 1);
		}
	}
	jb_raw(j, "\"", 1);
}

static void jb_key(struct jbuf *j, const char *key)
{
	if (j->need_comma)
		jb_raw(j, ",", 1);
	jb_str(j, key);
	jb_raw(j, ":", 1);
	j->need_comma = 1;
}

static void jb_num(struct jbuf *j, double v)
{
	char tmp[64];
	if (!isfinite(v))
		jb_puts(j, "null");	/* JSON has no NaN; a missing value reads as null */
	else if (v == (double)(long long)v && fabs(v) < 9e15)
		snprintf(tmp, sizeof(tmp), "%lld", (long long)v), jb_puts(j, tmp);
	else
		snprintf(tmp, sizeof(tmp), "%.6g", v), jb_puts(j, tmp);
}

static void jb_open(struct jbuf *j, const char *key)
{
	if (key)
		jb_key(j, key);
	else if (j->need_comma)
		jb_raw(j, ",", 1);
	jb_raw(j, "{", 1);
	j->need_comma = 0;
}

static void jb_close(struct jbuf *j)
{
	jb_raw(j, "}", 1);
	j->need_comma = 1;
}

static void jb_key_num(struct jbuf *j, const char *k, double v) { jb_key(j, k); jb_num(j, v); }
static void jb_key_str(struct jbuf *j, const char *k, const char *v) { jb_key(j, k); jb_str(j, v); }

static void jb_str_array(struct jbuf *j, const char *key, const char *const *v)
{
	jb_key(j, key);
	jb_raw(j, "[", 1);
	for (int i = 0; v && v[i]; i++) {
		if (i)
			jb_raw(j, ",", 1);
		jb_str(j, v[i]);
	}
	jb_raw(j, "]", 1);
}

/* ---------------------------------------------------------------- context */

#define MM_MAX_ENTRIES 96

struct mm_kv {
	char name[64];
	double num;
	char str[128];
	int is_str;
};

struct mm_kvset {
	struct mm_kv kv[MM_MAX_ENTRIES];
	int n;
};

struct mm_ctx {
	const struct mm_workload *wl;
	const struct mm_param *params[MM_MAX_PARAMS + 4];
	char values[MM_MAX_PARAMS + 4][256];
	int nparams;
	int warmup;
	struct mm_kvset metrics, counts, state;
};

static struct mm_kv *kv_slot(struct mm_kvset *set, const char *name)
{
	for (int i = 0; i < set->n; i++)
		if (!strcmp(set->kv[i].name, name))
			return &set->kv[i];
	if (set->n == MM_MAX_ENTRIES) {
		fprintf(stderr, "mmwork: too many entries, dropping '%s'\n", name);
		return NULL;
	}
	struct mm_kv *kv = &set->kv[set->n++];
	snprintf(kv->name, sizeof(kv->name), "%s", name);
	return kv;
}

void mm_metric(struct mm_ctx *c, const char *n, double v)
{
	struct mm_kv *kv = kv_slot(&c->metrics, n);
	if (kv) kv->num = v, kv->is_str = 0;
}

void mm_count(struct mm_ctx *c, const char *n, double v)
{
	struct mm_kv *kv = kv_slot(&c->counts, n);
	if (kv) kv->num = v, kv->is_str = 0;
}

void mm_state_num(struct mm_ctx *c, const char *n, double v)
{
	struct mm_kv *kv = kv_slot(&c->state, n);
	if (kv) kv->num = v, kv->is_str = 0;
}

void mm_state_str(struct mm_ctx *c, const char *n, const char *v)
{
	struct mm_kv *kv = kv_slot(&c->state, n);
	if (kv) {
		snprintf(kv->str, sizeof(kv->str), "%s", v);
		kv->is_str = 1;
	}
}

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

int mm_is_warmup(const struct mm_ctx *c) { return c->warmup; }

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

static void parse_args(struct mm_ctx *c, int argc, char **argv)
{
	char why[256];

	for (const struct mm_param *p = harness_params; p->name; p++)
		c->params[c->nparams++] = p;
	for (const struct mm_param *p = c->wl->params; p->name; p++) {
		if (c->nparams == MM_MAX_PARAMS + 4)
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
	if (c->wl->validate && c->wl->validate(c))
		exit(2);
}

/* ---------------------------------------------------------------- procfs */

int mm_read_text(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return 0;
}

long mm_read_long(const char *path)
{
	char buf[64];
	if (mm_read_text(path, buf, sizeof(buf)))
		return -1;
	return strtol(buf, NULL, 10);
}

long mm_meminfo_kb(const char *key)
{
	char line[256];
	size_t klen = strlen(key);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			v = strtol(line + klen + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* The bracketed word of a sysfs mode file such as THP's "always [madvise] never". */
static void read_bracketed(const char *path, char *out, size_t len)
{
	char buf[256], *l, *r;
	snprintf(out, len, "unavailable");
	if (mm_read_text(path, buf, sizeof(buf)))
		return;
	l = strchr(buf, '[');
	r = l ? strchr(l, ']') : NULL;
	if (l && r)
		snprintf(out, len, "%.*s", (int)(r - l - 1), l + 1);
}

struct vmstat_snap {
	long v[64];
};

static void vmstat_read(const char *const *names, struct vmstat_snap *s)
{
	char line[256];
	FILE *f = fopen("/proc/vmstat", "re");
	for (int i = 0; names && names[i]; i++)
		s->v[i] = -1;	/* absent on this kernel */
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *sp = strchr(line, ' ');
		if (!sp)
			continue;
		*sp = '\0';
		for (int i = 0; names && names[i]; i++)
			if (!strcmp(line, names[i]))
				s->v[i] = strtol(sp + 1, NULL, 10);
	}
	fclose(f);
}

int mm_smaps_range(const void *start, size_t len, struct mm_smaps *o)
{
	uintptr_t lo = (uintptr_t)start, hi = lo + len;
	char line[512];
	int in = 0;
	FILE *f = fopen("/proc/self/smaps", "re");
	memset(o, 0, sizeof(*o));
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b;
		char key[64];
		long val;
		if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = a < hi && b > lo;
			o->vmas += in;
			continue;
		}
		if (!in || sscanf(line, "%63[^:]: %ld", key, &val) != 2)
			continue;
		if (!strcmp(key, "Rss")) o->rss_kb += val;
		else if (!strcmp(key, "Anonymous")) o->anon_kb += val;
		else if (!strcmp(key, "AnonHugePages")) o->anon_huge_kb += val;
		else if (!strcmp(key, "Swap")) o->swap_kb += val;
		else if (!strcmp(key, "FilePmdMapped")) o->file_pmd_kb += val;
		else if (!strcmp(key, "ShmemPmdMapped")) o->shmem_pmd_kb += val;
		else if (!strcmp(key, "KernelPageSize") && val > o->kernel_page_kb)
			o->kernel_page_kb = val;
	}
	fclose(f);
	return 0;
}

void mm_state_smaps(struct mm_ctx *c, const char *prefix, const struct mm_smaps *s)
{
	char k[96];
#define PUT(field) \
	snprintf(k, sizeof(k), "%s" #field, prefix), mm_state_num(c, k, (double)s->field)
	PUT(vmas); PUT(rss_kb); PUT(anon_kb); PUT(anon_huge_kb); PUT(swap_kb);
	PUT(file_pmd_kb); PUT(shmem_pmd_kb); PUT(kernel_page_kb);
#undef PUT
}

/* The page state every sample carries, whatever the workload. */
static void add_global_state(struct mm_ctx *c)
{
	char buf[128];
	struct utsname u;

	read_bracketed("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof(buf));
	mm_state_str(c, "thp_enabled", buf);
	read_bracketed("/sys/kernel/mm/transparent_hugepage/defrag", buf, sizeof(buf));
	mm_state_str(c, "thp_defrag", buf);
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
	mm_state_num(c, "page_size_kb", (double)(sysconf(_SC_PAGESIZE) / 1024));
	mm_state_num(c, "online_cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
	if (!uname(&u))
		mm_state_str(c, "kernel", u.release);
}

/* ---------------------------------------------------------------- errors */

struct mm_err_entry {
	char call[24];
	int err;
	long count;
};

struct mm_err_table {
	pthread_mutex_t lock;
	int n;
	struct mm_err_entry e[32];
};

static struct mm_err_table *errtab;

void mm_error(const char *call, int err)
{
	pthread_mutex_lock(&errtab->lock);
	int i;
	for (i = 0; i < errtab->n; i++)
		if (errtab->e[i].err == err && !strcmp(errtab->e[i].call, call))
			break;
	if (i == errtab->n && errtab->n < 32) {
		snprintf(errtab->e[i].call, sizeof(errtab->e[i].call), "%s", call);
		errtab->e[i].err = err;
		errtab->n++;
	}
	if (i < 32)
		errtab->e[i].count++;
	pthread_mutex_unlock(&errtab->lock);
}

static void errtab_init(void)
{
	pthread_mutexattr_t a;
	errtab = mm_shared_alloc(sizeof(*errtab));
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutex_init(&errtab->lock, &a);
}

static void jb_errors(struct jbuf *j)
{
	jb_open(j, "errors");
	for (int i = 0; i < errtab->n; i++) {
		char k[64];
		const char *name = strerrorname_np(errtab->e[i].err);
		snprintf(k, sizeof(k), "%s:%s", errtab->e[i].call, name ? name : "E?");
		jb_key_num(j, k, (double)errtab->e[i].count);
	}
	jb_close(j);
	errtab->n = 0;
}

/* ---------------------------------------------------------------- knobs */

#define MM_MAX_KNOBS 16

static struct {
	char path[128];
	char old[128];
} knobs[MM_MAX_KNOBS];
static int nknobs;
static pid_t knob_owner;

static int write_text(const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, value, strlen(value));
	int saved = errno;
	close(fd);
	errno = saved;
	return n == (ssize_t)strlen(value) ? 0 : -1;
}

int mm_knob_set(const char *path, const char *value)
{
	int i;
	for (i = 0; i < nknobs; i++)
		if (!strcmp(knobs[i].path, path))
			break;
	if (i == nknobs) {
		char old[128];
		if (nknobs == MM_MAX_KNOBS || mm_read_text(path, old, sizeof(old)))
			return -1;
		/* THP-style mode files read back as "a [b] c": keep the bracketed word. */
		if (strchr(old, '['))
			read_bracketed(path, old, sizeof(old));
		snprintf(knobs[i].old, sizeof(knobs[i].old), "%s", old);
		snprintf(knobs[i].path, sizeof(knobs[i].path), "%s", path);
		knob_owner = getpid();
		nknobs++;
	}
	return write_text(path, value);
}

/* Async-signal-safe: open/write/close only. Last set, first restored. */
void mm_knobs_restore(void)
{
	if (getpid() != knob_owner)
		return;
	for (int i = nknobs - 1; i >= 0; i--)
		write_text(knobs[i].path, knobs[i].old);
	nknobs = 0;
}

static void on_signal(int sig)
{
	mm_knobs_restore();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* ---------------------------------------------------------------- helpers */

void mm_rounds_add(struct mm_rounds *r, uint64_t ns)
{
	if (r->n == r->cap) {
		r->cap = r->cap ? r->cap * 2 : 64;
		r->ns = realloc(r->ns, (size_t)r->cap * sizeof(*r->ns));
		if (!r->ns) {
			perror("mmwork: realloc");
			exit(1);
		}
	}
	r->ns[r->n++] = ns;
}

static int cmp_ns(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

double mm_rounds_median(const struct mm_rounds *r)
{
	if (!r->n)
		return NAN;
	qsort(r->ns, (size_t)r->n, sizeof(*r->ns), cmp_ns);
	return r->n % 2 ? (double)r->ns[r->n / 2]
			: ((double)r->ns[r->n / 2 - 1] + (double)r->ns[r->n / 2]) / 2;
}

void mm_rounds_free(struct mm_rounds *r)
{
	free(r->ns);
	*r = (struct mm_rounds){ 0 };
}

uint64_t mm_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int mm_deadline_passed(uint64_t start_ns, double seconds)
{
	return (double)(mm_now_ns() - start_ns) >= seconds * 1e9;
}

void *mm_map_aligned(size_t len, size_t align)
{
	char *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		mm_error("mmap", errno);
		return NULL;
	}
	uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	size_t head = start - (uintptr_t)p, tail = align - head;
	if (head)
		munmap(p, head);
	if (tail)
		munmap((char *)start + len, tail);
	return (void *)start;
}

void mm_touch_write(char *p, size_t len, unsigned char value)
{
	for (size_t off = 0; off < len; off += MM_PAGE_SIZE)
		((volatile char *)p)[off] = (char)value;
}

uint64_t mm_touch_read(const char *p, size_t len)
{
	uint64_t sum = 0;
	for (size_t off = 0; off < len; off += MM_PAGE_SIZE)
		sum += (unsigned char)((const volatile char *)p)[off];
	return sum;
}

void *mm_shared_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmwork: mmap shared");
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

int mm_run_workers(struct mm_ctx *c, int n, int (*fn)(struct mm_ctx *, int),
		   uint64_t *real_ns)
{
	int go[2], failed = 0;
	pid_t *pids = calloc((size_t)n, sizeof(*pids));
	if (!pids || pipe(go))
		mm_die(c, "cannot set up %d workers: %s", n, strerror(errno));
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			mm_error("fork", errno);
			n = i;
			failed = 1;
			break;
		}
		if (pids[i] == 0) {
			char b;
			close(go[1]);
			/* Wait for the release: every worker starts on the same edge. */
			if (read(go[0], &b, 1) < 0)
				_exit(1);
			_exit(fn(c, i) ? 1 : 0);
		}
	}
	close(go[0]);
	uint64_t t0 = mm_now_ns();
	close(go[1]);	/* EOF releases every worker at once */
	for (int i = 0; i < n; i++) {
		int st;
		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			failed = 1;
	}
	*real_ns = mm_now_ns() - t0;
	free(pids);
	return failed ? -1 : 0;
}

/* ---------------------------------------------------------------- sampling */

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

static void emit_sample(struct mm_ctx *c, int index, const struct rusage *r0,
			const struct rusage *r1, const struct vmstat_snap *v0,
			const struct vmstat_snap *v1)
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
	jb_errors(&j);
	jb_close(&j);
	jb_puts(&j, "\n");
	fwrite(j.s, 1, j.len, stdout);
	fflush(stdout);
	free(j.s);
}

/* Time the hypervisor ran something else on our CPUs (the 8th field of the
 * "cpu" line of /proc/stat), in USER_HZ ticks; -1 when not reported. */
static long steal_ticks(void)
{
	long f[8] = { 0 };
	FILE *fp = fopen("/proc/stat", "re");
	if (!fp)
		return -1;
	int n = fscanf(fp, "cpu %ld %ld %ld %ld %ld %ld %ld %ld", &f[0], &f[1], &f[2], &f[3],
		       &f[4], &f[5], &f[6], &f[7]);
	fclose(fp);
	return n == 8 ? f[7] : -1;
}

static int run_one(struct mm_ctx *c, int index, int warmup)
{
	struct rusage r0, r1;
	struct vmstat_snap v0, v1;
	long steal0 = steal_ticks();

	c->warmup = warmup;
	c->metrics.n = c->counts.n = c->state.n = 0;
	vmstat_read(c->wl->vmstat, &v0);
	rusage_total(&r0);
	int rc = c->wl->sample(c);
	rusage_total(&r1);
	vmstat_read(c->wl->vmstat, &v1);
	mm_knobs_restore();
	if (rc) {
		fprintf(stderr, "mmwork: %s: sample %d failed\n", c->wl->name, index);
		return rc;
	}
	if (warmup) {
		errtab->n = 0;
		return 0;
	}
	add_global_state(c);
	long steal1 = steal_ticks();
	if (steal0 >= 0 && steal1 >= 0)
		mm_state_num(c, "steal_ms", (double)(steal1 - steal0) * 1000.0 /
					    (double)sysconf(_SC_CLK_TCK));
	emit_sample(c, index, &r0, &r1, &v0, &v1);
	return 0;
}

/* ---------------------------------------------------------------- describe */

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
		for (const struct mm_param *p = harness_params; p->name; p++)
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
		jb_raw(&j, "]", 1);
		j.need_comma = 1;
		jb_str_array(&j, "mm_paths", wl->mm_paths);
		jb_str_array(&j, "vmstat", wl->vmstat);
		jb_str_array(&j, "tracepoints", wl->tracepoints);
		jb_str_array(&j, "host_settings", wl->host_settings);
		jb_close(&j);
	}
	jb_puts(&j, "]\n");
	fputs(j.s, stdout);
	free(j.s);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: mmwork WORKLOAD [--option value ...]\n"
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
		for (const struct mm_param *p = pass ? wl->params : harness_params; p->name; p++)
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
	parse_args(&ctx, argc - 2, argv + 2);
	if (mm_arg_long(&ctx, "check"))
		return 0;
	errtab_init();

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	atexit(mm_knobs_restore);

	long warmups = mm_arg_long(&ctx, "warmups"), samples = mm_arg_long(&ctx, "samples");
	for (long i = 0; i < warmups; i++)
		if (run_one(&ctx, (int)i, 1))
			return 1;
	for (long i = 0; i < samples; i++)
		if (run_one(&ctx, (int)i, 0))
			return 1;
	return 0;
}
