/*
 * make-corpus.c — writes valid request and response messages into a
 * directory, the seeds of the fuzzer's corpus (tests/fuzz/corpus/message is
 * made by it and kept in the repository).
 */
#include <stdio.h>
#include <string.h>

#include "message.h"

static void save(const char *dir, const char *name, const kolo__msg_t *m)
{
    kolo__bytes_t b = {0};
    kolo__err_t err;
    char path[4096];
    FILE *f;

    if (kolo__msg_encode(m, &b, &err) != KOLO_OK)
        return;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(b.data, 1, b.len, f);
        fclose(f);
    }
    kolo__bytes_free(&b);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    kolo__request_t reqs[3];
    kolo__response_t resps[3];
    kolo__msg_t m;

    memset(reqs, 0, sizeof(reqs));
    memset(resps, 0, sizeof(resps));
    reqs[0].name = (char *)"grad/fc1/weight";
    kolo__params_init(&reqs[0].params, KOLO__COLL_ALLREDUCE, KOLO_FLOAT32,
                      KOLO_OP_AVERAGE, 4096);
    reqs[1].name = (char *)"embeddings";
    kolo__params_init(&reqs[1].params, KOLO__COLL_ALLGATHER, KOLO_FLOAT16, 0, 64);
    reqs[1].params.ndim = 2;
    reqs[1].params.shape[1] = 64;
    reqs[2].name = (char *)"group/member";
    kolo__params_init(&reqs[2].params, KOLO__COLL_REDUCESCATTER, KOLO_INT32,
                      KOLO_OP_SUM, 12);
    reqs[2].params.group = 3;
    reqs[2].params.prescale = 0.5;
    strcpy(reqs[2].params.group_key, "group/first");

    m = (kolo__msg_t){KOLO__MSG_REQUESTS, 0, 0, {.requests = reqs}};
    save(dir, "requests-empty", &m);
    m.n = 1;
    save(dir, "requests-one", &m);
    m.n = 3;
    m.rank = 2;
    save(dir, "requests-three", &m);

    resps[0].name = (char *)"grad/fc1/weight";
    resps[0].params = reqs[0].params;
    resps[1].name = (char *)"embeddings";
    resps[1].params = reqs[1].params;
    resps[1].status = KOLO_ERR_MISMATCH;
    resps[1].text = (char *)"allgather of tensor 'embeddings': ranks disagree";
    resps[2].name = (char *)"b";
    kolo__params_init(&resps[2].params, KOLO__COLL_BROADCAST, KOLO_UINT8, 0, 1);
    resps[2].params.root = 3;
    m = (kolo__msg_t){KOLO__MSG_RESPONSES, 0, 3, {.responses = resps}};
    save(dir, "responses-three", &m);
    return 0;
}
