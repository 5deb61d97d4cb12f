/* fsdp-plan: how a model would train with FSDP on a cluster, before the job is launched.
 *
 *   fsdp-plan --model gpt3-175b --profile h100:nodes=128 --mixed-precision bf16
 *   fsdp-plan --model mlp:4096,16384,4096 --profile a100 --sweep
 *
 * Runs the real training step (the same hooks, allocator and model code as fsdp-train) on
 * simulated ranks in shape mode: no buffers and no math, only bytes and virtual time from the
 * cluster profile. Prints per-rank peak memory by category and phase, the step time, the
 * exposed communication and the MFU; --sweep tries strategies, backward prefetch policies and
 * the rate limiter and says which fit the device memory and which is fastest. */
#include <fsdp/fsdp.h>
#include <fsdp/gpt2.h>
#include <fsdp/trace.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- models ------------------------------------------------------------------------------
 *
 * A model is a family of ops (how to build it on a rank and run one forward and backward in
 * shape mode) and a table entry per named configuration: adding a model is one entry. */

#define MAX_DIMS (FSDP_MLP_MAX_LAYERS + 1)

typedef struct model_cfg {
    int dims[MAX_DIMS]; /* mlp */
    int nlayers;
    fsdp_gpt2_config_t gpt; /* gpt */
    int checkpoint_activations;
} model_cfg_t;

typedef struct model_ops {
    /* Parses what follows the family prefix (the whole spec for a preset's own spec). */
    int (*parse)(const char *spec, model_cfg_t *cfg);
    fsdp_status_t (*create)(fsdp_t *fs, const model_cfg_t *cfg, void **model_p);
    /* One forward and backward over `rows` rows of this rank's batch. */
    fsdp_status_t (*step)(void *model, size_t rows);
    /* Calls func as the forward and the backward of a step begin; NULL when the model cannot
     * (its forward and backward are then reported together, as forward). */
    void (*phase_hook)(void *model, fsdp_phase_func_t func, void *arg);
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

static void mlp_phase_hook(void *model, fsdp_phase_func_t func, void *arg)
{
    fsdp_mlp_set_phase_hook(model, func, arg);
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

static const model_ops_t mlp_ops = {mlp_parse,   mlp_create, mlp_step, mlp_phase_hook,
                                    mlp_destroy, mlp_params, mlp_units};

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

static const model_ops_t mlp_175b_ops = {mlp_175b_parse, mlp_create, mlp_step, mlp_phase_hook,
                                         mlp_destroy,    mlp_params, mlp_units};

/* GPT-2 and the GPT-3 family (include/fsdp/gpt2.h): a preset name or gpt2:layers=...,
 * one sequence of n_positions tokens per `rows` of them. */
static int gpt_parse(const char *spec, model_cfg_t *cfg)
{
    return fsdp_gpt2_config_parse(spec, &cfg->gpt) == FSDP_OK ? 0 : -1;
}

static fsdp_status_t gpt_create(fsdp_t *fs, const model_cfg_t *cfg, void **model_p)
{
    fsdp_status_t st = fsdp_gpt2_create(fs, &cfg->gpt, (fsdp_gpt2_t **)model_p);
    if (st == FSDP_OK && cfg->checkpoint_activations)
        st = fsdp_gpt2_set_checkpointing(*model_p, -1, 1);
    return st;
}

static fsdp_status_t gpt_step(void *model, size_t rows)
{
    size_t seq = (size_t)fsdp_gpt2_config(model)->n_positions;
    size_t batch = rows > seq ? rows / seq : 1;
    int32_t *tokens;
    float loss;
    fsdp_status_t st;

    if (rows < seq)
        seq = rows;
    /* shape mode reads no tokens: zeros stand for the batch */
    tokens = calloc(batch * seq, sizeof(*tokens));
    if (tokens == NULL)
        return FSDP_ERR_NO_MEMORY;
    st = fsdp_gpt2_forward_backward(model, tokens, tokens, batch, seq, &loss);
    free(tokens);
    return st;
}

static void gpt_destroy(void *model)
{
    fsdp_gpt2_destroy(model);
}

static double gpt_params(const model_cfg_t *cfg)
{
    return (double)fsdp_gpt2_num_params(&cfg->gpt);
}

static int gpt_units(const model_cfg_t *cfg)
{
    return cfg->gpt.n_layer + 1;
}

static const model_ops_t gpt_ops = {gpt_parse,   gpt_create, gpt_step, NULL,
                                    gpt_destroy, gpt_params, gpt_units};

typedef struct model_entry {
    const char *name;               /* exact name, or a family prefix ending in ':' */
    int (*match)(const char *spec); /* or this, when not NULL */
    const char *what;
    const model_ops_t *ops;
    size_t default_rows; /* per rank; 0: one sequence */
} model_entry_t;

static const model_entry_t models[] = {
    {"mlp:", NULL, "mlp:D0,D1,...,DL: a Linear/ReLU stack, one unit per Linear", &mlp_ops, 8},
    {"mlp-175b", NULL, "GPT-3 175B's parameter and unit count as an MLP (96 units of 1.81e9)",
     &mlp_175b_ops, 2048},
    {"gpt", fsdp_gpt2_spec_is_gpt,
     "a GPT-2 / GPT-3 preset (--list-models) or gpt2:layers=L,heads=H,dim=D,seq=T,vocab=V; "
     "--batch counts tokens, one sequence by default",
     &gpt_ops, 0},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

static const model_entry_t *model_find(const char *spec)
{
    for (size_t i = 0; i < N_MODELS; i++) {
        size_t n = strlen(models[i].name);
        if (models[i].match != NULL        ? models[i].match(spec)
            : models[i].name[n - 1] == ':' ? strncmp(spec, models[i].name, n) == 0
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
    const char *trace_path; /* --trace: every simulated run becomes a run of this database */
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
          "  --model SPEC               mlp:D0,D1,...,DL, a GPT preset (gpt2, gpt3-175b, ...), or\n"
          "                             another named model (--list-models)\n"
          "  --profile P                cluster: a preset (h100, a100) or a JSON file, optionally\n"
          "                             with :nodes=N,gpus_per_node=G (default h100)\n"
          "  --nodes N, --gpus-per-node G   the cluster's shape (override the profile's)\n"
          "  --world W                  ranks (default nodes x gpus per node)\n"
          "  --capacity BYTES           device memory per GPU, with K/M/G/T; 0 is unlimited\n"
          "                             (default: the profile's GPU memory)\n"
          "  --batch ROWS               rows (tokens) per rank per step (default: 8 for an mlp,\n"
          "                             2048 for mlp-175b, one sequence for a GPT)\n"
          "  --strategy S               full_shard | shard_grad_op | no_shard | hybrid_shard |\n"
          "                             hybrid_shard_zero2 (default full_shard)\n"
          "  --backward-prefetch P      pre | post | none (default pre)\n"
          "  --forward-prefetch         prefetch the next unit's all-gather in forward\n"
          "  --limit-all-gathers, --no-limit-all-gathers   CPU rate limiter (default on)\n"
          "  --mixed-precision bf16|f16 param_dtype: the all-gathers and compute in it\n"
          "  --cpu-offload              sharded parameters and gradients in pinned host memory\n"
          "  --checkpoint-activations   GPT models: recompute each block in backward\n"
          "  --optim adamw|sgd          optimizer state to hold (default adamw)\n"
          "  --steps N                  simulated steps; the last is reported (default 2)\n"
          "  --sweep                    try every strategy, backward prefetch and limiter setting\n"
          "  --trace FILE               write each simulated run's events to FILE (SQLite)\n"
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
    if (errno || end == s || *end != '\0' || !(v >= 0) || v * mult > 1e18)
        die("%s: '%s' is not a size in bytes (e.g. 80G, 85899345920; 0 is unlimited)", opt, s);
    return (size_t)(v * mult);
}

enum {
    OPT_MODEL = 256,
    OPT_PROFILE,
    OPT_NODES,
    OPT_GPN,
    OPT_WORLD,
    OPT_CAPACITY,
    OPT_BATCH,
    OPT_OPTIM,
    OPT_STEPS,
    OPT_SWEEP,
    OPT_PRINT_PROFILE,
    OPT_LIST,
    OPT_TIMEOUT,
    OPT_VERSION,
    OPT_HELP,
    OPT_MP,
    OPT_CKPT_ACT,
    OPT_CPU_OFFLOAD,
    OPT_TRACE
};

static int is_hybrid(fsdp_strategy_t s)
{
    return s == FSDP_HYBRID_SHARD || s == FSDP_HYBRID_SHARD_ZERO2;
}

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
        CLI_FSDP_LONG_OPTIONS,
        {"optim", required_argument, NULL, OPT_OPTIM},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"sweep", no_argument, NULL, OPT_SWEEP},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"print-profile", no_argument, NULL, OPT_PRINT_PROFILE},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"mixed-precision", required_argument, NULL, OPT_MP},
        {"checkpoint-activations", no_argument, NULL, OPT_CKPT_ACT},
        {"cpu-offload", no_argument, NULL, OPT_CPU_OFFLOAD},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *profile = FSDP_SIM_DEFAULT_PROFILE, *capacity = NULL;
    long nodes = 0, gpn = 0, batch = 0;
    int c, print_profile = 0, ckpt_act = 0, show = 0; /* 1: --version, 2: --help */

    memset(a, 0, sizeof(*a));
    fsdp_config_init(&a->fsdp);
    a->optim = FSDP_OPTIM_ADAMW;
    a->steps = 2;
    a->timeout_s = 600.0;
    opterr = 0;
    /* ":" first: a missing value is reported as such, not as an unknown option */
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL:
            a->model_spec = optarg;
            break;
        case OPT_PROFILE:
            profile = optarg;
            break;
        case OPT_NODES:
            nodes = parse_long("--nodes", optarg, 1, 1000000);
            break;
        case OPT_GPN:
            gpn = parse_long("--gpus-per-node", optarg, 1, 1024);
            break;
        case OPT_WORLD:
            a->world = (int)parse_long("--world", optarg, 1, 65536);
            break;
        case OPT_CAPACITY:
            capacity = optarg;
            break;
        case OPT_BATCH:
            batch = parse_long("--batch", optarg, 1, 1L << 30);
            break;
        case OPT_OPTIM:
            if (strcmp(optarg, "adamw") == 0)
                a->optim = FSDP_OPTIM_ADAMW;
            else if (strcmp(optarg, "sgd") == 0)
                a->optim = FSDP_OPTIM_SGD;
            else
                die("--optim: '%s' is not one of adamw, sgd", optarg);
            break;
        case OPT_STEPS:
            a->steps = (int)parse_long("--steps", optarg, 1, 1000);
            break;
        case OPT_TRACE:
            a->trace_path = optarg;
            break;
        case OPT_SWEEP:
            a->sweep = 1;
            break;
        case OPT_MP: {
            fsdp_dtype_t dt;
            if (!fsdp_dtype_parse(optarg, &dt) || (dt != FSDP_DTYPE_BF16 && dt != FSDP_DTYPE_F16))
                die("--mixed-precision: '%s' is not one of bf16, f16", optarg);
            a->fsdp.mixed_precision.param_dtype = dt;
            break;
        }
        case OPT_CKPT_ACT:
            ckpt_act = 1;
            break;
        case OPT_CPU_OFFLOAD:
            a->fsdp.cpu_offload = 1;
            break;
        case OPT_PRINT_PROFILE:
            print_profile = 1;
            break;
        case OPT_LIST: {
            int n = 0;
            const fsdp_gpt2_preset_t *gp = fsdp_gpt2_presets(&n);
            for (size_t i = 0; i < N_MODELS; i++)
                printf("%-14s %s\n", models[i].name, models[i].what);
            for (int i = 0; i < n; i++)
                printf("  %-12s %.4g parameters: %s\n", gp[i].name,
                       (double)fsdp_gpt2_num_params(&gp[i].cfg), gp[i].description);
            exit(0);
        }
        case OPT_TIMEOUT: {
            char *end;
            a->timeout_s = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(a->timeout_s > 0) || a->timeout_s > 1e6)
                die("--timeout: '%s' is not a number of seconds in (0, 1e6]", optarg);
            break;
        }
        case OPT_VERSION: show = 1; break;
        case OPT_HELP: show = 2; break;
        case ':':
            die("option '%s' needs a value (see --help)", argv[optind - 1]);
        default: {
            char why[256];
            if (cli_fsdp_option(c, optarg, argv[optind - 1], &a->fsdp, why, sizeof(why)) != 0)
                die("%s", why);
            break;
        }
        }
    }
    if (optind < argc)
        die("unexpected argument '%s' (see --help)", argv[optind]);
    if (show == 1)
        printf("fsdp-plan (libfsdp) %s\n", fsdp_version_string());
    if (show == 2)
        usage(stdout);
    if (show != 0)
        exit(0);
    {
        char why[512];
        if (cli_check_output("--trace", a->trace_path, 0, why, sizeof(why)) != 0)
            die("%s", why);
    }

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
    if (a->model == NULL)
        die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
            "widths, or one of --list-models",
            a->model_spec, MAX_DIMS);
    if (a->model->ops->parse(a->model_spec, &a->mcfg) != 0) {
        if (a->model->ops == &gpt_ops)
            exit(2); /* the library said what is allowed */
        die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
            "widths, or one of --list-models",
            a->model_spec, MAX_DIMS);
    }
    if (ckpt_act && a->model->ops != &gpt_ops)
        die("--checkpoint-activations needs a GPT model");
    a->mcfg.checkpoint_activations = ckpt_act;
    a->per_node = a->profile.gpus_per_node;
    if (a->world == 0) {
        if ((double)a->profile.nodes * a->per_node > 65536)
            die("%d nodes x %d GPUs is more than 65536 ranks", a->profile.nodes, a->per_node);
        a->world = a->profile.nodes * a->per_node;
    }
    if (a->world < a->per_node)
        a->per_node = a->world; /* part of one node */
    else if (a->world % a->per_node != 0)
        die("--world %d is not a whole number of nodes of %d GPUs (set --gpus-per-node)", a->world,
            a->per_node);
    a->capacity = capacity ? parse_bytes("--capacity", capacity) : a->profile.gpu.memory_bytes;
    a->rows = batch > 0 ? (size_t)batch : a->model->default_rows;
    if (a->rows == 0) /* one sequence */
        a->rows = (size_t)a->mcfg.gpt.n_positions;
}

/* ---- one simulated run -------------------------------------------------------------------- */

enum { PH_SETUP = 0, PH_FORWARD, PH_BACKWARD, PH_OPTIM, N_PHASES };
static const char *const phase_names[N_PHASES] = {"setup", "forward", "backward", "optimizer"};

typedef struct rank_result {
    fsdp_status_t status;
    double step_time;         /* of the last step */
    fsdp_sim_time_stats_t ts; /* of the last step */
    size_t peak_alloc, peak_reserved;
    size_t at_peak[FSDP_MEM_CATEGORY_COUNT]; /* allocated by category at peak_alloc */
    size_t phase_alloc[N_PHASES], phase_reserved[N_PHASES];
} rank_result_t;

typedef struct plan_run {
    const plan_args_t *a;
    fsdp_config_t cfg;
    rank_result_t *res;  /* per rank */
    fsdp_trace_t *trace; /* --trace, or NULL */
} plan_run_t;

/* Folds the phase's peaks into the rank's and starts the next phase's. */
static void phase_end(fsdp_mem_t *mem, rank_result_t *r, int phase)
{
    fsdp_mem_stats_t st;

    fsdp_mem_get_stats(mem, &st);
    if (st.peak_allocated > r->phase_alloc[phase])
        r->phase_alloc[phase] = st.peak_allocated;
    if (st.peak_reserved > r->phase_reserved[phase])
        r->phase_reserved[phase] = st.peak_reserved;
    if (st.peak_allocated > r->peak_alloc) {
        r->peak_alloc = st.peak_allocated;
        memcpy(r->at_peak, st.at_peak_by_category, sizeof(r->at_peak));
    }
    if (st.peak_reserved > r->peak_reserved)
        r->peak_reserved = st.peak_reserved;
    fsdp_mem_reset_peaks(mem);
}

typedef struct phase_ctx {
    fsdp_mem_t *mem;
    rank_result_t *r;
    int cur;
} phase_ctx_t;

static void phase_begin(fsdp_phase_t phase, void *arg)
{
    phase_ctx_t *p = arg;
    phase_end(p->mem, p->r, p->cur);
    p->cur = phase == FSDP_PHASE_BACKWARD ? PH_BACKWARD : PH_FORWARD;
}

static fsdp_status_t plan_rank(fsdp_dev_t *dev, void *arg)
{
    plan_run_t *run = arg;
    const plan_args_t *a = run->a;
    rank_result_t *r = &run->res[dev->rank];
    fsdp_optim_config_t oc;
    fsdp_optim_t *opt = NULL;
    phase_ctx_t pc;
    void *model = NULL;
    fsdp_t *fs = NULL;
    fsdp_mem_t *mem;
    fsdp_status_t st;

    st = run->trace != NULL ? fsdp_trace_attach(run->trace, dev) : FSDP_OK;
    if (st == FSDP_OK)
        st = fsdp_create(dev, &run->cfg, &fs);
    if (st != FSDP_OK) {
        fsdp_trace_detach(dev);
        return r->status = st;
    }
    mem = fsdp_memory(fs);
    pc.mem = mem;
    pc.r = r;
    pc.cur = PH_SETUP;
    fsdp_optim_config_init(&oc, a->optim);
    st = a->model->ops->create(fs, &a->mcfg, &model);
    if (st == FSDP_OK) {
        if (a->model->ops->phase_hook != NULL)
            a->model->ops->phase_hook(model, phase_begin, &pc);
        st = fsdp_optim_create(fs, &oc, &opt);
    }
    for (int step = 0; step < a->steps && st == FSDP_OK; step++) {
        double t0;
        /* what came before (setup, or the last step's optimizer) ends */
        phase_begin(FSDP_PHASE_FORWARD, &pc);
        fsdp_sim_time_reset(dev);
        t0 = dev->ops->host_time(dev);
        st = a->model->ops->step(model, a->rows);
        if (st != FSDP_OK)
            break;
        phase_end(mem, r, pc.cur);
        pc.cur = PH_OPTIM;
        st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (st == FSDP_OK)
            st = dev->ops->stream_synchronize(dev, NULL);
        if (st == FSDP_OK)
            st = fsdp_sim_time_stats(dev, &r->ts);
        r->step_time = dev->ops->host_time(dev) - t0;
        if (st == FSDP_OK && run->trace != NULL) {
            fsdp_mem_stats_t ms;
            fsdp_mem_get_stats(mem, &ms);
            fsdp_trace_step(dev, step + 1, 0.0, r->step_time, &ms);
        }
    }
    if (st == FSDP_OK)
        phase_end(mem, r, pc.cur);
    if (opt != NULL)
        fsdp_optim_destroy(opt);
    if (model != NULL)
        a->model->ops->destroy(model);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return r->status = st;
}

typedef struct summary {
    fsdp_status_t status;
    int oom;                 /* did not fit the capacity */
    double step_time;        /* max over ranks */
    double exposed, compute; /* of the slowest rank */
    double mfu;
    size_t peak_alloc, peak_reserved; /* max over ranks */
} summary_t;

/* The dtype GEMMs run in: MFU is against its peak. */
static fsdp_dtype_t compute_dtype(const fsdp_config_t *cfg)
{
    fsdp_dtype_t dt = cfg->mixed_precision.param_dtype;
    return dt == FSDP_DTYPE_BF16 || dt == FSDP_DTYPE_F16 ? dt : FSDP_DTYPE_F32;
}

static summary_t run_plan(const plan_args_t *a, const fsdp_config_t *cfg, size_t capacity,
                          rank_result_t *res)
{
    fsdp_sim_params_t sp;
    plan_run_t run = {.a = a, .cfg = *cfg, .res = res};
    summary_t s;
    double peak = fsdp_sim_profile_matmul_flops(&a->profile, compute_dtype(cfg));
    int slow = 0;

    memset(&s, 0, sizeof(s));
    memset(res, 0, sizeof(*res) * (size_t)a->world);
    run.cfg.device_capacity = capacity;
    fsdp_sim_params_init(&sp);
    sp.world_size = a->world;
    sp.ranks_per_node = a->per_node;
    sp.mode = FSDP_SIM_SHAPE;
    sp.fibers = 1; /* thousands of ranks on a few cores */
    sp.timeout_s = a->timeout_s;
    sp.profile = a->profile;
    if (a->trace_path != NULL) {
        fsdp_trace_run_info_t info;
        fsdp_sim_profile_t topo = a->profile; /* the profile with the simulated topology */
        char *profile_json;
        fsdp_status_t st;
        topo.gpus_per_node = a->per_node;
        topo.nodes = a->world / a->per_node;
        profile_json = fsdp_sim_profile_to_json(&topo);
        if (profile_json == NULL)
            die("out of host memory");
        memset(&info, 0, sizeof(info));
        info.backend = "sim (shape mode)";
        info.world_size = a->world;
        info.strategy = fsdp_strategy_name(cfg->strategy);
        info.profile_json = profile_json;
        info.command_line = a->model_spec;
        st = fsdp_trace_open(a->trace_path, &info, &run.trace);
        free(profile_json);
        if (st != FSDP_OK)
            die("cannot write the trace to %s (see the message above)", a->trace_path);
    }
    s.status = fsdp_sim_launch(&sp, plan_rank, &run, NULL);
    if (fsdp_trace_close(run.trace) != FSDP_OK && s.status == FSDP_OK)
        s.status = FSDP_ERR_IO;
    for (int r = 0; r < a->world; r++) {
        if (res[r].status == FSDP_ERR_OUT_OF_MEMORY)
            s.oom = 1;
        if (res[r].step_time > res[slow].step_time)
            slow = r;
        if (res[r].peak_alloc > s.peak_alloc)
            s.peak_alloc = res[r].peak_alloc;
        if (res[r].peak_reserved > s.peak_reserved)
            s.peak_reserved = res[r].peak_reserved;
    }
    s.step_time = res[slow].step_time;
    s.exposed = res[slow].ts.exposed_comm_s;
    s.compute = res[slow].ts.compute_s;
    s.mfu = s.step_time > 0 && peak > 0 ? res[slow].ts.gemm_flops / (s.step_time * peak) : 0.0;
    return s;
}

/* Runs with the device capacity; a run that does not fit is run again without a limit, to say
 * how much it needs. */
static summary_t plan_config(const plan_args_t *a, const fsdp_config_t *cfg, rank_result_t *res,
                             int quiet)
{
    summary_t s;

    log_quiet = 1; /* out of memory is an answer here, not an error to print */
    s = run_plan(a, cfg, a->capacity, res);
    if (s.oom) {
        s = run_plan(a, cfg, 0, res);
        s.oom = 1;
    }
    log_quiet = 0;
    if (s.status != FSDP_OK && !quiet) {
        /* say why, with the messages on */
        run_plan(a, cfg, 0, res);
    }
    return s;
}

/* ---- output ------------------------------------------------------------------------------- */

static double unit_div;
static const char *unit_name;

static void pick_unit(size_t max_bytes)
{
    if (max_bytes >= ((size_t)1 << 30)) {
        unit_div = (double)((size_t)1 << 30), unit_name = "GiB";
    } else if (max_bytes >= ((size_t)1 << 20)) {
        unit_div = (double)((size_t)1 << 20), unit_name = "MiB";
    } else {
        unit_div = 1024.0, unit_name = "KiB";
    }
}

static double u(size_t bytes)
{
    return (double)bytes / unit_div;
}

static void fmt_capacity(size_t bytes, char *buf, size_t n)
{
    if (bytes == 0)
        snprintf(buf, n, "unlimited");
    else
        snprintf(buf, n, "%.2f GiB", (double)bytes / (double)((size_t)1 << 30));
}

/* Prints one line per run of ranks whose line is the same. */
static void print_folded(const plan_args_t *a, const rank_result_t *res,
                         void (*line)(const rank_result_t *r, char *buf, size_t n))
{
    char cur[512], next[512];
    int first = 0;

    line(&res[0], cur, sizeof(cur));
    for (int r = 1; r <= a->world; r++) {
        if (r < a->world) {
            line(&res[r], next, sizeof(next));
            if (strcmp(next, cur) == 0)
                continue;
        }
        if (r - 1 == first)
            printf("  rank %-9d %s\n", first, cur);
        else {
            char ranks[32];
            snprintf(ranks, sizeof(ranks), "%d-%d", first, r - 1);
            printf("  ranks %-8s %s\n", ranks, cur);
        }
        first = r;
        if (r < a->world)
            memcpy(cur, next, sizeof(cur));
    }
}

static void memory_line(const rank_result_t *r, char *buf, size_t n)
{
    int off = snprintf(buf, n, "%9.2f %9.2f ", u(r->peak_alloc), u(r->peak_reserved));
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT && off > 0 && (size_t)off < n; c++)
        off += snprintf(buf + off, n - (size_t)off, " %9.2f", u(r->at_peak[c]));
}

static void phase_line(const rank_result_t *r, char *buf, size_t n)
{
    int off = 0;
    for (int p = 0; p < N_PHASES && off >= 0 && (size_t)off < n; p++) {
        char cell[64];
        snprintf(cell, sizeof(cell), "%.2f / %.2f", u(r->phase_alloc[p]), u(r->phase_reserved[p]));
        off += snprintf(buf + off, n - (size_t)off, "%s%-21s", p ? " " : "", cell);
    }
}

static const char *prefetch_name(fsdp_backward_prefetch_t p)
{
    return p == FSDP_BACKWARD_PREFETCH_PRE    ? "pre"
           : p == FSDP_BACKWARD_PREFETCH_POST ? "post"
                                              : "none";
}

static void print_header(const plan_args_t *a)
{
    char cap[32];
    double params = a->model->ops->params(&a->mcfg);

    fmt_capacity(a->capacity, cap, sizeof(cap));
    printf("model %s: %d units, %.4g parameters (%.2f GiB in f32)\n", a->model_spec,
           a->model->ops->units(&a->mcfg), params, params * 4 / (double)((size_t)1 << 30));
    printf("cluster %s: %d ranks, %d per node (%s, %s each)\n", a->profile.name, a->world,
           a->per_node, a->profile.gpu.model, cap);
    printf("batch %zu rows per rank, %s, %d step%s simulated (the last is reported)\n", a->rows,
           a->optim == FSDP_OPTIM_ADAMW ? "adamw" : "sgd", a->steps, a->steps > 1 ? "s" : "");
}

static int print_plan(const plan_args_t *a, rank_result_t *res)
{
    fsdp_dtype_t dt = compute_dtype(&a->fsdp);
    double peak = fsdp_sim_profile_matmul_flops(&a->profile, dt);
    char cap[32];
    summary_t s;

    print_header(a);
    printf("config %s, backward prefetch %s, forward prefetch %s, limit all-gathers %s%s%s\n",
           fsdp_strategy_name(a->fsdp.strategy), prefetch_name(a->fsdp.backward_prefetch),
           a->fsdp.forward_prefetch ? "on" : "off", a->fsdp.limit_all_gathers ? "on" : "off",
           dt != FSDP_DTYPE_F32 ? ", param_dtype " : "",
           dt != FSDP_DTYPE_F32 ? fsdp_dtype_name(dt) : "");
    fflush(stdout);
    s = plan_config(a, &a->fsdp, res, 0);
    if (s.status != FSDP_OK && !s.oom) {
        fprintf(stderr, "fsdp-plan: error: the simulation failed (%s); see above\n",
                fsdp_status_name(s.status));
        return 1;
    }
    printf("step time %.3f ms, compute %.3f ms, exposed communication %.3f ms (%.1f%% of the "
           "step)\n",
           s.step_time * 1e3, s.compute * 1e3, s.exposed * 1e3,
           s.step_time > 0 ? 100.0 * s.exposed / s.step_time : 0.0);
    printf("MFU %.1f%% (GEMM FLOPs run per rank, recomputation included, / step time / %.4g "
           "TFLOP/s %s peak)\n",
           100.0 * s.mfu, peak / 1e12,
           dt == FSDP_DTYPE_F32 && a->profile.gpu.allow_tf32 ? "tf32" : fsdp_dtype_name(dt));
    pick_unit(s.peak_reserved);
    printf("memory per rank, %s (peaks over the run; by category at the peak of allocated):\n",
           unit_name);
    printf("  %-15s %9s %9s ", "", "allocated", "reserved");
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++) {
        char name[16];
        snprintf(name, sizeof(name), "%.9s", fsdp_mem_category_name((fsdp_mem_category_t)c));
        printf(" %9s", name);
    }
    printf("\n");
    print_folded(a, res, memory_line);
    printf("peaks by phase, %s (allocated / reserved):\n  %-15s", unit_name, "");
    for (int p = 0; p < N_PHASES; p++)
        printf("%s%-21s", p ? " " : "", phase_names[p]);
    printf("\n");
    print_folded(a, res, phase_line);
    if (a->model->ops->phase_hook == NULL)
        printf("  (this model reports its forward and backward together, as forward)\n");
    fmt_capacity(a->capacity, cap, sizeof(cap));
    if (s.oom)
        printf("fits: no: needs %.2f GiB reserved (%.2f GiB allocated) per GPU of %s\n",
               (double)s.peak_reserved / (double)((size_t)1 << 30),
               (double)s.peak_alloc / (double)((size_t)1 << 30), cap);
    else
        printf("fits: yes: peak reserved %.2f GiB of %s per GPU\n",
               (double)s.peak_reserved / (double)((size_t)1 << 30), cap);
    return 0;
}

static int print_sweep(const plan_args_t *a, rank_result_t *res)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD,
                                                 FSDP_HYBRID_SHARD, FSDP_HYBRID_SHARD_ZERO2};
    static const fsdp_backward_prefetch_t prefetches[] = {
        FSDP_BACKWARD_PREFETCH_PRE, FSDP_BACKWARD_PREFETCH_POST, FSDP_BACKWARD_PREFETCH_NONE};
    fsdp_config_t best_cfg = a->fsdp;
    summary_t best = {.status = FSDP_ERR_NOT_FOUND};
    int n_fit = 0;

    print_header(a);
    printf("%-19s %-8s %-7s %10s %10s %6s %12s %12s  %s\n", "strategy", "prefetch", "limiter",
           "step ms", "exposed ms", "MFU", "peak alloc", "peak reserv", "fits");
    for (size_t si = 0; si < sizeof(strategies) / sizeof(strategies[0]); si++) {
        /* hybrid strategies shard within a node: only worth trying on several nodes */
        if (is_hybrid(strategies[si]) && a->world <= a->per_node)
            continue;
        for (size_t pi = 0; pi < 3; pi++) {
            for (int lim = 1; lim >= 0; lim--) {
                fsdp_config_t cfg = a->fsdp;
                summary_t s;
                cfg.strategy = strategies[si];
                cfg.backward_prefetch = prefetches[pi];
                cfg.limit_all_gathers = lim;
                s = plan_config(a, &cfg, res, 1);
                if (s.status != FSDP_OK && !s.oom) {
                    printf("%-19s %-8s %-7s  failed: %s\n", fsdp_strategy_name(cfg.strategy),
                           prefetch_name(cfg.backward_prefetch), lim ? "on" : "off",
                           fsdp_status_string(s.status));
                    continue;
                }
                printf("%-19s %-8s %-7s %10.3f %10.3f %5.1f%% %8.2f GiB %8.2f GiB  %s\n",
                       fsdp_strategy_name(cfg.strategy), prefetch_name(cfg.backward_prefetch),
                       lim ? "on" : "off", s.step_time * 1e3, s.exposed * 1e3, 100.0 * s.mfu,
                       (double)s.peak_alloc / (double)((size_t)1 << 30),
                       (double)s.peak_reserved / (double)((size_t)1 << 30), s.oom ? "no" : "yes");
                fflush(stdout);
                if (!s.oom && (best.status != FSDP_OK || s.step_time < best.step_time)) {
                    best = s;
                    best_cfg = cfg;
                }
                n_fit += !s.oom;
            }
        }
    }
    if (n_fit == 0) {
        printf("nothing fits in %.2f GiB per GPU\n",
               (double)a->capacity / (double)((size_t)1 << 30));
        return 0;
    }
    printf("fastest that fits: %s, backward prefetch %s, limit all-gathers %s: %.3f ms per "
           "step, MFU %.1f%%, peak reserved %.2f GiB (%d of the configurations fit)\n",
           fsdp_strategy_name(best_cfg.strategy), prefetch_name(best_cfg.backward_prefetch),
           best_cfg.limit_all_gathers ? "on" : "off", best.step_time * 1e3, 100.0 * best.mfu,
           (double)best.peak_reserved / (double)((size_t)1 << 30), n_fit);
    return 0;
}

int main(int argc, char **argv)
{
    plan_args_t args;
    rank_result_t *res;
    int rc;

    fsdp_log_set_handler(log_to_stderr, NULL);
    parse_args(argc, argv, &args);
    res = calloc((size_t)args.world, sizeof(*res));
    if (res == NULL)
        die("out of host memory for %d ranks", args.world);
    rc = args.sweep ? print_sweep(&args, res) : print_plan(&args, res);
    free(res);
    return rc;
}
