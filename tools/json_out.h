/*
 * json_out.h - the JSON documents of `beammoe <command> --json`, written
 * with stdio alone: the tool's JSON output must not need json-c (an
 * optional dependency, m4/beam_json.m4, that only the safetensors files
 * use).
 *
 * One writer, one document, written as it goes: a value is printed when it
 * is added, so a long audit or bench streams its rows (one a line) instead
 * of holding them. The caller nests begin/end pairs correctly; key is the
 * member's name inside an object and NULL inside an array or for the top
 * level value.
 */
#ifndef BEAMMOE_TOOLS_JSON_OUT_H
#define BEAMMOE_TOOLS_JSON_OUT_H

#include <stdint.h>
#include <stdio.h>

#define JW_MAXDEPTH 16

typedef struct jw {
    FILE *f;
    int depth;
    int count[JW_MAXDEPTH]; /* values written so far at each level: the commas */
    char close[JW_MAXDEPTH]; /* the closing character of each open level */
    int inline_from;        /* levels deeper than this go on one line (a row) */
} jw;

/* A writer of one document on f (stdout for --json). */
void jw_init(jw *w, FILE *f);
/* An object or an array; an object or array opened with jw_begin_row (or
 * deeper inside one) is written on one line, so a table's rows read one a
 * line. */
void jw_begin(jw *w, const char *key, char open, char close, int row);
#define jw_begin_obj(w, key) jw_begin(w, key, '{', '}', 0)
#define jw_begin_arr(w, key) jw_begin(w, key, '[', ']', 0)
#define jw_begin_row(w, key) jw_begin(w, key, '{', '}', 1)     /* an object on one line */
#define jw_begin_row_arr(w, key) jw_begin(w, key, '[', ']', 1) /* an array on one line */
void jw_end(jw *w); /* the innermost object or array; after the top one, a newline */

void jw_str(jw *w, const char *key, const char *s); /* NULL: null */
void jw_int(jw *w, const char *key, int64_t v);
void jw_uint(jw *w, const char *key, uint64_t v);
void jw_num(jw *w, const char *key, double v); /* not finite: null (JSON has no NaN) */
void jw_float(jw *w, const char *key, float v); /* a value given as a float: its shortest text */
void jw_bool(jw *w, const char *key, int v);
#define jw_null(w, key) jw_str(w, key, NULL)

/* s as a JSON string (quotes included) on f: '"', '\\' and the control
 * characters escaped, every other valid UTF-8 character kept; characters
 * that could act on a terminal the document is shown on (U+007F, C1
 * controls, invisible and reordering ones: the set of harness/text.h) as
 * \uNNNN, which a JSON reader turns back into the same character; a byte
 * that is not UTF-8 (a file name may hold one) as U+FFFD, since JSON text
 * must be UTF-8. */
void jw_put_string(FILE *f, const char *s);

#endif
