/*
 * core-knobs.c - global kernel settings a workload changes, recorded on
 * first write and written back after each sample, at exit and on a fatal
 * signal, so a shared machine is left as it was found.
 */
#define _GNU_SOURCE
#include "core-knobs.h"
#include "core-procfs.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MM_MAX_KNOBS 16

static struct {
	char path[128];
	char old[128];
} knobs[MM_MAX_KNOBS];
static int nknobs;
static pid_t knob_owner;

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
			mm_read_bracketed(path, old, sizeof(old));
		snprintf(knobs[i].old, sizeof(knobs[i].old), "%s", old);
		snprintf(knobs[i].path, sizeof(knobs[i].path), "%s", path);
		knob_owner = getpid();
		nknobs++;
	}
	return mm_write_text(path, value);
}

/* Async-signal-safe: mm_write_text is open/write/close only. Last set, first
 * restored. */
void mm_knobs_restore(void)
{
	if (getpid() != knob_owner)
		return;
	for (int i = nknobs - 1; i >= 0; i--)
		mm_write_text(knobs[i].path, knobs[i].old);
	nknobs = 0;
}

static void on_signal(int sig)
{
	mm_knobs_restore();
	signal(sig, SIG_DFL);
	raise(sig);
}

void mm_knobs_restore_on_exit(void)
{
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	atexit(mm_knobs_restore);
}
