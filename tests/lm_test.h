/* What the language-model tests (test_gpt2.c, test_llama.c) share around the model under test:
 * random numbers for their references, the parameters of a model in the canonical order (the
 * root's, then each layer's, in declaration order), a rank's batch, the parity corpus and the
 * simulated launch of a job. */
#ifndef FSDP_TESTS_LM_TEST_H
#define FSDP_TESTS_LM_TEST_H

#include <fsdp/fsdp.h>
#include <stdint.h>

/* A uniform double in [lo, hi) from the xorshift state *state (each test seeds its own). */
double lm_test_urand(uint64_t *state, double lo, double hi);

/* Sets the model's parameters from values in the canonical order. */
fsdp_status_t lm_test_set_params(fsdp_lm_t *lm, const float *values);
/* Appends unit u's parameters, taken from its flat buffer `flat`, to out at *off. */
void lm_test_canon_copy(fsdp_unit_t *u, const float *flat, float *out, size_t *off);
/* The model's sharded gradients (world 1: all of them) into out. */
void lm_test_grads(fsdp_lm_t *lm, float *out);
/* Gathers the model's full parameters (a collective) and on rank 0 writes them to out. */
fsdp_status_t lm_test_gather_params(fsdp_lm_t *lm, int rank, float *out);

/* Rank `rank` of `world`'s rows of step `step`: from a token source, or its slice of one global
 * batch (inputs and targets of batch x seq). */
fsdp_status_t lm_test_rank_batch(fsdp_tokens_t *tokens, const int32_t *inputs,
                                 const int32_t *targets, size_t batch, size_t seq, uint64_t seed,
                                 int rank, int world, int step, int32_t *in, int32_t *tg);

/* 4096 tokens of a learnable, not random, sequence, batches drawn at random. */
fsdp_tokens_t *lm_test_parity_tokens(void);

/* Runs fn(dev, arg) on `world` simulated ranks, in shape mode when shape. */
fsdp_status_t lm_test_launch(int world, int shape, fsdp_status_t (*fn)(fsdp_dev_t *, void *),
                             void *arg);
/* The same in data mode with the sim's pack cache off (no_pack_cache 1) or on (0). */
fsdp_status_t lm_test_launch_packing(int world, int no_pack_cache,
                                     fsdp_status_t (*fn)(fsdp_dev_t *, void *), void *arg);
/* Gradient accumulation as fsdp-train --grad-accum: the rows in `accum` micro-batches, no_sync
 * for all but the last; *loss_p the mean of their losses. The model's loss scale (1 / accum) is
 * the caller's to set. */
fsdp_status_t lm_test_accumulate(fsdp_t *fs, fsdp_lm_t *lm, int accum, const int32_t *inputs,
                                 const int32_t *targets, size_t rows, size_t seq, float *loss_p);
/* The relative difference of a from b: |a - b| / |b| in the L2 norm, in double. */
double lm_test_rel_diff(const float *a, const float *b, size_t n);
/* The peak bytes of FSDP_MEM_ACTIVATION of fs's allocator. */
size_t lm_test_act_peak(fsdp_t *fs);

#endif
