/* Status table, versions, dtypes and conversions, and the backend table check. */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "sim_hidden.h"
#include "test_util.h"

static void test_status_strings(void)
{
    CU_ASSERT_STRING_EQUAL(fsdp_status_string(FSDP_OK), "success");
    CU_ASSERT_STRING_EQUAL(fsdp_status_name(FSDP_ERR_TIMEOUT), "FSDP_ERR_TIMEOUT");
    CU_ASSERT_PTR_NOT_NULL(fsdp_status_string((fsdp_status_t)12345));
    CU_ASSERT_STRING_EQUAL(fsdp_status_string((fsdp_status_t)12345), "unknown status");
#define CHECK_(name, value, msg) CU_ASSERT_STRING_EQUAL(fsdp_status_string(FSDP_##name), msg);
    FSDP_FOREACH_STATUS(CHECK_)
#undef CHECK_
}

static void test_version(void)
{
    CU_ASSERT_EQUAL(fsdp_version(), FSDP_VERSION_HEX);
    CU_ASSERT_STRING_EQUAL(fsdp_version_string(), FSDP_VERSION_STRING);
}

/* Every slot FSDP_BACKEND_SLOTS lists is checked: the sim's complete table passes, and the same
 * table with any one slot NULL, or of another size, is refused. */
static void test_backend_check(void)
{
    const fsdp_backend_ops_t *sim = fsdp_sim_backend();
    fsdp_backend_ops_t ops;
    int nslots = 0;

    CU_ASSERT_EQUAL(fsdp_backend_check(sim), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_backend_check(NULL), FSDP_ERR_INVALID_PARAM);
#define NULL_ONE_(slot)                                                                            \
    ops = *sim;                                                                                    \
    CU_ASSERT_PTR_NOT_NULL(ops.slot);                                                              \
    ops.slot = NULL;                                                                               \
    CU_ASSERT_EQUAL(fsdp_backend_check(&ops), FSDP_ERR_INVALID_PARAM);                             \
    nslots++;
    FSDP_BACKEND_SLOTS(NULL_ONE_)
#undef NULL_ONE_
    CU_ASSERT_EQUAL((size_t)nslots * sizeof(void (*)(void)),
                    sizeof(ops) - offsetof(fsdp_backend_ops_t, segment_alloc));
    ops = *sim;
    ops.size = sizeof(ops) - 8;
    CU_ASSERT_EQUAL(fsdp_backend_check(&ops), FSDP_ERR_INVALID_PARAM);
}

static void test_dtypes(void)
{
    fsdp_dtype_t d;
    CU_ASSERT_EQUAL(fsdp_dtype_size(FSDP_DTYPE_F32), 4);
    CU_ASSERT_EQUAL(fsdp_dtype_size(FSDP_DTYPE_BF16), 2);
    CU_ASSERT_EQUAL(fsdp_dtype_size(FSDP_DTYPE_F16), 2);
    CU_ASSERT_EQUAL(fsdp_dtype_size((fsdp_dtype_t)99), 0);
    CU_ASSERT(fsdp_dtype_parse("bf16", &d) && d == FSDP_DTYPE_BF16);
    CU_ASSERT(fsdp_dtype_parse("fp16", &d) && d == FSDP_DTYPE_F16);
    CU_ASSERT(!fsdp_dtype_parse("fp8", &d));
}

static void test_bf16_rounding(void)
{
    /* 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1 */
    CU_ASSERT_EQUAL(fsdp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up */
    CU_ASSERT_EQUAL(fsdp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CU_ASSERT_EQUAL(fsdp_bf16_to_f32(0x3f80), 1.0f);
    CU_ASSERT(isnan(fsdp_bf16_to_f32(fsdp_f32_to_bf16(NAN))));
    CU_ASSERT(isinf(fsdp_bf16_to_f32(fsdp_f32_to_bf16(INFINITY))));
}

static void test_f16_rounding(void)
{
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(1.0f), 0x3c00);
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(65504.0f), 0x7bff);
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(65519.0f), 0x7bff);
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(65520.0f), 0x7c00); /* tie to even: infinity */
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(0x1p-25f), 0x0000); /* tie to even: zero */
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(0x1.8p-25f), 0x0001);
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(-2.0f), 0xc000);
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    CU_ASSERT_EQUAL(fsdp_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    CU_ASSERT_EQUAL(fsdp_f16_to_f32(0x0001), 0x1p-24f);
    CU_ASSERT_EQUAL(fsdp_f16_to_f32(0x7bff), 65504.0f);
    CU_ASSERT(isnan(fsdp_f16_to_f32(fsdp_f32_to_f16(NAN))));
    /* every f16 value survives a round trip through f32 */
    for (unsigned h = 0; h < 0x10000; h++) {
        float f = fsdp_f16_to_f32((uint16_t)h);
        if (!isnan(f))
            CU_ASSERT_EQUAL_FATAL(fsdp_f32_to_f16(f), h);
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"status strings", test_status_strings},
        {"version", test_version},
        {"dtypes", test_dtypes},
        {"backend table check covers every slot", test_backend_check},
        {"bf16 rounding", test_bf16_rounding},
        {"f16 rounding", test_f16_rounding},
        {NULL, NULL},
    };
    return fsdp_test_run("basics", tests);
}
