/* fsdp-plan: how a model would train with FSDP on a cluster, before the job is launched.
 *
 *   fsdp-plan --model mlp-175b --profile h100:nodes=128 --batch 2048
 *   fsdp-plan --model mlp:4096,16384,4096 --profile a100 --sweep
 *
 * Runs the real training step (the same hooks, allocator and model code as fsdp-train) on
 * simulated ranks in shape mode: no buffers and no math, only bytes and virtual time from the
 * cluster profile. Prints per-rank peak memory by category and phase, the step time, the
 * exposed communication and the MFU; --sweep tries strategies, backward prefetch policies and
 * the rate limiter and says which fit the device memory and which is fastest. */
#include <fsdp/fsdp.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- models ------------------------------------------------------------------------------
 *
 * A model is a family of ops (how to build it on a rank and run one forward and backward in
 * shape mode) and a table entry per named configuration: adding a model is one entry. */

#define MAX_DIMS (FSDP_MLP_MAX_LAYERS + 1)

typedef struct model_cfg {
    int dims[MAX_DIMS];
    int nlayers;
} model_cfg_t;

typedef struct model_ops {
    /* Parses what follows the family prefix (the whole spec for a preset's own spec). */
    int (*parse)(const char *spec, model_cfg_t *cfg);
    fsdp_status_t (*create)(fsdp_t *fs, const model_cfg_t *cfg, void **model_p);
    /* One forward and backward over `rows` rows of this rank's batch. */
    fsdp_status_t (*step)(void *model, size_t rows);
    void (*destroy)(void *model);
    double (*params)(const model_cfg_t *cfg);
    int (*units)(const model_cfg_t *cfg);
} model_ops_t;

static int mlp_parse(const char *spec, model_cfg_t *cfg)
{
    cfg->nlayers = fsdp_mlp_parse_spec(spec, cfg->dims, MAX_DIMS);
    return cfg->nlayers >= 1 ? 0 : -1;
}

static fsdp_status_t mlp_create(fsdp_t *fs, const model_cfg_t *cfg, void **model_p)
{
    /* shape mode: no initial values to set */
    return fsdp_mlp_create(fs, cfg->dims, cfg->nlayers, (fsdp_mlp_t **)model_p);
}

static fsdp_status_t mlp_step(void *model, size_t rows)
{
    float loss;
    /* shape mode moves no data: there is no batch in host memory */
    return fsdp_mlp_forward_backward(model, NULL, NULL, rows, &loss);
}

static void mlp_destroy(void *model)
{
    fsdp_mlp_destroy(model);
}

static double mlp_params(const model_cfg_t *cfg)
{
    double n = 0.0;
    for (int i = 0; i < cfg->nlayers; i++)
        n += (double)cfg->dims[i] * cfg->dims[i + 1] + cfg->dims[i + 1];
    return n;
}

static int mlp_units(const model_cfg_t *cfg)
{
    return cfg->nlayers;
}

static const model_ops_t mlp_ops = {mlp_parse, mlp_create, mlp_step, mlp_destroy, mlp_params,
                                    mlp_units};

/* GPT-3 175B's shape (96 blocks of 12 x 12288^2 = 1.81e9 parameters) as an MLP: 96 Linear
 * units alternating 12288 -> 147456 -> 12288, 1.74e11 parameters. */
static int mlp_175b_parse(const char *spec, model_cfg_t *cfg)
{
    (void)spec;
    cfg->nlayers = 96;
    for (int i = 0; i <= cfg->nlayers; i++)
        cfg->dims[i] = i % 2 ? 12 * 12288 : 12288;
    return 0;
}

static const model_ops_t mlp_175b_ops = {mlp_175b_parse, mlp_create, mlp_step, mlp_destroy,
                                         mlp_params, mlp_units};

typedef struct model_entry {
    const char *name;   /* exact name, or a family prefix ending in ':' */
    const char *what;
    const model_ops_t *ops;
    size_t default_rows; /* per rank */
} model_entry_t;

static const model_entry_t models[] = {
    {"mlp:", "mlp:D0,D1,...,DL: a Linear/ReLU stack, one unit per Linear", &mlp_ops, 8},
    {"mlp-175b", "GPT-3 175B's parameter and unit count as an MLP (96 units of 1.81e9)",
     &mlp_175b_ops, 2048},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

static const model_entry_t *model_find(const char *spec)
{
    for (size_t i = 0; i < N_MODELS; i++) {
        size_t n = strlen(models[i].name);
        if (models[i].name[n - 1] == ':' ? strncmp(spec, models[i].name, n) == 0
                                         : strcmp(spec, models[i].name) == 0)
            return &models[i];
    }
    return NULL;
}

/* ---- arguments ---------------------------------------------------------------------------- */

typedef struct plan_args {
    const char *model_spec;
    const model_entry_t *model;
    model_cfg_t mcfg;
    fsdp_sim_profile_t profile;
    size_t capacity; /* bytes per GPU */
    fsdp_config_t fsdp;
    fsdp_optim_kind_t optim;
    size_t rows;
    int steps;
    int sweep;
    int world, per_node;
    double timeout_s;
} plan_args_t;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fsdp-plan: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* Library messages as the tool's own, once each (every rank may say the same); none while a
 * sweep probes configurations that may not fit. */
static int log_quiet;

static void log_to_stderr(fsdp_log_level_t level, const char *file, int line, const char *func,
                          const char *msg, void *arg)
{
    static const char *const names[] = {"error", "warning", "info", "debug", "trace"};
    static char last[1024]; /* the handler runs under the log lock */
    (void)file, (void)line, (void)func, (void)arg;
    if (log_quiet || strncmp(last, msg, sizeof(last) - 1) == 0)
        return;
    snprintf(last, sizeof(last), "%s", msg);
    fprintf(stderr, "fsdp-plan: %s: %s\n", names[level >= 0 && level <= 4 ? level : 0], msg);
}

static void usage(FILE *f)
{
    fputs("usage: fsdp-plan --model SPEC [options]\n"
          "  --model SPEC               mlp:D0,D1,...,DL, or a named model (--list-models)\n"
          "  --profile P                cluster: a preset (h100, a100) or a JSON file, optionally\n"
          "                             with :nodes=N,gpus_per_node=G (default h100)\n"
          "  --nodes N, --gpus-per-node G   the cluster's shape (override the profile's)\n"
          "  --world W                  ranks (default nodes x gpus per node)\n"
          "  --capacity BYTES           device memory per GPU, with K/M/G/T (default: the\n"
          "                             profile's GPU memory)\n"
          "  --batch ROWS               rows (tokens) per rank per step (default per model)\n"
          "  --strategy S               full_shard | shard_grad_op | no_shard | hybrid_shard |\n"
          "                             hybrid_shard_zero2 (default full_shard)\n"
          "  --backward-prefetch P      pre | post | none (default pre)\n"
          "  --forward-prefetch         prefetch the next unit's all-gather in forward\n"
          "  --limit-all-gathers, --no-limit-all-gathers   CPU rate limiter (default on)\n"
          "  --optim adamw|sgd          optimizer state to hold (default adamw)\n"
          "  --steps N                  simulated steps; the last is reported (default 2)\n"
          "  --sweep                    try every strategy, backward prefetch and limiter setting\n"
          "  --print-profile            print the cluster profile as JSON and exit\n"
          "  --list-models              the named models\n"
          "  --timeout S                collective timeout in wall seconds (default 600)\n"
          "  --version, --help\n",
          f);
}

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi)
        die("%s: '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
    return v;
}

static size_t parse_bytes(const char *opt, const char *s)
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
    if (errno || end == s || *end != '\0' || !(v > 0) || v * mult > 1e18)
        die("%s: '%s' is not a size in bytes (e.g. 80G, 85899345920)", opt, s);
    return (size_t)(v * mult);
}

enum {
    OPT_MODEL = 256, OPT_PROFILE, OPT_NODES, OPT_GPN, OPT_WORLD, OPT_CAPACITY, OPT_BATCH,
    OPT_STRATEGY, OPT_BWD_PREFETCH, OPT_FWD_PREFETCH, OPT_LIMIT, OPT_NO_LIMIT, OPT_OPTIM,
    OPT_STEPS, OPT_SWEEP, OPT_PRINT_PROFILE, OPT_LIST, OPT_TIMEOUT, OPT_VERSION, OPT_HELP
};

static void parse_args(int argc, char **argv, plan_args_t *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"nodes", required_argument, NULL, OPT_NODES},
        {"gpus-per-node", required_argument, NULL, OPT_GPN},
        {"world", required_argument, NULL, OPT_WORLD},
        {"capacity", required_argument, NULL, OPT_CAPACITY},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"strategy", required_argument, NULL, OPT_STRATEGY},
        {"backward-prefetch", required_argument, NULL, OPT_BWD_PREFETCH},
        {"forward-prefetch", no_argument, NULL, OPT_FWD_PREFETCH},
        {"limit-all-gathers", no_argument, NULL, OPT_LIMIT},
        {"no-limit-all-gathers", no_argument, NULL, OPT_NO_LIMIT},
        {"optim", required_argument, NULL, OPT_OPTIM},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"sweep", no_argument, NULL, OPT_SWEEP},
        {"print-profile", no_argument, NULL, OPT_PRINT_PROFILE},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *profile = FSDP_SIM_DEFAULT_PROFILE, *capacity = NULL;
    long nodes = 0, gpn = 0, batch = 0;
    int c, print_profile = 0;

    memset(a, 0, sizeof(*a));
    fsdp_config_init(&a->fsdp);
    a->optim = FSDP_OPTIM_ADAMW;
    a->steps = 2;
    a->timeout_s = 600.0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: a->model_spec = optarg; break;
        case OPT_PROFILE: profile = optarg; break;
        case OPT_NODES: nodes = parse_long("--nodes", optarg, 1, 1000000); break;
        case OPT_GPN: gpn = parse_long("--gpus-per-node", optarg, 1, 1024); break;
        case OPT_WORLD: a->world = (int)parse_long("--world", optarg, 1, 65536); break;
        case OPT_CAPACITY: capacity = optarg; break;
        case OPT_BATCH: batch = parse_long("--batch", optarg, 1, 1L << 30); break;
        case OPT_STRATEGY:
            if (!fsdp_strategy_parse(optarg, &a->fsdp.strategy))
                die("--strategy: '%s' is not one of full_shard, shard_grad_op, no_shard, "
                    "hybrid_shard, hybrid_shard_zero2", optarg);
            break;
        case OPT_BWD_PREFETCH:
            if (strcmp(optarg, "pre") == 0)
                a->fsdp.backward_prefetch = FSDP_BACKWARD_PREFETCH_PRE;
            else if (strcmp(optarg, "post") == 0)
                a->fsdp.backward_prefetch = FSDP_BACKWARD_PREFETCH_POST;
            else if (strcmp(optarg, "none") == 0)
                a->fsdp.backward_prefetch = FSDP_BACKWARD_PREFETCH_NONE;
            else
                die("--backward-prefetch: '%s' is not one of pre, post, none", optarg);
            break;
        case OPT_FWD_PREFETCH: a->fsdp.forward_prefetch = 1; break;
        case OPT_LIMIT: a->fsdp.limit_all_gathers = 1; break;
        case OPT_NO_LIMIT: a->fsdp.limit_all_gathers = 0; break;
        case OPT_OPTIM:
            if (strcmp(optarg, "adamw") == 0)
                a->optim = FSDP_OPTIM_ADAMW;
            else if (strcmp(optarg, "sgd") == 0)
                a->optim = FSDP_OPTIM_SGD;
            else
                die("--optim: '%s' is not one of adamw, sgd", optarg);
            break;
        case OPT_STEPS: a->steps = (int)parse_long("--steps", optarg, 1, 1000); break;
        case OPT_SWEEP: a->sweep = 1; break;
        case OPT_PRINT_PROFILE: print_profile = 1; break;
        case OPT_LIST:
            for (size_t i = 0; i < N_MODELS; i++)
                printf("%-12s %s\n", models[i].name, models[i].what);
            exit(0);
        case OPT_TIMEOUT: {
            char *end;
            a->timeout_s = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(a->timeout_s > 0) || a->timeout_s > 1e6)
                die("--timeout: '%s' is not a number of seconds in (0, 1e6]", optarg);
            break;
        }
        case OPT_VERSION:
            printf("fsdp-plan (libfsdp) %s\n", fsdp_version_string());
            exit(0);
        case OPT_HELP:
            usage(stdout);
            exit(0);
        case ':':
            die("option '%s' needs a value (see --help)", argv[optind - 1]);
        default:
            die("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        die("unexpected argument '%s' (see --help)", argv[optind]);

    if (fsdp_sim_profile_from_arg(profile, &a->profile) != FSDP_OK)
        exit(2); /* the library said why */
    if (nodes > 0)
        a->profile.nodes = (int)nodes;
    if (gpn > 0)
        a->profile.gpus_per_node = (int)gpn;
    if (print_profile) {
        char *json = fsdp_sim_profile_to_json(&a->profile);
        if (json == NULL)
            die("out of host memory");
        printf("%s\n", json);
        free(json);
        exit(0);
    }
    if (a->model_spec == NULL)
        die("--model is required (see --help and --list-models)");
    a->model = model_find(a->model_spec);
    if (a->model == NULL || a->model->ops->parse(a->model_spec, &a->mcfg) != 0)
        die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
            "widths, or one of --list-models", a->model_spec, MAX_DIMS);
    a->per_node = a->profile.gpus_per_node;
    if (a->world == 0) {
        if ((double)a->profile.nodes * a->per_node > 65536)
            die("%d nodes x %d GPUs is more than 65536 ranks", a->profile.nodes, a->per_node);
        a->world = a->profile.nodes * a->per_node;
    }
    if (a->world % a->per_node != 0)
        a->per_node = a->world < a->per_node ? a->world : 1;
    a->capacity = capacity ? parse_bytes("--capacity", capacity) : a->profile.gpu.memory_bytes;
    a->rows = batch > 0 ? (size_t)batch : a->model->default_rows;
    if (fsdp_strategy_is_hybrid_public(a->fsdp.strategy) && a->world % a->per_node != 0)
        die("--strategy %s needs the world (%d) to be a multiple of the GPUs per node (%d)",
            fsdp_strategy_name(a->fsdp.strategy), a->world, a->per_node);
}
