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
#include <fsdp/llama.h>
#include <fsdp/trace.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "progress.h"

/* ---- models ------------------------------------------------------------------------------
 *
 * A model is a family of ops (how to build it on a rank and run one forward and backward in
 * shape mode) and a table entry per named configuration: adding a model is one entry. */

#define MAX_DIMS (FSDP_MLP_MAX_LAYERS + 1)

typedef struct model_cfg {
    int dims[MAX_DIMS]; /* mlp */
    int nlayers;
    fsdp_gpt2_config_t gpt; /* gpt */
    fsdp_llama_config_t llama;  /* llama */
    int checkpoint_activations; /* 1: every block, K: every K-th, or CLI_AC_SELECTIVE_OP */
    size_t seq;                 /* tokens per sequence (gpt, llama); 1 for an mlp's rows */
    int eager_memory;           /* llama: the memory of eager PyTorch (--ops eager) */
} model_cfg_t;

typedef struct model_ops {
    /* Parses what follows the family prefix (the whole spec for a preset's own spec). */
    int (*parse)(const char *spec, model_cfg_t *cfg);
    fsdp_status_t (*create)(fsdp_t *fs, const model_cfg_t *cfg, void **model_p);
    /* One forward and backward over this rank's batch: `batch` rows, or sequences of `seq`
     * tokens. */
    fsdp_status_t (*step)(void *model, size_t batch, size_t seq);
    /* Calls func as the forward and the backward of a step begin; NULL when the model cannot
     * (its forward and backward are then reported together, as forward). */
    void (*phase_hook)(void *model, fsdp_phase_func_t func, void *arg);
    void (*destroy)(void *model);
    double (*params)(const model_cfg_t *cfg);
    int (*units)(const model_cfg_t *cfg);
    /* A language model's FLOPs per token by PaLM's definition (Chowdhery et al. 2022, appendix
     * B): 6 N + 12 L H hd T, N the parameters outside the embedding tables; 0 for others. */
    double (*palm_flops_per_token)(const model_cfg_t *cfg);
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

static fsdp_status_t mlp_step(void *model, size_t batch, size_t seq)
{
    float loss;
    (void)seq;
    /* shape mode moves no data: there is no batch in host memory */
    return fsdp_mlp_forward_backward(model, NULL, NULL, batch, &loss);
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

static const model_ops_t mlp_ops = {mlp_parse,   mlp_create, mlp_step,  mlp_phase_hook,
                                    mlp_destroy, mlp_params, mlp_units, NULL};

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

static const model_ops_t mlp_175b_ops = {mlp_175b_parse, mlp_create, mlp_step,  mlp_phase_hook,
                                         mlp_destroy,    mlp_params, mlp_units, NULL};

/* GPT-2 and the GPT-3 family (include/fsdp/gpt2.h): a preset name or gpt2:layers=...,
 * sequences of n_positions tokens, or --seq. */
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

static fsdp_status_t gpt_step(void *model, size_t batch, size_t seq)
{
    int32_t *tokens;
    float loss;
    fsdp_status_t st;

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

static double gpt_palm_flops(const model_cfg_t *cfg)
{
    const fsdp_gpt2_config_t *g = &cfg->gpt;
    double embed = ((double)g->vocab_size + g->n_positions) * g->n_embd; /* wte, wpe */
    return 6.0 * (gpt_params(cfg) - embed) + 12.0 * g->n_layer * g->n_embd * (double)cfg->seq;
}

static const model_ops_t gpt_ops = {gpt_parse,   gpt_create, gpt_step,  NULL,
                                    gpt_destroy, gpt_params, gpt_units, gpt_palm_flops};

/* Llama (include/fsdp/llama.h): a preset name or llama:layers=..., sequences of the model's
 * length, or of 8192 tokens (Llama 3's training context) for the 128K-context presets, or
 * --seq. */
static int llama_parse(const char *spec, model_cfg_t *cfg)
{
    return fsdp_llama_config_parse(spec, &cfg->llama) == FSDP_OK ? 0 : -1;
}

static fsdp_status_t llama_create(fsdp_t *fs, const model_cfg_t *cfg, void **model_p)
{
    fsdp_status_t st = fsdp_llama_create(fs, &cfg->llama, (fsdp_llama_t **)model_p);
    int every = cfg->checkpoint_activations;
    if (st == FSDP_OK && every == CLI_AC_SELECTIVE_OP)
        st = fsdp_llama_set_checkpointing(*model_p, -1, FSDP_LLAMA_CKPT_SELECTIVE_OP);
    for (int l = every - 1; st == FSDP_OK && every > 0 && l < cfg->llama.n_layer; l += every)
        st = fsdp_llama_set_checkpointing(*model_p, l, FSDP_LLAMA_CKPT_FULL);
    if (st == FSDP_OK && cfg->eager_memory)
        st = fsdp_llama_set_eager_memory(*model_p, 1);
    return st;
}

static size_t llama_seq(const fsdp_llama_config_t *cfg)
{
    return cfg->max_seq < 8192 ? (size_t)cfg->max_seq : 8192;
}

static fsdp_status_t llama_step(void *model, size_t batch, size_t seq)
{
    float loss;
    /* shape mode reads no tokens */
    return fsdp_llama_forward_backward(model, NULL, NULL, batch, seq, &loss);
}

static void llama_destroy(void *model)
{
    fsdp_llama_destroy(model);
}

static double llama_params(const model_cfg_t *cfg)
{
    return (double)fsdp_llama_num_params(&cfg->llama);
}

static int llama_units(const model_cfg_t *cfg)
{
    return cfg->llama.n_layer + 1;
}

/* N leaves out embed_tokens only, as torchtitan counts it: an untied head is a matmul. */
static double llama_palm_flops(const model_cfg_t *cfg)
{
    const fsdp_llama_config_t *l = &cfg->llama;
    double embed = (double)l->vocab_size * l->dim;
    return 6.0 * (llama_params(cfg) - embed) +
           12.0 * l->n_layer * l->n_head * fsdp_llama_head_dim(l) * (double)cfg->seq;
}

static const model_ops_t llama_ops = {llama_parse,   llama_create, llama_step,  NULL,
                                      llama_destroy, llama_params, llama_units, llama_palm_flops};

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
     "--batch counts sequences, one per rank by default",
     &gpt_ops, 0},
    {"llama", fsdp_llama_spec_is_llama,
     "a Llama preset (--list-models) or llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,seq=T,"
     "vocab=V,...; sequences of at most 8192 tokens, one a rank by default",
     &llama_ops, 0},
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

/* What a sweep varies unless the command line sets it. */
enum {
    FIX_STRATEGY = 1u << 0,
    FIX_PREFETCH = 1u << 1,
    FIX_LIMITER = 1u << 2,
    FIX_PRECISION = 1u << 3,
    FIX_CKPT_ACT = 1u << 4
};

/* --fit-status: the exit status of a plan or sweep that ran (docs: --help). */
enum { EXIT_FITS = 0, EXIT_ERROR = 1, EXIT_USAGE = 2, EXIT_NO_FIT = 3 };

typedef struct plan_args {
    const char *model_spec;
    const model_entry_t *model;
    model_cfg_t mcfg;
    fsdp_sim_profile_t profile;
    size_t capacity; /* bytes per GPU */
    fsdp_config_t fsdp;
    fsdp_optim_kind_t optim;
    size_t local_batch; /* rows or sequences per rank */
    size_t rows;        /* rows or tokens per rank */
    int steps;
    int sweep;
    unsigned fixed; /* FIX_*: the settings given on the command line, which a sweep keeps */
    int fit_status; /* --fit-status: the exit status says whether the job fits */
    int world, per_node;
    double timeout_s;
    const char *trace_path; /* --trace: every simulated run becomes a run of this database */
    const char *plot_path;  /* --plot: an SVG of the reported step, drawn from the trace */
    int symmetry;           /* simulate one rank per class of ranks that run alike */
    char command_line[2048]; /* for the trace */
} plan_args_t;

static void usage(FILE *f)
{
    fputs("usage: fsdp-plan --model SPEC [options]\n"
          "  --model SPEC               mlp:D0,D1,...,DL, a GPT preset (gpt2, gpt3-175b, ...), or\n"
          "                             another named model (--list-models)\n"
          "  --profile P                cluster: a preset (h100, a100) or a JSON file, optionally\n"
          "                             with :nodes=N,gpus_per_node=G (default h100)\n"
          "  --nodes N, --gpus-per-node G   the cluster's shape (override the profile's)\n"
          "  --world W                  ranks (default nodes x gpus per node; at most 2^20)\n"
          "  --capacity BYTES           device memory per GPU, with K/M/G/T; 0 is unlimited\n"
          "                             (default: the profile's GPU memory)\n"
          "  --batch B                  global batch: rows (mlp) or sequences (gpt), divisible\n"
          "                             by the world\n"
          "  --local-batch B            per-rank batch (default: 8 rows for an mlp, 2048 for\n"
          "                             mlp-175b, one sequence for a GPT)\n"
          "  --seq T                    gpt, llama: tokens per sequence (default: the model's\n"
          "                             positions, at most 8192 for a Llama)\n"
          "  --strategy S               full_shard | shard_grad_op | no_shard | hybrid_shard |\n"
          "                             hybrid_shard_zero2 (default full_shard)\n"
          "  --backward-prefetch P      pre | post | none (default pre)\n"
          "  --forward-prefetch         prefetch the next unit's all-gather in forward\n"
          "  --limit-all-gathers, --no-limit-all-gathers   CPU rate limiter (default on)\n"
          "  --mixed-precision SPEC     D, PyTorch's MixedPrecision(param_dtype=D); or\n"
          "                             param=D,reduce=D,buffer=D, any subset (D: fp32, bf16,\n"
          "                             fp16): the all-gathers and compute in param's dtype\n"
          "  --cpu-offload              sharded parameters and gradients in pinned host memory\n"
          "  --checkpoint-activations   GPT and Llama models: recompute each block in backward\n"
          "  --activation-checkpointing none|full|selective-layer[:K]|selective-op\n"
          "                             full is the above; selective-layer checkpoints every K-th\n"
          "                             block (default 2); selective-op (llama) keeps the outputs\n"
          "                             of attention and every other matmul, recomputes the rest\n"
          "  --attention eager|fused    gpt: HF's eager attention (the default), which keeps\n"
          "                             the T x T probabilities, or one fused kernel\n"
          "                             (FlashAttention's contract; llama: always)\n"
          "  --ops eager|fused          how the job runs its element-wise work: eager PyTorch\n"
          "                             ops as HF's model runs them, or one fused kernel each\n"
          "                             (torch.compile, fused kernels); default: the profile's\n"
          "                             \"ops\" (eager in the presets). Eager also holds a\n"
          "                             Llama's memory as eager autograd does\n"
          "  --optim adamw|sgd          optimizer state to hold (default adamw)\n"
          "  --steps N                  simulated steps; the last is reported (default 2)\n"
          "  --sweep                    try every strategy, backward prefetch, limiter setting,\n"
          "                             activation checkpointing (GPT models) and precision\n"
          "                             (fp32, bf16) that the command line does not set, and\n"
          "                             name the fastest configuration that fits\n"
          "  --fit-status               exit status says whether the job fits: 0 it fits (a\n"
          "                             sweep: some configuration does), 3 it does not, 1 the\n"
          "                             simulation failed, 2 bad usage (without it: 0 either way)\n"
          "  --trace FILE               write each simulated run's events to FILE (SQLite)\n"
          "  --plot FILE.svg            draw the reported (last) step: memory by category over\n"
          "                             time and the stream timelines of one rank of each\n"
          "                             class (--no-symmetry: rank 0), from the trace (--trace's\n"
          "                             file, or a temporary one); not with --sweep\n"
          "  --no-symmetry              simulate every rank, not one rank per class of ranks\n"
          "                             that run alike (the figures are the same; a trace\n"
          "                             holds the simulated ranks, each with the ranks it\n"
          "                             stands for)\n"
          "  --print-profile            print the cluster profile as JSON and exit\n"
          "  --list-models              the named models\n"
          "  --timeout S                collective timeout in wall seconds (default 600)\n"
          "  --version, --help\n"
          "fsdp-train's options that plan has not: the training ones (--lr and the optimizer's\n"
          "hyperparameters, --seed, --init, --data, --tokens, --save, checkpoints, --resume,\n"
          "--clip-grad-norm, --grad-accum: a plan has no values to train), --backend (a plan\n"
          "simulates), --ranks-per-node (--gpus-per-node), --quiet.\n"
          "Environment:\n"
          "  FSDP_LOG_LEVEL             error | warn | info | debug | trace (default warn)\n",
          f);
}

enum {
    OPT_MODEL = 256,
    OPT_PROFILE,
    OPT_NODES,
    OPT_GPN,
    OPT_WORLD,
    OPT_CAPACITY,
    OPT_BATCH,
    OPT_LOCAL_BATCH,
    OPT_SEQ,
    OPT_OPTIM,
    OPT_STEPS,
    OPT_SWEEP,
    OPT_PRINT_PROFILE,
    OPT_LIST,
    OPT_TIMEOUT,
    OPT_OPS,
    OPT_VERSION,
    OPT_HELP,
    OPT_MP,
    OPT_CKPT_ACT,
    OPT_AC,
    OPT_ATTENTION,
    OPT_CPU_OFFLOAD,
    OPT_TRACE,
    OPT_PLOT,
    OPT_FIT_STATUS,
    OPT_NO_SYMMETRY
};

/* Tokens per item of a batch: a GPT's sequence, or one row. */
static size_t plan_seq_len(const plan_args_t *a)
{
    return a->mcfg.seq;
}

/* The longest sequence the model takes, and its default; 1 for models of rows. */
static size_t model_positions(const plan_args_t *a, size_t *default_p)
{
    size_t n = 1;
    if (a->model->ops == &llama_ops)
        n = (size_t)a->mcfg.llama.max_seq;
    else if (a->model->ops == &gpt_ops)
        n = (size_t)a->mcfg.gpt.n_positions;
    *default_p = a->model->ops == &llama_ops ? llama_seq(&a->mcfg.llama) : n;
    return n;
}

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
        {"local-batch", required_argument, NULL, OPT_LOCAL_BATCH},
        {"seq", required_argument, NULL, OPT_SEQ},
        CLI_FSDP_LONG_OPTIONS,
        {"optim", required_argument, NULL, OPT_OPTIM},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"sweep", no_argument, NULL, OPT_SWEEP},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"plot", required_argument, NULL, OPT_PLOT},
        {"fit-status", no_argument, NULL, OPT_FIT_STATUS},
        {"no-symmetry", no_argument, NULL, OPT_NO_SYMMETRY},
        {"print-profile", no_argument, NULL, OPT_PRINT_PROFILE},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"ops", required_argument, NULL, OPT_OPS},
        {"mixed-precision", required_argument, NULL, OPT_MP},
        {"checkpoint-activations", no_argument, NULL, OPT_CKPT_ACT},
        {"activation-checkpointing", required_argument, NULL, OPT_AC},
        {"attention", required_argument, NULL, OPT_ATTENTION},
        {"cpu-offload", no_argument, NULL, OPT_CPU_OFFLOAD},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *profile = FSDP_SIM_DEFAULT_PROFILE, *capacity = NULL;
    long nodes = 0, gpn = 0, batch = 0, local_batch = 0, seq = 0;
    int ops = -1, attention = -1;
    size_t positions, default_seq;
    int c, print_profile = 0, ckpt_act = 0, show = 0; /* 1: --version, 2: --help */

    memset(a, 0, sizeof(*a));
    fsdp_config_init(&a->fsdp);
    a->optim = FSDP_OPTIM_ADAMW;
    a->steps = 2;
    a->timeout_s = 600.0;
    a->symmetry = 1;
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
        case OPT_OPS:
            ops = cli_ops(optarg);
            break;
        case OPT_NODES:
            nodes = cli_parse_long("--nodes", optarg, 1, 1000000);
            break;
        case OPT_GPN:
            gpn = cli_parse_long("--gpus-per-node", optarg, 1, 1024);
            break;
        case OPT_WORLD:
            a->world = (int)cli_parse_long("--world", optarg, 1, FSDP_MAX_WORLD);
            break;
        case OPT_CAPACITY:
            capacity = optarg;
            break;
        case OPT_BATCH:
            batch = cli_parse_long("--batch", optarg, 1, 1L << 30);
            break;
        case OPT_LOCAL_BATCH:
            local_batch = cli_parse_long("--local-batch", optarg, 1, 1L << 30);
            break;
        case OPT_SEQ:
            seq = cli_parse_long("--seq", optarg, 1, 1L << 24);
            break;
        case OPT_OPTIM:
            if (strcmp(optarg, "adamw") == 0)
                a->optim = FSDP_OPTIM_ADAMW;
            else if (strcmp(optarg, "sgd") == 0)
                a->optim = FSDP_OPTIM_SGD;
            else
                cli_die("--optim: '%s' is not one of adamw, sgd", optarg);
            break;
        case OPT_STEPS:
            a->steps = (int)cli_parse_long("--steps", optarg, 1, 1000);
            break;
        case OPT_TRACE:
            a->trace_path = optarg;
            break;
        case OPT_PLOT:
            a->plot_path = optarg;
            break;
        case OPT_NO_SYMMETRY:
            a->symmetry = 0;
            break;
        case OPT_SWEEP:
            a->sweep = 1;
            break;
        case OPT_FIT_STATUS:
            a->fit_status = 1;
            break;
        case OPT_MP:
            cli_parse_mixed_precision(optarg, &a->fsdp.mixed_precision);
            a->fixed |= FIX_PRECISION;
            break;
        case OPT_CKPT_ACT:
            ckpt_act = 1;
            a->fixed |= FIX_CKPT_ACT;
            break;
        case OPT_AC:
            ckpt_act = cli_activation_checkpointing(optarg);
            a->fixed |= FIX_CKPT_ACT;
            break;
        case OPT_ATTENTION:
            attention = cli_attention(optarg);
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
            {
                const fsdp_llama_preset_t *lp = fsdp_llama_presets(&n);
                for (int i = 0; i < n; i++)
                    printf("  %-13s %llu parameters: %s\n", lp[i].name,
                           (unsigned long long)fsdp_llama_num_params(&lp[i].cfg),
                           lp[i].description);
            }
            exit(0);
        }
        case OPT_TIMEOUT: {
            char *end;
            a->timeout_s = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(a->timeout_s > 0) || a->timeout_s > 1e6)
                cli_die("--timeout: '%s' is not a number of seconds in (0, 1e6]", optarg);
            break;
        }
        case OPT_VERSION: show = 1; break;
        case OPT_HELP: show = 2; break;
        default:
            a->fixed |= c == CLI_OPT_STRATEGY                         ? FIX_STRATEGY
                        : c == CLI_OPT_BWD_PREFETCH                   ? FIX_PREFETCH
                        : c == CLI_OPT_LIMIT || c == CLI_OPT_NO_LIMIT ? FIX_LIMITER
                                                                      : 0u;
            cli_other_option(c, argv, &a->fsdp);
            break;
        }
    }
    cli_no_arguments(argc, argv);
    cli_command_line(argc, argv, a->command_line, sizeof(a->command_line));
    if (show == 1)
        printf("fsdp-plan (libfsdp) %s\n", fsdp_version_string());
    if (show == 2)
        usage(stdout);
    if (show != 0)
        exit(0);
    {
        char why[512];
        if (cli_check_output("--trace", a->trace_path, 0, why, sizeof(why)) != 0 ||
            cli_check_output("--plot", a->plot_path, 0, why, sizeof(why)) != 0)
            cli_die("%s", why);
    }
    if (a->plot_path != NULL && a->sweep)
        cli_die("--plot draws one plan, not a sweep: plot the configuration the sweep names");
    if (a->plot_path != NULL && a->trace_path != NULL && strcmp(a->plot_path, a->trace_path) == 0)
        cli_die("--plot and --trace name the same file '%s'", a->plot_path);

    if (fsdp_sim_profile_from_arg(profile, &a->profile) != FSDP_OK)
        exit(2); /* the library said why */
    if (nodes > 0)
        a->profile.nodes = (int)nodes;
    if (gpn > 0)
        a->profile.gpus_per_node = (int)gpn;
    if (ops >= 0)
        a->profile.ops = (fsdp_sim_ops_t)ops;
    if (print_profile) {
        char *json = fsdp_sim_profile_to_json(&a->profile);
        if (json == NULL)
            cli_die("out of host memory");
        printf("%s\n", json);
        free(json);
        exit(0);
    }
    if (a->model_spec == NULL)
        cli_die("--model is required (see --help and --list-models)");
    a->model = model_find(a->model_spec);
    if (a->model == NULL)
        cli_die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
                "widths, or one of --list-models",
                a->model_spec, MAX_DIMS);
    if (a->model->ops->parse(a->model_spec, &a->mcfg) != 0) {
        if (a->model->ops == &gpt_ops || a->model->ops == &llama_ops)
            exit(2); /* the library said what is allowed */
        cli_die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
                "widths, or one of --list-models",
                a->model_spec, MAX_DIMS);
    }
    cli_apply_attention(attention, a->model->ops == &gpt_ops ? &a->mcfg.gpt : NULL,
                        a->model->ops == &llama_ops);
    if (ckpt_act && a->model->ops != &gpt_ops && a->model->ops != &llama_ops)
        cli_die("activation checkpointing needs a GPT or Llama model");
    if (ckpt_act == CLI_AC_SELECTIVE_OP && a->model->ops != &llama_ops)
        cli_die("--activation-checkpointing selective-op needs a Llama model (GPT-2 has full and "
                "selective-layer)");
    a->mcfg.checkpoint_activations = ckpt_act;
    a->mcfg.eager_memory = a->profile.ops == FSDP_SIM_OPS_EAGER;
    positions = model_positions(a, &default_seq);
    if (seq > 0 && positions == 1)
        cli_die("--seq needs a GPT or Llama model (an mlp's batch is rows)");
    if ((size_t)seq > positions)
        cli_die("--seq %ld is longer than the model's %zu positions (seq= in the model spec sets "
                "them)",
                seq, positions);
    a->mcfg.seq = seq > 0 ? (size_t)seq : default_seq;
    a->per_node = a->profile.gpus_per_node;
    if (a->world == 0) {
        if ((double)a->profile.nodes * a->per_node > FSDP_MAX_WORLD)
            cli_die("%d nodes x %d GPUs is more than %d ranks", a->profile.nodes, a->per_node,
                    FSDP_MAX_WORLD);
        a->world = a->profile.nodes * a->per_node;
    }
    if (a->world < a->per_node)
        a->per_node = a->world; /* part of one node */
    else if (a->world % a->per_node != 0)
        cli_die("--world %d is not a whole number of nodes of %d GPUs (set --gpus-per-node)",
                a->world, a->per_node);
    a->capacity = capacity ? cli_parse_bytes("--capacity", capacity) : a->profile.gpu.memory_bytes;
    if (batch > 0 && batch % a->world != 0)
        cli_die("--batch %ld is not divisible by --world %d: every rank needs the same number of "
                "%s (--local-batch B gives each rank B)",
                batch, a->world, plan_seq_len(a) > 1 ? "sequences" : "rows");
    if (batch > 0 && local_batch > 0 && batch != local_batch * a->world)
        cli_die("--batch %ld and --local-batch %ld disagree on %d ranks: give one", batch,
                local_batch, a->world);
    if (local_batch == 0)
        local_batch = batch > 0 ? batch / a->world : (long)a->model->default_rows;
    if (local_batch == 0) /* one sequence */
        local_batch = 1;
    a->local_batch = (size_t)local_batch;
    a->rows = a->local_batch * plan_seq_len(a);
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
    const int *represent; /* symmetric ranks, or NULL */
    /* not NULL: build the model, derive the classes of symmetric ranks of a world of
     * classes_world into it (from the layout of its units), stop */
    int *classes, classes_world, classes_per_node, n_classes;
} plan_run_t;

static int *classes; /* the classes of the last run, a->world entries */
static int64_t last_trace_run; /* the trace's run of the last simulated run (--trace, --plot) */

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
        /* a divergence the classes missed fails the run here, before any step */
        st = fsdp_sim_symmetry_check(fs, run->represent);
        if (st == FSDP_OK && run->classes != NULL) {
            run->n_classes = fsdp_sim_symmetric_ranks(fs, run->classes_world, run->classes_per_node,
                                                      run->cfg.strategy, run->classes);
            a->model->ops->destroy(model);
            fsdp_destroy(fs);
            return r->status = st;
        }
        if (st == FSDP_OK)
            st = fsdp_optim_create(fs, &oc, &opt);
    }
    for (int step = 0; step < a->steps && st == FSDP_OK; step++) {
        double t0;
        /* what came before (setup, or the last step's optimizer) ends */
        phase_begin(FSDP_PHASE_FORWARD, &pc);
        fsdp_sim_time_reset(dev);
        t0 = dev->ops->host_time(dev);
        st = a->model->ops->step(model, a->local_batch, a->mcfg.seq);
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
    double sm_held;          /* its GEMMs' and attention's time lost to collectives' SMs */
    double mfu;
    size_t peak_alloc, peak_reserved; /* max over ranks */
    int simulated;                    /* ranks simulated (fewer than the world with symmetry) */
    int runs;                         /* times the job was simulated (run_plan) */
    double last_change;               /* of the step time between the last two, relative */
} summary_t;

/* The dtype GEMMs run in: MFU is against its peak. */
static fsdp_dtype_t compute_dtype(const fsdp_config_t *cfg)
{
    fsdp_dtype_t dt = cfg->mixed_precision.param_dtype;
    return dt == FSDP_DTYPE_BF16 || dt == FSDP_DTYPE_F16 ? dt : FSDP_DTYPE_F32;
}

/* The classes of symmetric ranks for cfg into represent; the number of ranks to simulate, or
 * the world when symmetry is off or does not pay. */
static int plan_symmetry(const plan_args_t *a, const fsdp_config_t *cfg, int *represent)
{
    /* one rank builds the model: the layout of its units is every rank's */
    plan_args_t one = *a;
    rank_result_t r1;
    fsdp_sim_params_t sp;
    plan_run_t run = {.a = &one, .cfg = *cfg, .res = &r1, .classes = represent};

    if (!a->symmetry || a->world == 1)
        return a->world;
    one.world = one.per_node = 1;
    run.cfg.device_capacity = 0;
    run.classes_world = a->world;
    run.classes_per_node = a->per_node;
    memset(&r1, 0, sizeof(r1));
    fsdp_sim_params_init(&sp);
    sp.mode = FSDP_SIM_SHAPE;
    sp.profile = a->profile;
    if (fsdp_sim_launch(&sp, plan_rank, &run, NULL) != FSDP_OK || run.n_classes < 1)
        return a->world; /* run every rank */
    return run.n_classes;
}

/* One simulation of the job; holds: the book of the runs before (NULL: none); traced: write the
 * trace (--trace). */
static summary_t run_once(const plan_args_t *a, const fsdp_config_t *cfg, size_t capacity,
                          rank_result_t *res, fsdp_sim_holds_t *holds, int traced)
{
    fsdp_sim_params_t sp;
    plan_run_t run = {.a = a, .cfg = *cfg, .res = res};
    summary_t s;
    double peak = fsdp_sim_profile_matmul_flops(&a->profile, compute_dtype(cfg));
    int slow = 0;

    memset(&s, 0, sizeof(s));
    memset(res, 0, sizeof(*res) * (size_t)a->world);
    run.cfg.device_capacity = capacity;
    if (classes == NULL)
        classes = malloc((size_t)a->world * sizeof(*classes));
    s.simulated = classes != NULL ? plan_symmetry(a, cfg, classes) : a->world;
    if (s.simulated > 0 && s.simulated < a->world)
        run.represent = classes;
    else
        s.simulated = a->world;
    fsdp_sim_params_init(&sp);
    sp.world_size = a->world;
    sp.ranks_per_node = a->per_node;
    sp.mode = FSDP_SIM_SHAPE;
    sp.fibers = 1; /* thousands of ranks on a few cores */
    sp.timeout_s = a->timeout_s;
    sp.profile = a->profile;
    sp.holds = holds;
    if (traced && a->trace_path != NULL) {
        fsdp_trace_run_info_t info;
        fsdp_sim_profile_t topo = a->profile; /* the profile with the simulated topology */
        char *profile_json;
        fsdp_status_t st;
        topo.gpus_per_node = a->per_node;
        topo.nodes = a->world / a->per_node;
        profile_json = fsdp_sim_profile_to_json(&topo);
        if (profile_json == NULL)
            cli_die("out of host memory");
        memset(&info, 0, sizeof(info));
        info.backend = "sim (shape mode)";
        info.world_size = a->world;
        info.strategy = fsdp_strategy_name(cfg->strategy);
        info.profile_json = profile_json;
        info.command_line = a->command_line;
        st = fsdp_trace_open(a->trace_path, &info, &run.trace);
        free(profile_json);
        if (st != FSDP_OK)
            cli_die("cannot write the trace to %s (see the message above)", a->trace_path);
        last_trace_run = fsdp_trace_run_id(run.trace);
    }
    sp.represent = run.represent;
    s.status = fsdp_sim_launch(&sp, plan_rank, &run, NULL);
    if (fsdp_trace_close(run.trace) != FSDP_OK && s.status == FSDP_OK)
        s.status = FSDP_ERR_IO;
    if (run.represent != NULL && s.status == FSDP_ERR_UNSUPPORTED) {
        /* the classes diverged (logged): every rank apart */
        plan_args_t all = *a;
        all.symmetry = 0;
        return run_once(&all, cfg, capacity, res, holds, traced);
    }
    for (int r = 0; r < a->world && run.represent != NULL; r++) {
        if (run.represent[r] != r) /* the rank's run is its representative's */
            res[r] = res[run.represent[r]];
    }
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
    s.sm_held = res[slow].ts.sm_held_s;
    s.mfu = s.step_time > 0 && peak > 0 ? res[slow].ts.gemm_flops / (s.step_time * peak) : 0.0;
    return s;
}

/* A kernel is priced when it is issued, so a collective issued after the kernels it overlaps
 * (FSDP's forward all-gathers) would leave them all the SMs: the job runs again with the SMs its
 * collectives held in the run before (fsdp_sim_holds_t) until its step time changes by less
 * than a part in 10^4, up to PLAN_RUNS runs (each run moves it by a tenth to a fifth of what
 * the run before moved it); --trace traces the last run again, repeated exactly. */
#define PLAN_RUNS 6

static summary_t run_plan(const plan_args_t *a, const fsdp_config_t *cfg, size_t capacity,
                          rank_result_t *res)
{
    fsdp_sim_holds_t *holds = fsdp_sim_holds_create(a->world);
    summary_t s;
    double last = 0.0, change = 0.0;
    int runs = 0;

    for (int i = 0; i < PLAN_RUNS; i++) {
        s = run_once(a, cfg, capacity, res, holds, holds == NULL && a->trace_path != NULL);
        runs++;
        if (i > 0)
            change = s.step_time > 0.0 ? fabs(s.step_time - last) / s.step_time : 0.0;
        if (holds == NULL || s.status != FSDP_OK || s.oom || (i > 0 && change <= 1e-4))
            break;
        last = s.step_time;
    }
    /* the trace is of the last run, repeated: the same figures as without --trace */
    if (holds != NULL && a->trace_path != NULL) {
        fsdp_sim_holds_repeat(holds);
        s = run_once(a, cfg, capacity, res, holds, 1);
    }
    fsdp_sim_holds_destroy(holds);
    s.runs = runs;
    s.last_change = change;
    return s;
}

/* Runs with the device capacity; a run that does not fit is run again without a limit, to say
 * how much it needs, unless `quiet` (a sweep, which says only that it does not fit: the second
 * run would double the time of a sweep of large models). */
static summary_t plan_config(const plan_args_t *a, const fsdp_config_t *cfg, rank_result_t *res,
                             int quiet)
{
    summary_t s;

    cli_log_quiet(1); /* out of memory is an answer here, not an error to print */
    s = run_plan(a, cfg, a->capacity, res);
    if (s.oom && !quiet) {
        s = run_plan(a, cfg, 0, res);
        s.oom = 1;
    }
    cli_log_quiet(0);
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
            /* a rank a symmetric run stood for has its representative's result */
            if (memcmp(&res[r], &res[r - 1], sizeof(res[r])) == 0)
                continue;
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

/* A category's column: as wide as its whole name (the trace's peak_<category> columns). */
static int category_width(int c)
{
    int w = (int)strlen(fsdp_mem_category_name((fsdp_mem_category_t)c));
    return w > 9 ? w : 9;
}

static void memory_line(const rank_result_t *r, char *buf, size_t n)
{
    int off = snprintf(buf, n, "%9.2f %9.2f ", u(r->peak_alloc), u(r->peak_reserved));
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT && off > 0 && (size_t)off < n; c++)
        off += snprintf(buf + off, n - (size_t)off, " %*.2f", category_width(c), u(r->at_peak[c]));
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
    if (plan_seq_len(a) > 1)
        printf("batch %zu sequences, %zu per rank (%zu tokens per rank), %s, %d step%s simulated "
               "(the last is reported)\n",
               a->local_batch * (size_t)a->world, a->local_batch, a->rows,
               a->optim == FSDP_OPTIM_ADAMW ? "adamw" : "sgd", a->steps, a->steps > 1 ? "s" : "");
    else
        printf("batch %zu rows, %zu per rank, %s, %d step%s simulated (the last is reported)\n",
               a->local_batch * (size_t)a->world, a->local_batch,
               a->optim == FSDP_OPTIM_ADAMW ? "adamw" : "sgd", a->steps, a->steps > 1 ? "s" : "");
}

/* How many ranks ran for the figures above. */
static void print_simulated(const plan_args_t *a, int lo, int hi)
{
    if (lo == a->world && hi == a->world)
        printf("ranks simulated: all %d%s\n", a->world,
               a->symmetry || a->world == 1 ? "" : " (--no-symmetry)");
    else if (lo == hi)
        printf("ranks simulated: %d of %d, each for its class of ranks that run alike "
               "(--no-symmetry: all)\n",
               lo, a->world);
    else
        printf("ranks simulated: %d to %d of %d, each for its class of ranks that run alike "
               "(--no-symmetry: all)\n",
               lo, hi, a->world);
}

/* ---- --plot ------------------------------------------------------------------------------ */

enum { PLOT_MAX_RANKS = 32 }; /* panels of one picture */

static char plot_tmp_dir[4096], plot_tmp_db[4096 + 16]; /* --plot without --trace */

static void plot_tmp_remove(void)
{
    static const char *const suffixes[] = {"", "-journal", "-wal", "-shm"};

    if (plot_tmp_db[0] == '\0')
        return;
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        char path[sizeof(plot_tmp_db) + 16];
        snprintf(path, sizeof(path), "%s%s", plot_tmp_db, suffixes[i]);
        unlink(path);
    }
    rmdir(plot_tmp_dir);
    plot_tmp_db[0] = '\0';
}

/* --plot without --trace: the runs are traced into a database in a directory of their own under
 * $TMPDIR (or /tmp), removed at exit. */
static void plot_tmp_trace(plan_args_t *a)
{
    const char *tmp = getenv("TMPDIR");

    if (a->plot_path == NULL || a->trace_path != NULL)
        return;
    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    snprintf(plot_tmp_dir, sizeof(plot_tmp_dir), "%s/fsdp-plan-XXXXXX", tmp);
    if (mkdtemp(plot_tmp_dir) == NULL)
        cli_die("--plot: cannot make a temporary directory in %s: %s", tmp, strerror(errno));
    snprintf(plot_tmp_db, sizeof(plot_tmp_db), "%s/plan.db", plot_tmp_dir);
    atexit(plot_tmp_remove);
    a->trace_path = plot_tmp_db;
}

/* Draws the last step of the reported run: one rank of each class of a symmetric run, rank 0
 * of one simulated in full. */
static fsdp_status_t plot_plan(const plan_args_t *a, const summary_t *s)
{
    fsdp_trace_plot_options_t opts;
    fsdp_status_t st;

    fsdp_trace_plot_options_init(&opts);
    opts.first_step = opts.last_step = a->steps;
    opts.max_ranks = s->simulated < a->world ? s->simulated : 1;
    if (opts.max_ranks > PLOT_MAX_RANKS)
        opts.max_ranks = PLOT_MAX_RANKS;
    st = fsdp_trace_plot_svg_ex(a->trace_path, last_trace_run, &opts, a->plot_path);
    if (st != FSDP_OK)
        return st;
    if (opts.max_ranks < s->simulated && s->simulated < a->world)
        printf("plot: %s (step %d, the first %d of %d classes of ranks)\n", a->plot_path, a->steps,
               opts.max_ranks, s->simulated);
    else if (s->simulated < a->world)
        printf("plot: %s (step %d, one rank of each class)\n", a->plot_path, a->steps);
    else
        printf("plot: %s (step %d, rank 0)\n", a->plot_path, a->steps);
    return FSDP_OK;
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
    progress_start(0, "", "simulating");
    s = plan_config(a, &a->fsdp, res, 0);
    progress_end();
    if (s.status != FSDP_OK && !s.oom) {
        cli_error("the simulation failed (%s); see above", fsdp_status_name(s.status));
        return EXIT_ERROR;
    }
    printf("step time %.3f ms, compute %.3f ms, exposed communication %.3f ms (%.1f%% of the "
           "step)\n",
           s.step_time * 1e3, s.compute * 1e3, s.exposed * 1e3,
           s.step_time > 0 ? 100.0 * s.exposed / s.step_time : 0.0);
    if (s.sm_held > 0.0)
        printf("GEMMs and attention beside collectives: %.3f ms longer on the SMs the collectives "
               "leave them (%.1f%% of the step)\n",
               s.sm_held * 1e3, s.step_time > 0 ? 100.0 * s.sm_held / s.step_time : 0.0);
    printf("MFU %.1f%% (GEMM FLOPs run per rank, recomputation included, / step time / %.4g "
           "TFLOP/s %s peak)\n",
           100.0 * s.mfu, peak / 1e12,
           dt == FSDP_DTYPE_F32 && a->profile.gpu.allow_tf32 ? "tf32" : fsdp_dtype_name(dt));
    if (a->model->ops->palm_flops_per_token != NULL) {
        double tokens_s = s.step_time > 0 ? (double)a->rows / s.step_time : 0.0;
        double per_token = a->model->ops->palm_flops_per_token(&a->mcfg);
        /* the step time of the slowest rank: every rank waits for it */
        printf("%.0f tokens/s per GPU (%zu tokens per rank per step)\n", tokens_s, a->rows);
        printf("MFU by PaLM's definition %.1f%% (6 N + 12 L H hd T = %.4g FLOP per token, N the "
               "parameters outside the embedding; recomputation not counted)\n",
               peak > 0 ? 100.0 * tokens_s * per_token / peak : 0.0, per_token);
    }
    pick_unit(s.peak_reserved);
    printf("memory per rank, %s (peaks over the run; by category at the peak of allocated):\n",
           unit_name);
    printf("  %-15s %9s %9s ", "", "allocated", "reserved");
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++)
        printf(" %*s", category_width(c), fsdp_mem_category_name((fsdp_mem_category_t)c));
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
    print_simulated(a, s.simulated, s.simulated);
    if (s.runs > 1 && s.last_change == 0.0)
        printf("simulated %d times, each run pricing its kernels with the SMs the collectives of "
               "the run before held (docs/costs.md): the last two agree\n",
               s.runs);
    else if (s.runs > 1)
        printf("simulated %d times, each run pricing its kernels with the SMs the collectives of "
               "the run before held (docs/costs.md): the last moved the step time by %.2g%%\n",
               s.runs, 100.0 * s.last_change);
    if (a->plot_path != NULL && plot_plan(a, &s) != FSDP_OK) {
        cli_error("--plot: cannot draw %s (see the message above)", a->plot_path);
        return EXIT_ERROR;
    }
    return s.oom && a->fit_status ? EXIT_NO_FIT : EXIT_FITS;
}

/* One configuration of a sweep: the runtime's settings and the model's. */
typedef struct sweep_point {
    fsdp_config_t cfg;
    int ckpt_act;
} sweep_point_t;

/* A sweep's activation checkpointing: off, on (every block), sel-layer (every K-th), sel-op. */
static const char *ckpt_name(int ckpt_act)
{
    return ckpt_act == 0                     ? "off"
           : ckpt_act == 1                   ? "on"
           : ckpt_act == CLI_AC_SELECTIVE_OP ? "sel-op"
                                             : "sel-layer";
}

static const char *precision_name(const fsdp_config_t *cfg)
{
    fsdp_dtype_t dt = compute_dtype(cfg);
    return dt == FSDP_DTYPE_F32 ? "fp32" : fsdp_dtype_name(dt);
}

static void sweep_describe(const sweep_point_t *p, char *buf, size_t n)
{
    snprintf(buf, n,
             "%s, backward prefetch %s, limit all-gathers %s, activation checkpointing "
             "%s, %s",
             fsdp_strategy_name(p->cfg.strategy), prefetch_name(p->cfg.backward_prefetch),
             p->cfg.limit_all_gathers ? "on" : "off", ckpt_name(p->ckpt_act),
             precision_name(&p->cfg));
}

/* Every combination of the settings the command line leaves free, in a fixed order: the
 * strategies (hybrid ones only across nodes), the backward prefetch policies, the limiter on and
 * off, activation checkpointing off and on (GPT models), full precision and bf16. Returns how
 * many were written to pts (at most max). */
static int sweep_points(const plan_args_t *a, sweep_point_t *pts, int max)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD,
                                                 FSDP_HYBRID_SHARD, FSDP_HYBRID_SHARD_ZERO2};
    static const fsdp_backward_prefetch_t prefetches[] = {
        FSDP_BACKWARD_PREFETCH_PRE, FSDP_BACKWARD_PREFETCH_POST, FSDP_BACKWARD_PREFETCH_NONE};
    /* activation checkpointing: off and every block (the transformers), or what was given */
    int ckpt[2] = {0, 1}, n_ckpt = a->model->ops == &gpt_ops || a->model->ops == &llama_ops ? 2 : 1;
    int n = 0;

    if (a->fixed & FIX_CKPT_ACT) {
        ckpt[0] = a->mcfg.checkpoint_activations;
        n_ckpt = 1;
    }

    for (size_t si = 0; si < sizeof(strategies) / sizeof(strategies[0]); si++) {
        if (a->fixed & FIX_STRATEGY ? strategies[si] != a->fsdp.strategy
                                    : is_hybrid(strategies[si]) && a->world <= a->per_node)
            continue; /* hybrid strategies shard within a node: worth trying on several */
        for (size_t pi = 0; pi < 3; pi++) {
            if ((a->fixed & FIX_PREFETCH) && prefetches[pi] != a->fsdp.backward_prefetch)
                continue;
            for (int lim = 1; lim >= 0; lim--) {
                if ((a->fixed & FIX_LIMITER) && lim != a->fsdp.limit_all_gathers)
                    continue;
                for (int ci = 0; ci < n_ckpt; ci++) {
                    for (int bf = 0; bf <= 1; bf++) {
                        sweep_point_t p = {.cfg = a->fsdp, .ckpt_act = ckpt[ci]};
                        if (bf && (a->fixed & FIX_PRECISION))
                            continue;
                        if (bf) /* MixedPrecision(param_dtype=bf16), the rest default */
                            cli_parse_mixed_precision("bf16", &p.cfg.mixed_precision);
                        p.cfg.strategy = strategies[si];
                        p.cfg.backward_prefetch = prefetches[pi];
                        p.cfg.limit_all_gathers = lim;
                        if (n < max)
                            pts[n] = p;
                        n++;
                    }
                }
            }
        }
    }
    return n;
}

static int print_sweep(const plan_args_t *a, rank_result_t *res)
{
    enum { MAX_POINTS = 5 * 3 * 2 * 2 * 2 };
    sweep_point_t pts[MAX_POINTS], best_pt;
    summary_t best = {.status = FSDP_ERR_NOT_FOUND};
    int n_fit = 0, n_failed = 0, n = sweep_points(a, pts, MAX_POINTS), sim_lo = a->world;
    int sim_hi = 0;
    char desc[256];

    print_header(a);
    fmt_capacity(a->capacity, desc, sizeof(desc));
    printf("sweeping %d configurations (a row that does not fit ran out of its %s per GPU and "
           "stopped there)\n",
           n, desc);
    printf("%-18s %-12s %-7s %-8s %-9s %9s %11s %6s %15s %18s  %s\n", "strategy", "bwd prefetch",
           "limiter", "act ckpt", "precision", "step ms", "exposed ms", "MFU", "peak alloc GiB",
           "peak reserved GiB", "fits");
    fflush(stdout);
    progress_start(n, "config", "simulating");
    for (int i = 0; i < n; i++) {
        plan_args_t b = *a;
        const sweep_point_t *p = &pts[i];
        summary_t s;

        b.mcfg.checkpoint_activations = p->ckpt_act;
        s = plan_config(&b, &p->cfg, res, 1);
        sim_lo = s.simulated < sim_lo ? s.simulated : sim_lo;
        sim_hi = s.simulated > sim_hi ? s.simulated : sim_hi;
        if (s.status != FSDP_OK && !s.oom) {
            progress_printf(
                "%-18s %-12s %-7s %-8s %-9s  failed: %s", fsdp_strategy_name(p->cfg.strategy),
                prefetch_name(p->cfg.backward_prefetch), p->cfg.limit_all_gathers ? "on" : "off",
                ckpt_name(p->ckpt_act), precision_name(&p->cfg), fsdp_status_string(s.status));
            n_failed++;
        } else if (s.oom) {
            progress_printf("%-18s %-12s %-7s %-8s %-9s %9s %11s %6s %15s %18s  %s",
                            fsdp_strategy_name(p->cfg.strategy),
                            prefetch_name(p->cfg.backward_prefetch),
                            p->cfg.limit_all_gathers ? "on" : "off", ckpt_name(p->ckpt_act),
                            precision_name(&p->cfg), "-", "-", "-", "-", "-", "no");
        } else {
            progress_printf("%-18s %-12s %-7s %-8s %-9s %9.3f %11.3f %5.1f%% %15.2f %18.2f  %s",
                            fsdp_strategy_name(p->cfg.strategy),
                            prefetch_name(p->cfg.backward_prefetch),
                            p->cfg.limit_all_gathers ? "on" : "off", ckpt_name(p->ckpt_act),
                            precision_name(&p->cfg), s.step_time * 1e3, s.exposed * 1e3,
                            100.0 * s.mfu, (double)s.peak_alloc / (double)((size_t)1 << 30),
                            (double)s.peak_reserved / (double)((size_t)1 << 30), "yes");
            if (best.status != FSDP_OK || s.step_time < best.step_time) {
                best = s;
                best_pt = *p;
            }
            n_fit++;
        }
        progress_update(i + 1, NULL);
    }
    progress_end();
    if (n_fit == 0) {
        printf("nothing fits in %.2f GiB per GPU\n",
               (double)a->capacity / (double)((size_t)1 << 30));
        print_simulated(a, sim_lo, sim_hi);
        return !a->fit_status ? EXIT_FITS : n_failed == n ? EXIT_ERROR : EXIT_NO_FIT;
    }
    sweep_describe(&best_pt, desc, sizeof(desc));
    printf("fastest that fits: %s: %.3f ms per step, MFU %.1f%%, peak reserved %.2f GiB (%d of "
           "%d configurations fit)\n",
           desc, best.step_time * 1e3, 100.0 * best.mfu,
           (double)best.peak_reserved / (double)((size_t)1 << 30), n_fit, n);
    print_simulated(a, sim_lo, sim_hi);
    return EXIT_FITS;
}

int main(int argc, char **argv)
{
    plan_args_t args;
    rank_result_t *res;
    int rc;

    cli_init("fsdp-plan");
    parse_args(argc, argv, &args);
    plot_tmp_trace(&args);
    res = calloc((size_t)args.world, sizeof(*res));
    if (res == NULL)
        cli_die("out of host memory for %d ranks", args.world);
    rc = args.sweep ? print_sweep(&args, res) : print_plan(&args, res);
    free(classes);
    free(res);
    return rc;
}
