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

/* Length of the well-formed UTF-8 sequence at s (at most n bytes), or 0:
 * no overlong forms, surrogates or code points past U+10FFFF. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len = s[0] >= 0xF5 ? 0 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
	if (!len || len > n)
		return 0;
	for (size_t i = 1; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 0;
	if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0) ||
	    (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))
		return 0;
	return len;
}

void jb_text(struct jbuf *j, const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	jb_raw(j, "\"", 1);
	for (size_t i = 0; i < n;) {
		char esc[8];
		if (u[i] == '"' || u[i] == '\\') {
			esc[0] = '\\'; esc[1] = (char)u[i];
			jb_raw(j, esc, 2);
			i++;
		} else if (u[i] == 0) {
			jb_puts(j, "\\ufffd");
			i++;
		} else if (u[i] < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", u[i]);
			jb_puts(j, esc);
			i++;
		} else if (u[i] < 0x80) {
			jb_raw(j, s + i, 1);
			i++;
		} else {
			size_t len = utf8_len(u + i, n - i);
			if (len)
				jb_raw(j, s + i, len);
			else
				jb_puts(j, "\\ufffd");
			i += len ? len : 1;
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
