/*
 * suite.h - the CUnit driver of the test programs (their other helpers are
 * the harness's: harness/util.h, harness/case.h).
 */
#ifndef BEAMMOE_TESTS_SUITE_H
#define BEAMMOE_TESTS_SUITE_H

#include "case.h"

typedef struct suite_test {
    const char *name;
    void (*fn)(void);
} suite_test;

/* Run one suite of tests (array ends with {NULL, NULL}); returns the exit
 * status for automake: 0 all passed, 1 a failure, 99 CUnit itself failed. */
int suite_run(const char *suite, const suite_test *tests);

#endif
