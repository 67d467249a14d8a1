/*
 * core-errno.c - failed calls counted by call and errno in a table that
 * forked workers share, so a sample reports its failures instead of
 * printing them or stopping.
 */
#define _GNU_SOURCE
#include "core-errno.h"
#include "core-shm.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

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

void mm_errors_init(void)
{
	pthread_mutexattr_t a;
	errtab = mm_shared_alloc(sizeof(*errtab));
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutex_init(&errtab->lock, &a);
}

void mm_errors_clear(void)
{
	errtab->n = 0;
}

static const char *errno_name(int err)
{
	const char *name = strerrorname_np(err);
	return name ? name : "E?";
}

void mm_errors_json(struct jbuf *j)
{
	jb_open(j, "errors");
	for (int i = 0; i < errtab->n; i++) {
		char k[64];
		snprintf(k, sizeof(k), "%s:%s", errtab->e[i].call, errno_name(errtab->e[i].err));
		jb_key_num(j, k, (double)errtab->e[i].count);
	}
	jb_close(j);
	errtab->n = 0;
}

void mm_errors_text(char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < errtab->n && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%s %s x %ld", i ? ", " : "",
				       errtab->e[i].call, errno_name(errtab->e[i].err),
				       errtab->e[i].count);
}
