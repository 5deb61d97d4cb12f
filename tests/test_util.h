/* Shared helpers of the CUnit test programs. */
#ifndef FSDP_TEST_UTIL_H
#define FSDP_TEST_UTIL_H

#include <CUnit/Basic.h>
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

/* A gpu test without a device: 77 (skipped), or 1 when FSDP_REQUIRE_GPU is set (make
 * check-gpu), saying which and why. */
static inline int fsdp_test_skip_gpu(const char *prog, const char *why)
{
    const char *req = getenv("FSDP_REQUIRE_GPU");
    int required = req != NULL && req[0] != '\0' && strcmp(req, "0") != 0;

    printf("%s: %s: %s\n", prog, required ? "FAIL (FSDP_REQUIRE_GPU is set)" : "skipped", why);
    return required ? 1 : 77;
}

#endif
