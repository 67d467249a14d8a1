/*
 * core-args.h - command-line arguments checked against a workload's table.
 *
 * Every value is checked once, here, before anything runs (`--check` stops
 * right after), so a bad profile fails with one line and exit 2 instead of
 * halfway through an experiment; workloads then read values by name.
 */
#ifndef MMWORK_CORE_ARGS_H
#define MMWORK_CORE_ARGS_H

#include "core-workload.h"

/* Options every workload takes, before its own. */
extern const struct mm_param mm_harness_params[];

/* Fill ctx->params and ctx->values from the defaults and argv (the
 * arguments after the workload name; for a workload that takes a command,
 * what follows "--" is that command); on a bad argument print one line
 * and exit 2. */
void mm_parse_args(struct mm_ctx *ctx, int argc, char **argv);

/* The command after "--" (a workload with takes_command); NULL-terminated. */
char *const *mm_command(const struct mm_ctx *ctx);

/* Parameter values, looked up by name (the tables are tiny). */
long mm_arg_long(const struct mm_ctx *ctx, const char *name);
double mm_arg_double(const struct mm_ctx *ctx, const char *name);
const char *mm_arg_str(const struct mm_ctx *ctx, const char *name);

/* Print a one-line error naming the workload and exit 2. */
void mm_die(const struct mm_ctx *ctx, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 2, 3)));

#endif
