/*
 * core-procfs.c - reading the kernel's text files (meminfo, vmstat, smaps,
 * stat, sysfs values), so every sample and workload parses them one way.
 */
#define _GNU_SOURCE
#include "core-procfs.h"
#include "core-record.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int mm_write_text(const char *path, const char *value)
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

void mm_read_bracketed(const char *path, char *out, size_t len)
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

void mm_vmstat_read(const char *const *names, struct mm_vmstat_snap *s)
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

/* The 8th field of the "cpu" line of /proc/stat. */
void mm_cpu_ticks(struct mm_cpu_ticks *t)
{
	long f[8] = { 0 };	/* user nice system idle iowait irq softirq steal */
	FILE *fp = fopen("/proc/stat", "re");
	int n = fp ? fscanf(fp, "cpu %ld %ld %ld %ld %ld %ld %ld %ld", &f[0], &f[1], &f[2],
			    &f[3], &f[4], &f[5], &f[6], &f[7]) : 0;
	if (fp)
		fclose(fp);
	t->busy = n == 8 ? f[0] + f[1] + f[2] + f[5] + f[6] : -1;
	t->steal = n == 8 ? f[7] : -1;
}

long long mm_psi_some_us(const char *what)
{
	char path[64], line[256];
	long long total = -1;
	snprintf(path, sizeof(path), "/proc/pressure/%s", what);
	FILE *fp = fopen(path, "re");
	if (fp && fgets(line, sizeof(line), fp)) {
		const char *t = strstr(line, "total=");
		if (!strncmp(line, "some", 4) && t)
			total = atoll(t + 6);
	}
	if (fp)
		fclose(fp);
	return total;
}

int mm_smaps_range(const void *start, size_t len, struct mm_smaps *o)
{
	return mm_smaps_file("/proc/self/smaps", (uintptr_t)start, (uintptr_t)start + len, o);
}

int mm_smaps_file(const char *path, uintptr_t lo, uintptr_t hi, struct mm_smaps *o)
{
	char line[512];
	int in = 0;
	FILE *f = fopen(path, "re");
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

/* Online NUMA nodes, from a list like "0-1,3" (1 when there is no list). */
int mm_online_nodes(void)
{
	char buf[128];
	int n = 0;
	if (mm_read_text("/sys/devices/system/node/online", buf, sizeof(buf)))
		return 1;
	for (char *p = buf; *p;) {
		long a = strtol(p, &p, 10), b = a;
		if (*p == '-')
			b = strtol(p + 1, &p, 10);
		n += (int)(b - a + 1);
		if (*p != ',')
			break;
		p++;
	}
	return n > 0 ? n : 1;
}
