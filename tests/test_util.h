/* Shared helpers of the CUnit test programs. */
#ifndef FSDP_TEST_UTIL_H
#define FSDP_TEST_UTIL_H

#include <CUnit/Basic.h>
#include <fsdp/gpu.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fsdp_test_case {
    const char *name;
    void (*func)(void);
} fsdp_test_case_t;

/* Runs one suite of tests; returns the process exit status (0 when every test passed). */
static inline int fsdp_test_run(const char *suite_name, const fsdp_test_case_t *tests)
{
    CU_pSuite suite;
    unsigned failures;

    if (CU_initialize_registry() != CUE_SUCCESS)
        return 99;
    suite = CU_add_suite(suite_name, NULL, NULL);
    if (suite == NULL)
        return 99;
    for (const fsdp_test_case_t *t = tests; t->name != NULL; t++) {
        if (CU_add_test(suite, t->name, t->func) == NULL)
            return 99;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failures == 0 ? 0 : 1;
}

/* Checks on rank threads. CUnit's asserts belong to the main thread (a failing _FATAL assert
 * longjmps, and never across threads), so a rank function checks with FSDP_RANK_CHECK*, which
 * records the first failure of any rank, and the main thread asserts the record with
 * fsdp_test_failure_assert once the ranks have joined. A passing check costs one branch.
 *
 * A zeroed fsdp_test_failure_t (static, calloc or `= {0}`) is ready; asserting it clears it. */
typedef struct fsdp_test_failure {
    atomic_int count; /* failed checks, every rank together */
    atomic_int state; /* 0: none, 1: the first is being written, 2: written */
    const char *file;
    int line;
    char text[640]; /* "rank R: expression (detail)" */
} fsdp_test_failure_t;

/* Records a failed check of `rank` unless one is recorded already; returns 0 (the check's
 * value). detail may be NULL. */
static inline int fsdp_test_record(fsdp_test_failure_t *f, const char *file, int line, int rank,
                                   const char *expr, const char *detail)
{
    int none = 0;

    atomic_fetch_add(&f->count, 1);
    if (!atomic_compare_exchange_strong(&f->state, &none, 1))
        return 0;
    f->file = file;
    f->line = line;
    if (detail != NULL)
        snprintf(f->text, sizeof(f->text), "rank %d: %s (%s)", rank, expr, detail);
    else
        snprintf(f->text, sizeof(f->text), "rank %d: %s", rank, expr);
    atomic_store(&f->state, 2);
    return 0;
}

/* As fsdp_test_record, with a printf-style detail. */
static inline int fsdp_test_fail(fsdp_test_failure_t *f, const char *file, int line, int rank,
                                 const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static inline int fsdp_test_fail(fsdp_test_failure_t *f, const char *file, int line, int rank,
                                 const char *expr, const char *fmt, ...)
{
    char detail[384];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    return fsdp_test_record(f, file, line, rank, expr, detail);
}

/* Records `a == b` failing with both values; returns whether they are equal. */
static inline int fsdp_test_check_eq(fsdp_test_failure_t *f, const char *file, int line, int rank,
                                     long long a, long long b, const char *expr)
{
    if (a == b)
        return 1;
    return fsdp_test_fail(f, file, line, rank, expr, "%lld, expected %lld", a, b);
}

static inline int fsdp_test_check_eq_fp(fsdp_test_failure_t *f, const char *file, int line,
                                        int rank, double a, double b, const char *expr)
{
    if (a == b)
        return 1;
    return fsdp_test_fail(f, file, line, rank, expr, "%.9g, expected %.9g", a, b);
}

/* Each check is an expression, true when it passed, so that a rank can stop where the rest
 * cannot run: `if (!FSDP_RANK_CHECK(...)) return FSDP_ERR_INTERNAL;`. */
#define FSDP_RANK_CHECK(fail, rank, cond)                                                          \
    ((cond) ? 1 : fsdp_test_record((fail), __FILE__, __LINE__, (rank), #cond, NULL))

/* With a printf-style detail, e.g. the values that made the check fail. */
#define FSDP_RANK_CHECK_MSG(fail, rank, cond, ...)                                                 \
    ((cond) ? 1 : fsdp_test_fail((fail), __FILE__, __LINE__, (rank), #cond, __VA_ARGS__))

/* Equality of two numbers (integers, statuses or floating point, compared as such), reporting
 * both values. */
#define FSDP_RANK_CHECK_EQ(fail, rank, a, b)                                                       \
    _Generic((a) + (b), float                                                                      \
             : fsdp_test_check_eq_fp, double                                                       \
             : fsdp_test_check_eq_fp, default                                                      \
             : fsdp_test_check_eq)((fail), __FILE__, __LINE__, (rank), (a), (b), #a " == " #b)

/* A check the rest of the rank function depends on (a _FATAL assert on the main thread): when
 * it fails, the rank function returns FSDP_ERR_INTERNAL. */
#define FSDP_RANK_REQUIRE_MSG(fail, rank, cond, ...)                                               \
    do {                                                                                           \
        if (!FSDP_RANK_CHECK_MSG(fail, rank, cond, __VA_ARGS__))                                   \
            return FSDP_ERR_INTERNAL;                                                              \
    } while (0)

/* A sim rank's call that must return FSDP_OK; otherwise its status and the sim's last error
 * are recorded and the rank function returns FSDP_ERR_INTERNAL. */
#define FSDP_RANK_REQUIRE_OK(fail, dev, call)                                                      \
    do {                                                                                           \
        fsdp_status_t st_ = (call);                                                                \
        if (st_ != FSDP_OK) {                                                                      \
            fsdp_test_fail((fail), __FILE__, __LINE__, (dev)->rank, #call, "returned %s: %s",      \
                           fsdp_status_name(st_), fsdp_sim_last_error(dev));                       \
            return FSDP_ERR_INTERNAL;                                                              \
        }                                                                                          \
    } while (0)

/* On the main thread, after the ranks joined: one CUnit assertion, failed at the first failed
 * check's place with its text and the number of failed checks; then the record is cleared. */
static inline void fsdp_test_failure_assert(fsdp_test_failure_t *f)
{
    char msg[sizeof(f->text) + 64];
    int n = atomic_load(&f->count);

    if (n == 0) {
        CU_assertImplementation(CU_TRUE, __LINE__, "no failed check on a rank", __FILE__, "",
                                CU_FALSE);
        return;
    }
    if (atomic_load(&f->state) == 2)
        snprintf(msg, sizeof(msg), "%s [%d failed check%s on the ranks]", f->text, n,
                 n == 1 ? "" : "s");
    else
        snprintf(msg, sizeof(msg), "%d failed check%s on the ranks", n, n == 1 ? "" : "s");
    CU_assertImplementation(CU_FALSE, (unsigned)f->line, msg, f->file ? f->file : __FILE__, "",
                            CU_FALSE);
    atomic_store(&f->count, 0);
    atomic_store(&f->state, 0);
    f->file = NULL;
    f->line = 0;
}

/* A gpu test's first line: what it found (driver, runtime, NCCL and cuBLAS versions, the
 * devices and their compute capability, or why there is none). */
static inline void fsdp_test_gpu_banner(const char *prog)
{
    char found[1024];

    fsdp_gpu_describe(found, sizeof(found));
    printf("%s: %s\n", prog, found);
    fflush(stdout);
}

/* A gpu test without a device: 77 (skipped), or 1 when FSDP_REQUIRE_GPU is set (make
 * check-gpu), saying which and why. */
static inline int fsdp_test_skip_gpu(const char *prog, const char *why)
{
    const char *req = getenv("FSDP_REQUIRE_GPU");
    int required = req != NULL && req[0] != '\0' && strcmp(req, "0") != 0;

    printf("%s: %s: %s\n", prog, required ? "FAIL (FSDP_REQUIRE_GPU is set)" : "skipped", why);
    return required ? 1 : 77;
}

/* A xorshift generator for test inputs: the next 32 bits of *state (any nonzero seed). */
static inline uint32_t fsdp_test_rand32(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 11);
}

/* The float of the given bits (a NaN of a chosen payload, say). */
static inline float fsdp_test_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The closing line of a test of vector loops against their scalar replay: which ISAs it could
 * run (have_isa[0] SSE2, have_isa[1] AVX2) and how many runs it compared; at least one. */
static inline void fsdp_test_isa_summary(const int *have_isa, long compared)
{
    printf("\n  sse2 %s, avx2 %s; %ld runs compared with the scalar replay ",
           have_isa[0] ? "tested" : "not available", have_isa[1] ? "tested" : "not available",
           compared);
    CU_ASSERT(compared > 0);
}

#endif
