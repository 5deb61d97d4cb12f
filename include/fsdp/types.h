/* libfsdp: element types, reduction ops and memory categories shared by every layer. */
#ifndef FSDP_TYPES_H
#define FSDP_TYPES_H

#include <fsdp/api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, bytes, short name) */
#define FSDP_FOREACH_DTYPE(X)                                                                      \
    X(F32, 4, "f32")                                                                               \
    X(BF16, 2, "bf16")                                                                             \
    X(F16, 2, "f16")                                                                               \
    X(I32, 4, "i32")

typedef enum {
#define FSDP_DTYPE_ENUM_(name, bytes, str) FSDP_DTYPE_##name,
    FSDP_FOREACH_DTYPE(FSDP_DTYPE_ENUM_)
#undef FSDP_DTYPE_ENUM_
        FSDP_DTYPE_COUNT
} fsdp_dtype_t;

/* Bytes per element; 0 for an invalid dtype. */
FSDP_API size_t fsdp_dtype_size(fsdp_dtype_t dtype);
/* "f32", "bf16", "f16", "i32"; "invalid" otherwise. Never NULL. */
FSDP_API const char *fsdp_dtype_name(fsdp_dtype_t dtype);
/* Parses "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16", "i32". */
FSDP_API int fsdp_dtype_parse(const char *s, fsdp_dtype_t *dtype_p);
/* 1 for the floating-point types. */
FSDP_API int fsdp_dtype_is_float(fsdp_dtype_t dtype);

typedef enum {
    FSDP_REDUCE_SUM = 0,
    FSDP_REDUCE_AVG = 1,
    FSDP_REDUCE_MAX = 2,
    FSDP_REDUCE_COUNT
} fsdp_reduce_op_t;

/* What a byte of device memory is for (DESIGN.md, "Memory"). */
#define FSDP_FOREACH_MEM_CATEGORY(X)                                                               \
    X(SHARDED_PARAM, "sharded_param")                                                              \
    X(UNSHARDED_PARAM, "unsharded_param")                                                          \
    X(LOW_PREC_SHARD, "low_prec_shard")                                                            \
    X(GRADIENT, "gradient")                                                                        \
    X(OPTIMIZER_STATE, "optimizer_state")                                                          \
    X(ACTIVATION, "activation")                                                                    \
    X(COMM_BUFFER, "comm_buffer")                                                                  \
    X(TEMPORARY, "temporary")

typedef enum {
#define FSDP_MEM_CAT_ENUM_(name, str) FSDP_MEM_##name,
    FSDP_FOREACH_MEM_CATEGORY(FSDP_MEM_CAT_ENUM_)
#undef FSDP_MEM_CAT_ENUM_
        FSDP_MEM_CATEGORY_COUNT
} fsdp_mem_category_t;

FSDP_API const char *fsdp_mem_category_name(fsdp_mem_category_t cat);

/* IEEE binary16 and bfloat16 conversions, round to nearest even (NaN stays NaN). */
FSDP_API uint16_t fsdp_f32_to_bf16(float x);
FSDP_API float fsdp_bf16_to_f32(uint16_t x);
FSDP_API uint16_t fsdp_f32_to_f16(float x);
FSDP_API float fsdp_f16_to_f32(uint16_t x);

#ifdef __cplusplus
}
#endif
#endif
