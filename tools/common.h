/*
 * common.h - the command line of the beammoe tool (tools/): subcommands,
 * option values, exit statuses, byte counts. Cases, the reference, the
 * runner and the helpers are the harness's (harness/case.h, util.h).
 *
 * The tool is a client of the public API only (include/beammoe.h); nothing
 * here is part of the library.
 */
#ifndef BEAMMOE_TOOLS_COMMON_H
#define BEAMMOE_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "beammoe.h"
#include "case.h"
#include "st_case.h"

/* ---- exit statuses shared by every subcommand ----
 * One rule (beammoe --help, README): 2 for what the user gave wrong, 1 for
 * a check that failed or an error of the run itself. */
#define TOOL_EXIT_OK 0
#define TOOL_EXIT_FAIL 1  /* audit mismatch or error row; device, communication,
                             out-of-memory or other library error of the run */
#define TOOL_EXIT_USAGE 2 /* bad or missing option or value, sizes or values
                             the library rejects, a backend not available, an
                             unusable --input file or --output path */

/* ---- standard streams (streams.c) ----
 * tool_streams_open at the start: a closed stdin or stderr gets /dev/null;
 * a closed stdout is refused (message, -1: exit TOOL_EXIT_FAIL). Else 0.
 * tool_streams_close(rc) at the end: flushes and closes stdout; on a write
 * error says so on stderr and turns rc 0 into TOOL_EXIT_FAIL. */
int tool_streams_open(void);
int tool_streams_close(int rc);

/* ---- subcommands (one file each) ---- */
int cmd_audit(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Option values: 0 on success, else prints "<cmd>: <opt>: ..." and returns
 * TOOL_EXIT_USAGE (value_error: "beammoe <cmd>: <opt>: '<s>' <why>"). The
 * whole value must be the number: no space before or after it, no trailing
 * text. */
int value_error(const char *cmd, const char *opt, const char *s, const char *why);
int parse_i64(const char *cmd, const char *opt, const char *s, int64_t *out);
int parse_i32(const char *cmd, const char *opt, const char *s, int32_t *out);
int parse_f32(const char *cmd, const char *opt, const char *s, float *out);
/* "A,B" -> two floats. */
int parse_f32_pair(const char *cmd, const char *opt, const char *s, float out[2]);
int parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);

/* Every option once, flags too (the help's exit-status rule): a value
 * option given twice would keep one value and drop the other, and a
 * repeated flag is as likely a mistake. opt and longopts[li] are what
 * getopt_long just returned (li < 0: a short option, matched by its value);
 * seen[] has one zeroed slot per entry of longopts. 0, or prints
 * "beammoe <cmd>: --<name> given twice; ..." and returns -1. */
struct option;
/* The end of every command's option table: the options they all take
 * (--json: a JSON document on stdout instead of the text; --help). */
#define TOOL_OPTIONS_END                                                                           \
    {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, { NULL, 0, NULL, 0 }
int option_once(const char *cmd, const struct option *longopts, int li, int opt, unsigned char *seen);
/* Arguments left after the options: 0 when there are none, else prints
 * "beammoe <cmd>: unexpected argument '<arg>'" and returns -1. */
int no_operands(const char *cmd, int argc, char **argv, int optind_);
/* A command's options, one at a time (optind = 1 before the first):
 * next_option gives the next one's value (getopt_long with "h" over
 * longopts, each once: option_once), -1 after the last, -2 after a usage
 * error (its message printed); -h, --help only sets *help. Then
 * options_end(last: next_option's last value): the exit status when the
 * command ends there (a usage error or an extra argument: 2; help:
 * usage(stdout), 0), else -1. */
int next_option(const char *cmd, int argc, char **argv, const struct option *longopts, unsigned char *seen,
                int *help);
int options_end(const char *cmd, int last, int argc, char **argv, int help, void (*usage)(FILE *));

/* A failed library call: prints "beammoe <cmd>: <what> failed: <status>:
 * <message>" (ops: the table it was called through, whose last_error holds
 * the message; NULL: this library's beam_last_error); returns
 * TOOL_EXIT_FAIL. */
int report_lib_error(const beam_ops *ops, const char *cmd, const char *what, beam_status st);
/* The exit status for a library status under the tool's rule:
 * invalid argument or unsupported (the caller's input, or a backend that is
 * not available) 2, any other error 1. */
int tool_exit_status(beam_status st);

/* ---- --input FILE.safetensors (audit, run) ---- */
/* The case of the file at path: 0 with *p, *op and the stored results *s
 * (they point into f: st_close(f) after them), or the exit status after a
 * message "beammoe <cmd>: <path>: <why>" on stderr: 2 for a build without
 * json-c or a file that cannot be used. */
int load_input_case(const char *cmd, const char *path, st_file *f, hc_case *p, hc_op *op, st_stored *s);

/* ---- timing (run, bench) ---- */
/* The spread of n timed calls: min, median and max seconds. A median far
 * above the min, or a max far above the median, says other work shared
 * the host (docs/tool.md). */
typedef struct tool_times {
    double min, median, max;
    int n;
} tool_times;
/* v[0..n) seconds, sorted in place, into *t. */
void tool_times_of(double *v, int n, tool_times *t);
/* A warning on stderr when the 1-minute load average is above 0.5 as cmd
 * starts timing with `threads` threads: other work competes for the cores
 * and memory, so times may be high and spread. */
void warn_load(const char *cmd, int threads);

/* ---- backends that cannot be used here ---- */
/* In plain words, into out: "not available (no NVIDIA driver on this
 * host)" and the like, from the library's message lib_msg (the
 * beam_last_error() of a failed beam_backend_ops or beam_set_backend for
 * backend `name`), which names the CUDA runtime's error and reads as a
 * version problem on a host that simply has no GPU. An unknown message is
 * kept: "not available (<lib_msg>)". */
void backend_unavailable(const char *name, const char *lib_msg, char *out, size_t n);

/* ---- bytes per call, read plus written ---- */
double bytes_finalize(int64_t T, int32_t K, int32_t H, int post_weight);
double bytes_fused(int64_t T, int32_t K, int32_t H, int post_weight,
                   int next_on, int next_weight);
double bytes_nrn(int64_t T, int32_t H, int pre_weight, int next_on, int next_weight);

#endif
