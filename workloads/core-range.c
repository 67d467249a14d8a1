/*
 * core-range.c - the mapping, its backing and the timed-round loop that
 * the range workloads share (core-range.h), so that each of them maps,
 * advises and times the same way.
 */
#define _GNU_SOURCE
#include "core-range.h"
#include "core-args.h"
#include "core-errno.h"
#include "core-record.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#define RANGE_CHUNK (1 << 20)

const char *const mm_thp_choices[] = { "default", "hugepage", "nohugepage", NULL };
const char *const mm_backing_choices[] = { "auto", "anon", "shmem", "file", NULL };
const char *const mm_backing_names[] = { "anon", "shmem", "file" };

void mm_advise_thp(const struct mm_ctx *c, char *p, size_t len)
{
	const char *thp = mm_arg_str(c, "thp");
	if (!strcmp(thp, "hugepage") && madvise(p, len, MADV_HUGEPAGE))
		mm_error("madvise_hugepage", errno);
	if (!strcmp(thp, "nohugepage") && madvise(p, len, MADV_NOHUGEPAGE))
		mm_error("madvise_nohugepage", errno);
}

char *mm_map_range(const struct mm_ctx *c, size_t len, int flags, int fd, char **start)
{
	char *p = mm_map(len, mm_align_bytes(mm_arg_str(c, "align")), PROT_READ | PROT_WRITE,
			 flags, fd);
	if (!p)
		return NULL;
	if (start)
		*start = p;
	mm_advise_thp(c, p, len);
	return p;
}

enum mm_backing mm_backing_of(const struct mm_ctx *c, int auto_file)
{
	const char *b = mm_arg_str(c, "backing");
	if (!strcmp(b, "auto"))
		return auto_file ? MM_BACKING_FILE : MM_BACKING_ANON;
	return !strcmp(b, "anon") ? MM_BACKING_ANON :
	       !strcmp(b, "shmem") ? MM_BACKING_SHMEM : MM_BACKING_FILE;
}

int mm_open_unlinked(const char *dir, const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd >= 0)
		unlink(path);
	return fd;
}

int mm_fill(int fd, size_t len)
{
	char *chunk = malloc(RANGE_CHUNK);
	if (!chunk)
		return -1;
	memset(chunk, 0x5a, RANGE_CHUNK);
	for (size_t off = 0; off < len; off += RANGE_CHUNK) {
		const size_t n = len - off < RANGE_CHUNK ? len - off : RANGE_CHUNK;
		if (pwrite(fd, chunk, n, (off_t)off) != (ssize_t)n) {
			mm_error("pwrite", errno);
			free(chunk);
			return -1;
		}
	}
	free(chunk);
	return 0;
}

void mm_pread_all(int fd, size_t len)
{
	char *buf = malloc(RANGE_CHUNK);
	for (size_t off = 0; buf && off < len; off += RANGE_CHUNK)
		if (pread(fd, buf, RANGE_CHUNK, (off_t)off) < 0)
			mm_error("pread", errno);
	free(buf);
}

int mm_open_backing(const struct mm_ctx *c, enum mm_backing b, const char *name, size_t len,
		    int fill)
{
	int fd = b == MM_BACKING_SHMEM ? memfd_create(name, MFD_CLOEXEC) :
		 mm_open_unlinked(mm_arg_str(c, "dir"), name);
	if (fd < 0) {
		mm_error("open", errno);
		return -1;
	}
	if (!fill && ftruncate(fd, (off_t)len)) {
		mm_error("ftruncate", errno);
		close(fd);
		return -1;
	}
	if (fill && mm_fill(fd, len)) {
		close(fd);
		return -1;
	}
	/* Clean page cache: a pageout or an fadvise(DONTNEED) drops it. */
	if (fill && b == MM_BACKING_FILE && fdatasync(fd))
		mm_error("fdatasync", errno);
	return fd;
}

const char *mm_fs_name(long magic)
{
	switch (magic) {
	case 0xEF53: return "ext4";
	case 0x01021994: return "tmpfs";
	case 0x58465342: return "xfs";
	case 0x9123683E: return "btrfs";
	case 0x794c7630: return "overlay";
	case 0x858458f6: return "ramfs";
	default: return "other";
	}
}

void mm_state_dir_fs(struct mm_ctx *c, int fd)
{
	struct statfs fs;
	if (!fstatfs(fd, &fs))
		mm_state_str(c, "dir_fs", mm_fs_name((long)fs.f_type));
}

void mm_state_file_fs_magic(struct mm_ctx *c, const char *dir)
{
	struct statfs fs;
	char magic[32];
	if (statfs(dir, &fs))
		return;
	snprintf(magic, sizeof(magic), "0x%lx", (unsigned long)fs.f_type);
	mm_state_str(c, "file_fs_magic", magic);
}

int mm_run_rounds(struct mm_ctx *c, long give_up, mm_round_fn *round, void *arg,
		  struct mm_loop *l)
{
	const long min_rounds = mm_arg_long(c, "rounds");
	const double min_s = (double)mm_arg_long(c, "min-ms") / 1000.0;
	const uint64_t t_start = mm_now_ns();

	*l = (struct mm_loop){ 0 };
	while (l->timed + l->failed < min_rounds || !mm_deadline_passed(t_start, min_s)) {
		const int r = round(c, arg, &l->start);
		if (r < 0)
			return -1;
		if (r) {	/* the call failed: counted, not timed */
			if (++l->failed >= give_up && !l->timed)
				break;
			continue;
		}
		l->timed++;
		l->aligned += mm_pmd_offset_kb(l->start) == 0;
	}
	return 0;
}

void mm_metric_rounds(struct mm_ctx *c, const char *name, struct mm_rounds *r, double units)
{
	char total[64];
	snprintf(total, sizeof(total), "%s_total", name);
	mm_metric(c, name, mm_rounds_median(r) / units);
	mm_metric(c, total, mm_rounds_total(r) / (units * (double)r->n));
}

void mm_state_placement(struct mm_ctx *c, const struct mm_loop *l)
{
	mm_state_num(c, "mapping_pmd_aligned_fraction", (double)l->aligned / (double)l->timed);
	mm_state_num(c, "mapping_start_mod_2m_kb", mm_pmd_offset_kb(l->start));
}
