/*
 * auth.h — the job's secret and the handshake that proves it, for every
 * connection a job accepts (design in auth.c). The cryptography is
 * libsodium's: HMAC-SHA256, SHA-256 and its random source.
 */
#ifndef KOLO_AUTH_H
#define KOLO_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KOLO__KEY_BYTES 32
#define KOLO__NONCE_BYTES 32
#define KOLO__MAC_BYTES 32

/* What each side of a connection sends, in order: the connecting side's
 * hello (magic, its rank, the rank it connects to, its nonce), the
 * listening side's reply (its nonce, its proof), the connecting side's
 * proof. */
#define KOLO__HELLO_BYTES (8 + 4 + 4 + KOLO__NONCE_BYTES)
#define KOLO__REPLY_BYTES (KOLO__NONCE_BYTES + KOLO__MAC_BYTES)
#define KOLO__PROOF_BYTES KOLO__MAC_BYTES

/* The job's key, from KOLO_SECRET, else Horovod's _HOROVOD_SECRET_KEY or
 * HOROVOD_SECRET_KEY:
 * KOLO_OK with *have = 1 and the key in key (a hash of the secret), or
 * *have = 0 when neither is set, unless KOLO_REQUIRE_SECRET=1 (then
 * KOLO_ERR_CONFIG), or KOLO_ERR_CONFIG for a secret too short to be one.
 * getenv_fn reads the environment (getenv). */
int kolo__auth_job_key(const char *(*getenv_fn)(const char *name),
                       uint8_t key[KOLO__KEY_BYTES], int *have,
                       kolo__err_t *err);

/* out = HMAC-SHA256(key, label || 0 || data): a key for one purpose (a
 * context, Redis's password) from the job's key. */
void kolo__auth_derive(uint8_t out[KOLO__KEY_BYTES],
                       const uint8_t key[KOLO__KEY_BYTES], const char *label,
                       const void *data, size_t len);

/* The password of the Redis server kolorun starts for a job
 * (--start-redis), derived from the job's key: 64 hex digits and a NUL. */
void kolo__auth_redis_password(const uint8_t key[KOLO__KEY_BYTES],
                               char out[2 * KOLO__KEY_BYTES + 1]);

/* The MAC of one rendezvous entry of job `job` (joblen bytes): key and
 * value under a key derived from the job's key and the job's name, as 64
 * hex digits and a NUL. A job with a secret appends it to every value it
 * puts in a Redis rendezvous, and checks it on every value it reads. */
#define KOLO__ENTRY_MAC_CHARS (2 * KOLO__MAC_BYTES)
void kolo__auth_entry_mac(const uint8_t key[KOLO__KEY_BYTES], const char *job,
                          size_t joblen, const char *name, const void *value,
                          size_t len, char out[KOLO__ENTRY_MAC_CHARS + 1]);

/* n bytes from the operating system's random source; 0, or -1 when it
 * cannot give them (errno says why). */
int kolo__auth_random(void *out, size_t n);

/* Whether a and b (n bytes) are equal, in time that does not depend on
 * where they differ. */
int kolo__auth_equal(const void *a, const void *b, size_t n);

/* One connection's handshake, from either side. `magic` names the kind
 * of connection (8 bytes: "KOLOPAIR", "KOLORING"), from the connecting
 * rank, to the listening one, key the context's key. Each side draws its
 * own nonce; each proof is an HMAC over both nonces, the magic, the ranks
 * and the side's role, so that nothing a stranger saw on the wire, or
 * sends back to a side, is worth anything in another connection. */
typedef struct kolo__handshake {
    char magic[8];
    uint32_t from, to;
    uint8_t key[KOLO__KEY_BYTES];
    uint8_t nonce_c[KOLO__NONCE_BYTES], nonce_l[KOLO__NONCE_BYTES];
} kolo__handshake_t;

void kolo__handshake_init(kolo__handshake_t *h, const char magic[8],
                          uint32_t from, uint32_t to,
                          const uint8_t key[KOLO__KEY_BYTES]);

/* The connecting side: its hello (draws its nonce). 0, or -1 when the
 * random source failed. */
int kolo__handshake_hello(kolo__handshake_t *h,
                          uint8_t out[KOLO__HELLO_BYTES]);

/* The listening side, given a hello: 0 and the reply in out when the
 * hello is one for this connection (magic and ranks), -1 otherwise. */
int kolo__handshake_reply(kolo__handshake_t *h,
                          const uint8_t hello[KOLO__HELLO_BYTES],
                          uint8_t out[KOLO__REPLY_BYTES]);

/* The connecting side, given the reply: 0 and its proof in out when the
 * listening side proved it holds the key, -1 otherwise. */
int kolo__handshake_prove(kolo__handshake_t *h,
                          const uint8_t reply[KOLO__REPLY_BYTES],
                          uint8_t out[KOLO__PROOF_BYTES]);

/* The listening side, given the proof: 0 when it is right, -1 otherwise. */
int kolo__handshake_check(const kolo__handshake_t *h,
                          const uint8_t proof[KOLO__PROOF_BYTES]);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_AUTH_H */
