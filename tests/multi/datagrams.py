#!/usr/bin/env python3
"""datagrams.py -- a stranger's datagrams to a job's shared-memory wake
sockets, for tests/multi/run-stranger.sh.

    datagrams.py SECONDS [READY_FILE]

Until the job's sockets are gone (at most SECONDS), sends datagrams to
every abstract Unix socket named
kolo-shm-* (kolo's wake sockets, ops/shm/shm_ops.c) that /proc/net/unix
lists: 8-byte tokens of every kind (0, 1, a large round, UINT64_MAX, the
one kolo uses to say a peer is lost) and other sizes, as whatever user
runs it. Prints "datagrams: N sent to M socket(s)"; exits 0 when it sent
some, 1 when it found no socket to send to.
"""
import os
import socket
import struct
import sys
import time


def wake_sockets():
    names = set()
    with open("/proc/net/unix") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[-1].startswith("@kolo-shm-"):
                names.add(fields[-1][1:])
    return sorted(names)


def main():
    until = time.monotonic() + float(sys.argv[1])
    if len(sys.argv) > 2:  # READY_FILE: say that it is looking
        with open(sys.argv[2], "w") as f:
            f.write("ready\n")
    tokens = [struct.pack("=Q", v) for v in (0, 1, 1 << 40, (1 << 64) - 1)]
    tokens += [b"", b"x", os.urandom(64)]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sent = 0
    seen = set()
    while time.monotonic() < until:
        names = wake_sockets()
        if seen and not names:
            break  # the job is over
        for name in names:
            seen.add(name)
            for t in tokens:
                try:
                    s.sendto(t, "\0" + name)
                    sent += 1
                except OSError:
                    pass
        time.sleep(0.001)
    print("datagrams: %d sent to %d socket(s)" % (sent, len(seen)), flush=True)
    return 0 if sent else 1


if __name__ == "__main__":
    sys.exit(main())
