#!/usr/bin/python3
"""test-why.py — `kolo-timeline why DIR` on flight recorder dumps written
here, in the format docs/flight.md gives, one directory per situation:

  not_enqueued  a rank stuck in its own code (4 ranks, its Python stack in
                the dump); the same after a stall shutdown (failed records,
                the stacks only in rank2.stacks, written by faulthandler);
                a rank that had shut down
  deadlock      a rank skipped a tensor and waits on another (3 ranks; 2
                ranks; after the runtime failed them)
  backend       a rank inside a Gloo allreduce the others finished
  no_dump       a rank without a dump; one whose only dump is far older
                than the others' (it dumped on SIGUSR1, then was killed)
  mismatch      the ranks disagreed on a shape
  error         an error the others' errors followed
  finished      every rank shut down, nothing pending (+ the latest rank)
  straggler     rank 0's figures warned of rank 2
  running, unknown  nothing stuck; every rank waiting on a tensor all have
  reading       unknown and missing fields, a .tmp file, a file that is not
                JSON, an older elastic generation set aside, an empty
                directory (exit 2), usage errors
  pip command   bindings/python/_kolo_commands.py's kolo-timeline runs why

Each case checks the verdict's kind, ranks and tensor (--json) and the
first line's words, ranks and times (text). The dumps are written by
the Job class below, not by a job: tests/timeline/run-timeline.sh and
the flight tests run real jobs. Prints one line per check and "N passed,
N failed"; exits 1 on a failure.

Usage: tests/timeline/test-why.py [TOOL]   (default: KOLO_TOP_SRCDIR's
tools/kolo-timeline, or the tree this file is in)
"""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("KOLO_TOP_SRCDIR") or os.path.dirname(
    os.path.dirname(HERE))
TOOL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    SRC, "tools", "kolo-timeline")
PY = "/usr/bin/python3"
T = 1765150000.0          # the jobs' start, unix seconds
passed = failed = 0

STACKS = """\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/job/data.py", line 17 in load_batch
  File "/job/train.py", line 42 in train_step
  File "/job/train.py", line 80 in <module>
"""


class Job:
    """The dumps of one job, rank by rank, in the format of docs/flight.md.
    Each rank counts its enqueues (seq, from seq0 on, as if its ring had
    dropped the older ones) and its operations of each kind (nth)."""

    def __init__(self, size, now, seq0=0, host="node1"):
        self.size, self.now = size, now
        self.dumps = [self._dump(r, host) for r in range(size)]
        self.seq = [seq0] * size
        self.nth = [{"allreduce": seq0} for _ in range(size)]
        self.batch = [0] * size

    def _dump(self, r, host):
        return {
            "kolo_flight": 1, "rank": r, "size": self.size,
            "local_rank": r, "cross_rank": 0, "host": host, "pid": 4000 + r,
            "elastic_generation": 0, "reason": "SIGUSR1", "time": self.now,
            "clock_offset": T - 1000.0, "records_kept": 2048,
            "records_total": 0,
            "training": {"inside": None, "since": T, "waiting_on": None,
                         "last_enqueue": None},
            "sets": [{"id": 0, "rank": r, "size": self.size,
                      "ranks": list(range(self.size)),
                      "background": {"doing": "idle", "since": self.now},
                      "rounds": 100, "enqueued": 0, "completed": 0,
                      "stopped": None}],
            "stragglers": None, "python_stacks": None, "records": []}

    def enqueue(self, r, name, at, op="allreduce", nbytes=4096):
        self.seq[r] += 1
        self.nth[r][op] = self.nth[r].get(op, 0) + 1
        rec = {"seq": self.seq[r], "nth": self.nth[r][op], "set": 0,
               "name": name, "op": op, "dtype": "float32",
               "shape": [nbytes // 4], "bytes": nbytes, "device": "cpu",
               "enqueued": at, "ready": None, "started": None,
               "ended": None, "batch": None, "batch_tensors": None,
               "batch_bytes": None, "state": "enqueued", "error": None}
        d = self.dumps[r]
        d["records"].append(rec)
        d["records_total"] += 1
        d["sets"][0]["enqueued"] += 1
        d["training"]["last_enqueue"] = {"set": 0, "name": name,
                                         "seq": rec["seq"], "time": at}
        return rec

    def run(self, r, recs, at, state="done", took=0.002, tensors=None,
            nbytes=None):
        """One batch of rank r: ready, started at `at`, ended (done)."""
        self.batch[r] += 1
        for rec in recs:
            rec.update(ready=at, started=at, batch=self.batch[r],
                       batch_tensors=tensors or len(recs),
                       batch_bytes=nbytes or sum(x["bytes"] for x in recs),
                       state=state)
            if state == "done":
                rec["ended"] = at + took
                self.dumps[r]["sets"][0]["completed"] += 1

    def steps(self, n, names, at, ranks=None, every=0.1):
        """n steps of the named allreduces, done on every rank."""
        for k in range(n):
            t = at + k * every
            for r in ranks if ranks is not None else range(self.size):
                recs = [self.enqueue(r, name, t + 0.001 * r)
                        for name in names]
                self.run(r, recs, t + 0.01 + 0.001 * r)
        return at + n * every

    def wait(self, r, rec, since):
        self.dumps[r]["training"] = {
            "inside": "kolo_wait", "since": since,
            "waiting_on": {"set": rec["set"], "name": rec["name"],
                           "seq": rec["seq"]},
            "last_enqueue": self.dumps[r]["training"]["last_enqueue"]}

    def outside(self, r, since):
        self.dumps[r]["training"].update(inside=None, since=since,
                                         waiting_on=None)

    def reason(self, text, ranks=None):
        for r in ranks if ranks is not None else range(self.size):
            self.dumps[r]["reason"] = text

    def write(self, path, ranks=None):
        os.makedirs(path, exist_ok=True)
        for r in ranks if ranks is not None else range(self.size):
            with open(os.path.join(path, "rank%d.json" % r), "w") as f:
                json.dump(self.dumps[r], f, indent=1)
        return path


# ---- running the tool, checking

def why(path, *args):
    p = subprocess.run([PY, TOOL, "why"] + list(args) + [path],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TZ="UTC"))
    return p.returncode, p.stdout, p.stderr


def report(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("PASS %s" % what)
    else:
        failed += 1
        print("FAIL %s" % what)
        for line in detail.splitlines()[:40]:
            print("    " + line)
    if os.environ.get("KOLO_TEST_SMOKE"):
        print("SMOKE: KOLO_TEST_SMOKE is set: the first case ran, not the "
              "others")
        print("%d passed, %d failed" % (passed, failed))
        sys.exit(1 if failed else 0)


def check(what, path, kind, ranks, tensor, first, more=()):
    """The verdict of `why path`: its kind, ranks and tensor in --json,
    its first line (a regex, matched from the start) in text; `more`:
    regexes some later line matches."""
    rc, out, err = why(path, "--json")
    detail = "exit %d\n%s%s" % (rc, out, err)
    try:
        v = json.loads(out)
    except ValueError:
        return report(False, what + ": --json is not JSON", detail)
    got = (v.get("kind"), v.get("ranks"), v.get("tensor"))
    if rc != 0 or got != (kind, ranks, tensor):
        return report(False, "%s: want %r, got %r" % (
            what, (kind, ranks, tensor), got), detail)
    rc, out, err = why(path)
    lines = out.splitlines()
    detail = "exit %d\n%s%s" % (rc, out, err)
    if rc != 0 or not lines or not re.match(first, lines[0]):
        return report(False, "%s: first line does not match /%s/" % (
            what, first), detail)
    if lines[0] != v.get("text"):
        return report(False, "%s: --json's text differs from the first "
                      "line" % what, detail)
    for pat in more:
        if not any(re.search(pat, line) for line in lines[1:]):
            return report(False, "%s: no later line matches /%s/" % (
                what, pat), detail)
    report(True, "%s: %s" % (what, lines[0][:100]))


# ---- the situations

def stuck_in_user_code(work):
    """4 ranks, 12 steps of 3 allreduces from seq 1494 on; then ranks 0,
    1, 3 enqueue grad/fc3.weight and wait 62 s; rank 2 left kolo 61.8 s
    before its dump, in load_batch."""
    now = T + 100.0
    job = Job(4, now, seq0=1494)
    names = ["grad/fc1.weight", "grad/fc2.weight", "grad/fc3.weight"]
    t = job.steps(12, names, now - 63.5)
    job.steps(1, names[:2], t)
    for r in (0, 1, 3):
        rec = job.enqueue(r, names[2], now - 62.0)
        job.wait(r, rec, now - 62.0)
    job.outside(2, now - 61.8)
    job.dumps[2]["python_stacks"] = STACKS
    job.reason("stall warning")
    return job


def case_not_enqueued(work):
    job = stuck_in_user_code(work)
    check("not_enqueued: rank 2 stuck in its own code",
          job.write(os.path.join(work, "user")), "not_enqueued", [2],
          "grad/fc3.weight",
          re.escape("rank 2 never enqueued 'grad/fc3.weight' (its 1533rd "
                    "allreduce); ranks 0, 1, 3 waited 62 s for it; rank 2's "
                    "training thread was outside kolo for the last 61.8 s: "
                    "it is stuck in your code (data loading?)") + "$",
          [r"rank 2's main thread \(from rank2.json\)",
           r'^    File "/job/data.py", line 17 in load_batch',
           r"set 0 \(global\): the last collective every rank completed: "
           r"'grad/fc2.weight' \(seq 1532, allreduce",
           r"set 0 \(global\): the ranks part at seq 1533 \(their 1533rd "
           r"collective\): ranks 0, 1, 3 enqueued 'grad/fc3.weight'; "
           r"rank 2 nothing yet"])


def case_after_stall_shutdown(work):
    """The same job after a stall shutdown: the waiters' records failed
    at 70 s, their training threads left kolo; their last dumps at
    shutdown, rank 2's on kolorun's stop; its stacks in rank2.stacks."""
    job = stuck_in_user_code(work)
    err = ("stall shutdown after 70 s: rank 2 is missing "
           "'grad/fc3.weight'")
    for r in (0, 1, 3):
        rec = job.dumps[r]["records"][-1]
        rec.update(state="failed", ended=rec["enqueued"] + 70.0, error=err)
        job.outside(r, rec["ended"])
        job.dumps[r]["time"] = rec["ended"] + 0.5
        job.dumps[r]["reason"] = "shutdown"
    job.dumps[2]["python_stacks"] = None
    job.dumps[2]["time"] = job.now + 9.0
    job.dumps[2]["reason"] = "kolorun stopping the job"
    path = job.write(os.path.join(work, "user-stopped"))
    real_stacks(os.path.join(path, "rank2.stacks"))
    check("not_enqueued after a stall shutdown (failed records, "
          "rank2.stacks)", path, "not_enqueued", [2], "grad/fc3.weight",
          re.escape("rank 2 never enqueued 'grad/fc3.weight' (its 1533rd "
                    "allreduce); ranks 0, 1, 3 waited 70 s for it; rank 2's "
                    "training thread was outside kolo for the last 70.8 s: "
                    "it is stuck in your code"),
          [r"rank 2's main thread \(from rank2.stacks\)",
           r'^    File ".*stacks.py", line \d+ in load_batch$',
           r'^    File ".*stacks.py", line \d+ in train_step$',
           r"rank 0 said: stall shutdown after 70 s: rank 2 is missing"])


STACKS_PY = """\
import faulthandler, signal, sys, threading, time
out = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
def load_batch():
    signal.raise_signal(signal.SIGUSR1)
def train_step():
    load_batch()
train_step()
train_step()
"""


def real_stacks(path):
    """A stacks file as kolo's binding has faulthandler write it: two
    dumps appended, each of a helper thread and the main thread."""
    script = os.path.join(os.path.dirname(path), "stacks.py")
    with open(script, "w") as f:
        f.write(STACKS_PY)
    subprocess.run([PY, script, path], check=True, timeout=60)
    os.unlink(script)


def deadlock_job(size, failed=False):
    """Every rank did 20 collectives; the last rank then enqueues
    metric.a and waits on it, the others grad.b."""
    now = T + 50.0
    job = Job(size, now)
    job.steps(10, ["grad.a", "grad.b"], now - 10.0)
    last = size - 1
    for r in range(size):
        rec = job.enqueue(r, "metric.a" if r == last else "grad.b",
                          now - 5.0)
        job.wait(r, rec, now - 5.0)
        if failed:
            rec.update(state="failed", ended=now - 4.9,
                       error="deadlock: rank %d skipped 'grad.b'" % last)
            job.outside(r, now - 4.9)
    job.reason("deadlock")
    return job


def case_deadlock(work):
    check("deadlock at 3 ranks: rank 2 skipped grad.b",
          deadlock_job(3).write(os.path.join(work, "dl3")), "deadlock", [2],
          "grad.b",
          re.escape("rank 2 skipped 'grad.b' (the others' 21st collective) "
                    "and waits on 'metric.a' (its 21st); ranks 0, 1 wait on "
                    "'grad.b': a deadlock"))
    check("deadlock at 2 ranks: rank 1 skipped, rank 0 waits",
          deadlock_job(2).write(os.path.join(work, "dl2")), "deadlock", [1],
          "grad.b",
          re.escape("rank 1 skipped 'grad.b' (the others' 21st collective) "
                    "and waits on 'metric.a' (its 21st); rank 0 waits on "
                    "'grad.b'"))
    check("deadlock after the runtime failed every rank's wait",
          deadlock_job(3, failed=True).write(os.path.join(work, "dl3f")),
          "deadlock", [2], "grad.b", r"rank 2 skipped 'grad\.b' .*"
          r"ranks 0, 1 wait on 'grad\.b'",
          [r"rank \d said: deadlock: rank 2 skipped 'grad.b'"])


def case_backend(work):
    """3 ranks; batch 88 (12 tensors, 96 MiB) ran on every rank 40 s ago:
    ranks 0 and 2 finished it and wait on the next step's first tensor,
    rank 1 is still inside it (its background thread too)."""
    now = T + 200.0
    job = Job(3, now)
    names = ["grad/%d" % k for k in range(12)]
    for r in range(3):
        job.batch[r] = 86
    job.steps(1, names, now - 45.0)
    for r in range(3):
        recs = [job.enqueue(r, n, now - 40.5, nbytes=8 << 20) for n in names]
        job.run(r, recs, now - 40.0, state="done" if r != 1 else "running",
                took=0.05)
        job.wait(r, recs[-1], now - 40.4)
        job.dumps[r]["sets"][0]["backend"] = "Gloo"
        if r != 1:
            job.wait(r, job.enqueue(r, names[0], now - 39.9), now - 39.9)
    job.dumps[1]["host"] = "node2"
    job.dumps[1]["sets"][0]["background"] = {"doing": "a collective",
                                             "since": now - 40.0}
    job.reason("stall warning")
    check("backend: rank 1 inside the Gloo allreduce of batch 88",
          job.write(os.path.join(work, "backend")), "backend", [1],
          "grad/0",
          re.escape("rank 1 is inside the Gloo allreduce of batch 88 (12 "
                    "tensors, 96 MiB) since 40 s, which ranks 0, 2 "
                    "finished: the link between them, or rank 1's host "
                    "(node2)") + "$")


def killed_job(size=4):
    """Every rank did 30 steps; the last rank's last one ended last."""
    now = T + 300.0
    job = Job(size, now)
    job.steps(30, ["grad.w"], now - 20.0)
    return job, now


def clock(t):
    """Unix seconds as the time of day in UTC, to the millisecond."""
    ms = int(round(t * 1000)) % 86400000
    return "%02d:%02d:%02d.%03d" % (ms // 3600000, ms // 60000 % 60,
                                    ms // 1000 % 60, ms % 1000)


def case_no_dump(work):
    job, now = killed_job()
    for r in range(3):
        job.wait(r, job.enqueue(r, "grad.w", now - 16.9), now - 16.9)
        job.dumps[r]["reason"] = ("error: lost rank 3 (pid 4003) has "
                                  "exited or was killed")
    alive = job.dumps[2]["records"][-2]["ended"]
    check("no_dump: rank 3 left none",
          job.write(os.path.join(work, "killed"), ranks=[0, 1, 2]),
          "no_dump", [3], None,
          re.escape("rank 3 left no dump: it was killed or frozen (last "
                    "seen alive by rank 2 at %s, when 'grad.w' completed"
                    % clock(alive)),
          [r"rank 0 said: lost rank 3 \(pid 4003\) has exited",
           r"^next: find how it ended",
           r"every dump here is from host node1"])
    # Rank 3 dumped on SIGUSR1 after 10 steps, 40 s before the job
    # stopped; it was killed after 20 more.
    now = T + 300.0
    job = Job(4, now)
    job.steps(10, ["grad.w"], now - 42.0, every=0.2)
    snap = copy.deepcopy(job.dumps[3])
    snap["time"] = now - 40.0
    job.steps(20, ["grad.w"], now - 39.0, every=0.5)
    alive = job.dumps[2]["records"][-1]["ended"]
    job.dumps[3] = snap
    for r in range(3):
        job.dumps[r]["reason"] = "kolorun stopping the job"
    check("no_dump: rank 3's only dump 40 s older than the others'",
          job.write(os.path.join(work, "stale")), "no_dump", [3], None,
          re.escape("rank 3's only dump (SIGUSR1, at %s) is 40 s older than "
                    "the others': it was killed or frozen since (last seen "
                    "alive by rank 2 at %s" % (clock(now - 40.0),
                                               clock(alive))))


def case_mismatch(work):
    now = T + 20.0
    job = Job(3, now)
    job.steps(3, ["grad.w"], now - 5.0)
    err = ("allreduce of tensor 'x': ranks disagree on shape: rank 0 has "
           "[4], rank 2 has [5]")
    for r in range(3):
        rec = job.enqueue(r, "x", now - 1.0)
        rec.update(state="failed", ended=now - 0.9, error=err)
        job.dumps[r]["reason"] = "error: " + err
    check("mismatch: named as a disagreement", job.write(
        os.path.join(work, "mismatch")), "mismatch", [0, 2], "x",
        re.escape("the ranks disagreed (none of them failed): " + err))


def case_shut_down(work):
    """Rank 1 shut down 30 s ago, while rank 0 went on to wait on grad.x."""
    now = T + 60.0
    job = Job(2, now)
    job.steps(20, ["grad.a"], now - 33.0)
    job.wait(0, job.enqueue(0, "grad.x", now - 30.0), now - 30.0)
    job.dumps[0]["reason"] = "stall warning"
    job.dumps[1].update(reason="shutdown", time=now - 30.5)
    check("not_enqueued: a rank that had shut down", job.write(
        os.path.join(work, "left")), "not_enqueued", [1], "grad.x",
        re.escape("rank 1 never enqueued 'grad.x' (its 21st allreduce); "
                  "rank 0 waited 30 s for it; rank 1 had shut down "
                  "(kolo_shutdown, at %s): it left the job before that "
                  "collective" % clock(now - 30.5)))


def case_error(work):
    """Rank 1's enqueue of grad/7 failed for want of memory; ranks 0 and 2
    failed theirs a second later because of it."""
    now = T + 90.0
    job = Job(3, now)
    job.steps(5, ["grad/7"], now - 5.0)
    first = "out of memory enqueuing tensor 'grad/7'"
    for r in range(3):
        err = first if r == 1 else (
            "rank 1 had failed: %s; so rank %d's allreduce of tensor "
            "'grad/7' failed" % (first, r))
        rec = job.enqueue(r, "grad/7", now - 2.5)
        at = now - (2.0 if r == 1 else 1.0)
        rec.update(state="failed", ended=at, error=err)
        job.dumps[r]["reason"] = "error: " + err
    check("error: the first one, named with its rank", job.write(
        os.path.join(work, "oom")), "error", [1], "grad/7",
        re.escape("rank 1 reported the first error, at %s: %s; start from "
                  "it (ranks 0, 2's errors followed)"
                  % (clock(now - 2.0), first)))


def with_stragglers(job, warned):
    job.dumps[0]["stragglers"] = {
        "window_s": 30.2, "rounds": 512, "warned": warned,
        "ranks": [{"rank": 2, "last_share": 0.93, "median_late_s": 0.041,
                   "late_share_of_time": 0.31},
                  {"rank": 1, "last_share": 0.04, "median_late_s": 0.002,
                   "late_share_of_time": 0.01}]}


def case_finished(work):
    now = T + 40.0
    job = Job(4, now)
    job.steps(20, ["grad.a", "grad.b"], now - 5.0)
    job.reason("shutdown")
    with_stragglers(job, None)
    check("finished: every rank shut down, nothing pending",
          job.write(os.path.join(work, "done")), "finished", [], None,
          re.escape("the job ended normally: all 4 ranks shut down with "
                    "nothing pending") + "$",
          [re.escape("the latest rank: rank 2: last in 93% of 512 "
                     "negotiations over 30 s, median 41 ms late")])


def case_straggler(work):
    now = T + 40.0
    job = Job(3, now)
    job.steps(20, ["grad.a"], now - 3.0)
    with_stragglers(job, 2)
    check("straggler: rank 0's figures warned of rank 2",
          job.write(os.path.join(work, "slow")), "straggler", [2], None,
          re.escape("rank 2 is slow: last in 93% of 512 negotiations over "
                    "30 s, median 41 ms late; the others waited for it 31% "
                    "of the time"))


def case_running_unknown(work):
    now = T + 40.0
    job = Job(2, now)
    job.steps(20, ["grad.a"], now - 3.0)
    job.wait(0, job.enqueue(0, "grad.a", now - 0.004), now - 0.004)
    check("running: a healthy job's dumps on SIGUSR1", job.write(
        os.path.join(work, "healthy")), "running", [], None,
        r"nothing stuck: the ranks were at work when they dumped \(SIGUSR1\)",
        [r"^rank 0: last completed 'grad.a' \(set 0, seq 20, allreduce\); "
         r"waits on 'grad.a'", r"^rank 1: .*; nothing pending"])
    job = Job(2, now)
    job.steps(20, ["grad.a"], now - 33.0)
    for r in range(2):
        job.wait(r, job.enqueue(r, "grad.z", now - 30.0), now - 30.0)
    job.reason("stall warning")
    check("unknown: every rank waits on a tensor they all have",
          job.write(os.path.join(work, "odd")), "unknown", [], None,
          r"no cause found in the dumps \(taken for: stall warning\)",
          [r"^rank 1: last completed .*; waits on 'grad.z'"])


# ---- reading whatever a directory holds

def case_reading(work):
    job = stuck_in_user_code(work)
    for d in job.dumps:
        d["a_field_of_a_later_kolo"] = {"x": [1, 2]}
        for k in ("local_rank", "cross_rank", "clock_offset", "sets",
                  "stragglers", "records_kept"):
            del d[k]
        for rec in d["records"]:
            for k in ("dtype", "shape", "device", "batch", "state"):
                rec.pop(k, None)
            rec["later"] = True
    path = job.write(os.path.join(work, "odd-fields"))
    with open(os.path.join(path, ".rank1.json.4001.tmp"), "w") as f:
        f.write('{"kolo_flight": 1, "rank": 1, "reco')
    check("fields missing, unknown fields, a .tmp file", path,
          "not_enqueued", [2], "grad/fc3.weight",
          r"rank 2 never enqueued 'grad/fc3.weight' \(its 1533rd allreduce"
          r"\); ranks 0, 1, 3 waited 62 s",
          [r"note: .rank1.json.4001.tmp: a dump that was never finished"])

    job, now = killed_job(3)
    gen0 = job.write(os.path.join(work, "elastic"))
    shutil.copy(os.path.join(gen0, "rank2.json"),
                os.path.join(gen0, "rank3.json"))
    job2 = Job(2, now + 30.0)
    job2.steps(5, ["grad.w"], now + 20.0)
    job2.reason("shutdown")
    for d in job2.dumps:
        d["elastic_generation"] = 1
    job2.write(gen0)
    with open(os.path.join(gen0, "rank2.json"), "w") as f:
        f.write("[]")
    check("an older elastic generation set aside; a file not a dump",
          gen0, "finished", [], None,
          r"the job ended normally: all 2 ranks shut down",
          [r"note: rank3.json: of elastic generation 0, older than the "
           r"newest \(1\): set aside",
           r"note: rank2.json: not a flight recorder dump"])

    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    rc, out, err = why(empty)
    report(rc == 2 and "no flight recorder dumps" in err and not out,
           "an empty directory: exit 2, saying so",
           "exit %d\n%s%s" % (rc, out, err))
    rc, out, err = why(empty, "--json")
    ok = rc == 2 and json.loads(out or "{}").get("kind") == "no_dumps"
    report(ok, "an empty directory, --json: kind no_dumps, exit 2",
           "exit %d\n%s%s" % (rc, out, err))
    rc, out, err = why(os.path.join(work, "none-such"))
    report(rc == 2 and "no such directory" in err,
           "a directory that does not exist: exit 2",
           "exit %d\n%s%s" % (rc, out, err))
    p = subprocess.run([PY, TOOL, "why"], capture_output=True, text=True)
    report(p.returncode == 2 and "why wants one directory" in p.stderr,
           "why without a directory: usage, exit 2",
           p.stdout + p.stderr)


def case_pip_command(work):
    """The command pip installs runs the package's copy of the tool:
    here a package laid out as setup.py lays it out."""
    pkg = os.path.join(work, "site", "kolo")
    os.makedirs(os.path.join(pkg, "_native"))
    open(os.path.join(pkg, "__init__.py"), "w").close()
    shutil.copy(TOOL, os.path.join(pkg, "_native", "kolo-timeline"))
    path = stuck_in_user_code(work).write(os.path.join(work, "pip"))
    code = ("import sys, _kolo_commands; sys.argv = ['kolo-timeline', "
            "'why', %r]; _kolo_commands.kolo_timeline()" % path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(work, "site"), os.path.join(SRC, "bindings",
                                                  "python")]))
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True,
                       env=env, timeout=60)
    report(p.returncode == 0 and p.stdout.startswith(
        "rank 2 never enqueued 'grad/fc3.weight'"),
        "the pip-installed kolo-timeline command runs why",
        "exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr))


def main():
    work = tempfile.mkdtemp(prefix="kolo-why-test.")
    try:
        for case in (case_not_enqueued, case_after_stall_shutdown,
                     case_deadlock, case_backend, case_no_dump,
                     case_mismatch, case_shut_down, case_error,
                     case_finished, case_straggler,
                     case_running_unknown, case_reading, case_pip_command):
            case(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
