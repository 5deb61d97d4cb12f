/* What simulating ranks costs.
 *
 *     bench_sim [--quick] [--world W] [--threads] [--workers N] [--rows R] [--data-only]
 *               [--shape-only] [--symmetric-only] [--batch B]
 *
 * (--world, --threads: the run of every rank; the symmetric runs have their own worlds, on
 * fibers, and --threads skips them.)
 *
 * Shape mode: one FULL_SHARD step (forward, backward, AdamW) on W simulated ranks (default
 * 1024, 128 nodes of 8 H100), first of the real GPT-3-175B preset (lib/nn/gpt2*.c: 96 blocks,
 * width 12288, 96 heads, vocabulary 50257, 1.746e11 parameters, 97 units) on one sequence of
 * R = 2048 tokens per rank, then of its MLP stand-in (96 Linear units alternating 12288 ->
 * 147456 -> 12288, 1.74e11 parameters, R rows per rank), which has a third of the ops.
 * Reported: wall and CPU time of the launch (set-up, the step, teardown), the process's peak
 * resident memory, and ops simulated (kernels, copies and collectives summed over ranks) per
 * wall second. Target for the GPT-3 preset: <= 5 s and <= 4 GiB on 2 cores at 1024 ranks.
 * Measured on a 2-core machine shared with other builds: with the other core free (load about
 * 1), 2.6-3.1 s wall and 4.9-5.9 s CPU on two fiber workers, 4.6-5.5 s on one; with other
 * builds running (load 2 to 4), 3.3-7.7 s on two workers, as the second worker then gets only
 * part of a core. 4.44e6 ops (4340 per rank), 0.81 GiB peak RSS (with libfsdp linking the gpu
 * backend's CUDA libraries). Both workers stay busy from the first rank to the last (a perf
 * timeline shows them at the same sample rate throughout); the serial set-up before the
 * workers start and the teardown after they end take 0.1-0.2 s together. The CPU time is
 * mostly cache misses: a rank's state is cold each time its fiber resumes, so what costs is
 * how many distinct cache lines an op touches, above all in the caching-allocator model (each
 * rank's free-block trees and live-block map: over two fifths of the time) and the stream and
 * collective accounting.
 *
 * Symmetric ranks, first: the same GPT-3-175B step in bf16 (MixedPrecision(param_dtype=bf16))
 * with one simulated rank per class of ranks that run alike (fsdp_sim_params_t.represent, the
 * classes derived from the model on one rank as fsdp-plan derives them, their derivation
 * counted), on 1,024, 16,384 and 131,072 ranks (--quick: 24 blocks, the first two), each
 * reported next to the 1,024-rank wall time of the same run: the ratio is the figure that
 * matters, since the cost should not grow with the world. Targets: <= 1 s at 1,024 ranks,
 * <= 2 s and <= 1 GiB at 16,384, <= 10 s at 131,072 (--symmetric-only: these runs alone).
 * Measured on the 2-core machine under a load of about 2: 12, 13 and 25 ranks simulated;
 * 0.022-0.029 s, 0.021-0.025 s and 0.039-0.056 s wall (0.03-0.04 s, 0.03-0.04 s and
 * 0.06-0.07 s CPU), ratios 0.9-1.05 and 1.65-2.2, peak RSS 0.02 GiB (before the classes were
 * derived from the layout: 0.086 s, 0.62 s and 6.1 s, ratios 7.2 and 71). The classes cost
 * next to nothing now (lib/core/symmetry.c cuts the ranks into runs at the shards that hold a
 * parameter's boundary and compares one rank per run); what the world still costs is writing
 * each rank's class and the launch's arrays of a few words per rank (under 1% of the CPU in a
 * perf profile at 131,072 ranks). The rest is the simulated ranks' own runs, about 1.8 ms each
 * at every world: 131,072 ranks simulate 25, not 12, because their shards of a block's flat
 * parameter (13,900 elements) are no larger than its biases and norms (12,288 to 49,152), so
 * these span shards of their own (a shard inside a bias is a class of its own), where at
 * 1,024 ranks one shard holds several whole.
 *
 * Data mode: the cost of simulating W ranks against the same arithmetic in one plain
 * process. The same MLP step (512-2048-2048-512, global batch B rows, AdamW) runs
 *   (a) simulated: W = 8 ranks of B/W rows each under FULL_SHARD, as fibers on one worker
 *       thread (--threads: one thread per rank; --workers N: N workers);
 *   (c) in a plain process: the W slices of B/W rows one after the other, the gradients
 *       accumulated into one buffer (the weight-gradient GEMMs add into it), then divided by W,
 *       AdamW over all parameters and zeroed: a single-process reference's step, with the same
 *       kernel bodies (fsdp_sim_kernel_exec) and no runtime at all (no hooks, allocator,
 *       streams, collectives or ranks);
 *   (b) in a plain process as one pass of B rows: the same FLOPs in larger GEMMs.
 * The cost of simulating is a/c, the process's CPU time over the measured steps (from a barrier
 * after the warm-up step to one after the last; set-up excluded). Target: <= 1.3 at 128, 256
 * and 512 rows per rank. Measured on the 2-core machine over several runs: 1.09-1.19,
 * 1.00-1.16 and 1.04-1.15 (1.23-1.26 at 128 rows with threads). What it pays for is what a world of W ranks does on top
 * of one process's arithmetic: W copies of the all-gathered parameters (forward and backward),
 * W unsharded gradients zero-filled and pre-divided, the reduce-scatter reading all of them,
 * the hooks, the allocator and stream models and the switches between ranks. c/b (1.0-1.3 at
 * 128 rows) is the arithmetic's own price for smaller GEMMs, which a/c does not charge to the
 * simulator.
 */
#include <fsdp/fsdp.h>
#include <fsdp/gpt2.h>

#include "sim_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The calling thread's CPU time: the plain baseline's. */
static double thread_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_gib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / (1024.0 * 1024.0); /* KiB on Linux */
}

typedef struct bench_run {
    const fsdp_gpt2_config_t *gpt; /* the model: this GPT when set, else the MLP */
    int dims[FSDP_MLP_MAX_LAYERS + 1];
    int nlayers;
    size_t rows;  /* per rank */
    float *x, *y; /* data mode: the global batch, NULL in shape mode */
    fsdp_strategy_t strategy;
    int warmup, steps; /* steps before the measured ones, and those */
    int micro;         /* forward-backward passes per step (gradient accumulation); 0 is 1 */
    int bf16;          /* MixedPrecision(param_dtype=bf16) */
    int *represent;    /* symmetric ranks (fsdp_sim_params_t.represent), or NULL */
    int classes_world; /* the class derivation's rank: the world to derive them for */
    /* per rank */
    uint64_t *ops;
    double *step_time;
    double steps_cpu; /* data mode: the process's CPU seconds in the measured steps */
    size_t *peak_reserved;
} bench_run_t;

/* One forward and backward: the MLP over its rows, or the GPT over one sequence of `rows`
 * tokens (shape mode reads no tokens: zeros stand for them). */
static fsdp_status_t bench_forward_backward(const bench_run_t *b, fsdp_mlp_t *mlp, fsdp_lm_t *gpt,
                                            const int32_t *tokens, const float *x, const float *y)
{
    float loss;

    if (gpt != NULL)
        return fsdp_lm_forward_backward(gpt, tokens, tokens, 1, b->rows, &loss);
    return fsdp_mlp_forward_backward(mlp, x, y, b->rows, &loss);
}

/* One step: `micro` forward-backward passes over consecutive slices of the rank's rows (their
 * gradients accumulate), the optimizer, zero_grad. */
static fsdp_status_t bench_step(const bench_run_t *b, fsdp_t *fs, fsdp_mlp_t *mlp, fsdp_lm_t *gpt,
                                fsdp_optim_t *opt, const int32_t *tokens, const float *x,
                                const float *y)
{
    fsdp_status_t st = FSDP_OK;
    int micro = b->micro > 0 ? b->micro : 1;

    for (int m = 0; m < micro && st == FSDP_OK; m++)
        st = bench_forward_backward(
            b, mlp, gpt, tokens, x != NULL ? x + (size_t)m * b->rows * (size_t)b->dims[0] : NULL,
            y != NULL ? y + (size_t)m * b->rows * (size_t)b->dims[b->nlayers] : NULL);
    if (st == FSDP_OK)
        st = fsdp_optim_step(opt);
    fsdp_zero_grad(fs);
    return st;
}

static fsdp_status_t bench_rank(fsdp_dev_t *dev, void *arg)
{
    bench_run_t *b = arg;
    fsdp_config_t cfg;
    fsdp_optim_config_t oc;
    fsdp_sim_time_stats_t ts;
    fsdp_mem_stats_t ms;
    fsdp_t *fs = NULL;
    fsdp_mlp_t *mlp = NULL;
    fsdp_lm_t *gpt = NULL;
    int32_t *tokens = NULL;
    fsdp_optim_t *opt = NULL;
    const float *x = NULL, *y = NULL;
    double t0;
    fsdp_status_t st;

    fsdp_config_init(&cfg);
    cfg.strategy = b->strategy;
    if (b->bf16)
        cfg.mixed_precision.param_dtype = FSDP_DTYPE_BF16;
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    st = fsdp_create(dev, &cfg, &fs);
    if (st != FSDP_OK)
        return st;
    if (b->gpt != NULL) {
        st = fsdp_gpt2_create(fs, b->gpt, &gpt);
        tokens = calloc(b->rows, sizeof(*tokens));
        if (st == FSDP_OK && tokens == NULL)
            st = FSDP_ERR_NO_MEMORY;
    } else {
        st = fsdp_mlp_create(fs, b->dims, b->nlayers, &mlp);
    }
    if (st == FSDP_OK && b->x != NULL) {
        st = fsdp_mlp_init_params(mlp, 1);
        x = b->x + (size_t)dev->rank * b->rows * (size_t)b->dims[0];
        y = b->y + (size_t)dev->rank * b->rows * (size_t)b->dims[b->nlayers];
    }
    if (st == FSDP_OK && b->classes_world > 0) {
        /* one rank's layout of the units is every rank's: the classes come from it, as
         * fsdp-plan derives them */
        if (fsdp_symmetric_ranks(fs, b->classes_world, b->classes_world % 8 == 0 ? 8 : 0,
                                 b->strategy, b->represent) < 1)
            st = FSDP_ERR_INTERNAL;
        fsdp_lm_destroy(gpt);
        free(tokens);
        fsdp_mlp_destroy(mlp);
        fsdp_destroy(fs);
        return st;
    }
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    /* data mode: a first step (segments, optimizer state, page faults) then the measured ones */
    for (int step = 0; step < b->warmup && st == FSDP_OK; step++)
        st = bench_step(b, fs, mlp, gpt, opt, tokens, x, y);
    /* data mode: every rank starts the measured steps together, and the process's CPU time
     * between that barrier and the one after them is the steps' cost, whatever runs the ranks
     * (threads or fibers) */
    if (st == FSDP_OK && b->x != NULL)
        st = fsdp_dev_barrier(dev, fsdp_dev_group_world(dev));
    if (dev->rank == 0)
        b->steps_cpu = -cpu_now();
    fsdp_sim_time_reset(dev);
    t0 = fsdp_dev_host_time(dev);
    for (int step = 0; step < b->steps && st == FSDP_OK; step++)
        st = bench_step(b, fs, mlp, gpt, opt, tokens, x, y);
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    if (st == FSDP_OK)
        st = fsdp_sim_time_stats(dev, &ts);
    if (st == FSDP_OK) {
        fsdp_mem_get_stats(fsdp_memory(fs), &ms);
        b->ops[dev->rank] = ts.n_kernels + ts.n_copies + ts.n_colls;
        b->step_time[dev->rank] = fsdp_dev_host_time(dev) - t0;
        b->peak_reserved[dev->rank] = ms.peak_reserved;
    }
    if (st == FSDP_OK && b->x != NULL)
        st = fsdp_dev_barrier(dev, fsdp_dev_group_world(dev));
    if (dev->rank == 0)
        b->steps_cpu += cpu_now();
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(gpt);
    free(tokens);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return st;
}

typedef struct bench_result {
    fsdp_status_t status;
    double wall, cpu;
    double step_cpu; /* data mode: the process's CPU seconds in the measured steps */
    uint64_t ops;
    double step_time;
    size_t peak_reserved;
} bench_result_t;

static bench_result_t bench_launch(bench_run_t *b, int world, fsdp_sim_mode_t mode, int fibers,
                                   int workers)
{
    fsdp_sim_params_t p;
    bench_result_t r;
    double w0, c0;

    memset(&r, 0, sizeof(r));
    b->ops = calloc((size_t)world, sizeof(*b->ops));
    b->step_time = calloc((size_t)world, sizeof(*b->step_time));
    b->peak_reserved = calloc((size_t)world, sizeof(*b->peak_reserved));
    if (b->ops == NULL || b->step_time == NULL || b->peak_reserved == NULL) {
        r.status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.ranks_per_node = world % 8 == 0 ? 8 : world;
    p.mode = mode;
    p.fibers = fibers;
    p.workers = workers;
    p.timeout_s = 600;
    p.represent = b->represent;
    w0 = wall_now();
    c0 = cpu_now();
    r.status = fsdp_sim_launch(&p, bench_rank, b, NULL);
    r.wall = wall_now() - w0;
    r.cpu = cpu_now() - c0;
    r.step_cpu = b->steps_cpu;
    for (int i = 0; i < world; i++) {
        r.ops += b->ops[i];
        if (b->step_time[i] > r.step_time)
            r.step_time = b->step_time[i];
        if (b->peak_reserved[i] > r.peak_reserved)
            r.peak_reserved = b->peak_reserved[i];
    }
out:
    free(b->ops);
    free(b->step_time);
    free(b->peak_reserved);
    return r;
}

/* One shape-mode FULL_SHARD step on `world` ranks: the GPT-3-175B preset (gpt != 0; one
 * sequence of `rows` tokens per rank) or its MLP stand-in (`rows` rows per rank). --quick
 * keeps 24 of the 96 blocks or units. */
static int bench_shape(int gpt, int world, int fibers, int workers, size_t rows, int quick)
{
    fsdp_gpt2_config_t cfg;
    bench_run_t b;
    bench_result_t r;
    double params = 0.0;
    char what[96];

    memset(&b, 0, sizeof(b));
    if (gpt) {
        const fsdp_gpt2_preset_t *preset = fsdp_gpt2_preset_find("gpt3-175b");
        if (preset == NULL) {
            fprintf(stderr, "bench_sim: the gpt3-175b preset is missing\n");
            return 1;
        }
        cfg = preset->cfg;
        if (quick)
            cfg.n_layer = 24;
        if (rows > (size_t)cfg.n_positions) {
            fprintf(stderr, "bench_sim: --rows %zu is longer than gpt3-175b's %d positions\n",
                    rows, cfg.n_positions);
            return 1;
        }
        b.gpt = &cfg;
        params = (double)fsdp_gpt2_num_params(&cfg);
        snprintf(what, sizeof(what), "gpt3-175b%s: %d blocks, one sequence of %zu tokens",
                 quick ? " (--quick)" : "", cfg.n_layer, rows);
    } else {
        b.nlayers = quick ? 24 : 96;
        for (int i = 0; i <= b.nlayers; i++)
            b.dims[i] = i % 2 ? 12 * 12288 : 12288;
        for (int i = 0; i < b.nlayers; i++)
            params += (double)b.dims[i] * b.dims[i + 1] + b.dims[i + 1];
        snprintf(what, sizeof(what), "mlp-175b stand-in: %d units, %zu rows", b.nlayers, rows);
    }
    b.rows = rows;
    b.strategy = FSDP_FULL_SHARD;
    b.steps = 1;
    r = bench_launch(&b, world, FSDP_SIM_SHAPE, fibers, workers);
    if (r.status != FSDP_OK) {
        fprintf(stderr, "bench_sim: the shape-mode run failed: %s\n", fsdp_status_string(r.status));
        return 1;
    }
    printf("shape mode, %s per rank, %.4g parameters, FULL_SHARD + AdamW, %d ranks as %s\n",
           what, params, world, fibers ? "fibers" : "threads");
    printf("  wall %.2f s (target <= 5 s on 2 cores), process CPU %.2f s, peak RSS so far %.2f "
           "GiB (target <= 4 GiB)\n",
           r.wall, r.cpu, peak_rss_gib());
    printf("  %llu ops simulated (%.0f per rank), %.3g rank-ops per wall second\n",
           (unsigned long long)r.ops, (double)r.ops / world, (double)r.ops / r.wall);
    printf("  simulated step time %.3f s on h100, peak reserved %.2f GiB per rank\n", r.step_time,
           (double)r.peak_reserved / (double)((size_t)1 << 30));
    return 0;
}

/* GPT-3-175B FULL_SHARD bf16 + AdamW, one step, with symmetric ranks (fsdp_sim_params_t.represent,
 * the classes derived as fsdp-plan derives them, and that derivation counted) on 1,024, 16,384
 * and 131,072 ranks (--quick: 24 blocks, the first two). What matters is each world's wall time
 * over the 1,024-rank one's of the same run: the cost should not grow with the world. Targets:
 * <= 1 s at 1,024 ranks, <= 2 s and <= 1 GiB at 16,384, <= 10 s at 131,072. */
static int bench_symmetric(int workers, size_t rows, int quick)
{
    static const int worlds[] = {1024, 16384, 131072};
    static const char *const targets[] = {"<= 1 s", "<= 2 s, <= 1 GiB", "<= 10 s"};
    const fsdp_gpt2_preset_t *preset = fsdp_gpt2_preset_find("gpt3-175b");
    fsdp_gpt2_config_t cfg;
    double base = 0.0;

    if (preset == NULL) {
        fprintf(stderr, "bench_sim: the gpt3-175b preset is missing\n");
        return 1;
    }
    cfg = preset->cfg;
    if (quick)
        cfg.n_layer = 24;
    printf("shape mode with symmetric ranks, gpt3-175b%s: %d blocks, one sequence of %zu tokens "
           "per rank, %.4g parameters, FULL_SHARD bf16 + AdamW, one step (wall: the classes and "
           "the launch)\n",
           quick ? " (--quick)" : "", cfg.n_layer, rows, (double)fsdp_gpt2_num_params(&cfg));
    printf("  %7s %9s %8s %8s %9s %9s %12s  %s\n", "ranks", "simulated", "wall s", "CPU s",
           "/ 1024", "RSS GiB", "step time s", "target");
    for (int i = 0; i < (quick ? 2 : 3); i++) {
        int world = worlds[i], n = 0;
        fsdp_sim_params_t p;
        bench_run_t b;
        bench_result_t r;
        double w0 = wall_now(), c0 = cpu_now(), wall, cpu;

        memset(&b, 0, sizeof(b));
        b.gpt = &cfg;
        b.rows = rows;
        b.strategy = FSDP_FULL_SHARD;
        b.steps = 1;
        b.bf16 = 1;
        b.represent = malloc((size_t)world * sizeof(*b.represent));
        if (b.represent == NULL) {
            fprintf(stderr, "bench_sim: out of host memory for %d ranks\n", world);
            return 1;
        }
        /* the classes, from the model built on one rank */
        b.classes_world = world;
        fsdp_sim_params_init(&p);
        p.mode = FSDP_SIM_SHAPE;
        b.ops = calloc(1, sizeof(*b.ops));
        b.step_time = calloc(1, sizeof(*b.step_time));
        b.peak_reserved = calloc(1, sizeof(*b.peak_reserved));
        r.status = b.ops != NULL && b.step_time != NULL && b.peak_reserved != NULL
                       ? fsdp_sim_launch(&p, bench_rank, &b, NULL)
                       : FSDP_ERR_NO_MEMORY;
        free(b.ops);
        free(b.step_time);
        free(b.peak_reserved);
        b.classes_world = 0;
        if (r.status == FSDP_OK)
            r = bench_launch(&b, world, FSDP_SIM_SHAPE, 1, workers);
        wall = wall_now() - w0;
        cpu = cpu_now() - c0;
        for (int q = 0; q < world && r.status == FSDP_OK; q++)
            n += b.represent[q] == q;
        free(b.represent);
        if (r.status != FSDP_OK) {
            fprintf(stderr, "bench_sim: the symmetric run on %d ranks failed: %s\n", world,
                    fsdp_status_string(r.status));
            return 1;
        }
        if (i == 0)
            base = wall;
        printf("  %7d %9d %8.3f %8.3f %9.2f %9.2f %12.3f  %s\n", world, n, wall, cpu,
               base > 0 ? wall / base : 0.0, peak_rss_gib(), r.step_time, targets[i]);
    }
    return 0;
}

/* ---- Data mode's baseline: the arithmetic alone, in one plain process -------------------- */

/* The MLP of fsdp_mlp_forward_backward (Linear, ReLU between, mean-squared error) trained with
 * no runtime at all: its parameters, gradients and AdamW state are flat host arrays, and each
 * kernel descriptor goes straight to the kernel bodies the sim backend executes
 * (fsdp_sim_kernel_exec), in the order the model issues them. No hooks, allocator, streams,
 * collectives or ranks. */
typedef struct plain_mlp {
    const int *dims;
    int nlayers;
    size_t rows, numel;
    float *param, *grad, *exp_avg, *exp_avg_sq; /* numel each: W0, b0, W1, b1, ... */
    float *act[FSDP_MLP_MAX_LAYERS + 1];        /* rows x dims[i] */
    float *dy, *dx, loss;                       /* rows x the widest layer */
    int64_t step;
} plain_mlp_t;

static fsdp_status_t plain_exec(fsdp_kernel_t *k)
{
    return fsdp_sim_kernel_exec(k);
}

static fsdp_status_t plain_gemm(int ta, int tb, size_t m, size_t n, size_t kk, const float *a,
                                size_t lda, const float *b, size_t ldb, float beta, float *c,
                                size_t ldc)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

    k.u.gemm.trans_a = ta;
    k.u.gemm.trans_b = tb;
    k.u.gemm.m = m;
    k.u.gemm.n = n;
    k.u.gemm.k = kk;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = a;
    k.u.gemm.lda = lda;
    k.u.gemm.b = b;
    k.u.gemm.ldb = ldb;
    k.u.gemm.beta = beta;
    k.u.gemm.c = c;
    k.u.gemm.ldc = ldc;
    return plain_exec(&k);
}

/* One forward and backward over `rows` rows; the gradients add into p->grad. */
static fsdp_status_t plain_pass(plain_mlp_t *p, const float *x, const float *y)
{
    const int L = p->nlayers;
    const size_t R = p->rows;
    fsdp_kernel_t k;
    fsdp_status_t st = FSDP_OK;
    size_t off[FSDP_MLP_MAX_LAYERS], o = 0;

    for (int i = 0; i < L; i++) {
        off[i] = o;
        o += (size_t)p->dims[i] * (size_t)p->dims[i + 1] + (size_t)p->dims[i + 1];
    }
    p->act[0] = (float *)x;
    for (int i = 0; i < L && st == FSDP_OK; i++) {
        size_t in = (size_t)p->dims[i], out = (size_t)p->dims[i + 1];
        const float *w = p->param + off[i], *b = w + in * out;

        st = plain_gemm(0, 1, R, out, in, p->act[i], in, w, in, 0.0f, p->act[i + 1], out);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_BIAS_ADD;
        k.u.bias_add.y = p->act[i + 1];
        k.u.bias_add.bias = b;
        k.u.bias_add.rows = R;
        k.u.bias_add.cols = out;
        if (st == FSDP_OK)
            st = plain_exec(&k);
        if (i == L - 1)
            break;
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_RELU_FWD;
        k.u.relu_fwd.y = p->act[i + 1];
        k.u.relu_fwd.x = p->act[i + 1];
        k.u.relu_fwd.n = R * out;
        if (st == FSDP_OK)
            st = plain_exec(&k);
    }
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_MSE_LOSS;
    k.u.mse.loss = &p->loss;
    k.u.mse.dy = p->dy;
    k.u.mse.y = p->act[L];
    k.u.mse.t = y;
    k.u.mse.n = R * (size_t)p->dims[L];
    k.u.mse.denom = (double)k.u.mse.n;
    if (st == FSDP_OK)
        st = plain_exec(&k);
    for (int i = L - 1; i >= 0 && st == FSDP_OK; i--) {
        size_t in = (size_t)p->dims[i], out = (size_t)p->dims[i + 1];
        float *dw = p->grad + off[i], *db = dw + in * out, *t;

        st = plain_gemm(1, 0, out, in, R, p->dy, out, p->act[i], in, 1.0f, dw, in);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_BIAS_GRAD;
        k.u.bias_grad.dbias = db;
        k.u.bias_grad.dy = p->dy;
        k.u.bias_grad.rows = R;
        k.u.bias_grad.cols = out;
        if (st == FSDP_OK)
            st = plain_exec(&k);
        if (i == 0 || st != FSDP_OK)
            break;
        st = plain_gemm(0, 0, R, in, out, p->dy, out, p->param + off[i], in, 0.0f, p->dx, in);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_RELU_BWD;
        k.u.relu_bwd.dx = p->dx;
        k.u.relu_bwd.dy = p->dx;
        k.u.relu_bwd.y = p->act[i];
        k.u.relu_bwd.n = R * in;
        if (st == FSDP_OK)
            st = plain_exec(&k);
        t = p->dy;
        p->dy = p->dx;
        p->dx = t;
    }
    return st;
}

/* One step: `micro` passes over consecutive slices of `rows` rows, the gradients averaged over
 * them, AdamW, the gradients zeroed. */
static fsdp_status_t plain_step(plain_mlp_t *p, const float *x, const float *y, int micro)
{
    fsdp_kernel_t k;
    fsdp_status_t st = FSDP_OK;

    for (int m = 0; m < micro && st == FSDP_OK; m++)
        st = plain_pass(p, x + (size_t)m * p->rows * (size_t)p->dims[0],
                        y + (size_t)m * p->rows * (size_t)p->dims[p->nlayers]);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_DIV;
    k.u.scale.x = p->grad;
    k.u.scale.n = p->numel;
    k.u.scale.alpha = (float)micro;
    if (st == FSDP_OK)
        st = plain_exec(&k);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ADAMW;
    k.u.adamw.param = p->param;
    k.u.adamw.grad = p->grad;
    k.u.adamw.exp_avg = p->exp_avg;
    k.u.adamw.exp_avg_sq = p->exp_avg_sq;
    k.u.adamw.n = p->numel;
    k.u.adamw.lr = 1e-3f;
    k.u.adamw.beta1 = 0.9f;
    k.u.adamw.beta2 = 0.999f;
    k.u.adamw.eps = 1e-8f;
    k.u.adamw.weight_decay = 0.01f;
    k.u.adamw.step = ++p->step;
    if (st == FSDP_OK)
        st = plain_exec(&k);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_FILL;
    k.u.fill.x = p->grad;
    k.u.fill.n = p->numel;
    if (st == FSDP_OK)
        st = plain_exec(&k);
    return st;
}

static void plain_free(plain_mlp_t *p)
{
    free(p->param);
    free(p->grad);
    free(p->exp_avg);
    free(p->exp_avg_sq);
    for (int i = 1; i <= p->nlayers; i++)
        free(p->act[i]);
    free(p->dy);
    free(p->dx);
}

/* The plain process's CPU seconds for b->steps steps (after b->warmup) of b->micro passes of
 * b->rows rows; a negative value on an error. */
static double plain_run(const bench_run_t *b)
{
    plain_mlp_t p;
    size_t widest = 0;
    int micro = b->micro > 0 ? b->micro : 1, ok = 1;
    fsdp_status_t st = FSDP_OK;
    double c0, cpu;

    memset(&p, 0, sizeof(p));
    p.dims = b->dims;
    p.nlayers = b->nlayers;
    p.rows = b->rows;
    for (int i = 0; i < b->nlayers; i++)
        p.numel += (size_t)b->dims[i] * (size_t)b->dims[i + 1] + (size_t)b->dims[i + 1];
    for (int i = 0; i <= b->nlayers; i++)
        widest = (size_t)b->dims[i] > widest ? (size_t)b->dims[i] : widest;
    p.param = malloc(p.numel * sizeof(float));
    p.grad = calloc(p.numel, sizeof(float));
    p.exp_avg = calloc(p.numel, sizeof(float));
    p.exp_avg_sq = calloc(p.numel, sizeof(float));
    p.dy = malloc(p.rows * widest * sizeof(float));
    p.dx = malloc(p.rows * widest * sizeof(float));
    ok = p.param != NULL && p.grad != NULL && p.exp_avg != NULL && p.exp_avg_sq != NULL &&
         p.dy != NULL && p.dx != NULL;
    for (int i = 1; i <= b->nlayers; i++)
        ok &= (p.act[i] = malloc(p.rows * (size_t)b->dims[i] * sizeof(float))) != NULL;
    if (!ok) {
        plain_free(&p);
        return -1.0;
    }
    for (size_t i = 0; i < p.numel; i++)
        p.param[i] = (float)((i * 2654435761u) % 2001) / 1000.0f * 0.02f - 0.02f;
    for (int s = 0; s < b->warmup && st == FSDP_OK; s++)
        st = plain_step(&p, b->x, b->y, micro);
    c0 = thread_cpu_now();
    for (int s = 0; s < b->steps && st == FSDP_OK; s++)
        st = plain_step(&p, b->x, b->y, micro);
    cpu = thread_cpu_now() - c0;
    plain_free(&p);
    return st == FSDP_OK ? cpu : -1.0;
}

static int bench_data(int world, size_t batch, int reps, int fibers, int workers)
{
    static const int dims[] = {512, 2048, 2048, 512};
    bench_run_t b;
    bench_result_t sim = {.status = FSDP_OK};
    double accum = 0.0, whole = 0.0;
    int rc = 0;
    char how[64];

    memset(&b, 0, sizeof(b));
    memcpy(b.dims, dims, sizeof(dims));
    b.nlayers = 3;
    b.x = calloc(batch * (size_t)dims[0], sizeof(float));
    b.y = calloc(batch * (size_t)dims[3], sizeof(float));
    if (b.x == NULL || b.y == NULL) {
        fprintf(stderr, "bench_sim: out of host memory\n");
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < batch * (size_t)dims[0]; i++)
        b.x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    b.warmup = 1;
    b.steps = 2;
    b.strategy = FSDP_FULL_SHARD;
    if (fibers)
        snprintf(how, sizeof(how), "fibers on %d worker%s", workers, workers == 1 ? "" : "s");
    else
        snprintf(how, sizeof(how), "threads");
    /* alternately, best of `reps`: a shared machine's noise only ever adds time */
    for (int rep = 0; rep < reps; rep++) {
        bench_result_t r;
        double t;
        /* (a) the simulation: W ranks, B/W rows each */
        b.rows = batch / (size_t)world;
        b.micro = 1;
        r = bench_launch(&b, world, FSDP_SIM_DATA, fibers, workers);
        if (rep == 0 || r.status != FSDP_OK || r.step_cpu < sim.step_cpu)
            sim = r;
        /* (c) the same arithmetic in one plain process: the W slices of B/W rows one after the
         * other, their gradients accumulated (a single-process reference's step) */
        b.micro = world;
        t = plain_run(&b);
        if (rep == 0 || t < 0.0 || t < accum)
            accum = t;
        /* (b) the same GEMM FLOPs in one plain process as one batch of B rows */
        b.rows = batch;
        b.micro = 1;
        t = plain_run(&b);
        if (rep == 0 || t < 0.0 || t < whole)
            whole = t;
        if (sim.status != FSDP_OK || accum < 0.0 || whole < 0.0)
            break;
    }
    if (sim.status != FSDP_OK || accum <= 0.0 || whole <= 0.0) {
        fprintf(stderr, "bench_sim: the data-mode run failed: %s%s\n",
                fsdp_status_string(sim.status),
                accum <= 0.0 || whole <= 0.0 ? " (or the plain baseline's)" : "");
        rc = 1;
        goto out;
    }
    printf("data mode: mlp:%d,%d,%d,%d, global batch %zu rows, %d steps (forward, backward, "
           "AdamW) after %d, best of %d\n",
           dims[0], dims[1], dims[2], dims[3], batch, b.steps, b.warmup, reps);
    printf("  (a) simulated, %d ranks x %zu rows (FULL_SHARD) as %s: the steps %.3f s CPU; the "
           "whole launch %.3f s CPU, %.3f s wall\n",
           world, batch / (size_t)world, how, sim.step_cpu, sim.cpu, sim.wall);
    printf("  (c) plain process, %d accumulated passes of %zu rows (the same arithmetic): the "
           "steps %.3f s CPU\n",
           world, batch / (size_t)world, accum);
    printf("  (b) plain process, one pass of %zu rows (the same FLOPs in larger GEMMs): the "
           "steps %.3f s CPU\n",
           batch, whole);
    printf("  cost of simulating %d ranks: a/c %.2fx the steps' CPU time (target <= 1.3: %s); "
           "a/b %.2fx; c/b %.2fx\n",
           world, sim.step_cpu / accum, sim.step_cpu / accum <= 1.3 ? "ok" : "OVER",
           sim.step_cpu / whole, accum / whole);
out:
    free(b.x);
    free(b.y);
    return rc;
}

int main(int argc, char **argv)
{
    int world = 1024, fibers = 1, workers = 0, data_workers, quick = 0, shape = 1, data = 1;
    int symmetric_only = 0;
    size_t rows = 2048, batch = 0; /* batch: data mode's global batch, 0 for the defaults */

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--world") == 0 && i + 1 < argc) {
            world = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) {
            workers = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            rows = (size_t)atol(argv[++i]);
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            long v = atol(argv[++i]);
            batch = v > 0 ? (size_t)v : 1; /* 1: refused below */
        } else if (strcmp(argv[i], "--threads") == 0) {
            fibers = 0;
        } else if (strcmp(argv[i], "--shape-only") == 0) {
            data = 0;
        } else if (strcmp(argv[i], "--data-only") == 0) {
            shape = 0;
        } else if (strcmp(argv[i], "--symmetric-only") == 0) {
            symmetric_only = 1;
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            i++; /* bench_gemm's flag, passed by make bench to every benchmark */
        } else {
            fprintf(stderr, "usage: bench_sim [--quick] [--world W] [--threads] [--workers N] "
                            "[--rows R] [--shape-only] [--data-only] [--symmetric-only] "
                            "[--batch B]\n");
            return 2;
        }
    }
    if (world < 1 || world > 65536 || rows < 1 || (batch != 0 && batch % 8 != 0)) {
        fprintf(stderr, "bench_sim: --world must be in [1, 65536], --rows positive and --batch "
                        "a positive multiple of 8 (data mode runs 8 ranks)\n");
        return 2;
    }
    if (quick && world == 1024)
        world = 256;
    /* data mode runs its fibers on one worker unless told otherwise: the plain process it is
     * held against has one thread */
    data_workers = workers > 0 ? workers : 1;
    /* the symmetric runs first, then the real model on every rank: each peak RSS so far is
     * its own (the symmetric runs' are far below the full run's) */
    if ((shape || symmetric_only) && fibers && bench_symmetric(workers, rows, quick) != 0)
        return 1;
    if (symmetric_only)
        return 0;
    if (shape && (bench_shape(1, world, fibers, workers, rows, quick) != 0 ||
                  bench_shape(0, world, fibers, workers, rows, quick) != 0))
        return 1;
    if (data && batch != 0)
        return bench_data(8, batch, quick ? 1 : 3, fibers, data_workers);
    /* the same arithmetic per rank, in slices of 128, 256 and 512 rows of the batch */
    if (data && (bench_data(8, quick ? 256 : 1024, quick ? 1 : 3, fibers, data_workers) != 0 ||
                 (!quick && (bench_data(8, 2048, 3, fibers, data_workers) != 0 ||
                             bench_data(8, 4096, 3, fibers, data_workers) != 0))))
        return 1;
    return 0;
}
