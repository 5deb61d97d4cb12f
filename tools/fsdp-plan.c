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
#include <fsdp/trace.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "plan.h"
#include "progress.h"

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
    char cap[32], mesh[64];
    double params = a->model->ops->params(&a->mcfg);

    fmt_capacity(a->capacity, cap, sizeof(cap));
    printf("model %s: %d units, %.4g parameters (%.2f GiB in f32)\n", a->model_spec,
           a->model->ops->units(&a->mcfg), params, params * 4 / (double)((size_t)1 << 30));
    printf("cluster %s: %d ranks%s, %d per node (%s, %s each)\n", a->profile.name, a->world,
           cli_mesh(mesh, sizeof(mesh), a->world, a->per_node, &a->fsdp), a->per_node,
           a->profile.gpu.model, cap);
    if (a->profile.stack[0] != '\0')
        printf("software of its constants: %s\n", a->profile.stack);
    /* with --grad-accum K: the batch and tokens of a step, K micro-batches of --local-batch */
    const size_t k = (size_t)a->grad_accum, batch = a->local_batch * (size_t)a->dp * k;
    const char *a_step = k > 1 ? " a step" : "";
    char micro[48] = "";
    if (k > 1)
        snprintf(micro, sizeof(micro), "%zu micro-batches of ", k);
    if (plan_seq_len(a) > 1 && a->dp < a->world)
        printf("batch %zu sequences%s, %s%zu per dp rank of %d (tp %d: %zu tokens per rank%s), %s, "
               "%d step%s simulated (the last is reported)\n",
               batch, a_step, micro, a->local_batch, a->dp, a->world / a->dp, a->rows * k, a_step,
               a->optim == FSDP_OPTIM_ADAMW ? "adamw" : "sgd", a->steps, a->steps > 1 ? "s" : "");
    else if (plan_seq_len(a) > 1)
        printf("batch %zu sequences%s, %s%zu per rank (%zu tokens per rank%s), %s, %d step%s "
               "simulated (the last is reported)\n",
               batch, a_step, micro, a->local_batch, a->rows * k, a_step,
               a->optim == FSDP_OPTIM_ADAMW ? "adamw" : "sgd", a->steps, a->steps > 1 ? "s" : "");
    else
        printf("batch %zu rows%s, %s%zu per rank, %s, %d step%s simulated (the last is "
               "reported)\n",
               batch, a_step, micro, a->local_batch, a->optim == FSDP_OPTIM_ADAMW ? "adamw" : "sgd",
               a->steps, a->steps > 1 ? "s" : "");
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
    st = fsdp_trace_plot_svg_ex(a->trace_path, plan_last_trace_run(), &opts, a->plot_path);
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

/* fully_shard's settings, as the config line prints FSDP1's. */
static void print_fsdp2_config(const fsdp_config_t *c, fsdp_dtype_t dt)
{
    char raf[32];

    if (c->reshard_after_forward == FSDP_RESHARD_DEFAULT)
        snprintf(raf, sizeof(raf), "default (not the root)");
    else if (c->reshard_after_forward == FSDP_RESHARD_TRUE)
        snprintf(raf, sizeof(raf), "true");
    else if (c->reshard_after_forward == FSDP_RESHARD_FALSE)
        snprintf(raf, sizeof(raf), "false");
    else
        snprintf(raf, sizeof(raf), "%d", c->reshard_after_forward);
    printf("config api fsdp2 (fully_shard)%s, reshard after forward %s, prefetch forward %s, "
           "backward %s%s%s\n",
           c->strategy == FSDP_HYBRID_SHARD ? ", HSDP" : "", raf,
           c->explicit_forward_prefetch ? "explicit" : "none",
           c->explicit_backward_prefetch ? "explicit" : "implicit",
           dt != FSDP_DTYPE_F32 ? ", param_dtype " : "",
           dt != FSDP_DTYPE_F32 ? fsdp_dtype_name(dt) : "");
}

static int print_plan(const plan_args_t *a, rank_result_t *res)
{
    fsdp_dtype_t dt = plan_compute_dtype(&a->fsdp);
    double peak = fsdp_sim_profile_matmul_flops(&a->profile, dt);
    char cap[32];
    summary_t s;

    print_header(a);
    if (a->fsdp.api == FSDP_API_FSDP2)
        print_fsdp2_config(&a->fsdp, dt);
    else
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
    if (a->profile.nccl.hbm_traffic_factor > 0.0)
        printf("memory-bound kernels beside collectives: %.3f ms longer on the HBM bandwidth the "
               "collectives take (%.1f%% of the step)\n",
               s.hbm_held * 1e3, s.step_time > 0 ? 100.0 * s.hbm_held / s.step_time : 0.0);
    printf("MFU %.1f%% (GEMM FLOPs run per rank, recomputation included, / step time / %.4g "
           "TFLOP/s %s peak)\n",
           100.0 * s.mfu, peak / 1e12,
           dt == FSDP_DTYPE_F32 && a->profile.gpu.allow_tf32 ? "tf32" : fsdp_dtype_name(dt));
    if (a->model->ops->palm_flops_per_token != NULL) {
        /* a step's tokens: every micro-batch's */
        size_t tokens = a->rows * (size_t)a->grad_accum;
        double tokens_s = s.step_time > 0 ? (double)tokens / s.step_time : 0.0;
        double per_token = a->model->ops->palm_flops_per_token(&a->mcfg);
        /* the step time of the slowest rank: every rank waits for it */
        printf("%.0f tokens/s per GPU (%zu tokens per rank per step)\n", tokens_s, tokens);
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
        printf("%s%-21s", p ? " " : "", plan_phase_names[p]);
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

/* tp of a configuration, 1 without tensor parallelism */
static int tp_of(const fsdp_config_t *c)
{
    return c->tp_size > 1 ? c->tp_size : 1;
}

/* The sweep's first column: the strategy, and tp when there is tensor parallelism. */
static const char *strategy_col(const sweep_point_t *p, char buf[32])
{
    if (tp_of(&p->cfg) == 1)
        return fsdp_strategy_name(p->cfg.strategy);
    snprintf(buf, 32, "%s tp%d", fsdp_strategy_name(p->cfg.strategy), tp_of(&p->cfg));
    return buf;
}

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
    fsdp_dtype_t dt = plan_compute_dtype(cfg);
    return dt == FSDP_DTYPE_F32 ? "fp32" : fsdp_dtype_name(dt);
}

/* The sweep's second and third columns: FSDP1's backward prefetch and limiter, fully_shard's
 * backward prefetch schedule and reshard_after_forward. */
static const char *prefetch_col(const fsdp_config_t *c)
{
    if (c->api == FSDP_API_FSDP2)
        return c->explicit_backward_prefetch ? "explicit" : "implicit";
    return prefetch_name(c->backward_prefetch);
}

static const char *limiter_col(const fsdp_config_t *c)
{
    if (c->api == FSDP_API_FSDP2)
        return c->reshard_after_forward == FSDP_RESHARD_FALSE ? "false" : "default";
    return c->limit_all_gathers ? "on" : "off";
}

static void sweep_describe(const sweep_point_t *p, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s, backward prefetch %s, %s %s, activation checkpointing %s, %s",
                     fsdp_strategy_name(p->cfg.strategy), prefetch_col(&p->cfg),
                     p->cfg.api == FSDP_API_FSDP2 ? "reshard after forward" : "limit all-gathers",
                     limiter_col(&p->cfg), ckpt_name(p->ckpt_act), precision_name(&p->cfg));
    if (tp_of(&p->cfg) > 1 && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ", tp %d", tp_of(&p->cfg));
}

/* Whether tp divides what a language model splits over it: the sequence (sequence
 * parallelism), the heads and the vocabulary, and a Llama's kv heads and FFN (the refusals of
 * lm_tp.c, gpt2_lm.c and llama.c: a sweep leaves such a tp out) */
static int tp_divides(const plan_args_t *a, int tp)
{
    const model_cfg_t *m = &a->mcfg;

    if (m->seq % (size_t)tp != 0)
        return 0;
    if (a->model->family == MODEL_LLAMA)
        return m->llama.n_head % tp == 0 && m->llama.n_kv_head % tp == 0 &&
               m->llama.ffn_dim % tp == 0 && m->llama.vocab_size % tp == 0;
    return m->gpt.n_head % tp == 0 && m->gpt.vocab_size % tp == 0;
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
    int ckpt[2] = {0, 1}, n_ckpt = a->model->family != MODEL_MLP ? 2 : 1;
    int n = 0;

    if (a->fixed & FIX_CKPT_ACT) {
        ckpt[0] = a->mcfg.checkpoint_activations;
        n_ckpt = 1;
    }

    /* fully_shard: full_shard and HSDP, the implicit and explicit backward prefetch, and
     * reshard_after_forward at its default and false, in the places of FSDP1's strategies,
     * prefetch policies and limiter */
    int v2 = a->fsdp.api == FSDP_API_FSDP2, n_pf = v2 ? 2 : 3;
    /* fully_shard of a llama or a GPT: tensor parallelism of 1, 2, 4 and 8 ranks where they
     * divide a node and what the model splits over tp (tp_divides), with full and hybrid
     * sharding (HSDP x tp: each node holds whole tp groups), unless --tp fixed it */
    int tps[4] = {tp_of(&a->fsdp)}, n_tp = 1;

    if (v2 && a->model->family != MODEL_MLP && !(a->fixed & FIX_TP))
        for (int t = 2; t <= 8; t *= 2)
            if (a->per_node % t == 0 && a->world % t == 0 && tp_divides(a, t))
                tps[n_tp++] = t;

    for (size_t si = 0; si < sizeof(strategies) / sizeof(strategies[0]); si++) {
        if (v2 && strategies[si] != FSDP_FULL_SHARD && strategies[si] != FSDP_HYBRID_SHARD)
            continue;
        if (a->fixed & FIX_STRATEGY ? strategies[si] != a->fsdp.strategy
                                    : plan_is_hybrid(strategies[si]) && a->world <= a->per_node)
            continue; /* hybrid strategies shard within a node: worth trying on several */
        for (int pi = 0; pi < n_pf; pi++) {
            if ((a->fixed & FIX_PREFETCH) && (v2 ? pi != a->fsdp.explicit_backward_prefetch
                                                 : prefetches[pi] != a->fsdp.backward_prefetch))
                continue;
            for (int lim = 1; lim >= 0; lim--) {
                if ((a->fixed & FIX_LIMITER) &&
                    (v2 ? lim != (a->fsdp.reshard_after_forward != FSDP_RESHARD_FALSE)
                        : lim != a->fsdp.limit_all_gathers))
                    continue;
                for (int ci = 0; ci < n_ckpt; ci++) {
                    for (int bf = 0; bf <= 1; bf++) {
                        sweep_point_t p = {.cfg = a->fsdp, .ckpt_act = ckpt[ci]};
                        if (bf && (a->fixed & FIX_PRECISION))
                            continue;
                        if (bf) /* MixedPrecision(param_dtype=bf16), the rest default */
                            cli_parse_mixed_precision("bf16", &p.cfg.mixed_precision);
                        p.cfg.strategy = strategies[si];
                        if (v2) {
                            p.cfg.explicit_backward_prefetch = pi;
                            p.cfg.reshard_after_forward =
                                lim ? FSDP_RESHARD_DEFAULT : FSDP_RESHARD_FALSE;
                        } else {
                            p.cfg.backward_prefetch = prefetches[pi];
                            p.cfg.limit_all_gathers = lim;
                        }
                        for (int ti = 0; ti < n_tp; ti++) {
                            p.cfg.tp_size = tps[ti];
                            if (n < max)
                                pts[n] = p;
                            n++;
                        }
                    }
                }
            }
        }
    }
    return n;
}

static int print_sweep(const plan_args_t *a, rank_result_t *res)
{
    enum { MAX_POINTS = 5 * 3 * 2 * 2 * 2 * 4 };
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
           a->fsdp.api == FSDP_API_FSDP2 ? "reshard" : "limiter", "act ckpt", "precision",
           "step ms", "exposed ms", "MFU", "peak alloc GiB", "peak reserved GiB", "fits");
    fflush(stdout);
    progress_start(n, "config", "simulating");
    for (int i = 0; i < n; i++) {
        plan_args_t b = *a;
        const sweep_point_t *p = &pts[i];
        summary_t s;
        char col[32];

        b.mcfg.checkpoint_activations = p->ckpt_act;
        /* the same global batch over world / tp dp ranks */
        b.dp = a->world / tp_of(&p->cfg);
        b.local_batch = a->local_batch * (size_t)a->dp / (size_t)b.dp;
        b.rows = b.local_batch * plan_seq_len(a) / (size_t)tp_of(&p->cfg);
        s = plan_config(&b, &p->cfg, res, 1);
        sim_lo = s.simulated < sim_lo ? s.simulated : sim_lo;
        sim_hi = s.simulated > sim_hi ? s.simulated : sim_hi;
        if (s.status != FSDP_OK && !s.oom) {
            progress_printf("%-18s %-12s %-7s %-8s %-9s  failed: %s", strategy_col(p, col),
                            prefetch_col(&p->cfg), limiter_col(&p->cfg), ckpt_name(p->ckpt_act),
                            precision_name(&p->cfg), fsdp_status_string(s.status));
            n_failed++;
        } else if (s.oom) {
            progress_printf("%-18s %-12s %-7s %-8s %-9s %9s %11s %6s %15s %18s  %s",
                            strategy_col(p, col), prefetch_col(&p->cfg), limiter_col(&p->cfg),
                            ckpt_name(p->ckpt_act), precision_name(&p->cfg), "-", "-", "-", "-",
                            "-", "no");
        } else {
            progress_printf("%-18s %-12s %-7s %-8s %-9s %9.3f %11.3f %5.1f%% %15.2f %18.2f  %s",
                            strategy_col(p, col), prefetch_col(&p->cfg), limiter_col(&p->cfg),
                            ckpt_name(p->ckpt_act), precision_name(&p->cfg), s.step_time * 1e3,
                            s.exposed * 1e3, 100.0 * s.mfu,
                            (double)s.peak_alloc / (double)((size_t)1 << 30),
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
    plan_parse_args(argc, argv, &args);
    plot_tmp_trace(&args);
    res = calloc((size_t)args.world, sizeof(*res));
    if (res == NULL)
        cli_die("out of host memory for %d ranks", args.world);
    rc = args.sweep ? print_sweep(&args, res) : print_plan(&args, res);
    plan_run_cleanup();
    free(res);
    return rc;
}
