/*
 * unit.h — what every Check unit test shares: making its suite, running
 * it and turning the result into the exit status automake's harness
 * reads.
 */
#ifndef KOLO_TESTS_UNIT_H
#define KOLO_TESTS_UNIT_H

#include <check.h>
#include <stddef.h>
#include <stdlib.h>

/* Check's ck_assert_msg (and every ck_assert_* built on it) marks the
 * place of each assertion that passes with a write(2) to the runner, so
 * that a crash can be placed after it. The tests that compare every
 * element of large arrays made millions of those: test-reduce spent 14 of
 * its 25 s in write(2), and minutes under the sanitizers. Here a passing
 * assertion costs only its test; a failing one fails exactly as Check's
 * does (file, line, expression, message). A crash is still reported as
 * one, placed at the test's first line instead of its last assertion. */
#undef ck_assert_msg
#define ck_assert_msg(expr, ...)                                               \
    ((expr) ? (void)0                                                          \
            : _ck_assert_failed(__FILE__, __LINE__,                            \
                                "Assertion '" #expr "' failed", ##__VA_ARGS__))

/* Defines `static void name(void *out, const void *a, const void *b,
 * size_t n)`, an element-wise reduction of the kind the backends' ops take
 * (out[i] = expr, where x and y are a[i] and b[i], of type `type`): the
 * tests of a backend hand it their own, computed here, not the runtime's. */
#define KOLO_UNIT_REDUCE_FN(name, type, expr)                                  \
    static void name(void *out, const void *a, const void *b, size_t n)        \
    {                                                                          \
        for (size_t i = 0; i < n; i++) {                                       \
            type x = ((const type *)a)[i], y = ((const type *)b)[i];           \
            ((type *)out)[i] = (type)(expr);                                   \
        }                                                                      \
    }

/* Adds to suite s a test case `name` of the given tests, each allowed
 * `timeout` seconds; returns it, for fixtures and more tests. */
static inline TCase *kolo_unit_tcase(Suite *s, const char *name,
                                     double timeout, const TTest *const *tests,
                                     size_t n)
{
    TCase *tc = tcase_create(name);

    tcase_set_timeout(tc, timeout);
    for (size_t i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return tc;
}

/* The tests listed, as kolo_unit_tcase's last two arguments. */
#define KOLO_UNIT_TESTS(...)                                                   \
    (const TTest *const[]){__VA_ARGS__},                                       \
        sizeof((const TTest *const[]){__VA_ARGS__}) / sizeof(const TTest *)

/* A suite of one test case, "core", of the given tests, each allowed
 * `timeout` seconds. */
static inline Suite *kolo_unit_suite(const char *name, double timeout,
                                     const TTest *const *tests, size_t n)
{
    Suite *s = suite_create(name);

    kolo_unit_tcase(s, "core", timeout, tests, n);
    return s;
}

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

/* A test program's main: one suite `name` of one case of the tests listed,
 * each allowed `timeout` seconds; Check prints the summary. */
#define KOLO_UNIT_MAIN(name, timeout, ...)                                     \
    int main(void)                                                             \
    {                                                                          \
        const TTest *const tests_[] = {__VA_ARGS__};                           \
        return kolo_unit_run(kolo_unit_suite(                                  \
            name, timeout, tests_, sizeof(tests_) / sizeof(tests_[0])));       \
    }

#endif /* KOLO_TESTS_UNIT_H */
