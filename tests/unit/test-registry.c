/*
 * test-registry.c — unit tests of ops/registry.c: the one place that
 * chooses a backend for a role of a process set (kolo__ops_choose).
 *
 * Why these tests: the choice decides which transport every byte takes,
 * and a wrong default is silent (a job on one host over Gloo works, only
 * slower; a job across hosts over shared memory cannot). So each rule of
 * the policy in ops.h is checked against the backends this build has, and
 * every refusal against the sentence a user reads.
 */
#include "config.h"

#include <check.h>
#include <string.h>

#include "ops.h"
#include "unit.h"

static kolo__ops_need_t need(int size, int all_local, int mpi, const char *want)
{
    return (kolo__ops_need_t){size, all_local, mpi, 3, "KOLO_CPU_OPERATIONS",
                              want};
}

/* The first network backend of this build, as the policy orders them. */
static const kolo__ops_t *first_network(int mpi_launched)
{
    if (mpi_launched && kolo__ops_find("mpi") != NULL)
        return kolo__ops_find("mpi");
    if (kolo__ops_find("gloo") != NULL)
        return kolo__ops_find("gloo");
    return kolo__ops_find("mpi");
}

START_TEST(one_member_is_local)
{
    kolo__ops_need_t n = need(1, 1, 0, "gloo");
    const kolo__ops_t *ops = NULL;
    char err[256];

    /* Even when a backend is named: one rank needs no peers. */
    ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)), KOLO_OK);
    ck_assert_ptr_eq(ops, &kolo__ops_local);
}
END_TEST

START_TEST(defaults)
{
    const kolo__ops_t *ops = NULL, *want;
    char err[256];

    for (int all_local = 0; all_local <= 1; all_local++) {
        for (int mpi = 0; mpi <= 1; mpi++) {
            const char *auto_names[] = {NULL, "", "auto"};
            for (int a = 0; a < 3; a++) {
                kolo__ops_need_t n = need(4, all_local, mpi, auto_names[a]);
                /* Under mpirun MPI, as Horovod; else shared memory on
                 * one host; else the network. */
                want = mpi && kolo__ops_find("mpi") != NULL
                           ? kolo__ops_find("mpi")
                       : all_local && kolo__ops_find("shm") != NULL
                           ? kolo__ops_find("shm")
                           : first_network(mpi);
                if (want == NULL) {
                    ck_assert_int_eq(kolo__ops_choose(&n, &ops, err,
                                                      sizeof(err)),
                                     KOLO_ERR_UNSUPPORTED);
                    ck_assert_ptr_nonnull(strstr(err, "built without one"));
                    continue;
                }
                ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                                 KOLO_OK);
                ck_assert_ptr_eq(ops, want);
            }
        }
    }
}
END_TEST

START_TEST(unknown_name_lists_the_others)
{
    kolo__ops_need_t n = need(2, 1, 0, "tcp");
    const kolo__ops_t *ops = &kolo__ops_local;
    char err[256], names[128];

    ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                     KOLO_ERR_UNSUPPORTED);
    ck_assert_ptr_null(ops);
    kolo__ops_names(names, sizeof(names));
    ck_assert_ptr_nonnull(strstr(err, "KOLO_CPU_OPERATIONS=tcp: this kolo "
                                      "has no backend of that name"));
    ck_assert_ptr_nonnull(strstr(err, names[0] ? names : "none"));
    /* Composed backends are never named by users. */
    n.want = "hier";
    ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                     KOLO_ERR_UNSUPPORTED);
    n.want = "local";
    ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                     KOLO_ERR_UNSUPPORTED);
    ck_assert_ptr_null(strstr(names, "hier"));
    ck_assert_ptr_null(strstr(names, "local"));
}
END_TEST

START_TEST(named_backends_and_their_limits)
{
    const kolo__ops_t *ops;
    char err[256];

    if (kolo__ops_find("shm") != NULL) {
        kolo__ops_need_t n = need(2, 0, 0, "shm");
        ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                         KOLO_ERR_UNSUPPORTED);
        ck_assert_str_eq(err, "KOLO_CPU_OPERATIONS=shm: the ranks of this "
                              "job or process set are not all on one host");
        n.all_local = 1;
        ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)), KOLO_OK);
        ck_assert_ptr_eq(ops, kolo__ops_find("shm"));
    }
    if (kolo__ops_find("mpi") != NULL) {
        kolo__ops_need_t n = need(2, 1, 0, "mpi");
        ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                         KOLO_ERR_UNSUPPORTED);
        ck_assert_str_eq(err, "KOLO_CPU_OPERATIONS=mpi: the mpi backend needs "
                              "the job to be started by mpirun (or kolorun "
                              "--mpi), and rank 3 was started by kolorun "
                              "without --mpi");
        n.mpi_launched = 1;
        ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)), KOLO_OK);
        ck_assert_ptr_eq(ops, kolo__ops_find("mpi"));
    }
    if (kolo__ops_find("gloo") != NULL) {
        /* A network backend serves one host as well as many. */
        for (int all_local = 0; all_local <= 1; all_local++) {
            kolo__ops_need_t n = need(3, all_local, 1, "gloo");
            ck_assert_int_eq(kolo__ops_choose(&n, &ops, err, sizeof(err)),
                             KOLO_OK);
            ck_assert_ptr_eq(ops, kolo__ops_find("gloo"));
        }
    }
}
END_TEST

START_TEST(capabilities_match_the_backends)
{
    const kolo__ops_t *shm = kolo__ops_find("shm"), *hier;

    ck_assert_uint_eq(kolo__ops_local.caps & KOLO__OPS_USER, 0);
    if (shm != NULL) {
        ck_assert_uint_ne(shm->caps & KOLO__OPS_ONE_HOST, 0);
        ck_assert_uint_eq(shm->caps & KOLO__OPS_NETWORK, 0);
        hier = kolo__ops_hierarchical();
        ck_assert_ptr_nonnull(hier);
        ck_assert_str_eq(hier->name, "hier");
        ck_assert_uint_eq(hier->caps & KOLO__OPS_USER, 0);
    }
    if (kolo__ops_find("gloo") != NULL)
        ck_assert_uint_ne(kolo__ops_find("gloo")->caps & KOLO__OPS_NETWORK, 0);
    if (kolo__ops_find("mpi") != NULL)
        ck_assert_uint_ne(kolo__ops_find("mpi")->caps & KOLO__OPS_MPIRUN, 0);
    /* kolo-bench's copy of the host backends has no device backend. */
    ck_assert_ptr_null(kolo__ops_device());
}
END_TEST

KOLO_UNIT_MAIN("registry", 30,
        one_member_is_local, defaults, unknown_name_lists_the_others,
        named_backends_and_their_limits, capabilities_match_the_backends)
