/* bf16 and IEEE binary16 conversions with round to nearest even; shared host/device bodies. */
#ifndef FSDP_KERNELS_CONVERT_H
#define FSDP_KERNELS_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "kernels/hd.h"

FSDP_HD uint32_t fsdp_kb_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

FSDP_HD float fsdp_kb_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

FSDP_HD uint16_t fsdp_kb_f32_to_bf16(float f)
{
    uint32_t x = fsdp_kb_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

FSDP_HD float fsdp_kb_bf16_to_f32(uint16_t h)
{
    return fsdp_kb_bits_f32((uint32_t)h << 16);
}

FSDP_HD uint16_t fsdp_kb_f32_to_f16(float f)
{
    uint32_t x = fsdp_kb_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x3ffu) : 0u));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
        uint32_t e = ax >> 23;
        if (e < 102u)
            return (uint16_t)sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

FSDP_HD float fsdp_kb_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t m = (uint32_t)h & 0x3ffu;
    if (e == 0u) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    if (e == 31u)
        return fsdp_kb_bits_f32(sign | 0x7f800000u | (m << 13));
    return fsdp_kb_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Rounds an f32 value through a 16-bit type (the value the low-precision tensor holds). */
FSDP_HD float fsdp_kb_round_bf16(float f)
{
    return fsdp_kb_bf16_to_f32(fsdp_kb_f32_to_bf16(f));
}

FSDP_HD float fsdp_kb_round_f16(float f)
{
    return fsdp_kb_f16_to_f32(fsdp_kb_f32_to_f16(f));
}

#endif
