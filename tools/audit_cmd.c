/*
 * audit_cmd.c - the `beammoe audit` command: its options and usage, then
 * the built-in sweep (audit.c) or the audit of a file (audit_input.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <getopt.h>
#include <stdio.h>

#include "audit.h"
#include "common.h"

static void audit_usage(FILE *f)
{
    fprintf(f,
            "Usage: beammoe audit [--quick] [--seed N] [--verbose] [--json]\n"
            "       beammoe audit --input FILE.safetensors [--quick] [--json]\n"
            "\n"
            "Checks every available backend (cpu; cuda when it loads) and every strategy\n"
            "against the CPU ground truth on a built-in sweep of shapes and special\n"
            "values (NaN, +-inf, signed zeros, subnormals, rounding ties, overflow), and\n"
            "the CPU backend against the naive reference of docs/numerics.md; the\n"
            "quantized output of normalized in every form the tests run (FP8 with FP32\n"
            "scales and the block-scaled forms), the CPU's against the model of\n"
            "docs/numerics.md (harness/quant_model.c) and every backend's against the\n"
            "CPU's.\n"
            "The gather runs on CPU groups of 1, 2, 3, 4 and 8 ranks (the CUDA gather\n"
            "needs one process per GPU: tests/test_gather_nccl checks it bit for bit\n"
            "against the same rules). Inputs past the live rows are NaN; outputs get a\n"
            "guard row that must keep the tool's sentinel.\n"
            "\n"
            "Report: one line per backend and strategy, summed over the cases: cases,\n"
            "elements compared, mismatching elements, max BF16 ULP distance (ordered\n"
            "integers; NaN vs NaN 0, NaN vs number 'nan'); a row that mismatches or\n"
            "fails is printed in full as it happens. --verbose prints every row (case,\n"
            "backend, strategy, compared, mismatch, maxulp). Progress goes to stderr\n"
            "every 2 s on a long audit. docs/tool.md describes every column and line.\n"
            "\n"
            "  --quick     a smaller sweep (seconds)\n"
            "  --seed N    seed of the generated inputs (default 1; not with --input)\n"
            "  --input F   audit the tensors of safetensors file F instead of the sweep\n"
            "              (one case: its report has every row)\n"
            "  --verbose   every row of every case, and the library's own words for a\n"
            "              backend that cannot be audited\n"
            "  --json      one JSON document on stdout instead of the text (docs/tool.md)\n"
            "  -h, --help  this text\n"
            "\n"
            "--input F: the same backends and strategies on real tensors (a dump from a\n"
            "model, or 'beammoe run --output'). Tensors (row-major, little-endian):\n"
            "  expert_outputs    BF16 [capacity, top_k, hidden] or [capacity*top_k, hidden]\n"
            "  expert_weights    F32  [capacity, top_k]                       (required)\n"
            "  residual          BF16 [rows >= live_tokens, hidden]: the fused op\n"
            "                    (finalize_norm_residual_norm); without it, finalize\n"
            "  post_norm_weight  BF16 [hidden]   post-FFN RMSNorm weight\n"
            "  next_norm_weight  BF16 [hidden]   next-layer RMSNorm weight (needs residual)\n"
            "  output | hidden, normalized  BF16 [live_tokens, hidden]: expected results,\n"
            "                    compared bit for bit with the ground truth when present\n"
            "Metadata (__metadata__, strings): routed_scale (default 1), post_eps,\n"
            "next_eps (default 1e-6; a given eps turns its norm on even without a\n"
            "weight), live_tokens (default: residual rows, else capacity), scales \"a,b\"\n"
            "(needs residual). A file that cannot be used (missing, truncated, bad JSON,\n"
            "missing names, wrong dtypes or shapes, arguments the library rejects) is\n"
            "exit status 2 with a message. Needs a build with json-c.\n"
            "\n"
            "Exit status: 0 all match; 1 a mismatch or an error row, or the run failed\n"
            "(out of memory, device error); 2 a bad option or value (a number is the\n"
            "whole value: no spaces, no trailing text), or an --input file that cannot\n"
            "be used: missing, not a regular file (a FIFO or device is refused at once),\n"
            "malformed, or values the library rejects. 'beammoe --help' has the rule of\n"
            "every command.\n");
}

int cmd_audit(int argc, char **argv)
{
    static const struct option longopts[] = {{"quick", no_argument, NULL, 'q'},
                                             {"seed", required_argument, NULL, 's'},
                                             {"input", required_argument, NULL, 'i'},
                                             {"verbose", no_argument, NULL, 'v'}, TOOL_OPTIONS_END};
    audit_view view = {0, 0};
    int opt, i, help = 0, seed_given = 0, quick = 0;
    uint64_t seed = 1;
    unsigned char seen[sizeof longopts / sizeof longopts[0]] = {0};
    const char *input = NULL;

    optind = 1;
    while ((opt = next_option("audit", argc, argv, longopts, seen, &help)) >= 0) {
        switch (opt) {
        case 'q':
            quick = 1;
            break;
        case 's':
            if (parse_u64("audit", "--seed", optarg, &seed)) return TOOL_EXIT_USAGE;
            seed_given = 1;
            break;
        case 'i':
            input = optarg;
            break;
        case 'v':
            view.verbose = 1;
            break;
        case 'j':
            view.json = 1;
            break;
        }
    }
    if ((i = options_end("audit", opt, argc, argv, help, audit_usage)) >= 0) return i;
    /* a file's inputs are the file's: a seed would be silently unused */
    if (input && seed_given) {
        fprintf(stderr, "beammoe audit: --seed applies to the built-in sweep, not to --input\n"
                        "Try 'beammoe audit --help'.\n");
        return TOOL_EXIT_USAGE;
    }
    return input ? audit_input(input, quick, &view) : audit_sweep(&view, quick, seed);
}
