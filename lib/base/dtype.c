/* Element types, reduction ops, memory categories and the public conversion functions. */

#include <fsdp/types.h>

#include <string.h>

#include "base/base_hidden.h"
#include "kernels/convert.h"

size_t fsdp_dtype_size(fsdp_dtype_t dtype)
{
    switch (dtype) {
#define FSDP_DTYPE_SIZE_(name, bytes, str)                                                         \
    case FSDP_DTYPE_##name:                                                                        \
        return bytes;
        FSDP_FOREACH_DTYPE(FSDP_DTYPE_SIZE_)
#undef FSDP_DTYPE_SIZE_
    default:
        return 0;
    }
}

const char *fsdp_dtype_name(fsdp_dtype_t dtype)
{
    switch (dtype) {
#define FSDP_DTYPE_NAME_(name, bytes, str)                                                         \
    case FSDP_DTYPE_##name:                                                                        \
        return str;
        FSDP_FOREACH_DTYPE(FSDP_DTYPE_NAME_)
#undef FSDP_DTYPE_NAME_
    default:
        return "invalid";
    }
}

int fsdp_dtype_parse(const char *s, fsdp_dtype_t *dtype_p)
{
    static const struct {
        const char *name;
        fsdp_dtype_t dtype;
    } names[] = {
        {"f32", FSDP_DTYPE_F32},   {"fp32", FSDP_DTYPE_F32},      {"float32", FSDP_DTYPE_F32},
        {"bf16", FSDP_DTYPE_BF16}, {"bfloat16", FSDP_DTYPE_BF16}, {"f16", FSDP_DTYPE_F16},
        {"fp16", FSDP_DTYPE_F16},  {"float16", FSDP_DTYPE_F16},   {"i32", FSDP_DTYPE_I32},
        {"int32", FSDP_DTYPE_I32},
    };
    if (s == NULL)
        return 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].name) == 0) {
            *dtype_p = names[i].dtype;
            return 1;
        }
    }
    return 0;
}

int fsdp_dtype_is_float(fsdp_dtype_t dtype)
{
    return dtype == FSDP_DTYPE_F32 || dtype == FSDP_DTYPE_BF16 || dtype == FSDP_DTYPE_F16;
}

const char *fsdp_reduce_op_name(fsdp_reduce_op_t op)
{
    switch (op) {
    case FSDP_REDUCE_SUM:
        return "sum";
    case FSDP_REDUCE_AVG:
        return "avg";
    case FSDP_REDUCE_MAX:
        return "max";
    default:
        return "invalid";
    }
}

const char *fsdp_mem_category_name(fsdp_mem_category_t cat)
{
    switch (cat) {
#define FSDP_MEM_CAT_NAME_(name, str)                                                              \
    case FSDP_MEM_##name:                                                                          \
        return str;
        FSDP_FOREACH_MEM_CATEGORY(FSDP_MEM_CAT_NAME_)
#undef FSDP_MEM_CAT_NAME_
    default:
        return "invalid";
    }
}

uint16_t fsdp_f32_to_bf16(float x)
{
    return fsdp_kb_f32_to_bf16(x);
}

float fsdp_bf16_to_f32(uint16_t x)
{
    return fsdp_kb_bf16_to_f32(x);
}

uint16_t fsdp_f32_to_f16(float x)
{
    return fsdp_kb_f32_to_f16(x);
}

float fsdp_f16_to_f32(uint16_t x)
{
    return fsdp_kb_f16_to_f32(x);
}
