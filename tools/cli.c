/* What fsdp-train and fsdp-plan share on the command line (cli.h). */
#include "cli.h"
#include "progress.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *cli_tool = "fsdp";
static int cli_quiet;
/* the simulated ranks that stopped only because another failed: the first says so, the rest are
 * counted and summed up in one line at exit (on the gpu backend each process is one rank) */
static int cli_peer_lines, cli_peer_more;

/* A message that ends in ": " and FSDP_ERR_RANK_FAILED's text. */
static int peer_failed(const char *msg)
{
    const char *why = fsdp_status_string(FSDP_ERR_RANK_FAILED);
    size_t n = strlen(msg), k = strlen(why);
    return n >= k + 2 && strcmp(msg + n - k, why) == 0 && strncmp(msg + n - k - 2, ": ", 2) == 0;
}

static void log_to_stderr(fsdp_log_level_t level, const char *file, int line, const char *func,
                          const char *msg, void *arg)
{
    static const char *const names[] = {"error", "warning", "info", "debug", "trace"};
    static char last[1024]; /* the handler runs under the log lock */
    (void)file, (void)line, (void)func, (void)arg;
    /* ranks that fail alike (a bad checkpoint) say it once */
    if (cli_quiet || strncmp(last, msg, sizeof(last) - 1) == 0)
        return;
    if (peer_failed(msg) && cli_peer_lines++ > 0) {
        cli_peer_more++;
        return;
    }
    snprintf(last, sizeof(last), "%s", msg);
    progress_hide();
    fprintf(stderr, "%s: %s: %s\n", cli_tool, names[level >= 0 && level <= 4 ? level : 0], msg);
    progress_show();
}

static void cli_peer_summary(void)
{
    if (cli_peer_more > 0)
        fprintf(stderr, "%s: error: %d more rank%s stopped the same way (%s)\n", cli_tool,
                cli_peer_more, cli_peer_more == 1 ? "" : "s",
                fsdp_status_string(FSDP_ERR_RANK_FAILED));
}

/* At exit, what the tool printed must have reached its file (a full disk, /dev/full, a pipe whose
 * reader is gone with SIGPIPE ignored): otherwise one error line and status 2, never a cut-short
 * output and 0. Registered first, so it runs after every other exit handler has printed; stdout
 * closed by the caller (>&-) with nothing written to it is no failure. */
static void cli_close_stdout(void)
{
    int failed = ferror(stdout) != 0, err = 0;
    char why[128];

    if (fflush(stdout) != 0)
        failed = 1, err = errno;
    errno = 0;
    if (fclose(stdout) != 0 && !failed && errno != EBADF)
        failed = 1, err = errno;
    if (!failed)
        return;
    snprintf(why, sizeof(why), "%s", err ? strerror(err) : "a write to it failed");
    why[0] = (char)tolower((unsigned char)why[0]);
    fprintf(stderr,
            "%s: error: cannot write the standard output: %s (what it holds is cut short)\n",
            cli_tool, why);
    _exit(2);
}

void cli_init(const char *tool)
{
    cli_tool = tool;
    atexit(cli_close_stdout);
    atexit(cli_peer_summary);
    fsdp_log_set_handler(log_to_stderr, NULL);
    fsdp_log_level(); /* a bad FSDP_LOG_LEVEL is said at once, not at the first message */
}

void cli_log_quiet(int quiet)
{
    cli_quiet = quiet;
}

static void cli_vmessage(const char *kind, const char *fmt, va_list ap)
{
    progress_hide();
    fprintf(stderr, "%s: %s: ", cli_tool, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    progress_show();
}

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vmessage("error", fmt, ap);
    va_end(ap);
}

void cli_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vmessage("note", fmt, ap);
    va_end(ap);
}

void cli_die(const char *fmt, ...)
{
    va_list ap;
    progress_end();
    va_start(ap, fmt);
    cli_vmessage("error", fmt, ap);
    va_end(ap);
    exit(2);
}

void cli_fail_quietly(void)
{
    exit(2);
}

long cli_parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi)
        cli_die("%s: '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
    return v;
}

double cli_parse_double(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v) || v < lo || v > hi)
        cli_die("%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    return v;
}

size_t cli_parse_bytes(const char *opt, const char *s)
{
    char *end;
    double v, mult = 1.0;
    errno = 0;
    v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        mult = 1024.0, end++;
    else if (*end == 'M')
        mult = 1024.0 * 1024, end++;
    else if (*end == 'G')
        mult = 1024.0 * 1024 * 1024, end++;
    else if (*end == 'T')
        mult = 1024.0 * 1024 * 1024 * 1024, end++;
    if (*end == 'i')
        end++;
    if (*end == 'B')
        end++;
    if (errno || end == s || *end != '\0' || !(v >= 0) || v * mult > 1e18)
        cli_die("%s: '%s' is not a size in bytes (e.g. 80G, 85899345920; 0 is unlimited)", opt, s);
    return (size_t)(v * mult);
}

void cli_parse_mixed_precision(const char *spec, fsdp_mixed_precision_t *mp)
{
    char buf[256], *save = NULL;
    fsdp_dtype_t dt0;

    const fsdp_dtype_t *seen[3] = {NULL, NULL, NULL};
    int nseen = 0;

    if (strlen(spec) >= sizeof(buf) || spec[0] == '\0' || spec[0] == ',' ||
        spec[strlen(spec) - 1] == ',' || strstr(spec, ",,") != NULL)
        cli_die("--mixed-precision: '%s' is not a dtype D or a list of param=D, reduce=D, buffer=D "
                "(no empty item)",
                spec);
    strcpy(buf, spec);
    if (strchr(buf, '=') == NULL && strchr(buf, ',') == NULL && fsdp_dtype_parse(buf, &dt0)) {
        /* MixedPrecision(param_dtype=D): reduce_dtype and buffer_dtype keep their defaults */
        if (!fsdp_dtype_is_float(dt0))
            cli_die("--mixed-precision: '%s' is not a float dtype (fp32, bf16, fp16)", spec);
        mp->param_dtype = dt0;
        return;
    }
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        fsdp_dtype_t dt, *field;
        if (strcmp(item, "keep_low_precision_grads") == 0) {
            mp->keep_low_precision_grads = 1;
            continue;
        }
        if (eq == NULL)
            cli_die("--mixed-precision: '%s' is not key=dtype (keys param, reduce, buffer) or "
                    "keep_low_precision_grads",
                    item);
        *eq = '\0';
        if (strcmp(item, "param") == 0 || strcmp(item, "param_dtype") == 0)
            field = &mp->param_dtype;
        else if (strcmp(item, "reduce") == 0 || strcmp(item, "reduce_dtype") == 0)
            field = &mp->reduce_dtype;
        else if (strcmp(item, "buffer") == 0 || strcmp(item, "buffer_dtype") == 0)
            field = &mp->buffer_dtype;
        else
            cli_die("--mixed-precision: unknown key '%s' (keys: param, reduce, buffer)", item);
        if (!fsdp_dtype_parse(eq + 1, &dt) || !fsdp_dtype_is_float(dt))
            cli_die("--mixed-precision: %s='%s' is not a float dtype (fp32/f32/float32, "
                    "bf16/bfloat16, fp16/f16/float16)",
                    item, eq + 1);
        for (int i = 0; i < nseen; i++)
            if (seen[i] == field)
                cli_die("--mixed-precision: %s is given twice in '%s'", item, spec);
        seen[nseen++] = field;
        *field = dt;
    }
}

void cli_command_line(int argc, char **argv, char *buf, size_t size)
{
    size_t off = 0;

    if (size == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; i < argc && off + 1 < size; i++) {
        const char *arg = argv[i], *libs;
        char prog[1024];
        int n;
        /* libtool runs DIR/.libs/NAME or DIR/.libs/lt-NAME for the wrapper DIR/NAME */
        if (i == 0 && (libs = strstr(arg, ".libs/")) != NULL && strchr(libs + 6, '/') == NULL) {
            const char *name = libs + 6;
            if (strncmp(name, "lt-", 3) == 0)
                name += 3;
            snprintf(prog, sizeof(prog), "%.*s%s", (int)(libs - arg), arg, name);
            arg = prog;
        }
        if (arg[0] != '\0' && strpbrk(arg, " \t\n'\"\\$`*?[]{}()<>|&;#~") == NULL)
            n = snprintf(buf + off, size - off, "%s%s", i ? " " : "", arg);
        else {
            n = snprintf(buf + off, size - off, "%s'", i ? " " : "");
            for (const char *p = arg; n >= 0 && *p && off + (size_t)n + 5 < size; p++)
                n += *p == '\'' ? snprintf(buf + off + n, size - off - (size_t)n, "'\\''")
                                : snprintf(buf + off + n, size - off - (size_t)n, "%c", *p);
            n += snprintf(buf + off + n, size - off - (size_t)n, "'");
        }
        if (n < 0)
            break;
        off += (size_t)n;
    }
    if (off >= size)
        buf[size - 1] = '\0';
}

/* FSDP's options given on the command line, for cli_no_arguments' check against --api */
static unsigned fsdp_given;
static int explicit_backward;

static int parse_reshard(const char *arg)
{
    char *end;
    long n;

    if (strcmp(arg, "true") == 0)
        return FSDP_RESHARD_TRUE;
    if (strcmp(arg, "false") == 0)
        return FSDP_RESHARD_FALSE;
    n = strtol(arg, &end, 10);
    if (arg[0] >= '1' && arg[0] <= '9' && *end == '\0' && n >= 1 && n <= FSDP_MAX_WORLD)
        return (int)n;
    return FSDP_RESHARD_INHERIT;
}

int cli_fsdp_option(int opt, const char *arg, const char *spelled, fsdp_config_t *cfg, char *why,
                    size_t why_len)
{
    if (opt >= CLI_OPT_STRATEGY && opt <= CLI_OPT_TP_LOSS)
        fsdp_given |= 1u << (opt - CLI_OPT_STRATEGY);
    switch (opt) {
    case CLI_OPT_API:
        if (strcmp(arg, "fsdp1") == 0 || strcmp(arg, "fsdp2") == 0) {
            cfg->api = arg[4] == '2' ? FSDP_API_FSDP2 : FSDP_API_FSDP1;
        } else {
            snprintf(why, why_len, "--api: '%s' is not one of fsdp1, fsdp2", arg);
            return -1;
        }
        return 0;
    case CLI_OPT_RAF:
        cfg->reshard_after_forward = parse_reshard(arg);
        if (cfg->reshard_after_forward == FSDP_RESHARD_INHERIT) {
            snprintf(why, why_len,
                     "--reshard-after-forward: '%s' is not true, false or a number of ranks N "
                     ">= 1 (dividing the shard group's size)",
                     arg);
            return -1;
        }
        return 0;
    case CLI_OPT_OUTPUT_DTYPE:
        if (!fsdp_dtype_parse(arg, &cfg->mixed_precision.output_dtype) ||
            !fsdp_dtype_is_float(cfg->mixed_precision.output_dtype)) {
            cfg->mixed_precision.output_dtype = FSDP_DTYPE_UNSET;
            snprintf(why, why_len,
                     "--output-dtype: '%s' is not a float dtype (fp32/f32/float32, "
                     "bf16/bfloat16, fp16/f16/float16)",
                     arg);
            return -1;
        }
        return 0;
    case CLI_OPT_TP: {
        char *end;
        long n = strtol(arg, &end, 10);
        if (arg[0] < '1' || arg[0] > '9' || *end != '\0' || n < 1 || n > 4096) {
            snprintf(why, why_len, "--tp: '%s' is not a number of ranks in [1, 4096]", arg);
            return -1;
        }
        cfg->tp_size = (int)n;
        return 0;
    }
    case CLI_OPT_TP_LOSS:
        cfg->tp_loss_parallel = 1;
        return 0;
    case CLI_OPT_STRATEGY:
        if (!fsdp_strategy_parse(arg, &cfg->strategy)) {
            snprintf(why, why_len,
                     "--strategy: '%s' is not one of full_shard, shard_grad_op, no_shard, "
                     "hybrid_shard, hybrid_shard_zero2",
                     arg);
            return -1;
        }
        return 0;
    case CLI_OPT_BWD_PREFETCH:
        explicit_backward = strcmp(arg, "explicit") == 0;
        if (!explicit_backward && !fsdp_backward_prefetch_parse(arg, &cfg->backward_prefetch)) {
            snprintf(why, why_len,
                     "--backward-prefetch: '%s' is not one of pre, post, none (fsdp1) or "
                     "explicit (fsdp2)",
                     arg);
            return -1;
        }
        return 0;
    case CLI_OPT_FWD_PREFETCH:
        cfg->forward_prefetch = 1;
        return 0;
    case CLI_OPT_LIMIT:
        cfg->limit_all_gathers = 1;
        return 0;
    case CLI_OPT_NO_LIMIT:
        cfg->limit_all_gathers = 0;
        return 0;
    default:
        snprintf(why, why_len, "unknown option '%s' (see --help)", spelled);
        return -1;
    }
}

void cli_other_option(int opt, char **argv, fsdp_config_t *cfg)
{
    char why[256];

    if (opt == ':')
        cli_die("option '%s' needs a value (see --help)", argv[optind - 1]);
    if (cli_fsdp_option(opt, optarg, argv[optind - 1], cfg, why, sizeof(why)) != 0)
        cli_die("%s", why);
}

#define GIVEN(opt) (fsdp_given & (1u << ((opt)-CLI_OPT_STRATEGY)))

/* --api fsdp2: what FSDP1's options become, or why they are refused */
static void fsdp2_options(fsdp_config_t *cfg)
{
    if (GIVEN(CLI_OPT_LIMIT) || GIVEN(CLI_OPT_NO_LIMIT))
        cli_die("--api fsdp2: fully_shard has no all-gather rate limiter (its frees are ordered "
                "by stream waits); drop --limit-all-gathers / --no-limit-all-gathers");
    if (GIVEN(CLI_OPT_BWD_PREFETCH) && !explicit_backward)
        cli_die("--api fsdp2: --backward-prefetch pre|post|none is fsdp1's; fully_shard "
                "prefetches the previous unit implicitly (as pre), or give --backward-prefetch "
                "explicit for explicit lists");
    if (cfg->strategy == FSDP_SHARD_GRAD_OP || cfg->strategy == FSDP_HYBRID_SHARD_ZERO2)
        cli_die("--api fsdp2: --strategy %s is fsdp1's; give --reshard-after-forward false%s",
                fsdp_strategy_name(cfg->strategy),
                cfg->strategy == FSDP_HYBRID_SHARD_ZERO2 ? " with --strategy hybrid_shard" : "");
    if (cfg->strategy == FSDP_NO_SHARD)
        cli_die("--api fsdp2: --strategy no_shard is fsdp1's; replicate with --strategy "
                "hybrid_shard --ranks-per-node 1");
    cfg->explicit_forward_prefetch = cfg->forward_prefetch;
    cfg->explicit_backward_prefetch = explicit_backward;
    cfg->forward_prefetch = 0;
    cfg->backward_prefetch = FSDP_BACKWARD_PREFETCH_PRE;
}

void cli_no_arguments(int argc, char **argv, fsdp_config_t *cfg)
{
    if (optind < argc)
        cli_die("unexpected argument '%s' (see --help)", argv[optind]);
    if (cfg->tp_loss_parallel && cfg->tp_size <= 1)
        cli_die("--tp-loss-parallel keeps the logits sharded over a tp group: give --tp N > 1");
    if (cfg->api == FSDP_API_FSDP2) {
        fsdp2_options(cfg);
        return;
    }
    if (GIVEN(CLI_OPT_TP) && cfg->tp_size > 1)
        cli_die("--tp %d needs --api fsdp2: tensor parallelism composes with fully_shard's "
                "per-parameter shards, not with fsdp1's flat parameters",
                cfg->tp_size);
    if (GIVEN(CLI_OPT_RAF))
        cli_die("--reshard-after-forward is fully_shard's (--api fsdp2); fsdp1's strategies "
                "say it: full_shard reshards, shard_grad_op does not");
    if (explicit_backward)
        cli_die("--backward-prefetch explicit is fully_shard's (--api fsdp2); fsdp1 takes pre, "
                "post or none");
    if (GIVEN(CLI_OPT_OUTPUT_DTYPE))
        cli_die("--output-dtype is fully_shard's MixedPrecisionPolicy (--api fsdp2); fsdp1's "
                "--mixed-precision takes param, reduce and buffer dtypes");
}

int cli_activation_checkpointing(const char *arg)
{
    const char *sel = "selective-layer";
    size_t n = strlen(sel);
    char *end;
    long k;

    if (strcmp(arg, "none") == 0)
        return 0;
    if (strcmp(arg, "full") == 0)
        return 1;
    if (strcmp(arg, "selective-op") == 0)
        return CLI_AC_SELECTIVE_OP;
    if (strncmp(arg, sel, n) == 0 && arg[n] == '\0')
        return 2;
    if (strncmp(arg, sel, n) == 0 && arg[n] == ':' && arg[n + 1] >= '0' && arg[n + 1] <= '9') {
        k = strtol(arg + n + 1, &end, 10);
        if (*end == '\0' && k >= 1 && k <= 1 << 20)
            return (int)k;
    }
    cli_die("--activation-checkpointing: '%s' is not none, full, selective-layer[:K] (K >= 1) or "
            "selective-op",
            arg);
}

int cli_attention(const char *arg)
{
    if (strcmp(arg, "eager") == 0)
        return 0;
    if (strcmp(arg, "fused") == 0)
        return 1;
    cli_die("--attention: '%s' is not eager or fused", arg);
}

int cli_ops(const char *arg)
{
    if (strcmp(arg, "eager") == 0)
        return FSDP_SIM_OPS_EAGER;
    if (strcmp(arg, "fused") == 0)
        return FSDP_SIM_OPS_FUSED;
    cli_die("--ops: '%s' is not one of eager, fused", arg);
}

void cli_apply_attention(int attention, fsdp_gpt2_config_t *gpt, int llama)
{
    if (attention < 0)
        return;
    if (llama) {
        if (attention == 0)
            cli_die("--attention eager: a llama model's attention is always the fused kernel");
        return;
    }
    if (gpt == NULL)
        cli_die("--attention applies to gpt and llama models; an mlp has no attention");
    gpt->fused_attention = attention;
}

int cli_check_output(const char *opt, const char *path, int dir, char *why, size_t why_len)
{
    char parent[4096];
    const char *slash;
    struct stat st;

    if (path == NULL)
        return 0;
    if (path[0] == '\0') {
        snprintf(why, why_len, "%s: the path is empty", opt);
        return -1;
    }
    if (stat(path, &st) == 0) {
        if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
            snprintf(why, why_len, "%s: '%s' exists and is not a %s", opt, path,
                     dir ? "directory" : "regular file");
            return -1;
        }
        if (dir && access(path, W_OK | X_OK) != 0) {
            snprintf(why, why_len, "%s: cannot write into '%s': %s", opt, path, strerror(errno));
            return -1;
        }
        if (dir)
            return 0;
    }
    /* the file (or the directory) is created or replaced in its parent */
    slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(parent, sizeof(parent), ".");
    else
        snprintf(parent, sizeof(parent), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (access(parent, W_OK | X_OK) != 0) {
        snprintf(why, why_len, "%s: cannot write into '%s': %s", opt, parent, strerror(errno));
        return -1;
    }
    return 0;
}

const char *cli_mesh(char *buf, size_t size, int world, int per_node, const fsdp_config_t *cfg)
{
    int tp = cfg->tp_size;

    if (tp <= 1 || world % tp != 0)
        snprintf(buf, size, "%s", "");
    else if ((cfg->strategy == FSDP_HYBRID_SHARD || cfg->strategy == FSDP_HYBRID_SHARD_ZERO2) &&
             per_node > 0 && world % per_node == 0 && per_node % tp == 0)
        snprintf(buf, size, " (replicate %d x shard %d x tp %d)", world / per_node, per_node / tp,
                 tp);
    else
        snprintf(buf, size, " (dp %d x tp %d)", world / tp, tp);
    return buf;
}
