/* census.h - the record census.bpf.c writes and mmcensus reads: one VMA. */
#ifndef CENSUS_H
#define CENSUS_H

struct census_vma {
	__u32 tgid, tid, ppid;	/* ppid: the parent process, for command trees */
	__u64 start, end, flags, pgoff;
	__u64 anon_vma, root;	/* kernel addresses: identities only, never shown to users */
	__u32 file;		/* 1: a file-backed VMA (private COW pages have an anon_vma too) */
	char comm[16];
};

#endif
