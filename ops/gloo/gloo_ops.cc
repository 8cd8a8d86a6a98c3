/*
 * gloo_ops.cc — the Gloo backend: kolo's ops table over Gloo's TCP
 * transport.
 *
 * This is the only C++ file of kolo. Gloo reports failures with exceptions;
 * every entry point below runs its body inside guarded(), which catches
 * everything and turns it into a kolo status and a sentence, so no
 * exception ever crosses into the C runtime.
 *
 * Rendezvous: ranks meet through a directory (KOLO_RENDEZVOUS=file:DIR) that
 * kolorun creates, where Gloo's FileStore keeps one file per key, or, for
 * jobs over several hosts, through a Redis server
 * (KOLO_RENDEZVOUS=redis:HOST:PORT/JOB) with Gloo's RedisStore, every key
 * under JOB/ so that jobs sharing a server never meet. Keys are
 * prefixed with what the runtime passes (it counts kolo_init calls and
 * names the process set), so a program that shuts down and initialises
 * again, or adds a process set, meets its peers under fresh keys. Waiting for keys is bounded by the start timeout,
 * and a timeout names the ranks that never arrived.
 *
 * Wake tokens (ops.h) travel on their own slot. A listener thread keeps a
 * receive from any peer posted and hands each token to the runtime; it
 * blocks in Gloo's waitRecv (a condition variable), so it costs nothing
 * while no token comes. A failed receive means a peer's connection is gone:
 * the listener reports it as a token for round UINT64_MAX, so the runtime
 * runs a round at once and the backend names the failure.
 *
 * Only Gloo's newer API (gloo::allreduce, gloo::gather, ...) is used: the
 * older algorithm classes set socket buffer sizes from their first message
 * and mixing the two APIs was measured to slow 64 KiB allreduces 100-fold
 * (shared/MEASUREMENTS.md). The transport runs in its default asynchronous
 * mode: waiting threads block on condition variables, never spin.
 */
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <algorithm>

#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
/* Debian's hiredis headers live in <hiredis/>: tell redis_store.h. */
#define HIREDIS_NESTED_INCLUDE 1
#include <gloo/rendezvous/redis_store.h>
#include <gloo/transport/tcp/device.h>

#include "ops.h"

namespace {

/* A slot no collective uses: collectives build theirs from small tags. */
constexpr uint64_t kWakeSlot = 0x4b4f4c4f57414b45ULL; /* "KOLOWAKE" */

struct GlooCtx {
    int rank = 0;
    int size = 1;
    uint32_t tag = 0;
    std::shared_ptr<gloo::rendezvous::Context> context;
    std::shared_ptr<gloo::transport::Device> device;

    /* Wake tokens. */
    kolo__ops_wake_fn on_wake = nullptr;
    void *wake_arg = nullptr;
    uint64_t recv_token = 0;
    std::unique_ptr<gloo::transport::UnboundBuffer> recv_buf;
    std::vector<uint64_t> send_token;   /* one per rank */
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> send_buf;
    std::vector<char> send_pending;
    std::thread listener;
    std::atomic<bool> stopping{false};
};

void listen(GlooCtx *g)
{
    std::vector<int> peers;
    for (int r = 0; r < g->size; r++)
        if (r != g->rank)
            peers.push_back(r);
    while (!g->stopping.load()) {
        try {
            g->recv_buf->recv(peers, kWakeSlot);
            /* 30 days: waitRecv needs a finite timeout, and the listener
             * must not wake for nothing. */
            if (!g->recv_buf->waitRecv(nullptr, std::chrono::hours(24 * 30)))
                break; /* aborted by finalize */
            g->on_wake(g->wake_arg, g->recv_token);
        } catch (...) {
            if (!g->stopping.load())
                g->on_wake(g->wake_arg, UINT64_MAX);
            break;
        }
    }
}

/* A store whose waits are bounded by the start timeout and say which ranks
 * are missing. Gloo's full-mesh connection stores one key per rank, named
 * by the rank number. */
class TimedStore : public gloo::rendezvous::Store {
  public:
    TimedStore(gloo::rendezvous::Store &inner, std::chrono::milliseconds timeout)
        : inner_(inner), timeout_(timeout) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        inner_.set(key, data);
    }
    std::vector<char> get(const std::string &key) override
    {
        wait({key});
        return inner_.get(key);
    }
    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, timeout_);
    }
    /* Gloo passes the context's operation timeout here; rendezvous is
     * bounded by the start timeout instead. */
    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &) override
    {
        const std::chrono::milliseconds timeout = timeout_;
        try {
            inner_.wait(keys, timeout);
        } catch (const std::exception &) {
            /* Which ranks are missing is the runtime's to say (it keeps a
             * registry); here only how long was waited. */
            char secs[32];
            std::snprintf(secs, sizeof(secs), "%.1f", timeout.count() / 1000.0);
            throw gloo::IoException(
                std::string("rendezvous timed out after ") + secs +
                " s (is every rank started, and KOLO_START_TIMEOUT long enough?)");
        }
    }

  private:
    gloo::rendezvous::Store &inner_;
    std::chrono::milliseconds timeout_;
};

/* The store of a rendezvous string: file:DIR, or redis:HOST:PORT[/JOB]
 * (HOST may be [IPv6]; env.c has checked the form). Sets `ns` to the
 * namespace the keys go under. */
std::unique_ptr<gloo::rendezvous::Store> open_store(const std::string &rdv,
                                                    const char *self,
                                                    std::string &ns)
{
    if (rdv.compare(0, 5, "file:") == 0) {
        ns.clear();
        return std::unique_ptr<gloo::rendezvous::Store>(
            new gloo::rendezvous::FileStore(rdv.substr(5)));
    }
    if (rdv.compare(0, 6, "redis:") != 0)
        throw gloo::Exception("unsupported rendezvous '" + rdv + "'");
    std::string rest = rdv.substr(6), host, port;
    size_t slash = rest.find('/', rest[0] == '[' ? rest.find(']') : 0);
    ns = slash == std::string::npos ? "kolo" : rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    size_t colon = rest.rfind(':');
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    try {
        return std::unique_ptr<gloo::rendezvous::Store>(
            new gloo::rendezvous::RedisStore(host, std::stoi(port)));
    } catch (const std::exception &e) {
        throw gloo::IoException("cannot reach the Redis server " + host + ":" +
                                port + " from host " + self + ": " + e.what());
    }
}

std::chrono::milliseconds to_ms(double seconds)
{
    return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

/* Sorts a Gloo failure into kolo's codes from the text Gloo gives. */
int classify(const std::string &what)
{
    if (what.find("imed out") != std::string::npos ||
        what.find("imeout") != std::string::npos)
        return KOLO_ERR_TIMEOUT;
    if (what.find("closed by peer") != std::string::npos ||
        what.find("reset by peer") != std::string::npos ||
        what.find("Broken pipe") != std::string::npos ||
        what.find("Connection refused") != std::string::npos)
        return KOLO_ERR_RANK_LOST;
    return KOLO_ERR_BACKEND;
}

/* Runs body(), turning every exception into a status and a message. */
template <typename F>
int guarded(const char *what, char *err, size_t errlen, F body) noexcept
{
    try {
        body();
        return KOLO_OK;
    } catch (const std::bad_alloc &) {
        std::snprintf(err, errlen, "Gloo %s: out of memory", what);
        return KOLO_ERR_NO_MEMORY;
    } catch (const std::exception &e) {
        std::snprintf(err, errlen, "Gloo %s failed: %s", what, e.what());
        return classify(e.what());
    } catch (...) {
        std::snprintf(err, errlen, "Gloo %s failed with an unknown exception",
                      what);
        return KOLO_ERR_BACKEND;
    }
}

/* Gloo sizes its segments by the element type, so the buffers are typed by
 * element size; the reduce function does the arithmetic of the real dtype. */
template <typename T>
void run_allreduce(GlooCtx *g, const void *in, void *out, size_t count,
                   kolo__ops_reduce_fn reduce)
{
    gloo::AllreduceOptions opts(g->context);
    if (in != nullptr && in != out)
        opts.setInput(const_cast<T *>(static_cast<const T *>(in)), count);
    opts.setOutput(static_cast<T *>(out), count);
    opts.setReduceFunction(
        [reduce](void *c, const void *a, const void *b, size_t n) {
            reduce(c, a, b, n);
        });
    opts.setTag(g->tag++);
    gloo::allreduce(opts);
}

int gloo_init(const kolo__ops_config_t *cfg, void **ctx, char *err,
                         size_t errlen)
{
    GlooCtx *g = new (std::nothrow) GlooCtx;
    if (g == nullptr) {
        std::snprintf(err, errlen, "out of memory creating the Gloo context");
        return KOLO_ERR_NO_MEMORY;
    }
    g->rank = cfg->rank;
    g->size = cfg->size;
    int rc = guarded("rendezvous", err, errlen, [&] {
        char self[256] = "";
        gethostname(self, sizeof(self) - 1);
        gloo::transport::tcp::attr attr;
        attr.hostname = cfg->hostname;
        try {
            g->device = gloo::transport::tcp::CreateDevice(attr);
        } catch (const std::exception &e) {
            throw gloo::IoException(std::string("cannot bind address ") +
                                    cfg->hostname + " on host " + self +
                                    " (KOLO_HOSTNAME, or the address of "
                                    "KOLO_NETWORK_INTERFACE): " + e.what());
        }
        std::string ns;
        std::unique_ptr<gloo::rendezvous::Store> base =
            open_store(cfg->rendezvous, self, ns);
        gloo::rendezvous::PrefixStore prefix(
            ns.empty() ? std::string(cfg->prefix) : ns + "/" + cfg->prefix,
            *base);
        TimedStore store(prefix, to_ms(cfg->start_timeout_s));
        g->context =
            std::make_shared<gloo::rendezvous::Context>(cfg->rank, cfg->size);
        /* Connecting is bounded by the start timeout, operations by the
         * operation timeout. */
        g->context->setTimeout(to_ms(cfg->start_timeout_s));
        g->context->connectFullMesh(store, g->device);
        g->context->setTimeout(to_ms(cfg->timeout_s));
        if (g->size > 1 && cfg->on_wake != nullptr) {
            g->on_wake = cfg->on_wake;
            g->wake_arg = cfg->wake_arg;
            g->recv_buf = g->context->createUnboundBuffer(&g->recv_token,
                                                          sizeof(uint64_t));
            g->send_token.assign(g->size, 0);
            g->send_pending.assign(g->size, 0);
            for (int r = 0; r < g->size; r++)
                g->send_buf.push_back(g->context->createUnboundBuffer(
                    &g->send_token[r], sizeof(uint64_t)));
            g->listener = std::thread(listen, g);
        }
    });
    if (rc != KOLO_OK) {
        delete g;
        return rc;
    }
    *ctx = g;
    return KOLO_OK;
}

void gloo_finalize(void *ctx)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    try {
        if (g->listener.joinable()) {
            g->stopping.store(true);
            g->recv_buf->abortWaitRecv();
            g->listener.join();
        }
        delete g;
    } catch (...) {
        /* Destructors close sockets; nothing useful to report here. */
    }
}

int gloo_allreduce(void *ctx, const void *in, void *out,
                              size_t count, size_t elem_size,
                              kolo__ops_reduce_fn reduce, char *err,
                              size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("allreduce", err, errlen, [&] {
        switch (elem_size) {
        case 1: run_allreduce<uint8_t>(g, in, out, count, reduce); break;
        case 2: run_allreduce<uint16_t>(g, in, out, count, reduce); break;
        case 4: run_allreduce<uint32_t>(g, in, out, count, reduce); break;
        case 8: run_allreduce<uint64_t>(g, in, out, count, reduce); break;
        default:
            throw gloo::Exception("unsupported element size " +
                                  std::to_string(elem_size));
        }
    });
}

int gloo_allgather(void *ctx, const void *in, void *out,
                              size_t bytes, char *err, size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("allgather", err, errlen, [&] {
        gloo::AllgatherOptions opts(g->context);
        opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                      bytes);
        opts.setOutput(static_cast<uint8_t *>(out), bytes * g->size);
        opts.setTag(g->tag++);
        gloo::allgather(opts);
    });
}

int gloo_gather(void *ctx, const void *in, void *out, size_t bytes,
                           int root, char *err, size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("gather", err, errlen, [&] {
        gloo::GatherOptions opts(g->context);
        opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                      bytes);
        if (g->rank == root)
            opts.setOutput(static_cast<uint8_t *>(out), bytes * g->size);
        opts.setRoot(root);
        opts.setTag(g->tag++);
        gloo::gather(opts);
    });
}

int gloo_broadcast(void *ctx, void *buf, size_t bytes, int root,
                              char *err, size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("broadcast", err, errlen, [&] {
        gloo::BroadcastOptions opts(g->context);
        opts.setOutput(static_cast<uint8_t *>(buf), bytes);
        opts.setRoot(root);
        opts.setTag(g->tag++);
        gloo::broadcast(opts);
    });
}

int gloo_allgatherv(void *ctx, const void *in, void *out, const size_t *bytes,
                    char *err, size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("allgatherv", err, errlen, [&] {
        gloo::AllgathervOptions opts(g->context);
        std::vector<size_t> counts(bytes, bytes + g->size);
        opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                      bytes[g->rank]);
        opts.setOutput(static_cast<uint8_t *>(out), counts);
        opts.setTag(g->tag++);
        gloo::allgatherv(opts);
    });
}

int gloo_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                   void *out, const size_t *recv_bytes, char *err,
                   size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("alltoallv", err, errlen, [&] {
        gloo::AlltoallvOptions opts(g->context);
        std::vector<int64_t> sc(send_bytes, send_bytes + g->size);
        std::vector<int64_t> rc(recv_bytes, recv_bytes + g->size);
        opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                      sc);
        opts.setOutput(static_cast<uint8_t *>(out), rc);
        opts.setTag(g->tag++);
        gloo::alltoallv(opts);
    });
}

/* Ring reduce-scatter on unbound buffers: in step s every rank sends block
 * (rank - s - 1) to its right neighbour and receives block (rank - s - 2)
 * from its left one, adding it into its own copy; after size - 1 steps
 * rank r holds the full reduction of block r. Each rank sends and receives
 * (size - 1) / size of the tensor, half of what an allreduce moves. */
int gloo_reduce_scatter(void *ctx, void *work, void *out, const size_t *counts,
                        size_t elem_size, kolo__ops_reduce_fn reduce,
                        char *err, size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    return guarded("reduce-scatter", err, errlen, [&] {
        int n = g->size, r = g->rank;
        std::vector<size_t> off(n + 1, 0);
        size_t maxb = 0;
        for (int i = 0; i < n; i++) {
            off[i + 1] = off[i] + counts[i] * elem_size;
            maxb = std::max(maxb, counts[i] * elem_size);
        }
        std::vector<uint8_t> tmp(maxb ? maxb : 1);
        auto wbuf = g->context->createUnboundBuffer(work, off[n] ? off[n] : 1);
        auto tbuf = g->context->createUnboundBuffer(tmp.data(), tmp.size());
        uint64_t slot = (0x6b6f6c6fULL << 32) | g->tag++;
        for (int s = 0; s < n - 1; s++) {
            int sb = ((r - s - 1) % n + n) % n, rb = ((r - s - 2) % n + n) % n;
            size_t sbytes = off[sb + 1] - off[sb], rbytes = off[rb + 1] - off[rb];
            if (rbytes > 0)
                tbuf->recv((r - 1 + n) % n, slot, 0, rbytes);
            if (sbytes > 0)
                wbuf->send((r + 1) % n, slot, off[sb], sbytes);
            if (rbytes > 0) {
                tbuf->waitRecv();
                uint8_t *dst = static_cast<uint8_t *>(work) + off[rb];
                reduce(dst, dst, tmp.data(), counts[rb]);
            }
            if (sbytes > 0)
                wbuf->waitSend();
        }
        std::memcpy(out, static_cast<uint8_t *>(work) + off[r],
                    off[r + 1] - off[r]);
    });
}

int gloo_wake_peers(void *ctx, uint64_t round, char *err, size_t errlen)
{
    GlooCtx *g = static_cast<GlooCtx *>(ctx);
    if (g->listener.get_id() == std::thread::id())
        return KOLO_OK;
    return guarded("wake token", err, errlen, [&] {
        for (int r = 0; r < g->size; r++) {
            if (r == g->rank)
                continue;
            /* The previous token to r has almost always left: r's listener
             * reposts its receive right after taking one. */
            if (g->send_pending[r])
                g->send_buf[r]->waitSend();
            g->send_token[r] = round;
            g->send_buf[r]->send(r, kWakeSlot);
            g->send_pending[r] = 1;
        }
    });
}

} // namespace

extern "C" const kolo__ops_t kolo__ops_gloo = {
    /* .name = */ "gloo",
    /* .init = */ gloo_init,
    /* .finalize = */ gloo_finalize,
    /* .allreduce = */ gloo_allreduce,
    /* .allgather = */ gloo_allgather,
    /* .gather = */ gloo_gather,
    /* .broadcast = */ gloo_broadcast,
    /* .allgatherv = */ gloo_allgatherv,
    /* .alltoallv = */ gloo_alltoallv,
    /* .reduce_scatter = */ gloo_reduce_scatter,
    /* .wake_peers = */ gloo_wake_peers,
    /* .allreduce_stream = */ nullptr,
    /* .waiting_for = */ nullptr, /* a Gloo collective does not say */
    /* Every gloo::allreduce costs hundreds of microseconds before its bytes
     * move: over a veth link between network namespaces, 16 MiB pieces
     * reduced float16-compressed 256 MiB tensors 10% and a ResNet-50 step
     * about 8% faster than 4 MiB ones. */
    /* .chunk_bytes = */ 16 << 20,
};
