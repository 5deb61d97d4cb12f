/* The sim's element-wise kernels on their scalar loop and on their vector loops (sim/elem_vec.c),
 * in the same run: ns per element of adamw, gelu_fwd, gelu_bwd, add, axpy and an f32 -> bf16
 * cast on 2^20 elements, each ISA's best of several rounds (the rounds alternate the ISAs, so
 * that a noisy machine slows them alike), and the speedup over the scalar loop; the same for the
 * row kernels, column sums and Llama element passes (sim/rows_vec_tmpl.h) at the shapes of a
 * GPT-2 124M and a stories15M step, and for the fused attention's forward and backward (its lanes
 * as vectors, sim/lanes_vec_tmpl.h) on llama-tiny's, stories15M's and head_dim 128 shapes (with
 * --long, also T = 1024 and 2048 at head_dim 48, 64 and 128: keys and values past the caches).
 * Then, unless --quick, training steps (AdamW, one rank on one thread) of GPT-2 124M (B=4, T=64),
 * of a stories15M-shaped Llama (6 layers of 288, 6 heads, SwiGLU of 768, vocab 32000; B=4, T=256)
 * and of gpt2-tiny (B=32, T=64), each with the scalar loops and with the widest vectors,
 * alternated, and the ratio of their step times: the scalar run is the reference, the same step
 * with the element-wise kernels' and the fused attention's vector paths off (the same bytes; the
 * GEMMs keep their vector kernel in both).
 *
 *     bench_elem [--quick] [--long] [--rounds N] [--steps N]
 *
 * Kernel and step times are the thread's CPU time (a shared machine's other load counts less),
 * the best of the rounds, and of the steps after the first.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
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

static void *alloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (p == NULL) {
        fprintf(stderr, "bench_elem: out of memory\n");
        exit(1);
    }
    return p;
}

/* values as training sees them: small, of both signs, no NaN */
static float *values(size_t n, float scale, uint32_t seed)
{
    float *p = alloc(n * sizeof(float));
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
    }
    return p;
}

#define NISA 3
static const fsdp_sim_elem_isa_t isa_of[NISA] = {FSDP_SIM_ELEM_SCALAR, FSDP_SIM_ELEM_SSE2,
                                                 FSDP_SIM_ELEM_AVX2};
static const char *isa_name[NISA] = {"scalar", "sse2", "avx2"};

/* ns per element of k on each ISA (0: not available), best of `rounds`. Every ISA runs on the
 * same inputs: k's outputs are restored from `save` (bytes each, NULL: none) before each run. */
static void time_kernel(const char *name, const fsdp_kernel_t *k, size_t n, int rounds,
                        void *const *out, void *const *save, const size_t *bytes, int nout)
{
    double best[NISA];
    int have[NISA];

    for (int v = 0; v < NISA; v++) {
        best[v] = 1e30;
        have[v] = fsdp_sim_elem_set_isa(isa_of[v]);
    }
    for (int r = 0; r < rounds; r++) {
        for (int v = 0; v < NISA; v++) {
            double t0;
            if (!have[v])
                continue;
            for (int o = 0; o < nout; o++)
                memcpy(out[o], save[o], bytes[o]);
            fsdp_sim_elem_set_isa(isa_of[v]);
            t0 = cpu_now();
            if (fsdp_sim_kernel_exec(k) != FSDP_OK)
                exit(1);
            t0 = cpu_now() - t0;
            if (t0 < best[v])
                best[v] = t0;
        }
    }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    printf("  %-18s", name);
    for (int v = 0; v < NISA; v++) {
        if (have[v])
            printf(" %8.3f", 1e9 * best[v] / (double)n);
        else
            printf(" %8s", "-");
    }
    for (int v = 1; v < NISA; v++) {
        if (have[v])
            printf(" %8.2fx", best[0] / best[v]);
        else
            printf(" %9s", "-");
    }
    printf("\n");
}

static void bench_kernels(size_t n, int rounds)
{
    float *p = values(n, 0.2f, 1), *g = values(n, 0.01f, 2), *m = values(n, 0.001f, 3);
    float *v = values(n, 1e-4f, 4), *x = values(n, 8.0f, 5), *y = values(n, 1.0f, 6);
    float *sp = alloc(n * 4), *sm = alloc(n * 4), *sv = alloc(n * 4);
    uint16_t *h = alloc(n * 2), *hx = alloc(n * 2), *hy = alloc(n * 2);
    fsdp_kernel_t k;

    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]), hx[i] = fsdp_f32_to_bf16(x[i]), hy[i] = fsdp_f32_to_bf16(y[i]);
    memcpy(sp, p, n * 4), memcpy(sm, m, n * 4), memcpy(sv, v, n * 4);
    printf("element-wise kernels, %zu elements, ns per element (best of %d) and speedup over "
           "scalar:\n  %-18s %8s %8s %8s %9s %9s\n",
           n, rounds, "kernel", isa_name[0], isa_name[1], isa_name[2], "sse2", "avx2");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ADAMW;
    k.u.adamw.param = p, k.u.adamw.grad = g, k.u.adamw.exp_avg = m, k.u.adamw.exp_avg_sq = v;
    k.u.adamw.n = n, k.u.adamw.lr = 6e-4f, k.u.adamw.beta1 = 0.9f, k.u.adamw.beta2 = 0.95f;
    k.u.adamw.eps = 1e-8f, k.u.adamw.weight_decay = 0.1f, k.u.adamw.step = 10;
    {
        void *out[3] = {p, m, v}, *save[3] = {sp, sm, sv};
        size_t bytes[3] = {n * 4, n * 4, n * 4};
        time_kernel("adamw f32", &k, n, rounds, out, save, bytes, 3);
    }
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GELU_FWD;
    k.u.gelu_fwd.y = y, k.u.gelu_fwd.x = x, k.u.gelu_fwd.n = n, k.u.gelu_fwd.dtype = FSDP_DTYPE_F32;
    time_kernel("gelu_fwd f32", &k, n, rounds, NULL, NULL, NULL, 0);
    k.u.gelu_fwd.y = h, k.u.gelu_fwd.x = hx, k.u.gelu_fwd.dtype = FSDP_DTYPE_BF16;
    time_kernel("gelu_fwd bf16", &k, n, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GELU_BWD;
    k.u.gelu_bwd.dx = y, k.u.gelu_bwd.dy = g, k.u.gelu_bwd.x = x, k.u.gelu_bwd.n = n;
    k.u.gelu_bwd.dtype = FSDP_DTYPE_F32;
    time_kernel("gelu_bwd f32", &k, n, rounds, NULL, NULL, NULL, 0);
    k.u.gelu_bwd.dx = h, k.u.gelu_bwd.dy = hy, k.u.gelu_bwd.x = hx;
    k.u.gelu_bwd.dtype = FSDP_DTYPE_BF16;
    time_kernel("gelu_bwd bf16", &k, n, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ADD;
    k.u.add.y = y, k.u.add.a = x, k.u.add.b = g, k.u.add.n = n, k.u.add.dtype = FSDP_DTYPE_F32;
    time_kernel("add f32", &k, n, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_AXPY;
    k.u.axpy.y = y, k.u.axpy.x = g, k.u.axpy.n = n, k.u.axpy.alpha = 0.5f;
    k.u.axpy.y_dtype = FSDP_DTYPE_F32, k.u.axpy.x_dtype = FSDP_DTYPE_F32;
    time_kernel("axpy f32", &k, n, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_CAST;
    k.u.cast.dst = h, k.u.cast.src = x, k.u.cast.n = n;
    k.u.cast.dst_dtype = FSDP_DTYPE_BF16, k.u.cast.src_dtype = FSDP_DTYPE_F32;
    time_kernel("cast f32->bf16", &k, n, rounds, NULL, NULL, NULL, 0);
    free(p), free(g), free(m), free(v), free(x), free(y), free(sp), free(sm), free(sv);
    free(h), free(hx), free(hy);
}

/* The fused attention, forward and backward, on each ISA (its 32 lanes as vectors,
 * sim/lanes_vec_tmpl.h): ns per (query, key) pair that the causal mask keeps. */
static void bench_attention(const char *what, size_t B, size_t T, size_t H, size_t hd,
                            fsdp_dtype_t dt, int rounds)
{
    const size_t rows = B * T, n = rows * H * hd, pairs = B * H * T * (T + 1) / 2;
    float *q = values(n, 2.0f, 7), *kk = values(n, 2.0f, 8), *v = values(n, 1.0f, 9);
    float *o = values(n, 0.0f, 10), *dout = values(n, 0.01f, 11), *dq = alloc(n * 4);
    float *dk = alloc(n * 4), *dv = alloc(n * 4), *lse = alloc(B * H * T * 4);
    float *delta = alloc(B * H * T * 4);
    fsdp_kernel_t k;
    char name[64];

    for (size_t i = 0; dt == FSDP_DTYPE_BF16 && i < n; i++) { /* in place, as bench_gpt2 */
        ((uint16_t *)q)[i] = fsdp_f32_to_bf16(q[i]), ((uint16_t *)kk)[i] = fsdp_f32_to_bf16(kk[i]);
        ((uint16_t *)v)[i] = fsdp_f32_to_bf16(v[i]);
        ((uint16_t *)dout)[i] = fsdp_f32_to_bf16(dout[i]);
    }
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ATTENTION_FWD;
    k.u.attention_fwd = (__typeof__(k.u.attention_fwd)){
        o, lse, q, kk, v, B, T, H, H, hd, H * hd, H * hd, H * hd, H * hd, 0.125f, 1, dt};
    snprintf(name, sizeof(name), "%s fwd %s", what, fsdp_dtype_name(dt));
    time_kernel(name, &k, pairs, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ATTENTION_BWD;
    k.u.attention_bwd = (__typeof__(k.u.attention_bwd)){
        dq, dk, dv, delta, dout,   o,      q,      kk,     v,      lse, B,
        T,  H,  H,  hd,    H * hd, H * hd, H * hd, H * hd, 0.125f, 1,   dt};
    snprintf(name, sizeof(name), "%s bwd %s", what, fsdp_dtype_name(dt));
    time_kernel(name, &k, pairs, rounds, NULL, NULL, NULL, 0);
    free(q), free(kk), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
    free(delta);
}

/* The row kernels, column sums and Llama element passes (sim/rows_vec_tmpl.h) on each ISA, at
 * the shapes of a GPT-2 124M step (B=4, T=64: 256 rows of 768, 12 heads' causal scores, the
 * loss over 50257 logits of 64 rows, and loss_parallel's stages over half of them) and of a
 * stories15M step (B=4, T=256: 1024 rows of 288, SwiGLU of 768, 6 heads of 48): ns per element
 * of the kernel's largest tensor. */
static void bench_rows(int rounds)
{
    const size_t R = 256, C = 768, V = 50257, RV = 64, SR = 3072, ST = 64;
    const size_t LR = 1024, LC = 288, LF = 768, LH = 6, LD = 48;
    float *x = values(SR * ST > RV * V ? SR * ST : RV * V, 2.0f, 12), *y = values(RV * V, 1.0f, 13);
    float *dy = values(LR * LF, 0.1f, 14), *w = values(LR * LF, 1.0f, 15);
    float *b = values(C, 0.1f, 16), *dw = values(C, 0.0f, 17), *db = values(C, 0.0f, 18);
    float *st = values(LR, 0.0f, 19), *st2 = values(LR, 0.0f, 20), *tab = values(LR * LD, 1.0f, 21);
    int32_t *tg = alloc(RV * sizeof(int32_t));
    fsdp_kernel_t k;

    for (size_t i = 0; i < LR; i++)
        st[i] = 0.01f * (float)(i % 7), st2[i] = 1.0f + 0.01f * (float)(i % 5);
    for (size_t i = 0; i < RV; i++)
        tg[i] = (int32_t)((i * 7919) % V);
    printf("row kernels, column sums and Llama element passes, ns per element (best of %d) and "
           "speedup over scalar:\n",
           rounds);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_LAYERNORM_FWD;
    k.u.layernorm_fwd =
        (__typeof__(k.u.layernorm_fwd)){y, st, st2, x, w, b, R, C, 1e-5f, FSDP_DTYPE_F32};
    time_kernel("layernorm_fwd", &k, R * C, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_LAYERNORM_BWD;
    k.u.layernorm_bwd =
        (__typeof__(k.u.layernorm_bwd)){y, dw, db, dy, x, st, st2, w, R, C, 0, FSDP_DTYPE_F32};
    time_kernel("layernorm_bwd", &k, R * C, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_GRAD;
    k.u.bias_grad = (__typeof__(k.u.bias_grad)){db, dy, R, C, FSDP_DTYPE_F32, FSDP_DTYPE_F32};
    time_kernel("bias_grad", &k, R * C, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SOFTMAX_FWD;
    k.u.softmax_fwd = (__typeof__(k.u.softmax_fwd)){y, x, SR, ST, 0.125f, 1, FSDP_DTYPE_F32, 0, 0};
    time_kernel("softmax_fwd", &k, SR * ST, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SOFTMAX_BWD;
    k.u.softmax_bwd =
        (__typeof__(k.u.softmax_bwd)){w, dy, x, SR, ST, 0.125f, 1, FSDP_DTYPE_F32, 0, 0};
    time_kernel("softmax_bwd", &k, SR * ST, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_CROSS_ENTROPY;
    k.u.cross_entropy = (__typeof__(k.u.cross_entropy)){
        NULL, st, y, x, tg, RV, V, (double)RV, FSDP_DTYPE_F32, 0, NULL, 0};
    time_kernel("cross_entropy", &k, RV * V, rounds, NULL, NULL, NULL, 0);
    {
        /* loss_parallel's stages over a shard of half the vocabulary (--tp 2), stage 3 in place
         * over the logits as lm_tp.c runs it; the stats as the stages before would leave them */
        const size_t VS = V / 2 + 1;
        float *stats = alloc(3 * RV * sizeof(float)), *save = alloc(RV * VS * sizeof(float));
        void *out[1] = {x}, *sv[1] = {save};
        const size_t bytes[1] = {RV * VS * sizeof(float)};
        static const char *names[3] = {"ce_tp stage 1", "ce_tp stage 2", "ce_tp stage 3"};
        for (size_t i = 0; i < RV; i++)
            stats[i] = 1.0f, stats[RV + i] = 3000.0f, stats[2 * RV + i] = 0.5f;
        memcpy(save, x, bytes[0]);
        for (int stage = 1; stage <= 3; stage++) {
            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_CROSS_ENTROPY;
            k.u.cross_entropy = (__typeof__(k.u.cross_entropy)){stage == 3 ? y : NULL,
                                                                st,
                                                                stage == 3 ? x : NULL,
                                                                x,
                                                                tg,
                                                                RV,
                                                                VS,
                                                                (double)RV,
                                                                FSDP_DTYPE_F32,
                                                                stage,
                                                                stats,
                                                                VS};
            time_kernel(names[stage - 1], &k, RV * VS, rounds, stage == 3 ? out : NULL,
                        stage == 3 ? sv : NULL, bytes, stage == 3 ? 1 : 0);
        }
        free(stats), free(save);
    }
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RMSNORM_FWD;
    k.u.rmsnorm_fwd = (__typeof__(k.u.rmsnorm_fwd)){y, st2, x, w, LR, LC, 1e-5f, FSDP_DTYPE_F32};
    time_kernel("rmsnorm_fwd", &k, LR * LC, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RMSNORM_BWD;
    k.u.rmsnorm_bwd =
        (__typeof__(k.u.rmsnorm_bwd)){y, dw, dy, x, st2, w, LR, LC, 0, FSDP_DTYPE_F32};
    time_kernel("rmsnorm_bwd", &k, LR * LC, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SWIGLU_FWD;
    k.u.swiglu_fwd = (__typeof__(k.u.swiglu_fwd)){y, x, w, LR * LF, FSDP_DTYPE_F32};
    time_kernel("swiglu_fwd", &k, LR * LF, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SWIGLU_BWD;
    k.u.swiglu_bwd =
        (__typeof__(k.u.swiglu_bwd)){y, y + LR * LF, dy, x, w, LR * LF, FSDP_DTYPE_F32};
    time_kernel("swiglu_bwd", &k, LR * LF, rounds, NULL, NULL, NULL, 0);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ROPE_FWD;
    k.u.rope = (__typeof__(k.u.rope)){y,  x,  tab, tab + LR * LD / 2, LR,
                                      LH, LD, LR,  LH * LD,           FSDP_DTYPE_F32};
    time_kernel("rope_fwd", &k, LR * LH * LD, rounds, NULL, NULL, NULL, 0);
    free(x), free(y), free(dy), free(w), free(b), free(dw), free(db), free(st), free(st2);
    free(tab), free(tg);
}

/* ---- training steps: GPT-2 124M, a stories15M-shaped Llama, gpt2-tiny ---- */

typedef struct step_model {
    const char *name;
    const char *spec; /* fsdp_gpt2_config_parse's or, with llama, fsdp_llama_config_parse's */
    int llama;
    size_t batch, seq;
} step_model_t;

static const step_model_t step_models[] = {
    {"GPT-2 124M", "gpt2", 0, 4, 64},
    {"stories15M", "llama:layers=6,heads=6,kv_heads=6,dim=288,ffn=768,seq=256,vocab=32000", 1, 4,
     256},
    {"gpt2-tiny", "gpt2-tiny", 0, 32, 64},
};

typedef struct step_ctx {
    fsdp_tokens_t *tokens;
    const step_model_t *model;
    int steps;
    double seconds; /* the rank thread's CPU time of its fastest step after the first */
    float last_loss;
} step_ctx_t;

static fsdp_status_t step_rank(fsdp_dev_t *dev, void *arg)
{
    step_ctx_t *c = arg;
    const size_t B = c->model->batch, T = c->model->seq;
    int32_t *in = alloc(B * T * sizeof(int32_t)), *tg = alloc(B * T * sizeof(int32_t));
    fsdp_batch_spec_t spec = {B, T, dev->rank, dev->world_size, 1};
    fsdp_gpt2_config_t cfg;
    fsdp_llama_config_t lcfg;
    fsdp_optim_config_t oc;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_optim_t *opt = NULL;
    fsdp_status_t st;

    fsdp_config_init(&fc);
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    st = c->model->llama ? fsdp_llama_config_parse(c->model->spec, &lcfg)
                         : fsdp_gpt2_config_parse(c->model->spec, &cfg);
    if (st == FSDP_OK)
        st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = c->model->llama ? fsdp_llama_create(fs, &lcfg, &m) : fsdp_gpt2_create(fs, &cfg, &m);
    if (st == FSDP_OK)
        st = fsdp_lm_init_params(m, 1);
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    c->seconds = 1e30;
    for (int s = 0; s < c->steps && st == FSDP_OK; s++) {
        double t0 = cpu_now();
        st = fsdp_tokens_batch(c->tokens, &spec, s, in, tg);
        if (st == FSDP_OK)
            st = fsdp_lm_forward_backward(m, in, tg, B, T, &c->last_loss);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        t0 = cpu_now() - t0;
        if (s > 0 && t0 < c->seconds)
            c->seconds = t0;
    }
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    free(in);
    free(tg);
    return st;
}

/* CPU seconds of the fastest step after the first, on one rank and one thread */
static double run_steps(fsdp_tokens_t *t, const step_model_t *model, int steps, float *loss)
{
    step_ctx_t c = {t, model, steps, 0.0, 0.0f};
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    p.world_size = 1;
    p.threads = 1;
    if (fsdp_sim_launch(&p, step_rank, &c, NULL) != FSDP_OK)
        exit(1);
    *loss = c.last_loss;
    return c.seconds;
}

int main(int argc, char **argv)
{
    int quick = 0, longer = 0, rounds = 0, steps = 5;
    fsdp_tokens_t *t;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--long") == 0) {
            longer = 1;
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--quick] [--long] [--rounds N] [--steps N]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1)
        rounds = quick ? 3 : 15;
    if (steps < 2)
        steps = 2;
    bench_kernels((size_t)1 << 20, rounds);
    bench_rows(rounds);
    printf("fused attention (causal), ns per (query, key) pair (best of %d) and speedup over "
           "scalar:\n",
           rounds);
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16;
        bench_attention("llama-tiny", 8, 64, 4, 16, dt, rounds);  /* head_dim 16 */
        bench_attention("stories15M", 4, 256, 6, 48, dt, rounds); /* head_dim 48 */
        bench_attention("hd128", 1, 256, 2, 128, dt, rounds);     /* Llama 2 and 3's */
        for (size_t T = 1024; longer && T <= 2048; T *= 2)
            for (size_t hd = 48; hd <= 128; hd = hd == 48 ? 64 : 2 * hd) {
                char what[32];
                snprintf(what, sizeof(what), "T%zu hd%zu", T, hd);
                bench_attention(what, 1, T, 2, hd, dt, rounds);
            }
    }
    if (quick)
        return 0;
    if (corpus_open_default(argv[0], &t) != FSDP_OK)
        return 1;
    for (size_t k = 0; k < sizeof(step_models) / sizeof(step_models[0]); k++) {
        const step_model_t *mdl = &step_models[k];
        double best[2] = {1e30, 1e30};
        float loss[2];
        printf("%s, 1 rank on 1 thread, B=%zu T=%zu, AdamW: CPU s of the fastest of steps "
               "2..%d, scalar and %s loops alternated:\n",
               mdl->name, mdl->batch, mdl->seq, steps,
               (fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO), fsdp_sim_elem_isa_name()));
        for (int r = 0; r < 3; r++) {
            for (int v = 0; v < 2; v++) {
                double s;
                fsdp_sim_elem_set_isa(v == 0 ? FSDP_SIM_ELEM_SCALAR : FSDP_SIM_ELEM_AUTO);
                s = run_steps(t, mdl, steps, &loss[v]);
                printf("  %-7s %.4f s (loss after step %d: %.7f)\n", v == 0 ? "scalar" : "vector",
                       s, steps, (double)loss[v]);
                if (s < best[v])
                    best[v] = s;
            }
        }
        printf("  best: scalar %.4f s, vector %.4f s: %.3fx, %.0f tokens/s; losses %s\n", best[0],
               best[1], best[0] / best[1], (double)(mdl->batch * mdl->seq) / best[1],
               memcmp(&loss[0], &loss[1], sizeof(float)) == 0 ? "equal" : "DIFFER");
    }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    fsdp_tokens_close(t);
    return 0;
}
