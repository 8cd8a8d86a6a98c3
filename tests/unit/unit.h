/*
 * unit.h — what every Check unit test shares: running its suite and
 * turning the result into the exit status automake's harness reads.
 */
#ifndef KOLO_TESTS_UNIT_H
#define KOLO_TESTS_UNIT_H

#include <check.h>
#include <stdlib.h>

/* Runs the suite (Check prints its summary line) and frees it; 0 when
 * every test passed. */
static inline int kolo_unit_run(Suite *suite)
{
    SRunner *sr = srunner_create(suite);
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif /* KOLO_TESTS_UNIT_H */
