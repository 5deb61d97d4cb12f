/* Helpers of the language-model tests (lm_test.h). */
#include "lm_test.h"
#include "core/core_hidden.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

double lm_test_urand(uint64_t *state, double lo, double hi)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return lo + (hi - lo) * ((double)((*state * UINT64_C(2685821657736338717)) >> 11) * 0x1p-53);
}

/* Unit k of the model, in the canonical order: 0 the root, k the (k - 1)-th layer. */
static fsdp_unit_t *unit_at(fsdp_lm_t *lm, int k)
{
    return k == 0 ? fsdp_lm_root(lm) : fsdp_lm_layer(lm, k - 1);
}

fsdp_status_t lm_test_set_params(fsdp_lm_t *lm, const float *values)
{
    fsdp_status_t st = FSDP_OK;
    size_t off = 0;

    for (int k = 0; k <= fsdp_lm_num_layers(lm) && st == FSDP_OK; k++) {
        fsdp_unit_t *u = unit_at(lm, k);
        for (int i = 0; i < fsdp_unit_num_params(u) && st == FSDP_OK; i++) {
            fsdp_param_info_t pi;
            fsdp_unit_param_info(u, i, &pi);
            st = fsdp_unit_set_param(u, i, values + off);
            off += pi.numel;
        }
    }
    return st;
}

void lm_test_canon_copy(fsdp_unit_t *u, const float *flat, float *out, size_t *off)
{
    for (int i = 0; i < fsdp_unit_num_params(u); i++) {
        fsdp_param_info_t pi;
        fsdp_unit_param_info(u, i, &pi);
        memcpy(out + *off, flat + pi.offset, pi.numel * sizeof(float));
        *off += pi.numel;
    }
}

void lm_test_grads(fsdp_lm_t *lm, float *out)
{
    size_t off = 0;

    for (int k = 0; k <= fsdp_lm_num_layers(lm); k++)
        lm_test_canon_copy(unit_at(lm, k), fsdp_unit_sharded_grad(unit_at(lm, k)), out, &off);
}

fsdp_status_t lm_test_gather_params(fsdp_lm_t *lm, int rank, float *out)
{
    fsdp_status_t st = FSDP_OK;
    size_t off = 0;

    for (int k = 0; k <= fsdp_lm_num_layers(lm) && st == FSDP_OK; k++) {
        fsdp_unit_t *u = unit_at(lm, k);
        float *flat = malloc(fsdp_unit_flat_numel(u) * sizeof(float));
        st = fsdp_unit_gather_full(u, flat);
        if (st == FSDP_OK && rank == 0)
            lm_test_canon_copy(u, flat, out, &off);
        free(flat);
    }
    return st;
}

fsdp_status_t lm_test_rank_batch(fsdp_tokens_t *tokens, const int32_t *inputs,
                                 const int32_t *targets, size_t batch, size_t seq, uint64_t seed,
                                 int rank, int world, int step, int32_t *in, int32_t *tg)
{
    const size_t n = batch / (size_t)world * seq;

    if (tokens != NULL) {
        fsdp_batch_spec_t spec = {batch, seq, rank, world, seed};
        return fsdp_tokens_batch(tokens, &spec, step, in, tg);
    }
    memcpy(in, inputs + (size_t)rank * n, n * sizeof(int32_t));
    memcpy(tg, targets + (size_t)rank * n, n * sizeof(int32_t));
    return FSDP_OK;
}

fsdp_tokens_t *lm_test_parity_tokens(void)
{
    uint16_t ids[4096];
    fsdp_tokens_t *t;
    for (int i = 0; i < 4096; i++)
        ids[i] = (uint16_t)((i * 7 + (i / 13) * 3) % 97 + 32);
    CU_ASSERT_FATAL(fsdp_tokens_from_array(ids, 4096, FSDP_TOKENS_RANDOM, "parity", &t) == FSDP_OK);
    return t;
}

fsdp_status_t lm_test_launch(int world, int shape, fsdp_status_t (*fn)(fsdp_dev_t *, void *),
                             void *arg)
{
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.mode = shape ? FSDP_SIM_SHAPE : FSDP_SIM_DATA;
    return fsdp_sim_launch(&p, fn, arg, NULL);
}

fsdp_status_t lm_test_launch_packing(int world, int no_pack_cache,
                                     fsdp_status_t (*fn)(fsdp_dev_t *, void *), void *arg)
{
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.no_pack_cache = no_pack_cache;
    return fsdp_sim_launch(&p, fn, arg, NULL);
}

fsdp_status_t lm_test_accumulate(fsdp_t *fs, fsdp_lm_t *lm, int accum, const int32_t *inputs,
                                 const int32_t *targets, size_t rows, size_t seq, float *loss_p)
{
    size_t micro = rows / (size_t)accum;
    fsdp_status_t st = FSDP_OK;

    *loss_p = 0.0f;
    for (int k = 0; k < accum && st == FSDP_OK; k++) {
        float part = 0.0f;
        st = fsdp_set_sync_gradients(fs, k == accum - 1);
        if (st == FSDP_OK)
            st = fsdp_lm_forward_backward(lm, inputs + (size_t)k * micro * seq,
                                          targets + (size_t)k * micro * seq, micro, seq, &part);
        *loss_p += part / (float)accum;
    }
    return st;
}

double lm_test_rel_diff(const float *a, const float *b, size_t n)
{
    double nd = 0.0, nb = 0.0;
    for (size_t e = 0; e < n; e++) {
        nd += ((double)a[e] - b[e]) * ((double)a[e] - b[e]);
        nb += (double)b[e] * b[e];
    }
    return sqrt(nd / nb);
}

size_t lm_test_act_peak(fsdp_t *fs)
{
    fsdp_mem_stats_t ms;
    fsdp_mem_get_stats(fsdp_memory(fs), &ms);
    return ms.peak_by_category[FSDP_MEM_ACTIVATION];
}
