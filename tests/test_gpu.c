/* The gpu backend on a world of one: memory, streams and events, every kernel against the host
 * (the sim's executor when the library has it, else a host loop over the same shared bodies),
 * GEMM against a double-precision reference, and the collectives and splits of one rank.
 *
 * Exits 77 (skipped) when the gpu backend module is not loaded or no device is visible, unless
 * FSDP_REQUIRE_GPU is set (make check-gpu): then that is a failure. The checks that need no
 * device (a complete ops table, init failing cleanly) run first either way. */
#include <fsdp/fsdp.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel_elem.h"
#include "kernels/llama_bodies.h"
#include "module.h"
#include "test_util.h"

/* The sim's kernel executor (sim/sim_kernels.h) is internal to the library: looked up weakly,
 * so this test also builds against a library that does not have it yet. */
extern fsdp_status_t fsdp_sim_kernel_exec(const fsdp_kernel_t *k) __attribute__((weak));

/* The rank that prefixes the backend's messages (gpu/error.c) is internal to the module: reached
 * through its entry table (gpu/module.h), from the module libfsdp loaded. NULL without one. */
static const fsdp_gpu_module_t *loaded_module(void)
{
    fsdp_gpu_module_func_t entry;
    const char *path = fsdp_gpu_module_path();
    void *handle, *sym;

    if (path == NULL)
        return NULL;
    handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    sym = handle != NULL ? dlsym(handle, FSDP_GPU_MODULE_SYMBOL) : NULL;
    if (sym == NULL)
        return NULL;
    memcpy(&entry, &sym, sizeof(entry));
    return entry();
}

static fsdp_dev_t *dev;
static const fsdp_backend_ops_t *ops;

/* ---- helpers ---- */

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;

static float rnd(float lo, float hi)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng_state >> 40) & 0xffffff) / 16777216.0f;
}

static void fill_random(void *p, fsdp_dtype_t dtype, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        float v = rnd(lo, hi);
        if (dtype == FSDP_DTYPE_I32)
            ((int32_t *)p)[i] = (int32_t)(v * 1000.0f);
        else
            fsdp_kb_store(p, dtype, i, v);
    }
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, bytes, &p), FSDP_OK);
    return p;
}

static void dfree(void *p)
{
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, p);
}

static void h2d(void *d, const void *h, size_t bytes)
{
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_memcpy_async(dev, d, h, bytes, s), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_stream_synchronize(dev, s), FSDP_OK);
}

static void d2h(void *h, const void *d, size_t bytes)
{
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_memcpy_async(dev, h, d, bytes, s), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_stream_synchronize(dev, s), FSDP_OK);
}

/* Keeps expected error lines out of the test output. */
static void quiet(fsdp_log_level_t level, const char *file, int line, const char *func,
                  const char *msg, void *arg)
{
    (*(int *)arg)++;
}

/* ---- kernels: the GPU against the host, buffer by buffer ---- */

#define MAX_BUFS 12

typedef struct kcase {
    fsdp_kernel_t k; /* host pointers */
    int nbufs;
    struct {
        void *h;
        void *d;
        size_t bytes;
    } buf[MAX_BUFS];
} kcase_t;

/* Adds a host buffer of n elements (random in [lo, hi)) and returns it. */
static void *kbuf(kcase_t *c, fsdp_dtype_t dtype, size_t n, float lo, float hi)
{
    size_t bytes = (n > 0 ? n : 1) * fsdp_dtype_size(dtype);
    void *h = malloc(bytes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    memset(h, 0, bytes);
    fill_random(h, dtype, n, lo, hi);
    CU_ASSERT_FATAL(c->nbufs < MAX_BUFS);
    c->buf[c->nbufs].h = h;
    c->buf[c->nbufs].d = NULL;
    c->buf[c->nbufs].bytes = bytes;
    c->nbufs++;
    return h;
}

static void *to_dev_ptr(const kcase_t *c, const void *h)
{
    if (h == NULL)
        return NULL;
    for (int i = 0; i < c->nbufs; i++) {
        if (c->buf[i].h == h)
            return c->buf[i].d;
    }
    CU_FAIL("pointer of the descriptor is not a buffer of the case");
    return NULL;
}

/* A pointer into a buffer of the case (a group_copy part's), on the device. */
static void *to_dev_inner(const kcase_t *c, const void *h)
{
    for (int i = 0; h != NULL && i < c->nbufs; i++) {
        const char *b = c->buf[i].h;
        if ((const char *)h >= b && (const char *)h < b + c->buf[i].bytes)
            return (char *)c->buf[i].d + ((const char *)h - b);
    }
    CU_ASSERT_PTR_NULL(h);
    return NULL;
}

#define MAX_PARTS 64

/* The same descriptor with device pointers (a group_copy's table with them: host memory, as
 * the runtime's). */
static fsdp_kernel_t device_kernel(const kcase_t *c)
{
    static fsdp_copy_part_t dparts[MAX_PARTS];
    fsdp_kernel_t k = c->k;

    if (k.kind == FSDP_K_GROUP_COPY) {
        CU_ASSERT_FATAL(k.u.group_copy.nparts <= MAX_PARTS);
        for (size_t j = 0; j < k.u.group_copy.nparts; j++) {
            dparts[j] = k.u.group_copy.parts[j];
            dparts[j].dst = to_dev_inner(c, dparts[j].dst);
            dparts[j].src = to_dev_inner(c, dparts[j].src);
        }
        k.u.group_copy.parts = dparts;
        return k;
    }
#define MAP_(field) k.u.field = to_dev_ptr(c, c->k.u.field)
    switch (k.kind) {
    case FSDP_K_FILL:
        MAP_(fill.x);
        break;
    case FSDP_K_CAST:
        MAP_(cast.dst);
        MAP_(cast.src);
        break;
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
        MAP_(scale.x);
        break;
    case FSDP_K_AXPY:
        MAP_(axpy.y);
        MAP_(axpy.x);
        break;
    case FSDP_K_GEMM:
        MAP_(gemm.a);
        MAP_(gemm.b);
        MAP_(gemm.c);
        break;
    case FSDP_K_BIAS_ADD:
        MAP_(bias_add.y);
        MAP_(bias_add.bias);
        break;
    case FSDP_K_BIAS_GRAD:
        MAP_(bias_grad.dbias);
        MAP_(bias_grad.dy);
        break;
    case FSDP_K_RELU_FWD:
        MAP_(relu_fwd.y);
        MAP_(relu_fwd.x);
        break;
    case FSDP_K_RELU_BWD:
        MAP_(relu_bwd.dx);
        MAP_(relu_bwd.dy);
        MAP_(relu_bwd.y);
        break;
    case FSDP_K_MSE_LOSS:
        MAP_(mse.loss);
        MAP_(mse.dy);
        MAP_(mse.y);
        MAP_(mse.t);
        break;
    case FSDP_K_ADAMW:
        MAP_(adamw.param);
        MAP_(adamw.grad);
        MAP_(adamw.exp_avg);
        MAP_(adamw.exp_avg_sq);
        break;
    case FSDP_K_SGD:
        MAP_(sgd.param);
        MAP_(sgd.grad);
        MAP_(sgd.momentum_buf);
        break;
    case FSDP_K_SUMSQ:
        MAP_(sumsq.out);
        MAP_(sumsq.x);
        break;
    case FSDP_K_LAYERNORM_FWD:
        MAP_(layernorm_fwd.y);
        MAP_(layernorm_fwd.mean);
        MAP_(layernorm_fwd.rstd);
        MAP_(layernorm_fwd.x);
        MAP_(layernorm_fwd.weight);
        MAP_(layernorm_fwd.bias);
        break;
    case FSDP_K_LAYERNORM_BWD:
        MAP_(layernorm_bwd.dx);
        MAP_(layernorm_bwd.dweight);
        MAP_(layernorm_bwd.dbias);
        MAP_(layernorm_bwd.dy);
        MAP_(layernorm_bwd.x);
        MAP_(layernorm_bwd.mean);
        MAP_(layernorm_bwd.rstd);
        MAP_(layernorm_bwd.weight);
        break;
    case FSDP_K_SOFTMAX_FWD:
        MAP_(softmax_fwd.y);
        MAP_(softmax_fwd.x);
        break;
    case FSDP_K_SOFTMAX_BWD:
        MAP_(softmax_bwd.dx);
        MAP_(softmax_bwd.dy);
        MAP_(softmax_bwd.y);
        break;
    case FSDP_K_EMBEDDING_BWD:
        MAP_(embedding_bwd.dwte);
        MAP_(embedding_bwd.dwpe);
        MAP_(embedding_bwd.dy);
        MAP_(embedding_bwd.tokens);
        break;
    case FSDP_K_CROSS_ENTROPY:
        MAP_(cross_entropy.loss);
        MAP_(cross_entropy.losses);
        MAP_(cross_entropy.dlogits);
        MAP_(cross_entropy.logits);
        MAP_(cross_entropy.targets);
        break;
    case FSDP_K_RMSNORM_FWD:
        MAP_(rmsnorm_fwd.y);
        MAP_(rmsnorm_fwd.rstd);
        MAP_(rmsnorm_fwd.x);
        MAP_(rmsnorm_fwd.weight);
        break;
    case FSDP_K_RMSNORM_BWD:
        MAP_(rmsnorm_bwd.dx);
        MAP_(rmsnorm_bwd.dweight);
        MAP_(rmsnorm_bwd.dy);
        MAP_(rmsnorm_bwd.x);
        MAP_(rmsnorm_bwd.rstd);
        MAP_(rmsnorm_bwd.weight);
        break;
    case FSDP_K_ROPE_FWD:
    case FSDP_K_ROPE_BWD:
        MAP_(rope.y);
        MAP_(rope.x);
        MAP_(rope.cos);
        MAP_(rope.sin);
        break;
    case FSDP_K_SWIGLU_FWD:
        MAP_(swiglu_fwd.y);
        MAP_(swiglu_fwd.gate);
        MAP_(swiglu_fwd.up);
        break;
    case FSDP_K_SWIGLU_BWD:
        MAP_(swiglu_bwd.dgate);
        MAP_(swiglu_bwd.dup);
        MAP_(swiglu_bwd.dy);
        MAP_(swiglu_bwd.gate);
        MAP_(swiglu_bwd.up);
        break;
    case FSDP_K_ATTENTION_FWD:
        MAP_(attention_fwd.o);
        MAP_(attention_fwd.lse);
        MAP_(attention_fwd.q);
        MAP_(attention_fwd.k);
        MAP_(attention_fwd.v);
        break;
    case FSDP_K_ATTENTION_BWD:
        MAP_(attention_bwd.dq);
        MAP_(attention_bwd.dk);
        MAP_(attention_bwd.dv);
        MAP_(attention_bwd.delta);
        MAP_(attention_bwd.dout);
        MAP_(attention_bwd.o);
        MAP_(attention_bwd.q);
        MAP_(attention_bwd.k);
        MAP_(attention_bwd.v);
        MAP_(attention_bwd.lse);
        break;
    default:
        break;
    }
#undef MAP_
    return k;
}

/* The host's answer through the shared bodies: what the sim's loops do. */
static void host_exec(const fsdp_kernel_t *k)
{
    fsdp_kb_prep_t p;
    double acc = 0.0;

    if (fsdp_kb_llama_kind(k->kind)) { /* each pass's rows, lanes and column blocks in order */
        fsdp_kb_llama_host(k);
        return;
    }
    fsdp_kb_prepare(k, &p);
    if (k->kind >= FSDP_K_LAYERNORM_FWD &&
        k->kind <= FSDP_K_ADD) { /* the sim's loops (sim/kernels.c) */
        const size_t chunks = fsdp_kb_nn_chunks(k), rows = fsdp_kb_nn_rows(k);
        fsdp_kb_colsum(k);
        for (size_t c = 0; c < chunks; c++)
            fsdp_kb_nn_cols(k->kind, k, c);
        for (size_t r = 0; r < rows; r++)
            fsdp_kb_nn_row(k->kind, k, p.ce_scale, r);
        if (k->kind == FSDP_K_CROSS_ENTROPY && k->u.cross_entropy.loss != NULL)
            k->u.cross_entropy.loss[0] =
                (float)(fsdp_kb_reduce_sum(k, k->u.cross_entropy.rows, fsdp_kb_cross_entropy_term) /
                        k->u.cross_entropy.denom);
    }
    switch (k->kind) {
    case FSDP_K_BIAS_GRAD:
        fsdp_kb_colsum(k);
        return;
    case FSDP_K_SUMSQ:
        for (size_t i = 0; i < k->u.sumsq.n; i++)
            acc += fsdp_kb_sumsq_term(k, i);
        k->u.sumsq.out[0] = (float)acc;
        return;
    case FSDP_K_MSE_LOSS:
        for (size_t i = 0; i < k->u.mse.n; i++)
            acc += fsdp_kb_mse_term(k, i);
        k->u.mse.loss[0] = (float)(acc / k->u.mse.denom);
        break;
    default:
        break;
    }
    for (size_t i = 0; i < p.n; i++)
        fsdp_kb_elem(k->kind, k, &p, i);
}

/* Which buffer (index) holds a reduction's scalar result, compared with a tolerance. */
static int scalar_buf(const kcase_t *c)
{
    const void *h = c->k.kind == FSDP_K_SUMSQ      ? (const void *)c->k.u.sumsq.out
                    : c->k.kind == FSDP_K_MSE_LOSS ? (const void *)c->k.u.mse.loss
                                                   : NULL;
    for (int i = 0; i < c->nbufs; i++) {
        if (h != NULL && c->buf[i].h == h)
            return i;
    }
    return -1;
}

static void compare(const kcase_t *c, void *const *got, const char *who)
{
    int sb = scalar_buf(c);
    for (int i = 0; i < c->nbufs; i++) {
        if (i == sb) {
            float want = *(const float *)c->buf[i].h, have = *(const float *)got[i];
            double tol = 1e-6 * fabs((double)want) + 1e-30;
            if (!(fabs((double)have - (double)want) <= tol))
                fprintf(stderr, "\n  %s %s: scalar %.9g vs host %.9g\n",
                        fsdp_kernel_name(c->k.kind), who, (double)have, (double)want);
            CU_ASSERT(fabs((double)have - (double)want) <= tol);
            continue;
        }
        if (memcmp(c->buf[i].h, got[i], c->buf[i].bytes) != 0) {
            size_t b = 0;
            while (((const unsigned char *)c->buf[i].h)[b] == ((const unsigned char *)got[i])[b])
                b++;
            fprintf(stderr, "\n  %s %s: buffer %d differs from byte %zu of %zu\n",
                    fsdp_kernel_name(c->k.kind), who, i, b, c->buf[i].bytes);
            CU_FAIL("GPU result differs from the host's bits");
        }
    }
}

/* sumsq and mse_loss: the host's replay of the GPU's fixed summation tree, which must give the
 * very bits the GPU gives. 0 for the other kinds. */
static int tree_scalar(const kcase_t *c, float *out)
{
    const fsdp_kernel_t *k = &c->k;
    if (k->kind == FSDP_K_SUMSQ)
        *out = (float)(fsdp_kb_reduce_sum(k, k->u.sumsq.n, fsdp_kb_sumsq_term) / 1.0);
    else if (k->kind == FSDP_K_MSE_LOSS)
        *out = (float)(fsdp_kb_reduce_sum(k, k->u.mse.n, fsdp_kb_mse_term) / k->u.mse.denom);
    else
        return 0;
    return 1;
}

/* Uploads the buffers, runs the kernel on the GPU, runs the host, compares every buffer, and
 * frees the case. */
static void run_case(kcase_t *c)
{
    void *got[MAX_BUFS], *init[MAX_BUFS];
    float tree = 0.0f;
    fsdp_kernel_t kd;
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);

    for (int i = 0; i < c->nbufs; i++) {
        c->buf[i].d = dalloc(c->buf[i].bytes);
        h2d(c->buf[i].d, c->buf[i].h, c->buf[i].bytes);
        got[i] = malloc(c->buf[i].bytes);
        init[i] = malloc(c->buf[i].bytes);
        CU_ASSERT_PTR_NOT_NULL_FATAL(got[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(init[i]);
        memcpy(init[i], c->buf[i].h, c->buf[i].bytes);
    }
    kd = device_kernel(c);
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &kd), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_stream_synchronize(dev, s), FSDP_OK);
    for (int i = 0; i < c->nbufs; i++)
        d2h(got[i], c->buf[i].d, c->buf[i].bytes);
    if (tree_scalar(c, &tree)) {
        int sb = scalar_buf(c);
        CU_ASSERT_FATAL(sb >= 0);
        if (memcmp(&tree, got[sb], sizeof(float)) != 0)
            fprintf(stderr, "\n  %s: GPU %.9g, host replay of its tree %.9g\n",
                    fsdp_kernel_name(c->k.kind), (double)*(const float *)got[sb], (double)tree);
        CU_ASSERT(memcmp(&tree, got[sb], sizeof(float)) == 0);
    }

    if (fsdp_sim_kernel_exec != NULL && c->k.kind != FSDP_K_GEMM) {
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&c->k), FSDP_OK);
        compare(c, got, "vs fsdp_sim_kernel_exec");
        for (int i = 0; i < c->nbufs; i++)
            memcpy(c->buf[i].h, init[i], c->buf[i].bytes);
    }
    host_exec(&c->k);
    compare(c, got, "vs the shared bodies on the host");

    for (int i = 0; i < c->nbufs; i++) {
        dfree(c->buf[i].d);
        free(c->buf[i].h);
        free(got[i]);
        free(init[i]);
    }
    c->nbufs = 0;
}

static void test_ops_table(void)
{
    CU_ASSERT_EQUAL(fsdp_backend_check(fsdp_gpu_backend()), FSDP_OK);
    CU_ASSERT_PTR_EQUAL(dev->ops, fsdp_gpu_backend());
    CU_ASSERT(fsdp_dev_is_gpu(dev));
    CU_ASSERT_STRING_EQUAL(ops->name, "gpu");
    CU_ASSERT_EQUAL(dev->rank, 0);
    CU_ASSERT_EQUAL(dev->world_size, 1);
    CU_ASSERT_EQUAL(dev->local_size, 1);
    CU_ASSERT_EQUAL(fsdp_dev_compute_stream(dev)->id, 0);
}

static void test_fill_cast(void)
{
    const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16, FSDP_DTYPE_I32};
    const size_t n = 100003;
    kcase_t c;

    for (int d = 0; d < 4; d++) {
        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_FILL;
        c.k.u.fill.x = kbuf(&c, dts[d], n, -1, 1);
        c.k.u.fill.dtype = dts[d];
        c.k.u.fill.n = n - 3; /* leaves a tail untouched */
        c.k.u.fill.value = d == 3 ? 123456789.0 : 0.1;
        run_case(&c);
    }
    for (int sd = 0; sd < 4; sd++) {
        for (int dd = 0; dd < 4; dd++) {
            memset(&c, 0, sizeof(c));
            c.k.kind = FSDP_K_CAST;
            c.k.u.cast.src = kbuf(&c, dts[sd], n, -70000.0f, 70000.0f);
            c.k.u.cast.src_dtype = dts[sd];
            c.k.u.cast.dst = kbuf(&c, dts[dd], n, 0, 0);
            c.k.u.cast.dst_dtype = dts[dd];
            c.k.u.cast.n = n;
            if (dts[sd] == FSDP_DTYPE_F32) { /* the rounding corners */
                float *x = (float *)c.k.u.cast.src;
                x[0] = NAN;
                x[1] = INFINITY;
                x[2] = -0.0f;
                x[3] = 1e-40f;   /* f32 subnormal */
                x[4] = 6e-8f;    /* near the smallest f16 subnormal */
                x[5] = 65520.0f; /* rounds to f16 infinity */
                x[6] = 1.0f + 0x1p-8f;
                if (dts[dd] == FSDP_DTYPE_I32)
                    x[0] = x[1] = 0.0f; /* f32 -> i32 of NaN/inf is undefined in C */
            }
            run_case(&c);
        }
    }
    /* A grid larger than one launch covers (grid-stride loop). */
    memset(&c, 0, sizeof(c));
    c.k.kind = FSDP_K_FILL;
    c.k.u.fill.n = ((size_t)1 << 24) + 1000;
    c.k.u.fill.x = kbuf(&c, FSDP_DTYPE_F32, c.k.u.fill.n, 0, 1);
    c.k.u.fill.dtype = FSDP_DTYPE_F32;
    c.k.u.fill.value = -2.5;
    run_case(&c);
}

/* group_copy of 41 parts, more than one launch's 32: blocks with their own leading dimensions,
 * f32 and bf16 sources into f32 and bf16 destinations, sources cut into zeros, empty parts, and
 * a part of 2^20 elements (a grid-stride loop); against the host's loop and the sim. */
static void test_group_copy(void)
{
    enum { P = 41 };
    static fsdp_copy_part_t parts[P];
    size_t first = 0, so = 0, d32 = 0, d16 = 0;
    kcase_t c;

    memset(&c, 0, sizeof(c));
    for (int pass = 0; pass < 2; pass++) { /* sizes, then the parts over the buffers */
        float *s32 = pass ? c.buf[0].h : NULL, *o32 = pass ? c.buf[2].h : NULL;
        uint16_t *s16 = pass ? c.buf[1].h : NULL, *o16 = pass ? c.buf[3].h : NULL;
        first = so = d32 = d16 = 0;
        for (int j = 0; j < P; j++) {
            size_t rows = j == P - 1 ? 1 : 1 + (size_t)j % 4;
            size_t cols = j == P - 1 ? (size_t)1 << 20 : (size_t)(j * 7) % 13;
            size_t sld = cols + (size_t)j % 3, dld = cols + (size_t)j % 2;
            int dst32 = j % 3 == 0, src32 = j % 2 == 0;
            if (pass)
                parts[j] = (fsdp_copy_part_t){
                    .dst = dst32 ? (void *)(o32 + d32) : (void *)(o16 + d16),
                    .src = src32 ? (const void *)(s32 + so) : (const void *)(s16 + so),
                    .dst_ld = dld,
                    .src_ld = sld,
                    .src_n = j % 5 == 0 ? rows * sld / 2 : SIZE_MAX,
                    .rows = rows,
                    .cols = cols,
                    .first = first,
                    .dst_dtype = dst32 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16,
                    .src_dtype = src32 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16};
            first += rows * cols;
            so += rows * sld;
            *(dst32 ? &d32 : &d16) += rows * dld;
        }
        if (!pass) {
            kbuf(&c, FSDP_DTYPE_F32, so, -3, 3);
            kbuf(&c, FSDP_DTYPE_BF16, so, -3, 3);
            kbuf(&c, FSDP_DTYPE_F32, d32, -1, 1);
            kbuf(&c, FSDP_DTYPE_BF16, d16, -1, 1);
        }
    }
    c.k.kind = FSDP_K_GROUP_COPY;
    c.k.u.group_copy.parts = parts;
    c.k.u.group_copy.nparts = P;
    run_case(&c);
}

static void test_scale_axpy(void)
{
    const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    const size_t n = 77777;
    kcase_t c;

    for (int d = 0; d < 3; d++) {
        for (int div = 0; div < 2; div++) {
            memset(&c, 0, sizeof(c));
            c.k.kind = div ? FSDP_K_DIV : FSDP_K_SCALE;
            c.k.u.scale.x = kbuf(&c, dts[d], n, -100, 100);
            c.k.u.scale.dtype = dts[d];
            c.k.u.scale.n = n;
            c.k.u.scale.alpha = div ? 3.0f : 0.3f;
            run_case(&c);
        }
        for (int xd = 0; xd < 3; xd++) {
            memset(&c, 0, sizeof(c));
            c.k.kind = FSDP_K_AXPY;
            c.k.u.axpy.y = kbuf(&c, dts[d], n, -10, 10);
            c.k.u.axpy.y_dtype = dts[d];
            c.k.u.axpy.x = kbuf(&c, dts[xd], n, -10, 10);
            c.k.u.axpy.x_dtype = dts[xd];
            c.k.u.axpy.n = n;
            c.k.u.axpy.alpha = -0.7f;
            run_case(&c);
        }
    }
}

static void test_bias_relu(void)
{
    kcase_t c;

    memset(&c, 0, sizeof(c));
    c.k.kind = FSDP_K_BIAS_ADD;
    c.k.u.bias_add.rows = 333;
    c.k.u.bias_add.cols = 129;
    c.k.u.bias_add.y = kbuf(&c, FSDP_DTYPE_F32, 333 * 129, -1, 1);
    c.k.u.bias_add.bias = kbuf(&c, FSDP_DTYPE_F32, 129, -1, 1);
    run_case(&c);

    memset(&c, 0, sizeof(c));
    c.k.kind = FSDP_K_BIAS_GRAD;
    c.k.u.bias_grad.rows = 1000;
    c.k.u.bias_grad.cols = 300;
    c.k.u.bias_grad.dbias = kbuf(&c, FSDP_DTYPE_F32, 300, -1, 1);
    c.k.u.bias_grad.dy = kbuf(&c, FSDP_DTYPE_F32, 1000 * 300, -1, 1);
    run_case(&c);

    memset(&c, 0, sizeof(c));
    c.k.kind = FSDP_K_RELU_FWD;
    c.k.u.relu_fwd.n = 50001;
    c.k.u.relu_fwd.x = kbuf(&c, FSDP_DTYPE_F32, 50001, -1, 1);
    c.k.u.relu_fwd.y = kbuf(&c, FSDP_DTYPE_F32, 50001, 0, 0);
    run_case(&c);

    memset(&c, 0, sizeof(c)); /* in place */
    c.k.kind = FSDP_K_RELU_FWD;
    c.k.u.relu_fwd.n = 50001;
    c.k.u.relu_fwd.x = c.k.u.relu_fwd.y = kbuf(&c, FSDP_DTYPE_F32, 50001, -1, 1);
    run_case(&c);

    memset(&c, 0, sizeof(c));
    c.k.kind = FSDP_K_RELU_BWD;
    c.k.u.relu_bwd.n = 50001;
    c.k.u.relu_bwd.dy = c.k.u.relu_bwd.dx = kbuf(&c, FSDP_DTYPE_F32, 50001, -1, 1);
    c.k.u.relu_bwd.y = kbuf(&c, FSDP_DTYPE_F32, 50001, -1, 1);
    run_case(&c);

    /* mixed precision: 16-bit operands through the same bodies (load, f32, rounding store) */
    for (int d = 0; d < 2; d++) {
        const fsdp_dtype_t dt = d ? FSDP_DTYPE_F16 : FSDP_DTYPE_BF16;
        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_BIAS_ADD;
        c.k.u.bias_add.rows = 333;
        c.k.u.bias_add.cols = 129;
        c.k.u.bias_add.y_dtype = c.k.u.bias_add.bias_dtype = dt;
        c.k.u.bias_add.y = kbuf(&c, dt, 333 * 129, -1, 1);
        c.k.u.bias_add.bias = kbuf(&c, dt, 129, -1, 1);
        run_case(&c);

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_BIAS_GRAD;
        c.k.u.bias_grad.rows = 1000;
        c.k.u.bias_grad.cols = 300;
        c.k.u.bias_grad.dbias_dtype = c.k.u.bias_grad.dy_dtype = dt;
        c.k.u.bias_grad.dbias = kbuf(&c, dt, 300, -1, 1);
        c.k.u.bias_grad.dy = kbuf(&c, dt, 1000 * 300, -1, 1);
        run_case(&c);

        memset(&c, 0, sizeof(c)); /* in place */
        c.k.kind = FSDP_K_RELU_FWD;
        c.k.u.relu_fwd.n = 50001;
        c.k.u.relu_fwd.y_dtype = c.k.u.relu_fwd.x_dtype = dt;
        c.k.u.relu_fwd.x = c.k.u.relu_fwd.y = kbuf(&c, dt, 50001, -1, 1);
        run_case(&c);

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_RELU_BWD;
        c.k.u.relu_bwd.n = 50001;
        c.k.u.relu_bwd.dx_dtype = c.k.u.relu_bwd.dy_dtype = c.k.u.relu_bwd.y_dtype = dt;
        c.k.u.relu_bwd.dy = c.k.u.relu_bwd.dx = kbuf(&c, dt, 50001, -1, 1);
        c.k.u.relu_bwd.y = kbuf(&c, dt, 50001, -1, 1);
        run_case(&c);

        memset(&c, 0, sizeof(c)); /* low-precision output and gradient, f32 target and loss */
        c.k.kind = FSDP_K_MSE_LOSS;
        c.k.u.mse.n = 100003;
        c.k.u.mse.y_dtype = c.k.u.mse.dy_dtype = dt;
        c.k.u.mse.loss = kbuf(&c, FSDP_DTYPE_F32, 1, 0, 0);
        c.k.u.mse.dy = kbuf(&c, dt, 100003, 0, 0);
        c.k.u.mse.y = kbuf(&c, dt, 100003, -2, 2);
        c.k.u.mse.t = kbuf(&c, FSDP_DTYPE_F32, 100003, -2, 2);
        c.k.u.mse.denom = 100003.0;
        run_case(&c);
    }
}

/* The transformer kernels of nn_bodies.h: a warp per row, 32 x 32 blocks for the column sums,
 * token buckets for embedding_bwd; shapes with partial warps and blocks, in f32 and bf16. */
static void test_transformer(void)
{
    const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16};
    const size_t rows = 333, cols = 77, vocab = 1000, seq = 64;
    kcase_t c;

    for (int d = 0; d < 2; d++) {
        const fsdp_dtype_t dt = dts[d];
        float *mean, *rstd;
        int32_t *tok;

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_BIAS_GRAD;
        c.k.u.bias_grad.rows = rows;
        c.k.u.bias_grad.cols = cols;
        c.k.u.bias_grad.dbias_dtype = c.k.u.bias_grad.dy_dtype = dt;
        c.k.u.bias_grad.dbias = kbuf(&c, dt, cols, -1, 1);
        c.k.u.bias_grad.dy = kbuf(&c, dt, rows * cols, -1, 1);
        run_case(&c);

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_LAYERNORM_FWD;
        c.k.u.layernorm_fwd.y = kbuf(&c, dt, rows * cols, 0, 0);
        c.k.u.layernorm_fwd.mean = kbuf(&c, FSDP_DTYPE_F32, rows, 0, 0);
        c.k.u.layernorm_fwd.rstd = kbuf(&c, FSDP_DTYPE_F32, rows, 0, 0);
        c.k.u.layernorm_fwd.x = kbuf(&c, dt, rows * cols, -2, 3);
        c.k.u.layernorm_fwd.weight = kbuf(&c, dt, cols, 0.5f, 1.5f);
        c.k.u.layernorm_fwd.bias = kbuf(&c, dt, cols, -1, 1);
        c.k.u.layernorm_fwd.rows = rows;
        c.k.u.layernorm_fwd.cols = cols;
        c.k.u.layernorm_fwd.eps = 1e-5f;
        c.k.u.layernorm_fwd.dtype = dt;
        run_case(&c);

        for (int acc = 0; acc < 2; acc++) {
            memset(&c, 0, sizeof(c));
            c.k.kind = FSDP_K_LAYERNORM_BWD;
            c.k.u.layernorm_bwd.dx = kbuf(&c, dt, rows * cols, -1, 1);
            c.k.u.layernorm_bwd.dweight = kbuf(&c, dt, cols, -1, 1);
            c.k.u.layernorm_bwd.dbias = kbuf(&c, dt, cols, -1, 1);
            c.k.u.layernorm_bwd.dy = kbuf(&c, dt, rows * cols, -1, 1);
            c.k.u.layernorm_bwd.x = kbuf(&c, dt, rows * cols, -2, 2);
            c.k.u.layernorm_bwd.mean = mean = kbuf(&c, FSDP_DTYPE_F32, rows, -0.5f, 0.5f);
            c.k.u.layernorm_bwd.rstd = rstd = kbuf(&c, FSDP_DTYPE_F32, rows, 0.5f, 2);
            c.k.u.layernorm_bwd.weight = kbuf(&c, dt, cols, 0.5f, 1.5f);
            c.k.u.layernorm_bwd.rows = rows;
            c.k.u.layernorm_bwd.cols = cols;
            c.k.u.layernorm_bwd.accumulate = acc;
            c.k.u.layernorm_bwd.dtype = dt;
            (void)mean;
            (void)rstd;
            run_case(&c);
        }

        for (int causal = 0; causal < 2; causal++) {
            const size_t n = causal ? seq : 300, sr = causal ? 3 * seq : 77;
            memset(&c, 0, sizeof(c)); /* in place */
            c.k.kind = FSDP_K_SOFTMAX_FWD;
            c.k.u.softmax_fwd.y = kbuf(&c, dt, sr * n, -5, 5);
            c.k.u.softmax_fwd.x = c.k.u.softmax_fwd.y;
            c.k.u.softmax_fwd.rows = sr;
            c.k.u.softmax_fwd.cols = n;
            c.k.u.softmax_fwd.scale = 0.125f;
            c.k.u.softmax_fwd.divisor = causal ? 8.0f : 0.0f;
            c.k.u.softmax_fwd.causal = causal;
            c.k.u.softmax_fwd.dtype = dt;
            run_case(&c);

            memset(&c, 0, sizeof(c)); /* dx in place on dy */
            c.k.kind = FSDP_K_SOFTMAX_BWD;
            c.k.u.softmax_bwd.dx = kbuf(&c, dt, sr * n, -1, 1);
            c.k.u.softmax_bwd.dy = c.k.u.softmax_bwd.dx;
            c.k.u.softmax_bwd.y = kbuf(&c, dt, sr * n, 0, 0.1f);
            c.k.u.softmax_bwd.rows = sr;
            c.k.u.softmax_bwd.cols = n;
            c.k.u.softmax_bwd.scale = 0.125f;
            c.k.u.softmax_bwd.divisor = causal ? 8.0f : 0.0f;
            c.k.u.softmax_bwd.causal = causal;
            c.k.u.softmax_bwd.dtype = dt;
            run_case(&c);
        }

        memset(&c, 0, sizeof(c)); /* dlogits in place, ignored and invalid targets */
        c.k.kind = FSDP_K_CROSS_ENTROPY;
        c.k.u.cross_entropy.loss = kbuf(&c, FSDP_DTYPE_F32, 1, 0, 0);
        c.k.u.cross_entropy.losses = kbuf(&c, FSDP_DTYPE_F32, rows, 0, 0);
        c.k.u.cross_entropy.dlogits = kbuf(&c, dt, rows * vocab, -4, 4);
        c.k.u.cross_entropy.logits = c.k.u.cross_entropy.dlogits;
        c.k.u.cross_entropy.targets = tok = kbuf(&c, FSDP_DTYPE_I32, rows, 0, 0);
        for (size_t r = 0; r < rows; r++)
            tok[r] = r % 17 == 5 ? -1 : r == 100 ? (int32_t)vocab : (int32_t)((r * 7919) % vocab);
        c.k.u.cross_entropy.rows = rows;
        c.k.u.cross_entropy.vocab = vocab;
        c.k.u.cross_entropy.denom = (double)rows;
        c.k.u.cross_entropy.dtype = dt;
        run_case(&c);

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_EMBEDDING_BWD;
        c.k.u.embedding_bwd.dwte = kbuf(&c, dt, 200 * cols, -1, 1);
        c.k.u.embedding_bwd.dwpe = kbuf(&c, dt, seq * cols, -1, 1);
        c.k.u.embedding_bwd.dy = kbuf(&c, dt, rows * cols, -1, 1);
        c.k.u.embedding_bwd.tokens = tok = kbuf(&c, FSDP_DTYPE_I32, rows, 0, 0);
        for (size_t r = 0; r < rows; r++) /* repeats, an ignored and an invalid token */
            tok[r] = r == 7 ? -1 : r == 8 ? 200 : (int32_t)((r * r) % 151);
        c.k.u.embedding_bwd.rows = rows;
        c.k.u.embedding_bwd.cols = cols;
        c.k.u.embedding_bwd.seq = seq;
        c.k.u.embedding_bwd.vocab = 200;
        c.k.u.embedding_bwd.dtype = dt;
        run_case(&c);
    }
}

static void test_losses_reductions(void)
{
    const size_t sizes[] = {0, 1, 1000, 4096 * 1024 + 17};
    kcase_t c;

    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i];
        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_MSE_LOSS;
        c.k.u.mse.n = n;
        c.k.u.mse.loss = kbuf(&c, FSDP_DTYPE_F32, 1, 0, 0);
        c.k.u.mse.dy = i == 1 ? NULL : kbuf(&c, FSDP_DTYPE_F32, n, 0, 0);
        c.k.u.mse.y = kbuf(&c, FSDP_DTYPE_F32, n, -2, 2);
        c.k.u.mse.t = kbuf(&c, FSDP_DTYPE_F32, n, -2, 2);
        c.k.u.mse.denom = n > 0 ? (double)n : 1.0;
        run_case(&c);

        for (int d = 0; d < 2; d++) {
            memset(&c, 0, sizeof(c));
            c.k.kind = FSDP_K_SUMSQ;
            c.k.u.sumsq.n = n;
            c.k.u.sumsq.out = kbuf(&c, FSDP_DTYPE_F32, 1, 0, 0);
            c.k.u.sumsq.dtype = d ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            c.k.u.sumsq.x = kbuf(&c, c.k.u.sumsq.dtype, n, -3, 3);
            run_case(&c);
        }
    }
}

/* Same inputs, same bits: a reduction of fixed shape, run twice. */
static void test_reduction_determinism(void)
{
    const size_t n = 3000017;
    float *h = malloc(n * sizeof(float)), out[2];
    float *x = dalloc(n * sizeof(float)), *o = dalloc(2 * sizeof(float));
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    fsdp_kernel_t k = {.kind = FSDP_K_SUMSQ};

    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    fill_random(h, FSDP_DTYPE_F32, n, -1, 1);
    h2d(x, h, n * sizeof(float));
    k.u.sumsq.x = x;
    k.u.sumsq.dtype = FSDP_DTYPE_F32;
    k.u.sumsq.n = n;
    for (int r = 0; r < 2; r++) {
        k.u.sumsq.out = o + r;
        CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &k), FSDP_OK);
    }
    d2h(out, o, sizeof(out));
    CU_ASSERT(memcmp(&out[0], &out[1], sizeof(float)) == 0);
    dfree(x);
    dfree(o);
    free(h);
}

/* The Llama kernels (llama_bodies.h): rows of a warp, column blocks, elements; sizes that are
 * and are not multiples of the 32 lanes, in f32 and bf16. */
static void test_llama_norms(void)
{
    static const size_t shapes[][2] = {{1, 1}, {7, 37}, {77, 200}, {300, 4096}, {64, 16}};
    const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16};
    kcase_t c;

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int d = 0; d < 2; d++)
            for (int acc = 0; acc < 2; acc++) {
                const size_t R = shapes[si][0], C = shapes[si][1];
                const fsdp_dtype_t dt = dts[d];
                memset(&c, 0, sizeof(c));
                c.k.kind = FSDP_K_RMSNORM_FWD;
                c.k.u.rmsnorm_fwd.y = kbuf(&c, dt, R * C, 0, 0);
                c.k.u.rmsnorm_fwd.rstd = acc ? NULL : kbuf(&c, FSDP_DTYPE_F32, R, 0, 0);
                c.k.u.rmsnorm_fwd.x = kbuf(&c, dt, R * C, -2, 2);
                c.k.u.rmsnorm_fwd.weight = kbuf(&c, dt, C, 0.5f, 1.5f);
                c.k.u.rmsnorm_fwd.rows = R;
                c.k.u.rmsnorm_fwd.cols = C;
                c.k.u.rmsnorm_fwd.eps = 1e-5f;
                c.k.u.rmsnorm_fwd.dtype = dt;
                run_case(&c);

                memset(&c, 0, sizeof(c));
                c.k.kind = FSDP_K_RMSNORM_BWD;
                c.k.u.rmsnorm_bwd.dx = kbuf(&c, dt, R * C, -1, 1);
                c.k.u.rmsnorm_bwd.dweight = kbuf(&c, dt, C, -1, 1);
                c.k.u.rmsnorm_bwd.dy = kbuf(&c, dt, R * C, -1, 1);
                c.k.u.rmsnorm_bwd.x = kbuf(&c, dt, R * C, -2, 2);
                c.k.u.rmsnorm_bwd.rstd = kbuf(&c, FSDP_DTYPE_F32, R, 0.5f, 2.0f);
                c.k.u.rmsnorm_bwd.weight = kbuf(&c, dt, C, 0.5f, 1.5f);
                c.k.u.rmsnorm_bwd.rows = R;
                c.k.u.rmsnorm_bwd.cols = C;
                c.k.u.rmsnorm_bwd.accumulate = acc;
                c.k.u.rmsnorm_bwd.dtype = dt;
                run_case(&c);
            }

    for (int d = 0; d < 2; d++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const fsdp_dtype_t dt = dts[d];
            const size_t rows = 2 * 33, heads = 3, hd = 16, seq = 33, ld = 64;
            memset(&c, 0, sizeof(c));
            c.k.kind = bwd ? FSDP_K_ROPE_BWD : FSDP_K_ROPE_FWD;
            c.k.u.rope.y = kbuf(&c, dt, rows * ld, 0, 0);
            c.k.u.rope.x = kbuf(&c, dt, rows * ld, -2, 2);
            c.k.u.rope.cos = kbuf(&c, FSDP_DTYPE_F32, seq * hd / 2, -1, 1);
            c.k.u.rope.sin = kbuf(&c, FSDP_DTYPE_F32, seq * hd / 2, -1, 1);
            c.k.u.rope.rows = rows;
            c.k.u.rope.heads = heads;
            c.k.u.rope.head_dim = hd;
            c.k.u.rope.seq = seq;
            c.k.u.rope.ld = ld;
            c.k.u.rope.dtype = dt;
            run_case(&c);

            memset(&c, 0, sizeof(c));
            if (!bwd) {
                c.k.kind = FSDP_K_SWIGLU_FWD;
                c.k.u.swiglu_fwd.y = kbuf(&c, dt, 10007, 0, 0);
                c.k.u.swiglu_fwd.gate = kbuf(&c, dt, 10007, -4, 4);
                c.k.u.swiglu_fwd.up = kbuf(&c, dt, 10007, -2, 2);
                c.k.u.swiglu_fwd.n = 10007;
                c.k.u.swiglu_fwd.dtype = dt;
            } else {
                c.k.kind = FSDP_K_SWIGLU_BWD;
                c.k.u.swiglu_bwd.dgate = kbuf(&c, dt, 10007, 0, 0);
                c.k.u.swiglu_bwd.dup = kbuf(&c, dt, 10007, 0, 0);
                c.k.u.swiglu_bwd.dy = kbuf(&c, dt, 10007, -1, 1);
                c.k.u.swiglu_bwd.gate = kbuf(&c, dt, 10007, -4, 4);
                c.k.u.swiglu_bwd.up = kbuf(&c, dt, 10007, -2, 2);
                c.k.u.swiglu_bwd.n = 10007;
                c.k.u.swiglu_bwd.dtype = dt;
            }
            run_case(&c);
        }
}

/* Fused attention, forward then backward on the forward's o and lse (copied into the backward's
 * case, so that its probabilities are real ones): head_dim below, at and not a multiple of 32,
 * sequences of 1 and across 32, multi-head, grouped-query and multi-query, causal or not. */
static void test_llama_attention(void)
{
    static const struct {
        size_t B, T, H, K, hd;
        int causal;
        fsdp_dtype_t dt;
    } cases[] = {
        {2, 33, 4, 2, 16, 1, FSDP_DTYPE_F32},  {1, 1, 2, 1, 8, 1, FSDP_DTYPE_F32},
        {1, 100, 4, 1, 64, 1, FSDP_DTYPE_F32}, {2, 31, 4, 4, 80, 0, FSDP_DTYPE_F32},
        {1, 65, 8, 2, 128, 1, FSDP_DTYPE_F32}, {1, 40, 4, 2, 64, 1, FSDP_DTYPE_BF16},
        {1, 9, 2, 2, 256, 1, FSDP_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const size_t B = cases[i].B, T = cases[i].T, H = cases[i].H, K = cases[i].K;
        const size_t hd = cases[i].hd, rows = B * T, ldq = (H + 2) * hd, ldk = K * hd + 3;
        const fsdp_dtype_t dt = cases[i].dt;
        const size_t esz = fsdp_dtype_size(dt);
        void *o_keep, *lse_keep, *q_keep, *k_keep, *v_keep;
        kcase_t c;

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_ATTENTION_FWD;
        c.k.u.attention_fwd.o = kbuf(&c, dt, rows * H * hd, 0, 0);
        c.k.u.attention_fwd.lse = kbuf(&c, FSDP_DTYPE_F32, B * H * T, 0, 0);
        c.k.u.attention_fwd.q = kbuf(&c, dt, rows * ldq, -1.5f, 1.5f);
        c.k.u.attention_fwd.k = kbuf(&c, dt, rows * ldk, -1.5f, 1.5f);
        c.k.u.attention_fwd.v = kbuf(&c, dt, rows * ldk, -1.5f, 1.5f);
        c.k.u.attention_fwd.batch = B;
        c.k.u.attention_fwd.seq = T;
        c.k.u.attention_fwd.heads = H;
        c.k.u.attention_fwd.kv_heads = K;
        c.k.u.attention_fwd.head_dim = hd;
        c.k.u.attention_fwd.ldq = ldq;
        c.k.u.attention_fwd.ldk = ldk;
        c.k.u.attention_fwd.ldv = ldk;
        c.k.u.attention_fwd.ldo = H * hd;
        c.k.u.attention_fwd.scale = 1.0f / sqrtf((float)hd);
        c.k.u.attention_fwd.causal = cases[i].causal;
        c.k.u.attention_fwd.dtype = dt;
        /* the host's forward, kept for the backward's inputs */
        o_keep = malloc(rows * H * hd * esz);
        lse_keep = malloc(B * H * T * sizeof(float));
        q_keep = malloc(rows * ldq * esz);
        k_keep = malloc(rows * ldk * esz);
        v_keep = malloc(rows * ldk * esz);
        CU_ASSERT_FATAL(o_keep != NULL && lse_keep != NULL && q_keep != NULL && k_keep != NULL &&
                        v_keep != NULL);
        memcpy(q_keep, c.k.u.attention_fwd.q, rows * ldq * esz);
        memcpy(k_keep, c.k.u.attention_fwd.k, rows * ldk * esz);
        memcpy(v_keep, c.k.u.attention_fwd.v, rows * ldk * esz);
        {
            fsdp_kernel_t hk = c.k;
            hk.u.attention_fwd.o = o_keep;
            hk.u.attention_fwd.lse = lse_keep;
            host_exec(&hk);
        }
        run_case(&c);

        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_ATTENTION_BWD;
        c.k.u.attention_bwd.dq = kbuf(&c, dt, rows * ldq, 0, 0);
        c.k.u.attention_bwd.dk = kbuf(&c, dt, rows * ldk, 0, 0);
        c.k.u.attention_bwd.dv = kbuf(&c, dt, rows * ldk, 0, 0);
        c.k.u.attention_bwd.delta = kbuf(&c, FSDP_DTYPE_F32, B * H * T, 0, 0);
        c.k.u.attention_bwd.dout = kbuf(&c, dt, rows * H * hd, -1, 1);
        c.k.u.attention_bwd.o = kbuf(&c, dt, rows * H * hd, 0, 0);
        c.k.u.attention_bwd.q = kbuf(&c, dt, rows * ldq, 0, 0);
        c.k.u.attention_bwd.k = kbuf(&c, dt, rows * ldk, 0, 0);
        c.k.u.attention_bwd.v = kbuf(&c, dt, rows * ldk, 0, 0);
        c.k.u.attention_bwd.lse = kbuf(&c, FSDP_DTYPE_F32, B * H * T, 0, 0);
        memcpy((void *)c.k.u.attention_bwd.o, o_keep, rows * H * hd * esz);
        memcpy((void *)c.k.u.attention_bwd.lse, lse_keep, B * H * T * sizeof(float));
        memcpy((void *)c.k.u.attention_bwd.q, q_keep, rows * ldq * esz);
        memcpy((void *)c.k.u.attention_bwd.k, k_keep, rows * ldk * esz);
        memcpy((void *)c.k.u.attention_bwd.v, v_keep, rows * ldk * esz);
        c.k.u.attention_bwd.batch = B;
        c.k.u.attention_bwd.seq = T;
        c.k.u.attention_bwd.heads = H;
        c.k.u.attention_bwd.kv_heads = K;
        c.k.u.attention_bwd.head_dim = hd;
        c.k.u.attention_bwd.ldq = ldq;
        c.k.u.attention_bwd.ldk = ldk;
        c.k.u.attention_bwd.ldv = ldk;
        c.k.u.attention_bwd.ldo = H * hd;
        c.k.u.attention_bwd.scale = 1.0f / sqrtf((float)hd);
        c.k.u.attention_bwd.causal = cases[i].causal;
        c.k.u.attention_bwd.dtype = dt;
        run_case(&c);
        free(o_keep);
        free(lse_keep);
        free(q_keep);
        free(k_keep);
        free(v_keep);
    }
}

static void test_optimizers(void)
{
    const size_t n = 65537;
    kcase_t c;

    for (int step = 1; step <= 7; step += 6) {
        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_ADAMW;
        c.k.u.adamw.n = n;
        c.k.u.adamw.param = kbuf(&c, FSDP_DTYPE_F32, n, -1, 1);
        c.k.u.adamw.grad = kbuf(&c, FSDP_DTYPE_F32, n, -0.1f, 0.1f);
        c.k.u.adamw.exp_avg = kbuf(&c, FSDP_DTYPE_F32, n, -0.01f, 0.01f);
        c.k.u.adamw.exp_avg_sq = kbuf(&c, FSDP_DTYPE_F32, n, 0, 0.001f);
        c.k.u.adamw.lr = 1e-3f;
        c.k.u.adamw.beta1 = 0.9f;
        c.k.u.adamw.beta2 = 0.999f;
        c.k.u.adamw.eps = 1e-8f;
        c.k.u.adamw.weight_decay = 0.01f;
        c.k.u.adamw.step = step;
        run_case(&c);
    }
    for (int v = 0; v < 4; v++) {
        memset(&c, 0, sizeof(c));
        c.k.kind = FSDP_K_SGD;
        c.k.u.sgd.n = n;
        c.k.u.sgd.param = kbuf(&c, FSDP_DTYPE_F32, n, -1, 1);
        c.k.u.sgd.grad = kbuf(&c, FSDP_DTYPE_F32, n, -0.1f, 0.1f);
        c.k.u.sgd.momentum_buf = v == 0 ? NULL : kbuf(&c, FSDP_DTYPE_F32, n, -0.1f, 0.1f);
        c.k.u.sgd.lr = 0.05f;
        c.k.u.sgd.momentum = v == 0 ? 0.0f : 0.9f;
        c.k.u.sgd.dampening = v == 3 ? 0.1f : 0.0f;
        c.k.u.sgd.weight_decay = v >= 2 ? 1e-4f : 0.0f;
        c.k.u.sgd.nesterov = v == 2;
        c.k.u.sgd.first_step = v == 1;
        run_case(&c);
    }
}

/* ---- GEMM against a double-precision host reference ---- */

static void gemm_case(int ta, int tb, size_t m, size_t n, size_t k, size_t pad, float alpha,
                      float beta)
{
    size_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    float *a = malloc((na + 1) * sizeof(float)), *b = malloc((nb + 1) * sizeof(float));
    float *c = malloc(nc * sizeof(float)), *got = malloc(nc * sizeof(float));
    float *da = dalloc((na + 1) * sizeof(float)), *db = dalloc((nb + 1) * sizeof(float));
    float *dc = dalloc(nc * sizeof(float));
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    fsdp_kernel_t kd = {.kind = FSDP_K_GEMM};
    int bad = 0;

    CU_ASSERT_FATAL(a != NULL && b != NULL && c != NULL && got != NULL);
    fill_random(a, FSDP_DTYPE_F32, na, -1, 1);
    fill_random(b, FSDP_DTYPE_F32, nb, -1, 1);
    fill_random(c, FSDP_DTYPE_F32, nc, -1, 1);
    if (beta == 0.0f)
        c[0] = NAN; /* must be ignored */
    h2d(da, a, na * sizeof(float));
    h2d(db, b, nb * sizeof(float));
    h2d(dc, c, nc * sizeof(float));
    kd.u.gemm.trans_a = ta;
    kd.u.gemm.trans_b = tb;
    kd.u.gemm.m = m;
    kd.u.gemm.n = n;
    kd.u.gemm.k = k;
    kd.u.gemm.alpha = alpha;
    kd.u.gemm.a = da;
    kd.u.gemm.lda = lda;
    kd.u.gemm.b = db;
    kd.u.gemm.ldb = ldb;
    kd.u.gemm.beta = beta;
    kd.u.gemm.c = dc;
    kd.u.gemm.ldc = ldc;
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &kd), FSDP_OK);
    d2h(got, dc, nc * sizeof(float));

    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < ldc; j++) {
            double want, mag = 0.0, acc = 0.0;
            if (j >= n) { /* padding untouched */
                bad += memcmp(&got[i * ldc + j], &c[i * ldc + j], sizeof(float)) != 0;
                continue;
            }
            for (size_t p = 0; p < k; p++) {
                double av = ta ? a[p * lda + i] : a[i * lda + p];
                double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                acc += av * bv;
                mag += fabs(av * bv);
            }
            want = (double)alpha * acc;
            mag *= fabs((double)alpha);
            if (beta != 0.0f) { /* beta == 0 ignores C, NaN included */
                want += (double)beta * c[i * ldc + j];
                mag += fabs((double)beta * c[i * ldc + j]);
            }
            bad += !(fabs((double)got[i * ldc + j] - want) <= 1e-5 * mag + 1e-6);
        }
    }
    if (bad)
        fprintf(stderr, "\n  gemm ta=%d tb=%d m=%zu n=%zu k=%zu pad=%zu alpha=%g beta=%g: %d bad\n",
                ta, tb, m, n, k, pad, (double)alpha, (double)beta, bad);
    CU_ASSERT_EQUAL(bad, 0);
    dfree(da);
    dfree(db);
    dfree(dc);
    free(a);
    free(b);
    free(c);
    free(got);
}

/* bf16/f16 A and B (cublasGemmEx, f32 compute) against the double product of the 16-bit
 * values: f32 accumulation as in gemm_case, plus half an ulp of the output dtype when C is
 * 16-bit (one rounding). */
static void gemm_case_lp(fsdp_dtype_t dt, fsdp_dtype_t cdt, int ta, int tb, size_t m, size_t n,
                         size_t k, float alpha, float beta)
{
    size_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
    size_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    size_t es = fsdp_dtype_size(dt), cs = fsdp_dtype_size(cdt);
    void *a = malloc(na * es), *b = malloc(nb * es), *c = malloc(nc * cs), *got = malloc(nc * cs);
    void *da = dalloc(na * es), *db = dalloc(nb * es), *dc = dalloc(nc * cs);
    double half_ulp = cdt == FSDP_DTYPE_BF16 ? 0x1p-8 : cdt == FSDP_DTYPE_F16 ? 0x1p-11 : 0.0;
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    fsdp_kernel_t kd = {.kind = FSDP_K_GEMM};
    int bad = 0;

    CU_ASSERT_FATAL(a != NULL && b != NULL && c != NULL && got != NULL);
    fill_random(a, dt, na, -1, 1);
    fill_random(b, dt, nb, -1, 1);
    fill_random(c, cdt, nc, -1, 1);
    h2d(da, a, na * es);
    h2d(db, b, nb * es);
    h2d(dc, c, nc * cs);
    kd.u.gemm.trans_a = ta;
    kd.u.gemm.trans_b = tb;
    kd.u.gemm.m = m;
    kd.u.gemm.n = n;
    kd.u.gemm.k = k;
    kd.u.gemm.alpha = alpha;
    kd.u.gemm.a = da;
    kd.u.gemm.lda = lda;
    kd.u.gemm.b = db;
    kd.u.gemm.ldb = ldb;
    kd.u.gemm.beta = beta;
    kd.u.gemm.c = dc;
    kd.u.gemm.ldc = ldc;
    kd.u.gemm.a_dtype = kd.u.gemm.b_dtype = dt;
    kd.u.gemm.c_dtype = cdt;
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &kd), FSDP_OK);
    d2h(got, dc, nc * cs);

    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double want, mag = 0.0, acc = 0.0, have = fsdp_kb_load(got, cdt, i * ldc + j);
            for (size_t p = 0; p < k; p++) {
                double av = fsdp_kb_load(a, dt, ta ? p * lda + i : i * lda + p);
                double bv = fsdp_kb_load(b, dt, tb ? j * ldb + p : p * ldb + j);
                acc += av * bv;
                mag += fabs(av * bv);
            }
            want = (double)alpha * acc;
            mag *= fabs((double)alpha);
            if (beta != 0.0f) {
                double cv = fsdp_kb_load(c, cdt, i * ldc + j);
                want += (double)beta * cv;
                mag += fabs((double)beta * cv);
            }
            bad += !(fabs(have - want) <= 1e-5 * mag + 1e-6 + half_ulp * fabs(want));
        }
    }
    if (bad)
        fprintf(stderr, "\n  gemm %s->%s ta=%d tb=%d m=%zu n=%zu k=%zu: %d bad\n",
                fsdp_dtype_name(dt), fsdp_dtype_name(cdt), ta, tb, m, n, k, bad);
    CU_ASSERT_EQUAL(bad, 0);
    dfree(da);
    dfree(db);
    dfree(dc);
    free(a);
    free(b);
    free(c);
    free(got);
}

static void test_gemm(void)
{
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ta, tb, 37, 53, 71, 0, 1.0f, 0.0f);
            gemm_case(ta, tb, 128, 96, 257, 5, 0.5f, 1.0f);
            gemm_case(ta, tb, 1, 300, 17, 3, -2.0f, 0.25f);
        }
    }
    gemm_case(0, 0, 33, 44, 0, 1, 1.0f, 0.5f);  /* K = 0: C = beta * C */
    gemm_case(0, 1, 33, 44, 10, 0, 0.0f, 0.0f); /* alpha = 0, beta = 0: zeros */
    gemm_case(1, 0, 512, 512, 512, 0, 1.0f, 0.0f);
    for (int d = 0; d < 2; d++) {
        const fsdp_dtype_t dt = d ? FSDP_DTYPE_F16 : FSDP_DTYPE_BF16;
        for (int t = 0; t < 4; t++) {
            gemm_case_lp(dt, dt, t >> 1, t & 1, 37, 53, 71, 1.0f, 0.0f);
            gemm_case_lp(dt, dt, t >> 1, t & 1, 64, 96, 1000, 1.0f, 1.0f);
            gemm_case_lp(dt, FSDP_DTYPE_F32, t >> 1, t & 1, 37, 53, 300, 0.5f, 0.25f);
        }
        gemm_case_lp(dt, dt, 0, 1, 33, 44, 0, 1.0f, 0.5f); /* K = 0: C = beta * C, rounded */
    }
}

static void test_kernel_errors(void)
{
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    fsdp_kernel_t k = {.kind = FSDP_K_COUNT};
    int lines = 0;

    fsdp_log_set_handler(quiet, &lines);
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, NULL), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &k), FSDP_ERR_INVALID_PARAM);
    k.kind = FSDP_K_FILL;
    k.u.fill.n = 10;
    k.u.fill.dtype = FSDP_DTYPE_F32;
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &k), FSDP_ERR_INVALID_PARAM); /* x NULL */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GEMM;
    k.u.gemm.m = k.u.gemm.n = k.u.gemm.k = 4;
    k.u.gemm.lda = 3;
    k.u.gemm.ldb = k.u.gemm.ldc = 4;
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &k), FSDP_ERR_INVALID_PARAM); /* lda < K */
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT(lines >= 4);
}

/* A failed CUDA call is reported once, by its own op: the next kernel launch does not inherit
 * it (the thread's last error, which launches check, is reset). */
static void test_error_not_inherited(void)
{
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    float host[16];
    void *x = NULL;
    int lines = 0;

    CU_ASSERT_EQUAL_FATAL(fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, sizeof(host), &x),
                          FSDP_OK);
    fsdp_log_set_handler(quiet, &lines);
    /* cudaFree of an address that is no allocation: cudaErrorInvalidValue, not sticky */
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, (void *)(uintptr_t)0x1000);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT(lines >= 1);
    k.u.fill.x = x;
    k.u.fill.n = 16;
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.value = 2.5f;
    CU_ASSERT_EQUAL(fsdp_dev_kernel(dev, s, &k), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(dev, host, x, sizeof(host), s), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_stream_synchronize(dev, s), FSDP_OK);
    for (int i = 0; i < 16; i++)
        CU_ASSERT_EQUAL(host[i], 2.5f);
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, x);
}

/* ---- memory, streams, events ---- */

static void test_memory_streams_events(void)
{
    const size_t n = 1 << 20;
    fsdp_stream_t *hi = NULL, *lo = NULL, *cs = fsdp_dev_compute_stream(dev);
    fsdp_event_t *ev = NULL;
    float *pinned = NULL, *back = malloc(n * sizeof(float));
    float *d1 = dalloc(n * sizeof(float)), *d2 = dalloc(n * sizeof(float));
    double t0 = fsdp_dev_host_time(dev);
    int done = 0;

    CU_ASSERT_PTR_NOT_NULL_FATAL(back);
    CU_ASSERT_EQUAL_FATAL(
        fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_HOST_PINNED, n * sizeof(float), (void **)&pinned),
        FSDP_OK);
    for (size_t i = 0; i < n; i++)
        pinned[i] = (float)i;
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_stream_create(dev, "unshard", -100, &hi), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_stream_create(dev, "post_backward", 100, &lo), FSDP_OK);
    CU_ASSERT(hi->id > 0 && lo->id > 0 && hi->id != lo->id);
    CU_ASSERT(hi->priority <= lo->priority); /* clamped to the device's range */
    CU_ASSERT_STRING_EQUAL(hi->name, "unshard");
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_event_create(dev, &ev), FSDP_OK);

    /* pinned -> d1 on `hi`, then d1 -> d2 on `lo` after an event, then d2 -> host. */
    CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(dev, d1, pinned, n * sizeof(float), hi), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_event_record(dev, ev, hi), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_stream_wait_event(dev, lo, ev), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(dev, d2, d1, n * sizeof(float), lo), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_stream_wait_stream(dev, cs, lo), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(dev, back, d2, n * sizeof(float), cs), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_stream_synchronize(dev, cs), FSDP_OK);
    CU_ASSERT(memcmp(back, pinned, n * sizeof(float)) == 0);
    CU_ASSERT_EQUAL(fsdp_dev_event_synchronize(dev, ev), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_event_query(dev, ev, &done), FSDP_OK);
    CU_ASSERT_EQUAL(done, 1);
    CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(dev, d1, pinned, 0, cs), FSDP_OK);
    CU_ASSERT(fsdp_dev_host_time(dev) >= t0);

    fsdp_dev_event_destroy(dev, ev);
    fsdp_dev_stream_destroy(dev, hi);
    fsdp_dev_stream_destroy(dev, lo);
    fsdp_dev_stream_destroy(dev, cs); /* ignored: the compute stream belongs to the backend */
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_HOST_PINNED, pinned);
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, NULL);
    dfree(d1);
    dfree(d2);
    free(back);
}

/* ---- collectives of one rank ---- */

static void check_collectives(fsdp_dev_t *d, fsdp_group_t *g)
{
    const size_t n = 4099;
    fsdp_stream_t *s = fsdp_dev_compute_stream(d);
    float *h = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float));
    uint16_t *hb = malloc(n * sizeof(uint16_t)), *rb = malloc(n * sizeof(uint16_t));
    void *x = NULL, *y = NULL;
    int lines = 0;

    CU_ASSERT_FATAL(h != NULL && r != NULL && hb != NULL && rb != NULL);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_segment_alloc(d, FSDP_MEMKIND_DEVICE, n * 4, &x), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_dev_segment_alloc(d, FSDP_MEMKIND_DEVICE, n * 4, &y), FSDP_OK);
    fill_random(h, FSDP_DTYPE_F32, n, -5, 5);
    fill_random(hb, FSDP_DTYPE_BF16, n, -5, 5);

#define ROUND_TRIP_(call, host_in, host_out, bytes)                                                \
    do {                                                                                           \
        CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(d, x, host_in, bytes, s), FSDP_OK);                  \
        CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(d, y, host_in, bytes, s), FSDP_OK);                  \
        CU_ASSERT_EQUAL(call, FSDP_OK);                                                            \
        CU_ASSERT_EQUAL(fsdp_dev_memcpy_async(d, host_out, y, bytes, s), FSDP_OK);                 \
        CU_ASSERT_EQUAL(fsdp_dev_stream_synchronize(d, s), FSDP_OK);                               \
        CU_ASSERT(memcmp(host_in, host_out, bytes) == 0);                                          \
    } while (0)

    /* One rank: every collective is the identity. */
    ROUND_TRIP_(fsdp_dev_all_gather(d, g, x, y, n, FSDP_DTYPE_F32, s), h, r, n * 4);
    ROUND_TRIP_(fsdp_dev_all_gather(d, g, x, y, n, FSDP_DTYPE_BF16, s), hb, rb, n * 2);
    for (int op = 0; op < FSDP_REDUCE_COUNT; op++) {
        ROUND_TRIP_(fsdp_dev_reduce_scatter(d, g, x, y, n, FSDP_DTYPE_F32, (fsdp_reduce_op_t)op, s),
                    h, r, n * 4);
        ROUND_TRIP_(
            fsdp_dev_reduce_scatter(d, g, x, y, n, FSDP_DTYPE_BF16, (fsdp_reduce_op_t)op, s), hb,
            rb, n * 2);
        ROUND_TRIP_(fsdp_dev_all_reduce(d, g, y, y, n, FSDP_DTYPE_F32, (fsdp_reduce_op_t)op, s), h,
                    r, n * 4);
    }
    ROUND_TRIP_(fsdp_dev_broadcast(d, g, y, n, FSDP_DTYPE_F32, 0, s), h, r, n * 4);
    CU_ASSERT_EQUAL(fsdp_dev_barrier(d, g), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_dev_all_reduce(d, g, x, y, 0, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, s),
                    FSDP_OK);

    fsdp_log_set_handler(quiet, &lines);
    CU_ASSERT_EQUAL(fsdp_dev_broadcast(d, g, y, n, FSDP_DTYPE_F32, 1, s), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_dev_all_reduce(d, g, x, y, n, FSDP_DTYPE_COUNT, FSDP_REDUCE_SUM, s),
                    FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_dev_all_reduce(d, g, x, y, n, FSDP_DTYPE_F32, FSDP_REDUCE_COUNT, s),
                    FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_dev_all_reduce(d, NULL, x, y, n, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, s),
                    FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT_EQUAL(lines, 4);
#undef ROUND_TRIP_
    fsdp_dev_segment_free(d, FSDP_MEMKIND_DEVICE, x);
    fsdp_dev_segment_free(d, FSDP_MEMKIND_DEVICE, y);
    free(h);
    free(r);
    free(hb);
    free(rb);
}

static void test_collectives(void)
{
    fsdp_group_t *w = fsdp_dev_group_world(dev), *sub = NULL, *none = (fsdp_group_t *)1;

    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    CU_ASSERT_EQUAL(w->rank, 0);
    CU_ASSERT_EQUAL(w->size, 1);
    CU_ASSERT_EQUAL(w->ranks[0], 0);
    CU_ASSERT_STRING_EQUAL(w->name, "world");
    check_collectives(dev, w);

    CU_ASSERT_EQUAL_FATAL(fsdp_dev_group_split(dev, w, 3, 0, &sub), FSDP_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sub);
    CU_ASSERT_EQUAL(sub->rank, 0);
    CU_ASSERT_EQUAL(sub->size, 1);
    CU_ASSERT_EQUAL(sub->ranks[0], 0);
    CU_ASSERT_STRING_EQUAL(sub->name, "world/split(3)");
    check_collectives(dev, sub);
    CU_ASSERT_EQUAL(fsdp_dev_group_split(dev, w, -1, 0, &none), FSDP_OK);
    CU_ASSERT_PTR_NULL(none);
    fsdp_dev_group_destroy(dev, sub);
    fsdp_dev_group_destroy(dev, w); /* ignored: the world belongs to the backend */
    CU_ASSERT_PTR_EQUAL(fsdp_dev_group_world(dev), w);
}

/* A second dev in the same process, with host-blocking collectives. */
static void test_blocking_collectives(void)
{
    fsdp_gpu_params_t p;
    fsdp_dev_t *d2 = NULL;

    fsdp_gpu_params_init(&p);
    p.blocking_collectives = 1;
    p.timeout_s = 30.0;
    CU_ASSERT_EQUAL_FATAL(fsdp_gpu_init(&p, &d2), FSDP_OK);
    check_collectives(d2, fsdp_dev_group_world(d2));
    fsdp_gpu_finalize(d2);
}

static void test_params(void)
{
    fsdp_gpu_params_t p;
    fsdp_dev_t *d2 = (fsdp_dev_t *)1;
    int lines = 0;

    fsdp_gpu_params_init(&p);
    CU_ASSERT_EQUAL(p.world_size, 1);
    CU_ASSERT_EQUAL(p.device, -1);
    CU_ASSERT(p.timeout_s > 0);
    fsdp_log_set_handler(quiet, &lines);
    p.world_size = 2; /* and no unique id */
    CU_ASSERT_EQUAL(fsdp_gpu_init(&p, &d2), FSDP_ERR_INVALID_PARAM);
    p.rank = 2;
    CU_ASSERT_EQUAL(fsdp_gpu_init(&p, &d2), FSDP_ERR_INVALID_PARAM);
    p.rank = 0;
    p.world_size = 1;
    p.device = fsdp_gpu_device_count();
    CU_ASSERT_EQUAL(fsdp_gpu_init(&p, &d2), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT_PTR_EQUAL(d2, (fsdp_dev_t *)1); /* untouched on failure */
    fsdp_gpu_finalize(NULL);
}

/* ---- what needs no device ---- */

static const fsdp_gpu_module_t *module;

static void *other_rank_main(void *arg)
{
    int *seen = arg;

    seen[0] = module->log_rank(); /* a thread that made no dev names no rank */
    module->set_log_rank(5);
    seen[1] = module->log_rank();
    return NULL;
}

/* fsdp_gpu_launch_local makes every rank on its own thread: each thread's messages name its own
 * rank, not the last one set by any thread. Returns the number of failed checks. */
static int check_log_rank_per_thread(void)
{
    int seen[2] = {0, 0}, fails = 0;
    pthread_t tid;

    module = loaded_module();
    if (module == NULL) {
        if (fsdp_gpu_built()) {
            fprintf(stderr, "test_gpu: %s is loaded but its entry table is not reachable\n",
                    fsdp_gpu_module_path());
            return 1;
        }
        return 0; /* no module */
    }
    module->set_log_rank(3);
    if (pthread_create(&tid, NULL, other_rank_main, seen) != 0) {
        fprintf(stderr, "test_gpu: cannot start a thread\n");
        return 1;
    }
    pthread_join(tid, NULL);
    if (seen[0] != -1 || seen[1] != 5) {
        fprintf(stderr, "test_gpu: another thread's log rank read %d then %d, not -1 then 5\n",
                seen[0], seen[1]);
        fails++;
    }
    if (module->log_rank() != 3) {
        fprintf(stderr, "test_gpu: this thread's log rank became %d, not 3\n", module->log_rank());
        fails++;
    }
    module->set_log_rank(-1);
    return fails;
}

static const fsdp_test_case_t tests[] = {
    {"ops table", test_ops_table},
    {"params", test_params},
    {"memory, streams, events", test_memory_streams_events},
    {"fill and cast", test_fill_cast},
    {"group_copy", test_group_copy},
    {"scale, div, axpy", test_scale_axpy},
    {"bias and relu", test_bias_relu},
    {"transformer kernels", test_transformer},
    {"mse and sumsq", test_losses_reductions},
    {"reduction determinism", test_reduction_determinism},
    {"llama: rmsnorm, rope, swiglu", test_llama_norms},
    {"llama: fused attention", test_llama_attention},
    {"adamw and sgd", test_optimizers},
    {"gemm", test_gemm},
    {"kernel errors", test_kernel_errors},
    {"an error is not inherited", test_error_not_inherited},
    {"collectives of one rank", test_collectives},
    {"blocking collectives", test_blocking_collectives},
    {NULL, NULL},
};

static int skip(const char *why)
{
    return fsdp_test_skip_gpu("test_gpu", why);
}

int main(void)
{
    fsdp_dev_t *d = NULL;
    fsdp_status_t status;
    int lines = 0, rc;

    fsdp_test_gpu_banner("test_gpu");
    /* What needs no device: the ops table is complete in either build, and init fails cleanly
     * where it cannot work. */
    if (fsdp_backend_check(fsdp_gpu_backend()) != FSDP_OK) {
        fprintf(stderr, "test_gpu: the gpu ops table is incomplete\n");
        return 1;
    }
    if (check_log_rank_per_thread() != 0)
        return 1;
    fsdp_log_set_handler(quiet, &lines);
    status = fsdp_gpu_init(NULL, &d);
    fsdp_log_set_handler(NULL, NULL);
    if (!fsdp_gpu_built() || fsdp_gpu_device_count() == 0) {
        fsdp_status_t want = fsdp_gpu_built() ? FSDP_ERR_NO_DEVICE : FSDP_ERR_UNSUPPORTED;
        if (status != want || d != NULL || lines == 0) {
            fprintf(stderr, "test_gpu: fsdp_gpu_init without a device returned %s, not %s\n",
                    fsdp_status_name(status), fsdp_status_name(want));
            return 1;
        }
        return skip(fsdp_gpu_built() ? "no CUDA device visible" : fsdp_gpu_load_error());
    }
    if (status != FSDP_OK) {
        fprintf(stderr, "test_gpu: fsdp_gpu_init failed: %s\n", fsdp_status_string(status));
        return 1;
    }
    dev = d;
    ops = dev->ops;
    printf("test_gpu: %d device(s); reference: %s\n", fsdp_gpu_device_count(),
           fsdp_sim_kernel_exec != NULL ? "fsdp_sim_kernel_exec and the shared bodies"
                                        : "the shared bodies (no sim executor in this library)");
    rc = fsdp_test_run("gpu", tests);
    fsdp_gpu_finalize(dev);
    return rc;
}
