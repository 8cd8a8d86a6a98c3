/*
 * agree.h — what every rank of the job must agree on before a backend
 * connects: the settings at kolo_init, the members of a new process set
 * (design in agree.c).
 */
#ifndef KOLO_AGREE_H
#define KOLO_AGREE_H

#include "env.h"

/* Decides on the texts of all n ranks (texts[r] is rank r's): KOLO_OK, or
 * an error whose message every rank will return. */
typedef int (*kolo__agree_judge_fn)(char *const *texts, int n, void *arg,
                                    kolo__err_t *err);

/* Every rank of the job calls it with the same topic (unique within the
 * job's kolo_init generation `gen`) and its own text (at most
 * KOLO__AGREE_MAX - 1 bytes). Returns the same verdict on every rank: the
 * judge's, or KOLO_ERR_TIMEOUT naming the ranks that never arrived within
 * KOLO_START_TIMEOUT. */
#define KOLO__AGREE_MAX 4096
int kolo__agree(const kolo__config_t *cfg, unsigned gen, const char *topic,
                const char *mine, kolo__agree_judge_fn judge, void *arg,
                kolo__err_t *err);

/* A rank that fails before (or instead of) calling kolo__agree on `topic`
 * publishes why, so that the others stop at once with its reason ("rank
 * 1: out of memory ...") instead of waiting out KOLO_START_TIMEOUT for its
 * text. Best effort (nothing when the store cannot be reached, or under
 * MPI, where the launcher ends the job). */
void kolo__agree_failed(const kolo__config_t *cfg, unsigned gen,
                        const char *topic, const kolo__err_t *why);
/* Keeps one descriptor (of /dev/null) that kolo__agree_failed and a failed
 * kolo__outcome_agree give back before they write; kolo_init and
 * kolo_add_process_set take it while they run, and give it back
 * (kolo__agree_release) before they return. */
void kolo__agree_reserve(void);
void kolo__agree_release(void);

/* The judge of kolo_init: texts are kolo__config_agreed() lines; the first
 * setting that differs fails with KOLO_ERR_CONFIG, naming the variable and
 * which ranks have which value. */
int kolo__agree_settings(char *const *texts, int n, void *arg, kolo__err_t *err);

/* The outcome of connecting a process set, agreed by every rank of the
 * job (members connect; the others have nothing to connect), so that a
 * set that fails on one member fails on all ranks, and at once: while a
 * member waits for its peers inside a backend's init, kolo__outcome_
 * abandoned (the ops config's `abandoned` callback) tells it that another
 * member has already failed. */
typedef struct kolo__outcome {
    const kolo__config_t *cfg;
    unsigned gen;
    char topic[64];
    const int *members; /* [n] global ranks of the set */
    int n;
    struct kolo__store *store; /* opened by the first look */
    int agreed;                /* kolo__outcome_agree was called */
} kolo__outcome_t;

/* topic: unique within the generation, the same on every rank. */
void kolo__outcome_init(kolo__outcome_t *o, const kolo__config_t *cfg,
                        unsigned gen, const char *topic, const int *members,
                        int n);
int kolo__outcome_abandoned(void *arg, char *why, size_t len);
/* Publishes this rank's result (rc, and *mine when it failed) and returns
 * the job's: KOLO_OK when every member connected, else the first real
 * failure (a member's own, before those that only gave up because of it)
 * in *err. Closes what kolo__outcome_abandoned opened. */
int kolo__outcome_agree(kolo__outcome_t *o, int rc, const kolo__err_t *mine,
                        kolo__err_t *err);

#endif /* KOLO_AGREE_H */
