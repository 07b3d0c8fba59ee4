/*
 * st_fuzz.c - a bounded, seeded mutation fuzz of the tool's safetensors
 * reader and writer (harness/safetensors.c), run by `make check`. It matters
 * most in the --enable-sanitizers tree, where a read past a buffer, a leak
 * or undefined behaviour in the reader ends the run with a report.
 *
 * Part 1, round trips: random tensors (BF16, F32, zero-size ones, names with
 * escapes and non-ASCII letters) and metadata are written with st_write and
 * read back with st_open; everything must come back the same.
 *
 * Part 2, mutations: each iteration takes one good file (the round-trip
 * files and hand-made ones), applies 1 to 4 mutations (bit flips, bytes set
 * to JSON punctuation, tokens inserted into the header (\u0000, lone
 * surrogates, huge and negative numbers, null, a copied entry), ranges
 * deleted or repeated, numbers rewritten, truncation, the header length set
 * to the edited header's or to a wrong one), writes the result to a file and
 * reads it with st_open. The reader must either refuse it with a message,
 * or accept it with every promise of safetensors.h holding: the tensors tile
 * the data section, each one's bytes lie inside it and match its shape and
 * dtype, names are unique, and the header is strict JSON (no NaN,
 * Infinity, leading zero or raw control character in a string: tokens of
 * each are inserted, and json-c took them all). Every accepted byte is
 * read, so the sanitizers see any pointer that strays.
 *
 * Bounded: stops after BEAM_FUZZ_ITERS mutations (default 200000) or
 * BEAM_FUZZ_SECONDS seconds (default 3), whichever comes first. Seeded:
 * BEAM_TEST_SEED=<seed> (printed at the start) replays a run; the input being
 * read is always in the file named at the start, so after a crash it holds
 * the culprit. Exit 77 (skip) in a build without json-c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkstemp, clock_gettime under -std=c99 */
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "safetensors.h"
#include "util.h"

/* the harness's splitmix64 */
static hu_rng rng;
static uint64_t rnd(void) { return hu_next(&rng); }
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static char path[4096];
static int failures;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "st_fuzz: FAIL (%s:%d): ", __FILE__, __LINE__);                       \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

/* ---- a growable byte buffer ---- */
typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void buf_reserve(buf *b, size_t n)
{
    if (n <= b->cap) return;
    b->cap = n * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) {
        fprintf(stderr, "st_fuzz: out of memory\n");
        exit(99);
    }
}
static void buf_set(buf *b, const void *d, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->p, d, n);
    b->n = n;
}
static void buf_insert(buf *b, size_t at, const void *d, size_t n)
{
    buf_reserve(b, b->n + n);
    memmove(b->p + at + n, b->p + at, b->n - at);
    memcpy(b->p + at, d, n);
    b->n += n;
}
static void buf_erase(buf *b, size_t at, size_t n)
{
    memmove(b->p + at, b->p + at + n, b->n - at - n);
    b->n -= n;
}

/* A new file each time: rewriting one in place (truncate, write) makes
 * some file systems (ext4) flush it to disk, a hundred times slower. */
static int write_file(const unsigned char *d, size_t n)
{
    FILE *fp;
    unlink(path);
    fp = fopen(path, "wb");
    int ok = fp && (n == 0 || fwrite(d, 1, n, fp) == n);
    if (fp && fclose(fp) != 0) ok = 0;
    return ok ? 0 : -1;
}

static int read_file(buf *b)
{
    FILE *fp = fopen(path, "rb");
    unsigned char tmp[4096];
    size_t r;
    b->n = 0;
    if (!fp) return -1;
    while ((r = fread(tmp, 1, sizeof tmp, fp)) > 0) buf_insert(b, b->n, tmp, r);
    fclose(fp);
    return 0;
}

/* ---- what an accepted file must satisfy ---- */

static uint64_t accepted_checksum;

static void check_accepted(const st_file *f)
{
    int i, j;
    uint64_t covered = 0;
    for (i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        int64_t numel = 1;
        size_t bytes, k;
        int d;
        CHECK(t->name != NULL, "tensor %d has no name", i);
        for (d = 0; d < t->ndim; d++) numel *= t->shape[d];
        CHECK(numel == t->numel, "tensor '%s': numel %lld, shape says %lld", t->name,
              (long long)t->numel, (long long)numel);
        CHECK(t->elem_size == 1 || t->elem_size == 2 || t->elem_size == 4 || t->elem_size == 8,
              "tensor '%s': element size %zu", t->name, t->elem_size);
        bytes = (size_t)t->numel * t->elem_size;
        CHECK(t->offset <= f->size && bytes <= f->size - t->offset,
              "tensor '%s': bytes [%zu, +%zu) past the data (%zu)", t->name, t->offset, bytes,
              f->size);
        CHECK(t->data == f->bytes + t->offset, "tensor '%s': data pointer", t->name);
        /* touch every byte: a stray pointer is the sanitizers' to find */
        for (k = 0; k < bytes && t->offset + bytes <= f->size; k++)
            accepted_checksum = accepted_checksum * 31 + t->data[k];
        covered += bytes;
        for (j = 0; j < i; j++)
            CHECK(strcmp(f->tensors[j].name, t->name) != 0, "name '%s' twice", t->name);
    }
    CHECK(covered == f->size, "tensors cover %llu of %zu data bytes (tiling)",
          (unsigned long long)covered, f->size);
    for (i = 0; i < f->nmeta; i++) {
        CHECK(f->meta[2 * i] && f->meta[2 * i + 1], "metadata entry %d", i);
        for (j = 0; j < i; j++)
            CHECK(strcmp(f->meta[2 * j], f->meta[2 * i]) != 0, "metadata key twice");
    }
}

/* An accepted header is strict JSON (RFC 8259, as the format's reference
 * reader takes it), checked here by a scan of its own: no raw byte below
 * 0x20 inside a string, and every bare word (letters, digits, signs,
 * points outside strings) is true, false, null or an RFC 8259 number. */
static int rfc_number(const unsigned char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else
        return 0;
    if (i < n && s[i] == '.') {
        if (++i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    return i == n;
}

static int word_char(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == '-' || ch == '+' || ch == '.';
}

static void check_strict(const unsigned char *h, size_t n)
{
    size_t i = 0, j;
    while (i < n) {
        if (h[i] == '"') {
            for (i++; i < n && h[i] != '"'; i += h[i] == '\\' ? 2 : 1)
                CHECK(h[i] >= 0x20, "accepted: raw byte 0x%02x inside a string (byte %zu)", h[i], i);
            i++;
        } else if (word_char(h[i])) {
            for (j = i; j < n && word_char(h[j]); j++) {
            }
            CHECK(rfc_number(h + i, j - i) || (j - i == 4 && !memcmp(h + i, "true", 4)) ||
                      (j - i == 5 && !memcmp(h + i, "false", 5)) ||
                      (j - i == 4 && !memcmp(h + i, "null", 4)),
                  "accepted: '%.*s' is not strict JSON (byte %zu)", (int)(j - i), h + i, i);
            i = j;
        } else {
            CHECK(h[i] >= 0x20 || h[i] == '\t' || h[i] == '\n' || h[i] == '\r',
                  "accepted: raw byte 0x%02x outside a string (byte %zu)", h[i], i);
            i++;
        }
    }
}

/* ---- part 1: round trips through st_write ---- */

static const char *const name_parts[] = {"expert_outputs", "w", "résidu", "x\"q",
                                         "back\\slash", "tab\there", "日本", "😀", "a.b-c_1"};

static int round_trip(int case_index, buf *keep)
{
    st_out t[6];
    char names[6][64], err[512];
    void *data[6];
    const char *meta[8];
    char mv[4][64];
    int n = 1 + (int)below(5), nmeta = (int)below(4), i, d, rc = 0;
    st_file f;

    memset(t, 0, sizeof t);
    for (i = 0; i < n; i++) {
        int64_t numel = 1;
        size_t k, esz;
        snprintf(names[i], sizeof names[i], "%s%d", name_parts[below(9)], i);
        t[i].name = names[i];
        t[i].is_f32 = (int)below(2);
        t[i].ndim = (int)below(4);
        for (d = 0; d < t[i].ndim; d++) {
            t[i].shape[d] = (int64_t)below(5); /* zero-size dimensions too */
            numel *= t[i].shape[d];
        }
        esz = t[i].is_f32 ? 4 : 2;
        data[i] = malloc((size_t)numel * esz + 1);
        for (k = 0; k < (size_t)numel * esz; k++) ((unsigned char *)data[i])[k] = (unsigned char)rnd();
        t[i].data = data[i];
    }
    for (i = 0; i < nmeta; i++) {
        snprintf(mv[i], sizeof mv[i], "v%d \"%s\" \\ %llu", i, name_parts[below(9)],
                 (unsigned long long)below(1000));
        meta[2 * i] = i == 0 ? "routed_scale" : i == 1 ? "live_tokens" : i == 2 ? "é" : "k3";
        meta[2 * i + 1] = mv[i];
    }
    if (st_write(path, t, n, meta, nmeta, err, sizeof err)) {
        CHECK(0, "round trip %d: st_write: %s", case_index, err);
        rc = -1;
        goto out;
    }
    if (keep) read_file(keep);
    if (st_open(&f, path, err, sizeof err)) {
        CHECK(0, "round trip %d: st_open refuses st_write's file: %s", case_index, err);
        rc = -1;
        goto out;
    }
    check_accepted(&f);
    CHECK(f.ntensors == n, "round trip %d: %d tensors back, %d written", case_index, f.ntensors, n);
    for (i = 0; i < n && i < f.ntensors; i++) {
        const st_tensor *r = st_find(&f, names[i]);
        CHECK(r != NULL, "round trip %d: tensor '%s' lost", case_index, names[i]);
        if (!r) continue;
        CHECK(!strcmp(r->dtype, t[i].is_f32 ? "F32" : "BF16") && r->ndim == t[i].ndim,
              "round trip %d: tensor '%s' dtype or rank", case_index, names[i]);
        for (d = 0; d < t[i].ndim && d < r->ndim; d++)
            CHECK(r->shape[d] == t[i].shape[d], "round trip %d: '%s' shape", case_index, names[i]);
        CHECK(r->numel == 0 || !memcmp(r->data, data[i], (size_t)r->numel * r->elem_size),
              "round trip %d: tensor '%s' bytes differ (little-endian host)", case_index,
              names[i]);
    }
    CHECK(f.nmeta == nmeta, "round trip %d: %d metadata back, %d written", case_index, f.nmeta,
          nmeta);
    for (i = 0; i < nmeta; i++) {
        const char *v = st_meta(&f, meta[2 * i]);
        CHECK(v && !strcmp(v, meta[2 * i + 1]), "round trip %d: metadata '%s'", case_index,
              meta[2 * i]);
    }
    st_close(&f);
out:
    for (i = 0; i < n; i++) free(data[i]);
    return rc;
}

/* ---- part 2: mutations ---- */

/* Which checks refused the mutated files: the fuzz should reach them all. */
static const char *const kinds[] = {"truncated",      "header length",   "UTF-8",
                                    "NUL",            "surrogate",       "appears twice",
                                    "bad header JSON", "unknown dtype",  "shape",
                                    "data_offsets",   "__metadata__",    "header: "};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))
static long kind_count[NKINDS + 1];

static void count_kind(const char *msg)
{
    int k;
    for (k = 0; k < NKINDS && !strstr(msg, kinds[k]); k++) {
    }
    kind_count[k]++;
}

static const char *const tokens[] = {
    "\\u0000", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\u00e9", "\\\"", "\\\\", "\\",
    "\"", "\"a\":1,", "null", "true", "[]", "{}", "[0,0]", "1e308", "-1", "-0", "0.5",
    "9007199254740992", "9007199254740993", "18446744073709551616", "99999999999999999999",
    ",", ":", "{", "}", "[", "]", "\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
    "\xc3\xa9", " ", "\n", "\"__metadata__\":{\"k\":\"v\"},",
    "\"dtype\":\"BF16\",", "\"shape\":[],", "\"data_offsets\":[0,0],", "\"F64\"", "\"U8\"",
    /* what RFC 8259 refuses and json-c took: the reader must refuse them */
    "NaN", "Infinity", "-Infinity", "00", "-00", "00.5", "1.", "+1", ".5", "1e", "0x10", "True",
    "\t", "\x01", "\x1b", "\x1f", "\\u001b", "\\t", "\\x"};
static const unsigned char specials[] = {0, 1, 0x7F, 0x80, 0xFF, '"', '\\', '{', '}', '[',
                                         ']', ',', ':', '0', '9', '-', 'e', '.', ' ', 'u'};

/* One mutation of b; *hlen follows edits inside the header. */
static void mutate(buf *b, size_t *hlen)
{
    size_t hend = 8 + *hlen < b->n ? 8 + *hlen : b->n; /* header is [8, hend) */
    size_t at, n;
    switch (below(10)) {
    case 0: /* bit flip anywhere (the length too) */
        if (b->n) b->p[below(b->n)] ^= (unsigned char)(1u << below(8));
        break;
    case 1: /* a byte of the header to JSON punctuation or a bad UTF-8 byte */
        if (hend > 8) b->p[8 + below(hend - 8)] = specials[below(sizeof specials)];
        break;
    case 2: /* a token into the header */
    case 3: {
        const char *tok = tokens[below(sizeof tokens / sizeof tokens[0])];
        at = hend > 8 ? 8 + below(hend - 8 + 1) : b->n;
        buf_insert(b, at, tok, strlen(tok));
        if (at <= 8 + *hlen) *hlen += strlen(tok);
        break;
    }
    case 4: /* delete a range of the header */
        if (hend > 8) {
            at = 8 + below(hend - 8);
            n = 1 + below(hend - at < 16 ? hend - at : 16);
            buf_erase(b, at, n);
            *hlen -= n;
        }
        break;
    case 5: /* repeat a range of the header (a copied entry, key or number) */
        if (hend > 8 && b->n < 65536) {
            unsigned char tmp[256];
            at = 8 + below(hend - 8);
            n = 1 + below(hend - at < sizeof tmp ? hend - at : sizeof tmp);
            memcpy(tmp, b->p + at, n);
            buf_insert(b, 8 + below(hend - 8 + 1), tmp, n);
            *hlen += n;
        }
        break;
    case 6: { /* rewrite a number of the header */
        size_t s;
        char num[32];
        static const long long vals[] = {0, 1, 2, 7, 8, -1, 255, 256, 4096, 1LL << 31,
                                         1LL << 53, (1LL << 53) + 1, 1LL << 62};
        if (hend <= 8) break;
        s = 8 + below(hend - 8);
        while (s < hend && (b->p[s] < '0' || b->p[s] > '9')) s++;
        if (s == hend) break;
        for (n = 0; s + n < hend && b->p[s + n] >= '0' && b->p[s + n] <= '9'; n++) {
        }
        if (below(2))
            snprintf(num, sizeof num, "%lld", vals[below(sizeof vals / sizeof vals[0])]);
        else
            snprintf(num, sizeof num, "%llu", (unsigned long long)below(b->n + 16));
        buf_erase(b, s, n);
        buf_insert(b, s, num, strlen(num));
        *hlen = *hlen - n + strlen(num);
        break;
    }
    case 7: /* truncate, or extend the data */
        if (below(2) && b->n)
            b->n = below(b->n);
        else {
            unsigned char z[16] = {0};
            buf_insert(b, b->n, z, 1 + below(16));
        }
        break;
    case 8: /* the header length itself: off by a little, or wild */
        *hlen = below(3) ? *hlen + below(17) - 8 : (size_t)rnd();
        break;
    default: /* a byte of the data */
        if (b->n > hend) b->p[hend + below(b->n - hend)] = (unsigned char)rnd();
        break;
    }
}

static void put_len(buf *b, uint64_t v)
{
    int i;
    if (b->n < 8) return;
    for (i = 0; i < 8; i++) b->p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_len(const buf *b)
{
    uint64_t v = 0;
    int i;
    if (b->n < 8) return 0;
    for (i = 7; i >= 0; i--) v = (v << 8) | b->p[i];
    return v;
}

/* Hand-made good files: JSON order unlike offset order, a zero-size
 * tensor, escapes in names, every dtype size, padding after the object. */
static void add_raw_seed(buf *seeds, int *nseeds, const char *json, const unsigned char *data,
                         size_t dlen)
{
    size_t jl = strlen(json);
    buf *s = &seeds[(*nseeds)++];
    unsigned char len8[8];
    int i;
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    s->n = 0;
    buf_insert(s, 0, len8, 8);
    buf_insert(s, 8, json, jl);
    buf_insert(s, s->n, data, dlen);
}

int main(void)
{
    const char *env_seed = getenv("BEAM_TEST_SEED"), *env_iters = getenv("BEAM_FUZZ_ITERS"),
               *env_secs = getenv("BEAM_FUZZ_SECONDS"), *tmpdir = getenv("TMPDIR");
    uint64_t seed = env_seed && *env_seed ? strtoull(env_seed, NULL, 0)
                                          : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    long iters = env_iters ? atol(env_iters) : 200000, it;
    double secs = env_secs ? atof(env_secs) : 3.0, t0 = hu_now();
    buf seeds[24], cur = {NULL, 0, 0};
    int nseeds = 0, i, m, fd;
    long accepted = 0, refused = 0, empty_msg = 0;
    unsigned char data[64];
    char err[512];

    if (!st_available()) {
        printf("st_fuzz: SKIP: built without json-c\n");
        return 77;
    }
    snprintf(path, sizeof path, "%s/beammoe-st-fuzz.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    fd = mkstemp(path);
    if (fd < 0) {
        perror("st_fuzz: mkstemp");
        return 99;
    }
    close(fd);
    hu_rng_init(&rng, seed);
    printf("st_fuzz: BEAM_TEST_SEED=%llu, at most %ld mutations or %.1f s; the input being "
           "read is %s\n",
           (unsigned long long)seed, iters, secs, path);
    fflush(stdout);
    memset(seeds, 0, sizeof seeds);

    /* part 1: round trips, each file kept as a seed */
    /* (st_write syncs each file to disk: a few dozen are enough) */
    for (i = 0; i < 16; i++) round_trip(i, &seeds[nseeds++]);
    for (i = 16; i < 40; i++) round_trip(i, NULL);
    printf("st_fuzz: 40 round trips through st_write and st_open\n");

    for (i = 0; i < (int)sizeof data; i++) data[i] = (unsigned char)(i * 37 + 1);
    add_raw_seed(seeds, &nseeds,
                 "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                 "\"z\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
                 "\"a\\u00e9\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                 "\"__metadata__\":{\"routed_scale\":\"2.5\",\"s\\\"q\":\"\\ud83d\\ude00\"}}  \n",
                 data, 16);
    add_raw_seed(seeds, &nseeds,
                 "{\"x\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                 "\"y\":{\"dtype\":\"I16\",\"shape\":[1,1],\"data_offsets\":[3,5]},"
                 "\"w\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[5,13]}}",
                 data, 13);
    add_raw_seed(seeds, &nseeds, "{}      ", data, 0);
    for (i = 0; i < nseeds; i++) {
        st_file f;
        CHECK(write_file(seeds[i].p, seeds[i].n) == 0, "cannot write %s", path);
        CHECK(st_open(&f, path, err, sizeof err) == 0, "seed %d refused: %s", i, err);
        if (!failures) st_close(&f);
    }
    if (failures) goto done;

    /* part 2: mutations */
    for (it = 0; it < iters && hu_now() - t0 < secs; it++) {
        const buf *s = &seeds[below((size_t)nseeds)];
        size_t hlen;
        int m, nm = 1 + (int)below(4);
        st_file f;
        buf_set(&cur, s->p, s->n);
        hlen = (size_t)get_len(&cur);
        for (m = 0; m < nm; m++) mutate(&cur, &hlen);
        /* mostly a consistent length, so the edits reach the JSON parser */
        if (below(4)) put_len(&cur, (uint64_t)hlen);
        if (write_file(cur.p, cur.n)) {
            CHECK(0, "cannot write %s", path);
            break;
        }
        err[0] = '\0';
        if (st_open(&f, path, err, sizeof err) == 0) {
            accepted++;
            check_accepted(&f);
            check_strict(cur.p + 8, (size_t)get_len(&cur));
            st_close(&f);
        } else {
            refused++;
            if (!err[0]) empty_msg++;
            count_kind(err);
        }
        if (failures) {
            fprintf(stderr, "st_fuzz: at mutation %ld (BEAM_TEST_SEED=%llu); the input is kept "
                            "in %s\n",
                    it, (unsigned long long)seed, path);
            break;
        }
    }
    CHECK(empty_msg == 0, "%ld files refused without a message", empty_msg);
    printf("st_fuzz: %ld mutated files in %.1f s: %ld accepted (all checked), %ld refused with a "
           "message\n",
           it, hu_now() - t0, accepted, refused);
    printf("st_fuzz: refused by");
    for (i = 0, m = 0; i <= NKINDS; i++)
        if (kind_count[i])
            printf("%s '%s' %ld", m++ ? "," : ":", i < NKINDS ? kinds[i] : "other",
                   kind_count[i]);
    printf("\n");
    (void)accepted_checksum;

done:
    for (i = 0; i < nseeds; i++) free(seeds[i].p);
    free(cur.p);
    if (!failures) unlink(path);
    printf("st_fuzz: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
