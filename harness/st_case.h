/*
 * st_case.h - a case (finalize or fused) and its results as named
 * safetensors tensors (docs/safetensors.md):
 *   st_case_load    a file into a case (`beammoe audit --input`)
 *   st_case_write   a case and its outputs into a file (`beammoe run --output`)
 */
#ifndef BEAMMOE_HARNESS_ST_CASE_H
#define BEAMMOE_HARNESS_ST_CASE_H

#include <stddef.h>

#include "case.h"
#include "safetensors.h"

/* Results stored in a file: compared with the ground truth when present. */
typedef struct st_stored {
    const st_tensor *out, *hidden, *normalized;
} st_stored;

/* The file into c and *op (finalize without 'residual', fused with it) and
 * its stored results into s; names the file does not use are noted on
 * stderr. 0, or -1 with a message in err (everything a file can get wrong:
 * names, dtypes, shapes, metadata, the library's rules for top_k and
 * hidden). */
int st_case_load(const st_file *f, hc_case *c, hc_op *op, st_stored *s, char *err, size_t errn);

/* Write c (finalize or fused) and its outputs o to path; 0 or -1 with err. */
int st_case_write(const char *path, const hc_case *c, hc_op op, const hc_out *o, char *err,
                  size_t errn);

#endif
