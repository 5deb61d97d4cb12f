/* What fsdp-plan's files share: the models it plans (plan_models.c), its command line
 * (plan_args.c) and the simulation of one configuration (plan_run.c); fsdp-plan.c prints the
 * plan or the sweep. */
#ifndef FSDP_TOOLS_PLAN_H
#define FSDP_TOOLS_PLAN_H

#include <fsdp/fsdp.h>
#include <fsdp/gpt2.h>
#include <fsdp/llama.h>
#include <fsdp/sim.h>

#include <stddef.h>
#include <stdint.h>

/* ---- models (plan_models.c) ----------------------------------------------------------------
 *
 * A model is a family of ops (how to build it on a rank and run one forward and backward in
 * shape mode) and a table entry per named configuration: adding a model is one entry. */

#define MAX_DIMS (FSDP_MLP_MAX_LAYERS + 1)

typedef struct model_cfg {
    int dims[MAX_DIMS]; /* mlp */
    int nlayers;
    fsdp_gpt2_config_t gpt;     /* gpt */
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

typedef enum { MODEL_MLP = 0, MODEL_GPT, MODEL_LLAMA } model_family_t;

typedef struct model_entry {
    const char *name;               /* exact name, or a family prefix ending in ':' */
    int (*match)(const char *spec); /* or this, when not NULL */
    const char *what;
    const model_ops_t *ops;
    model_family_t family;
    size_t default_rows; /* per rank; 0: one sequence */
} model_entry_t;

/* The table, for --list-models. */
const model_entry_t *plan_models(size_t *count_p);
/* The entry spec names, or NULL. */
const model_entry_t *plan_model_find(const char *spec);
/* The longest sequence the model takes, and its default in *default_p (a Llama's: at most 8192
 * tokens, Llama 3's training context); 1 for models of rows. */
size_t plan_model_positions(const model_entry_t *m, const model_cfg_t *cfg, size_t *default_p);

/* ---- the command line (plan_args.c) ------------------------------------------------------- */

/* What a sweep varies unless the command line sets it. */
enum {
    FIX_STRATEGY = 1u << 0,
    FIX_PREFETCH = 1u << 1,
    FIX_LIMITER = 1u << 2,
    FIX_PRECISION = 1u << 3,
    FIX_CKPT_ACT = 1u << 4,
    FIX_TP = 1u << 5
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
    size_t local_batch; /* rows or sequences per rank in each micro-batch */
    size_t rows;        /* rows or tokens per rank in each micro-batch */
    int grad_accum;     /* micro-batches per optimizer step (--grad-accum) */
    int steps;
    int sweep;
    unsigned fixed; /* FIX_*: the settings given on the command line, which a sweep keeps */
    int fit_status; /* --fit-status: the exit status says whether the job fits */
    int world, per_node;
    int dp; /* data-parallel ranks: world / --tp; local_batch is each one's */
    double timeout_s;
    const char *trace_path;  /* --trace: every simulated run becomes a run of this database */
    const char *plot_path;   /* --plot: an SVG of the reported step, drawn from the trace */
    int symmetry;            /* simulate one rank per class of ranks that run alike */
    char command_line[2048]; /* for the trace */
} plan_args_t;

/* Parses and checks the command line into *a; dies with the tool's message (exit 2) on bad
 * usage, and exits 0 after --help, --version, --list-models and --print-profile. */
void plan_parse_args(int argc, char **argv, plan_args_t *a);

/* Tokens per item of a batch: a GPT's or Llama's sequence, or one row. */
static inline size_t plan_seq_len(const plan_args_t *a)
{
    return a->mcfg.seq;
}

static inline int plan_is_hybrid(fsdp_strategy_t s)
{
    return s == FSDP_HYBRID_SHARD || s == FSDP_HYBRID_SHARD_ZERO2;
}

/* ---- one configuration, simulated (plan_run.c) --------------------------------------------- */

enum { PH_SETUP = 0, PH_FORWARD, PH_BACKWARD, PH_OPTIM, N_PHASES };
/* "setup", "forward", "backward", "optimizer" */
extern const char *const plan_phase_names[N_PHASES];

typedef struct rank_result {
    fsdp_status_t status;
    double step_time;         /* of the last step */
    fsdp_sim_time_stats_t ts; /* of the last step */
    size_t peak_alloc, peak_reserved;
    size_t at_peak[FSDP_MEM_CATEGORY_COUNT]; /* allocated by category at peak_alloc */
    size_t phase_alloc[N_PHASES], phase_reserved[N_PHASES];
} rank_result_t;

typedef struct summary {
    fsdp_status_t status;
    int oom;                 /* did not fit the capacity */
    double step_time;        /* max over ranks */
    double exposed, compute; /* of the slowest rank */
    double sm_held;          /* its GEMMs' and attention's time lost to collectives' SMs */
    double hbm_held;         /* its memory-bound kernels' time lost to collectives' HBM traffic */
    double mfu;
    size_t peak_alloc, peak_reserved; /* max over ranks */
    int simulated;                    /* ranks simulated (fewer than the world with symmetry) */
    int runs;                         /* times the job was simulated (run_plan) */
    double last_change;               /* of the step time between the last two, relative */
} summary_t;

/* The dtype GEMMs run in: MFU is against its peak. */
fsdp_dtype_t plan_compute_dtype(const fsdp_config_t *cfg);

/* Simulates the job with cfg into res (a->world entries) with the device capacity; a run that
 * does not fit is run again without a limit, to say how much it needs, unless `quiet` (a
 * sweep, which says only that it does not fit: the second run would double the time of a
 * sweep of large models). */
summary_t plan_config(const plan_args_t *a, const fsdp_config_t *cfg, rank_result_t *res,
                      int quiet);

/* The trace's run id of the last traced simulation (--trace, --plot). */
int64_t plan_last_trace_run(void);
/* Frees what the runs kept between them (the classes of symmetric ranks). */
void plan_run_cleanup(void);

#endif
