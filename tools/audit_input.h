/*
 * audit_input.h - the tool's safetensors files: one problem (finalize or
 * fused) and its results as named tensors (docs/safetensors.md).
 *   audit --input FILE   reads a file into a problem and audits it
 *   run --output FILE    writes the problem that `run` used and its outputs
 */
#ifndef BEAMMOE_TOOLS_AUDIT_INPUT_H
#define BEAMMOE_TOOLS_AUDIT_INPUT_H

#include <stddef.h>

#include "problem.h"

/* `beammoe audit --input path`: the exit status (0 all match, 1 a
 * mismatch or library error, 2 the file cannot be used). */
int audit_input(const char *path, int quick);

/* 1 when this build can read/write safetensors; else 0 and a message. */
int tool_safetensors_available(const char **why);

/* Write p (finalize or fused op) and its outputs o to path; 0 or -1 with a
 * message in err. */
int run_write_safetensors(const char *path, const problem *p, const outputs *o, char *err,
                          size_t errn);

#endif
