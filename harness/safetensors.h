/*
 * safetensors.h - read and write safetensors files for the beammoe tool
 * (`audit --input`, `run --output`).
 *
 * Format (https://github.com/huggingface/safetensors): 8-byte little-endian
 * header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *    "__metadata__": {"key": "value", ...}}
 * then the data; offsets are relative to the first byte after the header.
 * The header is checked and read by st_header.c (strict JSON, the format's
 * schema, no JSON tree built), written with json-c. Everything read from
 * the file is bounds-checked: a hostile file gives an error message, never
 * a crash, and a header takes a small multiple of its size in memory.
 * Without json-c (HAVE_JSON_C undefined) both directions fail with a message
 * that says how to get it.
 */
#ifndef BEAMMOE_TOOLS_SAFETENSORS_H
#define BEAMMOE_TOOLS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
/* Same cap as the reference implementation: a header is never 100 MB. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct st_tensor {
    char *name;
    char dtype[16];
    size_t elem_size; /* bytes per element of dtype */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    size_t offset;             /* of its bytes in the data section */
    const unsigned char *data; /* into st_file.bytes; numel * elem_size bytes */
} st_tensor;

typedef struct st_file {
    unsigned char *bytes; /* the data section (after the header) */
    size_t size;          /* its length in bytes */
    st_tensor *tensors;
    int ntensors;
    char **meta; /* key, value, key, value, ... */
    int nmeta;
    char *strings; /* where the names, keys and values are (one block) */
} st_file;

/* 1 when this build can read and write safetensors (json-c found). */
int st_available(void);
/* The message both directions give when st_available() is 0. */
#define ST_NO_JSON_C "this beammoe was built without json-c; install libjson-c-dev and reconfigure"

/* Read and check a file; 0 on success, else -1 with a message in err
 * (without the path: the caller names it). Only a regular file is read (a
 * FIFO or a device is refused at once, never waited on); the header length
 * and the header are checked against the file's size before the data
 * section is read. The header must follow st_header.h's rule (strict JSON
 * in UTF-8, the format's schema, no name twice), and the tensors'
 * data_offsets must tile the data section exactly. Messages show the
 * file's text escaped (text.h). */
int st_open(st_file *f, const char *path, char *err, size_t errn);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name); /* NULL if absent */
const char *st_meta(const st_file *f, const char *key);       /* NULL if absent */

/* Little-endian element decoding into host arrays of t->numel elements.
 * The caller has checked the dtype. */
void st_get_u16(const st_tensor *t, uint16_t *dst);
void st_get_f32(const st_tensor *t, float *dst);

/* One tensor to write: BF16 (uint16_t bits) or F32 (float) host data. */
typedef struct st_out {
    const char *name;
    int is_f32;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_out;

/* Write tensors (in order) and metadata (key, value pairs) to path; header
 * padded with spaces so the data starts 8-byte aligned. 0 or -1 with err.
 * The file is written to a new temporary file (mkstemp) in the folder of
 * path and renamed onto path only when complete: on any failure path is
 * untouched and the temporary file is removed, also when a signal whose
 * default action ends the process arrives meanwhile (removed, then the
 * signal raised again with its default action). path may name a regular file
 * (replaced, its permission bits kept), a symbolic link to one (the file it
 * points to is replaced), or nothing yet (created with 0666 & ~umask); a
 * directory, a device, a FIFO or a file this user may not write is refused
 * before anything is created. */
/* The checks st_write makes before it creates anything, alone: 0 when path
 * can be written, else -1 with a message in err. */
int st_output_check(const char *path, char *err, size_t errn);

int st_write(const char *path, const st_out *t, int n, const char *const *meta, int nmeta,
             char *err, size_t errn);

#endif
