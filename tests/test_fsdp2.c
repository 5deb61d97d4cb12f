/* FSDP2 (fully_shard, api fsdp2): the per-parameter layout, the collective sequences of
 * fsdp2-semantics.md's worked examples call by call (op, size, dtype, group, order), N-rank
 * training equal to one process at worlds 1 to 6, and the refusals. */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_hidden.h"
#include "mlp_ref.h"

/* ---------------- one iteration of an MLP, its collectives logged ---------------- */

#define C_GEMM 9  /* a marker in the log: the first GEMM of a unit's forward */
#define C_CAST 10 /* a marker: a cast on the compute stream, n elements to dtype */
/* a marker: a group_copy of n elements in group_size parts, the first to dtype (a chunk_copy
 * is one of a single part) */
#define C_COPY 11

typedef struct seq_cfg {
    int world;
    const int *dims;
    int nlayers;
    int raf; /* FSDP_RESHARD_* */
    int explicit_fwd, explicit_bwd;
    int sync; /* the iteration's gradient sync */
    int ranks_per_node;
    fsdp_dtype_t param_dtype, reduce_dtype, output_dtype;
    size_t rows;    /* of the batch on every rank (0: 2) */
    int mark_gemms; /* log a C_GEMM marker at every forward GEMM of a layer's output */
    int mark_casts; /* log a C_CAST marker at every cast on the compute stream */
    int mark_copies; /* log a C_COPY marker at every group_copy or chunk_copy */
    size_t sharded_bytes[8];
    fsdp_mem_stats_t at_backward[8], at_end[8]; /* as the backward begins, after the step */
} seq_cfg_t;

typedef struct phase_arg {
    fsdp_t *fs;
    fsdp_mem_stats_t *at_backward;
} phase_arg_t;

static void at_phase(fsdp_phase_t phase, void *arg)
{
    phase_arg_t *pa = arg;
    if (phase == FSDP_PHASE_BACKWARD)
        fsdp_mem_get_stats(fsdp_memory(pa->fs), pa->at_backward);
}

static _Thread_local const fsdp_backend_ops_t *inner_ops;
static _Thread_local int mark_gemms, mark_casts, mark_copies;
static _Thread_local fsdp_stream_t *compute_stream;

static fsdp_status_t marking_kernel(fsdp_dev_t *dev, fsdp_stream_t *s, const fsdp_kernel_t *k)
{
    if (mark_gemms && k->kind == FSDP_K_GEMM && k->u.gemm.trans_b && tl_nlog < MAX_LOG)
        tl_log[tl_nlog++] = (coll_t){(coll_kind_t)C_GEMM, k->u.gemm.n, 0, FSDP_DTYPE_F32, 0};
    if (mark_casts && k->kind == FSDP_K_CAST && s == compute_stream && tl_nlog < MAX_LOG)
        tl_log[tl_nlog++] = (coll_t){(coll_kind_t)C_CAST, k->u.cast.n, 0, k->u.cast.dst_dtype, 0};
    if (mark_copies && k->kind == FSDP_K_GROUP_COPY && tl_nlog < MAX_LOG) {
        const fsdp_copy_part_t *last = &k->u.group_copy.parts[k->u.group_copy.nparts - 1];
        tl_log[tl_nlog++] =
            (coll_t){(coll_kind_t)C_COPY, last->first + last->rows * last->cols,
                     (int)k->u.group_copy.nparts, k->u.group_copy.parts[0].dst_dtype, 0};
    }
    if (mark_copies && k->kind == FSDP_K_CHUNK_COPY && tl_nlog < MAX_LOG)
        tl_log[tl_nlog++] =
            (coll_t){(coll_kind_t)C_COPY, k->u.chunk_copy.rows * k->u.chunk_copy.cols, 1,
                     k->u.chunk_copy.dst_dtype, 0};
    return inner_ops->kernel(dev, s, k);
}

static coll_t seq_log[8][MAX_LOG];
static int seq_nlog[8];

static fsdp_status_t seq_rank(fsdp_dev_t *dev, void *arg)
{
    seq_cfg_t *c = arg;
    fsdp_backend_ops_t wrapped;
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp;
    size_t rows = c->rows > 0 ? c->rows : 2;
    float *x, *y, loss;
    fsdp_mem_stats_t st;

    inner_ops = dev->ops;
    wrap_ops(dev, &wrapped);
    mark_gemms = c->mark_gemms;
    mark_casts = c->mark_casts;
    mark_copies = c->mark_copies;
    if (c->mark_gemms || c->mark_casts || c->mark_copies)
        wrapped.kernel = marking_kernel;
    fsdp_config_init(&fc);
    fc.api = FSDP_API_FSDP2;
    fc.reshard_after_forward = c->raf;
    fc.explicit_forward_prefetch = c->explicit_fwd;
    fc.explicit_backward_prefetch = c->explicit_bwd;
    if (c->ranks_per_node > 0) {
        fc.strategy = FSDP_HYBRID_SHARD;
        fc.ranks_per_node = c->ranks_per_node;
    }
    fc.mixed_precision.param_dtype = c->param_dtype;
    fc.mixed_precision.reduce_dtype = c->reduce_dtype;
    fc.mixed_precision.output_dtype = c->output_dtype;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    compute_stream = fsdp_compute_stream(fs);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_create(fs, c->dims, c->nlayers, &mlp));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_init_params(mlp, 3));
    x = calloc(rows * (size_t)c->dims[0], sizeof(float));
    y = calloc(rows * (size_t)c->dims[c->nlayers], sizeof(float));
    phase_arg_t pa = {fs, &c->at_backward[dev->rank]};
    fsdp_mlp_set_phase_hook(mlp, at_phase, &pa);
    tl_nlog = 0;
    fsdp_set_sync_gradients(fs, c->sync);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_forward_backward(mlp, x, y, rows, &loss));
    fsdp_mem_get_stats(fsdp_memory(fs), &c->at_end[dev->rank]);
    memcpy(seq_log[dev->rank], tl_log, sizeof(coll_t) * (size_t)tl_nlog);
    seq_nlog[dev->rank] = tl_nlog;
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    c->sharded_bytes[dev->rank] = st.by_category[FSDP_MEM_SHARDED_PARAM];
    free(x);
    free(y);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void run_seq(seq_cfg_t *c)
{
    memset(seq_nlog, 0, sizeof(seq_nlog));
    CU_ASSERT_EQUAL_FATAL(run_ranks(c->world, seq_rank, c), FSDP_OK);
}

/* Every rank's log equals want (n entries): kind, size, group size, dtype and, for
 * reductions, the op. */
static void check_seq(const seq_cfg_t *c, const coll_t *want, int n)
{
    for (int r = 0; r < c->world; r++) {
        CU_ASSERT_EQUAL(seq_nlog[r], n);
        for (int i = 0; i < n && i < seq_nlog[r]; i++) {
            const coll_t *g = &seq_log[r][i], *w = &want[i];
            int same = g->kind == w->kind && g->n == w->n &&
                       (w->kind == (coll_kind_t)C_GEMM ||
                        (g->group_size == w->group_size && g->dtype == w->dtype &&
                         (w->kind == C_AG || g->op == w->op)));
            if (!same)
                fprintf(stderr,
                        "\n  rank %d call %d: kind %d n %zu group %d %s op %d; expected "
                        "kind %d n %zu group %d %s op %d\n",
                        r, i, (int)g->kind, g->n, g->group_size, fsdp_dtype_name(g->dtype),
                        (int)g->op, (int)w->kind, w->n, w->group_size, fsdp_dtype_name(w->dtype),
                        (int)w->op);
            CU_ASSERT(same);
        }
    }
}

#define AG(n, g, dt)                                                                               \
    {                                                                                              \
        C_AG, (n), (g), (dt), FSDP_REDUCE_SUM                                                      \
    }
#define RS(n, g, dt, op)                                                                           \
    {                                                                                              \
        C_RS, (n), (g), (dt), (op)                                                                 \
    }
#define AR(n, g, dt, op)                                                                           \
    {                                                                                              \
        C_AR, (n), (g), (dt), (op)                                                                 \
    }
#define F32 FSDP_DTYPE_F32
#define AVG FSDP_REDUCE_AVG

static const int dims3[] = {16, 30, 20, 4}; /* the W = 3 worked example */
static const int dims2[] = {16, 32, 4};     /* the W = 2 worked example */

static seq_cfg_t seq_default(int world, const int *layer_dims, int nlayers)
{
    seq_cfg_t c = {.world = world,
                   .dims = layer_dims,
                   .nlayers = nlayers,
                   .raf = FSDP_RESHARD_DEFAULT,
                   .sync = 1,
                   .param_dtype = FSDP_DTYPE_UNSET,
                   .reduce_dtype = FSDP_DTYPE_UNSET,
                   .output_dtype = FSDP_DTYPE_UNSET};
    return c;
}

/* W = 3, reshard_after_forward True (the default for units below a parameter-less root):
 * slots 170, 217 and 42 (rank 2 of the last layer all padding), 6 all-gathers, 3 AVG
 * reduce-scatters, the backward's all-gathers prefetched by the post-forward order. */
static void test_seq_world3(void)
{
    seq_cfg_t c = seq_default(3, dims3, 3);
    const coll_t want[] = {AG(170, 3, F32), AG(217, 3, F32),      AG(42, 3, F32),
                           AG(42, 3, F32),  AG(217, 3, F32),      RS(42, 3, F32, AVG),
                           AG(170, 3, F32), RS(217, 3, F32, AVG), RS(170, 3, F32, AVG)};
    run_seq(&c);
    check_seq(&c, want, 9);
    /* sharded parameters: 170, 217 and 42 f32, each rounded up to 512 bytes */
    for (int r = 0; r < 3; r++)
        CU_ASSERT_EQUAL(c.sharded_bytes[r], 1024 + 1024 + 512);

    c.raf = FSDP_RESHARD_TRUE;
    run_seq(&c);
    check_seq(&c, want, 9);
}

/* reshard_after_forward False: no all-gather in backward. */
static void test_seq_no_reshard(void)
{
    seq_cfg_t c = seq_default(3, dims3, 3);
    const coll_t want[] = {AG(170, 3, F32),     AG(217, 3, F32),      AG(42, 3, F32),
                           RS(42, 3, F32, AVG), RS(217, 3, F32, AVG), RS(170, 3, F32, AVG)};
    c.raf = FSDP_RESHARD_FALSE;
    run_seq(&c);
    check_seq(&c, want, 6);
    c.raf = 1; /* an int 1 is False */
    run_seq(&c);
    check_seq(&c, want, 6);
}

/* reshard_after_forward = 2 at W = 4 (semantics 1, "int reshard_after_forward"): the forward
 * gathers over the 4 ranks, the post-forward keeps W / N = 2 chunks a rank, and the backward
 * gathers those over the group of 2: L0 136 -> 544 forward, 272 -> 544 backward. */
static void test_seq_reshard_to_group(void)
{
    seq_cfg_t c = seq_default(4, dims3, 3);
    const coll_t want[] = {AG(136, 4, F32), AG(155, 4, F32),      AG(21, 4, F32),
                           AG(42, 2, F32),  AG(310, 2, F32),      RS(21, 4, F32, AVG),
                           AG(272, 2, F32), RS(155, 4, F32, AVG), RS(136, 4, F32, AVG)};
    c.raf = 2;
    run_seq(&c);
    check_seq(&c, want, 9);
    for (int r = 0; r < 4; r++) /* the post-forward copies were gathered and freed */
        CU_ASSERT_EQUAL(c.at_end[r].by_category[FSDP_MEM_UNSHARDED_PARAM], 0);
}

/* Sync off (set_requires_gradient_sync(False)): forward and backward still gather, nothing is
 * reduced. */
static void test_seq_sync_off(void)
{
    seq_cfg_t c = seq_default(3, dims3, 3);
    const coll_t want[] = {AG(170, 3, F32), AG(217, 3, F32), AG(42, 3, F32),
                           AG(42, 3, F32),  AG(217, 3, F32), AG(170, 3, F32)};
    c.sync = 0;
    run_seq(&c);
    check_seq(&c, want, 6);
}

/* W = 2 with the explicit lists L0 -> [L2] forward and L2 -> [L0] backward: both forward
 * all-gathers are issued before L0 computes; with the implicit schedule each is issued in its
 * own pre-forward. */
static void test_seq_explicit(void)
{
    seq_cfg_t c = seq_default(2, dims2, 2);
    const coll_t g = {(coll_kind_t)C_GEMM, 0, 0, F32, 0};
    coll_t want[] = {
        AG(272, 2, F32),     AG(66, 2, F32),      g, g, AG(66, 2, F32), AG(272, 2, F32),
        RS(66, 2, F32, AVG), RS(272, 2, F32, AVG)};
    want[2].n = 32;
    want[3].n = 4;
    c.mark_gemms = 1;
    c.explicit_fwd = c.explicit_bwd = 1;
    run_seq(&c);
    check_seq(&c, want, 8);

    coll_t implicit[] = {AG(272, 2, F32),     g,
                         AG(66, 2, F32),      g,
                         AG(66, 2, F32),      AG(272, 2, F32),
                         RS(66, 2, F32, AVG), RS(272, 2, F32, AVG)};
    implicit[1].n = 32;
    implicit[3].n = 4;
    c.explicit_fwd = c.explicit_bwd = 0;
    run_seq(&c);
    check_seq(&c, implicit, 8);
}

/* HSDP on a 2 x 2 mesh: all-gather and reduce-scatter over the 2-rank shard group, then the
 * AVG all-reduce of the shard over the replicate group, per unit. */
static void test_seq_hsdp(void)
{
    seq_cfg_t c = seq_default(4, dims3, 3);
    const coll_t want[] = {AG(255, 2, F32),      AG(310, 2, F32),      AG(42, 2, F32),
                           AG(42, 2, F32),       AG(310, 2, F32),      RS(42, 2, F32, AVG),
                           AR(42, 2, F32, AVG),  AG(255, 2, F32),      RS(310, 2, F32, AVG),
                           AR(310, 2, F32, AVG), RS(255, 2, F32, AVG), AR(255, 2, F32, AVG)};
    c.ranks_per_node = 2;
    run_seq(&c);
    check_seq(&c, want, 12);
}

/* Mixed precision: bf16 parameters all-gather in bf16 and, with no reduce dtype, reduce in
 * f32 (torch 2.15); an f16 reduce dtype reduces with SUM and the pre/post factors. */
static void test_seq_mixed_precision(void)
{
    seq_cfg_t c = seq_default(3, dims3, 3);
    const fsdp_dtype_t B = FSDP_DTYPE_BF16, H = FSDP_DTYPE_F16;
    const coll_t want[] = {AG(170, 3, B), AG(217, 3, B),        AG(42, 3, B),
                           AG(42, 3, B),  AG(217, 3, B),        RS(42, 3, F32, AVG),
                           AG(170, 3, B), RS(217, 3, F32, AVG), RS(170, 3, F32, AVG)};
    const coll_t want16[] = {AG(170, 3, B),
                             AG(217, 3, B),
                             AG(42, 3, B),
                             AG(42, 3, B),
                             AG(217, 3, B),
                             RS(42, 3, H, FSDP_REDUCE_SUM),
                             AG(170, 3, B),
                             RS(217, 3, H, FSDP_REDUCE_SUM),
                             RS(170, 3, H, FSDP_REDUCE_SUM)};
    c.param_dtype = B;
    run_seq(&c);
    check_seq(&c, want, 9);
    c.reduce_dtype = H;
    run_seq(&c);
    check_seq(&c, want16, 9);
}

#define GEMM_(n)                                                                                   \
    {                                                                                              \
        (coll_kind_t) C_GEMM, (n), 0, F32, 0                                                       \
    }
#define CAST(n, dt)                                                                                \
    {                                                                                              \
        (coll_kind_t) C_CAST, (n), 0, (dt), 0                                                      \
    }

/* MixedPrecisionPolicy(param_dtype=bf16, output_dtype=f32), W = 3, 2 rows: each unit's
 * pre-forward casts its f32 input to bf16 before its all-gather (the root's the data, the
 * layers' the f32 output of the layer before), each post-forward casts the bf16 output to f32
 * after the reshard; in backward the output's cast goes back (f32 -> bf16) before the unit's
 * pre-backward and the input's (bf16 -> f32) after its post-backward's reduce-scatter. Without
 * output_dtype only the root's cast of the data is left. */
static void test_seq_output_dtype(void)
{
    seq_cfg_t c = seq_default(3, dims3, 3);
    const fsdp_dtype_t B = FSDP_DTYPE_BF16;
    const coll_t want[] = {CAST(32, B),         AG(170, 3, B),        GEMM_(30),
                           CAST(60, F32), /* root, L0 */
                           CAST(60, B),         AG(217, 3, B),        GEMM_(20),
                           CAST(40, F32), /* L2 */
                           CAST(40, B),         AG(42, 3, B),         GEMM_(4),
                           CAST(8, F32), /* L4 */
                           CAST(8, B),          AG(42, 3, B),         AG(217, 3, B),
                           RS(42, 3, F32, AVG), CAST(40, F32),        CAST(40, B),
                           AG(170, 3, B),       RS(217, 3, F32, AVG), CAST(60, F32),
                           CAST(60, B),         RS(170, 3, F32, AVG)};
    const coll_t plain[] = {
        CAST(32, B),         AG(170, 3, B),       GEMM_(30),     AG(217, 3, B),
        GEMM_(20),           AG(42, 3, B),        GEMM_(4),      AG(42, 3, B),
        AG(217, 3, B),       RS(42, 3, F32, AVG), AG(170, 3, B), RS(217, 3, F32, AVG),
        RS(170, 3, F32, AVG)};
    c.param_dtype = B;
    c.mark_gemms = c.mark_casts = 1;
    c.output_dtype = FSDP_DTYPE_F32;
    run_seq(&c);
    check_seq(&c, want, (int)(sizeof(want) / sizeof(want[0])));
    c.output_dtype = FSDP_DTYPE_UNSET;
    run_seq(&c);
    check_seq(&c, plain, (int)(sizeof(plain) / sizeof(plain[0])));
}

#define COPY(n, parts, dt)                                                                         \
    {                                                                                              \
        (coll_kind_t) C_COPY, (n), (parts), (dt), 0                                                \
    }

/* One group_copy a unit for each copy-out and each chunk-cat, as torch's split_with_sizes_copy
 * and _chunk_cat, never a copy per parameter: W = 3, each of a unit's weight and bias a part,
 * W * A elements each way (510, 651 and 126), the copy-out into the compute dtype after the
 * unit's all-gather (and before the backward's prefetch), the chunk-cat into the reduce dtype
 * before its reduce-scatter. */
static void test_seq_group_copies(void)
{
    seq_cfg_t c = seq_default(3, dims3, 3);
    const fsdp_dtype_t B = FSDP_DTYPE_BF16;
    coll_t want[] = {AG(170, 3, F32),      COPY(510, 2, F32),   AG(217, 3, F32),
                     COPY(651, 2, F32),    AG(42, 3, F32),      COPY(126, 2, F32), /* forward */
                     AG(42, 3, F32),       COPY(126, 2, F32),   AG(217, 3, F32),
                     COPY(126, 2, F32),    RS(42, 3, F32, AVG), /* L4's backward */
                     COPY(651, 2, F32),    AG(170, 3, F32),     COPY(651, 2, F32),
                     RS(217, 3, F32, AVG), /* L2's */
                     COPY(510, 2, F32),    COPY(510, 2, F32),   RS(170, 3, F32, AVG)};
    const int n = (int)(sizeof(want) / sizeof(want[0]));

    c.mark_copies = 1;
    run_seq(&c);
    check_seq(&c, want, n);
    /* bf16 parameters: the copy-outs write bf16, the chunk-cats f32 (the reduce dtype) */
    for (int i = 0; i < n; i++) {
        if (want[i].kind == C_AG)
            want[i].dtype = B;
        if (want[i].kind == (coll_kind_t)C_COPY && i + 1 < n && want[i + 1].kind != C_RS)
            want[i].dtype = B;
    }
    c.param_dtype = B;
    run_seq(&c);
    check_seq(&c, want, n);
}

/* ---------------- memory: closed forms per category ---------------- */

/* W = 3, f32 (allocations rounded to 512 bytes). Unsharded parameters, one buffer each of
 * W * S * rest elements: L0 1920 + 120 -> 2048 + 512, L2 2520 + 84 -> 2560 + 512, L4 480 + 24
 * -> 512 + 512. All-gather outputs and reduce-scatter inputs, W * A elements: 2040 -> 2048,
 * 2604 -> 3072, 504 -> 512. Sharded parameters and gradients, A: 680, 868, 168 -> 1024, 1024,
 * 512. */
static void test_memory_closed_forms(void)
{
    enum { U0 = 2560, U2 = 3072, U4 = 1024, O0 = 2048, O2 = 3072, O4 = 512 };
    seq_cfg_t c = seq_default(3, dims3, 3);

    run_seq(&c);
    for (int r = 0; r < 3; r++) {
        const fsdp_mem_stats_t *b = &c.at_backward[r], *e = &c.at_end[r];
        /* resharded after each forward: one unit's buffers at a time, L2's the largest */
        CU_ASSERT_EQUAL(b->by_category[FSDP_MEM_UNSHARDED_PARAM], 0);
        CU_ASSERT_EQUAL(e->peak_by_category[FSDP_MEM_UNSHARDED_PARAM], U2);
        /* the root's post-forward let the last all-gather output go */
        CU_ASSERT_EQUAL(b->by_category[FSDP_MEM_COMM_BUFFER], 0);
        /* two buffers at most: L0's held output and L2's copy-in in forward; in backward L0's
         * prefetched output and L2's reduce-scatter input, L4's released before it */
        CU_ASSERT_EQUAL(e->peak_by_category[FSDP_MEM_COMM_BUFFER], O0 + O2);
        /* after the step: the sharded gradients alone, the last input released */
        CU_ASSERT_EQUAL(e->by_category[FSDP_MEM_GRADIENT], 1024 + 1024 + 512);
        CU_ASSERT_EQUAL(e->by_category[FSDP_MEM_COMM_BUFFER], 0);
        CU_ASSERT_EQUAL(e->by_category[FSDP_MEM_UNSHARDED_PARAM], 0);
    }

    c.raf = FSDP_RESHARD_FALSE;
    run_seq(&c);
    for (int r = 0; r < 3; r++) {
        const fsdp_mem_stats_t *b = &c.at_backward[r], *e = &c.at_end[r];
        /* every unit kept its parameters for backward; freed by the post-backward reshards */
        CU_ASSERT_EQUAL(b->by_category[FSDP_MEM_UNSHARDED_PARAM], U0 + U2 + U4);
        CU_ASSERT_EQUAL(e->by_category[FSDP_MEM_UNSHARDED_PARAM], 0);
        CU_ASSERT_EQUAL(b->by_category[FSDP_MEM_COMM_BUFFER], 0);
        /* forward as above; backward holds one input at a time */
        CU_ASSERT_EQUAL(e->peak_by_category[FSDP_MEM_COMM_BUFFER], O0 + O2);
        CU_ASSERT(O2 + O4 < O0 + O2);
    }
}

/* The activations' peak with output_dtype f32 under bf16 parameters, W = 3, B = 128 rows (every
 * block a multiple of 512 bytes: no rounding), d = 16, 30, 20, 4. Without it the peak is in
 * L2's backward: the f32 target 4 B d3, the bf16 input and saved outputs 2 B (d0 + d1 + d2 +
 * d3), L4's input gradient 2 B d2 and L2's 2 B d1, less L4's output and its gradient freed:
 * B (4 d3 + 2 d0 + 4 d1 + 4 d2). With it the peak is at L2's post-forward cast: the target,
 * the input, L0's f32 output (4 B d1) beside L2's bf16 cast of it (2 B d1), L2's bf16 output
 * (2 B d2) and its f32 cast (4 B d2): B (4 d3 + 2 d0 + 6 d1 + 6 d2). The casts add
 * 2 B (d1 + d2) to the peak. */
static void test_memory_output_dtype(void)
{
    const size_t B = 128, d0 = 16, d1 = 30, d2 = 20, d3 = 4;
    seq_cfg_t c = seq_default(3, dims3, 3);
    size_t plain[3];

    c.param_dtype = FSDP_DTYPE_BF16;
    c.rows = B;
    run_seq(&c);
    for (int r = 0; r < 3; r++) {
        plain[r] = c.at_end[r].peak_by_category[FSDP_MEM_ACTIVATION];
        CU_ASSERT_EQUAL(plain[r], B * (4 * d3 + 2 * d0 + 4 * d1 + 4 * d2));
    }
    c.output_dtype = FSDP_DTYPE_F32;
    run_seq(&c);
    for (int r = 0; r < 3; r++) {
        const fsdp_mem_stats_t *e = &c.at_end[r];
        CU_ASSERT_EQUAL(e->peak_by_category[FSDP_MEM_ACTIVATION],
                        B * (4 * d3 + 2 * d0 + 6 * d1 + 6 * d2));
        CU_ASSERT_EQUAL(e->peak_by_category[FSDP_MEM_ACTIVATION] - plain[r], 2 * B * (d1 + d2));
        CU_ASSERT_EQUAL(e->by_category[FSDP_MEM_ACTIVATION], 0); /* every cast freed */
    }
}

/* ---------------- bf16: rounded where torch rounds ---------------- */

typedef struct mp_run {
    fsdp_api_t api;
    int world;
    fsdp_dtype_t param, reduce, output;
    float final[512], losses[3];
    size_t total;
} mp_run_t;

static fsdp_status_t mp_rank(fsdp_dev_t *dev, void *arg)
{
    mp_run_t *m = arg;
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp;
    fsdp_optim_config_t oc;
    fsdp_optim_t *opt;
    size_t rows = (size_t)MAXB_ALL / (size_t)m->world, total;
    float loss, out[512];

    fsdp_config_init(&fc);
    fc.api = m->api;
    fc.mixed_precision.param_dtype = m->param;
    fc.mixed_precision.reduce_dtype = m->reduce;
    fc.mixed_precision.output_dtype = m->output;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_create(fs, dims, NL, &mlp));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_init_params(mlp, 11));
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    oc.lr = 1e-2f;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_optim_create(fs, &oc, &opt));
    for (int step = 0; step < 3; step++) {
        size_t row0 = (size_t)dev->rank * rows;
        FSDP_RANK_REQUIRE_OK(&failure, dev,
                             fsdp_mlp_forward_backward(mlp, xs + row0 * (size_t)dims[0],
                                                       ys + row0 * (size_t)dims[NL], rows, &loss));
        FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_optim_step(opt));
        fsdp_zero_grad(fs);
        if (dev->rank == 0)
            m->losses[step] = loss;
    }
    FSDP_RANK_REQUIRE_OK(&failure, dev, gather_all(mlp, out, &total));
    if (dev->rank == 0) {
        memcpy(m->final, out, total * sizeof(float));
        m->total = total;
    }
    fsdp_optim_destroy(opt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return FSDP_OK;
}

/* bf16 parameters under fully_shard round where FSDP1's MixedPrecision(param_dtype=bf16,
 * reduce_dtype=f32) rounds (its bf16 path held to PyTorch by test_mixed_precision_fsdp): the
 * shard cast for the all-gather, the compute, the bf16 gradients cast to f32 in the chunk-cat.
 * Where dividing by W is exact (W = 2 and 4) the AVG reduce-scatter gives FSDP1's bits; the
 * default reduce dtype of bf16 parameters is f32 (torch 2.15), so leaving it unset is the
 * same. */
static void test_bf16_rounding(void)
{
    make_batch();
    for (int w = 2; w <= 4; w += 2) {
        mp_run_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
        *a = (mp_run_t){.api = FSDP_API_FSDP1,
                        .world = w,
                        .param = FSDP_DTYPE_BF16,
                        .reduce = FSDP_DTYPE_F32,
                        .output = FSDP_DTYPE_UNSET};
        *b = (mp_run_t){.api = FSDP_API_FSDP2,
                        .world = w,
                        .param = FSDP_DTYPE_BF16,
                        .reduce = FSDP_DTYPE_UNSET,
                        .output = FSDP_DTYPE_UNSET};
        CU_ASSERT_EQUAL_FATAL(run_ranks(w, mp_rank, a), FSDP_OK);
        CU_ASSERT_EQUAL_FATAL(run_ranks(w, mp_rank, b), FSDP_OK);
        CU_ASSERT_EQUAL(a->total, b->total);
        CU_ASSERT(a->total > 0 && memcmp(a->final, b->final, a->total * sizeof(float)) == 0);
        /* and the bf16 reduction is another rounding */
        b->reduce = FSDP_DTYPE_BF16;
        CU_ASSERT_EQUAL_FATAL(run_ranks(w, mp_rank, b), FSDP_OK);
        CU_ASSERT(memcmp(a->final, b->final, a->total * sizeof(float)) != 0);
        free(a);
        free(b);
    }
}

/* output_dtype f32 under bf16 parameters gives the losses and weights of no output_dtype, bit
 * for bit: every bf16 value is an f32 one, so the forward's bf16 -> f32 -> bf16 round trip
 * gives the same bits; the input cast's backward widens a bf16 gradient exactly and the output
 * cast's rounds it back to itself; the loss reads the same values from the f32 output, and its
 * gradient, computed in f32 by the same expression, is rounded once either way (on the MSE's
 * store, or by the cast back). At worlds 2 and 3 (3 pads and leaves an empty shard). */
static void test_output_dtype_exact(void)
{
    make_batch();
    for (int w = 2; w <= 3; w++) {
        mp_run_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
        *a = (mp_run_t){.api = FSDP_API_FSDP2,
                        .world = w,
                        .param = FSDP_DTYPE_BF16,
                        .reduce = FSDP_DTYPE_UNSET,
                        .output = FSDP_DTYPE_UNSET};
        *b = *a;
        b->output = FSDP_DTYPE_F32;
        CU_ASSERT_EQUAL_FATAL(run_ranks(w, mp_rank, a), FSDP_OK);
        CU_ASSERT_EQUAL_FATAL(run_ranks(w, mp_rank, b), FSDP_OK);
        CU_ASSERT(a->total > 0 && a->total == b->total);
        CU_ASSERT(memcmp(a->final, b->final, a->total * sizeof(float)) == 0);
        CU_ASSERT(memcmp(a->losses, b->losses, sizeof(a->losses)) == 0);
        free(a);
        free(b);
    }
}

/* ---------------- frozen parameters and divide factors ---------------- */

/* A root without parameters and a unit a of w [4, 3] and b [5]: each rank writes gradient
 * rank + 1 into every trainable parameter, then the sharded gradient is read back. */
typedef struct grad_case {
    int frozen_w;             /* w has requires_grad = 0 */
    double divide_factor;     /* fsdp_unit_options_t.gradient_divide_factor */
    int force_sum;            /* .force_sum_reduction */
    fsdp_dtype_t reduce;      /* the reduce dtype (FSDP_DTYPE_UNSET: f32) */
    int mark_copies;          /* log the copies too (C_COPY) */
    float got_b[8], got_w[8]; /* rank r's first element of b's and w's rows in its shard */
    float w_after[8];         /* w's first element after an SGD step with weight decay */
} grad_case_t;

static fsdp_status_t write_grad(fsdp_dev_t *dev, fsdp_unit_t *u, int index, size_t n, float v)
{
    void *g;
    float host[16];
    fsdp_status_t status = fsdp_unit_grad(u, index, &g);

    for (size_t i = 0; i < n; i++)
        host[i] = v;
    if (status == FSDP_OK)
        status =
            fsdp_dev_memcpy_async(dev, g, host, n * sizeof(float), fsdp_dev_compute_stream(dev));
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, fsdp_dev_compute_stream(dev));
    return status;
}

static fsdp_status_t grad_rank(fsdp_dev_t *dev, void *arg)
{
    grad_case_t *gc = arg;
    fsdp_backend_ops_t wrapped;
    fsdp_config_t fc;
    fsdp_unit_options_t o;
    fsdp_t *fs;
    fsdp_unit_t *root, *a;
    fsdp_param_spec_t ps[2] = {{.name = "a.w", .ndim = 2, .shape = {4, 3}, .tied_to = -1},
                               {.name = "a.b", .ndim = 1, .shape = {5}, .tied_to = -1}};
    fsdp_param_info_t wi, bi;
    fsdp_optim_config_t oc;
    fsdp_optim_t *opt;
    float ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, *g, *ls;
    int r = dev->rank;

    inner_ops = dev->ops;
    wrap_ops(dev, &wrapped);
    mark_gemms = mark_casts = 0;
    mark_copies = gc->mark_copies;
    if (mark_copies)
        wrapped.kernel = marking_kernel;
    ps[0].requires_grad = !gc->frozen_w;
    ps[1].requires_grad = 1;
    fsdp_config_init(&fc);
    fc.api = FSDP_API_FSDP2;
    fc.mixed_precision.reduce_dtype = gc->reduce;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    fsdp_unit_options_init(&o);
    o.gradient_divide_factor = gc->divide_factor;
    o.force_sum_reduction = gc->force_sum;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_create(fs, "root", NULL, NULL, 0, &root));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_create_ex(fs, "a", root, ps, 2, &o, &a));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_set_param(a, 0, ones));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_set_param(a, 1, ones));
    tl_nlog = 0;
    FSDP_RANK_REQUIRE_OK(&failure, dev, forward_to_backward(root, a));
    if (!gc->frozen_w)
        FSDP_RANK_REQUIRE_OK(&failure, dev, write_grad(dev, a, 0, 12, (float)(r + 1)));
    FSDP_RANK_REQUIRE_OK(&failure, dev, write_grad(dev, a, 1, 5, (float)(r + 1)));
    FSDP_RANK_REQUIRE_OK(&failure, dev, finish_backward(fs, root, a));
    memcpy(seq_log[r], tl_log, sizeof(coll_t) * (size_t)tl_nlog);
    seq_nlog[r] = tl_nlog;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_param_info(a, 0, &wi));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_param_info(a, 1, &bi));
    g = fsdp_unit_sharded_grad(a);
    FSDP_RANK_REQUIRE_MSG(&failure, r, g != NULL, "no sharded gradient");
    gc->got_b[r] = bi.in_shard ? g[bi.offset_in_shard] : -1.0f;
    gc->got_w[r] = wi.in_shard ? g[wi.offset_in_shard] : -1.0f;
    /* the optimizer leaves a frozen parameter as it was, weight decay included */
    fsdp_optim_config_init(&oc, FSDP_OPTIM_SGD);
    oc.lr = 0.5f;
    oc.weight_decay = 0.1f;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_optim_create(fs, &oc, &opt));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_optim_step(opt));
    ls = fsdp_unit_local_shard(a);
    gc->w_after[r] = wi.in_shard ? ls[wi.offset_in_shard] : -1.0f;
    fsdp_optim_destroy(opt);
    fsdp_destroy(fs);
    return FSDP_OK;
}

/* Frozen parameters take no part in the reduce-scatter (its size follows the parameters with
 * a gradient: b's chunk of 2 of A = 6 + 2 at W = 3), get no gradient and no optimizer step. w's
 * 4 rows are 2, 2 and 0 on the three ranks; b's 5 rows 2, 2 and 1. */
static void test_frozen(void)
{
    grad_case_t gc = {.frozen_w = 1, .reduce = FSDP_DTYPE_UNSET};
    const coll_t want[] = {AG(8, 3, F32), AG(8, 3, F32), RS(2, 3, F32, AVG)};

    memset(seq_nlog, 0, sizeof(seq_nlog));
    CU_ASSERT_EQUAL_FATAL(run_ranks(3, grad_rank, &gc), FSDP_OK);
    for (int r = 0; r < 3; r++) {
        CU_ASSERT_EQUAL(seq_nlog[r], 3);
        for (int i = 0; i < 3 && i < seq_nlog[r]; i++) {
            CU_ASSERT_EQUAL(seq_log[r][i].kind, want[i].kind);
            CU_ASSERT_EQUAL(seq_log[r][i].n, want[i].n);
        }
        CU_ASSERT_EQUAL(gc.got_b[r], 2.0f); /* the average of 1, 2 and 3 */
        CU_ASSERT_EQUAL(gc.got_w[r], r < 2 ? 0.0f : -1.0f);
        CU_ASSERT_EQUAL(gc.w_after[r], r < 2 ? 1.0f : -1.0f);
    }

    /* the copies: the copy-outs of W * A = 24, the chunk-cat of b's chunks alone, and the
     * relayout of the reduced gradient into the shard, zeros in w's slot, one launch each */
    const coll_t copies[] = {AG(8, 3, F32),   COPY(24, 2, F32),   AG(8, 3, F32),  COPY(24, 2, F32),
                             COPY(6, 1, F32), RS(2, 3, F32, AVG), COPY(8, 2, F32)};
    gc.mark_copies = 1;
    memset(seq_nlog, 0, sizeof(seq_nlog));
    CU_ASSERT_EQUAL_FATAL(run_ranks(3, grad_rank, &gc), FSDP_OK);
    for (int r = 0; r < 3; r++) {
        CU_ASSERT_EQUAL(seq_nlog[r], 7);
        for (int i = 0; i < 7 && i < seq_nlog[r]; i++) {
            CU_ASSERT_EQUAL(seq_log[r][i].kind, copies[i].kind);
            CU_ASSERT_EQUAL(seq_log[r][i].n, copies[i].n);
            CU_ASSERT_EQUAL(seq_log[r][i].group_size, copies[i].group_size);
        }
        CU_ASSERT_EQUAL(gc.got_b[r], 2.0f);
        CU_ASSERT_EQUAL(gc.got_w[r], r < 2 ? 0.0f : -1.0f);
    }
    gc.mark_copies = 0;

    gc.frozen_w = 0; /* trainable: in the reduce-scatter, and stepped */
    memset(seq_nlog, 0, sizeof(seq_nlog));
    CU_ASSERT_EQUAL_FATAL(run_ranks(3, grad_rank, &gc), FSDP_OK);
    for (int r = 0; r < 3; r++) {
        CU_ASSERT(seq_nlog[r] == 3 && seq_log[r][2].n == 8);
        CU_ASSERT_EQUAL(gc.got_w[r], r < 2 ? 2.0f : -1.0f);
        if (r < 2) /* 1 - 0.5 * (2 + 0.1 * 1) */
            CU_ASSERT(fabsf(gc.w_after[r] - (1.0f - 0.5f * (2.0f + 0.1f))) < 1e-6f);
    }
}

/* set_gradient_divide_factor and set_force_sum_reduction_for_comms (semantics 1): f = W is
 * AVG; another f a PREMUL_SUM by 1 / f; forced sums divide by W after; f16 with f = 6 divides
 * by 2 before and 3 after (pre/post factors of 6). Gradients 1, 2, 3 on three ranks. */
static void test_divide_factors(void)
{
    static const struct {
        double f;
        int force;
        fsdp_dtype_t rd;
        fsdp_reduce_op_t op;
        float want;
    } cases[] = {
        {0.0, 0, FSDP_DTYPE_UNSET, FSDP_REDUCE_AVG, 2.0f},
        {3.0, 0, FSDP_DTYPE_UNSET, FSDP_REDUCE_AVG, 2.0f},
        {6.0, 0, FSDP_DTYPE_UNSET, FSDP_REDUCE_SUM, 1.0f},
        {0.0, 1, FSDP_DTYPE_UNSET, FSDP_REDUCE_SUM, 2.0f},
        {6.0, 0, FSDP_DTYPE_F16, FSDP_REDUCE_SUM, 1.0f},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        grad_case_t gc = {
            .divide_factor = cases[c].f, .force_sum = cases[c].force, .reduce = cases[c].rd};
        memset(seq_nlog, 0, sizeof(seq_nlog));
        CU_ASSERT_EQUAL_FATAL(run_ranks(3, grad_rank, &gc), FSDP_OK);
        for (int r = 0; r < 3; r++) {
            int rs = seq_nlog[r] - 1;
            CU_ASSERT(rs >= 0 && seq_log[r][rs].kind == C_RS && seq_log[r][rs].op == cases[c].op);
            CU_ASSERT_EQUAL(gc.got_b[r], cases[c].want);
            CU_ASSERT_EQUAL(gc.got_w[r], r < 2 ? cases[c].want : -1.0f);
        }
    }
}

/* ---------------- FSDPModule's controls ---------------- */

/* unshard() outside forward and backward gathers a unit's parameters (their values those of
 * fsdp_unit_gather_full), reshard() frees them; set_reshard_after_backward(False) keeps a
 * unit's parameters after backward, so the next forward gathers the other units only. */
static fsdp_status_t controls_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp;
    fsdp_unit_t *l1;
    float x[2 * 16] = {0}, y[2 * 4] = {0}, loss, full[20 * 30 + 20], got[20 * 30];
    fsdp_mem_stats_t st;
    int r = dev->rank;
    fsdp_backend_ops_t wrapped;
    (void)arg;

    wrap_ops(dev, &wrapped);
    fsdp_config_init(&fc);
    fc.api = FSDP_API_FSDP2;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_create(fs, dims3, 3, &mlp));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_init_params(mlp, 5));
    l1 = fsdp_mlp_layer(mlp, 1);
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_unit_unshard(l1), FSDP_ERR_STATE); /* before lazy init */
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_forward_backward(mlp, x, y, 2, &loss));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_gather_full(l1, full));
    FSDP_RANK_CHECK(&failure, r, fsdp_unit_param(l1, 0) == NULL);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_unshard(l1));
    FSDP_RANK_REQUIRE_MSG(&failure, r, fsdp_unit_param(l1, 0) != NULL, "no unsharded weight");
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         fsdp_dev_memcpy_async(dev, got, fsdp_unit_param(l1, 0), sizeof(got),
                                               fsdp_dev_compute_stream(dev)));
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         fsdp_dev_stream_synchronize(dev, fsdp_dev_compute_stream(dev)));
    FSDP_RANK_CHECK(&failure, r, memcmp(got, full, sizeof(got)) == 0);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_reshard(l1));
    FSDP_RANK_CHECK(&failure, r, fsdp_unit_param(l1, 0) == NULL);
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    FSDP_RANK_CHECK_EQ(&failure, r, st.by_category[FSDP_MEM_UNSHARDED_PARAM], 0);

    /* kept after backward: 2560 + 3072 + 1024 bytes of the three units' parameters */
    for (int l = 0; l < 3; l++)
        FSDP_RANK_REQUIRE_OK(&failure, dev,
                             fsdp_unit_set_reshard_after_backward(fsdp_mlp_layer(mlp, l), 0));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_forward_backward(mlp, x, y, 2, &loss));
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    FSDP_RANK_CHECK_EQ(&failure, r, st.by_category[FSDP_MEM_UNSHARDED_PARAM], 6656);
    tl_nlog = 0;
    tl_counts.all_gather = 0;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_forward_backward(mlp, x, y, 2, &loss));
    /* reshard after forward still frees them in forward; backward gathers again, forward not */
    FSDP_RANK_CHECK_EQ(&failure, r, tl_counts.all_gather, 3);
    for (int l = 0; l < 3; l++)
        FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_reshard(fsdp_mlp_layer(mlp, l)));
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    FSDP_RANK_CHECK_EQ(&failure, r, st.by_category[FSDP_MEM_UNSHARDED_PARAM], 0);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_controls(void)
{
    launch_quiet(3, FSDP_SIM_DATA, controls_rank); /* the refusal before lazy init logs */
}

/* ---------------- the layout ---------------- */

static fsdp_status_t layout_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp;
    fsdp_param_info_t pi;
    static const size_t slots[3] = {170, 217, 42};
    /* rows of each layer's weight on ranks 0, 1, 2: S = 10, 7, 2 */
    static const size_t rows[3][3] = {{10, 10, 10}, {7, 7, 6}, {2, 2, 0}};
    int r = dev->rank;
    (void)arg;

    fsdp_config_init(&fc);
    fc.api = FSDP_API_FSDP2;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_mlp_create(fs, dims3, 3, &mlp));
    for (int l = 0; l < 3; l++) {
        fsdp_unit_t *u = fsdp_mlp_layer(mlp, l);
        size_t in = (size_t)dims3[l];
        FSDP_RANK_CHECK_EQ(&failure, r, fsdp_unit_shard_numel(u), slots[l]);
        FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_param_info(u, 0, &pi));
        FSDP_RANK_CHECK_EQ(&failure, r, pi.numel_in_shard, rows[l][r] * in);
        FSDP_RANK_CHECK_EQ(&failure, r, pi.in_shard, rows[l][r] > 0);
        FSDP_RANK_CHECK_EQ(&failure, r, pi.offset_in_shard, 0);
        if (rows[l][r] > 0)
            FSDP_RANK_CHECK_EQ(&failure, r, pi.intra_start, (size_t)r * rows[l][0] * in);
        /* the bias's slot follows the weight's padded chunk */
        FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_param_info(u, 1, &pi));
        FSDP_RANK_CHECK_EQ(&failure, r, pi.offset_in_shard, rows[l][0] * in);
        FSDP_RANK_CHECK_EQ(&failure, r, pi.numel_in_shard, rows[l][r]);
    }
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_layout(void)
{
    CU_ASSERT_EQUAL(run_ranks(3, layout_rank, NULL), FSDP_OK);
}

/* ---------------- parity with one process ---------------- */

static double parity(run_cfg_t *cfg)
{
    run_result_t *res = calloc(1, sizeof(*res));
    double maxdiff = run_fsdp_against_ref(cfg, res), moved = 0.0;

    CU_ASSERT_EQUAL(res->total, 42 + 48 + 21);
    for (size_t i = 0; i < res->total; i++)
        moved += fabs((double)res->final_params[i] - res->init[i]);
    CU_ASSERT(moved > 1e-2); /* training moved the parameters */
    free(res);
    if (maxdiff > 1e-6)
        fprintf(stderr, "\n  fsdp2 W=%d raf %d: max |fsdp - reference| = %g\n", cfg->world,
                cfg->raf, maxdiff);
    return maxdiff;
}

/* Worlds 1 to 6 (3, 5 and 6 pad every layer, and leave high ranks empty shards), AdamW and SGD
 * with momentum, every reshard_after_forward and prefetch schedule. */
static void test_parity_worlds(void)
{
    make_batch();
    ref_batch = MAXB_ALL;
    for (int w = 1; w <= 6; w++) {
        for (int k = 0; k < 2; k++) {
            run_cfg_t cfg = {.world = w, .steps = 4, .fsdp2 = 1};
            fsdp_optim_config_init(&cfg.optim, k ? FSDP_OPTIM_SGD : FSDP_OPTIM_ADAMW);
            cfg.optim.lr = k ? 5e-2f : 1e-2f;
            cfg.optim.momentum = k ? 0.9f : 0.0f;
            CU_ASSERT(parity(&cfg) <= 1e-6);
            cfg.raf_set = 1;
            cfg.raf = w % 2 ? FSDP_RESHARD_FALSE : FSDP_RESHARD_TRUE;
            cfg.explicit_fwd = cfg.explicit_bwd = k;
            CU_ASSERT(parity(&cfg) <= 1e-6);
            if (w == 4 || w == 6) { /* to groups of 2 (and of 3 at W = 6) */
                cfg.raf = 2 + (w == 6 && k);
                CU_ASSERT(parity(&cfg) <= 1e-6);
            }
        }
    }
    ref_batch = MAXB;
}

/* CPUOffloadPolicy: the shards and the reduced gradients in pinned host memory, the optimizer
 * on the host; with accumulation under sync off, and at W = 1 (no all-gather). */
static void test_parity_offload(void)
{
    make_batch();
    ref_batch = MAXB_ALL;
    for (int w = 1; w <= 3; w++) {
        run_result_t *res = calloc(1, sizeof(*res));
        run_cfg_t cfg = {.world = w, .steps = 3, .fsdp2 = 1, .cpu_offload = 1};
        fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_ADAMW);
        cfg.optim.lr = 1e-2f;
        CU_ASSERT(parity(&cfg) <= 1e-6);
        cfg.micro = 2;
        cfg.sync[0] = 0;
        cfg.sync[1] = 1;
        CU_ASSERT(parity(&cfg) <= 1e-6);
        /* the shards live on the host: no device bytes of sharded parameters between steps */
        run_fsdp(&cfg, res);
        for (int r = 0; r < w; r++) {
            CU_ASSERT_EQUAL(res->sharded_param_bytes[r], 0);
            CU_ASSERT(res->pinned_bytes[r] > 0);
        }
        free(res);
    }
    ref_batch = MAXB;
}

/* Gradient accumulation without sync for the first micro-batches, clipping, and HSDP. */
static void test_parity_accum_clip_hsdp(void)
{
    make_batch();
    ref_batch = MAXB_ALL;
    for (int w = 2; w <= 6; w += 2) {
        /* the micro-batches split each rank's 60 / W rows evenly */
        run_cfg_t cfg = {.world = w,
                         .steps = 3,
                         .fsdp2 = 1,
                         .micro = w == 6 ? 2 : 3,
                         .sync = {0, w == 6, 1},
                         .clip_max = 0.05,
                         .clip_type = 2.0};
        fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_ADAMW);
        cfg.optim.lr = 1e-2f;
        CU_ASSERT(parity(&cfg) <= 1e-6);
        if (w >= 4) {
            run_cfg_t h = {.world = w,
                           .steps = 3,
                           .fsdp2 = 1,
                           .strategy = FSDP_HYBRID_SHARD,
                           .ranks_per_node = 2};
            fsdp_optim_config_init(&h.optim, FSDP_OPTIM_ADAMW);
            h.optim.lr = 1e-2f;
            CU_ASSERT(parity(&h) <= 1e-6);
        }
    }
    ref_batch = MAXB;
}

/* ---------------- refusals ---------------- */

static fsdp_status_t refusal_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_unit_t *root, *u;
    fsdp_param_spec_t scalar = {.name = "s", .ndim = 0, .requires_grad = 1, .tied_to = -1};
    int r = dev->rank;
    (void)arg;

    fsdp_config_init(&fc);
    fc.api = FSDP_API_FSDP2;
    fc.strategy = FSDP_SHARD_GRAD_OP;
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_create(dev, &fc, &fs), FSDP_ERR_INVALID_PARAM);
    fc.strategy = FSDP_FULL_SHARD;
    fc.mixed_precision.buffer_dtype = FSDP_DTYPE_BF16; /* MixedPrecisionPolicy has none */
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_create(dev, &fc, &fs), FSDP_ERR_INVALID_PARAM);
    fc.mixed_precision.buffer_dtype = FSDP_DTYPE_UNSET;
    fc.api = (fsdp_api_t)7;
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_create(dev, &fc, &fs), FSDP_ERR_INVALID_PARAM);
    fc.api = FSDP_API_FSDP2;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_create(fs, "root", NULL, NULL, 0, &root));
    /* fully_shard refuses scalars */
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_unit_create(fs, "s", root, &scalar, 1, &u),
                       FSDP_ERR_INVALID_PARAM);
    /* and has no summon_full_params */
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_summon_full_params(root, NULL), FSDP_ERR_UNSUPPORTED);
    fsdp_destroy(fs);

    /* FSDPModule's controls are fully_shard's */
    fc.api = FSDP_API_FSDP1;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &fc, &fs));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_unit_create(fs, "root", NULL, NULL, 0, &root));
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_unit_set_prefetch(root, 0, NULL, 0),
                       FSDP_ERR_INVALID_PARAM);
    FSDP_RANK_CHECK_EQ(&failure, r, fsdp_unit_set_reshard_after_backward(root, 0),
                       FSDP_ERR_INVALID_PARAM);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_refusals(void)
{
    launch_quiet(2, FSDP_SIM_DATA, refusal_rank);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"layout: dim-0 chunks padded per parameter (W = 3)", test_layout},
        {"sequence: W = 3, reshard after forward", test_seq_world3},
        {"sequence: W = 3, no reshard after forward", test_seq_no_reshard},
        {"sequence: W = 3, gradient sync off", test_seq_sync_off},
        {"sequence: W = 4, reshard after forward to groups of 2", test_seq_reshard_to_group},
        {"sequence: W = 2, explicit and implicit prefetch", test_seq_explicit},
        {"sequence: HSDP on a 2 x 2 mesh", test_seq_hsdp},
        {"sequence: bf16 parameters, f32 and f16 reduction", test_seq_mixed_precision},
        {"sequence: output_dtype f32 casts at every unit's boundary", test_seq_output_dtype},
        {"sequence: one group_copy a unit for the copy-out and the chunk-cat",
         test_seq_group_copies},
        {"memory: closed forms per category (W = 3)", test_memory_closed_forms},
        {"memory: output_dtype's casts (W = 3)", test_memory_output_dtype},
        {"output_dtype f32 under bf16: the same losses and weights", test_output_dtype_exact},
        {"parity with one process, worlds 1 to 6", test_parity_worlds},
        {"parity: accumulation, clipping, HSDP", test_parity_accum_clip_hsdp},
        {"parity: CPU offload", test_parity_offload},
        {"bf16 rounds where FSDP1's bf16 with an f32 reduction does", test_bf16_rounding},
        {"frozen parameters: no gradient, no reduction, no step", test_frozen},
        {"divide factors: AVG, PREMUL_SUM, forced SUM, f16", test_divide_factors},
        {"unshard, reshard, reshard_after_backward", test_controls},
        {"refusals", test_refusals},
        {NULL, NULL},
    };
    return fsdp_test_run("fsdp2", tests);
}
