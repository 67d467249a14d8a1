/*
 * events.h - what the guest did besides executing instructions (events=on),
 * counted per window like the instructions: part of insns.c, which includes
 * it and calls its hooks (events_trans, events_begin/end, events_write).
 *
 * An instruction count hides a cost that lies elsewhere: a path that sends
 * more IPIs, flushes more TLB entries, takes more locked operations or
 * moves more memory can run the same instructions.  Under TCG every one of
 * these is an architectural event the plugin sees, so each is counted
 * exactly, kernel and user apart:
 *
 * - loads, stores and their bytes: one memory callback per access (a
 *   locked read-modify-write is a load and a store);
 * - locked_insns: instructions with a LOCK prefix (f0), and xchg with a
 *   memory operand (86, 87), which locks without one;
 * - invlpgs (0f 01 /7), invpcids (66 0f 38 82) and cr3_writes (0f 22 /3):
 *   the TLB invalidations an x86-64 kernel issues (a CR3 write flushes the
 *   non-global entries unless its no-flush bit is set: a v1 plugin cannot
 *   read the register, so every write counts);
 * - ipis: stores to the local APIC's interrupt command register (physical
 *   0xfee00300, xAPIC mode: the only one QEMU 7.2's TCG offers, whose CPU
 *   models have no x2apic flag); one write may address several CPUs;
 * - string_insns: rep-prefixed movs, stos, lods, cmps and scas, once per
 *   execution, and string_bytes: the bytes they store (movs, stos) or load
 *   (lods, scas, and both operands of cmps);
 * - retired_insns: instructions as a CPU's counter retires them, a rep
 *   string instruction once.  TCG ends a block at a rep string instruction
 *   and runs each further iteration by entering a block of that one
 *   instruction at its own address, so insns.c's count (today's metric)
 *   counts it once per iteration.  Here a block that starts at the rep
 *   instruction its side's previous block ended in is that next iteration,
 *   and does not count again; an interrupt or fault in the middle of a
 *   kernel rep instruction makes its rest count once more (a user one's
 *   side is untouched by the kernel blocks in between).
 *
 * Per block: locked, TLB and string instructions and retired instructions
 * count when the block is entered, whole, as insns.c counts instructions;
 * memory accesses count one by one.  Every block and every memory access
 * takes a callback: events cost time (make bench, events part), so mmlab
 * asks for them only when a profile names an event metric, and for the
 * block events alone (events=blocks: no memory callbacks, and no loads,
 * stores, bytes or IPIs in the record) when it names none of the rest.  With several
 * vCPUs a window over every vCPU gets each event atomically, as insns.c's
 * count_all.  Each sample record then carries "events": per window,
 * {event: [kernel, user]}.
 *
 * With stays= too, each stay (a syscall, a fault, ...: insns.c) gets the
 * kernel events its vCPU counted from its first block to the user block
 * that ends it, pending and settled with the stay's own counts, so the
 * stays' events of a window are exactly those inside its counted stays.
 * The record then carries "stay_events": per window, {label: {event: n}}.
 */
#ifndef MMLAB_QEMU_PLUGIN_EVENTS_H
#define MMLAB_QEMU_PLUGIN_EVENTS_H

enum {
	EV_LOADS, EV_STORES, EV_LOAD_BYTES, EV_STORE_BYTES, EV_LOCKED, EV_INVLPG, EV_INVPCID,
	EV_CR3, EV_IPIS, EV_STRING, EV_STRING_BYTES, EV_RETIRED, N_EVENTS
};
static const char *const event_names[N_EVENTS] = {
	"loads", "stores", "load_bytes", "store_bytes", "locked_insns", "invlpgs", "invpcids",
	"cr3_writes", "ipis", "string_insns", "string_bytes", "retired_insns"
};

#define APIC_ICR_LOW 0xfee00300ULL
/* The events a memory callback counts: not counted (nor written) with events=blocks. */
#define EV_MEMORY (1u << EV_LOADS | 1u << EV_STORES | 1u << EV_LOAD_BYTES | \
		   1u << EV_STORE_BYTES | 1u << EV_IPIS | 1u << EV_STRING_BYTES)

/* One vCPU's events since boot, per side, and at each open window's begin. */
struct ev_vcpu {
	uint64_t n[2][N_EVENTS];
	uint64_t start[MM_MAX_WINDOWS][2][N_EVENTS];
	uint64_t last_rep[2];		/* the rep string instruction the side's last block ended in */
} __attribute__((aligned(64)));

/*
 * A translated block's events, the same for every block that has them: kept
 * once (`ev_kinds`), so translating again allocates nothing.
 */
struct ev_block {
	uint64_t rep;			/* the rep string instruction it ends in; 0: none */
	uint32_t n_insns;
	uint8_t side, starts_rep;	/* starts_rep: it is that instruction alone */
	uint16_t locked, invlpg, invpcid, cr3;
};

/* A memory access's udata: its side, and which of its bytes are a string's. */
enum { EV_STRING_STORES = 2, EV_STRING_LOADS = 4 };

static gboolean events, ev_memory;		/* events=blocks, events=on */
static struct ev_vcpu *ev_vcpus;
static uint64_t ev_sums[MM_MAX_WINDOWS][2][N_EVENTS];	/* under `lock` */
static uint64_t ev_all[MM_MAX_WINDOWS][2][N_EVENTS];	/* a window over every vCPU's */
static GHashTable *ev_kinds;				/* struct ev_block, under `lock` */

/* stays=: per vCPU, its kernel events when its stay began, and its windows'
 * pending stays' events per label; the settled ones per label and window. */
struct ev_stays {
	uint64_t start[N_EVENTS];
	uint64_t (*pending[MM_MAX_WINDOWS])[N_EVENTS];
};
static struct ev_stays *ev_stay_vcpus;
static uint64_t (*ev_stay_sums)[MM_MAX_WINDOWS][N_EVENTS];	/* under `lock` */

static void ev_add(struct ev_vcpu *v, int side, int e, uint64_t k)
{
	v->n[side][e] += k;
	if (inline_counts)		/* one vCPU: its windows over every vCPU are its own */
		return;
	for (uint32_t open = __atomic_load_n(&all_open, __ATOMIC_RELAXED); open; open &= open - 1)
		__atomic_fetch_add(&ev_all[__builtin_ctz(open)][side][e], k, __ATOMIC_RELAXED);
}

static void ev_block_entered(unsigned int vcpu, void *udata)
{
	const struct ev_block *b = udata;
	struct ev_vcpu *v = &ev_vcpus[vcpu];
	const int again = b->starts_rep && v->last_rep[b->side] == b->rep;
	v->last_rep[b->side] = b->rep;
	if (again)			/* the rep instruction's next iteration */
		return;
	ev_add(v, b->side, EV_RETIRED, b->n_insns);
	const uint16_t per_block[][2] = { { EV_LOCKED, b->locked }, { EV_INVLPG, b->invlpg },
					 { EV_INVPCID, b->invpcid }, { EV_CR3, b->cr3 },
					 { EV_STRING, b->rep != 0 } };
	for (size_t i = 0; i < sizeof(per_block) / sizeof(per_block[0]); i++)
		if (per_block[i][1])
			ev_add(v, b->side, per_block[i][0], per_block[i][1]);
}

/* Is a kernel store of 4 bytes at `vaddr` a write of the xAPIC's ICR (an IPI sent)? */
static int sends_ipi(qemu_plugin_meminfo_t info, uint64_t vaddr, unsigned int bytes)
{
	struct qemu_plugin_hwaddr *hw;
	if (bytes != 4 || (vaddr & 0xfff) != (APIC_ICR_LOW & 0xfff))
		return 0;
	hw = qemu_plugin_get_hwaddr(info, vaddr);
	return hw && qemu_plugin_hwaddr_is_io(hw) && qemu_plugin_hwaddr_phys_addr(hw) == APIC_ICR_LOW;
}

static void ev_access(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *udata)
{
	const uintptr_t flags = (uintptr_t)udata;
	const int side = (int)(flags & 1);
	const unsigned int bytes = 1u << qemu_plugin_mem_size_shift(info);
	struct ev_vcpu *v = &ev_vcpus[vcpu];
	if (qemu_plugin_mem_is_store(info)) {
		ev_add(v, side, EV_STORES, 1);
		ev_add(v, side, EV_STORE_BYTES, bytes);
		if (flags & EV_STRING_STORES)
			ev_add(v, side, EV_STRING_BYTES, bytes);
		if (side == KERNEL && sends_ipi(info, vaddr, bytes))
			ev_add(v, side, EV_IPIS, 1);
	} else {
		ev_add(v, side, EV_LOADS, 1);
		ev_add(v, side, EV_LOAD_BYTES, bytes);
		if (flags & EV_STRING_LOADS)
			ev_add(v, side, EV_STRING_BYTES, bytes);
	}
}

/*
 * One instruction's bytes, decoded as far as its events need: its legacy
 * and REX prefixes, then its opcode.  Sets the block's counts and returns
 * its accesses' string flags (0: not a rep string instruction).
 */
static uintptr_t ev_decode(const uint8_t *p, size_t size, struct ev_block *b)
{
	int lock = 0, rep = 0, opsize = 0;
	size_t i = 0;
	for (; i < size && p[i] && strchr("\xf0\xf2\xf3\x2e\x36\x3e\x26\x64\x65\x66\x67", p[i]); i++) {
		lock |= p[i] == 0xf0;
		rep |= p[i] == 0xf2 || p[i] == 0xf3;
		opsize |= p[i] == 0x66;
	}
	if (i < size && (p[i] & 0xf0) == 0x40)		/* REX */
		i++;
	if (i >= size)
		return 0;
	const uint8_t op = p[i], op2 = i + 1 < size ? p[i + 1] : 0, op3 = i + 2 < size ? p[i + 2] : 0;
	const uint8_t modrm = op == 0x0f ? op3 : op2;
	b->locked += lock || ((op == 0x86 || op == 0x87) && modrm >> 6 != 3);
	if (op == 0x0f && op2 == 0x01 && i + 2 < size)
		b->invlpg += modrm >> 6 != 3 && (modrm >> 3 & 7) == 7;
	b->cr3 += op == 0x0f && op2 == 0x22 && i + 2 < size && (modrm >> 3 & 7) == 3;
	b->invpcid += opsize && op == 0x0f && op2 == 0x38 && op3 == 0x82;
	if (!rep || op < 0xa4 || op > 0xaf || op == 0xa8 || op == 0xa9)	/* a8, a9: test */
		return 0;
	return op <= 0xa5 || op == 0xaa || op == 0xab ? EV_STRING_STORES : EV_STRING_LOADS;
}

static guint ev_hash(gconstpointer key)
{
	const struct ev_block *b = key;
	return g_int64_hash(&b->rep) ^ (b->n_insns * 2654435761u) ^
		(guint)(b->side | b->starts_rep << 1 | b->locked << 2 | b->invlpg << 10 |
			b->invpcid << 18 | b->cr3 << 24);
}

static gboolean ev_equal(gconstpointer a, gconstpointer b)
{
	return !memcmp(a, b, sizeof(struct ev_block));
}

/* The block's kept events: found, or kept now. */
static struct ev_block *ev_kept(const struct ev_block *b)
{
	g_mutex_lock(&lock);
	struct ev_block *kept = g_hash_table_lookup(ev_kinds, b);
	if (!kept) {
		kept = g_memdup2(b, sizeof(*b));
		g_hash_table_add(ev_kinds, kept);
	}
	g_mutex_unlock(&lock);
	return kept;
}

/* A block translated: a callback on entering it and on each of its memory accesses. */
static void events_trans(struct qemu_plugin_tb *tb, int side, size_t n)
{
	struct ev_block b;
	memset(&b, 0, sizeof(b));	/* the key is compared whole, padding too */
	b.n_insns = (uint32_t)n;
	b.side = (uint8_t)side;
	for (size_t i = 0; i < n; i++) {
		struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
		const uintptr_t string = ev_decode(qemu_plugin_insn_data(insn),
						   qemu_plugin_insn_size(insn), &b);
		if (string) {		/* it ends the block */
			b.rep = qemu_plugin_insn_vaddr(insn);
			b.starts_rep = i == 0;
		}
		if (ev_memory)
			qemu_plugin_register_vcpu_mem_cb(insn, ev_access, QEMU_PLUGIN_CB_NO_REGS,
							 QEMU_PLUGIN_MEM_RW,
							 (void *)(string | (uintptr_t)side));
	}
	qemu_plugin_register_vcpu_tb_exec_cb(tb, ev_block_entered, QEMU_PLUGIN_CB_NO_REGS,
					     ev_kept(&b));
}

/* Window w begins on `v` (a marker). */
static void events_begin(unsigned int vcpu, unsigned int w)
{
	memcpy(ev_vcpus[vcpu].start[w], ev_vcpus[vcpu].n, sizeof(ev_vcpus[vcpu].n));
}

/* Window w ended on its vCPU (under `lock`): its events into the sums. */
static void events_end(unsigned int vcpu, unsigned int w)
{
	const struct ev_vcpu *v = &ev_vcpus[vcpu];
	for (int side = USER; side <= KERNEL; side++)
		for (int e = 0; e < N_EVENTS; e++)
			ev_sums[w][side][e] += v->n[side][e] - v->start[w][side][e];
}

/* A window over every vCPU begins (under `lock`). */
static void events_begin_all(unsigned int w)
{
	memset(ev_all[w], 0, sizeof(ev_all[w]));
}

/* ... and ends (under `lock`). */
static void events_end_all(unsigned int w)
{
	for (int side = USER; side <= KERNEL; side++)
		for (int e = 0; e < N_EVENTS; e++)
			ev_sums[w][side][e] += __atomic_load_n(&ev_all[w][side][e], __ATOMIC_RELAXED);
}

/* The record's events (under `lock`): per window, {event: [kernel, user]}; then afresh. */
static void events_write(void)
{
	fputs("], \"events\": [", out);
	for (int w = 0; w < MM_MAX_WINDOWS; w++) {
		const char *sep = "";
		fputs(w ? ", {" : "{", out);
		for (int e = 0; e < N_EVENTS; e++) {
			if (!ev_memory && EV_MEMORY & 1u << e)
				continue;
			fprintf(out, "%s\"%s\": [%" PRIu64 ", %" PRIu64 "]", sep, event_names[e],
				ev_sums[w][KERNEL][e], ev_sums[w][USER][e]);
			sep = ", ";
		}
		fputs("}", out);
	}
	memset(ev_sums, 0, sizeof(ev_sums));
}

/* Is `arg` events=on (every event) or events=blocks (no memory callbacks)? */
static int events_arg(const char *arg)
{
	if (strcmp(arg, "events=on") && strcmp(arg, "events=blocks"))
		return 0;
	events = TRUE;
	ev_memory = !strcmp(arg, "events=on");
	return 1;
}

/* A stay begins on `vcpu` (stays=). */
static void events_stay_begin(unsigned int vcpu)
{
	memcpy(ev_stay_vcpus[vcpu].start, ev_vcpus[vcpu].n[KERNEL], sizeof(ev_vcpus[vcpu].n[KERNEL]));
}

/* The stay on `vcpu`, label `l`, ended in window w: its events pending on
 * the vCPU (`pending`) or into the sums (a window over every vCPU, under `lock`). */
static void events_stay_end(unsigned int vcpu, int32_t l, unsigned int w, gboolean pending)
{
	struct ev_stays *v = &ev_stay_vcpus[vcpu];
	uint64_t *into = ev_stay_sums[l][w];
	if (pending) {
		if (!v->pending[w] && !(v->pending[w] = calloc(MAX_LABELS, sizeof(*v->pending[w]))))
			abort();
		into = v->pending[w][l];
	}
	for (int e = 0; e < N_EVENTS; e++)
		into[e] += ev_vcpus[vcpu].n[KERNEL][e] - v->start[e];
}

/* Window w ended on `vcpu`: its pending stays' events into the sums (`commit`, under `lock`). */
static void events_stay_settle(unsigned int vcpu, unsigned int w, gboolean commit)
{
	struct ev_stays *v = &ev_stay_vcpus[vcpu];
	if (!v->pending[w])
		return;
	for (int l = 0; commit && l < n_labels; l++)
		for (int e = 0; e < N_EVENTS; e++)
			ev_stay_sums[l][w][e] += v->pending[w][l][e];
	memset(v->pending[w], 0, sizeof(*v->pending[w]) * (size_t)n_labels);
}

/* The record's stays' events (under `lock`): per window, {label: {event: n}}; then afresh. */
static void events_stay_write(void)
{
	fputs("], \"stay_events\": [", out);
	for (int w = 0; w < MM_MAX_WINDOWS; w++) {
		const char *sep = "";
		fputs(w ? ", {" : "{", out);
		for (int l = 0; l < n_labels; l++) {
			if (!ev_stay_sums[l][w][EV_RETIRED])	/* no stay of it: it retired nothing */
				continue;
			fprintf(out, "%s\"%s\": {", sep, labels[l]);
			for (int e = 0, first = 1; e < N_EVENTS; e++)
				if (ev_memory || !(EV_MEMORY & 1u << e)) {
					fprintf(out, "%s\"%s\": %" PRIu64, first ? "" : ", ",
						event_names[e], ev_stay_sums[l][w][e]);
					first = 0;
				}
			fputs("}", out);
			sep = ", ";
		}
		fputs("}", out);
	}
	memset(ev_stay_sums, 0, sizeof(*ev_stay_sums) * (size_t)n_labels);
}

/* events=, at install (after stays=): 0 on success. */
static int events_init(int n, gboolean with_stays)
{
	ev_vcpus = aligned_alloc(64, sizeof(*ev_vcpus) * (size_t)n);
	ev_kinds = g_hash_table_new(ev_hash, ev_equal);
	if (!ev_vcpus)
		return -1;
	memset(ev_vcpus, 0, sizeof(*ev_vcpus) * (size_t)n);
	if (!with_stays)
		return 0;
	ev_stay_vcpus = calloc((size_t)n, sizeof(*ev_stay_vcpus));
	ev_stay_sums = calloc(MAX_LABELS, sizeof(*ev_stay_sums));
	return ev_stay_vcpus && ev_stay_sums ? 0 : -1;
}

#endif
