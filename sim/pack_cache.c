/* A rank's packed GEMM operand (sim_kernels.h, fsdp_sim_pack_cache_t).
 *
 * A GEMM packs op(B) into micro-panels as it goes (gemm.c); for the LM head that is a pass over
 * the whole vocabulary's weight at every launch, a large part of a product with few rows (in
 * bench_gemm, GPT-2's head at 64 and 16 rows). Over the micro-batches of an accumulated step
 * the weight does not change, and the core says so: it names the values of the unsharded
 * parameters with a version (fsdp_unit_param_version) that the model passes as the GEMM's
 * b_version. The product packs into this buffer exactly what it would pack into its own, so a
 * product that reads it gives the same bits.
 *
 * Policy. Only for products of few rows (FSDP_SIM_PACK_CACHE_ROWS), where the packing is not
 * hidden behind the multiplies. The key is everything the packing depends on: B's address,
 * dtype, leading dimension, transpose, n, k, and its version. The first launch with a key only
 * records it; the second packs B into the buffer as it computes (no pass of its own), when the
 * key before was launched often enough for that to pay (FSDP_SIM_PACK_CACHE_LAUNCHES: a step's
 * micro-batches are the last step's); later ones read it. So a B whose version changes at every
 * launch (one forward per optimizer step) costs nothing, and one read by the micro-batches of
 * an accumulated step is packed once a step, from the second step on. A launch with another
 * key makes the copy stale; the buffer itself is kept for the next B of its size (the next
 * step's weight), so that its pages are not faulted in again. Its bytes count against the
 * world's host-memory bound, of which the buffer takes at most half: the rest stays for the
 * segments, and a segment that would not fit frees its rank's buffer first (backend.c).
 */
#include "config.h"

#include <stdlib.h>

#include <fsdp/log.h>

#include "sim_kernels.h"

static void free_buffer(fsdp_sim_pack_cache_t *c)
{
    if (c->packed != NULL) {
        free(c->packed);
        fsdp_sim_host_release(c->held, c->bytes);
    }
    c->packed = NULL;
    c->bytes = 0;
    c->valid = c->filling = 0;
}

void fsdp_sim_pack_cache_drop(fsdp_sim_pack_cache_t *c)
{
    free_buffer(c);
    c->b = NULL;
    c->version = 0;
}

static int same_key(const fsdp_sim_pack_cache_t *c, const fsdp_kernel_t *k)
{
    return c->b == k->u.gemm.b && c->version == k->u.gemm.b_version &&
           c->trans_b == k->u.gemm.trans_b && c->n == k->u.gemm.n && c->k == k->u.gemm.k &&
           c->ldb == k->u.gemm.ldb && c->dtype == k->u.gemm.b_dtype;
}

/* A buffer of `bytes` in packed, if the bound allows; 0 when it does not or memory runs out. */
static int reserve(fsdp_sim_pack_cache_t *c, size_t bytes)
{
    size_t before;
    void *p;

    if (c->packed != NULL && c->bytes == bytes)
        return 1;
    free_buffer(c);
    if (!fsdp_sim_host_reserve(c->held, c->limit / 2, bytes, &before))
        return 0;
    if (posix_memalign(&p, 64, bytes) != 0) {
        fsdp_sim_host_release(c->held, bytes);
        return 0;
    }
    c->packed = p;
    c->bytes = bytes;
    return 1;
}

float *fsdp_sim_pack_cache_get(fsdp_sim_pack_cache_t *c, const fsdp_kernel_t *k, int *fill_p)
{
    size_t floats;

    *fill_p = 0;
    if (c == NULL || c->off || k->kind != FSDP_K_GEMM || k->u.gemm.b_version == 0 ||
        k->u.gemm.m > c->max_rows || k->u.gemm.batch > 1 || k->u.gemm.m == 0 || k->u.gemm.n == 0 ||
        k->u.gemm.k == 0 || k->u.gemm.alpha == 0.0f || k->u.gemm.b == NULL ||
        k->u.gemm.ldb < (k->u.gemm.trans_b ? k->u.gemm.k : k->u.gemm.n))
        return NULL; /* no B to read (or a bad one, which the product reports) */
    if (!same_key(c, k)) { /* a new B, or new values: remember it, maybe pack at its next launch */
        c->valid = 0;
        c->last_launches = c->launches;
        c->launches = 1;
        c->b = k->u.gemm.b;
        c->version = k->u.gemm.b_version;
        c->trans_b = k->u.gemm.trans_b;
        c->n = k->u.gemm.n;
        c->k = k->u.gemm.k;
        c->ldb = k->u.gemm.ldb;
        c->dtype = k->u.gemm.b_dtype;
        return NULL;
    }
    c->launches++;
    if (c->valid) {
        c->hits++;
        return c->packed;
    }
    if (c->last_launches < c->min_launches)
        return NULL; /* the last version was not read often enough to pay for packing */
    floats = fsdp_sim_gemm_packed_b_floats(k->u.gemm.n, k->u.gemm.k);
    if (floats == 0 || !reserve(c, floats * sizeof(float)))
        return NULL;
    c->filling = 1;
    *fill_p = 1;
    return c->packed;
}

void fsdp_sim_pack_cache_done(fsdp_sim_pack_cache_t *c, fsdp_status_t status)
{
    if (c == NULL || !c->filling)
        return;
    c->filling = 0;
    c->valid = status == FSDP_OK;
    if (c->valid) {
        c->packs++;
        fsdp_debug("pack cache: a %zu x %zu operand packed for the next launches (%zu bytes)",
                   c->k, c->n, c->bytes);
    }
}
