/* Command-line options that fsdp-train and fsdp-plan share: FSDP's own, under PyTorch's names. */
#ifndef FSDP_TOOLS_CLI_H
#define FSDP_TOOLS_CLI_H

#include <fsdp/fsdp.h>

#include <getopt.h>
#include <stddef.h>

/* getopt_long values, above any single character and any tool's own option values. */
enum {
    CLI_OPT_STRATEGY = 0x10000,
    CLI_OPT_BWD_PREFETCH,
    CLI_OPT_FWD_PREFETCH,
    CLI_OPT_LIMIT,
    CLI_OPT_NO_LIMIT
};

/* The entries of a tool's struct option table for them. */
#define CLI_FSDP_LONG_OPTIONS                                                                   \
    {"strategy", required_argument, NULL, CLI_OPT_STRATEGY},                                    \
        {"backward-prefetch", required_argument, NULL, CLI_OPT_BWD_PREFETCH},                   \
        {"forward-prefetch", no_argument, NULL, CLI_OPT_FWD_PREFETCH},                          \
        {"limit-all-gathers", no_argument, NULL, CLI_OPT_LIMIT},                                \
        {"no-limit-all-gathers", no_argument, NULL, CLI_OPT_NO_LIMIT}

/* Applies getopt_long's value opt (and its argument) to cfg and returns 0; -1 when opt is none
 * of these options (spelled: the option as written) or its argument is not allowed, with why
 * saying so and what is allowed (without the tool's prefix). A tool calls it for every option
 * its own switch does not take. */
int cli_fsdp_option(int opt, const char *arg, const char *spelled, fsdp_config_t *cfg, char *why,
                    size_t why_len);

/* Checks an output path before any work, so that a run does not fail at its end: a file (dir
 * 0) must be a regular file or absent, in a writable directory; a directory (dir 1) must be a
 * writable directory or absent, in a writable directory. 0, or -1 with why saying what is wrong
 * (opt names the option). */
int cli_check_output(const char *opt, const char *path, int dir, char *why, size_t why_len);

#endif
