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
 * Stays (stays=PATH): the kernel's instructions by what entered it, without
 * a marker in the program.  Per vCPU, a kernel block entered right after a
 * user block starts a "stay", and the next user block ends it: the kernel
 * instructions in between (entry and exit included) are one call of
 * whatever the stay's entry block says (PATH's lines, from the kernel's
 * symbols: the syscall entry, asm_exc_page_fault, other asm_exc_*, interrupt
 * entries).  A syscall's stay is named by the first block it executes that
 * starts a syscall's function (__x64_sys_NAME); an interrupt inside a stay
 * counts with it.  A stay counts in a window that was open on its vCPU (or
 * over every vCPU) when it began and is the same window when it ends; a
 * per-vCPU window's stays are pending like its blocks.  The kernel runs at
 * a random offset (KASLR) and a v1 plugin cannot read memory, so the
 * offsets in PATH are from _text and _text is found at run time: the first
 * kernel block after a user block that ends in `syscall` (0f 05) is the
 * 64-bit syscall entry (PATH's anchor), a 2 MiB-aligned _text checks it.
 * Every sample record then carries "stays": per window, {label: [calls,
 * kernel instructions]}.  Every block takes a callback then.
 *
 * Events (events=on, or events=blocks): loads, stores, locked
 * instructions, TLB flushes, IPIs, rep string instructions and instructions
 * as a CPU retires them, per window beside the instructions (events.h).
 *
 * Arguments: out=PATH (required); mode=inline or mode=callback forces one
 * way of counting (to measure what each costs; README); blocks=on;
 * stays=PATH; calls=PATH (inclusive counts by function, with stays=:
 * calls.h).
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
	uint32_t gen[MM_MAX_WINDOWS];		/* stays=: windows begun here, per window */
	uint8_t in_kernel, after_syscall;	/* the last block was the kernel's; ended in syscall */
	int32_t stay_label;			/* the current stay's label; -1: not counted */
	uint8_t stay_unnamed;			/* a syscall's stay, its function not seen yet */
	uint64_t stay_insns;			/* its kernel instructions so far */
	uint32_t stay_open, stay_all;		/* the windows open when it began (own, all-vCPU) */
	uint32_t stay_gen[MM_MAX_WINDOWS], stay_all_gen[MM_MAX_WINDOWS];
	uint64_t (*stay_pending[MM_MAX_WINDOWS])[2];	/* per label: calls, insns */
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
	int32_t name;				/* stays=: the syscall it names, -1 none, -2 not known yet */
};

/* stays=: where a stay begins, an offset range from _text with its label. */
struct entry {
	uint64_t offset, size;
	int32_t label;
	char type;				/* A: the 64-bit syscall entry, S: a syscall's, E: other */
};

#define MAX_LABELS 4096
#define MAX_ENTRIES 256
#define TEXT_ALIGN 0x200000ULL			/* KASLR moves the kernel by 2 MiB steps */
#define LABEL_OTHER 0				/* a stay entered nowhere PATH names */

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
static gboolean by_block, stays;		/* blocks=on, stays=PATH */
static char *labels[MAX_LABELS];
static int n_labels;
static struct entry entries[MAX_ENTRIES];
static int n_entries;
static GHashTable *names;			/* stays=: function offset -> label + 1 */
static uint64_t anchor;				/* the 64-bit syscall entry's offset */
static uint64_t text_base;			/* this boot's _text, once found */
static uint32_t all_gen[MM_MAX_WINDOWS];	/* windows over every vCPU begun */
static uint64_t (*stay_sums)[MM_MAX_WINDOWS][2];	/* per label and window: calls, insns */

#include "events.h"

/* stays=: a label's index, added when new (at load, one thread). */
static int label_index(const char *label)
{
	for (int l = 0; l < n_labels; l++)
		if (!strcmp(labels[l], label))
			return l;
	if (n_labels == MAX_LABELS)
		return -1;
	labels[n_labels] = g_strdup(label);
	return n_labels++;
}

/*
 * stays=PATH: one line per place a stay is named by, offsets from _text in
 * hex: "A|S|E OFFSET SIZE LABEL" an entry (A the 64-bit syscall entry, the
 * anchor; S another syscall entry; E an exception's or interrupt's),
 * "N OFFSET LABEL" a function that names a syscall's stay.  0 on success.
 */
static int read_stays(const char *path)
{
	char line[512], type, label[256];
	unsigned long long offset, size;
	FILE *f = fopen(path, "r");
	int anchored = 0;
	if (!f)
		return -1;
	names = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
	label_index("other");
	while (fgets(line, sizeof(line), f)) {
		uint64_t *key;
		int l;
		if (sscanf(line, "N %llx %255s", &offset, label) == 2) {
			if ((l = label_index(label)) < 0)
				break;
			key = g_new(uint64_t, 1);
			*key = offset;
			g_hash_table_insert(names, key, GINT_TO_POINTER(l + 1));
		} else if (sscanf(line, "%c %llx %llx %255s", &type, &offset, &size, label) == 4 &&
			   strchr("ASE", type) && n_entries < MAX_ENTRIES &&
			   (l = label_index(label)) >= 0) {
			entries[n_entries++] = (struct entry){ offset, size, l, type };
			if (type == 'A') {
				anchor = offset;
				anchored = 1;
			}
		} else {
			break;
		}
	}
	const int bad = !feof(f) || !anchored;
	fclose(f);
	return bad ? -1 : 0;
}

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

/* A stay's label by where its first block starts (LABEL_OTHER: no entry PATH names). */
static int32_t entry_label(uint64_t vaddr, char *type)
{
	const uint64_t offset = vaddr - text_base;
	for (int i = 0; i < n_entries; i++)
		if (offset - entries[i].offset < entries[i].size) {
			*type = entries[i].type;
			return entries[i].label;
		}
	*type = 'E';
	return LABEL_OTHER;
}

/* A kernel block after a user block that ended in `syscall` is the syscall entry. */
static void find_text(uint64_t vaddr)
{
	const uint64_t text = vaddr - anchor;
	if (!(text & (TEXT_ALIGN - 1)))
		__atomic_store_n(&text_base, text, __ATOMIC_RELAXED);
}

static void begin_stay(struct vcpu *v, struct block *b)
{
	char type = 'E';
	if (!__atomic_load_n(&text_base, __ATOMIC_RELAXED) && v->after_syscall)
		find_text(b->vaddr);
	v->in_kernel = 1;
	v->stay_insns = 0;
	v->stay_label = __atomic_load_n(&text_base, __ATOMIC_RELAXED) ?
		entry_label(b->vaddr, &type) : -1;	/* before _text is known: not counted */
	v->stay_unnamed = type == 'A' || type == 'S';
	v->stay_open = v->open;
	memcpy(v->stay_gen, v->gen, sizeof(v->gen));
	if (events)
		events_stay_begin((unsigned int)(v - vcpus));
	v->stay_all = 0;
	if (!inline_counts) {		/* one vCPU: its windows over every vCPU are its own */
		g_mutex_lock(&lock);
		v->stay_all = all_open;
		memcpy(v->stay_all_gen, all_gen, sizeof(all_gen));
		g_mutex_unlock(&lock);
	}
}

/* The label a block names a syscall's stay with, when it starts a syscall's function. */
static int32_t block_name(struct block *b)
{
	int32_t name = __atomic_load_n(&b->name, __ATOMIC_RELAXED);
	if (name == -2) {
		const uint64_t offset = b->vaddr - text_base;
		name = GPOINTER_TO_INT(g_hash_table_lookup(names, &offset)) - 1;
		__atomic_store_n(&b->name, name, __ATOMIC_RELAXED);
	}
	return name;
}

#include "calls.h"

static void stay_block(struct vcpu *v, struct block *b)
{
	if (!v->in_kernel)
		begin_stay(v, b);
	v->stay_insns += b->n_insns;
	if (v->stay_unnamed && v->stay_label >= 0) {
		const int32_t name = block_name(b);
		if (name >= 0) {
			v->stay_label = name;
			v->stay_unnamed = 0;
		}
	}
}

/* A user block ends the stay: one call in each window open since it began. */
static void end_stay(struct vcpu *v)
{
	const int32_t l = v->stay_label;
	v->in_kernel = 0;
	if (l < 0)
		return;
	for (uint32_t own = v->stay_open & v->open; own; own &= own - 1) {
		const int w = __builtin_ctz(own);
		if (v->gen[w] != v->stay_gen[w])
			continue;
		if (!v->stay_pending[w] && !(v->stay_pending[w] = calloc(MAX_LABELS, 16)))
			abort();
		v->stay_pending[w][l][0]++;
		v->stay_pending[w][l][1] += v->stay_insns;
		if (events)
			events_stay_end((unsigned int)(v - vcpus), l, (unsigned int)w, TRUE);
	}
	if (!v->stay_all)
		return;
	g_mutex_lock(&lock);
	for (uint32_t all = v->stay_all & all_open; all; all &= all - 1) {
		const int w = __builtin_ctz(all);
		if (all_gen[w] == v->stay_all_gen[w]) {
			stay_sums[l][w][0]++;
			stay_sums[l][w][1] += v->stay_insns;
			if (events)
				events_stay_end((unsigned int)(v - vcpus), l, (unsigned int)w, FALSE);
		}
	}
	g_mutex_unlock(&lock);
}

/* Window w ended on `v`: its pending stays into the sums (`commit`, under `lock`) or dropped. */
static void settle_stays(struct vcpu *v, unsigned w, gboolean commit)
{
	if (events && stays)
		events_stay_settle((unsigned int)(v - vcpus), w, commit);
	if (!v->stay_pending[w])
		return;
	for (int l = 0; commit && l < n_labels; l++)
		for (int i = 0; i < 2; i++)
			stay_sums[l][w][i] += v->stay_pending[w][l][i];
	memset(v->stay_pending[w], 0, (size_t)n_labels * 16);
}

/* stays=: a user block counts on its vCPU and ends the stay it follows. */
static void count_user_block(unsigned int vcpu, void *udata)
{
	uintptr_t packed = (uintptr_t)udata;
	struct vcpu *v = &vcpus[vcpu];
	if (calls)
		calls_user(vcpu);
	if (v->in_kernel)
		end_stay(v);
	v->after_syscall = packed & 1;
	v->insns[USER] += packed >> 1;
	count_all(USER, packed >> 1, NULL);
}

/* blocks=on or stays=: a kernel block counts on its vCPU, into its stay and,
 * pending, into every window open there. */
static void count_kernel_block(unsigned int vcpu, void *udata)
{
	struct block *b = udata;
	struct vcpu *v = &vcpus[vcpu];
	const uint32_t slot = (uint32_t)(b - blocks);
	if (calls)
		calls_block(vcpu, b);
	v->insns[KERNEL] += b->n_insns;
	if (!inline_counts)
		count_all(KERNEL, b->n_insns, by_block ? b : NULL);
	if (stays)
		stay_block(v, b);
	for (uint32_t open = by_block ? v->open : 0; open; open &= open - 1) {
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
	if (calls)
		calls_settle(v, w, commit);
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
		b->name = -2;
		g_hash_table_insert(block_slots, &b->key, GUINT_TO_POINTER(n_blocks));
	} else {
		blocks_dropped++;
	}
	g_mutex_unlock(&lock);
	return b;
}

/* The record's stays (under `lock`): per window, {label: [calls, insns]}; then afresh. */
static void write_stays(void)
{
	fputs("], \"stays\": [", out);
	for (int w = 0; w < MM_MAX_WINDOWS; w++) {
		const char *sep = "";
		fputs(w ? ", {" : "{", out);
		for (int l = 0; l < n_labels; l++) {
			if (!stay_sums[l][w][0])
				continue;
			fprintf(out, "%s\"%s\": [%" PRIu64 ", %" PRIu64 "]", sep, labels[l],
				stay_sums[l][w][0], stay_sums[l][w][1]);
			sep = ", ";
		}
		fputs("}", out);
	}
	memset(stay_sums, 0, sizeof(*stay_sums) * (size_t)n_labels);
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
	if (stays)
		write_stays();
	if (events)
		events_write();
	if (events && stays)
		events_stay_write();
	fputs("]}\n", out);
	fflush(out);
	memset(sums, 0, sizeof(sums));
	unmatched = 0;
	if (by_block && !strcmp(kind, "warmup"))	/* blocks sum the measured samples only */
		for (uint32_t i = 0; i < n_blocks; i++)
			memset(blocks[i].insns, 0, sizeof(blocks[i].insns));
	if (calls && !strcmp(kind, "warmup"))
		calls_reset();
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
		settle_stays(v, w, TRUE);
		if (events)
			events_end((unsigned int)(v - vcpus), w);
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
	if (events)
		events_begin_all(w);
	all_used |= 1u << w;
	all_gen[w]++;
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
		if (events)
			events_end_all(w);
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
		if (events)
			events_begin(vcpu, w);
		if (calls)
			calls_begin(vcpu, w);
		settle_blocks(v, w, FALSE);	/* a window begun here before never ended here */
		settle_stays(v, w, FALSE);
		v->gen[w]++;
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

/* Does the block's last instruction enter the kernel by `syscall` (0f 05)? */
static int ends_in_syscall(struct qemu_plugin_tb *tb, size_t n)
{
	struct qemu_plugin_insn *last = qemu_plugin_tb_get_insn(tb, n - 1);
	const uint8_t *b = qemu_plugin_insn_data(last);
	return qemu_plugin_insn_size(last) == 2 && b[0] == 0x0f && b[1] == 0x05;
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	const size_t n = qemu_plugin_tb_n_insns(tb);
	const int side = qemu_plugin_tb_vaddr(tb) >= KERNEL_HALF ? KERNEL : USER;
	struct block *b = NULL;
	(void)id;
	if (blocks && side == KERNEL && (b = block_at(qemu_plugin_tb_vaddr(tb), n)))
		qemu_plugin_register_vcpu_tb_exec_cb(tb, count_kernel_block, QEMU_PLUGIN_CB_NO_REGS, b);
	else if (stays && side == USER)
		qemu_plugin_register_vcpu_tb_exec_cb(tb, count_user_block, QEMU_PLUGIN_CB_NO_REGS,
						     (void *)(uintptr_t)(n << 1 | ends_in_syscall(tb, n)));
	else if (inline_counts)
		qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64,
							 &vcpus[0].insns[side], n);
	else
		qemu_plugin_register_vcpu_tb_exec_cb(tb, count_block, QEMU_PLUGIN_CB_NO_REGS,
						     (void *)(uintptr_t)(n << 1 | side));
	if (calls && b)
		calls_trans(tb, b);
	if (events)
		events_trans(tb, side, n);
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
	for (int w = 0; by_block && w < MM_MAX_WINDOWS; w++) {
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
	if (calls)
		write_calls();
	fprintf(out, "{\"kind\": \"exit\", \"kernel\": %" PRIu64 ", \"user\": %" PRIu64 "}\n",
		total[KERNEL], total[USER]);
	fclose(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
					   int argc, char **argv)
{
	const char *path = NULL, *mode = NULL, *stays_path = NULL, *calls_path = NULL;
	for (int i = 0; i < argc; i++) {
		if (g_str_has_prefix(argv[i], "out="))
			path = argv[i] + 4;
		else if (g_str_has_prefix(argv[i], "mode="))
			mode = argv[i] + 5;
		else if (!strcmp(argv[i], "blocks=on"))
			by_block = TRUE;
		else if (events_arg(argv[i]))
			;
		else if (g_str_has_prefix(argv[i], "stays="))
			stays_path = argv[i] + 6;
		else if (g_str_has_prefix(argv[i], "calls="))
			calls_path = argv[i] + 6;
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
	if (stays_path && read_stays(stays_path)) {
		fprintf(stderr, "mmlab insns plugin: stays=%s: unreadable, or a line is not "
			"'A|S|E OFFSET SIZE LABEL' or 'N OFFSET LABEL', or no A line\n", stays_path);
		return -1;
	}
	stays = stays_path != NULL;
	if (by_block || stays) {
		blocks = calloc(MAX_BLOCKS, sizeof(*blocks));
		block_slots = g_hash_table_new(g_int64_hash, g_int64_equal);
		stay_sums = stays ? calloc(MAX_LABELS, sizeof(*stay_sums)) : NULL;
		if (!blocks || (stays && !stay_sums)) {
			fprintf(stderr, "mmlab insns plugin: no memory for blocks=on or stays=\n");
			return -1;
		}
	}
	if (events && events_init(n_vcpus, stays)) {
		fprintf(stderr, "mmlab insns plugin: no memory for events=\n");
		return -1;
	}
	if (calls_path && (!stays || calls_install(calls_path))) {
		fprintf(stderr, "mmlab insns plugin: calls=%s: needs stays=, and "
			"lines 'F OFFSET' or 'T|X OFFSET SIZE'\n", calls_path);
		return -1;
	}
	fprintf(out, "{\"kind\": \"start\", \"vcpus\": %d, \"mode\": \"%s\"}\n", n_vcpus,
		inline_counts ? "inline" : "callback");
	fflush(out);
	qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
	qemu_plugin_register_atexit_cb(id, at_exit, NULL);
	return 0;
}
