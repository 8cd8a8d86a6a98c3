/*
 * fuzz-message.c — a libFuzzer target for the negotiation message decoder,
 * the one place where kolo parses bytes that another process sent.
 *
 * Every input is decoded; a message that decodes must encode back to the
 * same bytes (the format has exactly one encoding per message, so anything
 * else means a field was misread). Built with clang -fsanitize=fuzzer,
 * address,undefined by `make fuzz`, which runs it for a bounded time over
 * the corpus in tests/fuzz/corpus/message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kolo__msg_t msg;
    kolo__err_t err;
    kolo__bytes_t again = {0};

    if (kolo__msg_decode(data, size, 1, &msg, &err) != KOLO_OK)
        return 0;
    if (kolo__msg_encode(&msg, &again, &err) != KOLO_OK)
        abort();
    if (again.len != size || memcmp(again.data, data, size) != 0)
        abort(); /* a decoded message must re-encode to its own bytes */
    kolo__bytes_free(&again);
    kolo__msg_free(&msg);
    return 0;
}
