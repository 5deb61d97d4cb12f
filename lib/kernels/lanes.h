/* The fixed reduction shapes of the row and column kernels: how a sum is split among lanes and
 * in which order the lanes' partial sums meet. A shape depends on the sizes alone, never on the
 * hardware, so a warp (or a block) on the GPU and a loop over the lanes on the host add the same
 * numbers in the same order and give the same bits.
 *
 * Rows (a reduction along a row of n elements: layernorm, rmsnorm, softmax, cross-entropy,
 * attention's dot products): FSDP_KB_LANES lanes, lane l takes elements l, l + 32, l + 64, ...
 * in that order, in f32; then the lanes meet in the butterfly of fsdp_kb_lane_tree: for
 * w = 16, 8, 4, 2, 1, partial[l] += partial[l + w] for l < w. On the GPU a warp does it with
 * __shfl_xor_sync (fsdp_kb_warp_tree); every lane ends with the same value, since IEEE addition
 * is commutative.
 *
 * Columns (a sum over the rows of a matrix, per column: a weight or bias gradient):
 * FSDP_KB_ROW_LANES lanes per column, lane y takes rows y, y + 32, ... in order, and the lanes
 * meet in the same butterfly. On the GPU a block holds 32 columns x 32 row lanes and the tree
 * runs over shared memory (fsdp_kb_block_col_tree). */
#ifndef FSDP_KERNELS_LANES_H
#define FSDP_KERNELS_LANES_H

#include <stddef.h>

#include "kernels/hd.h"

#define FSDP_KB_LANES 32     /* lanes of a row reduction: a warp */
#define FSDP_KB_ROW_LANES 32 /* lanes of a column reduction, per column */
#if FSDP_KB_LANES != 32
#error "fsdp_kb_lanes_sum_n's levels are those of 32 lanes"
#endif

/* Host replay: partial[0] = the butterfly sum of partial[0 .. FSDP_KB_LANES); returns it. */
FSDP_HD float fsdp_kb_lane_tree(float *partial)
{
    for (unsigned w = FSDP_KB_LANES / 2; w > 0; w >>= 1)
        for (unsigned l = 0; l < w; l++)
            partial[l] = partial[l] + partial[l + w];
    return partial[0];
}

/* Host replay: the largest of partial[0 .. FSDP_KB_LANES), in the same butterfly as the warp
 * (a NaN goes where the warp's comparisons take it); partial is overwritten. */
FSDP_HD float fsdp_kb_lane_max(float *partial)
{
    for (unsigned w = FSDP_KB_LANES / 2; w > 0; w >>= 1)
        for (unsigned l = 0; l < w; l++)
            partial[l] = partial[l + w] > partial[l] ? partial[l + w] : partial[l];
    return partial[0];
}

#ifdef __CUDACC__
/* Device: the butterfly of fsdp_kb_lane_tree across a full warp; every lane gets the sum. */
static __device__ __forceinline__ float fsdp_kb_warp_tree(float v)
{
    for (unsigned w = FSDP_KB_LANES / 2; w > 0; w >>= 1)
        v = v + __shfl_xor_sync(0xffffffffu, v, w);
    return v;
}

/* Device: fsdp_kb_lane_max across a full warp; every lane gets lane 0's result. */
static __device__ __forceinline__ float fsdp_kb_warp_max(float v)
{
    for (unsigned w = FSDP_KB_LANES / 2; w > 0; w >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, w);
        v = o > v ? o : v;
    }
    /* lanes below w held fsdp_kb_lane_max's values at each step; with a NaN the others may
     * not, so every lane takes lane 0's */
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Device: s[y][x] for y in [0, FSDP_KB_ROW_LANES) (x = threadIdx.x, y = threadIdx.y) summed
 * over y in the butterfly of fsdp_kb_lane_tree, into s[0][x]. Every thread of the block calls
 * it (it synchronizes). */
static __device__ __forceinline__ void fsdp_kb_block_col_tree(float (*s)[FSDP_KB_LANES + 1])
{
    __syncthreads();
    for (unsigned w = FSDP_KB_ROW_LANES / 2; w > 0; w >>= 1) {
        if (threadIdx.y < w)
            s[threadIdx.y][threadIdx.x] =
                s[threadIdx.y][threadIdx.x] + s[threadIdx.y + w][threadIdx.x];
        __syncthreads();
    }
}
#endif

/* A body written once for both: it runs FSDP_KB_HERE lanes of a row (or, for a column block,
 * FSDP_KB_HERE columns x FSDP_KB_HERE row lanes) from the caller's first lane: every lane on the
 * host, in a loop, and its own one on the GPU, where the warp (or the block) runs the others. */
#ifdef __CUDA_ARCH__
#define FSDP_KB_HERE 1
#else
#define FSDP_KB_HERE FSDP_KB_LANES
#endif

/* A caller's walk along a row: element e belongs to lane e % FSDP_KB_LANES, and a caller starting
 * at lane0 (0 on the host) takes elements lane0, lane0 + FSDP_KB_STEP, ...: on the host every
 * element in order, each added to its lane's partial part[FSDP_KB_SLOT(e)], on the GPU its own
 * lane's, into part[0]. Either way a lane adds its elements in index order. */
#define FSDP_KB_STEP (FSDP_KB_LANES / FSDP_KB_HERE)
#define FSDP_KB_SLOT(e) (FSDP_KB_HERE == 1 ? 0u : (unsigned)((e) % FSDP_KB_LANES))

/* The sum of a row's lane partials, part[0 .. FSDP_KB_HERE) the caller's: fsdp_kb_lane_tree over
 * all 32 on the host, fsdp_kb_warp_tree on the GPU; every lane gets it. part is overwritten. */
FSDP_HD float fsdp_kb_lanes_sum(float *part)
{
#ifdef __CUDA_ARCH__
    return fsdp_kb_warp_tree(part[0]);
#else
    return fsdp_kb_lane_tree(part);
#endif
}

/* fsdp_kb_lanes_sum of a row of n elements, whose lanes n .. FSDP_KB_LANES - 1 have none and
 * hold +0 (the caller zeroes every partial): the host skips the levels of the butterfly whose
 * upper half is all such lanes, which change nothing (a partial that starts at +0 is never -0
 * under round-to-nearest, and x + +0 is x for every other x, NaN and infinities included), so the
 * sum has the bits of the whole butterfly that the GPU runs. Each level's loop has constant
 * bounds, so the compiler can run it in vector registers (the same additions, lane by lane). */
FSDP_HD float fsdp_kb_lanes_sum_n(float *part, size_t n)
{
#ifdef __CUDA_ARCH__
    (void)n;
    return fsdp_kb_warp_tree(part[0]);
#else
#define FSDP_KB_LEVEL_(w)                                                                          \
    if (n > (w))                                                                                   \
        for (unsigned l = 0; l < (w); l++)                                                         \
            part[l] = part[l] + part[l + (w)];
    FSDP_KB_LEVEL_(16)
    FSDP_KB_LEVEL_(8)
    FSDP_KB_LEVEL_(4)
    FSDP_KB_LEVEL_(2)
    FSDP_KB_LEVEL_(1)
#undef FSDP_KB_LEVEL_
    return part[0];
#endif
}

/* The column sums of a block's partials s[y][x] (row lane y of column x), into s[0][x]: the
 * butterfly of fsdp_kb_lane_tree over y for each x, in loops on the host and
 * fsdp_kb_block_col_tree on the GPU (every thread of the block calls it). */
FSDP_HD void fsdp_kb_cols_sum(float (*s)[FSDP_KB_LANES + 1])
{
#ifdef __CUDA_ARCH__
    fsdp_kb_block_col_tree(s);
#else
    for (unsigned w = FSDP_KB_ROW_LANES / 2; w > 0; w >>= 1)
        for (unsigned y = 0; y < w; y++)
            for (unsigned x = 0; x < FSDP_KB_LANES; x++)
                s[y][x] = s[y][x] + s[y + w][x];
#endif
}

#endif
