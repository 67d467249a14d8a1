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
 *
 * `mmcensus --hold FILE -- COMMAND...` runs COMMAND so that no census can miss
 * it, however short it is and however busy the machine: COMMAND is traced
 * (PTRACE_O_TRACEEXIT) and stopped on its way out, while its mm is still
 * whole, and one census of every process is written to FILE then, after a
 * first line "pid N" naming COMMAND's process.  mmcensus exits as COMMAND
 * did (128 + the signal that killed it).  Exit 6: COMMAND cannot be traced
 * (kernel.yama.ptrace_scope 3) or started.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
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
static FILE *out;		/* where the records go: stdout, or --hold's FILE */

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
	fprintf(out, "%u %u %u %llx %llx %llx %llx %u %llx %llx %.16s\n", r->tgid, r->tid, r->ppid,
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

/* One census of every process, to `out`. */
static int census(void)
{
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
	return rc ?: (fflush(out) ? 1 : 0);
}

/* The child's side of --hold: be traced, stop until the tracer is ready, run. */
static void traced_exec(char **argv)
{
	if (ptrace(PTRACE_TRACEME, 0, NULL, NULL)) {
		fail(6, "cannot be traced (kernel.yama.ptrace_scope)", errno);
		_exit(6);
	}
	raise(SIGSTOP);
	execvp(argv[0], argv);
	fprintf(stderr, "mmcensus: %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

static int stopping(int sig)
{
	return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

/* Follow the traced command until it exits, taking the census at its exit
 * stop; other stops pass their signal on.  Returns the command's status as
 * a shell would (its exit code, or 128 + the signal that killed it). */
static int follow(pid_t pid)
{
	for (;;) {
		int st;
		if (waitpid(pid, &st, __WALL) < 0) {
			if (errno == EINTR)
				continue;
			return fail(6, "waiting for the command", errno);
		}
		if (WIFEXITED(st))
			return WEXITSTATUS(st);
		if (WIFSIGNALED(st))
			return 128 + WTERMSIG(st);
		int sig = WSTOPSIG(st);
		if (st >> 8 == (SIGTRAP | (PTRACE_EVENT_EXIT << 8))) {
			if (census())
				fprintf(stderr, "mmcensus: the census at the command's exit failed\n");
			fclose(out);
			sig = 0;
		} else if (st >> 8 == (SIGTRAP | (PTRACE_EVENT_EXEC << 8)) || stopping(sig)) {
			/* An exec (chroot runs the command), or a job-control stop:
			 * a stop passed on to a tracee started with TRACEME comes
			 * back to the tracer as another stop, so it is not. */
			sig = 0;
		}
		ptrace(PTRACE_CONT, pid, NULL, (void *)(long)sig);
	}
}

static int hold(const char *file, char **argv)
{
	out = fopen(file, "w");
	if (!out)
		return fail(6, file, errno);
	pid_t pid = fork();
	if (pid < 0)
		return fail(6, "fork", errno);
	if (pid == 0)
		traced_exec(argv);
	int st;
	if (waitpid(pid, &st, __WALL) < 0 || !WIFSTOPPED(st))
		return WIFEXITED(st) ? WEXITSTATUS(st) : fail(6, "starting the command", ECHILD);
	/* EXITKILL: if mmcensus is killed, the command dies with it. */
	if (ptrace(PTRACE_SETOPTIONS, pid, NULL,
		   (void *)(long)(PTRACE_O_TRACEEXIT | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL)))
		return fail(6, "tracing the command", errno);
	fprintf(out, "pid %d\n", pid);
	fflush(out);
	ptrace(PTRACE_CONT, pid, NULL, NULL);
	return follow(pid);
}

static int usage(void)
{
	fprintf(stderr, "usage: mmcensus [-v]  (-v: libbpf's own messages)\n"
		"       mmcensus [-v] --hold FILE -- COMMAND [ARG...]\n");
	return 2;
}

int main(int argc, char **argv)
{
	out = stdout;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-v"))
			verbose = 1;
		else if (!strcmp(argv[i], "--hold") && i + 3 < argc && !strcmp(argv[i + 2], "--"))
			return hold(argv[i + 1], argv + i + 3);
		else
			return usage();
	}
	return census();
}
