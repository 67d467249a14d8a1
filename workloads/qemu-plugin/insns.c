/*
 * insns.c - mmlab's QEMU TCG plugin: the guest's kernel and user
 * instructions inside mmwork's timed windows.
 *
 * mmwork (with --insns) executes a marker NOP at the start and end of each
 * timed window and after each sample (core-insns.h).  This plugin counts
 * every translation block's instructions when the block is entered, as
 * kernel or user by the block's address (the upper half is the kernel's on
 * x86-64), and on each marker takes the difference since the window's
 * start on that vCPU.  After each sample it writes one JSON line, the
 * windows of that sample summed, to the file `out=PATH`; mmlab turns it into
 * <window>_kernel_insns_per_<unit> (targets/qemu.py, insns.py).
 *
 * Counting per block, a block left early (a fault in its middle) counts
 * whole: deterministic, since the same faults happen every time.
 *
 * vCPUs: the 7.2 API's inline add goes to one address for every vCPU, and
 * with MTTCG (one host thread per vCPU) concurrent adds to it race and lose
 * counts.  So with one vCPU the blocks count inline (fast); with more, a
 * callback adds to the running vCPU's own counter (no sharing, slower).
 * Windows are per vCPU: a window that ends on another vCPU than it started
 * (its task migrated) is not counted, only reported as unmatched.  Sums over
 * the windows of a sample are taken under a lock.
 *
 * A window over every vCPU (MM_MARK_BEGIN_ALL / END_ALL: an exec workload's
 * whole command, whose processes run on any vCPU) counts everything every
 * vCPU executes between its two markers.  With one vCPU that is the vCPU's
 * own window, exact.  With more, every block adds to the window's shared
 * counters (atomically) while the window is open; a vCPU that entered a
 * block just before the begin or end may count it on the wrong side of it,
 * so its per-block counts can differ from its total by those few blocks
 * (its "blocks" line says exact: false).
 *
 * Per block (blocks=on): every kernel block's instructions inside each
 * window are also kept by the block's start address, for mmlab to name the
 * function each block is in (attribution/functions.py, with the kernel's
 * symbols).  Counting then takes the callback (it must know whether a
 * window is open).  A window's blocks are pending on its vCPU until the
 * window ends there, and dropped with it when it does not (unmatched), so
 * the blocks of the counted windows add up to exactly their totals.  Blocks
 * are summed over the measured samples' windows (warm-ups are dropped) and
 * written at exit, one line per window.
 *
 * Arguments: out=PATH (required); mode=inline or mode=callback forces one
 * way of counting (to measure what each costs; README); blocks=on.
 *
 * Build: gcc -shared -fPIC -I<qemu>/include/qemu $(pkg-config --cflags
 * --libs glib-2.0) insns.c -o insns.so (mmlab: qemu_plugin.py).
 */
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

#include "../core-insns.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define KERNEL_HALF 0xffff800000000000ULL
enum { USER, KERNEL };

/* One vCPU's counters, on a cache line of its own. */
struct vcpu {
	uint64_t insns[2];			/* USER, KERNEL: since boot */
	uint64_t start[MM_MAX_WINDOWS][2];	/* at each open window's begin marker */
	uint32_t open;				/* bit w: window w is open here */
	uint64_t *pending[MM_MAX_WINDOWS];	/* blocks=on: per block slot, the open window's */
	GArray *touched[MM_MAX_WINDOWS];	/* the slots with pending counts */
} __attribute__((aligned(64)));

struct window_sum {
	uint64_t windows, insns[2];
};

/*
 * A kernel block seen with blocks=on: its address, size, and instructions per
 * window.  One address can start blocks of different sizes (a block cut short
 * by an interrupt or a page boundary), so the key holds both.
 */
struct block {
	uint64_t key;				/* low 48 bits of the address, size above */
	uint64_t vaddr;
	uint64_t n_insns;
	uint64_t insns[MM_MAX_WINDOWS];		/* the counted windows', added under `lock` */
};

#define MAX_BLOCKS (1u << 18)

static struct vcpu *vcpus;
static int n_vcpus;
static gboolean inline_counts;
static GMutex lock;				/* the sums and the output */
static struct window_sum sums[MM_MAX_WINDOWS];
static uint64_t unmatched, records;
static uint32_t all_open;			/* bit w: a window over every vCPU is open */
static uint32_t all_used;			/* bit w: it was one, with several vCPUs */
static uint64_t all_insns[MM_MAX_WINDOWS][2];	/* its counts since its begin */
static FILE *out;
static struct block *blocks;			/* blocks=on: calloc'ed, touched as used */
static GHashTable *block_slots;			/* key -> slot + 1, under `lock` */
static uint32_t n_blocks, blocks_dropped;

/* Several vCPUs: `n` instructions of `side` into every open all-vCPU window. */
static void count_all(int side, uint64_t n, struct block *b)
{
	for (uint32_t open = __atomic_load_n(&all_open, __ATOMIC_RELAXED); open;
	     open &= open - 1) {
		const int w = __builtin_ctz(open);
		__atomic_fetch_add(&all_insns[w][side], n, __ATOMIC_RELAXED);
		if (b)
			__atomic_fetch_add(&b->insns[w], n, __ATOMIC_RELAXED);
	}
}

static void count_block(unsigned int vcpu, void *udata)
{
	uintptr_t packed = (uintptr_t)udata;
	vcpus[vcpu].insns[packed & 1] += packed >> 1;
	count_all((int)(packed & 1), packed >> 1, NULL);
}

/* blocks=on: a kernel block counts on its vCPU and, pending, into every window open there. */
static void count_kernel_block(unsigned int vcpu, void *udata)
{
	struct block *b = udata;
	struct vcpu *v = &vcpus[vcpu];
	const uint32_t slot = (uint32_t)(b - blocks);
	v->insns[KERNEL] += b->n_insns;
	if (!inline_counts)
		count_all(KERNEL, b->n_insns, b);
	for (uint32_t open = v->open; open; open &= open - 1) {
		const int w = __builtin_ctz(open);
		if (!v->pending[w]) {		/* first use: this vCPU's thread only */
			v->pending[w] = calloc(MAX_BLOCKS, sizeof(uint64_t));
			v->touched[w] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
			if (!v->pending[w])
				abort();
		}
		if (!v->pending[w][slot])
			g_array_append_val(v->touched[w], slot);
		v->pending[w][slot] += b->n_insns;
	}
}

/* Window w ended on `v`: add its pending blocks to the sums (`commit`) or drop them. */
static void settle_blocks(struct vcpu *v, unsigned w, gboolean commit)
{
	if (!v->pending[w])
		return;
	for (guint i = 0; i < v->touched[w]->len; i++) {
		const uint32_t slot = g_array_index(v->touched[w], uint32_t, i);
		if (commit)
			blocks[slot].insns[w] += v->pending[w][slot];
		v->pending[w][slot] = 0;
	}
	g_array_set_size(v->touched[w], 0);
}

/* The slot of the `n`-instruction block at `vaddr` (translated again, it keeps its slot). */
static struct block *block_at(uint64_t vaddr, size_t n)
{
	struct block *b = NULL;
	uint64_t key = (vaddr & 0xffffffffffffULL) | (uint64_t)n << 48;
	g_mutex_lock(&lock);
	gpointer slot = g_hash_table_lookup(block_slots, &key);
	if (slot) {
		b = &blocks[GPOINTER_TO_UINT(slot) - 1];
	} else if (n_blocks < MAX_BLOCKS) {
		b = &blocks[n_blocks++];
		b->key = key;
		b->vaddr = vaddr;
		b->n_insns = n;
		g_hash_table_insert(block_slots, &b->key, GUINT_TO_POINTER(n_blocks));
	} else {
		blocks_dropped++;
	}
	g_mutex_unlock(&lock);
	return b;
}

/* A sample (or warm-up) is complete: write its windows, start afresh. */
static void write_record(const char *kind)
{
	g_mutex_lock(&lock);
	fprintf(out, "{\"kind\": \"%s\", \"record\": %" PRIu64 ", \"unmatched\": %" PRIu64
		", \"windows\": [", kind, records++, unmatched);
	for (int w = 0; w < MM_MAX_WINDOWS; w++)
		fprintf(out, "%s[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", w ? ", " : "",
			sums[w].windows, sums[w].insns[KERNEL], sums[w].insns[USER]);
	fputs("]}\n", out);
	fflush(out);
	memset(sums, 0, sizeof(sums));
	unmatched = 0;
	if (blocks && !strcmp(kind, "warmup"))	/* blocks sum the measured samples only */
		for (uint32_t i = 0; i < n_blocks; i++)
			memset(blocks[i].insns, 0, sizeof(blocks[i].insns));
	g_mutex_unlock(&lock);
}

static void end_window(struct vcpu *v, unsigned w)
{
	g_mutex_lock(&lock);
	if (v->open & (1u << w)) {
		sums[w].windows++;
		for (int side = USER; side <= KERNEL; side++)
			sums[w].insns[side] += v->insns[side] - v->start[w][side];
		settle_blocks(v, w, TRUE);
	} else {
		unmatched++;
	}
	g_mutex_unlock(&lock);
	v->open &= ~(1u << w);
}

/* A window over every vCPU begins: its shared counters start from nothing. */
static void begin_all(unsigned w)
{
	g_mutex_lock(&lock);
	memset(all_insns[w], 0, sizeof(all_insns[w]));
	all_used |= 1u << w;
	__atomic_or_fetch(&all_open, 1u << w, __ATOMIC_SEQ_CST);
	g_mutex_unlock(&lock);
}

static void end_all(unsigned w)
{
	g_mutex_lock(&lock);
	if (__atomic_fetch_and(&all_open, ~(1u << w), __ATOMIC_SEQ_CST) & (1u << w)) {
		sums[w].windows++;
		for (int side = USER; side <= KERNEL; side++)
			sums[w].insns[side] += __atomic_load_n(&all_insns[w][side], __ATOMIC_RELAXED);
	} else {
		unmatched++;
	}
	g_mutex_unlock(&lock);
}

static void on_marker(unsigned int vcpu, void *udata)
{
	uint32_t code = (uint32_t)(uintptr_t)udata;
	const unsigned w = code & MM_MARK_WINDOW;
	struct vcpu *v = &vcpus[vcpu];

	if (inline_counts && (code & MM_MARK_KIND) == MM_MARK_BEGIN_ALL)
		code = MM_MARK_BEGIN | w;	/* one vCPU: its own window is every vCPU's */
	else if (inline_counts && (code & MM_MARK_KIND) == MM_MARK_END_ALL)
		code = MM_MARK_END | w;
	switch (code & MM_MARK_KIND) {
	case MM_MARK_BEGIN_ALL:
		begin_all(w);
		break;
	case MM_MARK_END_ALL:
		end_all(w);
		break;
	case MM_MARK_BEGIN:
		memcpy(v->start[w], v->insns, sizeof(v->insns));
		settle_blocks(v, w, FALSE);	/* a window begun here before never ended here */
		v->open |= 1u << w;
		break;
	case MM_MARK_END:
		end_window(v, w);
		break;
	case MM_MARK_SAMPLE:
		write_record("sample");
		break;
	case MM_MARK_WARMUP:
		write_record("warmup");
		break;
	}
}

/* Is `insn` one of mmwork's markers (nopl MM_MARK_MAGIC|code(%rax))? */
static int marker_code(struct qemu_plugin_insn *insn, uint32_t *code)
{
	const uint8_t *b = qemu_plugin_insn_data(insn);
	uint32_t disp;
	if (qemu_plugin_insn_size(insn) != 7 || b[0] != 0x0f || b[1] != 0x1f || b[2] != 0x80)
		return 0;
	memcpy(&disp, b + 3, sizeof(disp));	/* little-endian, as the guest */
	if ((disp & ~(MM_MARK_KIND | MM_MARK_WINDOW)) != MM_MARK_MAGIC ||
	    (disp & MM_MARK_WINDOW) >= MM_MAX_WINDOWS ||
	    (disp & MM_MARK_KIND) < MM_MARK_BEGIN || (disp & MM_MARK_KIND) > MM_MARK_END_ALL)
		return 0;
	*code = disp & (MM_MARK_KIND | MM_MARK_WINDOW);
	return 1;
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	const size_t n = qemu_plugin_tb_n_insns(tb);
	const int side = qemu_plugin_tb_vaddr(tb) >= KERNEL_HALF ? KERNEL : USER;
	struct block *b;
	(void)id;
	if (blocks && side == KERNEL && (b = block_at(qemu_plugin_tb_vaddr(tb), n)))
		qemu_plugin_register_vcpu_tb_exec_cb(tb, count_kernel_block, QEMU_PLUGIN_CB_NO_REGS, b);
	else if (inline_counts)
		qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64,
							 &vcpus[0].insns[side], n);
	else
		qemu_plugin_register_vcpu_tb_exec_cb(tb, count_block, QEMU_PLUGIN_CB_NO_REGS,
						     (void *)(uintptr_t)(n << 1 | side));
	if (side == KERNEL)
		return;
	for (size_t i = 0; i < n; i++) {
		struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
		uint32_t code;
		if (marker_code(insn, &code))
			qemu_plugin_register_vcpu_insn_exec_cb(insn, on_marker, QEMU_PLUGIN_CB_NO_REGS,
							       (void *)(uintptr_t)code);
	}
}

static void at_exit(qemu_plugin_id_t id, void *udata)
{
	uint64_t total[2] = { 0, 0 };
	(void)id;
	(void)udata;
	for (int i = 0; i < n_vcpus; i++)
		for (int side = USER; side <= KERNEL; side++)
			total[side] += vcpus[i].insns[side];
	for (int w = 0; blocks && w < MM_MAX_WINDOWS; w++) {
		const char *sep = "";
		fprintf(out, "{\"kind\": \"blocks\", \"window\": %d, \"dropped\": %" PRIu32
			", \"exact\": %s, \"blocks\": [", w, blocks_dropped,
			all_used & (1u << w) ? "false" : "true");
		for (uint32_t i = 0; i < n_blocks; i++) {
			if (!blocks[i].insns[w])
				continue;
			fprintf(out, "%s[%" PRIu64 ", %" PRIu64 "]", sep, blocks[i].vaddr,
				blocks[i].insns[w]);
			sep = ", ";
		}
		fputs("]}\n", out);
	}
	fprintf(out, "{\"kind\": \"exit\", \"kernel\": %" PRIu64 ", \"user\": %" PRIu64 "}\n",
		total[KERNEL], total[USER]);
	fclose(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
					   int argc, char **argv)
{
	const char *path = NULL, *mode = NULL;
	gboolean by_block = FALSE;
	for (int i = 0; i < argc; i++) {
		if (g_str_has_prefix(argv[i], "out="))
			path = argv[i] + 4;
		else if (g_str_has_prefix(argv[i], "mode="))
			mode = argv[i] + 5;
		else if (!strcmp(argv[i], "blocks=on"))
			by_block = TRUE;
		else {
			fprintf(stderr, "mmlab insns plugin: unknown argument '%s'\n", argv[i]);
			return -1;
		}
	}
	if (!info->system_emulation || !path) {
		fprintf(stderr, "mmlab insns plugin: needs system emulation and out=PATH\n");
		return -1;
	}
	n_vcpus = info->system.max_vcpus;
	inline_counts = mode ? !strcmp(mode, "inline") : n_vcpus == 1;
	if (!inline_counts && mode && strcmp(mode, "callback")) {
		fprintf(stderr, "mmlab insns plugin: mode is inline or callback, not '%s'\n", mode);
		return -1;
	}
	vcpus = aligned_alloc(64, sizeof(*vcpus) * (size_t)n_vcpus);
	out = fopen(path, "w");
	if (!vcpus || !out) {
		fprintf(stderr, "mmlab insns plugin: cannot write %s\n", path);
		return -1;
	}
	memset(vcpus, 0, sizeof(*vcpus) * (size_t)n_vcpus);
	if (by_block) {
		blocks = calloc(MAX_BLOCKS, sizeof(*blocks));
		block_slots = g_hash_table_new(g_int64_hash, g_int64_equal);
		if (!blocks) {
			fprintf(stderr, "mmlab insns plugin: no memory for blocks=on\n");
			return -1;
		}
	}
	fprintf(out, "{\"kind\": \"start\", \"vcpus\": %d, \"mode\": \"%s\"}\n", n_vcpus,
		inline_counts ? "inline" : "callback");
	fflush(out);
	qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
	qemu_plugin_register_atexit_cb(id, at_exit, NULL);
	return 0;
}
