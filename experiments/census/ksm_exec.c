/*
 * ksm_exec.c - run a program with KSM enabled for its whole address space,
 * as a service manager does for a workload (systemd's MemoryKSM=yes):
 * prctl(PR_SET_MEMORY_MERGE, 1), then exec.  The setting lives in the mm
 * and is carried across execve (the 6.18 host shows ksm_merge_any: yes in
 * the exec'd program's /proc/PID/ksm_stat), so every anonymous VMA the
 * program maps is VM_MERGEABLE.
 *
 *   ksm_exec PROGRAM ARGS...
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef PR_SET_MEMORY_MERGE
#define PR_SET_MEMORY_MERGE 67
#endif

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: ksm_exec PROGRAM ARGS...\n");
		return 2;
	}
	if (prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0)) {
		perror("ksm_exec: prctl(PR_SET_MEMORY_MERGE) (Linux 6.4+, CONFIG_KSM)");
		return 1;
	}
	execvp(argv[1], argv + 1);
	perror("ksm_exec: exec");
	return 127;
}
