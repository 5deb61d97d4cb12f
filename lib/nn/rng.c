/* Deterministic random numbers: splitmix64 (Steele, Lea and Flood, "Fast splittable
 * pseudorandom number generators", 2014), whose whole state is the one 64-bit counter of
 * fsdp_rng_t. The same seed gives the same sequence on every rank, platform and build. */
#include "config.h"

#include "nn/nn_int.h"

#include <math.h>

#include <fsdp/nn.h>

void fsdp_rng_seed(fsdp_rng_t *rng, uint64_t seed)
{
    rng->state = seed;
}

#define FSDP_RNG_GAMMA UINT64_C(0x9e3779b97f4a7c15) /* the counter's step */

static inline uint64_t next(fsdp_rng_t *rng)
{
    uint64_t z = (rng->state += FSDP_RNG_GAMMA);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

uint64_t fsdp_rng_next(fsdp_rng_t *rng)
{
    return next(rng);
}

void fsdp_rng_skip(fsdp_rng_t *rng, uint64_t n)
{
    rng->state += n * FSDP_RNG_GAMMA; /* both modulo 2^64 */
}

float fsdp_rng_uniform(fsdp_rng_t *rng, float lo, float hi)
{
    /* the top 24 bits: a multiple of 2^-24 in [0, 1), exact in f32 */
    double u = (double)(fsdp_rng_next(rng) >> 40) * 0x1p-24;
    float x = (float)((double)lo + ((double)hi - (double)lo) * u);
    /* rounding to f32 may reach hi itself; keep the interval half-open */
    if (x >= hi && hi > lo)
        x = nextafterf(hi, lo);
    return x;
}

float fsdp_rng_normal(fsdp_rng_t *rng)
{
    /* Box-Muller in double, with u1 in (0, 1] so that log(u1) is finite */
    double u1 = (double)((fsdp_rng_next(rng) >> 11) + 1) * 0x1p-53;
    double u2 = (double)(fsdp_rng_next(rng) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

void fsdp_rng_normal_polar(fsdp_rng_t *rng, float *out, size_t n, float std, size_t first,
                           size_t count)
{
    for (size_t i = 0; i < n; i += 2) {
        double u, v, s, f;
        do {
            u = (double)(next(rng) >> 11) * 0x1p-52 - 1.0;
            v = (double)(next(rng) >> 11) * 0x1p-52 - 1.0;
            s = u * u + v * v;
        } while (s >= 1.0 || s == 0.0);
        if (i + 2 <= first || i >= first + count)
            continue; /* neither value of the pair is wanted: no log, no square root */
        f = sqrt(-2.0 * log(s) / s);
        out[i] = (float)(std * u * f);
        if (i + 1 < n)
            out[i + 1] = (float)(std * v * f);
    }
}
