/*
 * qemu_plugin_harness.c - mmlab's QEMU plugin (workloads/qemu-plugin/insns.c)
 * driven without QEMU: the plugin API's functions it calls, faked, and two
 * vCPUs executing a script of blocks (test_syscalls.py builds and runs it).
 *
 * The kernel's text is at TEXT; the stays file the test writes puts the
 * syscall entry at +0x80, a page fault's at +0x200, interrupts' at +0x300,
 * __x64_sys_mprotect at +0x1000.  Arguments: the plugin's.  SCRIPT=calls runs
 * calls_script instead, for calls.h, and SCRIPT=irq irq_script.
 */
#include <glib.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

struct qemu_plugin_insn {
	uint8_t data[8];
	size_t size;
	qemu_plugin_vcpu_udata_cb_t cb;
	void *udata;
};

struct qemu_plugin_tb {
	uint64_t vaddr;
	size_t n;
	struct qemu_plugin_insn insns[16];
	qemu_plugin_vcpu_udata_cb_t cb;
	void *udata;
	uint64_t *inline_at, inline_add;
};

static qemu_plugin_vcpu_tb_trans_cb_t translate;
static qemu_plugin_udata_cb_t at_exit;

size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb) { return tb->n; }
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb) { return tb->vaddr; }
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn) { return insn->data; }
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn) { return insn->size; }

struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t i)
{
	return (struct qemu_plugin_insn *)&tb->insns[i];
}

void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb,
					  qemu_plugin_vcpu_udata_cb_t cb,
					  enum qemu_plugin_cb_flags flags, void *udata)
{
	(void)flags;
	tb->cb = cb;
	tb->udata = udata;
}

void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
					      void *ptr, uint64_t imm)
{
	(void)op;
	tb->inline_at = ptr;
	tb->inline_add = imm;
}

void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn,
					    qemu_plugin_vcpu_udata_cb_t cb,
					    enum qemu_plugin_cb_flags flags, void *udata)
{
	(void)flags;
	insn->cb = cb;
	insn->udata = udata;
}

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb)
{
	(void)id;
	translate = cb;
}

void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *udata)
{
	(void)id;
	(void)udata;
	at_exit = cb;
}

/* events=on's (events.h): not scripted here, a guest counts them (test_events.py). */
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn) { (void)insn; return 0; }
unsigned int qemu_plugin_mem_size_shift(qemu_plugin_meminfo_t info) { (void)info; return 0; }
bool qemu_plugin_mem_is_store(qemu_plugin_meminfo_t info) { (void)info; return false; }
bool qemu_plugin_hwaddr_is_io(const struct qemu_plugin_hwaddr *h) { (void)h; return false; }
uint64_t qemu_plugin_hwaddr_phys_addr(const struct qemu_plugin_hwaddr *h) { (void)h; return 0; }

struct qemu_plugin_hwaddr *qemu_plugin_get_hwaddr(qemu_plugin_meminfo_t info, uint64_t vaddr)
{
	(void)info;
	(void)vaddr;
	return NULL;
}

void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_mem_cb_t cb,
				      enum qemu_plugin_cb_flags flags, enum qemu_plugin_mem_rw rw,
				      void *udata)
{
	(void)insn, (void)cb, (void)flags, (void)rw, (void)udata;
}

#define TEXT 0xffffffff9a000000ULL
enum { PLAIN, SYSCALL, CALL, IRET, BEGIN_ALL = 0x0500, END_ALL = 0x0600, SAMPLE = 0x0300 };

/* A translated block of `n` NOPs; its last a `syscall`, a `call rel32` or an `iretq`, or
 * its first a marker. */
static struct qemu_plugin_tb *block(uint64_t vaddr, size_t n, unsigned kind)
{
	struct qemu_plugin_tb *tb = g_new0(struct qemu_plugin_tb, 1);
	tb->vaddr = vaddr;
	tb->n = n;
	for (size_t i = 0; i < n; i++) {
		tb->insns[i].size = 1;
		tb->insns[i].data[0] = 0x90;
	}
	if (kind == SYSCALL) {
		tb->insns[n - 1].size = 2;
		memcpy(tb->insns[n - 1].data, "\x0f\x05", 2);
	} else if (kind == CALL) {
		tb->insns[n - 1].size = 5;
		memcpy(tb->insns[n - 1].data, "\xe8\0\0\0\0", 5);
	} else if (kind == IRET) {
		tb->insns[n - 1].size = 2;
		memcpy(tb->insns[n - 1].data, "\x48\xcf", 2);
	} else if (kind != PLAIN) {
		const uint32_t disp = 0x4d4d0000u | kind;
		tb->insns[0].size = 7;
		memcpy(tb->insns[0].data, "\x0f\x1f\x80", 3);
		memcpy(tb->insns[0].data + 3, &disp, 4);
	}
	translate(0, tb);
	return tb;
}

static void run(unsigned vcpu, struct qemu_plugin_tb *tb)
{
	if (tb->cb)
		tb->cb(vcpu, tb->udata);
	if (tb->inline_at)
		*tb->inline_at += tb->inline_add;
	for (size_t i = 0; i < tb->n; i++)
		if (tb->insns[i].cb)
			tb->insns[i].cb(vcpu, tb->insns[i].udata);
}

/* Where a block that ends in a call returns to: the block after it. */
static uint64_t after(const struct qemu_plugin_tb *tb)
{
	return tb->vaddr + tb->n - 1 + tb->insns[tb->n - 1].size;
}

/*
 * SCRIPT=calls (with calls=, test_inclusive.py): one vCPU's tasks around a
 * sleeping syscall.  Its calls file: functions at +0x1000 (__x64_sys_move_pages,
 * the stays file's N line), +0x2000 (do_syscall_64), +0x3000 (a sleeper:
 * synchronize_rcu_expedited), +0x4000 (schedule), +0x5000 (__schedule); the
 * switch at +0x6000; two kernel threads' loops at +0x7000 and +0x8000.  The syscall
 * sleeps (its stack parked); thread B starts and sleeps from its loop; thread A,
 * asleep since before the window, resumes through __schedule and schedule() and
 * sleeps again from its own loop; the syscall resumes and returns.
 */
static void calls_script(void)
{
	struct qemu_plugin_tb *user = block(0x400000, 4, PLAIN),
		*user_syscall = block(0x400100, 3, SYSCALL),
		*entry = block(TEXT + 0x80, 5, CALL), *do_syscall = block(TEXT + 0x2000, 4, CALL),
		*sys = block(TEXT + 0x1000, 6, CALL), *sleeper = block(TEXT + 0x3000, 3, CALL),
		*schedule = block(TEXT + 0x4000, 2, CALL), *schedule_ = block(TEXT + 0x5000, 3, CALL),
		*sw = block(TEXT + 0x6000, 4, PLAIN), *a = block(TEXT + 0x7000, 3, CALL),
		*b = block(TEXT + 0x8000, 3, CALL), *begin = block(0x400200, 2, BEGIN_ALL),
		*end = block(0x400300, 2, END_ALL), *sample = block(0x400400, 2, SAMPLE);
	struct qemu_plugin_tb *in_schedule_ = block(after(schedule_), 2, PLAIN),
		*in_schedule = block(after(schedule), 2, PLAIN),
		*in_sleeper = block(after(sleeper), 2, PLAIN), *in_sys = block(after(sys), 2, PLAIN),
		*in_do_syscall = block(after(do_syscall), 2, PLAIN),
		*in_entry = block(after(entry), 2, PLAIN), *in_a = block(after(a) + 0x40, 2, PLAIN);

	run(0, user), run(0, user_syscall), run(0, entry), run(0, in_entry);  /* finds _text */
	run(0, user), run(0, begin);
	run(0, user_syscall), run(0, entry), run(0, do_syscall), run(0, sys), run(0, sleeper);
	run(0, schedule), run(0, schedule_), run(0, sw);		/* the syscall sleeps */
	run(0, b), run(0, schedule), run(0, schedule_), run(0, sw);	/* B starts, sleeps */
	run(0, in_schedule_), run(0, in_schedule), run(0, in_a);	/* A resumes ... */
	run(0, a), run(0, schedule), run(0, schedule_), run(0, sw);	/* ... and sleeps */
	run(0, in_schedule_), run(0, in_schedule), run(0, in_sleeper), run(0, in_sys);
	run(0, in_do_syscall), run(0, in_entry), run(0, user);	/* the syscall returns */
	run(0, end), run(0, sample);
}

/* Blocks one after another on vCPU 0. */
static void run_all(struct qemu_plugin_tb **tbs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		run(0, tbs[i]);
}

/*
 * SCRIPT=irq (with calls=, test_inclusive.py): timer interrupts, a fault and mprotect.
 * Functions at +0x1000 (__x64_sys_mprotect), +0x2000 (do_syscall_64), +0x3000
 * (change_protection), +0x4000 (a handler), +0x5000 (what it calls); the interrupt
 * entries (stays=' E lines) from +0x300: a vector's stub there jumps to the common stub
 * at +0x340, which calls the handler; the page fault's at +0x200; +0x500 returns by
 * iretq.  One call is interrupted inside change_protection, one between its call and
 * its entry, one faults inside it; then an interrupt lands in user mode.
 */
static void irq_script(void)
{
	struct qemu_plugin_tb *user = block(0x400000, 4, PLAIN),
		*user_syscall = block(0x400100, 3, SYSCALL),
		*entry = block(TEXT + 0x80, 5, CALL), *do_syscall = block(TEXT + 0x2000, 4, CALL),
		*sys = block(TEXT + 0x1000, 6, CALL), *leaf = block(TEXT + 0x3000, 3, PLAIN),
		*leaf_rest = block(TEXT + 0x3040, 2, PLAIN), *vector = block(TEXT + 0x300, 2, PLAIN),
		*stub = block(TEXT + 0x340, 3, CALL), *handler = block(TEXT + 0x4000, 4, CALL),
		*timer = block(TEXT + 0x5000, 5, PLAIN), *iret = block(TEXT + 0x500, 3, IRET),
		*fault = block(TEXT + 0x200, 3, CALL), *begin = block(0x400200, 2, BEGIN_ALL),
		*end = block(0x400300, 2, END_ALL), *sample = block(0x400400, 2, SAMPLE);
	struct qemu_plugin_tb *in_handler = block(after(handler), 2, PLAIN),
		*in_stub = block(after(stub), 2, PLAIN), *in_fault = block(after(fault), 2, PLAIN),
		*in_sys = block(after(sys), 2, PLAIN),
		*in_do_syscall = block(after(do_syscall), 2, PLAIN),
		*in_entry = block(after(entry), 2, PLAIN);
	struct qemu_plugin_tb *tick[] = { vector, stub, handler, timer, in_handler, in_stub, iret },
		*faults[] = { fault, handler, timer, in_handler, in_fault, iret };
	const size_t ticks = sizeof(tick) / sizeof(tick[0]), faulted = sizeof(faults) / sizeof(faults[0]);

	run(0, user), run(0, user_syscall), run(0, entry), run(0, in_entry);  /* finds _text */
	run(0, user), run(0, begin);
	for (int call = 0; call < 3; call++) {
		run(0, user_syscall), run(0, entry), run(0, do_syscall), run(0, sys);
		if (call != 1)
			run(0, leaf);
		if (call == 2)
			run_all(faults, faulted);	/* 19 */
		else
			run_all(tick, ticks);		/* 21 */
		if (call == 1)
			run(0, leaf);
		run(0, leaf_rest), run(0, in_sys), run(0, in_do_syscall), run(0, in_entry);
		run(0, user);
	}
	run_all(tick, ticks);				/* in user mode */
	run(0, user), run(0, end), run(0, sample);
}

int main(int argc, char **argv)
{
	qemu_info_t info = { .system_emulation = true, .system = { .max_vcpus = 2 } };
	if (qemu_plugin_install(0, &info, argc - 1, argv + 1))
		return 1;
	if (getenv("SCRIPT") && (!strcmp(getenv("SCRIPT"), "calls") ||
				 !strcmp(getenv("SCRIPT"), "irq"))) {
		(strcmp(getenv("SCRIPT"), "irq") ? calls_script : irq_script)();
		at_exit(0, NULL);
		return 0;
	}
	struct qemu_plugin_tb *user = block(0x400000, 4, PLAIN),
		*user_syscall = block(0x400100, 3, SYSCALL),
		*entry = block(TEXT + 0x80, 5, PLAIN), *mprotect = block(TEXT + 0x1000, 10, PLAIN),
		*exit_ = block(TEXT + 0x90, 4, PLAIN), *fault = block(TEXT + 0x200, 6, PLAIN),
		*irq = block(TEXT + 0x310, 2, PLAIN), *begin = block(0x400200, 2, BEGIN_ALL),
		*end = block(0x400300, 2, END_ALL), *sample = block(0x400400, 2, SAMPLE);

	run(0, user), run(0, user_syscall), run(0, entry), run(0, exit_);  /* finds _text */
	run(1, user_syscall), run(1, entry);		/* begins before the window ... */
	run(0, begin);
	run(1, mprotect), run(1, exit_), run(1, user);	/* ... and is not counted: 14 */
	for (int i = 0; i < 3; i++)			/* mprotect, a nested interrupt: 21 */
		run(0, user_syscall), run(0, entry), run(0, mprotect), run(0, irq), run(0, exit_);
	run(0, user), run(0, fault), run(0, exit_);	/* a page fault: 10 */
	run(1, user), run(1, irq), run(1, exit_);	/* an interrupt in user mode: 6 */
	run(1, user_syscall), run(1, entry);		/* open at the window's end: 5 */
	run(0, end), run(0, sample);
	run(1, exit_), run(1, user);
	at_exit(0, NULL);
	return 0;
}
