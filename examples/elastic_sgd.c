/*
 * elastic_sgd.c — an elastic C program: linear regression by data-parallel
 * SGD that goes on when ranks are lost or hosts come and go, following the
 * life cycle kolo.h documents under "Elastic jobs".
 *
 *   kolorun -np 2 --min-np 1 -H localhost:1,127.0.0.1:1 ./examples/elastic_sgd
 *   kolorun -np 2 --min-np 1 --host-discovery-script ./hosts.sh \
 *       ./examples/elastic_sgd [STEPS]
 *
 * The data: y = x . TRUE_W + 0.5 for 4096 fixed samples. Each step, rank r
 * of n takes a batch of its share of the samples, computes the gradient of
 * the squared error, and the gradients are averaged (allreduce AVERAGE).
 * The state (weights, bias, step) is committed after every step:
 *  - a step that fails with KOLO_ERR_MEMBERSHIP (a rank was lost): back to
 *    the last commit, then kolo_shutdown, kolo_init, and rank 0's state is
 *    broadcast to the new membership;
 *  - at each commit kolo_hosts_updated() (rank 0's answer, broadcast)
 *    says whether hosts were added or removed: re-form the same way, but
 *    keep the state (nothing failed);
 *  - kolo_init returning KOLO_ERR_REMOVED: this worker's host left the
 *    job; it exits 0.
 * Rank 0 prints the loss now and then, and the membership at each change.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kolo.h"

#define DIM 8
#define SAMPLES 4096
#define BATCH 32

typedef struct state {
    double w[DIM + 1]; /* weights, then the bias */
    double step;
} state_t;

static double sample_x(int i, int j)
{
    /* A fixed pseudo-random input in [-1, 1): the same on every rank. */
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(j * 40503u + 17);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (double)(h % 20000) / 10000.0 - 1.0;
}

static double sample_y(int i)
{
    double y = 0.5;
    for (int j = 0; j < DIM; j++)
        y += sample_x(i, j) * (j + 1) * 0.25;
    return y;
}

/* kolo_init (again while a newer membership overtook it), then rank 0's
 * committed state for everyone. Returns 1 when this worker was removed. */
static int join(state_t *committed)
{
    kolo_handle_t h;
    int rc;

    while ((rc = kolo_init()) == KOLO_ERR_MEMBERSHIP)
        ;
    if (rc == KOLO_ERR_REMOVED)
        return 1;
    if (rc != KOLO_OK) {
        fprintf(stderr, "elastic_sgd: kolo_init: %s\n", kolo_last_error());
        exit(1);
    }
    if (kolo_rank() == 0)
        printf("membership %d: %d ranks\n", kolo_elastic_generation(),
               kolo_size());
    rc = kolo_broadcast_async("state", committed, DIM + 2, KOLO_FLOAT64, 0,
                              NULL, &h);
    if (rc == KOLO_OK)
        rc = kolo_wait(h);
    return rc == KOLO_OK ? 0 : -1;
}

/* One step's gradient on this rank's batch; returns the batch loss. */
static double gradient(const state_t *s, double *g)
{
    int rank = kolo_rank(), size = kolo_size();
    int share = SAMPLES / size, start = rank * share;
    double loss = 0;

    memset(g, 0, (DIM + 1) * sizeof(double));
    for (int b = 0; b < BATCH; b++) {
        int i = start + (int)(((long)s->step * BATCH + b) % share);
        double pred = s->w[DIM], err;
        for (int j = 0; j < DIM; j++)
            pred += s->w[j] * sample_x(i, j);
        err = pred - sample_y(i);
        loss += err * err / BATCH;
        for (int j = 0; j < DIM; j++)
            g[j] += 2 * err * sample_x(i, j) / BATCH;
        g[DIM] += 2 * err / BATCH;
    }
    return loss;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    state_t committed, live;
    double loss = 0;

    memset(&committed, 0, sizeof(committed));
    if (!kolo_elastic())
        fprintf(stderr, "elastic_sgd: not an elastic job (kolorun --min-np "
                "or --host-discovery-script starts one); running anyway\n");
    if (join(&committed) != 0)
        return 0;
    live = committed;
    while (live.step < steps) {
        double g[DIM + 1];
        kolo_handle_t h;
        int rc, bits;

        loss = gradient(&live, g);
        rc = kolo_allreduce_async("grad", g, g, DIM + 1, KOLO_FLOAT64,
                                  KOLO_OP_AVERAGE, &h);
        if (rc == KOLO_OK)
            rc = kolo_wait(h);
        if (rc == KOLO_OK) {
            for (int j = 0; j <= DIM; j++)
                live.w[j] -= 0.05 * g[j];
            live.step++;
            committed = live; /* commit */
            bits = kolo_hosts_updated();
            rc = kolo_broadcast_async("hosts_updated", &bits, 1, KOLO_INT32,
                                      0, NULL, &h);
            if (rc == KOLO_OK)
                rc = kolo_wait(h);
            if (rc == KOLO_OK && bits == 0) {
                if (kolo_rank() == 0 && (int)live.step % 500 == 0)
                    printf("step %d: loss %.6f\n", (int)live.step, loss);
                continue;
            }
        }
        if (rc != KOLO_OK && rc != KOLO_ERR_MEMBERSHIP) {
            fprintf(stderr, "elastic_sgd: step %d: %s\n", (int)live.step,
                    kolo_last_error());
            return 1;
        }
        /* Re-form: after a loss, from the last commit. */
        live = committed;
        kolo_shutdown();
        if (join(&committed) != 0)
            return 0;
        live = committed;
    }
    if (kolo_rank() == 0) {
        printf("done: %d steps, loss %.6f, bias %.4f (true 0.5)\n",
               (int)live.step, loss, live.w[DIM]);
        for (int j = 0; j < DIM; j++)
            if (fabs(live.w[j] - (j + 1) * 0.25) > 0.05)
                printf("weight %d: %.4f, expected %.4f\n", j, live.w[j],
                       (j + 1) * 0.25);
    }
    kolo_shutdown();
    return 0;
}
