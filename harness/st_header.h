/*
 * st_header.h - the JSON header of a safetensors file, checked and read
 * into an st_file's table of tensors and metadata (safetensors.h).
 *
 * One rule, shared word for word with docs/safetensors.md (the Python
 * package has no reader of its own: its audit runs the tool):
 *   1. no NUL byte; valid UTF-8;
 *   2. strict JSON (RFC 8259, as the format's reference reader takes it):
 *      numbers as the RFC writes them (no NaN, Infinity, leading zeros, '+'
 *      or bare '.'), no raw control character U+0000-U+001F inside a string,
 *      only JSON's escapes, no \u0000 and no unpaired surrogate escape, at
 *      most 32 levels of nesting, nothing but spaces, tabs and line breaks
 *      after the top-level value; the first fault in the text is reported;
 *   3. the schema, in the text's order: the top level is an object whose
 *      members are tensor entries, each an object of exactly "dtype" (a
 *      known dtype), "shape" (at most 8 non-negative integers) and
 *      "data_offsets" ([begin, end] within the data section, end - begin
 *      = numel * dtype size), or "__metadata__", an object of strings; a key
 *      twice in one entry or in __metadata__;
 *   4. a name given twice at the top level.
 * Neither step builds a JSON tree: the syntax needs no memory, and only
 * what the schema allows is stored, so reading a header takes a small
 * multiple of its size whatever it holds.
 */
#ifndef BEAMMOE_HARNESS_ST_HEADER_H
#define BEAMMOE_HARNESS_ST_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

/* Deepest nesting of objects and arrays the syntax accepts (json-c's
 * default, which the reader once used). */
#define ST_MAX_DEPTH 32
/* Largest integer a shape or an offset may hold: far beyond any real file,
 * and products of two such values are checked before they are made. */
#define ST_MAX_INT ((int64_t)1 << 53)

/* The n bytes at h (the header, as read) against a data section of dlen
 * bytes: fills f's tensors (offsets; data pointers are the caller's) and
 * metadata. 0, or -1 with a message in err, f holding what it had read
 * (st_close frees it). */
int st_parse_header(st_file *f, const unsigned char *h, size_t n, uint64_t dlen, char *err,
                    size_t errn);

#endif
