/*
 * safetensors.c - the safetensors reader and writer of the beammoe tool.
 *
 * The reader opens a regular file only (without blocking: a FIFO or a
 * device is refused at once), reads the 8-byte header length and checks it
 * against the file's size, reads the header alone and has st_header.c check
 * it whole (strict JSON in UTF-8, the format's schema, no name twice) and
 * read it into the table of tensors, then checks that the tensors'
 * data_offsets tile the data section (no overlap, no gap, nothing after the
 * last tensor), as the format's reference reader requires, all before the
 * data section is read. Element decoding is explicit little-endian, so the
 * tool reads the same bytes on any host.
 *
 * The writer never opens the user's file: it writes a new temporary file in
 * the same folder and renames it into place when complete (st_write); it
 * builds the header with json-c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fstat, fchmod, mkstemp, realpath under -std=c99 */
#endif
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "st_header.h"
#include "text.h"

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
    free(f->strings); /* every name, key and value */
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

/* ---- where run --output writes ---- */

typedef struct out_target {
    char *path;      /* the file to replace or create (links followed) */
    char *dir;       /* its folder, where the temporary file goes */
    const char *base;
    int exists;
    struct stat sb;  /* of the existing file */
} out_target;

static void target_free(out_target *o)
{
    free(o->path);
    free(o->dir);
    memset(o, 0, sizeof *o);
}

static const char *file_kind_name(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

/* Decide where path leads and whether it may be written, creating and
 * changing nothing: a symbolic link (last component) is followed to the file
 * it names, which must exist; an existing file must be a regular file this
 * user may write; the folder must let this user create a file. */
static int resolve_output(const char *path, out_target *o, char *err, size_t errn)
{
    struct stat lsb;
    char *slash;
    size_t n = strlen(path);
    memset(o, 0, sizeof *o);
    if (n == 0) {
        set_err(err, errn, "the path is empty");
        return -1;
    }
    if (path[n - 1] == '/') {
        set_err(err, errn, "the path names a directory, not a file");
        return -1;
    }
    if (lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
        o->path = realpath(path, NULL);
        if (!o->path) {
            set_err(err, errn, "a symbolic link that does not point to a file (%s)",
                    strerror(errno));
            return -1;
        }
    } else {
        o->path = malloc(n + 1);
        if (!o->path) goto oom;
        memcpy(o->path, path, n + 1);
    }
    if (stat(o->path, &o->sb) == 0) {
        if (!S_ISREG(o->sb.st_mode)) {
            set_err(err, errn, "%s, not a regular file", file_kind_name(o->sb.st_mode));
            goto fail;
        }
        if (access(o->path, W_OK) != 0) {
            set_err(err, errn, "cannot write: %s", strerror(errno));
            goto fail;
        }
        o->exists = 1;
    } else if (errno != ENOENT) {
        set_err(err, errn, "cannot write: %s", strerror(errno));
        goto fail;
    }
    slash = strrchr(o->path, '/');
    o->dir = malloc(strlen(o->path) + 2);
    if (!o->dir) goto oom;
    if (!slash) {
        strcpy(o->dir, ".");
        o->base = o->path;
    } else {
        size_t d = slash == o->path ? 1 : (size_t)(slash - o->path);
        memcpy(o->dir, o->path, d);
        o->dir[d] = '\0';
        o->base = slash + 1;
    }
    if (access(o->dir, W_OK | X_OK) != 0) {
        set_err(err, errn, "cannot create a file in the folder '%s': %s", o->dir,
                strerror(errno));
        goto fail;
    }
    return 0;
oom:
    set_err(err, errn, "out of memory");
fail:
    target_free(o);
    return -1;
}

int st_output_check(const char *path, char *err, size_t errn)
{
    out_target o;
    if (resolve_output(path, &o, err, errn)) return -1;
    target_free(&o);
    return 0;
}

#ifdef HAVE_JSON_C

/* ---- reading ---- */

/* path opened for reading when it is a regular file: the descriptor, its
 * size in *size; else -1 with err. Opened with O_NONBLOCK, so a FIFO with
 * no writer (or a device) never blocks the open; fstat of the open file
 * (not a stat before it, which a rename could outrun) decides, and only a
 * regular file gets blocking reads. */
static int open_regular(const char *path, uint64_t *size, char *err, size_t errn)
{
    struct stat sb;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC), fl;
    if (fd < 0) {
        set_err(err, errn, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fd, &sb) != 0) {
        set_err(err, errn, "cannot open: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        set_err(err, errn, "not a regular file (%s)", file_kind_name(sb.st_mode));
        close(fd);
        return -1;
    }
    fl = fcntl(fd, F_GETFL);
    if (fl == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1) {
        set_err(err, errn, "cannot open: %s", strerror(errno));
        close(fd);
        return -1;
    }
    *size = (uint64_t)sb.st_size;
    return fd;
}

/* Exactly n bytes from fd into buf; 0, or -1 with err. */
static int read_exact(int fd, void *buf, size_t n, char *err, size_t errn)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n < ((size_t)1 << 30) ? n : ((size_t)1 << 30));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            set_err(err, errn, "read error: %s", strerror(errno));
            return -1;
        }
        if (r == 0) {
            set_err(err, errn, "read error: the file shrank while it was read");
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A tensor's byte span, for the tiling check. */
typedef struct span {
    uint64_t begin, end;
    int index;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

/* The tensors' spans, in offset order, must cover [0, dlen) once each:
 * what the reference reader accepts. Anything else means two readers could
 * see different bytes for one tensor, or bytes that belong to none. */
static int check_tiling(const st_file *f, uint64_t dlen, char *err, size_t errn)
{
    span *v = calloc((size_t)f->ntensors + 1, sizeof *v);
    uint64_t at = 0;
    int i, prev = -1;
    if (!v) {
        set_err(err, errn, "out of memory");
        return -1;
    }
    for (i = 0; i < f->ntensors; i++) {
        v[i].begin = f->tensors[i].offset;
        v[i].end = f->tensors[i].offset + (uint64_t)f->tensors[i].numel * f->tensors[i].elem_size;
        v[i].index = i;
    }
    qsort(v, (size_t)f->ntensors, sizeof *v, cmp_span);
    for (i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[v[i].index];
        char a[HU_ESC_NAME], b[HU_ESC_NAME];
        if (v[i].begin < at) {
            set_err(err, errn,
                    "bad data_offsets: tensor '%s' [%llu, %llu] overlaps tensor '%s', which "
                    "ends at %llu",
                    hu_escape(a, sizeof a, t->name, 0), (unsigned long long)v[i].begin,
                    (unsigned long long)v[i].end,
                    hu_escape(b, sizeof b, f->tensors[prev].name, 0), (unsigned long long)at);
            free(v);
            return -1;
        }
        if (v[i].begin > at) {
            set_err(err, errn,
                    "bad data_offsets: bytes [%llu, %llu) of the data belong to no tensor "
                    "(tensor '%s' begins at %llu)",
                    (unsigned long long)at, (unsigned long long)v[i].begin,
                    hu_escape(a, sizeof a, t->name, 0), (unsigned long long)v[i].begin);
            free(v);
            return -1;
        }
        at = v[i].end;
        prev = v[i].index;
    }
    free(v);
    if (at != dlen) {
        set_err(err, errn,
                "bad data_offsets: the tensors cover %llu bytes, but the data section after the "
                "header has %llu",
                (unsigned long long)at, (unsigned long long)dlen);
        return -1;
    }
    return 0;
}

int st_open(st_file *f, const char *path, char *err, size_t errn)
{
    uint64_t hlen = 0, fsize = 0, dlen;
    unsigned char len8[8], *hdr = NULL;
    int i, fd;

    memset(f, 0, sizeof *f);
    fd = open_regular(path, &fsize, err, errn);
    if (fd < 0) return -1;
    if (fsize < 8) {
        set_err(err, errn, "truncated: %llu bytes, shorter than the 8-byte header length",
                (unsigned long long)fsize);
        goto fail;
    }
    /* the length first, checked against the file's size: a header that
     * cannot fit is found without reading anything else */
    if (read_exact(fd, len8, 8, err, errn)) goto fail;
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    if (hlen > fsize - 8) {
        set_err(err, errn,
                "truncated: header length %llu is past the end of the file (%llu bytes)",
                (unsigned long long)hlen, (unsigned long long)fsize);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER || hlen < 2) {
        set_err(err, errn, "header length %llu is not in [2, %llu]", (unsigned long long)hlen,
                (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    dlen = fsize - 8 - hlen;
    if (dlen > (uint64_t)SIZE_MAX - 1) {
        set_err(err, errn, "file too large for this host");
        goto fail;
    }
    /* then the header alone, checked whole (st_header.c) */
    hdr = malloc((size_t)hlen);
    if (!hdr) {
        set_err(err, errn, "out of memory");
        goto fail;
    }
    if (read_exact(fd, hdr, (size_t)hlen, err, errn)) goto fail;
    if (st_parse_header(f, hdr, (size_t)hlen, dlen, err, errn)) goto fail;
    free(hdr);
    hdr = NULL;
    if (check_tiling(f, dlen, err, errn)) goto fail;

    /* the header holds: now the data section, exactly as long as it said */
    f->bytes = malloc(dlen ? (size_t)dlen : 1);
    if (!f->bytes) {
        set_err(err, errn, "out of memory reading %llu bytes of tensor data",
                (unsigned long long)dlen);
        goto fail;
    }
    f->size = (size_t)dlen;
    if (read_exact(fd, f->bytes, f->size, err, errn)) goto fail;
    for (i = 0; i < f->ntensors; i++) f->tensors[i].data = f->bytes + f->tensors[i].offset;
    close(fd);
    return 0;
fail:
    free(hdr);
    close(fd);
    st_close(f);
    return -1;
}

/* ---- signals while the temporary file exists ----
 * A signal whose default action ends the tool removes the file before the
 * tool dies of it: the handler unlinks it, then raises the signal again with
 * its default action, so the exit status still says which signal it was. A
 * signal the caller ignores (nohup) or handles keeps its disposition. A file
 * size limit makes write() fail (EFBIG, an ordinary write error) instead of
 * killing the tool with SIGXFSZ. One file at a time (the state is static). */
static const int cleanup_signals[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGPIPE,   SIGTERM, SIGALRM,
                                      SIGUSR1, SIGUSR2, SIGXCPU, SIGVTALRM, SIGPROF};
#define NCLEANUP ((int)(sizeof cleanup_signals / sizeof cleanup_signals[0]))
/* Read by the handler on whichever thread takes the signal, so atomics:
 * cleanup_path, the file to remove (NULL: none); cleanup_creating, 1 while
 * mkstemp runs (a file may exist whose name is not stored yet);
 * cleanup_dying, set by the handler before it looks at the other two, so
 * that either mkstemp is not started or the handler waits for its name. */
static char *cleanup_path;
static int cleanup_creating, cleanup_dying;

static void cleanup_and_die(int sig)
{
    char *p;
    __atomic_store_n(&cleanup_dying, 1, __ATOMIC_SEQ_CST);
    /* mkstemp runs with these signals blocked on its own thread, so this is
     * another thread: its name is microseconds away */
    while (__atomic_load_n(&cleanup_creating, __ATOMIC_SEQ_CST)) {
    }
    p = __atomic_load_n(&cleanup_path, __ATOMIC_SEQ_CST);
    if (p) unlink(p); /* unlink, signal, raise: async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when this handler returns */
}

typedef struct saved_signals {
    struct sigaction old[NCLEANUP], xfsz;
    sigset_t set; /* cleanup_signals */
} saved_signals;

static void signals_guard(saved_signals *sv)
{
    struct sigaction sa;
    int i;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sigemptyset(&sv->set);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &sa, &sv->xfsz);
    sa.sa_handler = cleanup_and_die;
    for (i = 0; i < NCLEANUP; i++) {
        sigaddset(&sv->set, cleanup_signals[i]);
        sigaction(cleanup_signals[i], NULL, &sv->old[i]);
        if (sv->old[i].sa_handler == SIG_DFL) sigaction(cleanup_signals[i], &sa, NULL);
    }
}

/* mkstemp with the handler kept off this thread until the name is stored,
 * and not started once a handler has begun (see cleanup_dying). */
static int guarded_mkstemp(saved_signals *sv, char *tmp)
{
    sigset_t old;
    int fd = -1;
    pthread_sigmask(SIG_BLOCK, &sv->set, &old);
    __atomic_store_n(&cleanup_creating, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&cleanup_dying, __ATOMIC_SEQ_CST))
        errno = EINTR; /* the tool is about to die of a signal */
    else
        fd = mkstemp(tmp); /* O_CREAT | O_EXCL, mode 0600 */
    if (fd >= 0) __atomic_store_n(&cleanup_path, tmp, __ATOMIC_SEQ_CST);
    __atomic_store_n(&cleanup_creating, 0, __ATOMIC_SEQ_CST);
    pthread_sigmask(SIG_SETMASK, &old, NULL); /* a signal that came meanwhile lands now */
    return fd;
}

static void signals_restore(saved_signals *sv)
{
    int i;
    __atomic_store_n(&cleanup_path, NULL, __ATOMIC_SEQ_CST);
    for (i = 0; i < NCLEANUP; i++) sigaction(cleanup_signals[i], &sv->old[i], NULL);
    sigaction(SIGXFSZ, &sv->xfsz, NULL);
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
    int k, d, rc = -1, fd = -1;
    char *tmp = NULL;
    out_target o;
    mode_t mode;
    saved_signals sv;
    int guarded = 0;

    memset(&o, 0, sizeof o);
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

    /* a new file next to the target, renamed onto it when complete: the
     * user's file is never opened, so a failure cannot touch it */
    if (resolve_output(path, &o, err, errn)) goto out;
    tmp = malloc(strlen(o.dir) + strlen(o.base) + 16);
    if (!tmp) goto oom;
    /* a name of at most 255 bytes however long the target's is */
    sprintf(tmp, "%s/.%.200s.XXXXXX", o.dir, o.base);
    signals_guard(&sv);
    guarded = 1;
    fd = guarded_mkstemp(&sv, tmp);
    if (fd < 0) {
        set_err(err, errn, "cannot create a temporary file in the folder '%s': %s", o.dir,
                strerror(errno));
        free(tmp);
        tmp = NULL;
        goto out;
    }
    /* the mode a file made by open(O_CREAT, 0666) would get, or the
     * replaced file's own, and its owner where this user may keep it */
    if (o.exists) {
        if ((o.sb.st_uid != geteuid() || o.sb.st_gid != getegid()) &&
            fchown(fd, o.sb.st_uid, o.sb.st_gid) != 0) {
            /* not allowed: the new file stays this user's */
        }
        mode = o.sb.st_mode & 0777;
    } else {
        mode_t um = umask(0);
        umask(um);
        mode = 0666 & ~um;
    }
    if (fchmod(fd, mode) != 0) goto wfail;
    fp = fdopen(fd, "wb");
    if (!fp) goto wfail;
    fd = -1;
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
    if (fflush(fp) != 0) goto wfail;
    /* on disk before it takes the name (a file system that cannot sync
     * says EINVAL: nothing to wait for there) */
    if (fsync(fileno(fp)) != 0 && errno != EINVAL && errno != ENOTSUP) goto wfail;
    if (fclose(fp) != 0) {
        fp = NULL;
        goto wfail;
    }
    fp = NULL;
    if (rename(tmp, o.path) != 0) goto wfail;
    __atomic_store_n(&cleanup_path, NULL, __ATOMIC_SEQ_CST); /* the name is the user's now */
    free(tmp);
    tmp = NULL;
    rc = 0;
    goto out;
wfail:
    set_err(err, errn, "write error: %s", strerror(errno));
    goto out;
oom:
    set_err(err, errn, "out of memory");
out:
    if (fp) fclose(fp);
    if (fd >= 0) close(fd);
    /* only ever the file made here, never path */
    if (tmp) unlink(tmp);
    if (guarded) signals_restore(&sv);
    free(tmp);
    free(buf);
    target_free(&o);
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
