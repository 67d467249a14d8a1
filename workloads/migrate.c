/*
 * migrate.c - page migration between the two nodes of a two-node machine:
 * move_pages(), migrate_pages() and mbind(MPOL_MF_MOVE) of a populated
 * anonymous range.
 *
 * Each round maps --mapping-kb fresh, binds it to the first node with
 * memory (mbind(MPOL_BIND) before anything is faulted, so every page is
 * allocated there), write-touches it, and times one call that moves every
 * page to the second node:
 *
 * - move-pages: move_pages(MPOL_MF_MOVE) with one address per 4 KiB page
 *   (kernel_move_pages -> do_pages_move, in chunks, -> migrate_pages);
 * - migrate-pages: migrate_pages() of this process from the first node to
 *   the second (do_migrate_pages -> migrate_to_node: every page of the
 *   process on the first node, the range's and the few of mmwork's own that
 *   are there; per page is per page of the range);
 * - mbind: mbind(MPOL_BIND to the second node, MPOL_MF_MOVE) of the range
 *   (do_mbind -> queue_pages_range -> migrate_pages).
 *
 * A THP (--thp) migrates whole when the target node has a free huge page,
 * and is split otherwise (thp_migration_split).  Which node the pages were
 * on before and after the call is read on one extra untimed round after the
 * timed ones (move_pages without nodes only reports, but it walks the page
 * tables the call walks).  On a machine with one NUMA node there is nothing
 * to migrate between: the workload refuses at --check.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* numaif.h's, without libnuma: the reproducer builds with the C library alone. */
#define MPOL_BIND_ 2
#define MPOL_MF_MOVE_ (1 << 1)
#define NODE_BITS (8 * sizeof(unsigned long))

static const char *const op_choices[] = { "move-pages", "migrate-pages", "mbind", NULL };

static const struct mm_param params[] = {
	{ "op", MM_CHOICE, "move-pages", "what moves the range to the second node: move_pages(), "
	  "migrate_pages() or mbind(MPOL_BIND, MPOL_MF_MOVE)", 0, 0, op_choices },
	MM_PARAM_SIZE_KB("mapping-kb", "4096", "anonymous range size in KiB"),
	MM_PARAM_THP("nohugepage", "range", ": nohugepage migrates 4 KiB folios; hugepage 2 MiB "
		     "ones"),
	MM_PARAM_ALIGN("range", "it", ""),
	MM_PARAM_ROUNDS("8", "minimum map/bind/populate/migrate rounds per sample"),
	MM_PARAM_MIN_MS("200"),
	{ NULL },
};

static const struct mm_metric metrics[] = {
	{ "migrate_ns_per_page", "ns", 0, "the --op call moving the range to the second "
	  "node" MM_MEDIAN_PER("page of the range") },
	{ "migrate_ns_per_page_total", "ns", 0, "the --op call moving the range to the second "
	  "node" MM_TOTAL },
	{ NULL },
};

/* The timed window, by id. */
enum { MG_MIGRATE };
static const struct mm_window windows[] = {
	{ "migrate", "page", "the --op call moving the range to the second node" },
	{ NULL },
};

static const char *const mm_paths[] = {
	"migrate_pages", "kernel_move_pages", "do_pages_move", "do_migrate_pages",
	"migrate_to_node", "do_mbind", "queue_pages_range", "migrate_pages_batch",
	"try_to_migrate_one", "remove_migration_ptes", "folio_mc_copy", "alloc_migration_target",
	"migrate_folio", NULL,
};

static const char *const vmstat[] = {
	"pgmigrate_success", "pgmigrate_fail", "thp_migration_success", "thp_migration_fail",
	"thp_migration_split", "pgfault", "thp_fault_alloc", NULL,
};

static const char *const tracepoints[] = { "migrate", "huge_memory", NULL };

/* The first two nodes with memory, from sysfs; how many there are. */
static int memory_nodes(int node[2])
{
	char buf[256];
	int n = 0;
	if (mm_read_text("/sys/devices/system/node/has_memory", buf, sizeof(buf)) &&
	    mm_read_text("/sys/devices/system/node/online", buf, sizeof(buf)))
		return 1;
	for (char *p = buf; *p && *p != '\n';) {
		long a = strtol(p, &p, 10), b = a;
		if (*p == '-')
			b = strtol(p + 1, &p, 10);
		for (long i = a; i <= b; i++, n++)
			if (n < 2)
				node[n] = (int)i;
		if (*p != ',')
			break;
		p++;
	}
	return n;
}

static int mg_validate(struct mm_ctx *c)
{
	int node[2] = { 0, 0 };
	const int n = memory_nodes(node);
	(void)c;
	/* The nodes are the machine's, not the arguments': a profile checked
	 * here runs its arms in guests of two nodes; a sample refuses one. */
	if (n >= 2 && (node[0] >= (int)NODE_BITS || node[1] >= (int)NODE_BITS)) {
		fprintf(stderr, "mmwork: migrate: nodes %d and %d: node ids above %d are not "
			"supported\n", node[0], node[1], (int)NODE_BITS - 1);
		return -1;
	}
	return 0;
}

struct mg_setup {
	int op;			/* 0 move-pages, 1 migrate-pages, 2 mbind */
	int from, to;
	long npages;
	void **addr;		/* move_pages' */
	int *target, *status;
	long not_moved;		/* pages the timed calls reported they could not move */
};

/* Which node each page is on, counted (a probe). */
static void where(struct mg_setup *s, long *on_from, long *on_to)
{
	*on_from = *on_to = 0;
	if (syscall(SYS_move_pages, 0, s->npages, s->addr, NULL, s->status, 0)) {
		mm_error("move_pages_query", errno);
		return;
	}
	for (long i = 0; i < s->npages; i++) {
		*on_from += s->status[i] == s->from;
		*on_to += s->status[i] == s->to;
	}
}

struct mg_probe {
	long before_from, before_to, after_from, after_to;
	struct mm_smaps smaps;
};

/*
 * One round.  Returns the call's ns, 0 when it failed (counted), -1 without
 * a mapping.  With `probe` set the window is not counted and the pages'
 * nodes are read before and after it.
 */
static int64_t mg_round(struct mm_ctx *c, struct mg_setup *s, size_t len,
			struct mg_probe *probe, char **start)
{
	const int timed = !probe;
	const unsigned long from_mask = 1UL << s->from, to_mask = 1UL << s->to;
	char *p = mm_map_range(c, len, MAP_PRIVATE | MAP_ANONYMOUS, -1, start);
	long rc;
	if (!p)
		return -1;
	/* Empty yet: the policy only decides where the faults allocate. */
	if (syscall(SYS_mbind, p, len, MPOL_BIND_, &from_mask, NODE_BITS + 1, 0))
		mm_error("mbind_source", errno);
	mm_touch_write(p, len, 1);
	for (long i = 0; i < s->npages; i++)
		s->addr[i] = p + i * MM_PAGE_SIZE;
	if (probe) {
		where(s, &probe->before_from, &probe->before_to);
		mm_smaps_range(p, len, &probe->smaps);
	}

	uint64_t t0 = MM_WINDOW_BEGIN(MG_MIGRATE, timed);
	if (s->op == 0)
		rc = syscall(SYS_move_pages, 0, s->npages, s->addr, s->target, s->status,
			     MPOL_MF_MOVE_);
	else if (s->op == 1)
		rc = syscall(SYS_migrate_pages, 0, NODE_BITS + 1, &from_mask, &to_mask);
	else
		rc = syscall(SYS_mbind, p, len, MPOL_BIND_, &to_mask, NODE_BITS + 1, MPOL_MF_MOVE_);
	uint64_t t1 = MM_WINDOW_END(MG_MIGRATE, timed);
	static const char *const calls[] = { "move_pages", "migrate_pages", "mbind" };
	/* migrate_pages() returns how many pages it could not move: of the
	 * process, not only of the range, so they are counted, not failures. */
	const int failed = rc < 0;
	if (failed)
		mm_error(calls[s->op], errno);
	else if (timed)
		s->not_moved += rc;
	if (s->op == 0 && !failed)
		for (long i = 0; i < s->npages; i++)
			if (s->status[i] < 0 && s->status[i] != -ENOENT)
				mm_error("move_pages_page", -s->status[i]);
	if (probe)
		where(s, &probe->after_from, &probe->after_to);
	munmap(p, len);
	return failed ? 0 : (int64_t)(t1 - t0);
}

/* A timed round for mm_run_rounds. */
struct mg_run {
	struct mg_setup s;
	size_t len;
	struct mm_rounds mig;
};

static int mg_timed(struct mm_ctx *c, void *arg, char **start)
{
	struct mg_run *r = arg;
	const int64_t ns = mg_round(c, &r->s, r->len, NULL, start);
	if (ns > 0)
		mm_rounds_add(&r->mig, (uint64_t)ns);
	return ns < 0 ? -1 : ns == 0;
}

static int mg_sample(struct mm_ctx *c)
{
	struct mg_run r = { .len = (size_t)mm_arg_long(c, "mapping-kb") * 1024 };
	const size_t len = r.len;
	const double pages = (double)(len / MM_PAGE_SIZE);
	const char *op = mm_arg_str(c, "op");
	struct mg_setup *s = &r.s;
	int node[2] = { 0, 1 };
	struct mm_loop loop;
	int rc = 1;

	const int n = memory_nodes(node);
	if (n < 2)
		mm_die(c, "needs two NUMA nodes with memory (this machine has %d); run it in a guest "
		       "with numa_nodes = 2", n);
	s->op = !strcmp(op, "move-pages") ? 0 : !strcmp(op, "migrate-pages") ? 1 : 2;
	s->from = node[0];
	s->to = node[1];
	s->npages = (long)(len / MM_PAGE_SIZE);
	s->addr = calloc((size_t)s->npages, sizeof(*s->addr));
	s->target = calloc((size_t)s->npages, sizeof(*s->target));
	s->status = calloc((size_t)s->npages, sizeof(*s->status));
	if (!s->addr || !s->target || !s->status)
		goto out;
	for (long i = 0; i < s->npages; i++)
		s->target[i] = s->to;

	if (mm_run_rounds(c, mm_arg_long(c, "rounds"), mg_timed, &r, &loop) || !loop.timed)
		goto out;

	mm_metric_rounds(c, "migrate_ns_per_page", &r.mig, pages);
	mm_count(c, "rounds", (double)loop.timed);
	mm_count(c, "pages", pages * (double)loop.timed);
	mm_window_units(c, MG_MIGRATE, pages);
	if (s->op == 1)
		mm_count(c, "pages_not_migrated", (double)s->not_moved);
	mm_state_num(c, "from_node", s->from);
	mm_state_num(c, "to_node", s->to);
	mm_state_num(c, "mapping_start_mod_2m_kb", mm_pmd_offset_kb(loop.start));
	rc = 0;
	if (!mm_probes(c))
		goto out;

	/* Where the pages were, from one extra round after the timed ones. */
	struct mg_probe probe;
	if (mg_round(c, s, len, &probe, &loop.start) < 0) {
		rc = 1;
		goto out;
	}
	mm_state_num(c, "thp_backed_fraction", (double)probe.smaps.anon_huge_kb / ((double)len / 1024));
	mm_state_num(c, "before_on_from_fraction", (double)probe.before_from / (double)s->npages);
	mm_state_num(c, "after_on_to_fraction", (double)probe.after_to / (double)s->npages);
	mm_state_num(c, "after_on_from_fraction", (double)probe.after_from / (double)s->npages);
out:
	mm_rounds_free(&r.mig);
	free(s->addr);
	free(s->target);
	free(s->status);
	return rc;
}

const struct mm_workload wl_migrate = {
	.name = "migrate",
	.seed = "none: a baseline of page migration between NUMA nodes",
	.summary = "bind a populated anon range to one node and time move_pages(), "
		   "migrate_pages() or mbind(MPOL_MF_MOVE) moving it to the other (two nodes)",
	MM_WORKLOAD_TABLES,
	.default_warmups = 1,
	.validate = mg_validate,
	.sample = mg_sample,
};
