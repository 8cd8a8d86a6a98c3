#!/usr/bin/python3
"""check-timeline.py — checks of the timeline files that test-timeline
leaves, and of kolo-timeline on them (run by run-timeline.sh).

  check-timeline.py structure FILE --size N --rank R --steps S [--absent NAME]...
                    [--ready first|every|own] [--cycles] [--straggler R]

    --ready: which rounds must hold the ready instant of every rank: the
    first (a name's first negotiation goes through the coordinator, who
    records them; the default for rank 0), every one (no response cache), or
    none: only this rank's own (the default for other ranks; the response
    cache settles later rounds without telling the coordinator who was
    ready when).
  check-timeline.py aligned FILE...              (the per-rank files of one job)
  check-timeline.py killed FILE [--min-events N]
  check-timeline.py stalled TOOL FILE --size N
  check-timeline.py balanced TOOL FILE...        (no end without its begin)
  check-timeline.py summary TOOL --size N --steps S [--straggler R]
                    [--complete] FILE...
  check-timeline.py plot TOOL DIR FILE...
  check-timeline.py names TOOL DIR FILE          (tensor names not UTF-8)
  check-timeline.py full FILE                    (written to a disk that filled)
  check-timeline.py bad-input TOOL DIR GOODFILE --steps S
  check-timeline.py horovod TOOL DIR GOODFILE --steps S

Prints "ok: ..." lines and exits 0, or "FAIL: ..." lines and exits 1.
Every file is read with json.load, a real JSON parser.
"""

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

# The workload of test-timeline.c, one step: name -> (collective, bytes,
# dtype, shape). Keep in step with test-timeline.c.
WORKLOAD = {
    "grad.a": ("ALLREDUCE", 4000, "float32", [1000]),
    "grad.b": ("ALLREDUCE", 8192, "float32", [64, 32]),
    "grad.c": ("ALLREDUCE", 2400, "float64", [300]),
    "grad.d": ("ALLREDUCE", 20000, "int32", [5000]),
    "gather.x": ("ALLGATHER", 48, "float32", [3, 4]),
    "bcast.w": ("BROADCAST", 1024, "float32", [256]),
}

# The tensor names of test-timeline's "names" mode, as bytes: some are not
# valid UTF-8. Keep in step with odd_names in test-timeline.c.
ODD_NAMES = [
    b"odd.plain", b"odd.\xc3\xa9", b"odd.\xe9", b"odd.\xc3", b"odd.\xc3(",
    b"odd.\xe2\x82", b"odd.\xe2\x82\xac", b"odd.\xf0\x9f\x98\x80",
    b"odd.\xed\xa0\x80", b"odd.\xc0\xaf", b"odd.\xf4\x90\x80\x80",
    b"odd.\xff\xfe", b"odd.\\udce9", b"odd.\"q\\\x01",
    # (1009 bytes, each but the first 9 written as \udcff: events larger
    # than a page of the file, which runtime/timeline.c writes apart)
    b"odd.long." + b"\xff" * 1000,
]

# Lanes that may appear besides the workload's (the straggler mode's barrier).
IGNORED = {"kolo.barrier"}

failures = []


MAX_SHOWN = 6


def fail(msg):
    failures.append(msg)
    if len(failures) <= MAX_SHOWN:
        print("FAIL: " + msg)


def ok(msg):
    print("ok: " + msg)


def finish():
    if len(failures) > MAX_SHOWN:
        print("FAIL: ... and %d more" % (len(failures) - MAX_SHOWN))
    sys.exit(1 if failures else 0)


def load(path):
    with open(path, "rb") as f:
        return json.load(f)


def opt(args, name, default=None, conv=str):
    if name in args:
        i = args.index(name)
        v = args[i + 1]
        del args[i:i + 2]
        return conv(v)
    return default


def flag(args, name):
    if name in args:
        args.remove(name)
        return True
    return False


def opts_all(args, name):
    out = []
    while name in args:
        out.append(opt(args, name))
    return out


# ---------------------------------------------------------------- structure

class Span:
    def __init__(self, name, start, args):
        self.name, self.start, self.end, self.args = name, start, None, args
        self.children = []


def lanes_of(path, events, allow_open=False):
    """Checks the events one by one; returns (names: pid -> tensor, tops:
    pid -> [top-level Span], instants: pid -> [(rank, ts)], cycles)."""
    names = {}
    stacks = {}
    tops = {}
    instants = {}
    cycles = []
    for i, ev in enumerate(events):
        where = "%s: event %d" % (path, i)
        if not isinstance(ev, dict):
            fail("%s is not an object" % where)
            continue
        ph = ev.get("ph")
        pid = ev.get("pid")
        if ph not in ("M", "B", "E", "i", "C"):
            fail("%s has ph %r" % (where, ph))
            continue
        if not isinstance(pid, int):
            fail("%s has no integer pid" % where)
            continue
        if ph == "M":
            if ev.get("name") == "process_name":
                n = ev.get("args", {}).get("name")
                if pid in names:
                    fail("%s names pid %d a second time" % (where, pid))
                if pid != 0 and n in names.values():
                    fail("%s: tensor %r has two lanes" % (where, n))
                names[pid] = n
            continue
        ts = ev.get("ts")
        if not isinstance(ts, int) or ts < 0:
            fail("%s has ts %r (want an integer >= 0)" % (where, ts))
            continue
        if pid not in names:
            fail("%s uses pid %d before its process_name event" % (where, pid))
            names[pid] = "pid %d" % pid
        if ph == "C":
            continue
        stack = stacks.setdefault(pid, [])
        if ph == "B":
            if not isinstance(ev.get("name"), str):
                fail("%s: a B event without a name" % where)
            s = Span(ev.get("name"), ts, ev.get("args"))
            if stack:
                stack[-1].children.append(s)
            else:
                tops.setdefault(pid, []).append(s)
            stack.append(s)
        elif ph == "E":
            if not stack:
                fail("%s: an E event on lane %r with no open span" % (where, names[pid]))
                continue
            s = stack.pop()
            s.end = ts
            if ts < s.start:
                fail("%s: %s of %r ends (%d) before it begins (%d)"
                     % (where, s.name, names[pid], ts, s.start))
        elif ph == "i":
            n = ev.get("name")
            if pid == 0:
                if n == "CYCLE_START":
                    cycles.append(ts)
                else:
                    fail("%s: instant %r on the job lane" % (where, n))
            elif isinstance(n, str) and n.isdigit():
                instants.setdefault(pid, []).append((int(n), ts))
            else:
                fail("%s: instant %r on tensor lane %r" % (where, n, names[pid]))
    open_spans = {names[p]: [s.name for s in st] for p, st in stacks.items() if st}
    if open_spans and not allow_open:
        fail("%s: spans never closed: %s" % (path, open_spans))
    return names, tops, instants, cycles, open_spans


def check_header(path, events, rank, size):
    if not isinstance(events, list) or not events:
        fail("%s: not a non-empty JSON array" % path)
        return None
    e0 = events[0]
    a = e0.get("args", {}) if isinstance(e0, dict) else {}
    if e0.get("ph") != "M" or e0.get("name") != "kolo_timeline":
        fail("%s: the first event is not the kolo_timeline metadata: %r" % (path, e0))
        return None
    t = a.get("start_time_since_epoch_in_micros")
    mtime = os.stat(path).st_mtime
    if not isinstance(t, int) or abs(t / 1e6 - mtime) > 3600:
        fail("%s: start_time_since_epoch_in_micros %r is not within an hour of "
             "the file's time %.0f" % (path, t, mtime * 1e6))
    if rank is not None and a.get("rank") != rank:
        fail("%s: rank %r, want %d" % (path, a.get("rank"), rank))
    if size is not None and a.get("size") != size:
        fail("%s: size %r, want %d" % (path, a.get("size"), size))
    return a


# The data backend's phase prefix of multi-rank jobs: run-timeline.sh runs
# them on Gloo, and one case on shared memory (KOLO_TEST_PHASE=SHM).
PHASE = os.environ.get("KOLO_TEST_PHASE", "GLOO")


def backend_name(coll, size):
    return (PHASE + "_" if size > 1 else "LOCAL_") + coll


def cmd_structure(args):
    size = opt(args, "--size", conv=int)
    rank = opt(args, "--rank", 0, int)
    steps = opt(args, "--steps", 3, int)
    absent = opts_all(args, "--absent")
    ready = opt(args, "--ready", "first" if rank == 0 else "own")
    want_cycles = flag(args, "--cycles")
    want_carried = flag(args, "--carried")
    straggler = opt(args, "--straggler", None, int)
    path = args[0]
    events = load(path)
    ok("%s: json.load read %d events" % (path, len(events)))
    if check_header(path, events, rank, size) is None:
        return
    names, tops, instants, cycles, _ = lanes_of(path, events)
    # Times count from the job's start: none after the file was written.
    epoch = events[0]["args"]["start_time_since_epoch_in_micros"]
    last = max((e["ts"] for e in events if isinstance(e.get("ts"), int)), default=0)
    if isinstance(epoch, int) and (epoch + last) / 1e6 > os.stat(path).st_mtime + 2:
        fail("%s: an event at %d us after the epoch, %.1f s after the file was "
             "last written" % (path, last, (epoch + last) / 1e6 - os.stat(path).st_mtime))
    if names.get(0) != "kolo rank %d" % rank:
        fail("%s: pid 0 is named %r, want 'kolo rank %d'" % (path, names.get(0), rank))
    tensors = {n: p for p, n in names.items() if p != 0 and n not in IGNORED}
    for n in absent:
        if n in tensors:
            fail("%s: tensor %r was recorded; it ran while the timeline was "
                 "stopped" % (path, n))
    if set(tensors) != set(WORKLOAD):
        fail("%s: tensor lanes %s, want %s" % (path, sorted(tensors), sorted(WORKLOAD)))
    if want_cycles and not cycles:
        fail("%s: no CYCLE_START marker (mark_cycles was on)" % path)
    if not want_cycles and cycles:
        fail("%s: %d CYCLE_START markers, mark_cycles was off" % (path, len(cycles)))
    # Every backend span, to find fused batches.
    backend_spans = []
    carried = {}  # (name, step) -> tensors of its batch, where it was
                  # carried with the agreement (the backend span's args)
    execs = {}
    judged, overtaken = [], []  # --straggler: (tensor, step) judged; where not last
    for name, (coll, nbytes, dtype, shape) in WORKLOAD.items():
        pid = tensors.get(name)
        if pid is None:
            continue
        seq = tops.get(pid, [])
        got = [s.name for s in seq]
        want = ["NEGOTIATE_" + coll, coll] * steps
        if got != want:
            fail("%s: %s's top-level spans are %s, want %s" % (path, name, got, want))
            continue
        ex_list = []
        for k in range(steps):
            neg, top = seq[2 * k], seq[2 * k + 1]
            if neg.children:
                fail("%s: %s step %d: spans inside %s: %s" % (
                    path, name, k, neg.name, [c.name for c in neg.children]))
            if neg.end > top.start:
                fail("%s: %s step %d: %s ends at %d, after %s begins at %d"
                     % (path, name, k, neg.name, neg.end, coll, top.start))
            a = top.args or {}
            if a.get("dtype") != dtype or a.get("shape") != shape:
                fail("%s: %s step %d: %s args %r, want dtype %s shape %s"
                     % (path, name, k, coll, a, dtype, shape))
            kids = [c.name for c in top.children]
            be = backend_name(coll, size)
            if coll == "ALLREDUCE":
                allowed = (["QUEUE", be],
                           ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", be,
                            "MEMCPY_OUT_FUSION_BUFFER"])
            else:
                allowed = (["QUEUE", be],)
            if kids not in [list(x) for x in allowed]:
                fail("%s: %s step %d: inside %s: %s, want one of %s"
                     % (path, name, k, coll, kids, list(allowed)))
            prev = top.start
            for c in top.children:
                if c.start < prev or c.end > top.end or c.children:
                    fail("%s: %s step %d: %s [%d, %d] is not inside %s [%d, %d] "
                         "after its elder sibling" % (path, name, k, c.name, c.start,
                                                      c.end, coll, top.start, top.end))
                prev = c.end
                if c.name == be:
                    backend_spans.append((c.start, c.end, name, k))
                    carried_batch = (c.args or {}).get("carried")
                    if carried_batch is not None:
                        carried[(name, k)] = carried_batch
            ex_list.append((neg, top, kids))
        execs[name] = ex_list
        # Ready instants.
        inst = sorted(instants.get(pid, []), key=lambda x: x[1])
        for r, ts in inst:
            if not 0 <= r < size:
                fail("%s: %s: a ready instant of rank %d (size %d)" % (path, name, r, size))
        for k, (neg, top, _) in enumerate(ex_list):
            lo = ex_list[k - 1][1].end if k else -1
            mine = [(r, ts) for r, ts in inst if lo < ts <= top.start]
            ranks = sorted({r for r, _ in mine})
            own = [ts for r, ts in mine if r == rank]
            # NEGOTIATE runs from the first rank's request (on the
            # coordinator, another rank's may come first) to the last.
            first = min(ts for _, ts in mine) if mine else None
            if len(own) != 1 or first != neg.start:
                fail("%s: %s step %d: this rank's ready instant(s) %s, the first "
                     "ready instant %s, want one of them at the NEGOTIATE begin %d"
                     % (path, name, k, own, first, neg.start))
            need_all = ready == "every" or (k == 0 and ready == "first")
            if need_all and ranks != list(range(size)):
                fail("%s: %s step %d: ready instants of ranks %s, want every rank "
                     "0..%d" % (path, name, k, ranks, size - 1))
            outside = [(r, ts) for r, ts in mine if not neg.start <= ts <= neg.end]
            if outside:
                fail("%s: %s step %d: ready instants %s outside %s [%d, %d] (the "
                     "span should run from the first rank's request to the last)"
                     % (path, name, k, outside, neg.name, neg.start, neg.end))
            if straggler is not None and len(ranks) == size:
                # Rank 0 records the others' ready times when their requests
                # reach it, a negotiation round at a time: under load a rank
                # may land in the same round as the straggler, microseconds
                # after it. Only a rank clearly later (1 ms) counts as ahead
                # of it; and as a rank the scheduler stops for longer than the
                # straggler's delay is late too (seen: 182 ms, four builds
                # beside the test), the straggler must be the last in most
                # steps (as kolo-timeline's "usually last"), not in every one.
                top_ts = max(ts for _, ts in mine)
                late = max(ts for r, ts in mine if r == straggler)
                judged.append((name, k))
                if late < top_ts - 1000:
                    overtaken.append((name, k, "%s step %d by %.1f ms: %s" % (
                        name, k, (top_ts - late) / 1e3, mine)))
        extra = [(r, ts) for r, ts in inst if ex_list and ts > ex_list[-1][1].start]
        if extra:
            fail("%s: %s: ready instants after the last operation: %s" % (path, name, extra))
    if straggler is not None:
        # Judged a step at a time: one stopped rank delays every tensor of
        # its step. The straggler must be last in most steps.
        steps_judged = {k for _, k in judged}
        steps_overtaken = {k for _, k, _ in overtaken}
        if not steps_judged:
            fail("%s: no step had every rank's ready instant, so the straggler "
                 "rank %d could not be judged" % (path, straggler))
        elif 2 * len(steps_overtaken) >= len(steps_judged):
            fail("%s: rank %d was not the last ready in %d of %d steps: %s"
                 % (path, straggler, len(steps_overtaken), len(steps_judged),
                    "; ".join(t for _, _, t in overtaken)))
    # Fused tensors (backend spans that overlap) copy through the fusion
    # buffer; a tensor reduced alone is reduced in place. A batch carried
    # with the agreement (runtime/negotiate.c) has no network step, so its
    # spans may last no measurable time and overlap nothing: its backend
    # span says in its args how many tensors the batch had.
    backend_spans.sort()
    fused = set(key for key, n in carried.items() if n > 1)
    for i, (s0, e0, n0, k0) in enumerate(backend_spans):
        if (n0, k0) in carried:
            continue
        for s1, e1, n1, k1 in backend_spans[i + 1:]:
            if s1 >= e0:
                break
            if (n1, k1) in carried:
                continue
            if n1 != n0:
                fused.add((n0, k0))
                fused.add((n1, k1))
    for name, ex_list in execs.items():
        if WORKLOAD[name][0] != "ALLREDUCE":
            continue
        for k, (_, _, kids) in enumerate(ex_list):
            has = "MEMCPY_IN_FUSION_BUFFER" in kids
            # Shared memory packs fused tensors straight into its segment:
            # no fusion buffer, no copy phases.
            if (name, k) in fused and not has and PHASE != "SHM":
                fail("%s: %s step %d was fused with others but shows no "
                     "MEMCPY_IN/OUT_FUSION_BUFFER" % (path, name, k))
            if (name, k) not in fused and has:
                fail("%s: %s step %d was reduced alone (in place) but shows "
                     "MEMCPY phases" % (path, name, k))
    if want_carried and not carried:
        fail("%s: no operation was carried with the agreement (a steady small "
             "allreduce over Gloo should be: runtime/negotiate.c)" % path)
    ok("%s: %d tensors x %d steps: phases, nesting, args, ready instants checked; "
       "%d fused operations, %d carried with the agreement"
       % (path, len(execs), steps, len(fused), len(carried)))


def cmd_aligned(args):
    """The per-rank files of one job: one per rank, one epoch, and the same
    operation overlapping in time on every rank (clocks aligned)."""
    files = {}
    for path in args:
        ev = load(path)
        a = check_header(path, ev, None, None)
        if a is None:
            return
        files[a["rank"]] = (path, ev, a)
    size = next(iter(files.values()))[2]["size"]
    if sorted(files) != list(range(size)):
        fail("per-rank files of ranks %s, want 0..%d" % (sorted(files), size - 1))
        return
    epochs = {a["start_time_since_epoch_in_micros"] for _, _, a in files.values()}
    if len(epochs) != 1:
        fail("the per-rank files have different epochs: %s" % sorted(epochs))
    spans = {}
    for r, (path, ev, _) in files.items():
        names, tops, _, _, _ = lanes_of(path, ev)
        for pid, seq in tops.items():
            # (start, end) of each operation. One carried with the agreement
            # (runtime/negotiate.c) met the other ranks in its negotiation,
            # not in its backend span, which is local work: its time is its
            # negotiation's start to its end.
            ops, neg = [], None
            for s in seq:
                if s.name.startswith("NEGOTIATE_"):
                    neg = s
                    continue
                carried = any("carried" in (c.args or {}) for c in s.children)
                ops.append(((neg.start if carried and neg else s.start), s.end))
                neg = None
            spans[(r, names[pid])] = ops
    bad = 0
    for name in WORKLOAD:
        ref = spans.get((0, name), [])
        for r in range(1, size):
            other = spans.get((r, name), [])
            if len(other) != len(ref):
                fail("%s: rank 0 recorded %d operations, rank %d %d"
                     % (name, len(ref), r, len(other)))
                continue
            for k, ((a0, a1), (b0, b1)) in enumerate(zip(ref, other)):
                # One operation: the spans of all ranks overlap (1 ms slack
                # for the alignment of the clocks).
                if a0 > b1 + 1000 or b0 > a1 + 1000:
                    bad += 1
                    if bad <= 3:
                        fail("%s op %d: rank 0 [%d, %d] and rank %d [%d, %d] do not "
                             "overlap: clocks not aligned" % (name, k, a0, a1,
                                                              r, b0, b1))
    ok("%d per-rank files: one epoch, the same operations at the same times"
       % len(files))


def cmd_killed(args):
    min_events = opt(args, "--min-events", 50, int)
    path = args[0]
    try:
        events = load(path)
    except ValueError as e:
        fail("%s: json.load refuses the file a killed job left: %s" % (path, e))
        return
    if len(events) < min_events:
        fail("%s: %d events, want at least %d" % (path, len(events), min_events))
    check_header(path, events, 0, None)
    _, tops, _, _, open_spans = lanes_of(path, events, allow_open=True)
    done = sum(1 for seq in tops.values() for s in seq if s.name == "ALLREDUCE"
               and s.end is not None)
    if done < 10:
        fail("%s: only %d completed allreduces recorded" % (path, done))
    ok("%s: json.load read %d events of a job killed with SIGKILL (%d allreduces "
       "complete, %d lanes with open spans)" % (path, len(events), done, len(open_spans)))


def cmd_balanced(args):
    """Files of a timeline started and stopped while operations were in
    flight: each loads, and no span ends in a file it did not begin in."""
    tool = args.pop(0)
    nopen = 0
    for path in args:
        events = load(path)
        check_header(path, events, 0, None)
        _, _, _, _, open_spans = lanes_of(path, events, allow_open=True)
        nopen += sum(len(v) for v in open_spans.values())
    rc, out, err = run_tool(tool, "summary", *args)
    if rc != 0:
        fail("kolo-timeline summary of the restarted files: exit %d: %s" % (rc, err))
    if not failures:
        ok("%d files of a timeline restarted in flight load and balance (%d spans "
           "left open by a stop in flight)" % (len(args), nopen))


def cmd_stalled(args):
    """The timeline of a job stopped by the stall inspector: valid, every
    span closed, the withheld tensor's last negotiation ended."""
    size = opt(args, "--size", conv=int)
    tool, path = args
    events = load(path)
    check_header(path, events, 0, size)
    names, tops, instants, _, _ = lanes_of(path, events)
    lane = {n: p for p, n in names.items()}
    seq = [s.name for s in tops.get(lane.get("grad.withheld"), [])]
    if seq[:2] != ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"] or \
            seq[2:] != ["NEGOTIATE_ALLREDUCE"]:
        fail("%s: grad.withheld's spans %s, want one allreduce and then a closed "
             "negotiation that failed" % (path, seq))
    rc, out, err = run_tool(tool, "summary", "--json", path)
    if rc != 0:
        fail("kolo-timeline summary %s: exit %d: %s" % (path, rc, err))
        return
    u = json.loads(out)["unfinished"].get("grad.withheld")
    if not u or u[0]["failed_negotiations"] != 1:
        fail("kolo-timeline does not list grad.withheld's failed negotiation: %r" % u)
    if not failures:
        ok("%s: the timeline of a job stopped by a stall is valid and closed; "
           "kolo-timeline lists the failed negotiation" % path)


def cmd_names(args):
    """Tensor names that are not valid UTF-8: the file is UTF-8 and JSON;
    every name has a lane of its own and gives its bytes back (a byte that
    is not UTF-8 is written as the escape of a lone surrogate U+DC80 +
    byte, Python's "surrogateescape"); kolo-timeline reads the file."""
    tool, outdir, path = args
    with open(path, "rb") as f:
        raw = f.read()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail("%s: not UTF-8 at byte %d: %r" % (path, e.start,
                                              raw[max(0, e.start - 20):e.end + 20]))
    try:
        events = load(path)
    except ValueError as e:
        fail("%s: json.load refuses the file: %s" % (path, e))
        return
    check_header(path, events, 0, None)
    names, tops, _, _, _ = lanes_of(path, events)
    got = {}
    for pid, n in names.items():
        if pid == 0:
            continue
        try:
            b = n.encode("utf-8", "surrogateescape")
        except (AttributeError, UnicodeEncodeError) as e:
            fail("%s: lane %d's name %r does not give bytes back: %s"
                 % (path, pid, n, e))
            continue
        got[b] = pid
        if "ALLREDUCE" not in [s.name for s in tops.get(pid, [])]:
            fail("%s: lane %r has no ALLREDUCE span" % (path, n))
    for b in ODD_NAMES:
        if b not in got:
            fail("%s: no lane for the tensor %r (lanes: %s)"
                 % (path, b, sorted(got)))
    for b in got:
        if b not in ODD_NAMES:
            fail("%s: a lane %r for no tensor of the job" % (path, b))
    rc, out, err = run_tool(tool, "summary", path)
    if rc != 0 or "odd.plain" not in out:
        fail("kolo-timeline summary %s: exit %d: %s%s" % (path, rc, out, err))
    rc, out, err = run_tool(tool, "summary", "--json", path)
    if rc != 0:
        fail("kolo-timeline summary --json %s: exit %d: %s" % (path, rc, err))
    else:
        tensors = json.loads(out)["tensors"]
        if len(tensors) != len(ODD_NAMES):
            fail("kolo-timeline summary --json: %d tensors, want %d: %s"
                 % (len(tensors), len(ODD_NAMES), sorted(tensors)))
    svg = os.path.join(outdir, "names.svg")
    rc, out, err = run_tool(tool, "plot", path, "-o", svg)
    if rc != 0:
        fail("kolo-timeline plot %s: exit %d: %s" % (path, rc, err))
    else:
        try:
            ET.parse(svg)
        except ET.ParseError as e:
            fail("%s: not well-formed XML: %s" % (svg, e))
    if not failures:
        ok("%s: UTF-8 JSON; %d tensor names, %d of them not UTF-8, each on its "
           "own lane and read back byte for byte; kolo-timeline summary and "
           "plot read it" % (path, len(ODD_NAMES), sum(1 for b in ODD_NAMES
                                                      if not _utf8(b))))


def _utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def cmd_full(args):
    """The file of a timeline whose disk filled up: it loads, holds the
    header and what was written before the failed write."""
    path = args[0]
    try:
        events = load(path)
    except ValueError as e:
        with open(path, "rb") as f:
            raw = f.read()
        fail("%s: json.load refuses the file that a full disk left (%d bytes, "
             "ending %r): %s" % (path, len(raw), raw[-60:], e))
        return
    check_header(path, events, 0, None)
    _, tops, _, _, open_spans = lanes_of(path, events, allow_open=True)
    if not failures:
        ok("%s: json.load read the %d events (%d lanes) written before the disk "
           "filled up (%d lanes with open spans)"
           % (path, len(events), len(tops), len(open_spans)))


# ---------------------------------------------------------------- kolo-timeline

def run_tool(tool, *argv):
    p = subprocess.run([sys.executable, tool] + list(argv), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def check_numbers(s, what, steps, size, straggler=None, complete=False):
    n0 = len(failures)
    if s.get("size") != size:
        fail("%s: size %r, want %d" % (what, s.get("size"), size))
    for name, (coll, nbytes, dtype, shape) in WORKLOAD.items():
        t = s["tensors"].get(name)
        if t is None:
            fail("%s: no tensor %s" % (what, name))
            continue
        if (t["collective"], t["count"], t["bytes"], t["bytes_total"]) != \
                (coll, steps, nbytes, nbytes * steps):
            fail("%s: %s: collective %s, count %s, bytes %s, total %s; want %s, %d, "
                 "%d, %d" % (what, name, t["collective"], t["count"], t["bytes"],
                             t["bytes_total"], coll, steps, nbytes, nbytes * steps))
        be = backend_name(coll, size)
        for p in ("NEGOTIATE_" + coll, coll, "QUEUE", be):
            st = t["phases"].get(p)
            if not st or st["count"] < steps or st["total_us"] <= 0 and p != "QUEUE":
                fail("%s: %s: phase %s: %r" % (what, name, p, st))
        if t["busbw_bytes_per_s"] is None or t["busbw_bytes_per_s"] <= 0:
            fail("%s: %s: no bus bandwidth" % (what, name))
    for coll in ("ALLREDUCE", "ALLGATHER", "BROADCAST"):
        c = s["collectives"].get(coll)
        want = sum(b for k, (cc, b, _, _) in WORKLOAD.items() if cc == coll) * steps
        cnt = sum(steps for k, (cc, _, _, _) in WORKLOAD.items() if cc == coll)
        if c is None or c["bytes_total"] != want or c["count"] != cnt:
            fail("%s: collective %s: %r, want %d bytes in %d operations"
                 % (what, coll, c and {k: c[k] for k in ("count", "bytes_total")},
                    want, cnt))
    st = s["stragglers"]
    if complete and st["complete_rounds"] != st["rounds"]:
        fail("%s: every rank's ready time known in %d of %d rounds, want all"
             % (what, st["complete_rounds"], st["rounds"]))
    # The start-up broadcasts stay out of the table (bcast.w's rounds).
    if complete and st.get("broadcast_rounds_left_out") != steps:
        fail("%s: %r broadcast negotiations left out of the straggler table, "
             "want bcast.w's %d" % (what, st.get("broadcast_rounds_left_out"), steps))
    if 0 < st["complete_rounds"] < 5 and st["usual_last_rank"] is not None:
        fail("%s: a usual last rank named from %d negotiations"
             % (what, st["complete_rounds"]))
    if straggler is not None:
        last = st["last_ready"].get(str(straggler), 0)
        if st["usual_last_rank"] != straggler or last < 0.8 * st["complete_rounds"] \
                or st["complete_rounds"] < len(WORKLOAD):
            fail("%s: the straggler table %r does not name rank %d as the usual "
                 "last-ready rank" % (what, st, straggler))
    return len(failures) == n0


def cmd_summary(args):
    size = opt(args, "--size", conv=int)
    steps = opt(args, "--steps", 3, int)
    straggler = opt(args, "--straggler", None, int)
    complete = flag(args, "--complete")
    tool, files = args[0], args[1:]
    rc, out, err = run_tool(tool, "summary", "--json", *files)
    if rc != 0:
        fail("kolo-timeline summary --json %s: exit %d: %s" % (" ".join(files), rc, err))
        return
    if err.strip():
        fail("kolo-timeline summary: unexpected warnings: %s" % err.strip())
    s = json.loads(out)
    what = "summary of " + " ".join(os.path.basename(f) for f in files)
    if check_numbers(s, what, steps, size, straggler, complete):
        ok("%s: counts, bytes, phases, bandwidth%s checked" % (
            what, ", straggler rank %d" % straggler if straggler is not None else ""))
    rc, text, err = run_tool(tool, "summary", *files)
    if rc != 0:
        fail("kolo-timeline summary (text): exit %d: %s" % (rc, err))
        return
    for name in WORKLOAD:
        if name not in text:
            fail("the text summary does not name %s" % name)
    for word in ("ALLREDUCE", PHASE + "_ALLREDUCE", "NEGOTIATE_ALLREDUCE", "QUEUE",
                 "stragglers", "bus bandwidth"):
        if word not in text:
            fail("the text summary lacks %r" % word)
    if straggler is not None and not re.search(
            r"usually last: rank %d \(last in \d+ of these \d+ negotiations\)"
            % straggler, text):
        fail("the text summary does not say 'usually last: rank %d (last in K of "
             "these N negotiations)'" % straggler)
    st = s["stragglers"]
    if 0 < st["complete_rounds"] < 5 and "too few to tell" not in text:
        fail("the text summary names no shortage of negotiations (%d)"
             % st["complete_rounds"])
    ok("text summary of %s (%d lines)" % (" ".join(files), text.count("\n")))


def cmd_plot(args):
    tool, outdir, files = args[0], args[1], args[2:]
    svg = os.path.join(outdir, "plot.svg")
    rc, out, err = run_tool(tool, "plot", *files, "-o", svg)
    if rc != 0:
        fail("kolo-timeline plot: exit %d: %s" % (rc, err))
        return
    if os.path.getsize(svg) < 1000:
        fail("%s: only %d bytes" % (svg, os.path.getsize(svg)))
    try:
        root = ET.parse(svg).getroot()
    except ET.ParseError as e:
        fail("%s: not well-formed XML: %s" % (svg, e))
        return
    ns = "{http://www.w3.org/2000/svg}"
    if root.tag != ns + "svg":
        fail("%s: the root element is %s, not svg" % (svg, root.tag))
    rects = root.findall(".//%srect" % ns)
    texts = "".join(t.text or "" for t in root.iter(ns + "text"))
    reds = [l for l in root.iter(ns + "line") if l.get("stroke") == "red"]
    if len(rects) < 20:
        fail("%s: %d rectangles" % (svg, len(rects)))
    for lane in ("NEGOTIATE_", "ALLREDUCE", PHASE + "_", "QUEUE"):
        if lane not in texts:
            fail("%s: no lane %s" % (svg, lane))
    if not reds:
        fail("%s: no red tick marks the last rank's ready instant" % svg)
    html = os.path.join(outdir, "plot.html")
    rc, out, err = run_tool(tool, "plot", *files, "-o", html)
    if rc != 0:
        fail("kolo-timeline plot -o .html: exit %d: %s" % (rc, err))
        return
    with open(html, encoding="utf-8") as f:
        page = f.read()
    if "<svg" not in page or "</html>" not in page or "stragglers" not in page:
        fail("%s: no SVG or summary in the page" % html)
    ok("plot: %s is XML with %d rectangles and %d red straggler ticks; %s written"
       % (svg, len(rects), len(reds), html))


def expect(tool, argv, code, words, what):
    rc, out, err = run_tool(tool, *argv)
    if rc != code:
        fail("%s: exit %d, want %d (stderr: %s)" % (what, rc, code, err.strip()))
        return None
    for w in words:
        if w not in err:
            fail("%s: stderr does not say %r: %s" % (what, w, err.strip()))
            return None
    ok("%s: exit %d, %s" % (what, rc, (err.strip().splitlines() or [""])[-1][:150]))
    return out


def cmd_bad_input(args):
    steps = opt(args, "--steps", 3, int)
    tool, d, good = args
    def write(name, data):
        p = os.path.join(d, name)
        with open(p, "w" if isinstance(data, str) else "wb") as f:
            f.write(data)
        return p
    p = write("notjson.json", "this is not JSON\n")
    expect(tool, ["summary", p], 1, [p, "not JSON"], "a text file")
    p = write("object.json", '{"traceEvents_no": 1, "hello": [1, 2]}')
    expect(tool, ["summary", p], 1, [p, "not a timeline", "JSON object"],
           "a JSON object that is not a timeline")
    p = write("numbers.json", "[1, 2, 3]")
    expect(tool, ["summary", p], 1, [p, "not a trace event"], "an array of numbers")
    p = write("othertrace.json", json.dumps([
        {"name": "frame", "ph": "B", "ts": 1, "pid": 1, "tid": 1},
        {"ph": "E", "ts": 2, "pid": 1, "tid": 1}]))
    expect(tool, ["summary", p], 1, [p, "not a kolo or Horovod timeline"],
           "another program's Chrome trace")
    p = write("empty.json", "")
    expect(tool, ["summary", p], 1, [p, "empty"], "an empty file")
    p = write("bracket.json", "[\n")
    expect(tool, ["summary", p], 1, [p, "no event"], "a file with only '['")
    p = write("binary.json", b"\x89PNG\r\n\x1a\n\0\0\0")
    expect(tool, ["summary", p], 1, [p], "a binary file")
    missing = os.path.join(d, "missing.json")
    expect(tool, ["summary", missing], 1, [missing, "cannot read"], "a missing file")
    expect(tool, ["summary", good, p], 1, [p], "one bad file among good ones")
    # Truncated: the recorded file cut in the middle of an event.
    with open(good, "rb") as f:
        data = f.read()
    cut = data.rfind(b'{"name"', 0, len(data) // 2) + 12
    p = write("truncated.json", data[:cut])
    out = expect(tool, ["summary", "--json", p], 0, [p, "truncated"],
                 "a file cut in the middle (%d of %d bytes)" % (cut, len(data)))
    if out is not None:
        s = json.loads(out)
        f0 = s["files"][0]
        total = sum(t["count"] for t in s["tensors"].values())
        if not f0["truncated"] or total <= 0 or total >= steps * len(WORKLOAD):
            fail("truncated file: truncated=%s, %d operations summarized (want some, "
                 "fewer than %d)" % (f0["truncated"], total, steps * len(WORKLOAD)))
        else:
            ok("truncated file: %d of %d operations summarized" % (total,
                                                                  steps * len(WORKLOAD)))
    p = write("cut-after-event.json", data[:data.rfind(b"}") + 1] + b",\n")
    expect(tool, ["summary", p], 0, [p, "not closed"], "a file whose array is not closed")
    p = write("cut-header.json", data[:20])
    expect(tool, ["summary", p], 1, [p, "truncated"], "a file cut inside its first event")
    # Usage.
    expect(tool, [], 2, ["usage"], "no arguments")
    expect(tool, ["frobnicate", good], 2, ["unknown command"], "an unknown command")
    expect(tool, ["summary"], 2, ["at least one"], "summary without files")
    expect(tool, ["plot", good], 2, ["-o"], "plot without -o")
    expect(tool, ["plot", good, "-o", os.path.join(d, "x.png")], 2, [".png"],
           "plot -o x.png")
    expect(tool, ["summary", "--bogus", good], 2, ["--bogus"], "an unknown option")
    rc, out, err = run_tool(tool, "--help")
    if rc != 0 or "summary" not in out:
        fail("--help: exit %d" % rc)


def to_horovod(events):
    """A kolo timeline rewritten the way Horovod writes one: its metadata
    first event, 'X' ready events, dtype and shape on the end of the
    top-level span, no tid, an array never closed."""
    out = [{"name": "process_name", "ph": "M", "pid": 0,
            "args": {"start_time_since_epoch_in_micros":
                     events[0]["args"]["start_time_since_epoch_in_micros"]}},
           {"name": "process_sort_index", "ph": "M", "pid": 0,
            "args": {"sort_index": 0}}]
    stacks = {}
    for ev in events[2:]:
        ev = dict(ev)
        ev.pop("tid", None)
        ph = ev.get("ph")
        if ph == "i" and ev.get("pid"):
            ev = {"ph": "X", "name": ev["name"], "ts": ev["ts"], "pid": ev["pid"],
                  "dur": 0}
        elif ph == "i":
            ev = {"ph": "i", "name": ev["name"], "ts": ev["ts"], "s": "g"}
        elif ph == "B":
            args = ev.pop("args", None)
            stacks.setdefault(ev["pid"], []).append(args)
        elif ph == "E":
            args = stacks[ev["pid"]].pop()
            if args and "dtype" in args:  # (Horovod's spans: the tensor's)
                ev["args"] = {"dtype": "HOROVOD_" + args["dtype"].upper(),
                              "shape": "[%s]" % ", ".join(map(str, args["shape"]))}
        elif ph == "C":
            continue
        out.append(ev)
    return "[\n" + "".join(json.dumps(e) + ",\n" for e in out)


def cmd_horovod(args):
    steps = opt(args, "--steps", 3, int)
    size = opt(args, "--size", conv=int)
    tool, d, good = args
    p = os.path.join(d, "horovod.json")
    with open(p, "w") as f:
        f.write(to_horovod(load(good)))
    rc, out, err = run_tool(tool, "summary", "--json", p)
    if rc != 0:
        fail("Horovod-style file: exit %d: %s" % (rc, err))
        return
    s = json.loads(out)
    if s["files"][0]["format"] != "horovod":
        fail("Horovod-style file read as %r" % s["files"][0]["format"])
    if check_numbers(s, "Horovod-style file", steps, size):
        ok("a Horovod-style file (X ready events, dtype/shape on the end, array "
           "not closed): counts and bytes as recorded")


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    cmd = args.pop(0)
    cmds = {"structure": cmd_structure, "aligned": cmd_aligned, "killed": cmd_killed,
            "stalled": cmd_stalled, "balanced": cmd_balanced,
            "names": cmd_names, "full": cmd_full,
            "summary": cmd_summary, "plot": cmd_plot,
            "bad-input": cmd_bad_input, "horovod": cmd_horovod}
    if cmd not in cmds:
        print("unknown command " + cmd)
        sys.exit(2)
    try:
        cmds[cmd](args)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        fail("%s: %s: %s" % (cmd, type(e).__name__, e))
    finish()


if __name__ == "__main__":
    main()
