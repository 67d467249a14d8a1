/*
 * core-json.c - the JSON writer behind every line mmwork prints on stdout.
 * Kept apart so that what a sample says (core-sample.c) and how it is
 * spelled in JSON do not mix.
 */
#define _GNU_SOURCE
#include "core-json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jb_raw(struct jbuf *j, const char *s, size_t n)
{
	if (j->len + n + 1 > j->cap) {
		j->cap = (j->len + n + 1) * 2;
		j->s = realloc(j->s, j->cap);
		if (!j->s) {
			perror("mmwork: realloc");
			exit(1);
		}
	}
	memcpy(j->s + j->len, s, n);
	j->len += n;
	j->s[j->len] = '\0';
}

void jb_puts(struct jbuf *j, const char *s) { jb_raw(j, s, strlen(s)); }

void jb_str(struct jbuf *j, const char *s)
{
	jb_raw(j, "\"", 1);
	for (; *s; s++) {
		char esc[8];
		if (*s == '"' || *s == '\\') {
			esc[0] = '\\'; esc[1] = *s;
			jb_raw(j, esc, 2);
		} else if ((unsigned char)*s < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", *s);
			jb_puts(j, esc);
		} else {
			jb_raw(j, s, 1);
		}
	}
	jb_raw(j, "\"", 1);
}

void jb_key(struct jbuf *j, const char *key)
{
	if (j->need_comma)
		jb_raw(j, ",", 1);
	jb_str(j, key);
	jb_raw(j, ":", 1);
	j->need_comma = 1;
}

void jb_num(struct jbuf *j, double v)
{
	char tmp[64];
	if (!isfinite(v))
		jb_puts(j, "null");	/* JSON has no NaN; a missing value reads as null */
	else if (v == (double)(long long)v && fabs(v) < 9e15)
		snprintf(tmp, sizeof(tmp), "%lld", (long long)v), jb_puts(j, tmp);
	else
		snprintf(tmp, sizeof(tmp), "%.6g", v), jb_puts(j, tmp);
}

void jb_open(struct jbuf *j, const char *key)
{
	if (key)
		jb_key(j, key);
	else if (j->need_comma)
		jb_raw(j, ",", 1);
	jb_raw(j, "{", 1);
	j->need_comma = 0;
}

void jb_close(struct jbuf *j)
{
	jb_raw(j, "}", 1);
	j->need_comma = 1;
}

void jb_key_num(struct jbuf *j, const char *k, double v) { jb_key(j, k); jb_num(j, v); }
void jb_key_str(struct jbuf *j, const char *k, const char *v) { jb_key(j, k); jb_str(j, v); }

void jb_str_array(struct jbuf *j, const char *key, const char *const *v)
{
	jb_key(j, key);
	jb_raw(j, "[", 1);
	for (int i = 0; v && v[i]; i++) {
		if (i)
			jb_raw(j, ",", 1);
		jb_str(j, v[i]);
	}
	jb_raw(j, "]", 1);
}
