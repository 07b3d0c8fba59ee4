/*
 * suite.c - the CUnit driver (see suite.h).
 */
#include "suite.h"

#include <CUnit/Basic.h>

int suite_run(const char *suite, const suite_test *tests)
{
    CU_pSuite s;
    unsigned failed;
    int i;
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 99;
    s = CU_add_suite(suite, NULL, NULL);
    if (!s) {
        CU_cleanup_registry();
        return 99;
    }
    for (i = 0; tests[i].name; i++)
        if (!CU_add_test(s, tests[i].name, tests[i].fn)) {
            CU_cleanup_registry();
            return 99;
        }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    if (CU_basic_run_tests() != CUE_SUCCESS) {
        CU_cleanup_registry();
        return 99;
    }
    failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
