/* Shard arithmetic (docs/runtime.md section 4): sizes, padding, per-parameter shard info and
 * gradient divide factors. */
#include <fsdp/fsdp.h>
#include <string.h>

#include "core/core_hidden.h"
#include "test_util.h"

static void test_shard_table(void)
{
    static const struct {
        size_t total;
        int world;
        size_t shard;
        size_t chunks[8];
    } cases[] = {
        {5, 4, 2, {2, 2, 1, 0}},
        {3, 8, 1, {1, 1, 1, 0, 0, 0, 0, 0}},
        {8, 4, 2, {2, 2, 2, 2}},
        {7, 3, 3, {3, 3, 1}},
        {1, 1, 1, {1}},
        {10, 1, 10, {10}},
        {9, 4, 3, {3, 3, 3, 0}},
        {13, 5, 3, {3, 3, 3, 3, 1}},
        {1, 2, 1, {1, 0}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t sum = 0;
        CU_ASSERT_EQUAL(fsdp_shard_numel(cases[c].total, cases[c].world), cases[c].shard);
        for (int r = 0; r < cases[c].world; r++) {
            size_t numel, pad;
            fsdp_shard_extent(cases[c].total, cases[c].world, r, &numel, &pad);
            CU_ASSERT_EQUAL(numel, cases[c].chunks[r]);
            CU_ASSERT_EQUAL(pad, cases[c].shard - cases[c].chunks[r]);
            sum += numel;
        }
        CU_ASSERT_EQUAL(sum, cases[c].total);
    }
    /* the example of docs/runtime.md section 4: T=5, W=4 pads 0,0,1,2 */
    size_t numel, pad;
    fsdp_shard_extent(5, 4, 3, &numel, &pad);
    CU_ASSERT(numel == 0 && pad == 2);
    fsdp_shard_extent(5, 4, 2, &numel, &pad);
    CU_ASSERT(numel == 1 && pad == 1);
}

static void test_divide_factors(void)
{
    static const struct {
        int d;
        double pre, post;
    } table[] = {{1, 1, 1},  {2, 2, 1},    {3, 2, 1.5}, {4, 2, 2},   {6, 4, 1.5},
                 {8, 4, 2},  {16, 4, 4},   {32, 8, 4},  {64, 8, 8},  {128, 16, 8}};
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        double pre, post;
        fsdp_divide_factors(table[i].d, &pre, &post);
        CU_ASSERT_DOUBLE_EQUAL(pre, table[i].pre, 0.0);
        CU_ASSERT_DOUBLE_EQUAL(post, table[i].post, 0.0);
    }
    for (int d = 1; d <= 128; d++) {
        double pre, post;
        int f;
        fsdp_divide_factors(d, &pre, &post);
        f = (int)pre;
        /* a power of two, the product is D, and growing stopped for the documented reason */
        CU_ASSERT((f & (f - 1)) == 0);
        CU_ASSERT_DOUBLE_EQUAL(pre * post, (double)d, 1e-12);
        CU_ASSERT(!(d % f == 0 && d / f > f));
        CU_ASSERT(f == 1 || (d % (f / 2) == 0 && d / (f / 2) > f / 2));
    }
}

/* Per-parameter shard info needs a process group: parameters of 3, 4 and 2 elements (T=9) on
 * 4 ranks (S=3). Rank intervals [0,3) [3,6) [6,9) [9,12). */
typedef struct {
    size_t in_shard[4][3], offset[4][3], intra[4][3], numel[4][3];
} info_table_t;

static info_table_t seen;
static fsdp_test_failure_t failure; /* info_rank's checks */

static fsdp_status_t info_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_param_spec_t specs[3];
    fsdp_unit_t *root, *u;
    fsdp_t *fs;
    fsdp_status_t status;
    (void)arg;

    memset(specs, 0, sizeof(specs));
    const char *names[3] = {"a", "b", "c"};
    int64_t sizes[3] = {3, 4, 2};
    for (int i = 0; i < 3; i++) {
        specs[i].name = names[i];
        specs[i].ndim = 1;
        specs[i].shape[0] = sizes[i];
        specs[i].requires_grad = 1;
        specs[i].tied_to = -1;
    }
    status = fsdp_create(dev, NULL, &fs);
    if (status != FSDP_OK)
        return status;
    status = fsdp_unit_create(fs, "root", NULL, NULL, 0, &root);
    if (status == FSDP_OK)
        status = fsdp_unit_create(fs, "u", root, specs, 3, &u);
    if (status == FSDP_OK) {
        FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_flat_numel(u), 9);
        FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_shard_numel(u), 3);
        for (int i = 0; i < 3; i++) {
            fsdp_param_info_t pi;
            fsdp_unit_param_info(u, i, &pi);
            seen.in_shard[dev->rank][i] = (size_t)pi.in_shard;
            seen.offset[dev->rank][i] = pi.offset_in_shard;
            seen.intra[dev->rank][i] = pi.intra_start;
            seen.numel[dev->rank][i] = pi.numel_in_shard;
        }
    }
    fsdp_destroy(fs);
    return status;
}

static void test_param_shard_info(void)
{
    static const info_table_t want = {
        .in_shard = {{1, 0, 0}, {0, 1, 0}, {0, 1, 1}, {0, 0, 0}},
        .offset = {{0, 0, 0}, {0, 0, 0}, {0, 0, 1}, {0, 0, 0}},
        .intra = {{0, 0, 0}, {0, 0, 0}, {0, 3, 0}, {0, 0, 0}},
        .numel = {{3, 0, 0}, {0, 3, 0}, {0, 1, 2}, {0, 0, 0}},
    };
    fsdp_sim_params_t p;
    fsdp_status_t status;
    fsdp_sim_params_init(&p);
    p.world_size = 4;
    status = fsdp_sim_launch(&p, info_rank, NULL, NULL);
    fsdp_test_failure_assert(&failure);
    CU_ASSERT_EQUAL_FATAL(status, FSDP_OK);
    CU_ASSERT(memcmp(&seen, &want, sizeof(want)) == 0);
}

/* Auto-wrap over a GPT-2-like tree: root (embeddings, final norm) with two blocks of
 * ln (8) + attn (100) + mlp (200). */
static void test_auto_wrap(void)
{
    static const fsdp_module_desc_t mods[] = {
        {"", "GPT", 50, -1},          /* 0 */
        {"h.0", "Block", 0, 0},       /* 1 */
        {"h.0.ln_1", "LayerNorm", 8, 1},
        {"h.0.attn", "Attention", 100, 1},
        {"h.0.mlp", "MLP", 200, 1},   /* 4 */
        {"h.1", "Block", 0, 0},       /* 5 */
        {"h.1.ln_1", "LayerNorm", 8, 5},
        {"h.1.attn", "Attention", 100, 5},
        {"h.1.mlp", "MLP", 200, 5},   /* 8 */
        {"ln_f", "LayerNorm", 8, 0},  /* 9 */
    };
    static const char *const block[] = {"Block"};
    int unit_of[10];
    fsdp_wrap_policy_t p;

    fsdp_wrap_policy_init(&p, FSDP_WRAP_BY_TYPE);
    p.types = block;
    p.ntypes = 1;
    CU_ASSERT_EQUAL_FATAL(fsdp_auto_wrap(&p, mods, 10, unit_of), FSDP_OK);
    static const int by_type[10] = {0, 1, 1, 1, 1, 5, 5, 5, 5, 0};
    CU_ASSERT(memcmp(unit_of, by_type, sizeof(by_type)) == 0);

    /* min params 150: each mlp (200) is wrapped; a block then holds 108 < 150 unwrapped */
    fsdp_wrap_policy_init(&p, FSDP_WRAP_MIN_PARAMS);
    CU_ASSERT_EQUAL(p.min_num_params, 100000000);
    p.min_num_params = 150;
    CU_ASSERT_EQUAL_FATAL(fsdp_auto_wrap(&p, mods, 10, unit_of), FSDP_OK);
    static const int by_size[10] = {0, 0, 0, 0, 4, 0, 0, 0, 8, 0};
    CU_ASSERT(memcmp(unit_of, by_size, sizeof(by_size)) == 0);
    /* min params 300: mlps stay, blocks (308) wrap */
    p.min_num_params = 300;
    CU_ASSERT_EQUAL_FATAL(fsdp_auto_wrap(&p, mods, 10, unit_of), FSDP_OK);
    CU_ASSERT(memcmp(unit_of, by_type, sizeof(by_type)) == 0);

    fsdp_wrap_policy_init(&p, FSDP_WRAP_NONE);
    CU_ASSERT_EQUAL_FATAL(fsdp_auto_wrap(&p, mods, 10, unit_of), FSDP_OK);
    for (int i = 0; i < 10; i++)
        CU_ASSERT_EQUAL(unit_of[i], 0);

    /* a bad tree and a custom policy without a function are refused */
    fsdp_module_desc_t bad[2] = {{"", "M", 1, -1}, {"x", "M", 1, 5}};
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(fsdp_auto_wrap(&p, bad, 2, unit_of), FSDP_ERR_INVALID_PARAM);
    fsdp_wrap_policy_init(&p, FSDP_WRAP_CUSTOM);
    CU_ASSERT_EQUAL(fsdp_auto_wrap(&p, mods, 10, unit_of), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_WARN);
}

static int wrap_attn(const fsdp_module_desc_t *m, size_t unwrapped, void *arg)
{
    (void)unwrapped;
    (void)arg;
    return strcmp(m->type, "Attention") == 0;
}

static void test_auto_wrap_custom(void)
{
    static const fsdp_module_desc_t mods[] = {
        {"", "GPT", 50, -1}, {"h.0", "Block", 0, 0}, {"h.0.attn", "Attention", 100, 1}};
    int unit_of[3];
    fsdp_wrap_policy_t p;
    fsdp_wrap_policy_init(&p, FSDP_WRAP_CUSTOM);
    p.func = wrap_attn;
    CU_ASSERT_EQUAL_FATAL(fsdp_auto_wrap(&p, mods, 3, unit_of), FSDP_OK);
    CU_ASSERT(unit_of[0] == 0 && unit_of[1] == 0 && unit_of[2] == 2);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"shard sizes and padding", test_shard_table},
        {"gradient divide factors", test_divide_factors},
        {"per-parameter shard info", test_param_shard_info},
        {"auto-wrap policies", test_auto_wrap},
        {"auto-wrap with a custom policy", test_auto_wrap_custom},
        {NULL, NULL},
    };
    return fsdp_test_run("shard", tests);
}
