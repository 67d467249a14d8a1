/*
 * exec.c - any command as a workload (mmlab's `workload = "exec"`).
 *
 * mmwork starts the command after "--" as its child and measures only from
 * outside: the harness's rusage of the whole process tree, /proc/vmstat
 * deltas and global page state (THP, swap, KSM) around it; here its wall
 * time and peak RSS and, with --smaps, the smaps of its mappings at its exit.
 * Nothing is read while it runs: mmwork sleeps in wait4() from fork to exit,
 * so the command's own timings have no observer beside them.  The smaps read
 * happens at a ptrace exit stop, after the command's last instruction and
 * before its memory is torn down.
 *
 * The command's own figures come back in the sample's "output": its stdout,
 * or the file an argument names as "{out}" (replaced by a fresh temporary
 * file, e.g. `stress-ng ... -Y {out}`).  mmlab parses them
 * (src/mmlab/execwork.py), so an output format is a Python matter.
 *
 * The command runs in a process group of its own (a timeout kills all of it),
 * with stdin from /dev/null, and dies with mmwork (PR_SET_PDEATHSIG).
 *
 * With --insns the command's instructions are counted, from its exec to its
 * exit, as window 0 ("command") over every CPU:
 * - a marker over every vCPU (core-insns.h) just before the exec and one
 *   after wait4() returns: mmlab's QEMU plugin counts everything the
 *   guest's vCPUs execute between the two (the command, every process it
 *   starts, and what the guest's kernel does meanwhile: interrupts,
 *   kworkers; mmwork itself sleeps in wait4);
 * - perf: instructions counters (kernel, user) on the command, opened
 *   before its exec with enable_on_exec and inherit, so that every process
 *   and thread it starts adds to them; read after it is reaped.
 * The program's own windows (mmlab.h's MMLAB_BEGIN/END, ids 1-7) are
 * counted by the plugin from their markers; with perf, the program writes
 * its totals to the file MMLAB_INSNS names, read back here.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define OUTPUT_MAX (1L << 20)	/* the last MiB of output is kept */
#define OUT_MARK "{out}"

static const struct mm_param params[] = {
	{ "timeout-s", MM_FLOAT, "600", "kill the command's process group after this many "
	  "seconds; the sample fails", 0, 0, NULL },
	{ "smaps", MM_FLAG, NULL, "read the command's smaps at its exit (a ptrace exit stop: "
	  "after its work, before its memory goes)", 0, 0, NULL },
	{ NULL },
};

/* The command's figures are parsed by mmlab from the output; none here. */
static const struct mm_metric metrics[] = { { NULL } };

static const char *const vmstat[] = {
	"pgfault", "pgmajfault", "pgalloc_normal", "pgfree", "pgactivate", "pgdeactivate",
	"thp_fault_alloc", "thp_fault_fallback", "thp_split_page", "thp_swpout",
	"thp_swpout_fallback", "pswpin", "pswpout", "pgsteal_anon", "pgscan_anon",
	"pgmigrate_success", "numa_pages_migrated", "compact_stall", "zswpout", NULL,
};

static const char *const none[] = { NULL };

static volatile sig_atomic_t timed_out;

static void on_alarm(int sig)
{
	(void)sig;
	timed_out = 1;
}

/* Whether an argument names the output file "{out}". */
static int uses_out(char *const *cmd)
{
	for (int i = 0; cmd[i]; i++)
		if (strstr(cmd[i], OUT_MARK))
			return 1;
	return 0;
}

/* The command's argv with every "{out}" replaced by `path`. */
static char **command_argv(char *const *cmd, const char *path)
{
	int n = 0;
	while (cmd[n])
		n++;
	char **out = calloc((size_t)n + 1, sizeof(*out));
	for (int i = 0; i < n; i++) {
		size_t marks = 0;
		for (const char *r = strstr(cmd[i], OUT_MARK); r; r = strstr(r + 1, OUT_MARK))
			marks++;
		char *w = out[i] = calloc(strlen(cmd[i]) + marks * strlen(path) + 1, 1);
		for (const char *r = cmd[i]; *r;) {
			if (!strncmp(r, OUT_MARK, strlen(OUT_MARK))) {
				w = stpcpy(w, path);
				r += strlen(OUT_MARK);
			} else {
				*w++ = *r++;
			}
		}
	}
	return out;
}

static void free_argv(char **argv)
{
	for (int i = 0; argv[i]; i++)
		free(argv[i]);
	free(argv);
}

/* The last `max` bytes of an open file; *len gets their count. */
static char *file_tail(int fd, long max, size_t *len, long *total)
{
	struct stat st;
	*len = 0;
	*total = fstat(fd, &st) ? 0 : (long)st.st_size;
	long from = *total > max ? *total - max : 0;
	char *buf = malloc((size_t)(*total - from) + 1);
	if (!buf)
		return NULL;
	ssize_t n = pread(fd, buf, (size_t)(*total - from), from);
	*len = n > 0 ? (size_t)n : 0;
	buf[*len] = '\0';
	return buf;
}

/*
 * The last TAIL_LINES non-empty lines the command wrote to `fd`, joined by
 * " | " and each cut at TAIL_WIDTH bytes, control characters shown as '?'
 * (they reach a terminal), or "(nothing)": a failed command's reason may be
 * on either of its outputs, so an error shows both.
 */
#define TAIL_LINES 3
#define TAIL_WIDTH 160
static void tail_lines(int fd, char *out, size_t outlen)
{
	size_t len, off = 0;
	long total;
	char *buf = file_tail(fd, 4096, &len, &total), *end, *starts[TAIL_LINES];
	int n = 0;
	snprintf(out, outlen, "(nothing)");
	if (!buf)
		return;
	for (end = buf + len; n < TAIL_LINES; end = starts[n++]) {
		while (end > buf && (unsigned char)end[-1] <= ' ')
			*--end = '\0';
		if (end == buf)
			break;
		starts[n] = end;
		while (starts[n] > buf && starts[n][-1] != '\n')
			starts[n]--;
	}
	for (int i = n - 1; i >= 0 && off < outlen; i--) {
		for (char *p = starts[i]; *p; p++)
			if ((unsigned char)*p < ' ' || *p == 0x7f)
				*p = '?';
		off += (size_t)snprintf(out + off, outlen - off, "%s%.*s", i == n - 1 ? "" : " | ",
					TAIL_WIDTH, starts[i]);
	}
	free(buf);
}

/* Why the command failed, in words: the tails of its stderr and stdout. */
static void last_words(int out_fd, int err_fd, char *why, size_t len)
{
	char out[TAIL_LINES * (TAIL_WIDTH + 3) + 1], err[sizeof(out)];
	tail_lines(out_fd, out, sizeof(out));
	tail_lines(err_fd, err, sizeof(err));
	snprintf(why, len, "stderr: %s; stdout: %s", err, out);
}

/* The command's instructions, counted with --insns (see the top). */
struct counting {
	int go[2];			/* the child execs once the parent closes go[1] */
	int kernel, user;		/* perf counters on the command, or -1 */
	char why[160];			/* why there are none */
	char windows[4096];		/* MMLAB_INSNS: the program's windows, with perf */
};

/* Before the fork: the go pipe and the file for the program's windows. */
static void counting_prepare(struct mm_ctx *c, struct counting *n)
{
	const char *dir = getenv("TMPDIR");
	n->kernel = n->user = -1;
	snprintf(n->why, sizeof(n->why), "none");
	if (pipe2(n->go, O_CLOEXEC))
		mm_die(c, "pipe: %s", strerror(errno));
	snprintf(n->windows, sizeof(n->windows), "%s/mmwork-windows-XXXXXX",
		 dir && *dir ? dir : "/tmp");
	int fd = mkstemp(n->windows);
	if (fd < 0)
		mm_die(c, "cannot create %s: %s", n->windows, strerror(errno));
	close(fd);
}

/* After the fork: counters on the child (before it execs), then let it go. */
static void counting_start(struct counting *n, pid_t pid)
{
	n->kernel = mm_insns_counter(pid, 1, -1, 1);
	n->user = n->kernel >= 0 ? mm_insns_counter(pid, 0, -1, 1) : -1;
	if (n->user < 0) {
		snprintf(n->why, sizeof(n->why), "none (perf_event_open of the instructions "
			 "counter: %s)", strerror(errno));
		if (n->kernel >= 0)
			close(n->kernel);
		n->kernel = -1;
	}
	close(n->go[0]);
	close(n->go[1]);
}

/* The program's windows from MMLAB_INSNS, summed over its processes, by id. */
static void counting_windows(struct mm_ctx *c, const char *path)
{
	double sum[MM_MAX_WINDOWS][3] = { { 0 } };
	unsigned long long f[3];
	int w;
	FILE *in = fopen(path, "r");
	while (in && fscanf(in, "%d %llu %llu %llu", &w, &f[0], &f[1], &f[2]) == 4)
		for (int i = 0; w > 0 && w < MM_MAX_WINDOWS && i < 3; i++)
			sum[w][i] += (double)f[i];
	if (in)
		fclose(in);
	for (w = 1; w < MM_MAX_WINDOWS; w++) {
		static const char *const what[] = { "windows", "kernel_insns", "user_insns" };
		char name[64];
		for (int i = 0; sum[w][0] && i < 3; i++) {
			snprintf(name, sizeof(name), "insns_window%d_%s", w, what[i]);
			mm_count(c, name, sum[w][i]);
		}
	}
}

/* After the command is reaped: its counts, or why there are none. */
static void counting_finish(struct mm_ctx *c, struct counting *n)
{
	uint64_t k = 0, u = 0;
	if (n->kernel >= 0 && read(n->kernel, &k, sizeof(k)) == (ssize_t)sizeof(k) &&
	    read(n->user, &u, sizeof(u)) == (ssize_t)sizeof(u)) {
		mm_count(c, "insns_window0_windows", 1);
		mm_count(c, "insns_window0_kernel_insns", (double)k);
		mm_count(c, "insns_window0_user_insns", (double)u);
		mm_state_str(c, "insns_source", "perf (inherited by the command's processes)");
	} else {
		mm_state_str(c, "insns_source", n->why);
	}
	counting_windows(c, n->windows);	/* empty unless the program's perf worked */
	if (n->kernel >= 0) {
		close(n->kernel);
		close(n->user);
	}
	unlink(n->windows);
}

static void child(char **argv, int out_fd, int err_fd, pid_t parent, int traced,
		  struct counting *n)
{
	int null = open("/dev/null", O_RDONLY);
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
	if (null > 0) {
		dup2(null, 0);
		close(null);
	}
	dup2(out_fd, 1);
	dup2(err_fd, 2);
	if (n) {
		char byte;
		close(n->go[1]);
		while (read(n->go[0], &byte, 1) < 0 && errno == EINTR)
			;		/* the parent has opened its counters on us */
		setenv("MMLAB_INSNS", n->windows, 1);
	}
	if (traced) {
		ptrace(PTRACE_TRACEME, 0, NULL, NULL);
		raise(SIGSTOP);		/* the parent sets its options, then lets it go */
	}
	if (n)
		MM_MARK(MM_MARK_BEGIN_ALL | 0);
	execvp(argv[0], argv);
	fprintf(stderr, "cannot run '%s': %s\n", argv[0], strerror(errno));
	_exit(127);
}

/*
 * Wait for the command, killing its process group after `timeout_s`.  When
 * traced, every stop is passed on with its signal except our own: the first
 * SIGSTOP (options are set then), the exec event, and the exit event, where
 * the command's smaps are read into *at_exit (*read_smaps = 1).
 */
static int wait_command(pid_t pid, int traced, double timeout_s, int *status,
			struct rusage *ru, struct mm_smaps *at_exit, int *read_smaps)
{
	struct sigaction sa = { .sa_handler = on_alarm }, old;
	struct itimerval timer = { .it_value = { (time_t)timeout_s,
		(suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6) } };
	int started = !traced, killed = 0;

	sigemptyset(&sa.sa_mask);	/* no SA_RESTART: the alarm ends wait4() */
	sigaction(SIGALRM, &sa, &old);
	timed_out = 0;
	setitimer(ITIMER_REAL, &timer, NULL);
	for (;;) {
		if (wait4(pid, status, __WALL, ru) < 0) {
			if (errno != EINTR)
				break;
			if (timed_out && !killed) {
				kill(-pid, SIGKILL);
				kill(pid, SIGKILL);
				killed = 1;
			}
			continue;
		}
		if (!WIFSTOPPED(*status))
			break;
		int sig = WSTOPSIG(*status), event = *status >> 16;
		if (!started && sig == SIGSTOP) {
			ptrace(PTRACE_SETOPTIONS, pid, NULL, (void *)(long)(PTRACE_O_TRACEEXIT |
			       PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL));
			started = 1;
			sig = 0;
		} else if (event == PTRACE_EVENT_EXIT) {
			char path[64];
			snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
			*read_smaps = !mm_smaps_file(path, 0, UINTPTR_MAX, at_exit);
			sig = 0;
		} else if (event) {
			sig = 0;
		}
		ptrace(PTRACE_CONT, pid, NULL, (void *)(long)sig);
	}
	memset(&timer, 0, sizeof(timer));
	setitimer(ITIMER_REAL, &timer, NULL);
	sigaction(SIGALRM, &old, NULL);
	return killed;
}

/* A temporary file for "{out}", in $TMPDIR or /tmp; its path in `path`. */
static void out_file(struct mm_ctx *c, char *path, size_t len)
{
	const char *dir = getenv("TMPDIR");
	snprintf(path, len, "%s/mmwork-exec-XXXXXX", dir && *dir ? dir : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0)
		mm_die(c, "cannot create the {out} file %s: %s", path, strerror(errno));
	close(fd);
}

static int exec_sample(struct mm_ctx *c)
{
	const int traced = mm_probes(c) && mm_arg_long(c, "smaps");
	const int to_file = uses_out(mm_command(c));
	char path[4096] = "";
	if (to_file)
		out_file(c, path, sizeof(path));
	char **argv = command_argv(mm_command(c), path);
	FILE *out = tmpfile(), *err = tmpfile();
	if (!out || !err)
		mm_die(c, "cannot create files for the command's output: %s", strerror(errno));
	/* The command gets them as its stdout and stderr only (dup2 clears this). */
	fcntl(fileno(out), F_SETFD, FD_CLOEXEC);
	fcntl(fileno(err), F_SETFD, FD_CLOEXEC);
	fflush(NULL);

	struct rusage ru = { 0 };
	struct mm_smaps at_exit = { 0 };
	struct counting counting, *n = mm_insns_on ? &counting : NULL;
	int status = 0, read_smaps = 0;
	const pid_t self = getpid();
	if (n)
		counting_prepare(c, n);
	const uint64_t t0 = mm_now_ns();
	pid_t pid = fork();
	if (pid < 0)
		mm_die(c, "fork: %s", strerror(errno));
	if (pid == 0)
		child(argv, fileno(out), fileno(err), self, traced, n);
	setpgid(pid, pid);
	if (n)
		counting_start(n, pid);
	int killed = wait_command(pid, traced, mm_arg_double(c, "timeout-s"), &status, &ru,
				  &at_exit, &read_smaps);
	if (n)
		MM_MARK(MM_MARK_END_ALL | 0);
	const uint64_t t1 = mm_now_ns();
	kill(-pid, SIGKILL);	/* whatever the command left running in its group */
	if (n)
		counting_finish(c, n);

	char why[4 * TAIL_LINES * (TAIL_WIDTH + 3)];
	const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	last_words(fileno(out), fileno(err), why, sizeof(why));
	if (to_file && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
		unlink(path);
	if (killed)
		mm_die(c, "'%s' did not finish within %g s (killed): %s", name,
		       mm_arg_double(c, "timeout-s"), why);
	if (WIFSIGNALED(status))
		mm_die(c, "'%s' was killed by signal %d (%s): %s", name, WTERMSIG(status),
		       strsignal(WTERMSIG(status)), why);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		mm_die(c, "'%s' exited with status %d: %s", name, WEXITSTATUS(status), why);

	size_t len;
	long total;
	int src = to_file ? open(path, O_RDONLY | O_CLOEXEC) : fileno(out);
	if (src < 0)
		mm_die(c, "cannot read the {out} file %s: %s", path, strerror(errno));
	char *text = file_tail(src, OUTPUT_MAX, &len, &total);
	if (!text)
		mm_die(c, "out of memory for the command's output");
	mm_output(c, text, len);
	free(text);
	if (to_file) {
		close(src);
		unlink(path);
	}
	fclose(out);
	fclose(err);

	mm_count(c, "command_wall_s", (double)(t1 - t0) / 1e9);
	mm_count(c, "command_max_rss_kb", (double)ru.ru_maxrss);
	mm_count(c, "output_bytes", (double)total);
	if (traced && read_smaps) {
		mm_state_smaps(c, "exit_", &at_exit);
		mm_state_num(c, "exit_thp_backed_fraction", at_exit.anon_kb > 0 ?
			     (double)at_exit.anon_huge_kb / (double)at_exit.anon_kb : 0);
	} else if (traced) {
		mm_state_str(c, "exit_smaps", "not read (no exit stop)");
	}
	free_argv(argv);
	return 0;
}

const struct mm_workload wl_exec = {
	.name = "exec",
	.seed = "any: a reporter's own command line or reproducer",
	.summary = "run the command after '--', measured from outside (rusage, vmstat, state)",
	.params = params,
	.metrics = metrics,
	.mm_paths = none,
	.vmstat = vmstat,
	.tracepoints = none,
	.host_settings = none,
	.default_warmups = 0,
	.takes_command = 1,
	.sample = exec_sample,
};
