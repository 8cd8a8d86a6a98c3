/*
 * test-flight.c — the flight recorder (runtime/flight.c): what it records
 * of a job of ranks as threads over ops/mem (tests/unit/ranks.c), and the
 * dump files it writes.
 *
 * Each dump is read back with Python's json module (/usr/bin/python3, as
 * `kolo-timeline why` reads it) by a short script per test, which checks
 * the records against the collectives the test ran: names, operations,
 * numbering (seq in the set, nth per collective), states, batches and the
 * order of the times. The tests also check that a dump is written whole
 * (no temporary file is left), that the ring keeps the newest records,
 * that KOLO_FLIGHT_RECORDER=0 writes nothing, that a directory that cannot
 * be written is said once while the job goes on, that an error reported
 * through a handle is dumped, that a refused enqueue gives its number
 * back, where the training thread is (blocked in kolo_wait on what), and
 * SIGUSR1: a signal from outside dumps and asks every rank to dump, the
 * handler kolo replaced is still called, a dump kolo asks for itself
 * raises the signal so that a handler chained in front of kolo's (Python's
 * faulthandler) writes the stacks first, and kolo_shutdown restores the
 * disposition.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flight.h"
#include "ranks.h"
#include "unit.h"

/* ---- the tests' files ----------------------------------------------------- */

static char g_dir[256]; /* the test's directory; dumps go to g_dir/dumps */

static void make_dir(void)
{
    static char dumps[300];

    snprintf(g_dir, sizeof(g_dir), "%s/kolo-test-flight.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(dumps, sizeof(dumps), "%s/dumps", g_dir);
    ranks_flight_dir = dumps;
    ranks_flight_recorder = 2048;
}

static void remove_dir(void)
{
    char cmd[400];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Runs a Python check on the dumps: `body` with D (the dumps' directory)
 * and load(r) (rank r's dump, parsed) defined; it fails the test with
 * the script's output unless it exits 0. */
static void py_check(const char *body)
{
    static const char prelude[] =
        "import json, os, sys\n"
        "D = sys.argv[1]\n"
        "def load(r):\n"
        "    with open(os.path.join(D, 'rank%d.json' % r), 'rb') as f:\n"
        "        return json.loads(f.read().decode('utf-8'))\n";
    char script[300], out[300], cmd[1200], text[4096] = "";
    FILE *f;
    int rc;
    size_t got;

    snprintf(script, sizeof(script), "%s/check.py", g_dir);
    snprintf(out, sizeof(out), "%s/check.out", g_dir);
    f = fopen(script, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s%s\n", prelude, body);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s' '%s' >'%s' 2>&1", script,
             ranks_flight_dir, out);
    rc = system(cmd);
    if ((f = fopen(out, "r")) != NULL) {
        got = fread(text, 1, sizeof(text) - 1, f);
        text[got] = '\0';
        fclose(f);
    }
    ck_assert_msg(rc == 0, "the dumps' check failed:\n%s", text);
}

/* Waits (10 s at most) until rank r's dump names `reason`. */
static int wait_dump(int r, const char *reason)
{
    char path[400], want[300], buf[4096];

    snprintf(path, sizeof(path), "%s/rank%d.json", ranks_flight_dir, r);
    snprintf(want, sizeof(want), "\"reason\": \"%s\"", reason);
    for (int i = 0; i < 5000; i++) {
        FILE *f = fopen(path, "r");
        size_t got = 0;
        if (f != NULL) {
            got = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
        }
        buf[got] = '\0';
        if (strstr(buf, want) != NULL)
            return 1;
        usleep(2000);
    }
    return 0;
}

/* ---- what a job records --------------------------------------------------- */

#define N1 5

/* Three allreduces together, a broadcast, then the first again; the
 * dumps must show them in that order on every rank. */
static void body_job(prank_t *p)
{
    static const char *const names[] = {"grad/a", "grad/b", "grad/c"};
    static const int64_t counts[] = {3, 100, 7};
    float in[3][100], out[3][100];
    int32_t bc[4] = {p->rank, p->rank, p->rank, p->rank};
    kolo__params_t pb = params(KOLO__COLL_BROADCAST, KOLO_INT32, KOLO_OP_SUM, 4);
    kolo_handle_t h[3];

    for (int t = 0; t < 3; t++)
        for (int i = 0; i < counts[t]; i++)
            in[t][i] = rank_val(p->rank, t, i);
    for (int t = 0; t < 3; t++)
        h[t] = allreduce(p, p->world, names[t], in[t], out[t], counts[t]);
    for (int t = 0; t < 3; t++) {
        expect_ok(p, h[t], names[t]);
        expect_sum(p, names[t], t, out[t], counts[t]);
    }
    pb.root = 1;
    expect_ok(p, push(p, p->world, "weights/bcast", &pb, bc, bc), "broadcast");
    EXPECT(p, bc[0] == 1 && bc[3] == 1, "rank %d: broadcast gave %d", p->rank,
           bc[0]);
    h[0] = allreduce(p, p->world, names[0], in[0], out[0], counts[0]);
    expect_ok(p, h[0], "grad/a again");
    expect_sum(p, names[0], 0, out[0], counts[0]);
}

/* What body_job leaves in every rank's last dump. */
static const char check_job[] =
    "names = ['grad/a', 'grad/b', 'grad/c', 'weights/bcast', 'grad/a']\n"
    "ops = ['allreduce'] * 3 + ['broadcast', 'allreduce']\n"
    "nth = [1, 2, 3, 1, 4]\n"
    "byts = [12, 400, 28, 16, 12]\n"
    "assert sorted(os.listdir(D)) == ['rank0.json', 'rank1.json'], os.listdir(D)\n"
    "for r in (0, 1):\n"
    "    d = load(r)\n"
    "    assert d['kolo_flight'] == 1 and d['rank'] == r and d['size'] == 2, d\n"
    "    assert d['reason'] == 'shutdown', d['reason']\n"
    "    assert d['records_kept'] == 2048 and d['records_total'] == 5, d\n"
    "    rs = d['records']\n"
    "    assert [x['name'] for x in rs] == names, rs\n"
    "    assert [x['op'] for x in rs] == ops, rs\n"
    "    assert [x['seq'] for x in rs] == [1, 2, 3, 4, 5], rs\n"
    "    assert [x['nth'] for x in rs] == nth, rs\n"
    "    assert [x['bytes'] for x in rs] == byts, rs\n"
    "    assert rs[1]['shape'] == [100] and rs[1]['dtype'] == 'float32', rs[1]\n"
    "    assert rs[3]['dtype'] == 'int32' and rs[3]['device'] == 'cpu', rs[3]\n"
    "    for x in rs:\n"
    "        assert x['state'] == 'done' and x['error'] is None, x\n"
    "        t = [x[k] for k in ('enqueued', 'ready', 'started', 'ended')]\n"
    "        assert None not in t and t == sorted(t), x\n"
    "        assert x['set'] == 0 and x['batch'] is not None, x\n"
    "    batches = {}\n"
    "    for x in rs:\n"
    "        batches.setdefault(x['batch'], []).append(x)\n"
    "    for b, xs in batches.items():\n"
    "        assert all(x['batch_tensors'] == len(xs) for x in xs), xs\n"
    "        assert all(x['batch_bytes'] == sum(y['bytes'] for y in xs) for x in xs), xs\n"
    "    assert len(batches[rs[3]['batch']]) == 1, 'the broadcast went alone'\n"
    "    assert sorted(batches) == sorted(set(x['batch'] for x in rs))\n"
    "    tr = d['training']\n"
    "    assert tr['inside'] is None and tr['waiting_on'] is None, tr\n"
    "    assert tr['since'] >= rs[-1]['ended'] - 1, tr\n"
    "    le = tr['last_enqueue']\n"
    "    assert le['name'] == 'grad/a' and le['seq'] == 5 and le['set'] == 0, le\n"
    "    s = d['sets']\n"
    "    assert len(s) == 1 and s[0]['id'] == 0 and s[0]['ranks'] == [0, 1], s\n"
    "    assert s[0]['enqueued'] == 5 and s[0]['completed'] == 5, s\n"
    "    assert s[0]['stopped'] and s[0]['background']['doing'] == 'idle', s\n"
    "    assert d['python_stacks'] is None and d['stragglers'] is None, d\n"
    "    assert abs(d['time'] - __import__('time').time()) < 600, d['time']\n";

START_TEST(records_of_a_job)
{
    make_dir();
    run_job(2, body_job);
    py_check(check_job);
    remove_dir();
}
END_TEST

/* More collectives than the ring holds: it keeps the newest. */
static void body_many(prank_t *p)
{
    float in = (float)p->rank, out;
    char name[32];

    for (int i = 0; i < 20; i++) {
        snprintf(name, sizeof(name), "t%d", i);
        expect_ok(p, allreduce(p, p->world, name, &in, &out, 1), name);
    }
}

START_TEST(ring_keeps_the_newest)
{
    make_dir();
    ranks_flight_recorder = 8;
    run_job(2, body_many);
    py_check("for r in (0, 1):\n"
             "    d = load(r)\n"
             "    assert d['records_kept'] == 8 and d['records_total'] == 20, d\n"
             "    rs = d['records']\n"
             "    assert [x['seq'] for x in rs] == list(range(13, 21)), rs\n"
             "    assert [x['name'] for x in rs] == ['t%d' % i for i in range(12, 20)]\n"
             "    assert [x['nth'] for x in rs] == list(range(13, 21)), rs\n");
    remove_dir();
}
END_TEST

START_TEST(off_writes_nothing)
{
    char path[400];
    struct stat st;

    make_dir();
    ranks_flight_recorder = 0;
    run_job(2, body_many);
    ck_assert_int_ne(stat(ranks_flight_dir, &st), 0);
    snprintf(path, sizeof(path), "%s/rank0.json", ranks_flight_dir);
    ck_assert_int_ne(access(path, F_OK), 0);
    remove_dir();
}
END_TEST

/* A directory that cannot be made (its parent is a file): one warning per
 * rank, however many dumps are asked for, and the job goes on. */
static void body_unwritable(prank_t *p)
{
    float in = (float)p->rank + 1, out = 0;

    for (int i = 0; i < 3; i++) {
        char reason[32];
        snprintf(reason, sizeof(reason), "asked %d", i);
        kolo__flight_dump(&p->rt, reason);
        expect_ok(p, allreduce(p, p->world, "x", &in, &out, 1), "x");
        EXPECT(p, out == 3.0f, "rank %d: x is %g, not 3", p->rank, out);
    }
}

START_TEST(unwritable_dir_warns_once)
{
    char file[300], dir[400], err_path[300], line[1024];
    int saved = dup(2), fd, lines[2] = {0, 0}, other = 0;
    FILE *f;

    make_dir();
    snprintf(file, sizeof(file), "%s/a-file", g_dir);
    f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    snprintf(dir, sizeof(dir), "%s/dumps", file);
    ranks_flight_dir = dir;
    snprintf(err_path, sizeof(err_path), "%s/stderr", g_dir);
    fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    run_job(2, body_unwritable);
    dup2(saved, 2);
    close(fd);
    f = fopen(err_path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "flight recorder: cannot write") == NULL)
            continue;
        ck_assert_msg(strstr(line, "Not a directory") != NULL &&
                      strstr(line, "no dumps from this rank, the job goes on"),
                      "%s", line);
        /* (the rank that owns SIGUSR1 first fails to write its .ready) */
        if (strstr(line, "/rank0.json:") != NULL || strstr(line, "/rank0.ready:") != NULL)
            lines[0]++;
        else if (strstr(line, "/rank1.json:") != NULL ||
                 strstr(line, "/rank1.ready:") != NULL)
            lines[1]++;
        else
            other++;
    }
    fclose(f);
    ck_assert_msg(lines[0] == 1 && lines[1] == 1 && other == 0,
                  "warnings: rank 0 %d, rank 1 %d, other %d", lines[0],
                  lines[1], other);
    remove_dir();
}
END_TEST

/* ---- errors, refusals, waits ---------------------------------------------- */

/* The ranks disagree on a tensor's size: both handles fail, and the
 * dumps say so. */
static void body_mismatch(prank_t *p)
{
    float in[4] = {1, 2, 3, 4}, out[4];
    char msg[KOLO__ERR_LEN + 64];
    kolo_handle_t h = allreduce(p, p->world, "grad/odd", in, out,
                                p->rank == 0 ? 4 : 3);
    int rc = wait_h(p, h, msg, sizeof(msg));

    EXPECT(p, rc == KOLO_ERR_MISMATCH, "rank %d: the mismatch gave %d: %s",
           p->rank, rc, msg);
    /* The job goes on. */
    h = allreduce(p, p->world, "grad/even", in, out, 4);
    expect_ok(p, h, "grad/even");
}

START_TEST(an_error_is_dumped)
{
    make_dir();
    run_job(2, body_mismatch);
    py_check("for r in (0, 1):\n"
             "    d = load(r)\n"
             "    before = [x['reason'] for x in d['earlier_dumps']]\n"
             "    assert len(before) == 1 and before[0].startswith('error: '), before\n"
             "    assert 'grad/odd' in before[0], before\n"
             "    rs = d['records']\n"
             "    assert [x['name'] for x in rs] == ['grad/odd', 'grad/even'], rs\n"
             "    assert rs[0]['state'] == 'failed' and 'grad/odd' in rs[0]['error'], rs\n"
             "    assert rs[0]['ended'] is not None, rs\n"
             "    assert rs[1]['state'] == 'done', rs\n");
    remove_dir();
}
END_TEST

/* A second enqueue of a name in flight is refused: it takes no number. */
static void body_refused(prank_t *p)
{
    float in = 1, out, in2 = 2, out2;
    kolo__err_t err;
    kolo_handle_t h1 = allreduce(p, p->world, "dup", &in, &out, 1);
    kolo_handle_t h2 = push_try(p->world, "dup", &(kolo__params_t){0}, &in2,
                                &out2, &err);

    EXPECT(p, h2 == 0 && err.code == KOLO_ERR_DUPLICATE_NAME,
           "rank %d: the second 'dup' was not refused (%d)", p->rank, err.code);
    expect_ok(p, h1, "dup");
    expect_ok(p, allreduce(p, p->world, "next", &in, &out, 1), "next");
}

START_TEST(a_refused_enqueue_takes_no_number)
{
    make_dir();
    run_job(2, body_refused);
    py_check("for r in (0, 1):\n"
             "    rs = load(r)['records']\n"
             "    assert [(x['name'], x['seq'], x['nth']) for x in rs] == "
             "[('dup', 1, 1), ('next', 2, 2)], rs\n"
             "    assert load(r)['records_total'] == 2\n");
    remove_dir();
}
END_TEST

/* What rank 1's dump says while it waits on 'late'. */
static void check_blocked_dump(void)
{
    py_check("d = load(1)\n"
             "assert d['reason'] == 'look', d['reason']\n"
             "t = d['training']\n"
             "assert t['inside'] == 'kolo_wait', t\n"
             "w = t['waiting_on']\n"
             "assert w == {'set': 0, 'name': 'late', 'seq': 1}, w\n"
             "r = d['records'][0]\n"
             "assert t['since'] >= r['enqueued'], t\n"
             "assert r['state'] == 'enqueued' and r['ready'] is None, r\n"
             "s = d['sets'][0]\n"
             "assert s['stopped'] is None and s['enqueued'] == 1, s\n"
             "assert s['completed'] == 0, s\n");
}

/* Rank 1 waits on a tensor rank 0 has not enqueued: rank 0 sees it
 * blocked (nothing of its own left in the queue) and has it dump, then
 * enqueues the tensor. */
static void body_blocked(prank_t *p)
{
    prank_t *r1 = &p->job->ranks[1];
    float in = 1, out = 0;
    int64_t since = 0;

    pthread_barrier_wait(&p->job->bar);
    if (p->rank == 1) {
        expect_ok(p, allreduce(p, p->world, "late", &in, &out, 1), "late");
        EXPECT(p, out == 2.0f, "late is %g", out);
        EXPECT(p, kolo__flight_outside_since(&p->rt) > 0, "rank 1 inside");
        EXPECT(p, kolo__flight_blocked_since(&p->rt, p->world) == 0,
               "rank 1 still blocked");
        return;
    }
    for (int i = 0; i < 5000 && since == 0; i++) {
        since = kolo__flight_blocked_since(&r1->rt, r1->world);
        if (since == 0)
            usleep(2000);
    }
    EXPECT(p, since > 0 && since <= kolo__now_us(), "rank 1 not seen blocked");
    EXPECT(p, kolo__flight_outside_since(&r1->rt) == 0, "rank 1 outside");
    kolo__flight_dump(&r1->rt, "look");
    EXPECT(p, wait_dump(1, "look"), "rank 1 did not dump");
    check_blocked_dump();
    expect_ok(p, allreduce(p, p->world, "late", &in, &out, 1), "late");
}

START_TEST(the_training_thread_blocked)
{
    make_dir();
    run_job(2, body_blocked);
    py_check("d = load(1)\n"
             "e = d['earlier_dumps']\n"
             "assert [x['reason'] for x in e] == ['look'], e\n"
             "assert d['training']['inside'] is None, d['training']\n"
             "assert d['records'][0]['state'] == 'done', d['records']\n");
    remove_dir();
}
END_TEST

/* ---- SIGUSR1 -------------------------------------------------------------- */

static atomic_int g_before; /* calls of the handler kolo replaced */
static struct sigaction g_kolo_action; /* kolo's, under the fake faulthandler */
static int g_stacks_fd = -1;

static void handler_before(int sig)
{
    (void)sig;
    atomic_fetch_add(&g_before, 1);
}

/* As faulthandler.register(sig, chain=False) on the binding's own
 * signal: writes the "stacks". */
static void fake_faulthandler(int sig)
{
    static const char text[] = "Thread 0x1 (most recent call first):\n"
                               "  File \"job.py\", line 7 in step\n";
    ssize_t w = write(g_stacks_fd, text, sizeof(text) - 1);

    (void)sig;
    (void)w;
}

/* A runtime without sets, as kolo_init has it before it connects. */
static void bare_runtime(kolo__runtime_t *rt, kolo__handles_t *h)
{
    kolo__err_t err;

    memset(rt, 0, sizeof(*rt));
    pthread_mutex_init(&rt->sets_mu, NULL);
    rt->cfg.flight_recorder = 16;
    snprintf(rt->cfg.flight_dir, sizeof(rt->cfg.flight_dir), "%s",
             ranks_flight_dir);
    ck_assert_int_eq(kolo__handles_init(h), 0);
    rt->handles = h;
    rt->size = 1;
    ck_assert_int_eq(kolo__flight_open(rt, &err), KOLO_OK);
}

START_TEST(sigusr1)
{
    kolo__runtime_t rt;
    kolo__handles_t h;
    struct sigaction before = {0}, now, fake = {0};
    char stacks[300];

    make_dir();
    before.sa_handler = handler_before;
    sigaction(SIGUSR1, &before, NULL);
    bare_runtime(&rt, &h);
    /* From outside: a dump, and a request that every rank dump. */
    raise(SIGUSR1);
    ck_assert_int_eq(atomic_load(&g_before), 1);
    ck_assert(wait_dump(0, "SIGUSR1"));
    ck_assert_int_eq(kolo__flight_take_dump_all(&rt), 1);
    ck_assert_int_eq(kolo__flight_take_dump_all(&rt), 0);
    /* The binding's own signal's handler writes the stacks, which the
     * next dump kolo asks for carries; kolo raises that signal, never
     * SIGUSR1 (the handler before kolo's is not called again). */
    snprintf(stacks, sizeof(stacks), "%s/rank0.stacks", g_dir);
    g_stacks_fd = open(stacks, O_RDWR | O_APPEND | O_CREAT, 0600);
    ck_assert_int_ge(g_stacks_fd, 0);
    fake.sa_handler = fake_faulthandler;
    sigaction(SIGRTMIN + 5, &fake, &g_kolo_action);
    ck_assert_int_eq(kolo__flight_stacks(&rt, g_stacks_fd, SIGUSR1,
                                         &(kolo__err_t){0}),
                     KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo__flight_stacks(&rt, g_stacks_fd, SIGRTMIN + 5,
                                         &(kolo__err_t){0}),
                     KOLO_OK);
    kolo__flight_dump(&rt, "asked by rank 3");
    ck_assert(wait_dump(0, "asked by rank 3"));
    ck_assert_int_eq(atomic_load(&g_before), 1);
    ck_assert_int_eq(kolo__flight_take_dump_all(&rt), 0);
    kolo__flight_stacks(&rt, -1, 0, &(kolo__err_t){0});
    sigaction(SIGRTMIN + 5, &g_kolo_action, NULL); /* faulthandler.unregister */
    kolo__flight_close(&rt);
    close(g_stacks_fd);
    /* The disposition before kolo's is back. */
    sigaction(SIGUSR1, NULL, &now);
    ck_assert(!(now.sa_flags & SA_SIGINFO) && now.sa_handler == handler_before);
    py_check("d = load(0)\n"
             "assert d['reason'] == 'asked by rank 3', d['reason']\n"
             "s = d['python_stacks']\n"
             "assert s.startswith('Thread 0x1') and 'job.py' in s, s\n"
             "assert [x['reason'] for x in d['earlier_dumps']] == ['SIGUSR1']\n"
             "assert d['records'] == [] and d['sets'] == [], d\n"
             "assert [f for f in os.listdir(D) if f.endswith('.tmp')] == []\n");
    kolo__handles_destroy(&h);
    remove_dir();
}
END_TEST

/* Requests of one kind while one is pending, or within a second of its
 * dump, add nothing. */
START_TEST(requests_coalesce)
{
    kolo__runtime_t rt;
    kolo__handles_t h;

    make_dir();
    bare_runtime(&rt, &h);
    kolo__flight_dump(&rt, "error: one");
    kolo__flight_dump(&rt, "error: two");
    ck_assert(wait_dump(0, "error: one"));
    kolo__flight_dump(&rt, "error: three");
    kolo__flight_close(&rt);
    py_check("d = load(0)\n"
             "assert d['reason'] == 'error: one', d['reason']\n"
             "assert d['earlier_dumps'] == [], d['earlier_dumps']\n");
    kolo__handles_destroy(&h);
    remove_dir();
}
END_TEST

KOLO_UNIT_MAIN("flight", 60, records_of_a_job, ring_keeps_the_newest,
               off_writes_nothing, unwritable_dir_warns_once,
               an_error_is_dumped, a_refused_enqueue_takes_no_number,
               the_training_thread_blocked, sigusr1,
               requests_coalesce)
