/*
 * core-record.c - what one sample reports: the metric, count and state
 * key/value sets a workload (and the harness's probes) fill, and the
 * command output an exec workload carries.  It writes into the context
 * only, so every core file that reports can include it without a loop.
 */
#define _GNU_SOURCE
#include "core-record.h"
#include "core-ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void mm_output(struct mm_ctx *c, const char *data, size_t len)
{
	free(c->output);
	c->output = malloc(len + 1);
	if (!c->output) {
		perror("mmwork: malloc");
		exit(1);
	}
	memcpy(c->output, data, len);
	c->output_len = len;
}

int mm_is_warmup(const struct mm_ctx *c) { return c->warmup; }
int mm_probes(const struct mm_ctx *c) { return c->probes; }
