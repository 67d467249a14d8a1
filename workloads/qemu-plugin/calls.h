/*
 * calls.h - inclusive kernel instructions by function (calls=PATH, with
 * stays=PATH): a function and everything it calls.
 *
 * Included by insns.c, whose blocks, vCPUs, windows and this boot's _text
 * (found by stays=) it uses.  Per vCPU a shadow call stack follows the
 * kernel's calls: a kernel block whose last instruction is a call (E8
 * rel32, FF /2) pushes a frame (the return address, the running kernel
 * count after the block); the next block entered is the callee's entry.  A
 * block that starts at the return address of a frame (searched from the
 * top, CALL_SEARCH deep) pops down to it, and each popped frame's entry
 * gets (count now - count at push) and one call, under its path's label,
 * pending in every window open on the vCPU like the blocks.  A frame's path
 * is the one of the frame below it; a frame that has none takes the
 * syscall its entry names (__x64_sys_NAME, as stays= names a stay), or,
 * in a stay that is no syscall's, the stay's label (fault, interrupt, ...):
 * so a syscall's path holds its entry function and what that called, not
 * the entry and exit code around it.  Returns are found by where they land,
 * not by the ret opcode, so returns through the return thunk count too.
 *
 * PATH's lines (offsets from _text, hex), from the kernel's symbols:
 *   "F OFFSET"       a function starts here,
 *   "T OFFSET SIZE"  a thunk (retpoline, return thunk): its blocks are
 *                    passed through, so an indirect call's callee is the
 *                    first block after the thunk, and its own calls and
 *                    jumps push nothing,
 *   "X OFFSET SIZE"  the context switch (__switch_to_asm): the stack is
 *                    another task's from here.
 * A function start entered neither by a call nor by a return (a tail call:
 * jmp to another function) pushes a frame that returns with the frame
 * below it.  Recursion counts once: a popped frame whose entry is also in
 * a deeper frame adds nothing (within one interrupt level, below).  Entry
 * code (stays=' A, S, E ranges) never pushes a tail frame.
 *
 * An interrupt taken in the kernel is no call of the function it lands in:
 * a hardware interrupt or system vector (stays=' "interrupt" entries, and
 * the NMI's) opens an interrupt level at the depth it found, and the
 * handler's frames go above it under the path "interrupt".  The level ends
 * at the block after the next `iretq` (not iret_to_self's, which returns
 * to the block after it; an exception inside a handler, which is rare,
 * ends it early), and its instructions are taken out of every frame below,
 * as a task's time switched out is: per vCPU, frames and windows count on
 * an own clock, the kernel count less the instructions of the interrupt
 * levels ended so far (a level's own excludes the levels nested in it).
 * Each level's instructions count once, beside the calls, per window under
 * the stay it interrupted ("interrupts" in the calls line), so the stays'
 * totals (which include the interrupts, stays=) are still accounted for.
 * An interrupt's entry block is one reached neither from other entry code
 * (irq_entries_start's jump to asm_common_interrupt) nor by a return (into
 * its stub), while the vCPU is in the kernel: one from user mode is a stay
 * of its own.  Faults and the other exceptions are raised by the code they
 * land in (a copy_from_user's fault, a WARN's ud2): their handlers stay
 * inside the faulting function's count, as its callees.
 *
 * A context switch parks the task's stack (PARKED per vCPU), its open
 * interrupt levels with it, and the next task starts with an empty one.  Every task comes back through the same
 * return from __switch_to_asm and then returns to where it called the
 * scheduler from, so a parked stack whose top frames the resumed task's
 * returns land on, and that alone matched the most of them (OWN_FRAMES at
 * least), is that task's: it is taken back and popped as far as they went.
 * The first two returns (into __schedule, then into schedule() or another
 * wrapper) are every sleeping task's, so a match needs the third, the
 * task's own call of the scheduler: with two, a kernel thread or another
 * process asleep since before the window (no parked stack of its own) took
 * the one parked stack that had slept through schedule(), and dropped it
 * on its way to user mode; the owner's syscall then counted under no path
 * (seed 004's patched move_pages read 0 for __x64_sys_move_pages).  Its
 * frames' starts move on by the time the task was away, so a function
 * counts what its own task ran inside it, not what other tasks ran while it
 * was switched out (a stay counts those), and a stack taken back wrongly
 * (another task's, alike up to where they matched) adds little.  A frame
 * older than a window counts from the window's start.
 *
 * Needs stays= (the stays' labels and the block table); blocks=on is not
 * needed, so a counting pass follows calls beside its stays without keeping
 * every block's counts.
 *
 * Calls are followed only while a window is open on the vCPU (following
 * every kernel block of a boot doubled a counting boot's time): a task
 * switched out before the window opened has no parked stack, and its
 * functions' frames from before then are not counted.  The stack is
 * dropped (not counted) when the vCPU runs user code, and frames are
 * dropped past CALL_DEPTH and when a vCPU has more parked stacks than
 * PARKED (the oldest); the frames dropped inside a window are reported
 * ("cut"), and those past CALL_DEPTH ("overflow").
 */

#define CALL_DEPTH 128
#define CALL_SEARCH 32
#define NO_ENTRY UINT32_MAX
#define MAX_RANGES 256
#define PLAIN 1					/* a block that starts nothing PATH names */
#define PARKED 8
#define OWN_FRAMES 3				/* returns a resumed task matches to take a stack */
#define IRQ_DEPTH 8				/* interrupt levels nested in one another */
#define IRQ_SLOT NO_ENTRY			/* the key slot of a stay's interrupt levels */

struct frame {
	uint64_t ret;				/* the return address the frame ends at */
	uint64_t start;				/* the vCPU's kernel count when it began */
	uint32_t entry;				/* the callee's first block (slot), or NO_ENTRY */
	int32_t path;				/* the path's label, -1 none */
	uint8_t tail;				/* entered by a jump: returns with the frame below */
};

/* An interrupt taken in the kernel: its handler is no call of the interrupted function. */
struct level {
	uint64_t open;				/* the own count when it was taken */
	int base;				/* the depth it found: the handler's frames go above */
	int32_t label;				/* its entry's label: the handler's path */
	int32_t stay;				/* the stay it interrupted */
	uint8_t entering;			/* it came between a call and the callee's entry */
};

/* A switched-out task's stack. */
struct parked {
	struct frame f[CALL_DEPTH];
	struct level l[IRQ_DEPTH];
	int levels;
	int depth;				/* 0: a free place */
	int matched;				/* resuming: its top frames the returns landed on */
	uint64_t when;				/* parked at this count: the oldest goes first */
};

struct call_stack {
	struct frame f[CALL_DEPTH];
	int depth;
	struct level l[IRQ_DEPTH];
	int levels;
	uint64_t excluded;			/* kernel instructions in ended interrupt levels */
	uint64_t own_start[MM_MAX_WINDOWS];	/* its own windows' start on the own clock */
	uint8_t entering;			/* the top frame's callee is the next block */
	uint8_t in_entry;			/* the last block was entry code */
	uint64_t iret_end;			/* the last block ended in iretq: its end */
	uint8_t switching, resuming;		/* in __switch_to_asm; after it, task not known */
	uint8_t following;			/* a window is open here: calls are followed */
	uint64_t resumed;			/* the count when the last switch ended */
	uint32_t all_seen[MM_MAX_WINDOWS];	/* the all-vCPU windows' all_gen seen here */
	uint64_t all_start[MM_MAX_WINDOWS];	/* their start in this vCPU's kernel count */
	GHashTable *pending[MM_MAX_WINDOWS];	/* call_key -> insns, calls */
	struct parked parked[PARKED];
} __attribute__((aligned(64)));

/* Per block slot: its last call's return address (0: none), and what it starts. */
struct call_site {
	uint64_t ret;
	uint64_t iret;				/* its end, when its last instruction is iretq */
	int8_t kind;				/* 0 not known yet; PLAIN, 'F', 'T', 'X', 'E', 'I' */
};

struct call_range {
	uint64_t offset, size;
	char type;				/* T or X */
};

static gboolean calls;				/* calls=PATH */
static struct call_stack *call_stacks;
static struct call_site *call_sites;		/* per block slot */
static GHashTable *incl[MM_MAX_WINDOWS];	/* per window, call_key -> insns, calls */
static GHashTable *function_starts;		/* offsets from _text */
static struct call_range call_ranges[MAX_RANGES];
static int n_call_ranges;
static uint64_t frames_cut[MM_MAX_WINDOWS];	/* dropped while the window was open */
static uint64_t frames_overflow;		/* past CALL_DEPTH, in the whole run */
static uint8_t *syscall_labels;			/* per stays= label: a syscall's */
static uint8_t *irq_labels;			/* per stays= label: an interrupt's */

/* calls=PATH: the function starts, thunks and the context switch.  0 on success. */
static int read_calls(const char *path)
{
	char line[128], type;
	unsigned long long offset, size;
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	function_starts = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "F %llx", &offset) == 1) {
			uint64_t *key = g_new(uint64_t, 1);
			*key = offset;
			g_hash_table_add(function_starts, key);
		} else if (sscanf(line, "%c %llx %llx", &type, &offset, &size) == 3 &&
			   (type == 'T' || type == 'X') && n_call_ranges < MAX_RANGES) {
			call_ranges[n_call_ranges++] = (struct call_range){ offset, size, type };
		} else {
			break;
		}
	}
	const int bad = !feof(f);
	fclose(f);
	return bad ? -1 : 0;
}

/* Does `insn` call (E8 rel32, or FF /2), or return from an interrupt (CF, iretq with
 * REX.W), after prefixes (cs for retpolines, REX)?  'C', 'I' or 0. */
static char call_or_iret(struct qemu_plugin_insn *insn)
{
	const uint8_t *b = qemu_plugin_insn_data(insn);
	const size_t n = qemu_plugin_insn_size(insn);
	size_t i = 0;
	while (i < n && (b[i] == 0x2e || b[i] == 0x3e || (b[i] & 0xf0) == 0x40))
		i++;
	if (i < n && (b[i] == 0xe8 || (b[i] == 0xff && i + 1 < n && ((b[i + 1] >> 3) & 7) == 2)))
		return 'C';
	return i < n && b[i] == 0xcf ? 'I' : 0;
}

/* At translation: the block's return address when its last instruction calls, or
 * that it ends in iretq. */
static void calls_trans(struct qemu_plugin_tb *tb, struct block *b)
{
	const size_t n = qemu_plugin_tb_n_insns(tb);
	uint64_t end = qemu_plugin_tb_vaddr(tb);
	for (size_t i = 0; i < n; i++)
		end += qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i));
	const char last = call_or_iret(qemu_plugin_tb_get_insn(tb, n - 1));
	if (last == 'C')
		__atomic_store_n(&call_sites[b - blocks].ret, end, __ATOMIC_RELAXED);
	else if (last == 'I')
		__atomic_store_n(&call_sites[b - blocks].iret, end, __ATOMIC_RELAXED);
}

/* What block `b` starts: a thunk, the switch, an interrupt's entry code ('I'), other
 * entry code, a function, or PLAIN. */
static int8_t site_kind(struct block *b)
{
	struct call_site *s = &call_sites[b - blocks];
	int8_t kind = __atomic_load_n(&s->kind, __ATOMIC_RELAXED);
	if (kind)
		return kind;
	const uint64_t offset = b->vaddr - text_base;
	char type = 0;
	for (int i = 0; i < n_call_ranges && !kind; i++)
		if (offset - call_ranges[i].offset < call_ranges[i].size)
			kind = call_ranges[i].type;
	const int32_t label = kind ? LABEL_OTHER : entry_label(b->vaddr, &type);
	if (label != LABEL_OTHER)
		kind = irq_labels[label] ? 'I' : 'E';
	if (!kind && g_hash_table_contains(function_starts, &offset))
		kind = 'F';
	if (!kind)
		kind = PLAIN;
	__atomic_store_n(&s->kind, kind, __ATOMIC_RELAXED);
	return kind;
}

/* 1 when pushed; past CALL_DEPTH the frame is counted as an overflow and dropped. */
static int push_frame(struct call_stack *cs, uint64_t ret, uint64_t start, uint32_t entry,
		      uint8_t tail)
{
	if (cs->depth == CALL_DEPTH) {
		__atomic_fetch_add(&frames_overflow, 1, __ATOMIC_RELAXED);
		return 0;
	}
	cs->f[cs->depth++] = (struct frame){ ret, start, entry, -1, tail };
	return 1;
}

/* The depth the open interrupt level found (0: none open): frames below are not its. */
static int floor_depth(const struct call_stack *cs)
{
	return cs->levels ? cs->l[cs->levels - 1].base : 0;
}

/* The top frame's entry is `b` (slot): its path, the interrupt's for a handler's first
 * frame, from the frame below, the syscall `b` names, or the stay's when that is no
 * syscall's. */
static void enter(struct vcpu *v, struct call_stack *cs, struct block *b)
{
	struct frame *f = &cs->f[cs->depth - 1];
	const int32_t name = block_name(b);
	f->entry = (uint32_t)(b - blocks);
	if (cs->levels && cs->depth - 1 == floor_depth(cs))
		f->path = cs->l[cs->levels - 1].label;
	else if (cs->depth > 1 && f[-1].path >= 0)
		f->path = f[-1].path;
	else if (name >= 0)
		f->path = name;
	else if (v->in_kernel && v->stay_label >= 0 && !syscall_labels[v->stay_label])
		f->path = v->stay_label;
}

/* An entry slot under a stay's label (-1: none) as one hash key. */
static gpointer call_key(int32_t label, uint32_t slot)
{
	return GSIZE_TO_POINTER((gsize)(label + 2) << 32 | slot);
}

/* `n` instructions and `calls` calls into `table`'s entry for `key`. */
static void add_calls(GHashTable *table, gpointer key, uint64_t n, uint64_t calls)
{
	uint64_t *sum = g_hash_table_lookup(table, key);
	if (!sum) {
		sum = g_new0(uint64_t, 2);
		g_hash_table_insert(table, key, sum);
	}
	sum[0] += n;
	sum[1] += calls;
}

static GHashTable *new_calls_table(void)
{
	return g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
}

/* `key` gets the own instructions since `start` and one call, in the vCPU's open windows
 * (from a window's start when it began later). */
static void add_in_windows(unsigned int vcpu, struct call_stack *cs, gpointer key,
			   uint64_t start, uint64_t now)
{
	struct vcpu *v = &vcpus[vcpu];
	for (uint32_t open = v->open; open; open &= open - 1) {
		const int w = __builtin_ctz(open);
		if (!cs->pending[w])	/* first use: this vCPU's thread only */
			cs->pending[w] = new_calls_table();
		add_calls(cs->pending[w], key, now - MAX(start, cs->own_start[w]), 1);
	}
	uint32_t all = inline_counts ? 0 : __atomic_load_n(&all_open, __ATOMIC_RELAXED);
	if (!all)
		return;
	g_mutex_lock(&lock);
	for (all &= all_open; all; all &= all - 1) {
		const int w = __builtin_ctz(all);
		add_calls(incl[w], key, now - MAX(start, cs->all_start[w]), 1);
	}
	g_mutex_unlock(&lock);
}

/* The base of the interrupt level frame `j` is in (0: none). */
static int level_base(const struct call_stack *cs, int j)
{
	int base = 0;
	for (int k = 0; k < cs->levels && cs->l[k].base <= j; k++)
		base = cs->l[k].base;
	return base;
}

/* A popped frame's entry gets its instructions and a call, in the vCPU's open windows. */
static void credit(unsigned int vcpu, struct call_stack *cs, int j, uint64_t now)
{
	const uint32_t e = cs->f[j].entry;
	if (e == NO_ENTRY)
		return;
	for (int k = level_base(cs, j); k < j; k++)	/* recursion: the deepest frame counts */
		if (cs->f[k].entry != NO_ENTRY && blocks[cs->f[k].entry].vaddr == blocks[e].vaddr)
			return;
	add_in_windows(vcpu, cs, call_key(cs->f[j].path, e), cs->f[j].start, now);
}

/* Several vCPUs: where each window over every vCPU began in this vCPU's count
 * (at its first block inside it), so a frame older than a window counts only
 * its part inside. */
static void see_all_windows(struct call_stack *cs, uint64_t now)
{
	for (uint32_t all = __atomic_load_n(&all_open, __ATOMIC_RELAXED); all; all &= all - 1) {
		const int w = __builtin_ctz(all);
		const uint32_t gen = __atomic_load_n(&all_gen[w], __ATOMIC_RELAXED);
		if (cs->all_seen[w] != gen) {
			cs->all_seen[w] = gen;
			cs->all_start[w] = now;
		}
	}
}

/* The frame (its index) the block at `vaddr` returns to, in the open level; -1 none. */
static int landing(const struct call_stack *cs, uint64_t vaddr)
{
	const int floor = floor_depth(cs);
	for (int i = cs->depth - 1; i >= floor && i >= cs->depth - CALL_SEARCH; i--)
		if (cs->f[i].ret == vaddr)
			return i;
	return -1;
}

/* Does the block at `vaddr` land on a frame's return address?  Then pop to it. */
static int land(unsigned int vcpu, struct call_stack *cs, uint64_t vaddr, uint64_t now)
{
	int i = landing(cs, vaddr);
	if (i < 0)
		return 0;
	while (i > floor_depth(cs) && cs->f[i].tail)	/* a tail call returns with its caller */
		i--;
	for (int j = cs->depth - 1; j >= i; j--)
		credit(vcpu, cs, j, now);
	cs->depth = i;
	return 1;
}

/* Is `b` the entry of the frame's function (a jump back to its own start)? */
static int same_function(const struct frame *f, const struct block *b)
{
	return f->entry != NO_ENTRY && blocks[f->entry].vaddr == b->vaddr;
}

/* `n` frames dropped, not counted: cut in the windows open on the vCPU. */
static void count_cut(unsigned int vcpu, int n)
{
	uint32_t open = vcpus[vcpu].open;
	if (!inline_counts)
		open |= __atomic_load_n(&all_open, __ATOMIC_RELAXED);
	for (; open && n; open &= open - 1)
		__atomic_fetch_add(&frames_cut[__builtin_ctz(open)], (uint64_t)n, __ATOMIC_RELAXED);
}

/* The stack cannot be followed on: its frames (and interrupt levels) are dropped. */
static void cut(unsigned int vcpu, struct call_stack *cs)
{
	count_cut(vcpu, cs->depth);
	cs->depth = cs->levels = 0;
	cs->entering = 0;
	cs->iret_end = 0;
}

/* An interrupt's entry block `b` while in the kernel: a level opens at this depth, a
 * call waiting for its callee's entry waits on until the level ends.  Levels nested
 * past IRQ_DEPTH cannot be followed: the stack is cut. */
static void irq_open(unsigned int vcpu, struct call_stack *cs, struct block *b, uint64_t now)
{
	char type;
	if (cs->levels == IRQ_DEPTH) {
		cut(vcpu, cs);
		return;
	}
	cs->l[cs->levels++] = (struct level){ now, cs->depth, entry_label(b->vaddr, &type),
					      vcpus[vcpu].stay_label, cs->entering };
	cs->entering = 0;
}

/* The block after an iretq that leaves the open level (frames its handler left are
 * cut): the level's own instructions count once under the stay it interrupted, and
 * leave the frames below it: the own clock goes back to when it was taken, and so
 * does the start of a window over every vCPU first seen during it. */
static void irq_close(unsigned int vcpu, struct call_stack *cs, uint64_t now)
{
	const struct level *l = &cs->l[--cs->levels];
	if (cs->depth > l->base) {
		count_cut(vcpu, cs->depth - l->base);
		cs->depth = l->base;
	}
	cs->entering = l->entering;
	add_in_windows(vcpu, cs, call_key(l->stay, IRQ_SLOT), l->open, now);
	cs->excluded += now - l->open;
	for (int w = 0; w < MM_MAX_WINDOWS; w++)
		cs->all_start[w] = MIN(cs->all_start[w], l->open);
}

/* The task switches out: its stack parked (in place of the oldest when all are
 * taken), the next task's empty, and every other parked stack a candidate. */
static void park(unsigned int vcpu, struct call_stack *cs, uint64_t now)
{
	struct parked *p = &cs->parked[0];
	for (int k = 1; k < PARKED && p->depth; k++)
		if (!cs->parked[k].depth || cs->parked[k].when < p->when)
			p = &cs->parked[k];
	for (int k = 0; k < PARKED; k++)
		cs->parked[k].matched = 0;
	count_cut(vcpu, p->depth);
	memcpy(p->f, cs->f, sizeof(cs->f[0]) * (size_t)cs->depth);
	memcpy(p->l, cs->l, sizeof(cs->l[0]) * (size_t)cs->levels);
	p->depth = cs->depth;
	p->levels = cs->levels;
	p->matched = -1;		/* a task does not switch to itself */
	p->when = now;
	cs->depth = cs->levels = 0;
	cs->entering = 0;
	cs->resuming = 1;
}

/* The parked stack that alone matched the most returns, OWN_FRAMES at least,
 * is the resumed task's: taken back, its matched frames popped. */
static void adopt(unsigned int vcpu, struct call_stack *cs, uint64_t now)
{
	struct parked *best = NULL;
	int tie = 0;
	for (int k = 0; k < PARKED; k++) {
		struct parked *p = &cs->parked[k];
		if (p->depth && p->matched > (best ? best->matched : 0)) {
			best = p;
			tie = 0;
		} else if (best && p->depth && p->matched == best->matched) {
			tie = 1;
		}
	}
	if (!best || tie || best->matched < OWN_FRAMES)
		return;
	count_cut(vcpu, cs->depth);	/* left by returning below them */
	memcpy(cs->f, best->f, sizeof(cs->f[0]) * (size_t)best->depth);
	memcpy(cs->l, best->l, sizeof(cs->l[0]) * (size_t)best->levels);
	cs->depth = best->depth;
	cs->levels = best->levels;
	for (int j = 0; j < cs->depth; j++)	/* the time away is other tasks' */
		cs->f[j].start += cs->resumed - best->when;
	for (int k = 0; k < cs->levels; k++)
		cs->l[k].open += cs->resumed - best->when;
	for (int j = cs->depth - 1; j >= best->depth - best->matched; j--)
		credit(vcpu, cs, j, now);
	cs->depth = best->depth - best->matched;
	cs->entering = cs->resuming = 0;
	best->depth = 0;
}

/* Resuming: does the block return into parked stacks?  Each one it does
 * matches one frame more (a tail call's with its caller). */
static int resume(unsigned int vcpu, struct call_stack *cs, uint64_t vaddr, uint64_t now)
{
	int hit = 0;
	for (int k = 0; k < PARKED; k++) {
		struct parked *p = &cs->parked[k];
		int i = p->depth - p->matched - 1;
		if (p->matched < 0 || i < 0 || p->f[i].ret != vaddr)
			continue;
		while (i > 0 && p->f[i].tail)
			i--;
		p->matched = p->depth - i;
		hit = 1;
	}
	if (hit)
		adopt(vcpu, cs, now);
	return hit;
}

/* Is a window open on `vcpu` (its own, or one over every vCPU)?  Calls are
 * followed only then, what costs is the following of every kernel block;
 * when the last one closes, the stack and the parked ones are forgotten. */
static int following(unsigned int vcpu, struct call_stack *cs)
{
	const int open = vcpus[vcpu].open ||
		(!inline_counts && __atomic_load_n(&all_open, __ATOMIC_RELAXED));
	if (!open && cs->following) {
		cs->depth = cs->levels = 0;
		cs->entering = cs->switching = cs->resuming = 0;
		cs->iret_end = 0;
		for (int k = 0; k < PARKED; k++)
			cs->parked[k].depth = 0;
	}
	cs->following = (uint8_t)open;
	return open;
}

/* A kernel block on `vcpu`, before its instructions count. */
static void calls_block(unsigned int vcpu, struct block *b)
{
	struct call_stack *cs = &call_stacks[vcpu];
	uint64_t now = vcpus[vcpu].insns[KERNEL] - cs->excluded;
	const uint32_t slot = (uint32_t)(b - blocks);
	if (!__atomic_load_n(&text_base, __ATOMIC_RELAXED) || !following(vcpu, cs))
		return;
	const int8_t kind = site_kind(b);
	const int after_entry = cs->in_entry;
	cs->in_entry = kind == 'E' || kind == 'I';
	if (cs->levels && cs->iret_end && cs->iret_end != b->vaddr) {	/* not iret_to_self */
		irq_close(vcpu, cs, now);
		now = vcpus[vcpu].insns[KERNEL] - cs->excluded;
	}
	cs->iret_end = __atomic_load_n(&call_sites[slot].iret, __ATOMIC_RELAXED);
	if (!inline_counts)
		see_all_windows(cs, now);
	if (kind == 'X' && !cs->switching)
		park(vcpu, cs, now);
	else if (kind != 'X' && cs->switching)
		cs->resumed = now;
	cs->switching = kind == 'X';
	if (kind == 'X' || kind == 'T')
		return;
	if (kind == 'I' && vcpus[vcpu].in_kernel && !after_entry && landing(cs, b->vaddr) < 0)
		irq_open(vcpu, cs, b, now);
	if (cs->entering) {
		cs->entering = 0;
		if (kind != 'E')	/* 'E': an exception came first, the callee is unknown */
			enter(&vcpus[vcpu], cs, b);
	} else if (!land(vcpu, cs, b->vaddr, now) &&
		   !(cs->resuming && resume(vcpu, cs, b->vaddr, now)) && kind == 'F' &&
		   cs->depth > floor_depth(cs) &&
		   !same_function(&cs->f[cs->depth - 1], b) &&
		   push_frame(cs, cs->f[cs->depth - 1].ret, now, slot, 1)) {
		enter(&vcpus[vcpu], cs, b);	/* a tail call */
	}
	const uint64_t ret = __atomic_load_n(&call_sites[slot].ret, __ATOMIC_RELAXED);
	if (ret)
		cs->entering = push_frame(cs, ret, now + b->n_insns, NO_ENTRY, 0);
}

/* A user block on `vcpu`: no kernel frame outlives it (a resumed task's
 * parked stack is taken back first, and the frames it returned through). */
static void calls_user(unsigned int vcpu)
{
	struct call_stack *cs = &call_stacks[vcpu];
	if (cs->resuming)
		adopt(vcpu, cs, vcpus[vcpu].insns[KERNEL] - cs->excluded);
	cs->resuming = cs->switching = 0;
	cut(vcpu, cs);
}

/* Window w begins on `vcpu`: where, on the vCPU's own clock (no interrupt level is
 * open in user mode, where windows begin). */
static void calls_begin(unsigned int vcpu, unsigned w)
{
	call_stacks[vcpu].own_start[w] = vcpus[vcpu].insns[KERNEL] - call_stacks[vcpu].excluded;
}

/* Window w ended on `v`: its pending inclusive counts into the sums (under `lock`)
 * when `commit`, or dropped. */
static void calls_settle(struct vcpu *v, unsigned w, gboolean commit)
{
	GHashTable *pending = call_stacks[v - vcpus].pending[w];
	GHashTableIter it;
	gpointer key, sum;
	if (!pending)
		return;
	g_hash_table_iter_init(&it, pending);
	while (commit && g_hash_table_iter_next(&it, &key, &sum))
		add_calls(incl[w], key, ((uint64_t *)sum)[0], ((uint64_t *)sum)[1]);
	g_hash_table_remove_all(pending);
}

/* A warm-up ended (under `lock`): inclusive counts sum the measured samples only. */
static void calls_reset(void)
{
	for (int w = 0; w < MM_MAX_WINDOWS; w++)
		g_hash_table_remove_all(incl[w]);
}

/* One window's entries (`irq`: its interrupt levels instead) from `table`: each entry's
 * [address, label, insns, calls], or each stay's "label": [levels, insns]. */
static void write_entries(GHashTable *table, gboolean irq)
{
	GHashTableIter it;
	gpointer key, sum;
	const char *sep = "";
	g_hash_table_iter_init(&it, table);
	while (g_hash_table_iter_next(&it, &key, &sum)) {
		const gsize k = GPOINTER_TO_SIZE(key);
		const int32_t label = (int32_t)(k >> 32) - 2;
		const char *name = label >= 0 ? labels[label] : "";
		const uint64_t *n = sum;
		if (((k & 0xffffffffu) == IRQ_SLOT) != irq)
			continue;
		if (irq)
			fprintf(out, "%s\"%s\": [%" PRIu64 ", %" PRIu64 "]", sep, name, n[1], n[0]);
		else
			fprintf(out, "%s[%" PRIu64 ", \"%s\", %" PRIu64 ", %" PRIu64 "]", sep,
				blocks[k & 0xffffffffu].vaddr, name, n[0], n[1]);
		sep = ", ";
	}
}

/* At exit: per window, this boot's _text, each entry's inclusive instructions and calls
 * by stay label ("" for none), and the interrupt levels taken out of them by the stay
 * they interrupted. */
static void write_calls(void)
{
	for (int w = 0; w < MM_MAX_WINDOWS; w++) {
		fprintf(out, "{\"kind\": \"calls\", \"window\": %d, \"text\": %" PRIu64
			", \"cut\": %" PRIu64 ", \"overflow\": %" PRIu64 ", \"entries\": [", w,
			text_base, frames_cut[w], frames_overflow);
		write_entries(incl[w], FALSE);
		fputs("], \"interrupts\": {", out);
		write_entries(incl[w], TRUE);
		fputs("}}\n", out);
	}
}

/* At load: calls=PATH read and the stacks made; 0 on success. */
static int calls_install(const char *path)
{
	if (read_calls(path))
		return -1;
	call_stacks = aligned_alloc(64, sizeof(*call_stacks) * (size_t)n_vcpus);
	call_sites = calloc(MAX_BLOCKS, sizeof(*call_sites));
	syscall_labels = calloc(MAX_LABELS, 1);
	irq_labels = calloc(MAX_LABELS, 1);
	if (!call_stacks || !call_sites || !syscall_labels || !irq_labels)
		return -1;
	for (int l = 0; l < n_labels; l++) {
		syscall_labels[l] = g_str_has_prefix(labels[l], "syscall_");
		irq_labels[l] = !strcmp(labels[l], "interrupt") || !strcmp(labels[l], "exception_nmi");
	}
	for (int w = 0; w < MM_MAX_WINDOWS; w++)
		incl[w] = new_calls_table();
	memset(call_stacks, 0, sizeof(*call_stacks) * (size_t)n_vcpus);
	calls = TRUE;
	return 0;
}
