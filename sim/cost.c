/* The sim's cost model: how long an op takes once it starts.
 *
 * Every op of the sim backend (kernels, copies, event records, collectives) is priced here and
 * nowhere else, from the world's cluster profile (profile.c; numbers and sources in
 * traces/profiles/README.md):
 *
 *  - GEMMs and fused attention by their FLOPs at the matmul peak times the kernel's efficiency
 *    and its tile and wave quantization on the GPU's SMs; other kernels by roofline,
 *    max(FLOPs / (peak x efficiency), bytes / (HBM x efficiency)); each plus a fixed kernel
 *    latency, FLOPs and bytes from fsdp_kernel_cost(); under eager ops a fused element-wise
 *    kernel is priced as the PyTorch ops HF's model runs instead (docs/costs.md);
 *  - copies by bandwidth: PCIe for host<->device, a read and a write of HBM device to device;
 *  - collectives by NCCL's own model (src/graph/tuning.cc, ncclTopoTuneModel and
 *    ncclTopoGetAlgoTime): time = latency + bytes / algorithm bandwidth for every enabled
 *    (algorithm, protocol), the fastest winning, with NVLink latencies and bandwidth inside a
 *    node and the network's when the group spans nodes.
 *
 * Everything is a pure function of the profile and the op: no wall clock, no state.
 */
#include "sim.h"

#include "kernels/attn_dims.h"
#include "kernels/kinds.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *fsdp_sim_copy_name(fsdp_sim_copy_kind_t kind)
{
    static const char *const names[FSDP_SIM_COPY_COUNT] = {"h2d", "d2h", "d2d", "h2h"};

    return (unsigned)kind < FSDP_SIM_COPY_COUNT ? names[kind] : "invalid";
}

/* 0: device memory, 1: host memory (pinned or not). */
static int addr_on_device(const fsdp_sim_dev_t *dev, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    size_t i = fsdp_sim_seg_search(dev, a);

    return i > 0 && a < dev->segs[i - 1].end && dev->segs[i - 1].kind == FSDP_MEMKIND_DEVICE;
}

fsdp_sim_copy_kind_t fsdp_sim_copy_kind(const fsdp_sim_dev_t *dev, const void *dst, const void *src)
{
    int d = addr_on_device(dev, dst), s = addr_on_device(dev, src);

    if (d && s)
        return FSDP_SIM_COPY_D2D;
    if (d)
        return FSDP_SIM_COPY_H2D;
    return s ? FSDP_SIM_COPY_D2H : FSDP_SIM_COPY_H2H;
}

double fsdp_sim_profile_matmul_flops(const fsdp_sim_profile_t *p, fsdp_dtype_t dtype)
{
    if ((unsigned)dtype >= FSDP_DTYPE_COUNT)
        return 0.0;
    if (dtype == FSDP_DTYPE_F32 && p->gpu.allow_tf32)
        return p->gpu.tf32_flops_per_s;
    return p->gpu.matmul_flops_per_s[dtype];
}

/* Bytes of one element. */
static double dsz(fsdp_dtype_t dtype)
{
    return (double)fsdp_dtype_size(dtype);
}

/* 1 when a GEMM runs on tensor cores and a row of A, B or C does not start 16 bytes after the
 * one before (a leading dimension of 0 is a single row, aligned). */
static int gemm_unaligned(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k)
{
    const size_t ld[3] = {k->u.gemm.lda, k->u.gemm.ldb, k->u.gemm.ldc};
    const fsdp_dtype_t dt[3] = {k->u.gemm.a_dtype, k->u.gemm.b_dtype, k->u.gemm.c_dtype};

    if (k->u.gemm.a_dtype == FSDP_DTYPE_F32 && !p->gpu.allow_tf32)
        return 0; /* CUDA cores */
    for (int i = 0; i < 3; i++)
        if (ld[i] * fsdp_dtype_size(dt[i]) % 16 != 0)
            return 1;
    return 0;
}

/* t = work / (rate x efficiency); a rate of 0 means the resource is not modeled (free). */
static double rate_time(double work, double rate, double efficiency)
{
    if (work <= 0.0 || rate <= 0.0)
        return 0.0;
    return work / (rate * efficiency);
}

/* ---- GEMMs and fused attention: efficiency x quantization ---------------------------- */

static double ceil_div(double a, double b)
{
    return ceil(a / b);
}

/* whole waves of `tiles` work units on `sms` SMs */
static double wave_quantization(double tiles, int sms)
{
    if (sms <= 0 || tiles <= 0.0)
        return 1.0;
    return tiles / (ceil_div(tiles, (double)sms) * (double)sms);
}

/* cuBLAS's smaller tiles, for outputs whose 128 x 256 tiles leave SMs idle */
static const double gemm_tiles[][2] = {
    {FSDP_SIM_GEMM_TILE_M, FSDP_SIM_GEMM_TILE_N}, {128, 128}, {64, 128}, {64, 64}};

/* The tile is chosen for the whole GPU's `sms` (the library does not know what else runs);
 * its waves run on the `free` SMs. */
static double gemm_quantization_on(double m, double n, double batch, int sms, int free)
{
    double lo = m < n ? m : n, hi = m < n ? n : m, tm = 0.0, tn = 0.0, a = 0.0, b = 0.0;

    if (sms <= 0 || m <= 0.0 || n <= 0.0)
        return 1.0;
    if (batch < 1.0)
        batch = 1.0;
    /* the largest tile that fills one wave of every SM, else the smallest */
    for (size_t i = 0; i < sizeof(gemm_tiles) / sizeof(gemm_tiles[0]); i++) {
        a = gemm_tiles[i][0];
        b = gemm_tiles[i][1];
        tm = ceil_div(lo, a);
        tn = ceil_div(hi, b);
        if (tm * tn * batch >= (double)sms)
            break;
    }
    return lo * hi / (tm * a * tn * b) * wave_quantization(tm * tn * batch, free);
}

double fsdp_sim_gemm_quantization(double m, double n, double batch, int sms)
{
    return gemm_quantization_on(m, n, batch, sms, sms);
}

double fsdp_sim_attention_quantization(double batch, double heads, double seq, int sms)
{
    double blocks;

    if (sms <= 0 || seq <= 0.0)
        return 1.0;
    blocks = ceil_div(seq, FSDP_SIM_ATTN_BLOCK);
    return seq / (blocks * FSDP_SIM_ATTN_BLOCK) *
           wave_quantization(batch * heads * blocks, sms);
}

/* The fused attention kernel's efficiency: the profile's table by sequence length where it has
 * one (linear in log2(seq) between its points, the nearer end's value outside them; the row of
 * head_dim 64 and below, or the one above), else attention_efficiency. */
static double attention_efficiency_at(const fsdp_sim_gpu_profile_t *g, double seq, double head_dim)
{
    const double *e = g->attention_seq_efficiency[head_dim > 64.0 ? 1 : 0];
    double x;
    int i;

    if (e[0] <= 0.0)
        return g->attention_efficiency;
    x = seq > 0.0 ? log2(seq / FSDP_SIM_ATTN_SEQ_MIN) : 0.0;
    if (x <= 0.0)
        return e[0];
    if (x >= FSDP_SIM_ATTN_SEQ_POINTS - 1)
        return e[FSDP_SIM_ATTN_SEQ_POINTS - 1];
    i = (int)x;
    return e[i] + (x - i) * (e[i + 1] - e[i]);
}

/* ---- eager element-wise ops ------------------------------------------------------------ */

/* One eager PyTorch op: a kernel reading and writing these bytes, one FLOP an output element
 * at most. An op on PyTorch's non-vectorized element-wise path (a broadcast operand, a strided
 * view, a dtype conversion; softmax) also has `elems`, the elements it computes, which it
 * cannot run faster than strided_elements_per_s; 0 for a vectorized op or a reduction. */
typedef struct eager_op {
    double read, write, elems;
} eager_op_t;

#define MAX_EAGER_OPS 24

typedef struct eager_seq {
    int n;
    eager_op_t op[MAX_EAGER_OPS];
} eager_seq_t;

static void sop(eager_seq_t *s, double read, double write, double elems)
{
    if (s->n < MAX_EAGER_OPS) {
        s->op[s->n].read = read;
        s->op[s->n].write = write;
        s->op[s->n].elems = elems;
        s->n++;
    }
}

/* a vectorized op or a reduction: bound by its bytes alone */
static void eop(eager_seq_t *s, double read, double write)
{
    sop(s, read, write, 0.0);
}

/* HF's eager GPT-2 attention moves q, k, v (n elements each) between the projection's [B, T, H,
 * hd] layout and the [B, H, T, hd] its matmuls take, as strided copies; the counts per layer are
 * traces/measured/h200-gpt2-eager-ops.json's. Forward, four: torch.matmul's reshape of q's and
 * k's transposed views into [B x H, T, hd] (without checkpointing, HF's DynamicCache cats k and
 * v into the cache instead, and v then needs none) and of v's, and the output's reshape back
 * into [B, T, C]. Backward, three: the output gradient's into [B, H, T, hd] and those of q's and
 * k's or v's gradients back, then split's backward, a cat of the three gradients (3n). n 0:
 * none. */
static void layout_copies(eager_seq_t *s, double e, double n, int fwd)
{
    if (n <= 0.0)
        return;
    for (int i = 0; i < (fwd ? 4 : 3); i++)
        sop(s, e * n, e * n, n);
    if (!fwd)
        sop(s, 3 * e * n, 3 * e * n, 3 * n);
}

/* The ops HF's modeling_llama.py (transformers 4.4x) or modeling_gpt2.py and autograd run for
 * what k does in one kernel; docs/costs.md, "Eager element-wise ops", lists each with its
 * source. n elements of e bytes (the activations' dtype), r rows; f32 intermediates are 4
 * bytes; casts to the dtype it already has are no ops. sop: the op takes PyTorch's
 * non-vectorized path (TensorIterator vectorizes only contiguous operands of one dtype; a
 * widening cast runs unrolled); q and k are rotated as [B, H, T, hd] views of [B, T, H, hd]
 * tensors. Returns 0 for a kernel eager PyTorch also runs as one. */
static int eager_ops(const fsdp_kernel_t *k, eager_seq_t *s)
{
    double e, n, r, c;
    int lowp;

    s->n = 0;
    switch (k->kind) {
    case FSDP_K_RMSNORM_FWD:
        /* LlamaRMSNorm.forward: h = x.to(f32); var = h.pow(2).mean(-1, keepdim); h = h *
         * rsqrt(var + eps); return weight * h.to(dtype) */
        e = dsz(k->u.rmsnorm_fwd.dtype);
        r = (double)k->u.rmsnorm_fwd.rows;
        c = (double)k->u.rmsnorm_fwd.cols;
        n = r * c;
        lowp = e != 4.0;
        if (lowp)
            sop(s, e * n, 4 * n, n);     /* to(f32) */
        eop(s, 4 * n, 4 * n);            /* pow(2) */
        eop(s, 4 * n, 4 * r);            /* mean(-1) */
        eop(s, 4 * r, 4 * r);            /* + eps */
        eop(s, 4 * r, 4 * r);            /* rsqrt */
        sop(s, 4 * n + 4 * r, 4 * n, n); /* h * rstd (broadcast) */
        if (lowp)
            eop(s, 4 * n, e * n);        /* to(dtype) */
        sop(s, e * n + e * c, e * n, n); /* weight * (broadcast) */
        return 1;
    case FSDP_K_RMSNORM_BWD:
        e = dsz(k->u.rmsnorm_bwd.dtype);
        r = (double)k->u.rmsnorm_bwd.rows;
        c = (double)k->u.rmsnorm_bwd.cols;
        n = r * c;
        lowp = e != 4.0;
        if (k->u.rmsnorm_bwd.dweight != NULL) {
            eop(s, 2 * e * n, e * n); /* mul backward: dy * normalized (weight's grad) */
            eop(s, e * n, e * c);     /* summed over the rows (sum_to_size) */
        }
        if (k->u.rmsnorm_bwd.dx == NULL)
            return 1;
        sop(s, e * n + e * c, e * n, n); /* mul backward: dy * weight (broadcast) */
        if (lowp)
            sop(s, e * n, 4 * n, n);     /* to(dtype) backward: to(f32) */
        sop(s, 4 * n + 4 * r, 4 * n, n); /* (h * rstd) backward: g * rstd (broadcast) */
        eop(s, 8 * n, 4 * n);         /* ... and g * h for rstd's grad */
        eop(s, 4 * n, 4 * r);         /* summed over the row */
        eop(s, 8 * r, 4 * r);         /* rsqrt backward */
        sop(s, 4 * r, 4 * n, n);      /* mean backward: expand / cols (an expanded view) */
        eop(s, 4 * n, 4 * n);         /* pow backward: h.pow(1) */
        eop(s, 4 * n, 4 * n);         /* x 2 */
        eop(s, 8 * n, 4 * n);         /* x grad */
        eop(s, 8 * n, 4 * n);         /* h's two gradients summed */
        if (lowp)
            eop(s, 4 * n, e * n);     /* to(f32) backward: to(dtype) */
        if (k->u.rmsnorm_bwd.accumulate)
            eop(s, 2 * e * n, e * n); /* autograd sums the residual's gradients */
        return 1;
    case FSDP_K_ROPE_FWD:
        /* apply_rotary_pos_emb on q or k: q * cos + rotate_half(q) * sin, rotate_half =
         * cat((-x2, x1), -1); cos and sin [batch, seq, head_dim] in the dtype */
        e = dsz(k->u.rope.dtype);
        n = (double)k->u.rope.rows * (double)k->u.rope.heads * (double)k->u.rope.head_dim;
        c = e * (double)k->u.rope.rows * (double)k->u.rope.head_dim; /* cos or sin */
        sop(s, e * n / 2, e * n / 2, n / 2); /* -x2 (a view) */
        sop(s, e * n, e * n, n);             /* cat (of views) */
        sop(s, e * n + c, e * n, n);         /* q * cos (a view, broadcast) */
        sop(s, e * n + c, e * n, n);         /* rotate_half(q) * sin (broadcast) */
        sop(s, 2 * e * n, e * n, n);         /* + (the two layouts differ) */
        return 1;
    case FSDP_K_ROPE_BWD:
        e = dsz(k->u.rope.dtype);
        n = (double)k->u.rope.rows * (double)k->u.rope.heads * (double)k->u.rope.head_dim;
        c = e * (double)k->u.rope.rows * (double)k->u.rope.head_dim;
        sop(s, e * n + c, e * n, n);         /* mul backward: g * cos (broadcast) */
        sop(s, e * n + c, e * n, n);         /* mul backward: g * sin (broadcast) */
        sop(s, e * n / 2, e * n / 2, n / 2); /* neg backward (a view) */
        for (int i = 0; i < 2; i++) { /* slice backward of x1 and x2: zeros, then the half */
            eop(s, 0, e * n);
            sop(s, e * n / 2, e * n / 2, n / 2);
        }
        eop(s, 2 * e * n, e * n); /* the three gradients of q summed */
        eop(s, 2 * e * n, e * n);
        return 1;
    case FSDP_K_SWIGLU_FWD:
        /* LlamaMLP: act_fn(gate) * up */
        e = dsz(k->u.swiglu_fwd.dtype);
        n = (double)k->u.swiglu_fwd.n;
        eop(s, e * n, e * n);     /* silu */
        eop(s, 2 * e * n, e * n); /* * up */
        return 1;
    case FSDP_K_SWIGLU_BWD:
        e = dsz(k->u.swiglu_bwd.dtype);
        n = (double)k->u.swiglu_bwd.n;
        eop(s, 2 * e * n, e * n); /* mul backward: dy * up */
        eop(s, 2 * e * n, e * n); /* mul backward: dy * silu(gate) */
        eop(s, 2 * e * n, e * n); /* silu_backward */
        return 1;
    case FSDP_K_GELU_FWD:
        /* HF's NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
         * pow(x, 3)))), eight ops on contiguous tensors */
        e = dsz(k->u.gelu_fwd.dtype);
        n = (double)k->u.gelu_fwd.n;
        eop(s, e * n, e * n);     /* pow(x, 3) */
        eop(s, e * n, e * n);     /* 0.044715 * */
        eop(s, 2 * e * n, e * n); /* x + */
        eop(s, e * n, e * n);     /* sqrt(2 / pi) * */
        eop(s, e * n, e * n);     /* tanh */
        eop(s, e * n, e * n);     /* 1 + */
        eop(s, e * n, e * n);     /* 0.5 * x */
        eop(s, 2 * e * n, e * n); /* the product */
        return 1;
    case FSDP_K_GELU_BWD:
        /* autograd through the eight: the product's two gradients, 0.5 *, tanh_backward,
         * sqrt(2 / pi) *, 0.044715 *, pow's (pow(x, 2), 3 *, the product), and the three
         * gradients of x summed */
        e = dsz(k->u.gelu_bwd.dtype);
        n = (double)k->u.gelu_bwd.n;
        eop(s, 2 * e * n, e * n); /* g * (1 + tanh) */
        eop(s, 2 * e * n, e * n); /* g * 0.5 x */
        eop(s, e * n, e * n);     /* 0.5 * */
        eop(s, 2 * e * n, e * n); /* tanh_backward */
        eop(s, e * n, e * n);     /* sqrt(2 / pi) * */
        eop(s, e * n, e * n);     /* 0.044715 * */
        eop(s, e * n, e * n);     /* pow(x, 2) */
        eop(s, e * n, e * n);     /* 3 * */
        eop(s, 2 * e * n, e * n); /* the product */
        eop(s, 2 * e * n, e * n); /* x's gradients summed */
        eop(s, 2 * e * n, e * n);
        return 1;
    case FSDP_K_SOFTMAX_FWD:
        /* HF's eager GPT-2 attention on the scores: the scaling, the causal mask added as a
         * [B, 1, T, T] tensor broadcast over the heads (the mask itself read from cache), the
         * softmax (one kernel, a row in a warp's registers); and with the head size, the
         * layouts' copies of q, k, v and the output */
        e = dsz(k->u.softmax_fwd.dtype);
        n = (double)k->u.softmax_fwd.rows * (double)k->u.softmax_fwd.cols;
        eop(s, e * n, e * n); /* * scale or / divisor */
        if (k->u.softmax_fwd.causal)
            sop(s, e * n, e * n, n); /* + mask (broadcast) */
        eop(s, e * n, e * n);        /* softmax */
        layout_copies(s, e, (double)k->u.softmax_fwd.rows * (double)k->u.softmax_fwd.head_dim, 1);
        return 1;
    case FSDP_K_SOFTMAX_BWD:
        /* the softmax's backward, whose CUDA implementation first computes grad * output as a
         * torch op of its own (softmax_backward_cuda_out, aten/src/ATen/native/cuda/SoftMax.cu),
         * then the softmax's kernel; the scaling's backward; with the head size, the copies */
        e = dsz(k->u.softmax_bwd.dtype);
        n = (double)k->u.softmax_bwd.rows * (double)k->u.softmax_bwd.cols;
        eop(s, 2 * e * n, e * n); /* grad * output */
        eop(s, 2 * e * n, e * n); /* _softmax_backward_data's kernel (that product, y) */
        eop(s, e * n, e * n);     /* the scaling's backward */
        layout_copies(s, e, (double)k->u.softmax_bwd.rows * (double)k->u.softmax_bwd.head_dim, 0);
        return 1;
    case FSDP_K_CROSS_ENTROPY:
        /* logits.float(); cross_entropy = log_softmax + nll_loss; / the tokens */
        e = dsz(k->u.cross_entropy.dtype);
        r = (double)k->u.cross_entropy.rows;
        n = r * (double)k->u.cross_entropy.vocab;
        lowp = e != 4.0;
        if (lowp)
            sop(s, e * n, 4 * n, n); /* float() */
        sop(s, 4 * n, 4 * n, n);     /* log_softmax */
        eop(s, 4 * r + 8 * r, 4);  /* nll_loss: the target's log-probability, summed */
        eop(s, 4, 4);              /* / tokens */
        if (k->u.cross_entropy.dlogits == NULL)
            return 1;
        eop(s, 4, 4);              /* div backward */
        eop(s, 0, 4 * n);          /* nll_loss_backward: zeros */
        eop(s, 8 * r + 4, 4 * r);  /* ... and -grad at each target */
        sop(s, 8 * n, 4 * n, n);   /* log_softmax_backward (grad, output) */
        if (lowp)
            eop(s, 4 * n, e * n);  /* float() backward */
        return 1;
    case FSDP_K_EMBEDDING_BWD:
        /* embedding_dense_backward (CUDA): a zeroed [vocab, dim] gradient, the token ids
         * sorted (radix sort: keys and values, 8 bytes each), per-segment partial sums in f32,
         * then added into the rows of the gradient */
        if (k->u.embedding_bwd.dwte == NULL)
            return 0;
        e = dsz(k->u.embedding_bwd.dtype);
        r = (double)k->u.embedding_bwd.rows;
        n = r * (double)k->u.embedding_bwd.cols;
        eop(s, 0, e * (double)k->u.embedding_bwd.vocab * (double)k->u.embedding_bwd.cols);
        eop(s, 16 * r, 16 * r);
        eop(s, 16 * r, 16 * r);
        eop(s, 8 * r, 8 * r); /* segment offsets */
        eop(s, e * n + 8 * r, 4 * n);
        eop(s, 4 * n, e * n);
        if (k->u.embedding_bwd.dwpe != NULL) /* GPT-2's positions: a second table */
            eop(s, e * n, e * n);
        return 1;
    case FSDP_K_ATTENTION_FWD:
    case FSDP_K_ATTENTION_BWD: {
        /* the fused kernel itself, plus the copies between the [B, T, H, hd] layout of the
         * projections and SDPA's [B, H, T, hd] (three per layer in the kernel trace of HF's
         * LlamaAttention with SDPA, traces/measured/h200-llama-4layer-flash-ops.json; one is
         * taken as forward's, two as backward's), and with grouped-query attention repeat_kv's
         * copies of k and v to every query head (HF's and torchtitan's) and their sums in
         * backward */
        fsdp_attn_dims_t a = fsdp_attn_dims(k);
        int fwd = a.fwd;
        double b = a.batch, t = a.seq, h = a.heads, kv = a.kv_heads, hd = a.head_dim;
        e = dsz(a.dtype);
        n = b * t * h * hd;
        for (int i = 0; i < (fwd ? 1 : 2); i++)
            sop(s, e * n, e * n, n);
        for (int i = 0; kv < h && i < 2; i++) {
            if (fwd) /* expand and reshape: a strided copy */
                sop(s, e * b * t * kv * hd, e * n, n);
            else /* summed over each group's heads */
                eop(s, e * n, e * b * t * kv * hd);
        }
        return 1;
    }
    default:
        return 0;
    }
}

double fsdp_sim_eager_bytes(const fsdp_kernel_t *k, int *ops_p)
{
    eager_seq_t s;
    double flops, bytes = 0.0;

    if (!eager_ops(k, &s) || fsdp_kb_cost_class(k->kind) == FSDP_KC_ATTENTION) {
        fsdp_kernel_cost(k, &flops, &bytes);
        if (ops_p != NULL)
            *ops_p = 1 + s.n;
        for (int i = 0; i < s.n; i++)
            bytes += s.op[i].read + s.op[i].write;
        return bytes;
    }
    for (int i = 0; i < s.n; i++)
        bytes += s.op[i].read + s.op[i].write;
    if (ops_p != NULL)
        *ops_p = s.n;
    return bytes;
}

double fsdp_sim_kernel_hbm_bytes(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k)
{
    double flops, bytes;
    eager_seq_t s;

    if (p->ops == FSDP_SIM_OPS_EAGER && eager_ops(k, &s))
        return fsdp_sim_eager_bytes(k, NULL);
    fsdp_kernel_cost(k, &flops, &bytes);
    return bytes;
}

int fsdp_sim_kind_eager(fsdp_kernel_kind_t kind)
{
    fsdp_kernel_t d;
    eager_seq_t s;

    if ((unsigned)kind >= FSDP_K_COUNT)
        return 0;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    if (kind == FSDP_K_EMBEDDING_BWD)
        return 1; /* with a token table to fill; without, one kernel */
    return eager_ops(&d, &s);
}

int fsdp_sim_kernel_launches(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k)
{
    int n;

    if (p->ops != FSDP_SIM_OPS_EAGER)
        return 1;
    fsdp_sim_eager_bytes(k, &n);
    return n;
}

/* An element-wise kernel's roofline time. */
static double roofline(const fsdp_sim_profile_t *p, double peak, double flops, double bytes)
{
    double tc = rate_time(flops, peak, p->gpu.compute_efficiency);
    double tm = rate_time(bytes, p->gpu.hbm_bytes_per_s, p->gpu.memory_efficiency);

    return (tc > tm ? tc : tm) + p->gpu.kernel_latency_s;
}

/* An eager op's time: its bytes at the element-wise ops' share of the memory bandwidth, or its
 * elements at the non-vectorized path's rate when that is longer (an op does one FLOP an
 * element at most: memory-bound on every profile). */
static double eager_op_time(const fsdp_sim_profile_t *p, const eager_op_t *op)
{
    double eff = p->gpu.elementwise_memory_efficiency > 0.0 ? p->gpu.elementwise_memory_efficiency
                                                            : p->gpu.memory_efficiency;
    double t = rate_time(op->read + op->write, p->gpu.hbm_bytes_per_s, eff) +
               p->gpu.kernel_latency_s;
    double te = rate_time(op->elems, p->gpu.strided_elements_per_s, 1.0) +
                p->gpu.kernel_latency_s;

    return te > t ? te : t;
}

/* k's time from its FLOPs and bytes (fsdp_kernel_cost), with `sms` SMs free for it: the
 * matrix products' peak is the free SMs' share, and their waves are counted on those SMs. */
static double kernel_time_of(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k, double flops,
                             double bytes, int sms)
{
    double tc, tm, t, share = p->gpu.sms > 0 && sms < p->gpu.sms ? (double)sms / p->gpu.sms : 1.0;
    eager_seq_t s;

    /* GEMMs at the matmul rate of their operands' dtype (f32: CUDA cores, or TF32 when
     * allowed), times their efficiency and quantization, and on tensor cores the unaligned
     * kernels' share when a row is not 16-byte aligned; memory-bound if their bytes say so */
    switch (fsdp_kb_cost_class(k->kind)) {
    case FSDP_KC_MATMUL: {
        double q = gemm_quantization_on((double)k->u.gemm.m, (double)k->u.gemm.n,
                                        (double)k->u.gemm.batch, p->gpu.sms, sms);
        if (gemm_unaligned(p, k))
            q *= p->gpu.gemm_unaligned_efficiency;
        tc = rate_time(flops, fsdp_sim_profile_matmul_flops(p, k->u.gemm.a_dtype),
                       p->gpu.gemm_efficiency * q * share);
        tm = rate_time(bytes, p->gpu.hbm_bytes_per_s, p->gpu.memory_efficiency);
        return (tc > tm ? tc : tm) + p->gpu.kernel_latency_s;
    }
    /* fused attention: its products on tensor cores, at the attention kernel's efficiency */
    case FSDP_KC_ATTENTION: {
        fsdp_attn_dims_t a = fsdp_attn_dims(k);
        double q = fsdp_sim_attention_quantization(a.batch, a.heads, a.seq, sms);
        tc = rate_time(flops, fsdp_sim_profile_matmul_flops(p, a.dtype),
                       attention_efficiency_at(&p->gpu, a.seq, a.head_dim) * q * share);
        tm = rate_time(bytes, p->gpu.hbm_bytes_per_s, p->gpu.memory_efficiency);
        t = (tc > tm ? tc : tm) + p->gpu.kernel_latency_s;
        if (p->ops == FSDP_SIM_OPS_EAGER && eager_ops(k, &s))
            for (int i = 0; i < s.n; i++)
                t += eager_op_time(p, &s.op[i]);
        return t;
    }
    case FSDP_KC_VECTOR:
        break;
    }
    /* element-wise work on CUDA cores; eager: op by op */
    if (p->ops == FSDP_SIM_OPS_EAGER && eager_ops(k, &s)) {
        t = 0.0;
        for (int i = 0; i < s.n; i++)
            t += eager_op_time(p, &s.op[i]);
        return t;
    }
    return roofline(p, p->gpu.vector_flops_per_s, flops, bytes);
}

double fsdp_sim_kernel_time(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k)
{
    double flops, bytes;

    fsdp_kernel_cost(k, &flops, &bytes);
    return kernel_time_of(p, k, flops, bytes, p->gpu.sms);
}

double fsdp_sim_kernel_time_on(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k, int sms)
{
    double flops, bytes;

    fsdp_kernel_cost(k, &flops, &bytes);
    if (sms < 1)
        sms = 1;
    if (p->gpu.sms > 0 && sms > p->gpu.sms)
        sms = p->gpu.sms;
    return kernel_time_of(p, k, flops, bytes, p->gpu.sms > 0 ? sms : 0);
}

double fsdp_sim_copy_time(const fsdp_sim_profile_t *p, fsdp_sim_copy_kind_t kind, double bytes)
{
    double t;

    if (bytes <= 0.0)
        return 0.0;
    switch (kind) {
    case FSDP_SIM_COPY_H2D:
        t = rate_time(bytes, p->host.h2d_bytes_per_s, 1.0);
        break;
    case FSDP_SIM_COPY_D2D: /* every byte is read and written */
        t = rate_time(2.0 * bytes, p->gpu.hbm_bytes_per_s, p->gpu.memory_efficiency);
        break;
    default:
        t = rate_time(bytes, p->host.d2h_bytes_per_s, 1.0);
        break;
    }
    return t + p->gpu.kernel_latency_s;
}

/* ---- NCCL ------------------------------------------------------------------------------- */

/* NCCL's log2i of a byte count's 64-byte units: floor(log2(n)), -1 for n == 0. */
static int log2_units(double nbytes)
{
    double units = floor(nbytes / 64.0);
    int l = -1;

    while (units >= 1.0) {
        units = floor(units / 2.0);
        l++;
    }
    return l;
}

static int ilog2(int n)
{
    int l = 0;

    while (n >>= 1)
        l++;
    return l;
}

/* min(v, c) where c <= 0 means no cap. */
static double cap(double v, double c)
{
    return c > 0.0 && c < v ? c : v;
}

/* PAT's per-rank latency term, src/graph/tuning.cc (v2.30.7): base + log2(nodes) x inter / 3.5
 * + 2.8 us x nranks. */
#define PAT_RANK_LATENCY_S 2.8e-6

/* NCCL_MAX_NVLS_ARITY (src/include/device.h): the heads of an NVLS graph */
#define NVLS_MAX_HEADS 32

/* NCCL's NVLS graph inside one node (src/graph/search.cc, ncclTopoCompute and
 * ncclTopoSearchTryNvls) has a head, one channel, per GPU, each at one speed of Hopper's intra-node
 * search (sm90SpeedArrayIntra, GB/s): the fastest whose n + 1 shares, a GPU's own head counted
 * twice, fit its NVLink. The tuning's NVLS all-reduce busBw is then 2 x 0.85 x that speed x
 * (n - 1) (src/graph/tuning.cc): 476 GB/s on 8 H100s, 306 on 4, 102 on 2. The profile's NVLS
 * bandwidth is measured on 8 ranks; n ranks take NCCL's ratio of n's to 8's, 1 on 8. */
static double nvls_ranks_scale(double nvlink_bytes_per_s, int n)
{
    static const double speeds[] = {60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3};
    double head[2] = {0.0, 0.0};
    int ranks[2] = {n < NVLS_MAX_HEADS ? n : NVLS_MAX_HEADS, 8};

    for (int i = 0; i < 2; i++) {
        for (size_t s = 0; s < sizeof(speeds) / sizeof(speeds[0]) && head[i] == 0.0; s++) {
            if ((ranks[i] + 1) * speeds[s] * 1e9 <= nvlink_bytes_per_s)
                head[i] = speeds[s];
        }
    }
    if (head[1] == 0.0)
        return 1.0;
    return head[0] * (ranks[0] - 1) / (head[1] * 7.0);
}

/* 1 when the profile's NCCL is older than version code `code` (nccl.version 0: the newest) */
static int before(const fsdp_sim_nccl_profile_t *nc, int code)
{
    return nc->version > 0 && nc->version < code;
}

/* NCCL's tuning model of one (algorithm, protocol) on all channels: its latency and algorithm
 * bandwidth; 0 if the pair does not apply. */
static int nccl_algo(const fsdp_sim_nccl_profile_t *nc, fsdp_sim_coll_kind_t kind, int a, int pr,
                     int n, int nodes, int node_ranks, double nbytes, double *lat_p, double *bw_p)
{
    int ppn = n / nodes, cls = nodes <= 1 ? 0 : nodes == 2 ? 1 : 2;
    int all_reduce = kind == FSDP_SIM_COLL_ALL_REDUCE || kind == FSDP_SIM_COLL_BARRIER;
    int gather = kind == FSDP_SIM_COLL_ALL_GATHER || kind == FSDP_SIM_COLL_REDUCE_SCATTER;
    /* the formulas of NCCL's tuning model before 2.19, 2.21 and 2.23 (nccl.version; 0: 2.30's) */
    int v19 = before(nc, 21900), v21 = before(nc, 22100), v23 = before(nc, 22300);
    int nsteps, ninter;
    double bus, nic_bus = 0.0, lat, bw, inter, klat = pr == FSDP_SIM_PROTO_SIMPLE ? 2.0 : 1.0;

    if (all_reduce) {
        nsteps = 2 * (n - 1);
        /* before 2.23 an all-reduce ring counted 2 x nodes network steps, since 2 (nodes - 1) */
        ninter = nodes > 1 ? 2 * (nodes - (v23 ? 0 : 1)) : 0;
    } else if (kind == FSDP_SIM_COLL_BROADCAST) {
        nsteps = n;
        ninter = nodes > 1 ? nodes : 0;
    } else {
        nsteps = n - 1;
        ninter = nodes - 1;
    }
    /* A ring or tree crossing nodes leaves each node once per channel: the NICs the group's
     * ranks on a node drive together carry what NVLink carries inside it. A rank drives at most
     * one NIC, and the node's ranks, node_ranks of them running groups like this one at once,
     * share its NICs: a group with ppn of them has ppn / node_ranks of the node's NICs. */
    bus = nc->intra_bus_bytes_per_s;
    if (nodes > 1) {
        double share = (double)nc->nics_per_node * ppn / (node_ranks > ppn ? node_ranks : ppn);
        nic_bus = nc->nic_bytes_per_s * (share < ppn ? share : ppn);
        bus = cap(bus, nic_bus);
    }
    /* with one rank per node, latencies are fully exposed: the tree's network row (2.23+) */
    inter = nc->inter_latency_s[ppn == 1 && a == FSDP_SIM_ALGO_RING && !v23 ? FSDP_SIM_ALGO_TREE
                                                                            : a][pr] +
            nc->net_latency_s * klat;

    switch (a) {
    case FSDP_SIM_ALGO_RING:
        /* LL: half the bus since 2.21; before, a quarter for an all-reduce or across nodes, a
         * third otherwise. LL128: 0.92, before 2.23 0.7 with one rank per node */
        if (pr == FSDP_SIM_PROTO_LL) {
            double ll = !v21 ? 0.5 : all_reduce || nodes > 1 ? 0.25 : 1.0 / 3.0;
            bus = cap(ll * bus, nc->ll_max_bytes_per_s[cls]);
        } else if (pr == FSDP_SIM_PROTO_LL128)
            bus = cap((v23 && ppn < 2 ? 0.7 : 0.92) * bus,
                      nc->channels * nc->ring_ll128_channel_bytes_per_s[cls]);
        bw = bus * n / nsteps;
        lat = nc->base_latency_s[a][pr];
        if (kind == FSDP_SIM_COLL_BROADCAST) {
            /* a chain of n steps; Simple pays the tree's chunk latency per step */
            int la = pr == FSDP_SIM_PROTO_SIMPLE ? FSDP_SIM_ALGO_TREE : FSDP_SIM_ALGO_RING;
            lat +=
                nsteps * (nodes == 1 ? nc->intra_latency_s[la][pr] : nc->inter_latency_s[la][pr]);
        } else {
            double intra = nc->intra_latency_s[a][pr];
            if (nodes > 1) {
                double ovh = nc->net_overhead_s * (pr == FSDP_SIM_PROTO_SIMPLE ? 3.0 : 1.0);
                intra = intra > ovh ? intra : ovh;
            }
            lat += (nsteps - ninter) * intra + ninter * inter;
            /* plateau effect of multi-node rings (sm80 and later) */
            if (pr == FSDP_SIM_PROTO_SIMPLE && nodes > 1 && all_reduce &&
                nbytes / ((double)nc->channels * n) >= 64.0)
                lat *= nc->ring_plateau_factor;
        }
        break;
    case FSDP_SIM_ALGO_TREE:
        if (!all_reduce)
            return 0;
        bus = cap(0.92 * bus, nc->channels * nc->tree_channel_bytes_per_s[cls]);
        if (pr == FSDP_SIM_PROTO_LL)
            bus = cap(bus / 3.8, nc->ll_max_bytes_per_s[cls]);
        else if (pr == FSDP_SIM_PROTO_LL128)
            bus = cap(bus * (nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0),
                      nc->channels * nc->tree_ll128_channel_bytes_per_s[cls]);
        bw = 0.5 * bus;
        lat = nc->base_latency_s[a][pr] +
              2.0 * ((ppn - 1) * nc->intra_latency_s[a][pr] + ilog2(nodes) * inter);
        {
            int ls = log2_units(nbytes);
            if (ls >= 0 && ls < FSDP_SIM_TREE_SIZES)
                bw *= nc->tree_correction[pr][ls];
        }
        break;
    case FSDP_SIM_ALGO_NVLS:
        /* NVLink SHARP: all-reduce inside one node (multi-node NVLS needs CollNet); NVLS needs
         * two ranks or more on a node (src/transport/nvls.cc, localRanks) */
        if (!all_reduce || nodes > 1 || ppn < 2 || pr != FSDP_SIM_PROTO_SIMPLE ||
            nc->nvls_bus_bytes_per_s <= 0.0)
            return 0;
        bw = nc->nvls_bus_bytes_per_s * nvls_ranks_scale(nc->intra_bus_bytes_per_s, n) * n / nsteps;
        /* 2.19+ set the latency to the NVLink one; 2.18 added it to the base */
        lat = nc->intra_latency_s[a][pr] + (v19 ? nc->base_latency_s[a][pr] : 0.0);
        break;
    case FSDP_SIM_ALGO_NVLS_TREE:
        /* NVLS inside each node, a tree of nodes over the network: all-reduce across nodes */
        if (!all_reduce || nodes == 1 || ppn < 2 || pr != FSDP_SIM_PROTO_SIMPLE ||
            nc->nvls_bus_bytes_per_s <= 0.0)
            return 0;
        bus = cap(cap(nc->nvls_bus_bytes_per_s, nic_bus),
                  (nc->nvls_channels > 0 ? nc->nvls_channels : nc->channels) *
                      nc->nvls_tree_channel_bytes_per_s[cls]);
        bw = bus * n / nsteps;
        /* 2.18: base + 2 (nodes - 1) network steps; 2.19+: base + NVLink + 2 log2(nodes) */
        lat = nc->base_latency_s[a][pr] +
              (v19 ? 2.0 * (nodes - 1) * inter
                   : nc->intra_latency_s[a][pr] + 2.0 * ilog2(nodes) * inter);
        break;
    case FSDP_SIM_ALGO_PAT:
        /* all-gather and reduce-scatter with one rank per node, NCCL 2.23+; its busBw is left
         * unconverted, as NCCL's other non-ring all-gathers */
        if (!gather || nodes == 1 || ppn != 1 || pr != FSDP_SIM_PROTO_SIMPLE ||
            nc->pat_bandwidth_factor <= 0.0)
            return 0;
        bw = bus * nc->pat_bandwidth_factor;
        lat = nc->base_latency_s[a][pr] + ilog2(nodes) * inter / 3.5 + PAT_RANK_LATENCY_S * n;
        break;
    default:
        return 0;
    }
    if (!(bw > 0.0))
        return 0;
    *lat_p = lat;
    *bw_p = bw;
    return 1;
}

/* The channels NCCL runs a call on (src/enqueue.cc topoGetAlgoInfo): NVLS always its own;
 * ring, tree and PAT drop one while nbytes < channels x nt x threadThreshold. */
static int call_channels(const fsdp_sim_nccl_profile_t *nc, int a, int pr, int n, double nbytes)
{
    double per = nc->channel_bytes[pr];
    double c;

    if (a == FSDP_SIM_ALGO_NVLS || a == FSDP_SIM_ALGO_NVLS_TREE)
        return nc->nvls_channels > 0 ? nc->nvls_channels : nc->channels;
    if (a == FSDP_SIM_ALGO_RING && pr == FSDP_SIM_PROTO_LL)
        per *= n;
    if (per <= 0.0)
        return nc->channels;
    c = floor(nbytes / per);
    return c >= nc->channels ? nc->channels : c < 1.0 ? 1 : (int)c;
}

double fsdp_sim_coll_time(const fsdp_sim_profile_t *p, fsdp_sim_coll_kind_t kind, int nranks,
                          int nnodes, double nbytes, fsdp_sim_coll_cost_t *cost_p)
{
    return fsdp_sim_coll_time_shared(p, kind, nranks, nnodes, 0, nbytes, cost_p);
}

double fsdp_sim_coll_time_shared(const fsdp_sim_profile_t *p, fsdp_sim_coll_kind_t kind,
                                 int nranks, int nnodes, int node_ranks, double nbytes,
                                 fsdp_sim_coll_cost_t *cost_p)
{
    const fsdp_sim_nccl_profile_t *nc = &p->nccl;
    fsdp_sim_coll_cost_t best = {FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_SIMPLE, 0.0, 0.0, 0.0, 0.0, 0};
    double best_tuned = 0.0;
    int found = 0;

    if (nbytes < 0.0)
        nbytes = 0.0;
    if (kind == FSDP_SIM_COLL_SPLIT) {
        /* host-side bookkeeping only */
    } else if (nranks <= 1) {
        /* NCCL on one rank copies the buffer (nothing in place) */
        best.time_s = fsdp_sim_copy_time(p, FSDP_SIM_COPY_D2D, nbytes);
    } else {
        if (nnodes < 1)
            nnodes = 1;
        if (nnodes > nranks)
            nnodes = nranks;
        for (int a = 0; a < FSDP_SIM_ALGO_COUNT; a++) {
            if (!(nc->algorithms & (1u << a)))
                continue;
            for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++) {
                double lat, bw, t;
                if (!(nc->protocols & (1u << pr)) ||
                    !nccl_algo(nc, kind, a, pr, nranks, nnodes, node_ranks, nbytes, &lat, &bw))
                    continue;
                t = lat + nbytes / bw;
                /* NCCL ranks by its tuning time; strictly faster wins, ties keep the earlier */
                if (!found || t < best_tuned) {
                    best.algo = (fsdp_sim_algo_t)a;
                    best.proto = (fsdp_sim_proto_t)pr;
                    best.latency_s = lat;
                    best.algo_bytes_per_s = bw;
                    best_tuned = t;
                    found = 1;
                }
            }
        }
        if (found) {
            int full = best.algo == FSDP_SIM_ALGO_NVLS || best.algo == FSDP_SIM_ALGO_NVLS_TREE
                           ? 0
                           : nc->channels;
            best.channels = call_channels(nc, best.algo, best.proto, nranks, nbytes);
            if (full > 0)
                best.algo_bytes_per_s *= (double)best.channels / full;
            best.floor_s = nc->call_floor_s + (nnodes > 1 ? nc->net_floor_s : 0.0);
            best.time_s = best.floor_s + best.latency_s + nbytes / best.algo_bytes_per_s;
        }
    }
    if (cost_p != NULL)
        *cost_p = best;
    return best.time_s;
}

int fsdp_sim_count_nodes(const int *ranks, int n, int per_node)
{
    int *nodes, count = 0;

    if (n <= 0 || per_node <= 0)
        return 1;
    nodes = malloc((size_t)n * sizeof(*nodes));
    if (nodes == NULL) {
        /* quadratic, but needs no memory */
        for (int i = 0; i < n; i++) {
            int seen = 0;
            for (int j = 0; j < i && !seen; j++)
                seen = ranks[j] / per_node == ranks[i] / per_node;
            count += !seen;
        }
        return count;
    }
    /* group ranks are usually in node order: count changes, then check the rest sorted */
    for (int i = 0; i < n; i++)
        nodes[i] = ranks[i] / per_node;
    for (int i = 1; i < n; i++) {
        /* insertion sort: near-sorted input is linear */
        int v = nodes[i], j = i - 1;
        while (j >= 0 && nodes[j] > v) {
            nodes[j + 1] = nodes[j];
            j--;
        }
        nodes[j + 1] = v;
    }
    for (int i = 0; i < n; i++)
        count += i == 0 || nodes[i] != nodes[i - 1];
    free(nodes);
    return count;
}

double fsdp_sim_coll_op_cost(const fsdp_sim_dev_t *dev, const fsdp_sim_op_t *op, int *sms_p)
{
    const fsdp_sim_profile_t *p = dev->profile;
    fsdp_sim_coll_cost_t cost;
    double nbytes = (double)op->bytes, t;

    /* NCCL counts the full buffer of an all-gather or reduce-scatter */
    if (op->coll == FSDP_SIM_COLL_ALL_GATHER || op->coll == FSDP_SIM_COLL_REDUCE_SCATTER)
        nbytes *= op->comm->size;
    /* torch's barrier is an all-reduce of one element */
    if (op->coll == FSDP_SIM_COLL_BARRIER)
        nbytes = 4.0;
    /* the launch's ranks on a node share its NICs (FSDP's groups that span nodes with fewer
     * ranks on each, the hybrid replicate groups, all run at once) */
    t = fsdp_sim_coll_time_shared(p, op->coll, op->comm->size, op->comm->nodes,
                                  dev->world->params.ranks_per_node, nbytes, &cost);
    /* a group of one copies with the copy engine; a barrier holds the host, not a stream */
    if (sms_p != NULL)
        *sms_p = op->comm->size > 1 && op->coll != FSDP_SIM_COLL_BARRIER
                     ? cost.channels * p->nccl.sms_per_channel
                     : 0;
    return t;
}

double fsdp_sim_op_cost_flops(const fsdp_sim_dev_t *dev, const fsdp_sim_op_t *op, double *flops_p)
{
    const fsdp_sim_profile_t *p = dev->profile;
    double nbytes;

    *flops_p = 0.0;
    switch (op->kind) {
    case FSDP_SIM_OP_KERNEL:
        fsdp_kernel_cost(op->kernel, flops_p, &nbytes);
        return kernel_time_of(p, op->kernel, *flops_p, nbytes, p->gpu.sms);
    case FSDP_SIM_OP_MEMCPY:
        return fsdp_sim_copy_time(p, fsdp_sim_copy_kind(dev, op->dst, op->src), (double)op->bytes);
    case FSDP_SIM_OP_COLLECTIVE:
        return fsdp_sim_coll_op_cost(dev, op, NULL);
    case FSDP_SIM_OP_EVENT_RECORD:
    default:
        return 0.0;
    }
}
