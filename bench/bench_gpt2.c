/* The sim's GPT-2: host throughput of each transformer kernel on the shapes of gpt2-tiny and
 * GPT-2 124M, in f32 and in bf16 (the loads and stores through the dtype), then whole training
 * steps of gpt2-tiny (forward, backward, AdamW) on 1 and 4 simulated ranks, in tokens per second,
 * in f32 and under bf16 mixed precision, with the ratio of the two step times; then llama-tiny's
 * steps against gpt2-tiny's in the same run (both 2 layers of width 64, 64 tokens, 256 ids;
 * llama-tiny's SwiGLU of 176 and untied head make it 125,248 parameters to GPT-2's 120,576),
 * with the ratio of their step times.
 *
 *     bench_gpt2 [--quick]
 *
 * Kernel times are the thread's CPU time, best of several repetitions; step rates are wall
 * time over the whole run (the ranks share the machine's cores).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp/fsdp.h>

#include "corpus.h"
#include "sim_kernels.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *buf(size_t n, float v)
{
    float *p = malloc(n * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "bench_gpt2: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = v + 0.001f * (float)(i % 977);
    return p;
}

/* The first n floats of p rewritten as n values of dt, in place (element i of dt ends before
 * float i, which is read before anything at or after it is written). */
static void to_dtype(float *p, size_t n, fsdp_dtype_t dt)
{
    for (size_t i = 0; dt != FSDP_DTYPE_F32 && i < n; i++)
        ((uint16_t *)p)[i] = dt == FSDP_DTYPE_BF16 ? fsdp_f32_to_bf16(p[i]) : fsdp_f32_to_f16(p[i]);
}

/* best CPU time of `reps` runs of k, in seconds */
static double time_kernel(const fsdp_kernel_t *k, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_now();
        if (fsdp_sim_kernel_exec(k) != FSDP_OK)
            exit(1);
        double t = cpu_now() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

static void bench_kernels(const char *what, size_t B, size_t T, size_t C, size_t H, size_t V,
                          fsdp_dtype_t dt, int reps)
{
    const size_t n = B * T, att = B * H * T * T;
    float *x = buf(n * 4 * C, 0.1f), *y = buf(n * 4 * C, 0.0f), *w = buf(4 * C, 1.0f);
    float *b = buf(4 * C, 0.0f), *mean = buf(n, 0.0f), *rstd = buf(n, 1.0f);
    float *a = buf(att, 0.01f), *logits = buf(n * V, 0.0f), *losses = buf(n, 0.0f);
    float *dw = buf(4 * C, 0.0f), *db = buf(4 * C, 0.0f), *wte = buf(V * C, 0.0f), loss;
    int32_t *tok = malloc(n * sizeof(int32_t));
    const float div = dt == FSDP_DTYPE_F32 ? 0.0f : 8.0f; /* the model's sqrt(64) in 16 bits */
    fsdp_kernel_t k;
    double t;

    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)(i * 7 % V);
    to_dtype(x, n * 4 * C, dt), to_dtype(y, n * 4 * C, dt), to_dtype(w, 4 * C, dt);
    to_dtype(b, 4 * C, dt), to_dtype(a, att, dt), to_dtype(logits, n * V, dt);
    to_dtype(dw, 4 * C, dt), to_dtype(db, 4 * C, dt), to_dtype(wte, V * C, dt);
    printf("%s (B=%zu T=%zu C=%zu H=%zu V=%zu) in %s, ns per element:\n", what, B, T, C, H, V,
           fsdp_dtype_name(dt));
#define ROW(name, count) printf("  %-16s %8.2f\n", name, 1e9 * t / (double)(count))
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_LAYERNORM_FWD;
    k.u.layernorm_fwd = (__typeof__(k.u.layernorm_fwd)){y, mean, rstd, x, w, b, n, C, 1e-5f, dt};
    t = time_kernel(&k, reps);
    ROW("layernorm_fwd", n * C);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_LAYERNORM_BWD;
    k.u.layernorm_bwd =
        (__typeof__(k.u.layernorm_bwd)){y, dw, db, x, x + n * C, mean, rstd, w, n, C, 1, dt};
    t = time_kernel(&k, reps);
    ROW("layernorm_bwd", n * C);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GELU_FWD;
    k.u.gelu_fwd = (__typeof__(k.u.gelu_fwd)){y, x, n * 4 * C, dt};
    t = time_kernel(&k, reps);
    ROW("gelu_fwd", n * 4 * C);
    k.kind = FSDP_K_GELU_BWD;
    k.u.gelu_bwd = (__typeof__(k.u.gelu_bwd)){y, y, x, n * 4 * C, dt};
    t = time_kernel(&k, reps);
    ROW("gelu_bwd", n * 4 * C);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SOFTMAX_FWD;
    k.u.softmax_fwd = (__typeof__(k.u.softmax_fwd)){a, a, B * H * T, T, 0.125f, 1, dt, div, 0};
    t = time_kernel(&k, reps);
    ROW("softmax_fwd", att);
    k.kind = FSDP_K_SOFTMAX_BWD;
    k.u.softmax_bwd = (__typeof__(k.u.softmax_bwd)){y, x, a, B * H * T, T, 0.125f, 1, dt, div, 0};
    if (att <= n * 4 * C) {
        t = time_kernel(&k, reps);
        ROW("softmax_bwd", att);
    }
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_EMBEDDING_FWD;
    k.u.embedding_fwd = (__typeof__(k.u.embedding_fwd)){y, tok, wte, x, n, C, T, V, dt, 0};
    t = time_kernel(&k, reps);
    ROW("embedding_fwd", n * C);
    k.kind = FSDP_K_EMBEDDING_BWD;
    k.u.embedding_bwd = (__typeof__(k.u.embedding_bwd)){wte, y, x, tok, n, C, T, V, dt};
    t = time_kernel(&k, reps);
    ROW("embedding_bwd", n * C);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_CROSS_ENTROPY;
    k.u.cross_entropy = (__typeof__(k.u.cross_entropy)){&loss, losses,    logits, logits, tok,  n,
                                                        V,     (double)n, dt,     0,      NULL, 0};
    t = time_kernel(&k, reps);
    ROW("cross_entropy", n * V);
#undef ROW
    free(x), free(y), free(w), free(b), free(mean), free(rstd), free(a), free(logits);
    free(losses), free(dw), free(db), free(wte), free(tok);
}

/* ---- training steps of gpt2-tiny ---- */

typedef struct step_ctx {
    fsdp_tokens_t *tokens;
    int steps;
    size_t batch, seq;
    fsdp_dtype_t param_dtype; /* FSDP_DTYPE_UNSET: f32 */
    int llama;                /* llama-tiny, else gpt2-tiny */
} step_ctx_t;

static fsdp_status_t step_rank(fsdp_dev_t *dev, void *arg)
{
    step_ctx_t *c = arg;
    size_t rows = c->batch / (size_t)dev->world_size;
    int32_t *in = malloc(rows * c->seq * sizeof(int32_t)), *tg = malloc(rows * c->seq * 4);
    fsdp_batch_spec_t spec = {c->batch, c->seq, dev->rank, dev->world_size, 1};
    fsdp_gpt2_config_t cfg;
    fsdp_llama_config_t lcfg;
    fsdp_optim_config_t oc;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL; /* GPT-2 or Llama */
    fsdp_optim_t *opt = NULL;
    fsdp_status_t st;

    fsdp_config_init(&fc);
    fc.mixed_precision.param_dtype = c->param_dtype;
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    fsdp_gpt2_config_parse("gpt2-tiny", &cfg);
    fsdp_llama_config_parse("llama-tiny", &lcfg);
    st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = c->llama ? fsdp_llama_create(fs, &lcfg, &m) : fsdp_gpt2_create(fs, &cfg, &m);
    if (st == FSDP_OK)
        st = fsdp_lm_init_params(m, 1);
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    for (int s = 0; s < c->steps && st == FSDP_OK; s++) {
        float loss;
        st = fsdp_tokens_batch(c->tokens, &spec, s, in, tg);
        if (st == FSDP_OK)
            st = fsdp_lm_forward_backward(m, in, tg, rows, c->seq, &loss);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    free(in);
    free(tg);
    return st;
}

/* the step rate under param_dtype (FSDP_DTYPE_UNSET: f32); returns seconds per step */
static double bench_steps(fsdp_tokens_t *t, int world, int steps, fsdp_dtype_t param_dtype,
                          int llama)
{
    step_ctx_t c = {t, steps, 32, 64, param_dtype, llama};
    fsdp_sim_params_t p;
    double t0, dt;

    fsdp_sim_params_init(&p);
    p.world_size = world;
    t0 = wall_now();
    if (fsdp_sim_launch(&p, step_rank, &c, NULL) != FSDP_OK)
        exit(1);
    dt = wall_now() - t0;
    printf("%s, %d rank%s full_shard, batch 32 x 64, %s: %.1f ms per step, %.0f tokens/s\n",
           llama ? "llama-tiny" : "gpt2-tiny", world, world > 1 ? "s" : "",
           param_dtype == FSDP_DTYPE_UNSET ? "f32" : fsdp_dtype_name(param_dtype), 1e3 * dt / steps,
           (double)steps * 32 * 64 / dt);
    return dt / steps;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    fsdp_tokens_t *t;

    if (argc > 1 && !quick) {
        fprintf(stderr, "usage: bench_gpt2 [--quick]\n");
        return 2;
    }
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16;
        bench_kernels("gpt2-tiny", 8, 64, 64, 2, 256, dt, quick ? 3 : 10);
        if (!quick)
            bench_kernels("gpt2 124M", 4, 256, 768, 12, 50257, dt, 2);
    }
    if (corpus_open_default(argv[0], &t) != FSDP_OK)
        return 1;
    for (int w = 1; w <= 4; w += 3) { /* bf16 against f32 in this run: loads and stores cost */
        double f32 = bench_steps(t, w, quick ? 5 : 20, FSDP_DTYPE_UNSET, 0);
        double bf16 = bench_steps(t, w, quick ? 5 : 20, FSDP_DTYPE_BF16, 0);
        printf("  bf16 / f32 step time on %d rank%s: %.2f\n", w, w > 1 ? "s" : "", bf16 / f32);
    }
    for (int w = 1; w <= 4; w += 3) { /* llama-tiny against gpt2-tiny of its width, f32 */
        double gpt = bench_steps(t, w, quick ? 5 : 20, FSDP_DTYPE_UNSET, 0);
        double llama = bench_steps(t, w, quick ? 5 : 20, FSDP_DTYPE_UNSET, 1);
        printf("  llama-tiny / gpt2-tiny step time on %d rank%s: %.2f\n", w, w > 1 ? "s" : "",
               llama / gpt);
    }
    fsdp_tokens_close(t);
    return 0;
}
