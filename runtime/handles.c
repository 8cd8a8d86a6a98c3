/*
 * handles.c — the handle table (design in handles.h).
 */
#include "alloc.h"
#include "handles.h"

#include <stdlib.h>
#include <string.h>

typedef struct handle_rec {
    int status;
    char *msg; /* owned; NULL on success or while running */
    kolo__handoff_t ho; /* owned until handed over */
} handle_rec_t;

static void handoff_free(kolo__handoff_t *ho)
{
    if (ho->output != NULL)
        ho->output_free(ho->output);
    if (ho->done != NULL)
        ho->done_free(ho->done);
    memset(ho, 0, sizeof(*ho));
}

static void rec_free(handle_rec_t *r)
{
    handoff_free(&r->ho);
    free(r->msg);
    free(r);
}

int kolo__handles_init(kolo__handles_t *h)
{
    memset(h, 0, sizeof(*h));
    kolo__map_init(&h->map);
    h->next_id = 1;
    if (pthread_mutex_init(&h->mu, NULL) != 0)
        return -1;
    if (pthread_cond_init(&h->cv, NULL) != 0) {
        pthread_mutex_destroy(&h->mu);
        return -1;
    }
    return 0;
}

void kolo__handles_destroy(kolo__handles_t *h)
{
    size_t it = 0;
    void *v;
    while (kolo__map_next(&h->map, &it, NULL, &v))
        rec_free(v);
    kolo__map_free(&h->map);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

int kolo__handles_new(kolo__handles_t *h, kolo_handle_t *id, kolo__err_t *err)
{
    handle_rec_t *r = kolo__calloc(1, sizeof(*r));
    kolo_handle_t new_id;

    if (r == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory creating a handle");
    r->status = KOLO_IN_PROGRESS;
    pthread_mutex_lock(&h->mu);
    new_id = h->next_id;
    if (kolo__map_put(&h->map, &new_id, sizeof(new_id), r) != 0) {
        pthread_mutex_unlock(&h->mu);
        free(r);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory creating a handle");
    }
    h->next_id++;
    pthread_mutex_unlock(&h->mu);
    *id = new_id;
    return KOLO_OK;
}

void kolo__handles_complete(kolo__handles_t *h, kolo_handle_t id, int status,
                            const char *msg)
{
    kolo__handles_complete_output(h, id, status, msg, NULL, NULL);
}

void kolo__handles_complete_output(kolo__handles_t *h, kolo_handle_t id,
                                   int status, const char *msg, void *output,
                                   void (*free_fn)(void *))
{
    kolo__handoff_t ho = {.output = output, .output_free = free_fn};
    kolo__handles_complete_handoff(h, id, status, msg, &ho);
}

void kolo__handles_complete_handoff(kolo__handles_t *h, kolo_handle_t id,
                                    int status, const char *msg,
                                    const kolo__handoff_t *ho)
{
    handle_rec_t *r;
    kolo__handoff_t left = *ho;
    /* Copy the message before taking the lock: waiters should not wait on
     * malloc. */
    char *copy = (status != KOLO_OK && msg != NULL) ? kolo__strdup(msg) : NULL;

    pthread_mutex_lock(&h->mu);
    r = kolo__map_get(&h->map, &id, sizeof(id));
    if (r != NULL && r->status == KOLO_IN_PROGRESS) {
        r->status = status;
        r->msg = copy;
        copy = NULL;
        if (status == KOLO_OK) {
            r->ho = left;
            memset(&left, 0, sizeof(left));
        }
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    free(copy);
    handoff_free(&left);
}

static int invalid(kolo__handles_t *h, kolo_handle_t id, kolo__err_t *err)
{
    if (id <= 0 || id >= h->next_id)
        return kolo__err_set(err, KOLO_ERR_INVALID_HANDLE,
                             "handle %lld was never issued",
                             (long long)id);
    return kolo__err_set(err, KOLO_ERR_INVALID_HANDLE,
                         "handle %lld was already released by kolo_wait",
                         (long long)id);
}

int kolo__handles_poll(kolo__handles_t *h, kolo_handle_t id, kolo__err_t *err)
{
    handle_rec_t *r;
    int status;

    pthread_mutex_lock(&h->mu);
    r = kolo__map_get(&h->map, &id, sizeof(id));
    if (r == NULL)
        status = invalid(h, id, err);
    else if ((status = r->status) < 0)
        kolo__err_set(err, status, "%s", r->msg ? r->msg : kolo_strerror(status));
    pthread_mutex_unlock(&h->mu);
    return status;
}

int kolo__handles_wait(kolo__handles_t *h, kolo_handle_t id, kolo__err_t *err)
{
    return kolo__handles_wait_output(h, id, err, NULL);
}

int kolo__handles_wait_output(kolo__handles_t *h, kolo_handle_t id,
                              kolo__err_t *err, void **output)
{
    kolo__handoff_t ho;
    int status = kolo__handles_wait_handoff(h, id, err, &ho);

    if (output != NULL) {
        *output = ho.output;
        ho.output = NULL;
    }
    handoff_free(&ho);
    return status;
}

int kolo__handles_wait_handoff(kolo__handles_t *h, kolo_handle_t id,
                               kolo__err_t *err, kolo__handoff_t *ho)
{
    handle_rec_t *r;
    int status;

    memset(ho, 0, sizeof(*ho));

    pthread_mutex_lock(&h->mu);
    r = kolo__map_get(&h->map, &id, sizeof(id));
    if (r == NULL) {
        status = invalid(h, id, err);
        pthread_mutex_unlock(&h->mu);
        return status;
    }
    while (r->status == KOLO_IN_PROGRESS) {
        pthread_cond_wait(&h->cv, &h->mu);
        /* Another thread waiting on the same handle may have released it
         * meanwhile: look it up again rather than trust the pointer. */
        r = kolo__map_get(&h->map, &id, sizeof(id));
        if (r == NULL) {
            status = invalid(h, id, err);
            pthread_mutex_unlock(&h->mu);
            return status;
        }
    }
    status = r->status;
    if (status < 0)
        kolo__err_set(err, status, "%s", r->msg ? r->msg : kolo_strerror(status));
    kolo__map_del(&h->map, &id, sizeof(id));
    pthread_mutex_unlock(&h->mu);
    *ho = r->ho;
    memset(&r->ho, 0, sizeof(r->ho));
    rec_free(r);
    return status;
}

const char *kolo__handles_error(kolo__handles_t *h, kolo_handle_t id)
{
    handle_rec_t *r;
    const char *msg = NULL;

    pthread_mutex_lock(&h->mu);
    r = kolo__map_get(&h->map, &id, sizeof(id));
    if (r != NULL && r->status < 0)
        msg = r->msg ? r->msg : kolo_strerror(r->status);
    pthread_mutex_unlock(&h->mu);
    return msg;
}

size_t kolo__handles_count(kolo__handles_t *h)
{
    size_t n;
    pthread_mutex_lock(&h->mu);
    n = h->map.count;
    pthread_mutex_unlock(&h->mu);
    return n;
}
