/*
 * json_out.c - the JSON writer of `--json` (json_out.h): stdio only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json_out.h"
#include "text.h"

/* Strings go through hu_escape first (harness/text.h: the one place that
 * knows which characters are unsafe to show), then its escapes become
 * JSON's: hu_escape writes "\\" for a backslash, "\xNN" for a control
 * character or a byte that is not UTF-8, "\uNNNN" for the characters it
 * hides, and every other character as itself. */
static void put_escaped(FILE *f, const char *e)
{
    while (*e) {
        if (e[0] == '\\' && e[1] == '\\') {
            fputs("\\\\", f);
            e += 2;
        } else if (e[0] == '\\' && e[1] == 'x') {
            unsigned v = (unsigned)strtoul((char[3]){e[2], e[3], 0}, NULL, 16);
            /* below 0x80 a control character; else a stray byte */
            if (v >= 0x80)
                fputs("\\ufffd", f);
            else if (v == '\n')
                fputs("\\n", f);
            else if (v == '\t')
                fputs("\\t", f);
            else
                fprintf(f, "\\u%04x", v);
            e += 4;
        } else if (e[0] == '\\' && e[1] == 'u') {
            fwrite(e, 1, 6, f); /* the same escape in JSON */
            e += 6;
        } else {
            if (*e == '"') fputc('\\', f);
            fputc(*e++, f);
        }
    }
}

void jw_put_string(FILE *f, const char *s)
{
    /* hu_escape grows a byte to at most 4 characters ("\xNN") */
    size_t n = strlen(s) * 4 + 1;
    char small[512], *e = n <= sizeof small ? small : malloc(n);
    fputc('"', f);
    if (!e) {
        /* no memory for the copy: say so in the value rather than print
         * unchecked bytes */
        fputs("(out of memory)", f);
    } else {
        put_escaped(f, hu_escape(e, n, s, 0));
        if (e != small) free(e);
    }
    fputc('"', f);
}

void jw_init(jw *w, FILE *f)
{
    memset(w, 0, sizeof *w);
    w->f = f;
    w->inline_from = JW_MAXDEPTH;
}

/* Before a value: the comma after the previous one, the new line and
 * indent (outside a row) or a space (inside), the member's name. */
static void jw_sep(jw *w, const char *key)
{
    if (w->depth > 0) {
        const int first = w->count[w->depth - 1]++ == 0;
        if (!first) fputc(',', w->f);
        if (w->depth - 1 < w->inline_from)
            fprintf(w->f, "\n%*s", 2 * w->depth, "");
        else if (!first)
            fputc(' ', w->f);
    }
    if (key) {
        jw_put_string(w->f, key);
        fputs(": ", w->f);
    }
}

void jw_begin(jw *w, const char *key, char open, char close, int row)
{
    jw_sep(w, key);
    fputc(open, w->f);
    if (w->depth >= JW_MAXDEPTH) return; /* a caller's bug: the nesting is fixed and shallow */
    if (row && w->inline_from > w->depth) w->inline_from = w->depth;
    w->close[w->depth] = close;
    w->count[w->depth++] = 0;
}

void jw_end(jw *w)
{
    if (w->depth == 0) return;
    w->depth--;
    if (w->count[w->depth] && w->depth < w->inline_from) fprintf(w->f, "\n%*s", 2 * w->depth, "");
    fputc(w->close[w->depth], w->f);
    if (w->depth == w->inline_from) w->inline_from = JW_MAXDEPTH;
    if (w->depth == 0) fputc('\n', w->f);
}

void jw_str(jw *w, const char *key, const char *s)
{
    jw_sep(w, key);
    if (s)
        jw_put_string(w->f, s);
    else
        fputs("null", w->f);
}

void jw_int(jw *w, const char *key, int64_t v)
{
    jw_sep(w, key);
    fprintf(w->f, "%lld", (long long)v);
}

void jw_uint(jw *w, const char *key, uint64_t v)
{
    jw_sep(w, key);
    fprintf(w->f, "%llu", (unsigned long long)v);
}

void jw_num(jw *w, const char *key, double v)
{
    jw_sep(w, key);
    /* %.10g: ten digits are more than any figure here means; the C locale
     * (the tool never sets another) writes the '.' JSON wants */
    if (isfinite(v))
        fprintf(w->f, "%.10g", v);
    else
        fputs("null", w->f);
}

void jw_float(jw *w, const char *key, float v)
{
    char buf[32];
    int digits = 6;
    jw_sep(w, key);
    if (!isfinite(v)) {
        fputs("null", w->f);
        return;
    }
    /* the shortest text that reads back as the same float: 0.01, not the
     * 0.009999999776 of its double */
    do snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
    while (strtof(buf, NULL) != v && ++digits < 9);
    fputs(buf, w->f);
}

void jw_bool(jw *w, const char *key, int v)
{
    jw_sep(w, key);
    fputs(v ? "true" : "false", w->f);
}
