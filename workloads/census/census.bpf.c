/*
 * census.bpf.c - one record per VMA of every process (or of one PID), read
 * from the kernel's own structures by a BPF task_vma iterator: which
 * anon_vma the VMA hangs off and that anon_vma's root.  /proc/PID/maps
 * cannot show either: two VMAs there look alike whether or not they share an
 * anon_vma, and the rmap walk that seed 004 times visits every VMA of one
 * anon_vma's interval tree.
 *
 * The kernel structures are declared with only the fields read, marked
 * preserve_access_index: libbpf relocates each field against the running
 * kernel's BTF at load time (CO-RE), so one object serves the host and the
 * Debian guests whatever their struct layouts.
 */
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "census.h"

struct seq_file;
struct file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct anon_vma {
	struct anon_vma *root;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct anon_vma *anon_vma;
	struct file *vm_file;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct task_struct *real_parent;
	char comm[16];
} __attribute__((preserve_access_index));

struct bpf_iter__task_vma {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
	struct vm_area_struct *vma;
} __attribute__((preserve_access_index));

char LICENSE[] SEC("license") = "GPL";

SEC("iter/task_vma")
int census(struct bpf_iter__task_vma *ctx)
{
	struct vm_area_struct *vma = ctx->vma;
	struct task_struct *task = ctx->task;
	struct census_vma r = {};

	if (!vma || !task)
		return 0;
	r.tgid = task->tgid;
	r.tid = task->pid;
	r.ppid = BPF_CORE_READ(task, real_parent, tgid);
	r.start = vma->vm_start;
	r.end = vma->vm_end;
	r.flags = vma->vm_flags;
	r.pgoff = vma->vm_pgoff;
	r.file = vma->vm_file != 0;
	r.anon_vma = (__u64)vma->anon_vma;
	if (vma->anon_vma)
		r.root = (__u64)BPF_CORE_READ(vma, anon_vma, root);
	bpf_probe_read_kernel_str(r.comm, sizeof(r.comm), task->comm);
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}
