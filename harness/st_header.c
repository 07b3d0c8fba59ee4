/*
 * st_header.c - a safetensors header's JSON, checked and read (the rule is
 * in st_header.h).
 *
 * Two passes over the text. The first checks the syntax and stores nothing
 * (a stack of 32 bytes for the nesting). The second walks text known to be
 * valid, follows the schema and stores each tensor entry as it ends; a
 * value the schema has no place for is skipped over, never stored. Every
 * decoded string (names, dtypes, metadata) goes into one block the size of
 * the header: a decoded JSON string is never longer than its text.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_header.h"
#include "text.h"

typedef struct cur {
    const unsigned char *h;
    size_t n, i; /* the text, its length, where we are */
    char *err;
    size_t errn;
    char *strings; /* the block for decoded strings (f->strings) */
    size_t used;
} cur;

static int fault(cur *c, const char *fmt, ...)
{
    va_list ap;
    if (c->err && c->errn) {
        va_start(ap, fmt);
        vsnprintf(c->err, c->errn, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static unsigned char peek(const cur *c)
{
    return c->i < c->n ? c->h[c->i] : 0; /* 0: the end (no NUL is inside) */
}

static int is_ws(unsigned char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static void ws(cur *c)
{
    while (c->i < c->n && is_ws(c->h[c->i])) c->i++;
}

static int is_digit(unsigned char ch)
{
    return ch >= '0' && ch <= '9';
}

/* Characters a number or a word is made of: what a fault names. */
static int run_char(unsigned char ch)
{
    return is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '.' ||
           ch == '+' || ch == '-';
}

static int hexval(unsigned char ch)
{
    if (is_digit(ch)) return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* 0 when s[0..n) is valid UTF-8 (no overlong form, no surrogate, nothing
 * past U+10FFFF), else -1 with *at the offset of the first bad byte. */
static int utf8_valid(const unsigned char *s, size_t n, size_t *at)
{
    size_t i = 0, k, len;
    uint32_t cp, min;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            break;
        }
        if (n - i < len) break;
        for (k = 1; k < len && (s[i + k] & 0xC0) == 0x80; k++) cp = (cp << 6) | (s[i + k] & 0x3F);
        if (k < len || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) break;
        i += len;
    }
    *at = i;
    return i < n ? -1 : 0;
}

/* ==== pass 1: the syntax ==== */

static int end_fault(cur *c)
{
    return fault(c, "bad header JSON: unexpected end of header");
}

static int word_is(const unsigned char *s, size_t n, const char *w)
{
    size_t k;
    if (strlen(w) != n) return 0;
    for (k = 0; k < n; k++) {
        unsigned char ch = s[k];
        if (ch >= 'A' && ch <= 'Z') ch = (unsigned char)(ch - 'A' + 'a');
        if (ch != (unsigned char)w[k]) return 0;
    }
    return 1;
}

/* What stands at `at` where a value must be, and is not one: named by its
 * run of letters, digits, signs and points (printable: nothing of the file
 * but those), at most 24 of them. */
static int value_fault(cur *c, size_t at)
{
    size_t j = at, len;
    char tok[32];
    while (j < c->n && run_char(c->h[j])) j++;
    len = j - at;
    if (len == 0) return fault(c, "bad header JSON: expected a value (byte %zu of the JSON)", at);
    snprintf(tok, sizeof tok, "%.*s%s", (int)(len > 24 ? 24 : len), (const char *)c->h + at,
             len > 24 ? "..." : "");
    if (is_digit(c->h[at]) || c->h[at] == '-' || c->h[at] == '+' || c->h[at] == '.' ||
        word_is(c->h + at, len, "nan") || word_is(c->h + at, len, "inf") ||
        word_is(c->h + at, len, "infinity"))
        return fault(c,
                     "bad header JSON: '%s' is not a JSON number: RFC 8259 has no NaN or "
                     "Infinity, no leading zeros, no '+', and digits on both sides of a '.' "
                     "(byte %zu of the JSON)",
                     tok, at);
    return fault(c, "bad header JSON: '%s' is not a JSON value (byte %zu of the JSON)", tok, at);
}

/* End of the RFC 8259 number at i (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?,
 * not followed by another letter, digit, sign or point), or 0 when there is
 * none; *integer: no fraction, no exponent. */
static size_t number_end(const unsigned char *h, size_t n, size_t i, int *integer)
{
    *integer = 1;
    if (i < n && h[i] == '-') i++;
    if (i < n && h[i] == '0') {
        i++;
    } else if (i < n && h[i] >= '1' && h[i] <= '9') {
        while (i < n && is_digit(h[i])) i++;
    } else {
        return 0;
    }
    if (i < n && h[i] == '.') {
        *integer = 0;
        if (++i >= n || !is_digit(h[i])) return 0;
        while (i < n && is_digit(h[i])) i++;
    }
    if (i < n && (h[i] == 'e' || h[i] == 'E')) {
        *integer = 0;
        i++;
        if (i < n && (h[i] == '+' || h[i] == '-')) i++;
        if (i >= n || !is_digit(h[i])) return 0;
        while (i < n && is_digit(h[i])) i++;
    }
    return i < n && run_char(h[i]) ? 0 : i; /* "00", "1.2.3", "1x" */
}

static int word_exact(const unsigned char *s, size_t n, const char *w)
{
    return strlen(w) == n && !memcmp(s, w, n);
}

/* A number or true, false, null (JSON's words are lower case) at c->i. */
static int syn_scalar(cur *c)
{
    size_t at = c->i, j = at, end;
    int integer;
    if (is_digit(c->h[at]) || c->h[at] == '-') {
        end = number_end(c->h, c->n, at, &integer);
        if (!end) return value_fault(c, at);
        c->i = end;
        return 0;
    }
    while (j < c->n && run_char(c->h[j])) j++;
    if (!word_exact(c->h + at, j - at, "true") && !word_exact(c->h + at, j - at, "false") &&
        !word_exact(c->h + at, j - at, "null"))
        return value_fault(c, at);
    c->i = j;
    return 0;
}

static int surrogate_fault(cur *c, size_t at)
{
    return fault(c,
                 "bad header: a string of the JSON has an unpaired UTF-16 surrogate escape, not "
                 "valid Unicode (byte %zu of the JSON)",
                 at);
}

/* The string at c->i ('"'): raw control characters, escapes, \u0000 (a C
 * string, a name, would end there) and surrogate escapes (a lone one is no
 * character: json-c made it U+FFFD, another name). */
static int syn_string(cur *c)
{
    const unsigned char *h = c->h;
    size_t i = c->i + 1, hi_at = 0;
    int hi = 0, k;
    for (;;) {
        unsigned ch, v;
        if (i >= c->n) return end_fault(c);
        ch = h[i];
        if (ch < 0x20)
            return fault(c,
                         "bad header JSON: a raw control character U+%04X inside a string; JSON "
                         "allows it only escaped (byte %zu of the JSON)",
                         ch, i);
        if (ch != '\\') { /* the closing quote, or a character of the string */
            if (hi) return surrogate_fault(c, hi_at);
            i++;
            if (ch == '"') break;
            continue;
        }
        if (i + 1 >= c->n) return end_fault(c);
        ch = h[i + 1];
        if (ch != 'u') {
            if (hi) return surrogate_fault(c, hi_at);
            if (!strchr("\"\\/bfnrt", (int)ch) || ch == 0) {
                if (ch > 0x20 && ch < 0x7F)
                    return fault(c,
                                 "bad header JSON: an invalid escape '\\%c' in a string (byte %zu "
                                 "of the JSON)",
                                 (int)ch, i);
                return fault(c, "bad header JSON: an invalid escape in a string (byte %zu of the JSON)",
                             i);
            }
            i += 2;
            continue;
        }
        for (v = 0, k = 0; k < 4; k++) {
            int d;
            if (i + 2 + (size_t)k >= c->n) return end_fault(c);
            d = hexval(h[i + 2 + k]);
            if (d < 0)
                return fault(c,
                             "bad header JSON: a \\u escape without four hex digits (byte %zu of "
                             "the JSON)",
                             i);
            v = (v << 4) | (unsigned)d;
        }
        if (v == 0)
            return fault(c, "bad header: \\u0000 (NUL) inside a string of the JSON (byte %zu of the JSON)",
                         i);
        if (v >= 0xD800 && v <= 0xDBFF) {
            if (hi) return surrogate_fault(c, hi_at);
            hi = 1;
            hi_at = i;
        } else if (v >= 0xDC00 && v <= 0xDFFF) {
            if (!hi) return surrogate_fault(c, i);
            hi = 0;
        } else if (hi) {
            return surrogate_fault(c, hi_at);
        }
        i += 6;
    }
    c->i = i;
    return 0;
}

/* The whole text: one JSON value and padding. A state machine over a stack
 * of open containers ('{' or '['), so nothing is allocated. */
static int syntax(cur *c)
{
    unsigned char stack[ST_MAX_DEPTH], ch;
    int depth = 0;
    c->i = 0;
    ws(c);
value:
    if (c->i >= c->n) return end_fault(c);
    ch = c->h[c->i];
    if (ch == '{' || ch == '[') {
        if (depth == ST_MAX_DEPTH)
            return fault(c, "bad header JSON: nesting too deep: more than %d levels (byte %zu of the JSON)",
                         ST_MAX_DEPTH, c->i);
        stack[depth++] = ch;
        c->i++;
        ws(c);
        if (peek(c) == (ch == '{' ? '}' : ']')) { /* empty */
            c->i++;
            depth--;
            goto after;
        }
        if (ch == '{') goto key;
        goto value;
    }
    if (ch == '"' ? syn_string(c) : syn_scalar(c)) return -1;
    goto after;
key:
    if (c->i >= c->n) return end_fault(c);
    if (c->h[c->i] != '"')
        return fault(c, "bad header JSON: expected a string key (byte %zu of the JSON)", c->i);
    if (syn_string(c)) return -1;
    ws(c);
    if (c->i >= c->n) return end_fault(c);
    if (c->h[c->i] != ':')
        return fault(c, "bad header JSON: expected ':' after a key (byte %zu of the JSON)", c->i);
    c->i++;
    ws(c);
    goto value;
after: /* a value has ended */
    ws(c);
    if (depth == 0) {
        if (c->i < c->n)
            return fault(c, "bad header JSON: bytes after the top-level object (byte %zu of the JSON)",
                         c->i);
        return 0;
    }
    if (c->i >= c->n) return end_fault(c);
    ch = c->h[c->i];
    if (ch == ',') {
        c->i++;
        ws(c);
        if (stack[depth - 1] == '{') goto key;
        goto value;
    }
    if (ch == (stack[depth - 1] == '{' ? '}' : ']')) {
        c->i++;
        depth--;
        goto after;
    }
    return fault(c,
                 stack[depth - 1] == '{'
                     ? "bad header JSON: expected ',' or '}' after a member (byte %zu of the JSON)"
                     : "bad header JSON: expected ',' or ']' after an element (byte %zu of the JSON)",
                 c->i);
}

/* ==== pass 2: the schema, on text the syntax has passed ==== */

static void skip_string(cur *c)
{
    c->i++;
    while (c->i < c->n && c->h[c->i] != '"') c->i += c->h[c->i] == '\\' ? 2 : 1;
    c->i++;
}

/* Past the value at c->i, whatever it holds, storing nothing. */
static void skip_value(cur *c)
{
    long depth = 0;
    for (;;) {
        unsigned char ch;
        ws(c);
        ch = peek(c);
        if (!ch) return;
        if (ch == '"') {
            skip_string(c);
        } else if (ch == '{' || ch == '[') {
            depth++;
            c->i++;
            continue;
        } else if (ch == '}' || ch == ']') {
            depth--;
            c->i++;
        } else if (ch == ',' || ch == ':') {
            c->i++;
            continue;
        } else {
            while (c->i < c->n && run_char(c->h[c->i])) c->i++;
        }
        if (depth <= 0) return;
    }
}

/* Past the ',' or the closing bracket after a member or an element: 1 when
 * another one follows. */
static int next_item(cur *c)
{
    ws(c);
    if (peek(c) == ',') {
        c->i++;
        ws(c);
        return 1;
    }
    c->i++;
    return 0;
}

/* Past the key and the ':' of a member: its value is at c->i. */
static void past_colon(cur *c)
{
    ws(c);
    c->i++;
    ws(c);
}

static void put_utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xC0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static unsigned hex4(const unsigned char *s)
{
    return (unsigned)(hexval(s[0]) << 12 | hexval(s[1]) << 8 | hexval(s[2]) << 4 | hexval(s[3]));
}

/* The string at c->i, decoded into the strings block (its text, quotes
 * included, is longer than what it decodes to, so the block of the
 * header's size never overflows); c->i moves past it. */
static char *take_string(cur *c)
{
    const unsigned char *h = c->h;
    char *o = c->strings + c->used;
    size_t i = c->i + 1, k = 0;
    while (i < c->n && h[i] != '"') {
        uint32_t cp;
        if (h[i] != '\\') {
            o[k++] = (char)h[i++];
            continue;
        }
        if (h[i + 1] != 'u') {
            switch (h[i + 1]) {
            case 'b': o[k++] = '\b'; break;
            case 'f': o[k++] = '\f'; break;
            case 'n': o[k++] = '\n'; break;
            case 'r': o[k++] = '\r'; break;
            case 't': o[k++] = '\t'; break;
            default: o[k++] = (char)h[i + 1]; break; /* " \ / */
            }
            i += 2;
            continue;
        }
        cp = hex4(h + i + 2);
        i += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* the syntax has its low half next */
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(h + i + 2) - 0xDC00);
            i += 6;
        }
        put_utf8(o, &k, cp);
    }
    o[k] = '\0';
    c->used += k + 1;
    c->i = i + 1;
    return o;
}

/* The value at c->i as a non-negative integer <= ST_MAX_INT into *v: 0;
 * -1 for anything else (not a number, a fraction or an exponent, a
 * negative, a larger one). "-0" is 0. Moves past the value either way. */
static int take_nonneg(cur *c, int64_t *v)
{
    size_t end;
    int integer, neg;
    uint64_t x = 0;
    unsigned char ch = peek(c);
    if (!is_digit(ch) && ch != '-') {
        skip_value(c);
        return -1;
    }
    end = number_end(c->h, c->n, c->i, &integer);
    neg = ch == '-';
    if (integer)
        for (c->i += (size_t)neg; c->i < end && x <= (uint64_t)ST_MAX_INT; c->i++)
            x = x * 10 + (uint64_t)(c->h[c->i] - '0');
    c->i = end;
    if (!integer || x > (uint64_t)ST_MAX_INT || (neg && x != 0)) return -1;
    *v = (int64_t)x;
    return 0;
}

/* json-c's name for the kind of the value at c->i, as the reader once said. */
static const char *json_kind_name(const cur *c)
{
    int integer;
    switch (peek(c)) {
    case '{': return "object";
    case '[': return "array";
    case '"': return "string";
    case 't':
    case 'f': return "boolean";
    case 'n': return "null";
    default:
        number_end(c->h, c->n, c->i, &integer);
        return integer ? "int" : "double";
    }
}

/* Bytes per element of the dtypes the format defines; 0 for unknown. */
static size_t dtype_size(const char *d)
{
    static const struct {
        const char *name;
        size_t size;
    } tab[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
               {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
               {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
    size_t i;
    for (i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(tab[i].name, d)) return tab[i].size;
    return 0;
}

/* Elements of the array, or members of the object, at c->i (c->i stays). */
static size_t container_length(cur *c)
{
    size_t save = c->i, n = 0;
    int object = peek(c) == '{';
    c->i++;
    ws(c);
    if (peek(c) != (object ? '}' : ']'))
        do {
            if (object) {
                skip_string(c);
                past_colon(c);
            }
            skip_value(c);
            n++;
        } while (next_item(c));
    c->i = save;
    return n;
}

enum { F_DTYPE, F_SHAPE, F_OFFSETS, F_N };
static const char *const field_name[F_N] = {"dtype", "shape", "data_offsets"};

/* The entry (value at c->i) of tensor t (its name set) against a data
 * section of dlen bytes. Its members are read first (an unknown field or
 * one given twice is refused there), then checked in a fixed order. */
static int take_entry(cur *c, st_tensor *t, uint64_t dlen)
{
    size_t at[F_N] = {0, 0, 0}, end, nd, d;
    int have[F_N] = {0, 0, 0}, f;
    int64_t numel = 1, b = -1, en = -1;
    char nm[HU_ESC_NAME], other[HU_ESC_NAME];
    const char *dt;

    hu_escape(nm, sizeof nm, t->name, 0);
    if (peek(c) != '{')
        return fault(c, "header: entry '%s' must be an object with dtype, shape, data_offsets", nm);
    c->i++;
    ws(c);
    if (peek(c) == '}')
        c->i++;
    else
        do {
            const char *k = take_string(c);
            for (f = 0; f < F_N && strcmp(k, field_name[f]); f++) {
            }
            if (f == F_N)
                return fault(c,
                             "header: tensor '%s' has an unknown field '%s'; an entry holds "
                             "dtype, shape and data_offsets only",
                             nm, hu_escape(other, sizeof other, k, 0));
            if (have[f])
                return fault(c, "bad header JSON: a key appears twice inside the entry '%s'", nm);
            past_colon(c);
            have[f] = 1;
            at[f] = c->i;
            skip_value(c);
        } while (next_item(c));
    end = c->i;

    c->i = at[F_DTYPE];
    if (!have[F_DTYPE] || peek(c) != '"')
        return fault(c, "header: tensor '%s' has no string \"dtype\"", nm);
    dt = take_string(c);
    t->elem_size = dtype_size(dt);
    if (!t->elem_size)
        return fault(c, "header: tensor '%s' has unknown dtype \"%s\"", nm,
                     hu_escape(other, sizeof other, dt, 20));
    snprintf(t->dtype, sizeof t->dtype, "%s", dt);

    c->i = at[F_SHAPE];
    if (!have[F_SHAPE] || peek(c) != '[')
        return fault(c, "header: tensor '%s' has no array \"shape\"", nm);
    nd = container_length(c);
    if (nd > ST_MAX_DIMS)
        return fault(c, "header: tensor '%s' has %zu dimensions (at most %d)", nm, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    c->i++;
    for (d = 0; d < nd; d++) {
        int64_t v = -1;
        ws(c);
        if (take_nonneg(c, &v))
            return fault(c, "header: tensor '%s': shape[%zu] is not a non-negative integer", nm, d);
        t->shape[d] = v;
        if (v && numel > ST_MAX_INT / v) return fault(c, "header: tensor '%s': shape too large", nm);
        numel *= v;
        next_item(c);
    }
    t->numel = numel;

    c->i = at[F_OFFSETS];
    if (!have[F_OFFSETS] || peek(c) != '[' || container_length(c) != 2)
        return fault(c, "header: tensor '%s' has no \"data_offsets\": [begin, end]", nm);
    c->i++;
    ws(c);
    if (take_nonneg(c, &b)) b = -1;
    next_item(c);
    if (take_nonneg(c, &en)) en = -1;
    if (b < 0 || en < 0 || en < b)
        return fault(c, "header: tensor '%s': data_offsets must be integers 0 <= begin <= end", nm);
    if ((uint64_t)en > dlen)
        return fault(c,
                     "truncated: tensor '%s' data_offsets end %lld is past the end of the data "
                     "(%llu bytes)",
                     nm, (long long)en, (unsigned long long)dlen);
    if ((uint64_t)(en - b) != (uint64_t)numel * t->elem_size)
        return fault(c, "tensor '%s': data_offsets span %lld bytes, but %s x %lld elements need %llu",
                     nm, (long long)(en - b), t->dtype, (long long)numel,
                     (unsigned long long)((uint64_t)numel * t->elem_size));
    t->offset = (size_t)b; /* b <= dlen, which fits in size_t (st_open) */
    c->i = end;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The first of v[0..n) (sorted: the smallest) given twice, or NULL. */
static const char *first_twice(const char **v, size_t n)
{
    size_t i;
    qsort(v, n, sizeof *v, cmp_str);
    for (i = 1; i < n; i++)
        if (!strcmp(v[i - 1], v[i])) return v[i];
    return NULL;
}

/* __metadata__ (value at c->i): an object of strings, no key twice. */
static int take_meta(cur *c, st_file *f)
{
    size_t count, k;
    const char **keys;
    char nm[HU_ESC_NAME];
    if (peek(c) != '{') return fault(c, "header: __metadata__ must be an object of strings");
    count = container_length(c); /* the pointers' room, once */
    f->meta = calloc(2 * count + 1, sizeof *f->meta);
    if (!f->meta) return fault(c, "out of memory");
    c->i++;
    ws(c);
    if (peek(c) == '}') {
        c->i++;
        return 0;
    }
    do {
        const char *key = take_string(c);
        past_colon(c);
        if (peek(c) != '"')
            return fault(c, "header: __metadata__ value of '%s' must be a string",
                         hu_escape(nm, sizeof nm, key, 0));
        f->meta[2 * f->nmeta] = (char *)key;
        f->meta[2 * f->nmeta + 1] = take_string(c);
        f->nmeta++;
    } while (next_item(c));
    keys = malloc((size_t)f->nmeta * sizeof *keys + 1);
    if (!keys) return fault(c, "out of memory");
    for (k = 0; k < (size_t)f->nmeta; k++) keys[k] = f->meta[2 * k];
    k = first_twice(keys, (size_t)f->nmeta) != NULL;
    free(keys);
    if (k) return fault(c, "bad header JSON: a key appears twice inside the entry '__metadata__'");
    return 0;
}

/* Step 4: a name given twice at the top level (readers keep different
 * entries of it). */
static int check_names(cur *c, const st_file *f, int meta_count)
{
    size_t n = (size_t)f->ntensors + (size_t)meta_count, k = 0;
    const char **v = malloc(n * sizeof *v + 1), *twice;
    char nm[HU_ESC_NAME];
    int i;
    if (!v) return fault(c, "out of memory");
    for (i = 0; i < f->ntensors; i++) v[k++] = f->tensors[i].name;
    for (i = 0; i < meta_count; i++) v[k++] = "__metadata__";
    twice = first_twice(v, n);
    if (twice) hu_escape(nm, sizeof nm, twice, 0);
    free(v);
    if (twice) return fault(c, "bad header JSON: the name '%s' appears twice", nm);
    return 0;
}

static int schema(cur *c, st_file *f, uint64_t dlen)
{
    int cap = 0, meta_count = 0;
    c->i = 0;
    ws(c);
    if (peek(c) != '{')
        return fault(c, "bad header JSON: the top level must be an object, not %s", json_kind_name(c));
    c->i++;
    ws(c);
    if (peek(c) == '}') return 0;
    do {
        char *name = take_string(c);
        past_colon(c);
        if (!strcmp(name, "__metadata__")) {
            if (meta_count++ == 0) {
                if (take_meta(c, f)) return -1;
            } else {
                skip_value(c); /* only counted: step 4 refuses the name */
            }
            continue;
        }
        if (f->ntensors == cap) {
            /* grown as entries come: only stored entries take room */
            st_tensor *t = realloc(f->tensors, sizeof *t * (size_t)(cap ? 2 * cap : 16));
            if (!t) return fault(c, "out of memory");
            f->tensors = t;
            cap = cap ? 2 * cap : 16;
        }
        memset(&f->tensors[f->ntensors], 0, sizeof f->tensors[0]);
        f->tensors[f->ntensors].name = name;
        if (take_entry(c, &f->tensors[f->ntensors++], dlen)) return -1;
    } while (next_item(c));
    return check_names(c, f, meta_count);
}

int st_parse_header(st_file *f, const unsigned char *h, size_t n, uint64_t dlen, char *err,
                    size_t errn)
{
    cur c;
    size_t bad;
    memset(&c, 0, sizeof c);
    c.h = h;
    c.n = n;
    c.err = err;
    c.errn = errn;
    if (memchr(h, 0, n)) return fault(&c, "bad header: NUL byte inside the JSON");
    if (utf8_valid(h, n, &bad))
        return fault(&c, "bad header: not valid UTF-8 (byte %zu of the JSON)", bad);
    if (syntax(&c)) return -1;
    f->strings = malloc(n + 1);
    if (!f->strings) return fault(&c, "out of memory");
    c.strings = f->strings;
    return schema(&c, f, dlen);
}
