/* What fsdp-train and fsdp-plan share on the command line: the tool's error messages, the
 * library's log as the tool's own, number parsing, and FSDP's options under PyTorch's names. */
#ifndef FSDP_TOOLS_CLI_H
#define FSDP_TOOLS_CLI_H

#include <fsdp/fsdp.h>

#include <getopt.h>
#include <stddef.h>

/* Names the tool in its messages (e.g. "fsdp-train") and makes the library's log messages come
 * out as the tool's own: "<tool>: error: ...", one line each, and a message repeated at once
 * (every rank may say the same) only once. At exit, a write to stdout that failed (a full disk)
 * is said in one line and the tool exits with status 2. Call first in main. */
void cli_init(const char *tool);
/* While quiet, the library's log messages are dropped (a tool probing what may fail). */
void cli_log_quiet(int quiet);

/* Prints "<tool>: error: <message>" on stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "<tool>: note: <message>" on stderr: what the tool chose for the user. */
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same as cli_error, then exits with status 2. */
void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Exits with status 2 saying nothing more: the library already said what was wrong. */
void cli_fail_quietly(void) __attribute__((noreturn));

/* The value of option opt (for the message) written as s, which must be a decimal integer or a
 * finite number in [lo, hi]; otherwise the tool dies saying so. */
long cli_parse_long(const char *opt, const char *s, long lo, long hi);
double cli_parse_double(const char *opt, const char *s, double lo, double hi);
/* A size in bytes: a number with an optional K, M, G or T (powers of 1024; KiB, KB and K are
 * alike); 0 is unlimited. */
size_t cli_parse_bytes(const char *opt, const char *s);

/* --mixed-precision: PyTorch's MixedPrecision. D alone (bf16) is MixedPrecision(param_dtype=D)
 * with the other fields at their defaults; param=D,reduce=D,buffer=D (with or without the
 * _dtype suffix) sets any subset, and keep_low_precision_grads that flag. D: fp32, bf16, fp16
 * and their other spellings. Dies saying what is allowed. */
void cli_parse_mixed_precision(const char *spec, fsdp_mixed_precision_t *mp);

/* The command line as the user typed it, for a trace's runs table: the program as it was called
 * (in a build tree, libtool's wrapper, not the binary under .libs/ that it runs) and each
 * argument, quoted for the shell where it needs to be; cut at size. */
void cli_command_line(int argc, char **argv, char *buf, size_t size);

/* getopt_long values, above any single character and any tool's own option values. */
enum {
    CLI_OPT_STRATEGY = 0x10000,
    CLI_OPT_BWD_PREFETCH,
    CLI_OPT_FWD_PREFETCH,
    CLI_OPT_LIMIT,
    CLI_OPT_NO_LIMIT,
    CLI_OPT_API,
    CLI_OPT_RAF,
    CLI_OPT_OUTPUT_DTYPE,
    CLI_OPT_TP,
    CLI_OPT_TP_LOSS
};

/* The entries of a tool's struct option table for them. */
#define CLI_FSDP_LONG_OPTIONS                                                                     \
    {"strategy", required_argument, NULL, CLI_OPT_STRATEGY},                                      \
        {"backward-prefetch", required_argument, NULL, CLI_OPT_BWD_PREFETCH},                     \
        {"forward-prefetch", no_argument, NULL, CLI_OPT_FWD_PREFETCH},                            \
        {"limit-all-gathers", no_argument, NULL, CLI_OPT_LIMIT},                                  \
        {"no-limit-all-gathers", no_argument, NULL, CLI_OPT_NO_LIMIT},                            \
        {"api", required_argument, NULL, CLI_OPT_API},                                            \
        {"reshard-after-forward", required_argument, NULL, CLI_OPT_RAF},                          \
        {"output-dtype", required_argument, NULL, CLI_OPT_OUTPUT_DTYPE},                          \
        {"tp", required_argument, NULL, CLI_OPT_TP},                                              \
        {"tp-loss-parallel", no_argument, NULL, CLI_OPT_TP_LOSS}

/* Applies getopt_long's value opt (and its argument) to cfg and returns 0; -1 when opt is none
 * of these options (spelled: the option as written) or its argument is not allowed, with why
 * saying so and what is allowed (without the tool's prefix). A tool calls it for every option
 * its own switch does not take. */
int cli_fsdp_option(int opt, const char *arg, const char *spelled, fsdp_config_t *cfg, char *why,
                    size_t why_len);
/* What a tool's switch leaves over after getopt_long returned opt: ':' (an option without its
 * value) and FSDP's options; the tool dies saying what was wrong with anything else. */
void cli_other_option(int opt, char **argv, fsdp_config_t *cfg);
/* After the options: the tool takes no other arguments, and dies naming the first one; and
 * FSDP's options agree with --api: under fsdp2, --forward-prefetch and --backward-prefetch
 * explicit become fully_shard's explicit lists, and an FSDP1-only option is refused with its
 * FSDP2 equivalent named (and --reshard-after-forward, --output-dtype or explicit under fsdp1). */
void cli_no_arguments(int argc, char **argv, fsdp_config_t *cfg);

/* --activation-checkpointing, torchtitan's meanings: "none" 0, "full" 1 (every block),
 * "selective-layer[:K]" K (every K-th block, default 2), "selective-op" CLI_AC_SELECTIVE_OP
 * (within every block, the expensive ops' outputs kept and the rest recomputed; Llama models);
 * the tool dies saying what is allowed for anything else. */
enum { CLI_AC_SELECTIVE_OP = -2 };
int cli_activation_checkpointing(const char *arg);

/* --attention eager|fused for a GPT model: 0 (HF's eager attention) or 1 (one fused kernel);
 * the tool dies saying what is allowed for anything else. */
int cli_attention(const char *arg);
/* --ops eager|fused: how the simulated times price element-wise work (fsdp_sim_ops_t); the tool
 * dies saying what is allowed for anything else. */
int cli_ops(const char *arg);
/* Applies --attention (attention < 0: not given) to the model: a GPT model's config (gpt), or a
 * check that a Llama (llama 1; its attention is always the fused kernel) is not asked for eager;
 * an MLP (gpt NULL, llama 0) has no attention. The tool dies naming a mismatch. */
void cli_apply_attention(int attention, fsdp_gpt2_config_t *gpt, int llama);

/* " (dp D x tp T)", the mesh of a run of world ranks, per_node to a node, under cfg's tensor
 * parallelism (" (replicate R x shard S x tp T)" under hybrid sharding, lib/core/groups.c), into
 * buf; "" without tensor parallelism. Returns buf. */
const char *cli_mesh(char *buf, size_t size, int world, int per_node, const fsdp_config_t *cfg);

/* Checks an output path before any work, so that a run does not fail at its end: a file (dir
 * 0) must be a regular file or absent, in a writable directory; a directory (dir 1) must be a
 * writable directory or absent, in a writable directory. 0, or -1 with why saying what is wrong
 * (opt names the option). */
int cli_check_output(const char *opt, const char *path, int dir, char *why, size_t why_len);

#endif
