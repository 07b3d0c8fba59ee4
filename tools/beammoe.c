/*
 * beammoe.c - entry point of the `beammoe` command-line tool: picks the
 * subcommand (audit.c, run.c, bench.c) and handles --help / --version.
 *
 * The tool links libbeammoe (the run-time dispatcher), so `audit` and `run`
 * reach every backend this host can load.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "common.h"

#ifndef PACKAGE_VERSION
#define BEAM_STR2(x) #x
#define BEAM_STR(x) BEAM_STR2(x)
#define PACKAGE_VERSION                                                                        \
    BEAM_STR(BEAM_VERSION_MAJOR) "." BEAM_STR(BEAM_VERSION_MINOR) "." BEAM_STR(BEAM_VERSION_PATCH)
#endif

static void tool_usage(FILE *f)
{
    fprintf(f,
            "Usage: beammoe <command> [options]\n"
            "       beammoe --help | --version\n"
            "\n"
            "Commands:\n"
            "  audit   every backend and strategy against the CPU ground truth, and the\n"
            "          CPU backend against an independent scalar reference\n"
            "  run     one case (generated, or a safetensors file's): backend, min /\n"
            "          median / max time, GB/s, checksum of the outputs\n"
            "  bench   CPU backend throughput as a fraction of memcpy bandwidth\n"
            "\n"
            "'beammoe <command> --help' describes a command's options; docs/tool.md\n"
            "describes every option, column, JSON field and message.\n"
            "Every command takes --json: one JSON document on stdout instead of the\n"
            "text (messages and progress stay on stderr).\n"
            "Environment: BEAM_BACKEND (%s or auto) picks the backend of 'run' when\n"
            "--backend is not given.\n"
            "\n"
            "Exit status, the same rule for every command:\n"
            "  0  done; audit: every row matches\n"
            "  1  a check failed or the run itself did: an audit mismatch or error row,\n"
            "     a device or communication error, out of memory, another library\n"
            "     error on valid input; a write error on the standard output (a full\n"
            "     disk, a closed stdout)\n"
            "  2  what was given is wrong: an unknown command, option or argument; an\n"
            "     option given twice, or one that does not apply (run --eps without a\n"
            "     norm, audit --seed with --input); a value that is not a number (a\n"
            "     number is the whole value: no spaces, no trailing text); sizes or\n"
            "     values the library rejects (top_k, hidden, tokens < 0, NaN or\n"
            "     infinite scales, eps < 0, ...); sizes larger than this host's\n"
            "     memory; a backend that is not available here (--backend,\n"
            "     BEAM_BACKEND); an --input file that cannot be used; an --output\n"
            "     path that cannot be written (nothing is written then)\n",
            bm_backend_choices(0));
}

/* The command line, run: its exit status. */
static int command(int argc, char **argv)
{
    const char *cmd;
    static char name[64];
    if (argc < 2) {
        fprintf(stderr, "beammoe: missing command\n");
        tool_usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        if (no_operands("", argc, argv, 2)) return TOOL_EXIT_USAGE;
        tool_usage(stdout);
        return TOOL_EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        if (no_operands("", argc, argv, 2)) return TOOL_EXIT_USAGE;
        printf("beammoe %s (library %s)\n", PACKAGE_VERSION, beam_version());
        return TOOL_EXIT_OK;
    }
    /* getopt_long of each command sees argv[0] = "beammoe <cmd>", so its
     * own messages ("beammoe run: unrecognized option ...") name it */
    snprintf(name, sizeof name, "beammoe %s", cmd);
    argv[1] = name;
    if (!strcmp(cmd, "audit")) return cmd_audit(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "beammoe: unknown command '%s'\nTry 'beammoe --help'.\n", cmd);
    return TOOL_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    /* a report that cannot be written fails the run (streams.c) */
    if (tool_streams_open()) return TOOL_EXIT_FAIL;
    /* a line reaches a pipe (`beammoe bench | tee log`) when it is done,
     * not when a 4 KiB buffer fills or the command ends */
    setvbuf(stdout, NULL, _IOLBF, 0);
    return tool_streams_close(command(argc, argv));
}
