/*
 * safetensors.c - the safetensors reader and writer of the beammoe tool.
 *
 * The reader loads the whole file, parses the header with json-c and checks
 * every number it takes from it against the file before any byte is used:
 * header length within the file, shapes non-negative with a product that
 * does not overflow, data_offsets ordered, inside the data section, and
 * exactly numel * dtype-size bytes long. Element decoding is explicit
 * little-endian, so the tool reads the same bytes on any host.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fileno, fstat under -std=c99 */
#endif
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"

#ifdef HAVE_JSON_C
#include <json.h>
#endif

static void set_err(char *err, size_t errn, const char *fmt, ...)
{
    va_list ap;
    if (!err || !errn) return;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
}

int st_available(void)
{
#ifdef HAVE_JSON_C
    return 1;
#else
    return 0;
#endif
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    int i;
    for (i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key)
{
    int i;
    for (i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

void st_close(st_file *f)
{
    int i;
    for (i = 0; i < f->ntensors; i++) free(f->tensors[i].name);
    for (i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
    free(f->tensors);
    free(f->meta);
    free(f->bytes);
    memset(f, 0, sizeof *f);
}

void st_get_u16(const st_tensor *t, uint16_t *dst)
{
    int64_t i;
    const unsigned char *s = t->data;
    for (i = 0; i < t->numel; i++) dst[i] = (uint16_t)(s[2 * i] | (s[2 * i + 1] << 8));
}

void st_get_f32(const st_tensor *t, float *dst)
{
    int64_t i;
    const unsigned char *s = t->data;
    for (i = 0; i < t->numel; i++) {
        uint32_t u = (uint32_t)s[4 * i] | ((uint32_t)s[4 * i + 1] << 8) |
                     ((uint32_t)s[4 * i + 2] << 16) | ((uint32_t)s[4 * i + 3] << 24);
        memcpy(&dst[i], &u, sizeof u);
    }
}

#ifdef HAVE_JSON_C

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

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Whole file into memory: a regular file only (a directory or a FIFO gives
 * a message, not a read error later). */
static int read_all(const char *path, unsigned char **out, size_t *size, char *err, size_t errn)
{
    FILE *fp = fopen(path, "rb");
    struct stat sb;
    unsigned char *buf;
    size_t n;
    if (!fp) {
        set_err(err, errn, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        set_err(err, errn, "not a regular file");
        fclose(fp);
        return -1;
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX - 1) {
        set_err(err, errn, "file too large for this host");
        fclose(fp);
        return -1;
    }
    n = (size_t)sb.st_size;
    buf = malloc(n ? n : 1);
    if (!buf) {
        set_err(err, errn, "out of memory reading %zu bytes", n);
        fclose(fp);
        return -1;
    }
    if (n && fread(buf, 1, n, fp) != n) {
        set_err(err, errn, "read error: %s", ferror(fp) ? strerror(errno) : "file shrank");
        free(buf);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    *out = buf;
    *size = n;
    return 0;
}

/* Largest integer a shape or offset may hold: far beyond any real file,
 * and products of two such values are still checked before multiplying. */
#define ST_MAX_INT ((int64_t)1 << 53)

/* A non-negative JSON integer <= ST_MAX_INT, or -1. */
static int64_t json_nonneg(struct json_object *o)
{
    int64_t v;
    if (!o || !json_object_is_type(o, json_type_int)) return -1;
    errno = 0;
    v = json_object_get_int64(o);
    if (v < 0 || v > ST_MAX_INT) return -1;
    return v;
}

static int parse_metadata(st_file *f, struct json_object *md, char *err, size_t errn)
{
    struct json_object_iterator it, end;
    int n = 0;
    if (!json_object_is_type(md, json_type_object)) {
        set_err(err, errn, "header: __metadata__ must be an object of strings");
        return -1;
    }
    f->meta = calloc((size_t)json_object_object_length(md) * 2 + 1, sizeof *f->meta);
    if (!f->meta) goto oom;
    it = json_object_iter_begin(md);
    end = json_object_iter_end(md);
    for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
        const char *k = json_object_iter_peek_name(&it);
        struct json_object *v = json_object_iter_peek_value(&it);
        if (!json_object_is_type(v, json_type_string)) {
            set_err(err, errn, "header: __metadata__ value of '%s' must be a string", k);
            return -1;
        }
        f->meta[2 * n] = dup_str(k);
        f->meta[2 * n + 1] = dup_str(json_object_get_string(v));
        f->nmeta = ++n;
        if (!f->meta[2 * n - 2] || !f->meta[2 * n - 1]) goto oom;
    }
    return 0;
oom:
    set_err(err, errn, "out of memory");
    return -1;
}

/* One tensor entry: dtype, shape, data_offsets, all checked against the
 * data section [data, data + dlen). */
static int parse_tensor(st_tensor *t, const char *name, struct json_object *e,
                        const unsigned char *data, uint64_t dlen, char *err, size_t errn)
{
    struct json_object *dt, *sh, *off;
    int64_t numel = 1, b, en;
    size_t i, nd;
    const char *d;
    if (!json_object_is_type(e, json_type_object)) {
        set_err(err, errn, "header: entry '%s' must be an object with dtype, shape, data_offsets",
                name);
        return -1;
    }
    if (!json_object_object_get_ex(e, "dtype", &dt) || !json_object_is_type(dt, json_type_string)) {
        set_err(err, errn, "header: tensor '%s' has no string \"dtype\"", name);
        return -1;
    }
    d = json_object_get_string(dt);
    t->elem_size = dtype_size(d);
    if (!t->elem_size) {
        set_err(err, errn, "header: tensor '%s' has unknown dtype \"%.20s\"", name, d);
        return -1;
    }
    snprintf(t->dtype, sizeof t->dtype, "%s", d);
    if (!json_object_object_get_ex(e, "shape", &sh) || !json_object_is_type(sh, json_type_array)) {
        set_err(err, errn, "header: tensor '%s' has no array \"shape\"", name);
        return -1;
    }
    nd = json_object_array_length(sh);
    if (nd > ST_MAX_DIMS) {
        set_err(err, errn, "header: tensor '%s' has %zu dimensions (at most %d)", name, nd,
                ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    for (i = 0; i < nd; i++) {
        int64_t v = json_nonneg(json_object_array_get_idx(sh, i));
        if (v < 0) {
            set_err(err, errn, "header: tensor '%s': shape[%zu] is not a non-negative integer",
                    name, i);
            return -1;
        }
        t->shape[i] = v;
        if (v && numel > ST_MAX_INT / v) {
            set_err(err, errn, "header: tensor '%s': shape too large", name);
            return -1;
        }
        numel *= v;
    }
    t->numel = numel;
    if (!json_object_object_get_ex(e, "data_offsets", &off) ||
        !json_object_is_type(off, json_type_array) || json_object_array_length(off) != 2) {
        set_err(err, errn, "header: tensor '%s' has no \"data_offsets\": [begin, end]", name);
        return -1;
    }
    b = json_nonneg(json_object_array_get_idx(off, 0));
    en = json_nonneg(json_object_array_get_idx(off, 1));
    if (b < 0 || en < 0 || en < b) {
        set_err(err, errn, "header: tensor '%s': data_offsets must be integers 0 <= begin <= end",
                name);
        return -1;
    }
    if ((uint64_t)en > dlen) {
        set_err(err, errn,
                "truncated: tensor '%s' data_offsets end %lld is past the end of the data "
                "(%llu bytes)",
                name, (long long)en, (unsigned long long)dlen);
        return -1;
    }
    if ((uint64_t)(en - b) != (uint64_t)numel * t->elem_size) {
        set_err(err, errn,
                "tensor '%s': data_offsets span %lld bytes, but %s x %lld elements need %llu",
                name, (long long)(en - b), t->dtype, (long long)numel,
                (unsigned long long)((uint64_t)numel * t->elem_size));
        return -1;
    }
    t->data = data + b;
    return 0;
}

int st_open(st_file *f, const char *path, char *err, size_t errn)
{
    uint64_t hlen = 0;
    int i;
    char *hdr = NULL;
    struct json_tokener *tok = NULL;
    struct json_object *root = NULL;
    struct json_object_iterator it, end;
    enum json_tokener_error jerr;
    size_t parsed;

    memset(f, 0, sizeof *f);
    if (read_all(path, &f->bytes, &f->size, err, errn)) return -1;
    if (f->size < 8) {
        set_err(err, errn, "truncated: %zu bytes, shorter than the 8-byte header length", f->size);
        goto fail;
    }
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | f->bytes[i];
    if (hlen > f->size - 8) {
        set_err(err, errn, "truncated: header length %llu is past the end of the file (%zu bytes)",
                (unsigned long long)hlen, f->size);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER || hlen < 2) {
        set_err(err, errn, "header length %llu is not in [2, %llu]", (unsigned long long)hlen,
                (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    /* a NUL-terminated copy: json-c reads at most hlen bytes, and the
     * trailing-bytes check below must not run past them */
    hdr = malloc((size_t)hlen + 1);
    if (!hdr) {
        set_err(err, errn, "out of memory");
        goto fail;
    }
    memcpy(hdr, f->bytes + 8, (size_t)hlen);
    hdr[hlen] = '\0';
    if (strlen(hdr) != (size_t)hlen) {
        set_err(err, errn, "bad header: NUL byte inside the JSON");
        goto fail;
    }
    tok = json_tokener_new_ex(32);
    if (!tok) {
        set_err(err, errn, "out of memory");
        goto fail;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    root = json_tokener_parse_ex(tok, hdr, (int)hlen);
    jerr = json_tokener_get_error(tok);
    if (!root || jerr != json_tokener_success) {
        set_err(err, errn, "bad header JSON: %s",
                jerr == json_tokener_continue ? "unexpected end of header"
                                              : json_tokener_error_desc(jerr));
        goto fail;
    }
#if defined(JSON_C_VERSION_NUM) && JSON_C_VERSION_NUM >= ((0 << 16) | (15 << 8))
    parsed = json_tokener_get_parse_end(tok);
#else
    parsed = (size_t)tok->char_offset;
#endif
    /* only the padding the format allows may follow the object */
    for (; parsed < (size_t)hlen; parsed++)
        if (hdr[parsed] != ' ' && hdr[parsed] != '\t' && hdr[parsed] != '\n' &&
            hdr[parsed] != '\r') {
            set_err(err, errn, "bad header JSON: bytes after the top-level object");
            goto fail;
        }
    if (!json_object_is_type(root, json_type_object)) {
        set_err(err, errn, "bad header JSON: the top level must be an object");
        goto fail;
    }
    f->tensors = calloc((size_t)json_object_object_length(root) + 1, sizeof *f->tensors);
    if (!f->tensors) {
        set_err(err, errn, "out of memory");
        goto fail;
    }
    it = json_object_iter_begin(root);
    end = json_object_iter_end(root);
    for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
        const char *name = json_object_iter_peek_name(&it);
        struct json_object *v = json_object_iter_peek_value(&it);
        st_tensor *t;
        if (!strcmp(name, "__metadata__")) {
            if (parse_metadata(f, v, err, errn)) goto fail;
            continue;
        }
        t = &f->tensors[f->ntensors];
        memset(t, 0, sizeof *t);
        t->name = dup_str(name);
        if (!t->name) {
            set_err(err, errn, "out of memory");
            goto fail;
        }
        f->ntensors++;
        if (parse_tensor(t, name, v, f->bytes + 8 + hlen, f->size - 8 - hlen, err, errn))
            goto fail;
    }
    json_object_put(root);
    json_tokener_free(tok);
    free(hdr);
    return 0;
fail:
    if (root) json_object_put(root);
    if (tok) json_tokener_free(tok);
    free(hdr);
    st_close(f);
    return -1;
}

static void put_le(unsigned char *d, const void *src, int is_f32, int64_t n)
{
    int64_t i;
    if (is_f32) {
        const float *s = src;
        for (i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &s[i], sizeof u);
            d[4 * i] = (unsigned char)u;
            d[4 * i + 1] = (unsigned char)(u >> 8);
            d[4 * i + 2] = (unsigned char)(u >> 16);
            d[4 * i + 3] = (unsigned char)(u >> 24);
        }
    } else {
        const uint16_t *s = src;
        for (i = 0; i < n; i++) {
            d[2 * i] = (unsigned char)s[i];
            d[2 * i + 1] = (unsigned char)(s[i] >> 8);
        }
    }
}

int st_write(const char *path, const st_out *t, int n, const char *const *meta, int nmeta,
             char *err, size_t errn)
{
    struct json_object *root = json_object_new_object(), *md = NULL;
    const char *js;
    size_t jlen, hlen, i;
    uint64_t off = 0;
    unsigned char len8[8], *buf = NULL;
    size_t bufn = 0;
    FILE *fp = NULL;
    int k, d, rc = -1;

    if (!root) goto oom;
    if (nmeta > 0) {
        md = json_object_new_object();
        if (!md) goto oom;
        for (k = 0; k < nmeta; k++)
            json_object_object_add(md, meta[2 * k], json_object_new_string(meta[2 * k + 1]));
        json_object_object_add(root, "__metadata__", md);
    }
    for (k = 0; k < n; k++) {
        struct json_object *e = json_object_new_object(), *sh = json_object_new_array(),
                           *of = json_object_new_array();
        int64_t numel = 1;
        if (!e || !sh || !of) goto oom;
        for (d = 0; d < t[k].ndim; d++) {
            json_object_array_add(sh, json_object_new_int64(t[k].shape[d]));
            numel *= t[k].shape[d];
        }
        json_object_object_add(e, "dtype", json_object_new_string(t[k].is_f32 ? "F32" : "BF16"));
        json_object_object_add(e, "shape", sh);
        json_object_array_add(of, json_object_new_int64((int64_t)off));
        off += (uint64_t)numel * (t[k].is_f32 ? 4 : 2);
        json_object_array_add(of, json_object_new_int64((int64_t)off));
        json_object_object_add(e, "data_offsets", of);
        json_object_object_add(root, t[k].name, e);
    }
    js = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
    if (!js) goto oom;
    jlen = strlen(js);
    hlen = (jlen + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));

    fp = fopen(path, "wb");
    if (!fp) {
        set_err(err, errn, "cannot create: %s", strerror(errno));
        goto out;
    }
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(js, 1, jlen, fp) != jlen) goto wfail;
    for (i = jlen; i < hlen; i++)
        if (fputc(' ', fp) == EOF) goto wfail;
    for (k = 0; k < n; k++) {
        int64_t numel = 1;
        size_t bytes;
        for (d = 0; d < t[k].ndim; d++) numel *= t[k].shape[d];
        bytes = (size_t)numel * (t[k].is_f32 ? 4 : 2);
        if (bytes > bufn) {
            free(buf);
            buf = malloc(bytes);
            bufn = buf ? bytes : 0;
            if (!buf) goto oom;
        }
        put_le(buf, t[k].data, t[k].is_f32, numel);
        if (bytes && fwrite(buf, 1, bytes, fp) != bytes) goto wfail;
    }
    if (fclose(fp) != 0) {
        fp = NULL;
        goto wfail;
    }
    fp = NULL;
    rc = 0;
    goto out;
wfail:
    set_err(err, errn, "write error: %s", strerror(errno));
    goto out;
oom:
    set_err(err, errn, "out of memory");
out:
    if (fp) fclose(fp);
    if (rc) remove(path);
    free(buf);
    if (root) json_object_put(root);
    return rc;
}

#else /* !HAVE_JSON_C */

int st_open(st_file *f, const char *path, char *err, size_t errn)
{
    (void)path;
    memset(f, 0, sizeof *f);
    set_err(err, errn, "%s", ST_NO_JSON_C);
    return -1;
}

int st_write(const char *path, const st_out *t, int n, const char *const *meta, int nmeta,
             char *err, size_t errn)
{
    (void)path, (void)t, (void)n, (void)meta, (void)nmeta;
    set_err(err, errn, "%s", ST_NO_JSON_C);
    return -1;
}

#endif
