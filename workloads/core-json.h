/*
 * core-json.h - the JSON writer behind every line mmwork prints on stdout
 * (samples and `mmwork describe`).
 *
 * A growing buffer and a comma flag are all that one-line JSON needs, so
 * mmwork carries this instead of a library: it stays one static binary and
 * the reproducer stays one file.
 */
#ifndef MMWORK_CORE_JSON_H
#define MMWORK_CORE_JSON_H

#include <stddef.h>

struct jbuf {
	char *s;
	size_t len, cap;
	int need_comma;
};

void jb_raw(struct jbuf *j, const char *s, size_t n);
void jb_puts(struct jbuf *j, const char *s);
void jb_str(struct jbuf *j, const char *s);		/* a quoted, escaped string */
/* `n` bytes of text another program wrote: NULs and bytes that are not UTF-8
 * become U+FFFD, so the line stays valid JSON whatever it printed. */
void jb_text(struct jbuf *j, const char *s, size_t n);
void jb_key(struct jbuf *j, const char *key);		/* "key": with the comma before it */
void jb_num(struct jbuf *j, double v);			/* NaN and infinities print as null */
void jb_open(struct jbuf *j, const char *key);		/* {, after "key": unless key is NULL */
void jb_close(struct jbuf *j);
void jb_key_num(struct jbuf *j, const char *k, double v);
void jb_key_str(struct jbuf *j, const char *k, const char *v);
void jb_str_array(struct jbuf *j, const char *key, const char *const *v);

#endif
