/* Blocked f32 GEMM for the sim backend's data mode.
 *
 * The classic three-level blocking (Goto and van de Geijn, "Anatomy of high-performance matrix
 * multiplication", 2008): op(B) is packed KC x NC at a time into NR-wide column micro-panels
 * (kept in L3), op(A) MC x KC at a time into MR-tall row micro-panels (kept in L2), and a
 * register-blocked MR x NR micro-kernel streams one A micro-panel against one B micro-panel
 * (kept in L1). Packing turns all four transpose combinations and any leading dimension into
 * one contiguous, zero-padded layout, so a single micro-kernel serves every case and edge
 * tiles need no special code.
 *
 * Getting the operands there is most of what is left once the micro-kernel runs near its peak
 * (on the GPT-2 shapes of bench_gemm, 10 to 17% of the time went to packing): each B
 * micro-panel is packed just before its first use, by the first A block, while the source of
 * the next one is prefetched a share per micro-tile, so its lines arrive from L3 or memory
 * while the micro-kernel runs; up to MC_ONE rows A is one block, each B micro-panel is used
 * once and all of them go through one buffer that stays in L1. A row-major operand read as a
 * strip of columns (B not transposed, A transposed) is packed a row at a time across all its
 * micro-panels, in address order: a strip reads one line per row, rows kilobytes apart, which
 * the hardware prefetcher does not follow.
 *
 * The micro-kernel is plain C over GNU vector types (no intrinsics): gcc -O2 does not keep an
 * MR x NR float array in registers on its own (measured 3 to 7 flops per cycle on Zen 3), while
 * a tile of vector variables compiles to one broadcast, NR/W multiplies and NR/W adds per row
 * and k (29 flops per cycle with AVX2, of a peak of 32 without FMA). On x86-64 a second copy of
 * the same source is compiled for AVX2 and picked at run time, with the blocked loops around it
 * (packing, the stores into C); the baseline copy uses SSE2. Neither enables FMA, so both round
 * every product and every sum the same way: the result does not depend on the micro-kernel,
 * only on KC (test_kernels checks the bits agree).
 *
 * bf16 and f16 operands are widened to f32 while they are packed (exact, and cheap next to the
 * O(mnk) products), so every dtype runs the same micro-kernel in the same order; a 16-bit C
 * goes through an f32 workspace and is rounded once (fsdp_sim_gemm_ex), after the epilogue
 * (kernel.h: the bias added to the f32 product, as addmm does).
 *
 * Summation order, fixed for a shape: element C[i,j] accumulates k in ascending order inside
 * each KC block starting from 0; the first block is written as alpha*acc (+ beta*C), later
 * blocks are added as C += alpha*acc, in ascending order.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>

#include "kernels/kernel_elem.h"
#include "sim_kernels.h"

#define MR 6                /* micro-tile rows */
#define NR 16               /* micro-tile columns */
#define KC FSDP_SIM_GEMM_KC /* k depth of a packed block: A 6 KiB and B 16 KiB micro-panels */
#define MC 144              /* rows of a packed A block (multiple of MR): 144 KiB, in L2 */
#define MC_ONE 264          /* up to this many rows, one A block of them all (264 KiB, in L2) */
#define NC 3072             /* columns of a packed B panel (multiple of NR): 3 MiB, in L3 */

#if defined(__GNUC__)
#define FSDP_GEMM_VECTOR 1
#else
#define FSDP_GEMM_VECTOR 0
#endif

#if defined(__GNUC__)
#define FSDP_GEMM_INLINE inline __attribute__((always_inline))
#else
#define FSDP_GEMM_INLINE inline
#endif

#if FSDP_GEMM_VECTOR && defined(__x86_64__)
#define FSDP_GEMM_HAVE_AVX2 1
#else
#define FSDP_GEMM_HAVE_AVX2 0
#endif

/* Computes tile[MR][NR] = sum over p < kc of a[p][0..MR) (x) b[p][0..NR), from packed
 * micro-panels a (kc x MR) and b (kc x NR). */
typedef void (*fsdp_gemm_ukernel_t)(size_t kc, const float *__restrict a, const float *__restrict b,
                                    float *__restrict tile);

#if FSDP_GEMM_VECTOR
/* One source for every vector width: vtype holds vw floats; the MR rows of the tile are done
 * `rows` at a time (each pass over the whole of kc), so that the accumulators of a pass fit in
 * the registers of the target. Each element still sums p in ascending order. */
#define FSDP_GEMM_UKERNEL(name, attr, vtype, vw, rows)                                             \
    attr static void name(size_t kc, const float *__restrict a, const float *__restrict b,         \
                          float *__restrict tile)                                                  \
    {                                                                                              \
        for (int r0 = 0; r0 < MR; r0 += (rows)) {                                                  \
            vtype acc[rows][NR / (vw)];                                                            \
            _Pragma("GCC unroll 8") for (int i = 0; i < (rows); i++)                               \
                _Pragma("GCC unroll 8") for (int j = 0; j < NR / (vw); j++) acc[i][j] =            \
                    (vtype){0};                                                                    \
            for (size_t p = 0; p < kc; p++) {                                                      \
                vtype bv[NR / (vw)];                                                               \
                _Pragma("GCC unroll 8") for (int j = 0; j < NR / (vw); j++)                        \
                    memcpy(&bv[j], b + p * NR + (size_t)j * (vw), sizeof(vtype));                  \
                _Pragma("GCC unroll 8") for (int i = 0; i < (rows); i++)                           \
                {                                                                                  \
                    float ai = a[p * MR + (size_t)(r0 + i)];                                       \
                    _Pragma("GCC unroll 8") for (int j = 0; j < NR / (vw); j++) acc[i][j] +=       \
                        ai * bv[j];                                                                \
                }                                                                                  \
            }                                                                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < (rows); i++)                               \
                _Pragma("GCC unroll 8") for (int j = 0; j < NR / (vw); j++)                        \
                    memcpy(tile + (r0 + i) * NR + j * (vw), &acc[i][j], sizeof(vtype));            \
        }                                                                                          \
    }

/* 16 SSE registers: 3 rows x 4 vectors of accumulators, 4 of B */
typedef float fsdp_gemm_v4f_t __attribute__((vector_size(16)));
FSDP_GEMM_UKERNEL(fsdp_gemm_ukernel_generic, , fsdp_gemm_v4f_t, 4, 3)

#if FSDP_GEMM_HAVE_AVX2
/* 16 AVX registers: 6 rows x 2 vectors of accumulators, 2 of B, 1 broadcast */
typedef float fsdp_gemm_v8f_t __attribute__((vector_size(32)));
FSDP_GEMM_UKERNEL(fsdp_gemm_ukernel_avx2, __attribute__((target("avx2"))), fsdp_gemm_v8f_t, 8, 6)
#endif

#else /* !FSDP_GEMM_VECTOR: scalar C for other compilers */
static void fsdp_gemm_ukernel_generic(size_t kc, const float *__restrict a,
                                      const float *__restrict b, float *__restrict tile)
{
    float acc[MR][NR] = {{0}};
    for (size_t p = 0; p < kc; p++)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                acc[i][j] += a[p * MR + i] * b[p * NR + j];
    memcpy(tile, acc, sizeof(acc));
}
#endif

static atomic_int fsdp_gemm_isa_choice = FSDP_SIM_GEMM_AUTO;

/* 1 when this CPU (and this build) can run isa. */
static int fsdp_gemm_cpu_has(fsdp_sim_gemm_isa_t isa)
{
    switch (isa) {
    case FSDP_SIM_GEMM_GENERIC:
        return 1;
#if FSDP_GEMM_HAVE_AVX2
    case FSDP_SIM_GEMM_AVX2:
        return __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    default:
        return 0;
    }
}

static fsdp_sim_gemm_isa_t fsdp_gemm_isa(void)
{
    int choice = atomic_load_explicit(&fsdp_gemm_isa_choice, memory_order_relaxed);
    if (choice == FSDP_SIM_GEMM_AUTO)
        return fsdp_gemm_cpu_has(FSDP_SIM_GEMM_AVX2) ? FSDP_SIM_GEMM_AVX2 : FSDP_SIM_GEMM_GENERIC;
    return (fsdp_sim_gemm_isa_t)choice;
}

int fsdp_sim_gemm_set_isa(fsdp_sim_gemm_isa_t isa)
{
    if (isa != FSDP_SIM_GEMM_AUTO && !fsdp_gemm_cpu_has(isa))
        return 0;
    atomic_store_explicit(&fsdp_gemm_isa_choice, (int)isa, memory_order_relaxed);
    return 1;
}

const char *fsdp_sim_gemm_isa_name(void)
{
    if (fsdp_gemm_isa() == FSDP_SIM_GEMM_AVX2)
        return "avx2";
    return FSDP_GEMM_VECTOR ? "generic" : "scalar";
}

static size_t fsdp_gemm_min(size_t x, size_t y)
{
    return x < y ? x : y;
}

static size_t fsdp_gemm_round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

/* Element idx of a buffer of dtype dt, widened to f32 (exact). With dt a constant, as in the
 * per-dtype packers below, the switch folds away and the f32 packer is a plain copy. */
static inline float fsdp_gemm_ld(const void *base, fsdp_dtype_t dt, size_t idx)
{
    switch (dt) {
    case FSDP_DTYPE_BF16:
        return fsdp_kb_bf16_to_f32(((const uint16_t *)base)[idx]);
    case FSDP_DTYPE_F16:
        return fsdp_kb_f16_to_f32(((const uint16_t *)base)[idx]);
    default:
        return ((const float *)base)[idx];
    }
}

/* Packing a transposed operand: rows of the source (contiguous in p) become columns of the
 * panel (dst[p * w + r]). Whole groups of 4 rows go 4 x 4 at a time: 4 loads of 4 consecutive
 * elements, a transpose in registers, 4 stores of 4 (instead of one strided store per element).
 * Rows r < rows of the source start at element src + r * ld; returns the rows done (a multiple
 * of 4), which the caller finishes one at a time. Values are copied (16-bit ones widened), so
 * the panel holds the same bits either way. */
#if FSDP_GEMM_VECTOR
typedef float fsdp_gemm_v4t_t __attribute__((vector_size(16)));

static FSDP_GEMM_INLINE fsdp_gemm_v4t_t fsdp_gemm_ld4(const void *base, fsdp_dtype_t dt,
                                                      size_t idx)
{
    fsdp_gemm_v4t_t v;
    if (dt == FSDP_DTYPE_F32) {
        memcpy(&v, (const float *)base + idx, sizeof(v));
    } else {
        v = (fsdp_gemm_v4t_t){fsdp_gemm_ld(base, dt, idx), fsdp_gemm_ld(base, dt, idx + 1),
                              fsdp_gemm_ld(base, dt, idx + 2), fsdp_gemm_ld(base, dt, idx + 3)};
    }
    return v;
}

/* The four lanes i0..i3 of the eight of a and b (0-3 a's, 4-7 b's): clang's and gcc >= 12's
 * __builtin_shufflevector, gcc's older __builtin_shuffle. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define FSDP_GEMM_SHUF4(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define FSDP_GEMM_SHUF4(a, b, i0, i1, i2, i3)                                                     \
    __builtin_shuffle(a, b, (fsdp_gemm_v4i_t){i0, i1, i2, i3})
typedef int fsdp_gemm_v4i_t __attribute__((vector_size(16)));
#endif

static FSDP_GEMM_INLINE size_t fsdp_gemm_pack_t4(const void *src, fsdp_dtype_t dt, size_t ld,
                                                 size_t s0, size_t rows, size_t kc, size_t w,
                                                 float *__restrict dst)
{
    size_t r = 0;

    /* a 4 x 4 transpose in two rounds of shuffles */
    for (; r + 4 <= rows; r += 4) {
        size_t s = s0 + r * ld, p = 0;
        for (; p + 4 <= kc; p += 4) {
            fsdp_gemm_v4t_t x0 = fsdp_gemm_ld4(src, dt, s + p);
            fsdp_gemm_v4t_t x1 = fsdp_gemm_ld4(src, dt, s + ld + p);
            fsdp_gemm_v4t_t x2 = fsdp_gemm_ld4(src, dt, s + 2 * ld + p);
            fsdp_gemm_v4t_t x3 = fsdp_gemm_ld4(src, dt, s + 3 * ld + p);
            fsdp_gemm_v4t_t t0 = FSDP_GEMM_SHUF4(x0, x1, 0, 4, 1, 5);
            fsdp_gemm_v4t_t t1 = FSDP_GEMM_SHUF4(x0, x1, 2, 6, 3, 7);
            fsdp_gemm_v4t_t t2 = FSDP_GEMM_SHUF4(x2, x3, 0, 4, 1, 5);
            fsdp_gemm_v4t_t t3 = FSDP_GEMM_SHUF4(x2, x3, 2, 6, 3, 7);
            fsdp_gemm_v4t_t c0 = FSDP_GEMM_SHUF4(t0, t2, 0, 1, 4, 5);
            fsdp_gemm_v4t_t c1 = FSDP_GEMM_SHUF4(t0, t2, 2, 3, 6, 7);
            fsdp_gemm_v4t_t c2 = FSDP_GEMM_SHUF4(t1, t3, 0, 1, 4, 5);
            fsdp_gemm_v4t_t c3 = FSDP_GEMM_SHUF4(t1, t3, 2, 3, 6, 7);
            memcpy(dst + p * w + r, &c0, sizeof(c0));
            memcpy(dst + (p + 1) * w + r, &c1, sizeof(c1));
            memcpy(dst + (p + 2) * w + r, &c2, sizeof(c2));
            memcpy(dst + (p + 3) * w + r, &c3, sizeof(c3));
        }
        for (; p < kc; p++)
            for (size_t i = 0; i < 4; i++)
                dst[p * w + r + i] = fsdp_gemm_ld(src, dt, s + i * ld + p);
    }
    return r;
}
#else
static FSDP_GEMM_INLINE size_t fsdp_gemm_pack_t4(const void *src, fsdp_dtype_t dt, size_t ld,
                                                 size_t s0, size_t rows, size_t kc, size_t w,
                                                 float *__restrict dst)
{
    (void)src, (void)dt, (void)ld, (void)s0, (void)rows, (void)kc, (void)w, (void)dst;
    return 0;
}
#endif

/* Packs op(A)[i0 .. i0+mc, p0 .. p0+kc) into MR-row micro-panels: element (i, p) of the block
 * goes to ap[(i / MR) * kc * MR + p * MR + i % MR]; rows past mc are zero. 16-bit elements are
 * widened here, once per block, so the micro-kernel only ever sees f32. */
static FSDP_GEMM_INLINE void fsdp_gemm_pack_a_dt(int trans, const void *a, fsdp_dtype_t dt,
                                                 size_t lda, size_t i0, size_t mc, size_t p0,
                                                 size_t kc, float *__restrict ap)
{
    if (trans) { /* A is [K, M]: row p is contiguous in i, read one after the other */
        size_t mfull = mc / MR * MR, mr = mc - mfull;
        for (size_t p = 0; p < kc; p++) {
            size_t src = (p0 + p) * lda + i0;
            for (size_t ir = 0; ir < mfull; ir += MR) {
                float *dst = ap + ir * kc + p * MR;
                for (size_t ii = 0; ii < MR; ii++)
                    dst[ii] = fsdp_gemm_ld(a, dt, src + ir + ii);
            }
            if (mr > 0) {
                float *dst = ap + mfull * kc + p * MR;
                for (size_t ii = 0; ii < mr; ii++)
                    dst[ii] = fsdp_gemm_ld(a, dt, src + mfull + ii);
                for (size_t ii = mr; ii < MR; ii++)
                    dst[ii] = 0.0f;
            }
        }
        return;
    }
    for (size_t ir = 0; ir < mc; ir += MR) { /* A is [M, K]: row i is contiguous in p */
        size_t mr = fsdp_gemm_min(MR, mc - ir);
        float *dst = ap + ir * kc;
        size_t ii = fsdp_gemm_pack_t4(a, dt, lda, (i0 + ir) * lda + p0, mr, kc, MR, dst);
        for (; ii < mr; ii++) {
            size_t src = (i0 + ir + ii) * lda + p0;
            for (size_t p = 0; p < kc; p++)
                dst[p * MR + ii] = fsdp_gemm_ld(a, dt, src + p);
        }
        for (ii = mr; ii < MR; ii++)
            for (size_t p = 0; p < kc; p++)
                dst[p * MR + ii] = 0.0f;
    }
}

/* Packs op(B)[p0 .. p0+kc, j0 .. j0+nc) into NR-column micro-panels: element (p, j) goes to
 * bp[(j / NR) * kc * NR + p * NR + j % NR]; columns past nc are zero. */
static FSDP_GEMM_INLINE void fsdp_gemm_pack_b_dt(int trans, const void *b, fsdp_dtype_t dt,
                                                 size_t ldb, size_t p0, size_t kc, size_t j0,
                                                 size_t nc, float *__restrict bp)
{
    if (!trans) { /* B is [K, N]: rows contiguous in j, read one after the other */
        size_t nfull = nc / NR * NR, nr = nc - nfull;
        for (size_t p = 0; p < kc; p++) {
            size_t src = (p0 + p) * ldb + j0;
            for (size_t jr = 0; jr < nfull; jr += NR) {
                float *dst = bp + jr * kc + p * NR;
                if (dt == FSDP_DTYPE_F32) {
                    memcpy(dst, (const float *)b + src + jr, NR * sizeof(float));
                } else {
                    for (size_t jj = 0; jj < NR; jj++)
                        dst[jj] = fsdp_gemm_ld(b, dt, src + jr + jj);
                }
            }
            if (nr > 0) {
                float *dst = bp + nfull * kc + p * NR;
                for (size_t jj = 0; jj < nr; jj++)
                    dst[jj] = fsdp_gemm_ld(b, dt, src + nfull + jj);
                for (size_t jj = nr; jj < NR; jj++)
                    dst[jj] = 0.0f;
            }
        }
        return;
    }
    for (size_t jr = 0; jr < nc; jr += NR) { /* B is [N, K]: row j is contiguous in p */
        size_t nr = fsdp_gemm_min(NR, nc - jr);
        float *dst = bp + jr * kc;
        size_t jj = fsdp_gemm_pack_t4(b, dt, ldb, (j0 + jr) * ldb + p0, nr, kc, NR, dst);
        for (; jj < nr; jj++) {
            size_t src = (j0 + jr + jj) * ldb + p0;
            for (size_t p = 0; p < kc; p++)
                dst[p * NR + jj] = fsdp_gemm_ld(b, dt, src + p);
        }
        for (jj = nr; jj < NR; jj++)
            for (size_t p = 0; p < kc; p++)
                dst[p * NR + jj] = 0.0f;
    }
}

/* One packer per dtype, each with its dtype a constant. */
static FSDP_GEMM_INLINE void fsdp_gemm_pack_a(int trans, const void *a, fsdp_dtype_t dt, size_t lda,
                                              size_t i0, size_t mc, size_t p0, size_t kc,
                                              float *__restrict ap)
{
    if (dt == FSDP_DTYPE_BF16)
        fsdp_gemm_pack_a_dt(trans, a, FSDP_DTYPE_BF16, lda, i0, mc, p0, kc, ap);
    else if (dt == FSDP_DTYPE_F16)
        fsdp_gemm_pack_a_dt(trans, a, FSDP_DTYPE_F16, lda, i0, mc, p0, kc, ap);
    else
        fsdp_gemm_pack_a_dt(trans, a, FSDP_DTYPE_F32, lda, i0, mc, p0, kc, ap);
}

static FSDP_GEMM_INLINE void fsdp_gemm_pack_b(int trans, const void *b, fsdp_dtype_t dt, size_t ldb,
                                              size_t p0, size_t kc, size_t j0, size_t nc,
                                              float *__restrict bp)
{
    if (dt == FSDP_DTYPE_BF16)
        fsdp_gemm_pack_b_dt(trans, b, FSDP_DTYPE_BF16, ldb, p0, kc, j0, nc, bp);
    else if (dt == FSDP_DTYPE_F16)
        fsdp_gemm_pack_b_dt(trans, b, FSDP_DTYPE_F16, ldb, p0, kc, j0, nc, bp);
    else
        fsdp_gemm_pack_b_dt(trans, b, FSDP_DTYPE_F32, ldb, p0, kc, j0, nc, bp);
}

/* Prefetching a B micro-panel's source, in units: for a transposed B, the 64-byte lines of each
 * of its nr rows (kc elements long); otherwise its kc rows (nr elements each, one or two
 * lines). */
static FSDP_GEMM_INLINE size_t fsdp_gemm_prefetch_units(int trans, fsdp_dtype_t dt, size_t kc,
                                                        size_t nr)
{
    size_t es = dt == FSDP_DTYPE_F32 ? 4 : 2;
    return trans ? nr * ((kc * es + 63) / 64) : nr > 0 ? kc : 0;
}

/* Prefetches units u0 .. u1 of the source of B's micro-panel at columns j0 .. of the k block
 * p0 .. p0 + kc (the units of fsdp_gemm_prefetch_units). */
static FSDP_GEMM_INLINE void fsdp_gemm_prefetch_b(int trans, const void *b, fsdp_dtype_t dt,
                                                  size_t ldb, size_t p0, size_t kc, size_t j0,
                                                  size_t nr, size_t u0, size_t u1)
{
    size_t es = dt == FSDP_DTYPE_F32 ? 4 : 2, lines = (kc * es + 63) / 64;
    const char *base = b;
    if (trans) {
        size_t row = u0 / lines, line = u0 % lines;
        const char *src = base + ((j0 + row) * ldb + p0) * es;
        for (size_t u = u0; u < u1; u++) {
            __builtin_prefetch(src + line * 64);
            if (++line == lines) {
                line = 0;
                src += ldb * es;
            }
        }
    } else {
        for (size_t u = u0; u < u1; u++) {
            const char *row = base + ((p0 + u) * ldb + j0) * es;
            __builtin_prefetch(row);
            __builtin_prefetch(row + nr * es - 1);
        }
    }
}

/* Writes the valid mr x nr corner of a tile into C: the first k block sets C from alpha*acc
 * (and beta*C unless beta == 0, which must not read C), later blocks add alpha*acc. Full tiles
 * take loops of constant length, which gcc vectorizes. */
static FSDP_GEMM_INLINE void fsdp_gemm_tile_store(const float *__restrict tile, float *__restrict c,
                                                  size_t ldc, size_t mr, size_t nr, float alpha,
                                                  float beta, int first)
{
    if (mr == MR && nr == NR) {
        for (size_t i = 0; i < MR; i++) {
            const float *__restrict t = tile + i * NR;
            float *__restrict ci = c + i * ldc;
            if (!first) {
                for (size_t j = 0; j < NR; j++)
                    ci[j] += alpha * t[j];
            } else if (beta == 0.0f) {
                for (size_t j = 0; j < NR; j++)
                    ci[j] = alpha * t[j];
            } else {
                for (size_t j = 0; j < NR; j++)
                    ci[j] = alpha * t[j] + beta * ci[j];
            }
        }
        return;
    }
    for (size_t i = 0; i < mr; i++) {
        const float *t = tile + i * NR;
        float *ci = c + i * ldc;
        if (!first) {
            for (size_t j = 0; j < nr; j++)
                ci[j] += alpha * t[j];
        } else if (beta == 0.0f) {
            for (size_t j = 0; j < nr; j++)
                ci[j] = alpha * t[j];
        } else {
            for (size_t j = 0; j < nr; j++)
                ci[j] = alpha * t[j] + beta * ci[j];
        }
    }
}

/* C = beta * C, with beta == 0 writing zeros whatever C held. */
static void fsdp_gemm_scale_c(size_t m, size_t n, float beta, float *c, size_t ldc)
{
    if (beta == 1.0f)
        return;
    for (size_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        if (beta == 0.0f) {
            memset(ci, 0, n * sizeof(float));
        } else {
            for (size_t j = 0; j < n; j++)
                ci[j] *= beta;
        }
    }
}

/* A and B of a product that reads them (k > 0, alpha != 0): set, with leading dimensions that
 * hold their rows. */
static fsdp_status_t fsdp_gemm_check(int trans_a, int trans_b, size_t m, size_t n, size_t k,
                                     const void *a, size_t lda, const void *b, size_t ldb)
{
    size_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;

    if (a == NULL || b == NULL || lda < a_cols || ldb < b_cols) {
        fsdp_error("gemm: m %zu n %zu k %zu trans_a %d trans_b %d: A %s lda %zu (need >= %zu), "
                   "B %s ldb %zu (need >= %zu)",
                   m, n, k, trans_a ? 1 : 0, trans_b ? 1 : 0, a == NULL ? "NULL" : "set", lda,
                   a_cols, b == NULL ? "NULL" : "set", ldb, b_cols);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

/* Packing buffers, kept from one product to the next: a buffer of a few MiB, allocated and
 * freed on every call, comes back as fresh pages from the kernel, whose faults cost more than
 * a small product. A caller takes a free slot's buffer (growing it when too small) and gives it
 * back; with every slot taken (more threads than slots) it allocates its own. What the slots
 * hold stays reachable until the process exits. */
#define FSDP_GEMM_BUF_SLOTS 16

static struct {
    atomic_flag busy;
    float *buf;
    size_t bytes;
} fsdp_gemm_bufs[FSDP_GEMM_BUF_SLOTS] = {
#define FSDP_GEMM_BUF_SLOT {ATOMIC_FLAG_INIT, NULL, 0}
    FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT,
    FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT,
    FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT,
    FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT, FSDP_GEMM_BUF_SLOT,
#undef FSDP_GEMM_BUF_SLOT
};

/* A 64-byte aligned buffer of at least `bytes`, *slot_p the slot it belongs to (-1: none);
 * NULL when out of memory. */
static float *fsdp_gemm_buf_get(size_t bytes, int *slot_p)
{
    float *buf;

    for (int i = 0; i < FSDP_GEMM_BUF_SLOTS; i++) {
        if (atomic_flag_test_and_set_explicit(&fsdp_gemm_bufs[i].busy, memory_order_acquire))
            continue;
        if (fsdp_gemm_bufs[i].bytes < bytes) {
            free(fsdp_gemm_bufs[i].buf);
            fsdp_gemm_bufs[i].buf = NULL;
            fsdp_gemm_bufs[i].bytes = 0;
            if (posix_memalign((void **)&buf, 64, bytes) != 0) {
                atomic_flag_clear_explicit(&fsdp_gemm_bufs[i].busy, memory_order_release);
                return NULL;
            }
            fsdp_gemm_bufs[i].buf = buf;
            fsdp_gemm_bufs[i].bytes = bytes;
        }
        *slot_p = i;
        return fsdp_gemm_bufs[i].buf;
    }
    *slot_p = -1;
    return posix_memalign((void **)&buf, 64, bytes) == 0 ? buf : NULL;
}

static void fsdp_gemm_buf_put(float *buf, int slot)
{
    if (slot < 0)
        free(buf);
    else
        atomic_flag_clear_explicit(&fsdp_gemm_bufs[slot].busy, memory_order_release);
}

/* op(B) packed whole (fsdp_sim_gemm_pack_b's layout): the micro-panel of k block pc and columns
 * j .. j + NR of op(B) is at p + pc * npad + (col0 + j) * kc, where col0 is the first column of
 * this product in the packed operand (a column block of a split product). With fill, the
 * product packs each micro-panel there as it goes, as it would into its own buffer, for later
 * products to read; else it reads them. */
typedef struct fsdp_gemm_packed {
    float *p;
    size_t npad, col0;
    int fill;
} fsdp_gemm_packed_t;

/* The blocked product into an f32 C (c != NULL, ldc >= n, m and n > 0 checked by the caller),
 * with an MR x NR micro-kernel and MC-row A blocks (constants of each instance below); B packed
 * here, or into and from bpk when it is not NULL (read from it unless bpk->fill). */
static FSDP_GEMM_INLINE fsdp_status_t fsdp_gemm_blocked(
    int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const void *a,
    fsdp_dtype_t a_dtype, size_t lda, const void *b, fsdp_dtype_t b_dtype, size_t ldb, float beta,
    float *c, size_t ldc, const fsdp_gemm_packed_t *bpk, fsdp_gemm_ukernel_t ukernel)
{
    /* a single A block when m is small enough: each B micro-panel is then used once, packed
     * into one buffer of one micro-panel that stays in L1 */
    size_t mcb = m <= MC_ONE ? MC_ONE : MC, kc_max, mc_max, nc_max;
    float *buf, *ap, *bp;

    size_t bytes;
    int slot;

    kc_max = fsdp_gemm_min(k, KC);
    mc_max = fsdp_gemm_min(fsdp_gemm_round_up(m, MR), mcb);
    nc_max = m <= mcb || bpk != NULL ? NR : fsdp_gemm_min(fsdp_gemm_round_up(n, NR), NC);
    bytes = (mc_max + nc_max) * kc_max * sizeof(float);
    buf = fsdp_gemm_buf_get(bytes, &slot);
    if (buf == NULL) {
        fsdp_error("gemm: cannot allocate %zu bytes of packing buffers", bytes);
        return FSDP_ERR_NO_MEMORY;
    }
    ap = buf;
    bp = buf + mc_max * kc_max;

    for (size_t jc = 0; jc < n; jc += NC) {
        size_t nc = fsdp_gemm_min(NC, n - jc);
        for (size_t pc = 0; pc < k; pc += KC) {
            size_t kc = fsdp_gemm_min(KC, k - pc);
            for (size_t ic = 0; ic < m; ic += mcb) {
                size_t mc = fsdp_gemm_min(mcb, m - ic), tiles = (mc + MR - 1) / MR;
                fsdp_gemm_pack_a(trans_a, a, a_dtype, lda, ic, mc, pc, kc, ap);
                /* jr outside ir: one B micro-panel stays in L1 while A streams from L2 */
                for (size_t jr = 0; jr < nc; jr += NR) {
                    size_t nr = fsdp_gemm_min(NR, nc - jr);
                    size_t next_nr = jr + NR < nc ? fsdp_gemm_min(NR, nc - jr - NR) : 0;
                    int packs = ic == 0 && (bpk == NULL || bpk->fill);
                    size_t units =
                        packs ? fsdp_gemm_prefetch_units(trans_b, b_dtype, kc, next_nr) : 0;
                    /* the first A block packs each B micro-panel just before its first use, the
                     * source of the next one prefetched meanwhile, a share per micro-tile */
                    float *bpj = m <= mcb ? bp : bp + jr * kc;
                    if (bpk != NULL)
                        bpj = bpk->p + pc * bpk->npad + (bpk->col0 + jc + jr) * kc;
                    if (packs)
                        fsdp_gemm_pack_b(trans_b, b, b_dtype, ldb, pc, kc, jc + jr, nr, bpj);
                    for (size_t ir = 0, t = 0; ir < mc; ir += MR, t++) {
                        _Alignas(64) float tile[MR * NR];
                        float *ct = c + (ic + ir) * ldc + jc + jr;
                        size_t mr = fsdp_gemm_min(MR, mc - ir);
                        if (units > 0)
                            fsdp_gemm_prefetch_b(trans_b, b, b_dtype, ldb, pc, kc, jc + jr + NR,
                                                 next_nr, units * t / tiles,
                                                 units * (t + 1) / tiles);
                        /* C's rows arrive while the micro-kernel runs */
                        for (size_t i = 0; i < mr; i++) {
                            __builtin_prefetch(ct + i * ldc, 1);
                            __builtin_prefetch(ct + i * ldc + nr - 1, 1);
                        }
                        ukernel(kc, ap + ir * kc, bpj, tile);
                        fsdp_gemm_tile_store(tile, ct, ldc, mr, nr, alpha, beta, pc == 0);
                    }
                }
            }
        }
    }
    fsdp_gemm_buf_put(buf, slot);
    return FSDP_OK;
}

static fsdp_status_t fsdp_gemm_run_generic(int trans_a, int trans_b, size_t m, size_t n, size_t k,
                                           float alpha, const void *a, fsdp_dtype_t a_dtype,
                                           size_t lda, const void *b, fsdp_dtype_t b_dtype,
                                           size_t ldb, float beta, float *c, size_t ldc,
                                           const fsdp_gemm_packed_t *bpk)
{
    return fsdp_gemm_blocked(trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype, ldb,
                             beta, c, ldc, bpk, fsdp_gemm_ukernel_generic);
}

#if FSDP_GEMM_HAVE_AVX2
/* The same for the AVX2 micro-kernel, the packing and the stores compiled for AVX2 as well
 * (copies, and the same multiplies and adds element by element: the same bits) */
__attribute__((target("avx2"))) static fsdp_status_t
fsdp_gemm_run_avx2(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha,
                   const void *a, fsdp_dtype_t a_dtype, size_t lda, const void *b,
                   fsdp_dtype_t b_dtype, size_t ldb, float beta, float *c, size_t ldc,
                   const fsdp_gemm_packed_t *bpk)
{
    return fsdp_gemm_blocked(trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype, ldb,
                             beta, c, ldc, bpk, fsdp_gemm_ukernel_avx2);
}
#endif

static fsdp_status_t fsdp_gemm_run(int trans_a, int trans_b, size_t m, size_t n, size_t k,
                                   float alpha, const void *a, fsdp_dtype_t a_dtype, size_t lda,
                                   const void *b, fsdp_dtype_t b_dtype, size_t ldb, float beta,
                                   float *c, size_t ldc, const fsdp_gemm_packed_t *bpk)
{
    fsdp_status_t status;

    if (k == 0 || alpha == 0.0f) {
        fsdp_gemm_scale_c(m, n, beta, c, ldc);
        return FSDP_OK;
    }
    status = fsdp_gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb);
    if (status != FSDP_OK)
        return status;
    switch (fsdp_gemm_isa()) {
#if FSDP_GEMM_HAVE_AVX2
    case FSDP_SIM_GEMM_AVX2:
        return fsdp_gemm_run_avx2(trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype,
                                  ldb, beta, c, ldc, bpk);
#endif
    default:
        return fsdp_gemm_run_generic(trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype,
                                     ldb, beta, c, ldc, bpk);
    }
}

/* ---- the product on a pool's threads ----
 *
 * C is cut into blocks of whole rows or whole columns, and each block is a product of its own
 * (fsdp_gemm_run over all of k): every element of C is summed in the order a single call gives
 * it, so the bits do not depend on the blocks or on the threads. Each block packs its own A (a
 * column block) or its own B (a row block) in full, so the cut goes across the dimension whose
 * other operand is the smaller to pack again: columns when m <= n. */

#define FSDP_GEMM_PAR_MIN_MACS (1u << 20) /* smaller products stay on the calling thread */
#define FSDP_GEMM_PAR_MIN_COLS 256        /* a column block worth packing all of A for */
#define FSDP_GEMM_PAR_MIN_ROWS 96         /* a row block worth packing all of B for */

typedef struct fsdp_gemm_job {
    int trans_a, trans_b, split_cols;
    size_t m, n, k, lda, ldb, ldc, block;
    float alpha, beta;
    const char *a, *b;
    fsdp_dtype_t a_dtype, b_dtype;
    float *c;
    const fsdp_gemm_packed_t *bpk; /* NULL: each block packs its B */
    atomic_int status;             /* FSDP_OK, or the failure of some block */
} fsdp_gemm_job_t;

static void fsdp_gemm_part(void *arg, size_t part)
{
    fsdp_gemm_job_t *j = arg;
    size_t sa = fsdp_dtype_size(j->a_dtype), sb = fsdp_dtype_size(j->b_dtype);
    size_t o = part * j->block;
    fsdp_status_t status;

    if (j->split_cols) { /* columns o .. o + nb: B's columns (rows when transposed), C's */
        size_t nb = fsdp_gemm_min(j->block, j->n - o);
        const char *b = j->b + (j->trans_b ? o * j->ldb : o) * sb;
        fsdp_gemm_packed_t bpk; /* the block's columns of the packed B */
        if (j->bpk != NULL) /* its columns: filled by this block alone */
            bpk = (fsdp_gemm_packed_t){j->bpk->p, j->bpk->npad, j->bpk->col0 + o, j->bpk->fill};
        status = fsdp_gemm_run(j->trans_a, j->trans_b, j->m, nb, j->k, j->alpha, j->a, j->a_dtype,
                               j->lda, b, j->b_dtype, j->ldb, j->beta, j->c + o, j->ldc,
                               j->bpk != NULL ? &bpk : NULL);
    } else { /* rows o .. o + mb: A's rows (columns when transposed), C's */
        size_t mb = fsdp_gemm_min(j->block, j->m - o);
        const char *a = j->a + (j->trans_a ? o : o * j->lda) * sa;
        status = fsdp_gemm_run(j->trans_a, j->trans_b, mb, j->n, j->k, j->alpha, a, j->a_dtype,
                               j->lda, j->b, j->b_dtype, j->ldb, j->beta, j->c + o * j->ldc,
                               j->ldc, j->bpk);
    }
    if (status != FSDP_OK)
        atomic_store(&j->status, (int)status);
}

/* Blocks of `unit`-multiples over `len`, about two per thread when each can be `min` long, else
 * one per thread, fewer when even that is too short. Returns the number of blocks, *block_p
 * their length (the last may be shorter). */
static size_t fsdp_gemm_blocks(size_t len, size_t unit, size_t min, int threads, size_t *block_p)
{
    size_t parts = (size_t)threads * 2, block;

    if (len / parts < min)
        parts = (size_t)threads;
    if (len / parts < min / 4)
        parts = len / (min / 4 > unit ? min / 4 : unit);
    if (parts < 1)
        parts = 1;
    block = fsdp_gemm_round_up((len + parts - 1) / parts, unit);
    *block_p = block;
    return (len + block - 1) / block;
}

static fsdp_status_t fsdp_gemm_run_par(fsdp_sim_pool_t *pool, int trans_a, int trans_b, size_t m,
                                       size_t n, size_t k, float alpha, const void *a,
                                       fsdp_dtype_t a_dtype, size_t lda, const void *b,
                                       fsdp_dtype_t b_dtype, size_t ldb, float beta, float *c,
                                       size_t ldc, const fsdp_gemm_packed_t *bpk)
{
    int threads = fsdp_sim_pool_threads(pool);
    fsdp_gemm_packed_t filled;
    fsdp_gemm_job_t job;
    size_t parts;
    fsdp_status_t status;

    if (threads <= 1 || k == 0 || alpha == 0.0f ||
        (double)m * (double)n * (double)k < (double)FSDP_GEMM_PAR_MIN_MACS)
        return fsdp_gemm_run(trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype, ldb,
                             beta, c, ldc, bpk);
    status = fsdp_gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb);
    if (status != FSDP_OK)
        return status;
    if (bpk != NULL && bpk->fill && m > n) { /* row blocks all read B: packed once, first */
        fsdp_sim_gemm_pack_b(trans_b, b, b_dtype, ldb, n, k, bpk->p);
        filled = *bpk;
        filled.fill = 0;
        bpk = &filled;
    }
    job = (fsdp_gemm_job_t){.trans_a = trans_a, .trans_b = trans_b, .split_cols = m <= n,
                            .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                            .alpha = alpha, .beta = beta, .a = a, .b = b, .a_dtype = a_dtype,
                            .b_dtype = b_dtype, .c = c, .bpk = bpk};
    atomic_init(&job.status, (int)FSDP_OK);
    if (job.split_cols)
        parts = fsdp_gemm_blocks(n, NR, FSDP_GEMM_PAR_MIN_COLS, threads, &job.block);
    else
        parts = fsdp_gemm_blocks(m, MR, FSDP_GEMM_PAR_MIN_ROWS, threads, &job.block);
    fsdp_sim_pool_run(pool, parts, fsdp_gemm_part, &job);
    return (fsdp_status_t)atomic_load(&job.status);
}

static int fsdp_gemm_dtype_float(fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_F32 || dt == FSDP_DTYPE_BF16 || dt == FSDP_DTYPE_F16;
}

size_t fsdp_sim_gemm_packed_b_floats(size_t n, size_t k)
{
    size_t npad = fsdp_gemm_round_up(n, NR);
    return npad < n || (k > 0 && npad > SIZE_MAX / sizeof(float) / k) ? 0 : npad * k;
}

void fsdp_sim_gemm_pack_b(int trans_b, const void *b, fsdp_dtype_t b_dtype, size_t ldb, size_t n,
                          size_t k, float *out)
{
    size_t npad = fsdp_gemm_round_up(n, NR);

    for (size_t pc = 0; pc < k; pc += KC) /* the blocks and micro-panels fsdp_gemm_blocked packs */
        fsdp_gemm_pack_b(trans_b, b, b_dtype, ldb, pc, fsdp_gemm_min(KC, k - pc), 0, n,
                         out + pc * npad);
}

fsdp_status_t fsdp_sim_gemm_ex_packed(fsdp_sim_pool_t *pool, int trans_a, int trans_b, size_t m,
                                      size_t n, size_t k, float alpha, const void *a,
                                      fsdp_dtype_t a_dtype, size_t lda, const void *b,
                                      fsdp_dtype_t b_dtype, size_t ldb, float beta, void *c,
                                      fsdp_dtype_t c_dtype, size_t ldc,
                                      const fsdp_gemm_epilogue_t *epi, float *b_packed,
                                      int b_fill)
{
    fsdp_gemm_packed_t packed = {b_packed, fsdp_gemm_round_up(n, NR), 0, b_fill};
    const fsdp_gemm_packed_t *bpk = b_packed != NULL ? &packed : NULL;
    fsdp_status_t status;
    float *cw;

    if (!fsdp_gemm_dtype_float(a_dtype) || b_dtype != a_dtype ||
        (c_dtype != a_dtype && c_dtype != FSDP_DTYPE_F32)) {
        fsdp_error("gemm: dtypes A %s, B %s, C %s (need A and B one of f32, bf16, f16, and C "
                   "that dtype or f32)",
                   fsdp_dtype_name(a_dtype), fsdp_dtype_name(b_dtype), fsdp_dtype_name(c_dtype));
        return FSDP_ERR_INVALID_PARAM;
    }
    if (m == 0 || n == 0)
        return FSDP_OK;
    if (c == NULL || ldc < n) {
        fsdp_error("gemm: C is %s with ldc %zu for %zu columns (need non-NULL, ldc >= n)",
                   c == NULL ? "NULL" : "set", ldc, n);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (c_dtype == FSDP_DTYPE_F32) {
        status = fsdp_gemm_run_par(pool, trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b,
                                   b_dtype, ldb, beta, c, ldc, bpk);
        /* the epilogue over the finished f32 product, in place: nothing to round */
        for (size_t i = 0; i < m && epi != NULL && status == FSDP_OK; i++)
            for (size_t j = 0; j < n; j++)
                ((float *)c)[i * ldc + j] =
                    fsdp_kb_gemm_epilogue(epi, c_dtype, c, ldc, ((float *)c)[i * ldc + j], i, j);
        return status;
    }

    /* A 16-bit C: the k blocks add into an f32 workspace, which is rounded once at the end, so
     * that no partial sum is rounded to 16 bits; beta * C is applied there, in f32, unless the
     * epilogue accumulates into C after rounding the product. */
    if (fsdp_kb_gemm_accumulates(epi, c_dtype))
        beta = 0.0f;
    if (m > SIZE_MAX / sizeof(float) / n ||
        posix_memalign((void **)&cw, 64, m * n * sizeof(float)) != 0) {
        fsdp_error("gemm: cannot allocate an f32 workspace for %zu x %zu %s outputs", m, n,
                   fsdp_dtype_name(c_dtype));
        return FSDP_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < m && beta != 0.0f; i++)
        for (size_t j = 0; j < n; j++)
            cw[i * n + j] = fsdp_kb_load(c, c_dtype, i * ldc + j);
    status = fsdp_gemm_run_par(pool, trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype,
                               ldb, beta, cw, n, bpk);
    for (size_t i = 0; i < m && status == FSDP_OK; i++)
        for (size_t j = 0; j < n; j++)
            fsdp_kb_store(c, c_dtype, i * ldc + j,
                          epi == NULL
                              ? cw[i * n + j]
                              : fsdp_kb_gemm_epilogue(epi, c_dtype, c, ldc, cw[i * n + j], i, j));
    free(cw);
    return status;
}

fsdp_status_t fsdp_sim_gemm_ex_par(fsdp_sim_pool_t *pool, int trans_a, int trans_b, size_t m,
                                   size_t n, size_t k, float alpha, const void *a,
                                   fsdp_dtype_t a_dtype, size_t lda, const void *b,
                                   fsdp_dtype_t b_dtype, size_t ldb, float beta, void *c,
                                   fsdp_dtype_t c_dtype, size_t ldc,
                                   const fsdp_gemm_epilogue_t *epi)
{
    return fsdp_sim_gemm_ex_packed(pool, trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b,
                                   b_dtype, ldb, beta, c, c_dtype, ldc, epi, NULL, 0);
}

fsdp_status_t fsdp_sim_gemm_ex(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha,
                               const void *a, fsdp_dtype_t a_dtype, size_t lda, const void *b,
                               fsdp_dtype_t b_dtype, size_t ldb, float beta, void *c,
                               fsdp_dtype_t c_dtype, size_t ldc, const fsdp_gemm_epilogue_t *epi)
{
    return fsdp_sim_gemm_ex_par(NULL, trans_a, trans_b, m, n, k, alpha, a, a_dtype, lda, b, b_dtype,
                                ldb, beta, c, c_dtype, ldc, epi);
}

fsdp_status_t fsdp_sim_gemm(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha,
                            const float *a, size_t lda, const float *b, size_t ldb, float beta,
                            float *c, size_t ldc)
{
    return fsdp_sim_gemm_ex(trans_a, trans_b, m, n, k, alpha, a, FSDP_DTYPE_F32, lda, b,
                            FSDP_DTYPE_F32, ldb, beta, c, FSDP_DTYPE_F32, ldc, NULL);
}
