/*
 * ring.h — kolo's own ring allreduce over TCP, beside Gloo's pairs.
 *
 * Gloo's ring moves a large allreduce at about half of what a TCP link
 * between two hosts carries (its loop thread receives, the calling thread
 * reduces, and every segment waits for a hand-over between them). The
 * Gloo backend (gloo_ops.cc) therefore gives allreduces past its one-step
 * exchange to this ring: every rank holds two sockets of its own, one to
 * its right neighbour and one from its left, and one thread streams the
 * whole reduce-scatter and allgather through them, sending each reduced
 * piece on as soon as it is reduced (ring.c explains the schedule).
 *
 * Setting up, in this order on every rank:
 *   kolo__ring_listen    binds a socket on the rank's address, any port,
 *                        and says the address to publish;
 *   (the caller publishes it, e.g. in the rendezvous store, and reads its
 *    right neighbour's)
 *   kolo__ring_connect   connects to the right neighbour and accepts the
 *                        left one, each side of each connection proving
 *                        the context's key (auth.h's handshake), dropping
 *                        with a warning every connection that does not
 *                        prove it; then closes the listening socket.
 *
 * Every call returns KOLO_OK or a KOLO_ERR_* code with one sentence in err
 * (ops.h's contract); waits block in poll(2), bounded by the timeout given.
 */
#ifndef KOLO_OPS_GLOO_RING_H
#define KOLO_OPS_GLOO_RING_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KOLO__RING_ADDR_LEN 96 /* "ADDRESS PORT", NUL-terminated */

typedef struct kolo__ring kolo__ring_t;

/* Binds a listening socket on `hostname` (an address or a name; empty:
 * this host's name), any port; writes "ADDRESS PORT" to addr. */
int kolo__ring_listen(const char *hostname, kolo__ring_t **ring,
                      char addr[KOLO__RING_ADDR_LEN], char *err, size_t errlen);

/* While kolo__ring_connect waits for its left neighbour, it asks
 * gave_up(arg, why, len) a few times a second (ops.h: abandoned); non-zero
 * ends the wait at once with KOLO_ERR_BACKEND and `why`. */
void kolo__ring_set_gave_up(kolo__ring_t *ring,
                            int (*gave_up)(void *arg, char *why, size_t len),
                            void *arg);

/* Makes the ring of `size` ranks: connects to rank (rank + 1) % size at
 * right_addr and accepts rank (rank - 1) % size, both within timeout_s.
 * send_buffer (0: the kernel's autotuning) is each socket's SO_SNDBUF,
 * which bounds the bytes in flight to a neighbour (ring.c says why).
 * key is the context's key (auth.h): both neighbours prove they hold it.
 * warn (may be NULL) reports each stranger's connection dropped. */
int kolo__ring_connect(kolo__ring_t *ring, int rank, int size,
                       const char *right_addr,
                       const uint8_t key[KOLO__KEY_BYTES],
                       double timeout_s, size_t send_buffer,
                       kolo__ops_warn_fn warn, char *err, size_t errlen);

/* Allreduce of count elements of elem_size bytes: in (NULL: out) into out,
 * reduced with `reduce` in the same order on every rank, so that every
 * rank gets the same bits. timeout_s bounds each wait for a peer. After a
 * failure the ring is broken and every later call fails at once. */
int kolo__ring_allreduce(kolo__ring_t *ring, const void *in, void *out,
                         size_t count, size_t elem_size,
                         kolo__ops_reduce_fn reduce, double timeout_s,
                         char *err, size_t errlen);

/* The same, streamed (ops.h: kolo__ops_stream_t): this rank's input is
 * read where it lies (view) or packed piece by piece (fill) as the ring
 * sends it, and each reduced piece goes out (finish, then drain) as soon
 * as this rank has it; the segments meet in a work buffer of the ring's
 * own. fill, view and drain may be called at any element, in any order,
 * each element once: view's and fill's where this rank's input is
 * needed, drain's where a result is complete. */
int kolo__ring_allreduce_stream(kolo__ring_t *ring, size_t count,
                                size_t elem_size, kolo__ops_reduce_fn reduce,
                                const kolo__ops_stream_t *s, double timeout_s,
                                char *err, size_t errlen);

/* An allgather around the ring in size - 1 steps: `bytes` at mine go to
 * every other rank, and rank r's arrive at slots + r * bytes (this rank's
 * slot is left as it is). Each step is one message per link, sent and
 * received by this thread, with no hand-over from Gloo's loop thread: for
 * a few ranks, the Gloo backend's exchange of small buffers takes it in
 * place of Gloo's pairs (with two ranks, one step: each rank's bytes to
 * the other). */
int kolo__ring_allgather(kolo__ring_t *ring, const void *mine, uint8_t *slots,
                         size_t bytes, double timeout_s, char *err,
                         size_t errlen);

/* The context rank this ring is waiting for right now, or -1 (read by the
 * stall watchdog from another thread). */
int kolo__ring_waiting_for(const kolo__ring_t *ring);

void kolo__ring_close(kolo__ring_t *ring);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_OPS_GLOO_RING_H */
