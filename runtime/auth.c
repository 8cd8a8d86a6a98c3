/*
 * auth.c — the job's secret, and the handshake with which every
 * connection a job accepts proves it (auth.h).
 *
 * The secret. kolorun draws one per job (32 random bytes, 64 hex digits)
 * and hands it to its ranks in their environment as KOLO_SECRET; under
 * another launcher the user sets KOLO_SECRET (or Horovod's
 * HOROVOD_SECRET_KEY) for every rank. It is read once per kolo_init and
 * kept only as its SHA-256 (with a label, so that the same string used
 * elsewhere gives another key); it never goes into the rendezvous store,
 * a log or a message. Each context (one kolo_init's process set and role,
 * named by its store prefix) derives its own key from it, so that a rank
 * of an earlier generation of an elastic job, which holds the same
 * secret, is still a stranger to the next one's sockets.
 *
 * The handshake, for a connection from rank C (connecting) to rank L
 * (listening), in one and a half round trips:
 *   C -> L  hello: magic, C, L, nonce_c
 *   L -> C  nonce_l, HMAC(key, "L" magic C L nonce_c nonce_l)
 *   C -> L  HMAC(key, "C" magic C L nonce_c nonce_l)
 * Each side checks the other's proof before it sends a byte of the job's
 * data, and draws its nonce fresh for the connection: a hello or proof
 * seen on the wire proves nothing in another connection (the other side's
 * nonce differs), a proof sent back to its author is refused (the role),
 * and no two connections' bytes repeat. The listening side answers only a
 * hello that names this connection's magic and ranks, and only with a
 * nonce and a MAC: a stranger learns nothing it can use.
 */
#include "config.h"

#include "auth.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

/* Shorter strings are refused: not a secret anyone should rely on. */
#define MIN_SECRET_CHARS 16

static int sodium_ready(void)
{
    /* Thread-safe, and cheap after the first call. */
    return sodium_init() >= 0;
}

int kolo__auth_job_key(const char *(*getenv_fn)(const char *name),
                       uint8_t key[KOLO__KEY_BYTES], int *have,
                       kolo__err_t *err)
{
    static const char label[] = "kolo job secret v1";
    const char *name = "KOLO_SECRET", *secret = getenv_fn(name);
    const char *require = getenv_fn("KOLO_REQUIRE_SECRET");
    crypto_hash_sha256_state st;

    *have = 0;
    if (require != NULL && require[0] != '\0' && strcmp(require, "0") != 0 &&
        strcmp(require, "1") != 0)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_REQUIRE_SECRET='%s' is not 0 or 1", require);
    /* Horovod's launchers put their key in _HOROVOD_SECRET_KEY (the
     * constant horovod.runner.common.util.secret.HOROVOD_SECRET_KEY names
     * it); HOROVOD_SECRET_KEY is read too. */
    if (secret == NULL || secret[0] == '\0') {
        name = "_HOROVOD_SECRET_KEY";
        secret = getenv_fn(name);
    }
    if (secret == NULL || secret[0] == '\0') {
        name = "HOROVOD_SECRET_KEY";
        secret = getenv_fn(name);
    }
    if (secret == NULL || secret[0] == '\0') {
        if (require != NULL && strcmp(require, "1") == 0)
            return kolo__err_set(
                err, KOLO_ERR_CONFIG,
                "KOLO_REQUIRE_SECRET=1, and no job secret is set: kolorun "
                "gives every rank one; under mpirun, srun or torchrun set "
                "KOLO_SECRET to the same string of at least %d characters "
                "on every rank (for example from `openssl rand -hex 32`)",
                MIN_SECRET_CHARS);
        return KOLO_OK;
    }
    if (strlen(secret) < MIN_SECRET_CHARS)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "%s has %zu characters; a job secret needs at "
                             "least %d (for example `openssl rand -hex 32`)",
                             name, strlen(secret), MIN_SECRET_CHARS);
    if (!sodium_ready())
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "libsodium cannot start (sodium_init failed)");
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const unsigned char *)label, sizeof(label));
    crypto_hash_sha256_update(&st, (const unsigned char *)secret,
                              strlen(secret));
    crypto_hash_sha256_final(&st, key);
    sodium_memzero(&st, sizeof(st));
    *have = 1;
    return KOLO_OK;
}

void kolo__auth_derive(uint8_t out[KOLO__KEY_BYTES],
                       const uint8_t key[KOLO__KEY_BYTES], const char *label,
                       const void *data, size_t len)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, KOLO__KEY_BYTES);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label,
                                  strlen(label) + 1);
    crypto_auth_hmacsha256_update(&st, data, len);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

void kolo__auth_redis_password(const uint8_t key[KOLO__KEY_BYTES],
                               char out[2 * KOLO__KEY_BYTES + 1])
{
    uint8_t pw[KOLO__KEY_BYTES];
    kolo__auth_derive(pw, key, "kolo redis password", "", 0);
    sodium_bin2hex(out, 2 * KOLO__KEY_BYTES + 1, pw, sizeof(pw));
    sodium_memzero(pw, sizeof(pw));
}

void kolo__auth_entry_mac(const uint8_t key[KOLO__KEY_BYTES], const char *job,
                          size_t joblen, const char *name, const void *value,
                          size_t len, char out[KOLO__ENTRY_MAC_CHARS + 1])
{
    uint8_t k[KOLO__KEY_BYTES], mac[KOLO__MAC_BYTES];
    crypto_auth_hmacsha256_state st;

    kolo__auth_derive(k, key, "kolo store entry", job, joblen);
    crypto_auth_hmacsha256_init(&st, k, sizeof(k));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)name,
                                  strlen(name) + 1);
    crypto_auth_hmacsha256_update(&st, value, len);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_bin2hex(out, KOLO__ENTRY_MAC_CHARS + 1, mac, sizeof(mac));
    sodium_memzero(&st, sizeof(st));
    sodium_memzero(k, sizeof(k));
}

int kolo__auth_random(void *out, size_t n)
{
    if (!sodium_ready()) {
        errno = EIO;
        return -1;
    }
    randombytes_buf(out, n);
    return 0;
}

int kolo__auth_equal(const void *a, const void *b, size_t n)
{
    return sodium_memcmp(a, b, n) == 0;
}

void kolo__handshake_init(kolo__handshake_t *h, const char magic[8],
                          uint32_t from, uint32_t to,
                          const uint8_t key[KOLO__KEY_BYTES])
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, magic, sizeof(h->magic));
    h->from = from;
    h->to = to;
    memcpy(h->key, key, KOLO__KEY_BYTES);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* The proof of `role` ('L' or 'C') in this connection. */
static void proof_of(const kolo__handshake_t *h, char role,
                     uint8_t out[KOLO__MAC_BYTES])
{
    uint8_t head[1 + 8 + 4 + 4];
    crypto_auth_hmacsha256_state st;

    head[0] = (uint8_t)role;
    memcpy(head + 1, h->magic, 8);
    put_u32(head + 9, h->from);
    put_u32(head + 13, h->to);
    crypto_auth_hmacsha256_init(&st, h->key, KOLO__KEY_BYTES);
    crypto_auth_hmacsha256_update(&st, head, sizeof(head));
    crypto_auth_hmacsha256_update(&st, h->nonce_c, KOLO__NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, h->nonce_l, KOLO__NONCE_BYTES);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

int kolo__handshake_hello(kolo__handshake_t *h, uint8_t out[KOLO__HELLO_BYTES])
{
    if (kolo__auth_random(h->nonce_c, KOLO__NONCE_BYTES) != 0)
        return -1;
    memcpy(out, h->magic, 8);
    put_u32(out + 8, h->from);
    put_u32(out + 12, h->to);
    memcpy(out + 16, h->nonce_c, KOLO__NONCE_BYTES);
    return 0;
}

int kolo__handshake_reply(kolo__handshake_t *h,
                          const uint8_t hello[KOLO__HELLO_BYTES],
                          uint8_t out[KOLO__REPLY_BYTES])
{
    uint8_t head[16];

    memcpy(head, h->magic, 8);
    put_u32(head + 8, h->from);
    put_u32(head + 12, h->to);
    if (memcmp(head, hello, sizeof(head)) != 0)
        return -1;
    memcpy(h->nonce_c, hello + 16, KOLO__NONCE_BYTES);
    if (kolo__auth_random(h->nonce_l, KOLO__NONCE_BYTES) != 0)
        return -1;
    memcpy(out, h->nonce_l, KOLO__NONCE_BYTES);
    proof_of(h, 'L', out + KOLO__NONCE_BYTES);
    return 0;
}

int kolo__handshake_prove(kolo__handshake_t *h,
                          const uint8_t reply[KOLO__REPLY_BYTES],
                          uint8_t out[KOLO__PROOF_BYTES])
{
    uint8_t want[KOLO__MAC_BYTES];

    memcpy(h->nonce_l, reply, KOLO__NONCE_BYTES);
    proof_of(h, 'L', want);
    if (!kolo__auth_equal(want, reply + KOLO__NONCE_BYTES, KOLO__MAC_BYTES))
        return -1;
    proof_of(h, 'C', out);
    return 0;
}

int kolo__handshake_check(const kolo__handshake_t *h,
                          const uint8_t proof[KOLO__PROOF_BYTES])
{
    uint8_t want[KOLO__MAC_BYTES];

    proof_of(h, 'C', want);
    return kolo__auth_equal(want, proof, KOLO__MAC_BYTES) ? 0 : -1;
}
