/* Shard arithmetic of a flat parameter (docs/runtime.md section 4). */

#include "core/core_hidden.h"

#include <fsdp/core.h>

#include <string.h>

size_t fsdp_shard_numel(size_t total, int world)
{
    size_t w = world < 1 ? 1 : (size_t)world;
    return (total + w - 1) / w; /* torch.chunk's chunk size */
}

void fsdp_shard_extent(size_t total, int world, int rank, size_t *numel_p, size_t *pad_p)
{
    size_t s = fsdp_shard_numel(total, world);
    size_t start = (size_t)rank * s;
    size_t numel = start >= total ? 0 : (total - start < s ? total - start : s);

    *numel_p = numel;
    *pad_p = s - numel;
}

void fsdp_divide_factors(int d, double *pre_p, double *post_p)
{
    int f = 1;

    if (d < 1)
        d = 1;
    /* grow the pre-factor while it divides D and stays below D / factor, so neither the
     * pre-divided sum nor the post-divided result strays far from 1 (low-precision safety) */
    while (d % f == 0 && d / f > f)
        f *= 2;
    *pre_p = (double)f;
    *post_p = (double)d / (double)f;
}

const char *fsdp_strategy_name(fsdp_strategy_t s)
{
    static const char *const names[] = {"full_shard", "shard_grad_op", "no_shard",
                                        "hybrid_shard", "hybrid_shard_zero2"};
    return (unsigned)s < FSDP_STRATEGY_COUNT ? names[s] : "invalid";
}

int fsdp_strategy_parse(const char *s, fsdp_strategy_t *s_p)
{
    for (int i = 0; i < FSDP_STRATEGY_COUNT; i++) {
        const char *name = fsdp_strategy_name((fsdp_strategy_t)i);
        const char *a = s, *b = name;
        /* accept "full_shard", "FULL_SHARD" and "full-shard" */
        while (*a && *b) {
            char ca = *a == '-' ? '_' : (char)(*a >= 'A' && *a <= 'Z' ? *a - 'A' + 'a' : *a);
            if (ca != *b)
                break;
            a++;
            b++;
        }
        if (*a == '\0' && *b == '\0') {
            *s_p = (fsdp_strategy_t)i;
            return 1;
        }
    }
    return 0;
}

int fsdp_backward_prefetch_parse(const char *s, fsdp_backward_prefetch_t *p_p)
{
    static const struct {
        const char *a, *b;
        fsdp_backward_prefetch_t p;
    } names[] = {{"pre", "BACKWARD_PRE", FSDP_BACKWARD_PREFETCH_PRE},
                 {"post", "BACKWARD_POST", FSDP_BACKWARD_PREFETCH_POST},
                 {"none", "NONE", FSDP_BACKWARD_PREFETCH_NONE}};
    for (size_t i = 0; s != NULL && i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].a) == 0 || strcmp(s, names[i].b) == 0) {
            *p_p = names[i].p;
            return 1;
        }
    }
    return 0;
}
