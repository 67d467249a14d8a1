/*
 * mmcensus - print one line per VMA of every process from the BPF task_vma
 * iterator in census.bpf.c (embedded below), for mmlab's census
 * (src/mmlab/census) to group by anon_vma and root anon_vma.  One pass over
 * every process costs about as much as reading every /proc/PID/maps.
 *
 * Static like mmwork, so that it travels into a guest's initramfs as it is.
 * Each line: tgid tid ppid start end vm_flags pgoff file anon_vma root comm,
 * the numbers in hex except the ids.  Exit 3: the kernel has no BTF; 4: not
 * permitted (needs root: CAP_BPF and CAP_PERFMON); 5: the kernel refused the
 * iterator (older than 5.12, or built without BPF syscall support).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "census.h"

#define BTF_PATH "/sys/kernel/btf/vmlinux"

/* The compiled census.bpf.c, linked in so that one file is the whole tool. */
asm(".pushsection .rodata\n"
    ".global census_obj\ncensus_obj:\n.incbin \"" CENSUS_OBJ "\"\n"
    ".global census_obj_end\ncensus_obj_end:\n"
    ".popsection\n");
extern const char census_obj[], census_obj_end[];

static int verbose;

static int print_libbpf(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	return verbose || level == LIBBPF_WARN ? vfprintf(stderr, fmt, ap) : 0;
}

static int fail(int code, const char *what, int err)
{
	fprintf(stderr, "mmcensus: %s: %s\n", what, strerror(err));
	return code;
}

static int refused(const char *what, int err)
{
	if (err == EPERM || err == EACCES)
		return fail(4, "not permitted (run as root: the iterator needs CAP_BPF and "
			    "CAP_PERFMON)", err);
	return fail(5, what, err);
}

static void print_record(const struct census_vma *r)
{
	printf("%u %u %u %llx %llx %llx %llx %u %llx %llx %.16s\n", r->tgid, r->tid, r->ppid,
	       (unsigned long long)r->start, (unsigned long long)r->end,
	       (unsigned long long)r->flags, (unsigned long long)r->pgoff, r->file,
	       (unsigned long long)r->anon_vma, (unsigned long long)r->root, r->comm);
}

/* Read the iterator's records to the end; a record never straddles reads
 * (bpf_seq_write writes it whole or not at all), but be safe anyway. */
static int drain(int fd)
{
	static char buf[1 << 16];
	size_t have = 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return fail(5, "reading the iterator", errno);
		if (n == 0)
			return 0;
		have += (size_t)n;
		size_t off = 0;
		for (; have - off >= sizeof(struct census_vma); off += sizeof(struct census_vma))
			print_record((const struct census_vma *)(buf + off));
		memmove(buf, buf + off, have - off);
		have -= off;
	}
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-v")) {
			fprintf(stderr, "usage: mmcensus [-v]  (-v: libbpf's own messages)\n");
			return 2;
		}
		verbose = 1;
	}
	if (access(BTF_PATH, R_OK))
		return fail(3, "this kernel has no BTF (" BTF_PATH ", CONFIG_DEBUG_INFO_BTF): "
			    "its VMAs' anon_vmas cannot be read", errno);
	libbpf_set_print(print_libbpf);
	struct bpf_object *obj = bpf_object__open_mem(census_obj,
						      (size_t)(census_obj_end - census_obj), NULL);
	if (!obj)
		return fail(5, "opening the embedded iterator", errno);
	if (bpf_object__load(obj))
		return refused("loading the task_vma iterator", errno);
	struct bpf_program *prog = bpf_object__find_program_by_name(obj, "census");
	struct bpf_link *link = bpf_program__attach_iter(prog, NULL);
	if (!link)
		return refused("attaching the task_vma iterator", errno);
	int fd = bpf_iter_create(bpf_link__fd(link));
	if (fd < 0)
		return refused("starting the task_vma iterator", errno);
	int rc = drain(fd);
	close(fd);
	bpf_link__destroy(link);
	bpf_object__close(obj);
	return rc ?: (fflush(stdout) ? 1 : 0);
}
