/*
 * train_mlp.c — kolo's "main job": a small but real data-parallel training
 * run written against the C API (kolo.h).
 *
 * What it does
 *   Every rank builds the same synthetic data set from --seed: a three-armed
 *   spiral in the plane (3 classes, 4000 points, 1000 of them held out for
 *   testing). Training sample i belongs to rank i % size, so every rank
 *   trains on its own shard. Every rank initialises the same multi-layer
 *   perceptron from the same seed:
 *
 *       2 inputs -> 64 tanh -> 32 tanh -> 3 logits, softmax cross-entropy
 *
 *   Each step, a rank runs forward and backward on a minibatch of its shard.
 *   As soon as a layer's gradients are computed (last layer first, the order
 *   backpropagation produces them) they are enqueued, one named tensor each
 *   ("grad/fc3/weight", "grad/fc3/bias", ..., "grad/fc1/bias"), with
 *   kolo_allreduce_async_opts(op = AVERAGE); the backward pass of the lower
 *   layers overlaps with the reduction of the upper ones. The rank then waits
 *   for all six handles and applies SGD with momentum. All ranks apply the
 *   same averaged gradient to the same weights, so they stay identical.
 *
 *   --backward-passes N  computes N micro-batches per step and uses kolo's
 *       local gradient accumulation (backward_passes = N, average_passes = 1):
 *       the calls of passes 1..N-1 only add into kolo's accumulator and
 *       complete at once; the call of pass N allreduces the mean of the N
 *       passes' gradients.
 *   --fp16  converts every gradient to IEEE half precision (by hand, below),
 *       allreduces it as KOLO_FLOAT16 and converts the result back.
 *
 *   Rank 0 prints, every --print-every steps, the training loss (averaged
 *   over the steps since the last report and across ranks, allreduced as the
 *   tensor "loss"), the test accuracy (every rank evaluates its share of the
 *   test set, the counts are summed across ranks) and the mean step time.
 *   At the end every rank checks, with a MIN and a MAX allreduce of a weight
 *   checksum, that all ranks hold bit-identical weights. The program exits
 *   non-zero if they differ, if the final test accuracy is below
 *   --min-accuracy, or if any kolo call fails — so it doubles as a smoke test.
 *
 * How to run it
 *   ./examples/train_mlp                       one rank, no launcher needed
 *   kolorun -np 2 ./examples/train_mlp
 *   kolorun -np 4 ./examples/train_mlp --backward-passes 4
 *   kolorun -np 3 ./examples/train_mlp --fp16 --steps 500
 *   ./examples/train_mlp --help                all flags
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo.h"

#define N_IN 2
#define N_H1 64
#define N_H2 32
#define N_CLASSES 3
#define N_SAMPLES 4000
#define N_TEST 1000
#define N_LAYERS 3
#define PI 3.14159265358979323846

static int rank, size;

/* ---- errors -------------------------------------------------------------- */

/* Stops the job: shutting down this rank completes every pending handle on
 * the other ranks with an error, so nobody waits for us forever. */
static void die(void)
{
    if (kolo_is_initialized())
        kolo_shutdown();
    exit(1);
}

static void check(int rc, const char *what)
{
    if (rc != KOLO_OK) {
        fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, what,
                kolo_strerror(rc), kolo_last_error());
        die();
    }
}

/* ---- deterministic random numbers (splitmix64) --------------------------- */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_uniform(rng_t *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* Standard normal (Box-Muller; one of the pair is thrown away). */
static double rng_normal(rng_t *r)
{
    double u = 1.0 - rng_uniform(r), v = rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * PI * v);
}

static void shuffle(int *a, int n, rng_t *r)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(r) % (uint64_t)(i + 1));
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- IEEE 754 binary16 <-> binary32 -------------------------------------- */

/* float -> half, rounding to nearest, ties to even. Overflow gives infinity,
 * NaN stays NaN (quiet), tiny values become subnormals or zero. */
static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    int exp = (int)((x >> 23) & 0xffu);
    uint32_t man = x & 0x7fffffu;

    if (exp == 0xff) /* infinity or NaN */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = exp - 127 + 15; /* the exponent, rebiased for half */
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* A half subnormal: the value is m * 2^-24 with m < 1024. Below
         * 2^-25 everything rounds to zero. */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e; /* 14..24 */
        uint32_t m = man >> shift;
        uint32_t rest = man & ((1u << shift) - 1);
        uint32_t half_way = 1u << (shift - 1);
        if (rest > half_way || (rest == half_way && (m & 1)))
            m++; /* may carry into the smallest normal: still right */
        return (uint16_t)(sign | m);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is right, up to infinity */
    return (uint16_t)h;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t x;

    if (exp == 0x1f) {
        x = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        x = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        x = sign;
    } else { /* subnormal: normalise */
        uint32_t e = 113;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* A quick self-test of the conversions: every half survives a round trip,
 * and values between two halves round to the nearer one (ties to even). */
static void check_half_conversions(void)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
            continue; /* NaN */
        float f = half_to_float((uint16_t)h);
        if (float_to_half(f) != h) {
            fprintf(stderr, "half 0x%04x -> %g does not round-trip\n", h, f);
            exit(1);
        }
        if ((h & 0x7fffu) >= 0x7bffu)
            continue; /* the largest finite half and infinity */
        float g = half_to_float((uint16_t)(h + 1));
        float mid = (f + g) / 2; /* exact in float */
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (float_to_half(mid) != want ||
            float_to_half(nextafterf(mid, 0.0f)) != h ||
            float_to_half(nextafterf(mid, 2 * g)) != (uint16_t)(h + 1)) {
            fprintf(stderr, "rounding between halves 0x%04x and 0x%04x is "
                            "wrong\n", h, h + 1);
            exit(1);
        }
    }
}

/* ---- the data set -------------------------------------------------------- */

static float data_x[N_SAMPLES][N_IN];
static int data_y[N_SAMPLES];

/* Three spiral arms, one per class, each turning about 3/4 of a circle,
 * with Gaussian noise; then shuffled. The first N_SAMPLES - N_TEST points
 * are the training set, the rest the test set. */
static void make_spirals(uint64_t seed)
{
    rng_t r = {seed ^ 0x5eedda7aULL};
    int order[N_SAMPLES];

    for (int i = 0; i < N_SAMPLES; i++) {
        int c = i % N_CLASSES;
        double t = rng_uniform(&r);
        double radius = 0.15 + 1.85 * t;
        double angle = 2.0 * PI * c / N_CLASSES + 1.5 * PI * t;
        order[i] = i;
        data_y[i] = c;
        data_x[i][0] = (float)(radius * cos(angle) + 0.08 * rng_normal(&r));
        data_x[i][1] = (float)(radius * sin(angle) + 0.08 * rng_normal(&r));
    }
    shuffle(order, N_SAMPLES, &r);
    static float x2[N_SAMPLES][N_IN];
    static int y2[N_SAMPLES];
    for (int i = 0; i < N_SAMPLES; i++) {
        memcpy(x2[i], data_x[order[i]], sizeof x2[i]);
        y2[i] = data_y[order[i]];
    }
    memcpy(data_x, x2, sizeof data_x);
    memcpy(data_y, y2, sizeof data_y);
}

/* ---- the model ----------------------------------------------------------- */

/* A fully connected layer: y = W x + b, W stored row-major [out][in]. */
typedef struct {
    int in, out;
    float *w, *b;   /* parameters */
    float *gw, *gb; /* gradients (allreduced in place) */
    float *vw, *vb; /* momentum */
    uint16_t *hw, *hb; /* the gradients as float16, for --fp16 */
    char name_w[32], name_b[32];
} layer_t;

static layer_t L[N_LAYERS];

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n, sz);
    if (!p) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        die();
    }
    return p;
}

/* Glorot-uniform weights, zero biases; the same on every rank. */
static void init_model(uint64_t seed)
{
    static const int dims[N_LAYERS + 1] = {N_IN, N_H1, N_H2, N_CLASSES};
    rng_t r = {seed ^ 0x3e1f00dULL};

    for (int l = 0; l < N_LAYERS; l++) {
        layer_t *y = &L[l];
        size_t nw = (size_t)dims[l] * dims[l + 1];
        y->in = dims[l];
        y->out = dims[l + 1];
        y->w = xcalloc(nw, sizeof(float));
        y->gw = xcalloc(nw, sizeof(float));
        y->vw = xcalloc(nw, sizeof(float));
        y->hw = xcalloc(nw, sizeof(uint16_t));
        y->b = xcalloc((size_t)y->out, sizeof(float));
        y->gb = xcalloc((size_t)y->out, sizeof(float));
        y->vb = xcalloc((size_t)y->out, sizeof(float));
        y->hb = xcalloc((size_t)y->out, sizeof(uint16_t));
        snprintf(y->name_w, sizeof y->name_w, "grad/fc%d/weight", l + 1);
        snprintf(y->name_b, sizeof y->name_b, "grad/fc%d/bias", l + 1);
        double limit = sqrt(6.0 / (y->in + y->out));
        for (size_t i = 0; i < nw; i++)
            y->w[i] = (float)((2.0 * rng_uniform(&r) - 1.0) * limit);
    }
}

/* out[n][y->out] = in[n][y->in] W^T + b, then tanh unless `linear`. */
static void dense(const layer_t *y, const float *in, float *out, int n,
                  int linear)
{
    for (int s = 0; s < n; s++) {
        const float *x = in + (size_t)s * y->in;
        for (int o = 0; o < y->out; o++) {
            const float *w = y->w + (size_t)o * y->in;
            float a = y->b[o];
            for (int i = 0; i < y->in; i++)
                a += w[i] * x[i];
            out[(size_t)s * y->out + o] = linear ? a : tanhf(a);
        }
    }
}

/* Activations of one minibatch. */
static float *x_in, *h1, *h2, *logits, *d_out, *d_h1, *d_h2;

static void alloc_activations(int batch)
{
    size_t n = (size_t)(batch > N_TEST ? batch : N_TEST);
    x_in = xcalloc(n * N_IN, sizeof(float));
    h1 = xcalloc(n * N_H1, sizeof(float));
    h2 = xcalloc(n * N_H2, sizeof(float));
    logits = xcalloc(n * N_CLASSES, sizeof(float));
    d_out = xcalloc(n * N_CLASSES, sizeof(float));
    d_h1 = xcalloc(n * N_H1, sizeof(float));
    d_h2 = xcalloc(n * N_H2, sizeof(float));
}

/* Forward pass of samples idx[0..n-1] into the activation buffers. */
static void forward(const int *idx, int n)
{
    for (int s = 0; s < n; s++)
        memcpy(x_in + (size_t)s * N_IN, data_x[idx[s]], sizeof data_x[0]);
    dense(&L[0], x_in, h1, n, 0);
    dense(&L[1], h1, h2, n, 0);
    dense(&L[2], h2, logits, n, 1);
}

/* ---- gradient allreduce -------------------------------------------------- */

typedef struct {
    int fp16, backward_passes;
    kolo_handle_t handles[2 * N_LAYERS];
    int pending;
} reducer_t;

static void enqueue_grad(reducer_t *rd, const char *name, float *g,
                         uint16_t *h, int64_t n)
{
    kolo_allreduce_opts_t opts;
    kolo_allreduce_opts_init(&opts);
    opts.op = KOLO_OP_AVERAGE;
    if (rd->backward_passes > 1) {
        opts.backward_passes = rd->backward_passes;
        opts.average_passes = 1;
    }
    kolo_handle_t handle;
    int rc;
    if (rd->fp16) {
        for (int64_t i = 0; i < n; i++)
            h[i] = float_to_half(g[i]);
        rc = kolo_allreduce_async_opts(name, h, h, n, KOLO_FLOAT16, &opts,
                                       &handle);
    } else {
        rc = kolo_allreduce_async_opts(name, g, g, n, KOLO_FLOAT32, &opts,
                                       &handle);
    }
    check(rc, name);
    rd->handles[rd->pending++] = handle;
}

/* Waits for every enqueued gradient. `last_pass`: the allreduced result was
 * written, so convert it back from float16 if needed. */
static void wait_grads(reducer_t *rd, int last_pass)
{
    for (int i = 0; i < rd->pending; i++)
        check(kolo_wait(rd->handles[i]), "kolo_wait(gradient)");
    rd->pending = 0;
    if (!rd->fp16 || !last_pass)
        return;
    for (int l = 0; l < N_LAYERS; l++) {
        for (int i = 0; i < L[l].in * L[l].out; i++)
            L[l].gw[i] = half_to_float(L[l].hw[i]);
        for (int i = 0; i < L[l].out; i++)
            L[l].gb[i] = half_to_float(L[l].hb[i]);
    }
}

/* Backward pass of the minibatch of size n held in the activation buffers
 * (after forward()); enqueues every gradient as soon as it is computed.
 * Returns the mean cross-entropy loss of the minibatch. */
static double backward(reducer_t *rd, const int *idx, int n)
{
    double loss = 0;

    /* softmax cross-entropy: d loss / d logits = (p - onehot) / n */
    for (int s = 0; s < n; s++) {
        const float *z = logits + (size_t)s * N_CLASSES;
        float *d = d_out + (size_t)s * N_CLASSES;
        float m = z[0], sum = 0;
        for (int c = 1; c < N_CLASSES; c++)
            m = z[c] > m ? z[c] : m;
        for (int c = 0; c < N_CLASSES; c++)
            sum += (d[c] = expf(z[c] - m));
        int y = data_y[idx[s]];
        loss -= log(d[y] / sum);
        for (int c = 0; c < N_CLASSES; c++)
            d[c] = (d[c] / sum - (c == y)) / (float)n;
    }

    /* Layers from the top: gradients of W and b, enqueue them, then the
     * gradient of the layer's input (through tanh' = 1 - tanh^2). */
    const float *acts[N_LAYERS] = {x_in, h1, h2};
    float *d_acts[N_LAYERS] = {NULL, d_h1, d_h2};
    float *d_cur = d_out;
    for (int l = N_LAYERS - 1; l >= 0; l--) {
        layer_t *y = &L[l];
        const float *a = acts[l];
        memset(y->gw, 0, sizeof(float) * (size_t)y->in * y->out);
        memset(y->gb, 0, sizeof(float) * (size_t)y->out);
        for (int s = 0; s < n; s++) {
            const float *ds = d_cur + (size_t)s * y->out;
            const float *as = a + (size_t)s * y->in;
            for (int o = 0; o < y->out; o++) {
                float *gw = y->gw + (size_t)o * y->in;
                y->gb[o] += ds[o];
                for (int i = 0; i < y->in; i++)
                    gw[i] += ds[o] * as[i];
            }
        }
        enqueue_grad(rd, y->name_w, y->gw, y->hw, (int64_t)y->in * y->out);
        enqueue_grad(rd, y->name_b, y->gb, y->hb, y->out);
        if (l == 0)
            break;
        float *d_prev = d_acts[l];
        for (int s = 0; s < n; s++) {
            const float *ds = d_cur + (size_t)s * y->out;
            const float *as = a + (size_t)s * y->in;
            float *dp = d_prev + (size_t)s * y->in;
            for (int i = 0; i < y->in; i++)
                dp[i] = 0;
            for (int o = 0; o < y->out; o++) {
                const float *w = y->w + (size_t)o * y->in;
                for (int i = 0; i < y->in; i++)
                    dp[i] += ds[o] * w[i];
            }
            for (int i = 0; i < y->in; i++)
                dp[i] *= 1.0f - as[i] * as[i];
        }
        d_cur = d_prev;
    }
    return loss / n;
}

static void sgd_update(float lr, float momentum)
{
    for (int l = 0; l < N_LAYERS; l++) {
        layer_t *y = &L[l];
        for (int i = 0; i < y->in * y->out; i++) {
            y->vw[i] = momentum * y->vw[i] + y->gw[i];
            y->w[i] -= lr * y->vw[i];
        }
        for (int i = 0; i < y->out; i++) {
            y->vb[i] = momentum * y->vb[i] + y->gb[i];
            y->b[i] -= lr * y->vb[i];
        }
    }
}

/* ---- evaluation ---------------------------------------------------------- */

/* Counts the correctly classified test samples of this rank's share of the
 * test set into out[0] and the share's size into out[1]. */
static void evaluate_shard(double out[2])
{
    static int idx[N_TEST];
    int n = 0;
    for (int i = N_SAMPLES - N_TEST + rank; i < N_SAMPLES; i += size)
        idx[n++] = i;
    forward(idx, n);
    int correct = 0;
    for (int s = 0; s < n; s++) {
        const float *z = logits + (size_t)s * N_CLASSES;
        int best = 0;
        for (int c = 1; c < N_CLASSES; c++)
            if (z[c] > z[best])
                best = c;
        correct += best == data_y[idx[s]];
    }
    out[0] = correct;
    out[1] = n;
}

/* The training loss averaged across ranks, and the test accuracy of the
 * whole test set: two allreduces, enqueued together and then waited. */
static void global_metrics(double local_loss, double *loss, double *accuracy)
{
    double counts[2];
    kolo_handle_t hl, hc;
    evaluate_shard(counts);
    check(kolo_allreduce_async("loss", &local_loss, &local_loss, 1,
                               KOLO_FLOAT64, KOLO_OP_AVERAGE, &hl),
          "allreduce(loss)");
    check(kolo_allreduce_async("eval/correct", counts, counts, 2,
                               KOLO_FLOAT64, KOLO_OP_SUM, &hc),
          "allreduce(eval/correct)");
    check(kolo_wait(hl), "kolo_wait(loss)");
    check(kolo_wait(hc), "kolo_wait(eval/correct)");
    *loss = local_loss;
    *accuracy = counts[0] / counts[1];
}

/* ---- the consistency check ----------------------------------------------- */

/* Sum, sum of squares and a 64-bit FNV-1a hash of the bytes of all weights
 * (split into two 32-bit halves, exact in a double). Allreduced with MIN and
 * with MAX: the results agree bit for bit only if every rank has the same. */
static int check_weights_identical(void)
{
    double sum = 0, sumsq = 0;
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (int l = 0; l < N_LAYERS; l++) {
        const float *arrs[2] = {L[l].w, L[l].b};
        int lens[2] = {L[l].in * L[l].out, L[l].out};
        for (int k = 0; k < 2; k++) {
            const unsigned char *p = (const unsigned char *)arrs[k];
            for (int i = 0; i < lens[k]; i++) {
                sum += arrs[k][i];
                sumsq += (double)arrs[k][i] * arrs[k][i];
            }
            for (size_t i = 0; i < sizeof(float) * (size_t)lens[k]; i++)
                hash = (hash ^ p[i]) * 0x100000001b3ULL;
        }
    }
    double mine[4] = {sum, sumsq, (double)(hash >> 32),
                      (double)(hash & 0xffffffffu)};
    double lo[4], hi[4];
    kolo_handle_t h1_, h2_;
    check(kolo_allreduce_async("checksum/min", mine, lo, 4, KOLO_FLOAT64,
                               KOLO_OP_MIN, &h1_),
          "allreduce(checksum/min)");
    check(kolo_allreduce_async("checksum/max", mine, hi, 4, KOLO_FLOAT64,
                               KOLO_OP_MAX, &h2_),
          "allreduce(checksum/max)");
    check(kolo_wait(h1_), "kolo_wait(checksum/min)");
    check(kolo_wait(h2_), "kolo_wait(checksum/max)");

    if (memcmp(lo, hi, sizeof lo) != 0 || memcmp(lo, mine, sizeof lo) != 0) {
        fprintf(stderr,
                "rank %d: ERROR: weights differ across %d ranks: sum "
                "min %.17g max %.17g, sum of squares min %.17g max %.17g "
                "(this rank: %.17g, %.17g)\n",
                rank, size, lo[0], hi[0], lo[1], hi[1], sum, sumsq);
        return 0;
    }
    printf("rank %d: weights identical across %d ranks (checksum sum %.17g, "
           "sum of squares %.17g, hash %016llx)\n",
           rank, size, sum, sumsq, (unsigned long long)hash);
    return 1;
}

/* ---- command line -------------------------------------------------------- */

typedef struct {
    int steps, batch, backward_passes, fp16, print_every;
    double lr, momentum, min_accuracy;
    uint64_t seed;
} options_t;

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
        "usage: %s [options]   (under kolorun: kolorun -np N %s [options])\n"
        "Trains a 2-64-32-3 MLP on a synthetic spiral data set, data-parallel\n"
        "over the ranks of the job, with gradients allreduced by kolo.\n"
        "  --steps N             training steps (default 300)\n"
        "  --batch N             samples per rank per micro-batch (default 32)\n"
        "  --lr F                learning rate (default 0.1)\n"
        "  --momentum F          SGD momentum (default 0.9)\n"
        "  --backward-passes N   micro-batches per step, accumulated by kolo\n"
        "                        (backward_passes = N, average_passes = 1)\n"
        "  --fp16                allreduce the gradients as float16\n"
        "  --seed N              seed of the data set and the weights (1)\n"
        "  --print-every N       report every N steps (default 50; 0: never)\n"
        "  --min-accuracy F      fail if the final test accuracy is lower\n"
        "                        (default 0.9)\n"
        "  --help                this text\n",
        prog, prog);
}

static void parse_args(int argc, char **argv, options_t *o)
{
    *o = (options_t){.steps = 300, .batch = 32, .backward_passes = 1,
                     .print_every = 50, .lr = 0.1, .momentum = 0.9,
                     .min_accuracy = 0.9, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, argv[0]);
            exit(0);
        }
        if (!strcmp(a, "--fp16")) {
            o->fp16 = 1;
            continue;
        }
        /* Every other flag takes a value: "--flag V" or "--flag=V". */
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        char *end = NULL;
        double d = val ? strtod(val, &end) : 0;
        int ok = val && *val && end && *end == '\0';
        int is_int = ok && d == floor(d) && d >= 0 && d <= 1e9;
#define FLAG(s) (len == strlen(s) && !strncmp(a, s, len))
        if (FLAG("--steps") && is_int && d >= 1)
            o->steps = (int)d;
        else if (FLAG("--batch") && is_int && d >= 1 && d <= N_SAMPLES)
            o->batch = (int)d;
        else if (FLAG("--backward-passes") && is_int && d >= 1)
            o->backward_passes = (int)d;
        else if (FLAG("--print-every") && is_int)
            o->print_every = (int)d;
        else if (FLAG("--seed") && is_int)
            o->seed = (uint64_t)d;
        else if (FLAG("--lr") && ok && d > 0)
            o->lr = d;
        else if (FLAG("--momentum") && ok && d >= 0 && d < 1)
            o->momentum = d;
        else if (FLAG("--min-accuracy") && ok && d >= 0 && d <= 1)
            o->min_accuracy = d;
        else {
            fprintf(stderr, "%s: bad option or value: %s%s%s\n", argv[0], a,
                    val && !eq ? " " : "", val && !eq ? val : "");
            usage(stderr, argv[0]);
            exit(2);
        }
#undef FLAG
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the training loop --------------------------------------------------- */

/* This rank's shard of the training set, samples rank, rank + size, ...,
 * drawn in a new random order each time it has all been used. */
typedef struct {
    int *idx, n, cursor;
    rng_t rng;
} shard_t;

static void shard_init(shard_t *sh, const options_t *opt)
{
    int n_train = N_SAMPLES - N_TEST;
    sh->idx = xcalloc((size_t)n_train, sizeof(int));
    sh->n = 0;
    for (int i = rank; i < n_train; i += size)
        sh->idx[sh->n++] = i;
    if (sh->n < opt->batch) {
        fprintf(stderr, "rank %d: --batch %d is larger than this rank's shard "
                        "(%d samples)\n", rank, opt->batch, sh->n);
        die();
    }
    sh->rng = (rng_t){opt->seed * 1000003ULL + (uint64_t)rank};
    sh->cursor = sh->n; /* reshuffle on first use */
}

/* The next n samples of the shard into idx[0..n-1]. */
static void shard_next(shard_t *sh, int *idx, int n)
{
    for (int s = 0; s < n; s++) {
        if (sh->cursor == sh->n) {
            shuffle(sh->idx, sh->n, &sh->rng);
            sh->cursor = 0;
        }
        idx[s] = sh->idx[sh->cursor++];
    }
}

/* One step: --backward-passes micro-batches, each forward and backward
 * (which enqueues its gradients), then the SGD update with the averaged
 * gradients. Returns the step's loss, the mean of its passes'. */
static double train_step(const options_t *opt, reducer_t *rd, shard_t *sh,
                         int *batch_idx)
{
    double loss = 0;
    for (int pass = 1; pass <= opt->backward_passes; pass++) {
        shard_next(sh, batch_idx, opt->batch);
        forward(batch_idx, opt->batch);
        loss += backward(rd, batch_idx, opt->batch);
        /* Passes before the last complete at once; waiting releases the
         * handles and lets us reuse the gradient buffers. */
        wait_grads(rd, pass == opt->backward_passes);
    }
    sgd_update((float)opt->lr, (float)opt->momentum);
    return loss / opt->backward_passes;
}

/* The figures rank 0 reports: the loss and step time summed since the last
 * report, and the last global loss and test accuracy. */
typedef struct {
    double loss_since, time_since;
    int steps_since;
    double loss, accuracy;
} progress_t;

/* Every --print-every steps rank 0 prints the global figures; after the
 * last step they are taken too, for the final line. Every rank takes part:
 * they are allreduced. */
static void report_progress(const options_t *opt, progress_t *p, int step)
{
    int report = opt->print_every > 0 && step % opt->print_every == 0;
    if (!report && step != opt->steps)
        return;
    global_metrics(p->loss_since / p->steps_since, &p->loss, &p->accuracy);
    if (rank == 0 && report)
        printf("step %5d  loss %.4f  test accuracy %.4f  "
               "step time %.3f ms\n", step, p->loss, p->accuracy,
               1e3 * p->time_since / p->steps_since);
    fflush(stdout);
    p->loss_since = p->time_since = 0;
    p->steps_since = 0;
}

/* kolo_init, and this rank's place in the job. */
static void join_job(void)
{
    /* Until kolo_init succeeds kolo_rank() knows nothing: a message about
     * a failed init names the rank the launcher gave (kolorun's KOLO_RANK,
     * or horovodrun's twin). */
    if (getenv("KOLO_RANK") != NULL || getenv("HOROVOD_RANK") != NULL)
        rank = atoi(getenv("KOLO_RANK") ? getenv("KOLO_RANK") : getenv("HOROVOD_RANK"));
    check(kolo_init(), "kolo_init");
    rank = kolo_rank();
    size = kolo_size();
}

static void print_setup(const options_t *opt)
{
    if (rank == 0)
        printf("train_mlp: %d rank%s, MLP %d-%d-%d-%d, %d train / %d test "
               "samples, batch %d per rank x %d pass%s, lr %g, momentum %g, "
               "gradients in %s\n",
               size, size == 1 ? "" : "s", N_IN, N_H1, N_H2, N_CLASSES,
               N_SAMPLES - N_TEST, N_TEST, opt->batch, opt->backward_passes,
               opt->backward_passes == 1 ? "" : "es", opt->lr, opt->momentum,
               opt->fp16 ? "float16" : "float32");
}

/* The verdict: every rank holds the same weights, and the model learned.
 * Rank 0 prints the final figures. */
static int finish(const options_t *opt, const progress_t *p, double total)
{
    int ok = check_weights_identical();
    int learned = p->accuracy >= opt->min_accuracy; /* false for NaN too */
    if (rank == 0) {
        printf("final: loss %.4f  test accuracy %.4f  %d steps in %.2f s "
               "(%.3f ms/step incl. evaluation)\n",
               p->loss, p->accuracy, opt->steps, total,
               1e3 * total / opt->steps);
        if (!learned)
            fprintf(stderr, "rank 0: ERROR: final test accuracy %.4f is below "
                            "%.2f: the model did not learn\n",
                    p->accuracy, opt->min_accuracy);
    }
    fflush(stdout);
    return ok && learned;
}

/* ---- main ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
    options_t opt;
    parse_args(argc, argv, &opt);
    if (opt.fp16)
        check_half_conversions();
    join_job();

    /* Every rank builds the same data set and the same initial weights. */
    make_spirals(opt.seed);
    init_model(opt.seed);
    alloc_activations(opt.batch);
    shard_t shard;
    shard_init(&shard, &opt);
    print_setup(&opt);

    reducer_t rd = {.fp16 = opt.fp16, .backward_passes = opt.backward_passes};
    int *batch_idx = xcalloc((size_t)opt.batch, sizeof(int));
    progress_t progress = {.loss = NAN, .accuracy = NAN};
    double t_start = now_s();
    for (int step = 1; step <= opt.steps; step++) {
        double t0 = now_s();
        double loss = train_step(&opt, &rd, &shard, batch_idx);
        progress.time_since += now_s() - t0;
        progress.loss_since += loss;
        progress.steps_since++;
        report_progress(&opt, &progress, step);
    }
    int ok = finish(&opt, &progress, now_s() - t_start);

    check(kolo_shutdown(), "kolo_shutdown");
    free(shard.idx);
    free(batch_idx);
    return ok ? 0 : 1;
}
