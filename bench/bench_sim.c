/* What simulating ranks costs.
 *
 *     bench_sim [--quick] [--world W] [--threads] [--workers N] [--rows R] [--data-only]
 *               [--shape-only] [--batch B]
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
 * Data mode: the cost of simulating W ranks against the same arithmetic in one plain
 * process. The same MLP step (global batch B rows) runs (a) on W ranks with B/W rows each and
 * (b) on one rank with all B rows (NO_SHARD, no collectives): the same GEMM FLOPs. The ratio
 * of the step's CPU time (each rank thread's own, summed; set-up excluded) a/b is the cost of
 * simulating W ranks: all-gathers, reduce-scatters, smaller GEMMs per rank, the rendezvous.
 * Target: <= 1.3; measured at 128, 256 and 512 rows per rank (W = 8), on the shared 2-core
 * machine: 1.39-1.45, 1.16-1.19 and 1.02-1.20 (two runs; --batch B runs one global batch).
 * What remains above 1 is the work each rank does on whole unsharded buffers, which one
 * process does once: the weight-gradient GEMMs' packing and C tiles (their K is B/W; the
 * largest part at 128 rows), W gradients zero-filled and pre-divided, W all-gathered copies of
 * the parameters (forward and backward) and the reduce-scatter reading all W gradients.
 */
#include <fsdp/fsdp.h>
#include <fsdp/gpt2.h>

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

/* A rank's own CPU time: threads on a shared core do not charge each other. (With fibers a
 * rank moves between worker threads; the data-mode runs use threads.) */
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
    /* per rank */
    uint64_t *ops;
    double *step_time;
    double *step_cpu; /* the rank thread's CPU seconds in the step */
    size_t *peak_reserved;
} bench_run_t;

/* One forward and backward: the MLP over its rows, or the GPT over one sequence of `rows`
 * tokens (shape mode reads no tokens: zeros stand for them). */
static fsdp_status_t bench_forward_backward(const bench_run_t *b, fsdp_mlp_t *mlp,
                                            fsdp_gpt2_t *gpt, const int32_t *tokens,
                                            const float *x, const float *y)
{
    float loss;

    if (gpt != NULL)
        return fsdp_gpt2_forward_backward(gpt, tokens, tokens, 1, b->rows, &loss);
    return fsdp_mlp_forward_backward(mlp, x, y, b->rows, &loss);
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
    fsdp_gpt2_t *gpt = NULL;
    int32_t *tokens = NULL;
    fsdp_optim_t *opt = NULL;
    const float *x = NULL, *y = NULL;
    double t0, c0;
    fsdp_status_t st;

    fsdp_config_init(&cfg);
    cfg.strategy = b->strategy;
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
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    /* data mode: a first step (segments, optimizer state, page faults) then the measured ones */
    for (int step = 0; step < b->warmup && st == FSDP_OK; step++) {
        st = bench_forward_backward(b, mlp, gpt, tokens, x, y);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    fsdp_sim_time_reset(dev);
    t0 = dev->ops->host_time(dev);
    c0 = thread_cpu_now();
    for (int step = 0; step < b->steps && st == FSDP_OK; step++) {
        st = bench_forward_backward(b, mlp, gpt, tokens, x, y);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    if (st == FSDP_OK)
        st = dev->ops->stream_synchronize(dev, NULL);
    b->step_cpu[dev->rank] = thread_cpu_now() - c0;
    if (st == FSDP_OK)
        st = fsdp_sim_time_stats(dev, &ts);
    if (st == FSDP_OK) {
        fsdp_mem_get_stats(fsdp_memory(fs), &ms);
        b->ops[dev->rank] = ts.n_kernels + ts.n_copies + ts.n_colls;
        b->step_time[dev->rank] = dev->ops->host_time(dev) - t0;
        b->peak_reserved[dev->rank] = ms.peak_reserved;
    }
    fsdp_optim_destroy(opt);
    fsdp_gpt2_destroy(gpt);
    free(tokens);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return st;
}

typedef struct bench_result {
    fsdp_status_t status;
    double wall, cpu;
    double step_cpu; /* summed over ranks */
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
    b->step_cpu = calloc((size_t)world, sizeof(*b->step_cpu));
    b->peak_reserved = calloc((size_t)world, sizeof(*b->peak_reserved));
    if (b->ops == NULL || b->step_time == NULL || b->step_cpu == NULL || b->peak_reserved == NULL) {
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
    w0 = wall_now();
    c0 = cpu_now();
    r.status = fsdp_sim_launch(&p, bench_rank, b, NULL);
    r.wall = wall_now() - w0;
    r.cpu = cpu_now() - c0;
    for (int i = 0; i < world; i++) {
        r.ops += b->ops[i];
        r.step_cpu += b->step_cpu[i];
        if (b->step_time[i] > r.step_time)
            r.step_time = b->step_time[i];
        if (b->peak_reserved[i] > r.peak_reserved)
            r.peak_reserved = b->peak_reserved[i];
    }
out:
    free(b->ops);
    free(b->step_time);
    free(b->step_cpu);
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

static int bench_data(int world, size_t batch, int reps)
{
    static const int dims[] = {512, 2048, 2048, 512};
    bench_run_t b;
    bench_result_t sim = {.status = FSDP_OK}, plain = {.status = FSDP_OK};
    int rc = 0;

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
    /* alternately, best of `reps`: a shared machine's noise only ever adds time */
    for (int rep = 0; rep < reps; rep++) {
        bench_result_t r;
        /* (a) W ranks, B/W rows each, FULL_SHARD */
        b.rows = batch / (size_t)world;
        b.strategy = FSDP_FULL_SHARD;
        r = bench_launch(&b, world, FSDP_SIM_DATA, 0, 0);
        if (rep == 0 || r.status != FSDP_OK || r.step_cpu < sim.step_cpu)
            sim = r;
        /* (b) the same arithmetic on one rank: all B rows */
        b.rows = batch;
        r = bench_launch(&b, 1, FSDP_SIM_DATA, 0, 0);
        if (rep == 0 || r.status != FSDP_OK || r.step_cpu < plain.step_cpu)
            plain = r;
        if (sim.status != FSDP_OK || plain.status != FSDP_OK)
            break;
    }
    if (sim.status != FSDP_OK || plain.status != FSDP_OK) {
        fprintf(stderr, "bench_sim: the data-mode run failed: %s / %s\n",
                fsdp_status_string(sim.status), fsdp_status_string(plain.status));
        rc = 1;
        goto out;
    }
    printf("data mode: mlp:%d,%d,%d,%d, global batch %zu rows, %d steps (forward, backward, "
           "AdamW) after %d, best of %d\n",
           dims[0], dims[1], dims[2], dims[3], batch, b.steps, b.warmup, reps);
    printf("  %d ranks x %zu rows (FULL_SHARD): the steps %.3f s CPU (summed over ranks); the "
           "whole launch %.3f s CPU, %.3f s wall\n",
           world, batch / (size_t)world, sim.step_cpu, sim.cpu, sim.wall);
    printf("  1 rank x %zu rows (same GEMM FLOPs): the steps %.3f s CPU; the whole launch %.3f "
           "s CPU, %.3f s wall\n",
           batch, plain.step_cpu, plain.cpu, plain.wall);
    printf("  cost of simulating %d ranks: %.2fx the steps' CPU time (target <= 1.3); %.2fx "
           "the whole launch's (set-up included: every rank draws the full initial weights, "
           "and the first step allocates %d unsharded copies)\n",
           world, sim.step_cpu / plain.step_cpu, sim.cpu / plain.cpu, world);
out:
    free(b.x);
    free(b.y);
    return rc;
}

int main(int argc, char **argv)
{
    int world = 1024, fibers = 1, workers = 0, quick = 0, shape = 1, data = 1;
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
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            i++; /* bench_gemm's flag, passed by make bench to every benchmark */
        } else {
            fprintf(stderr, "usage: bench_sim [--quick] [--world W] [--threads] [--workers N] "
                            "[--rows R] [--shape-only] [--data-only] [--batch B]\n");
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
    /* the real model first: the process's peak RSS is its own */
    if (shape && (bench_shape(1, world, fibers, workers, rows, quick) != 0 ||
                  bench_shape(0, world, fibers, workers, rows, quick) != 0))
        return 1;
    if (data && batch != 0)
        return bench_data(8, batch, quick ? 1 : 3);
    /* the same arithmetic per rank, in slices of 128, 256 and 512 rows of the batch */
    if (data && (bench_data(8, quick ? 256 : 1024, quick ? 1 : 3) != 0 ||
                 (!quick && (bench_data(8, 2048, 3) != 0 || bench_data(8, 4096, 3) != 0))))
        return 1;
    return 0;
}
