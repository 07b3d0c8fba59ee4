/*
 * cli.c - option values, exit statuses and byte counts of the command line
 * (the rest is the harness's: harness/util.h, harness/case.h).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "text.h"

/* ---- option parsing ----
 * A number is the whole option value: no leading or trailing space, no
 * trailing text ("4x", " 4", "4 " are errors; strtoll alone would take the
 * first two). */

static int starts_like_number(const char *s)
{
    return *s && !isspace((unsigned char)*s);
}

int value_error(const char *cmd, const char *opt, const char *s, const char *why)
{
    fprintf(stderr, "beammoe %s: %s: '%s' %s\n", cmd, opt, s, why);
    return TOOL_EXIT_USAGE;
}

int parse_i64(const char *cmd, const char *opt, const char *s, int64_t *out)
{
    char *end;
    long long v;
    errno = 0;
    v = starts_like_number(s) ? strtoll(s, &end, 10) : 0;
    if (!starts_like_number(s) || end == s || *end) return value_error(cmd, opt, s, "is not an integer");
    if (errno == ERANGE) return value_error(cmd, opt, s, "is out of the 64-bit range");
    *out = (int64_t)v;
    return 0;
}

int parse_i32(const char *cmd, const char *opt, const char *s, int32_t *out)
{
    int64_t v;
    if (parse_i64(cmd, opt, s, &v)) return -1;
    if (v < INT32_MIN || v > INT32_MAX) return value_error(cmd, opt, s, "is out of the 32-bit range");
    *out = (int32_t)v;
    return 0;
}

int parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = 0;
    /* decimal, or hexadecimal after 0x; never octal ("010" is ten) */
    int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    errno = 0;
    if (starts_like_number(s) && s[0] != '-' && s[0] != '+' && (!hex || isxdigit((unsigned char)s[2])))
        v = strtoull(hex ? s + 2 : s, &end, hex ? 16 : 10);
    else
        end = (char *)s;
    if (end == s || *end || errno == EINVAL) return value_error(cmd, opt, s, "is not a non-negative integer");
    if (errno == ERANGE) return value_error(cmd, opt, s, "is out of the 64-bit range");
    *out = (uint64_t)v;
    return 0;
}

int parse_f32(const char *cmd, const char *opt, const char *s, float *out)
{
    char *end = (char *)s;
    float v = 0.0f;
    errno = 0;
    if (starts_like_number(s)) v = strtof(s, &end);
    if (end == s || *end) return value_error(cmd, opt, s, "is not a number");
    /* Range and finiteness are the library's rules: pass the value on. */
    *out = v;
    return 0;
}

int parse_f32_pair(const char *cmd, const char *opt, const char *s, float out[2])
{
    const char *comma = strchr(s, ',');
    /* no space around either number (hu_split_pair, which a file's
     * metadata goes through too, lets strtof skip a leading one) */
    if (starts_like_number(s) && comma && starts_like_number(comma + 1) &&
        hu_split_pair(s, out) == 0)
        return 0;
    return value_error(cmd, opt, s, "is not two numbers 'A,B'");
}

int option_once(const char *cmd, const struct option *longopts, int li, int opt, unsigned char *seen)
{
    /* a short option (-h) has no long index: its long form's */
    for (int i = 0; li < 0 && longopts[i].name; i++)
        if (!longopts[i].flag && longopts[i].val == opt) li = i;
    if (li < 0) return 0; /* not ours: getopt's own error follows */
    if (seen[li]) {
        fprintf(stderr, "beammoe %s: --%s given twice; give each option once\n"
                        "Try 'beammoe %s --help'.\n",
                cmd, longopts[li].name, cmd);
        return -1;
    }
    seen[li] = 1;
    return 0;
}

int no_operands(const char *cmd, int argc, char **argv, int optind_)
{
    if (optind_ >= argc) return 0;
    fprintf(stderr, "beammoe%s%s: unexpected argument '%s'\nTry 'beammoe%s%s --help'.\n",
            *cmd ? " " : "", cmd, argv[optind_], *cmd ? " " : "", cmd);
    return -1;
}

int next_option(const char *cmd, int argc, char **argv, const struct option *longopts, unsigned char *seen,
                int *help)
{
    for (;;) {
        int li = -1; /* getopt_long sets it for long options only */
        const int opt = getopt_long(argc, argv, "h", longopts, &li);
        if (opt == -1) return -1;
        if (option_once(cmd, longopts, li, opt, seen)) return -2;
        if (opt == '?') {
            fprintf(stderr, "Try 'beammoe %s --help'.\n", cmd);
            return -2;
        }
        if (opt != 'h') return opt;
        *help = 1; /* after the loop: an extra argument is still an error */
    }
}

int options_end(const char *cmd, int last, int argc, char **argv, int help, void (*usage)(FILE *))
{
    if (last == -2 || no_operands(cmd, argc, argv, optind)) return TOOL_EXIT_USAGE;
    if (!help) return -1;
    usage(stdout);
    return TOOL_EXIT_OK;
}

int tool_exit_status(beam_status st)
{
    /* a rule of the contract broken by what was given, or a backend that
     * is not available: the caller's input; else the run itself failed */
    return st == BEAM_OK                                                ? TOOL_EXIT_OK
           : st == BEAM_ERR_INVALID_ARGUMENT || st == BEAM_ERR_UNSUPPORTED ? TOOL_EXIT_USAGE
                                                                        : TOOL_EXIT_FAIL;
}

int report_lib_error(const beam_ops *ops, const char *cmd, const char *what, beam_status st)
{
    fprintf(stderr, "beammoe %s: %s failed: %s: %s\n", cmd, what, beam_status_string(st),
            ops ? ops->last_error() : beam_last_error());
    return TOOL_EXIT_FAIL;
}

/* ---- --input FILE.safetensors ---- */

int load_input_case(const char *cmd, const char *path, st_file *f, hc_case *p, hc_op *op, st_stored *s)
{
    char err[512], shown[1024];
    if (!st_available()) {
        fprintf(stderr, "beammoe %s: --input: %s\n", cmd, ST_NO_JSON_C);
        return TOOL_EXIT_USAGE;
    }
    /* the path as printed: a file name may hold escape sequences too */
    hu_escape(shown, sizeof shown, path, 0);
    if (st_open(f, path, err, sizeof err)) {
        fprintf(stderr, "beammoe %s: %s: %s\n", cmd, shown, err);
        return TOOL_EXIT_USAGE;
    }
    if (st_case_load(f, p, op, s, err, sizeof err)) {
        fprintf(stderr, "beammoe %s: %s: %s\n", cmd, shown, err);
        st_close(f);
        return TOOL_EXIT_USAGE;
    }
    return 0;
}

/* ---- timing ---- */

void tool_times_of(double *v, int n, tool_times *t)
{
    t->n = n;
    t->median = hu_median(v, n); /* sorts v */
    t->min = n > 0 ? v[0] : 0.0;
    t->max = n > 0 ? v[n - 1] : 0.0;
}

void warn_load(const char *cmd, int threads)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = 0.0;
    if (!f) return;
    if (fscanf(f, "%lf", &l1) == 1 && l1 > 0.5)
        fprintf(stderr,
                "beammoe %s: warning: load average %.2f as the timing starts (%d threads): other work "
                "competes for cores and memory, times may be high and spread\n",
                cmd, l1, threads);
    fclose(f);
}

/* ---- backends that cannot be used here ---- */

void backend_unavailable(const char *name, const char *lib_msg, char *out, size_t n)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    const char *why = strstr(lib_msg, "cannot run here: ");
    char lib[64];
    snprintf(lib, sizeof lib, "libbeammoe_%s", name);
    /* The CUDA runtime says "driver version is insufficient" when it finds
     * no driver at all (cudaErrorInsufficientDriver): a host without the
     * NVIDIA kernel driver has no /proc/driver/nvidia. */
    if (strstr(lib_msg, "driver version is insufficient"))
        snprintf(out, n, "not available (%s)",
                 access("/proc/driver/nvidia/version", F_OK) != 0
                     ? "no NVIDIA driver on this host"
                     : "the NVIDIA driver on this host is older than the CUDA runtime of this build needs");
    else if (strstr(lib_msg, "no CUDA-capable device") || strstr(lib_msg, "device count is 0"))
        snprintf(out, n, "not available (no NVIDIA GPU visible%s%s%s)", env ? ": CUDA_VISIBLE_DEVICES='" : "",
                 env ? env : "", env ? "'" : "");
    else if (strstr(lib_msg, "compute capability"))
        snprintf(out, n, "not available (the GPU is older than compute capability 9.0, which the kernels need)");
    else if (strstr(lib_msg, "did not load") && strstr(lib_msg, lib) &&
             strstr(lib_msg, "cannot open shared object file"))
        snprintf(out, n, "not available (not in this build: %s is not built or not installed)", lib);
    else if (strstr(lib_msg, "did not load: "))
        snprintf(out, n, "not available (its library does not load: %s)",
                 strstr(lib_msg, "did not load: ") + strlen("did not load: "));
    else
        snprintf(out, n, "not available (%s)", why ? why + strlen("cannot run here: ") : lib_msg);
}

/* ---- byte counts (read plus written) ---- */

double bytes_finalize(int64_t T, int32_t K, int32_t H, int post_weight)
{
    double t = (double)T, k = (double)K, h = (double)H;
    return t * k * h * 2 + t * k * 4 + t * h * 2 + (post_weight ? h * 2 : 0);
}

double bytes_fused(int64_t T, int32_t K, int32_t H, int post_weight, int next_on,
                   int next_weight)
{
    double t = (double)T, h = (double)H;
    /* the finalize bytes (their T*H*2 output stands for
     * hidden_out; the finalized row itself is never stored), plus the
     * residual read, plus normalized written when the next norm is on. */
    return bytes_finalize(T, K, H, post_weight) + t * h * 2 +
           (next_on ? t * h * 2 : 0) + (next_weight ? h * 2 : 0);
}

double bytes_nrn(int64_t T, int32_t H, int pre_weight, int next_on, int next_weight)
{
    double t = (double)T, h = (double)H;
    return t * h * 2 * 3 + (next_on ? t * h * 2 : 0) + (pre_weight ? h * 2 : 0) +
           (next_weight ? h * 2 : 0);
}
