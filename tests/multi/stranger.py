#!/usr/bin/env python3
"""stranger.py -- a stranger on a Gloo job's listening ports, for
tests/multi/run-stranger.sh.

    stranger.py MODE DIR NP

The job's ranks write their pids to DIR/pid.R; its last rank (NP - 1) waits
in kolo_init (KOLO_TEST_HOLD_CONNECT: after the settings agreement, before
it connects) until a line arrives on the FIFO DIR/go. Meanwhile the
other ranks sit in Gloo's connection phase, each listening for the last
rank. This program waits (bounded) until each of them listens on a TCP
port, strikes every such port, then lets the last rank go. MODE:

  scan      connect and close at once (a port scanner)
  garbage   connect, send 3 bytes and hold the connection
  impostor  connect, send 64 bytes that look like kolo's hello but carry
            another identity, and hold
  flood     open 20 connections to every port, send nothing, hold them

Held connections are kept until the job closes them (the connection phase
is over) or until the bound; it reports how many the job closed. Prints
one line "stranger: MODE: N listening port(s) found, rank(s) R struck ..."
and exits 0 when it struck every rank but the last (and, when it held
connections, the job closed them all), 1 otherwise. It never leaves the
last rank waiting: it writes DIR/go whatever happens (while the rank
reads it, within the bound, STRANGER_BOUND seconds, 60 by default).
"""
import errno
import os
import select
import socket
import sys
import time

BOUND = float(os.environ.get("STRANGER_BOUND", "60"))


def listening_inodes():
    """inode -> (address, port) of every TCP socket in LISTEN state."""
    out = {}
    for path, family in (("/proc/net/tcp", socket.AF_INET),
                         ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            hexaddr, hexport = fields[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints the address as 32-bit words in host order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = socket.inet_ntop(family, raw)
            if addr in ("0.0.0.0", "::"):
                addr = "127.0.0.1" if family == socket.AF_INET else "::1"
            out[fields[9]] = (family, addr, int(hexport, 16))
    return out


def ports_of(pid, inodes):
    found = []
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return found
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            found.append(inodes[link[8:-1]])
    return found


def read_pid(d, rank):
    try:
        with open(os.path.join(d, "pid.%d" % rank)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def release(d, deadline):
    """Writes a line to DIR/go once the last rank reads it (bounded)."""
    path = os.path.join(d, "go")
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:
                return False
            time.sleep(0.05)  # no reader yet
            continue
        try:
            os.write(fd, b"go\n")
        finally:
            os.close(fd)
        return True


def strike(mode, targets, held, struck):
    """Hits every (rank, family, addr, port) of targets as MODE says,
    appending the connections it holds to held and the ranks it reached
    to struck."""
    # A socket of a pair between two early ranks may stop listening before
    # it is reached: the connection is refused, or, when it was already
    # waiting in the listener's backlog as the listener closed, reset at
    # the first send. Only the ports of the pairs with the last rank listen
    # until it is released, and every early rank has some.
    for rank, family, addr, port in sorted(set(targets)):
        for _ in range(20 if mode == "flood" else 1):
            try:
                s = socket.create_connection((addr, port), timeout=10)
            except OSError:
                break
            try:
                if mode == "garbage":
                    s.sendall(b"GET")
                elif mode == "impostor":
                    s.sendall(b"KOLOPAIR" + bytes(range(56)))
            except OSError:
                s.close()  # reset: that listener had closed
                break
            struck.add(rank)
            if mode == "scan":
                s.close()
                continue
            held.append(s)


def main():
    mode, d, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
    deadline = time.monotonic() + BOUND
    early = list(range(np - 1))
    targets = []
    # Wait until every early rank listens (Gloo creates its pairs, and
    # their listening sockets, before it waits for the last rank's address).
    while time.monotonic() < deadline:
        inodes = listening_inodes()
        targets = []
        ready = True
        for r in early:
            pid = read_pid(d, r)
            ports = ports_of(pid, inodes) if pid else []
            if not ports:
                ready = False
            targets += [(r,) + p for p in ports]
        if ready:
            break
        time.sleep(0.05)
    else:
        targets = []
    held = []
    struck = set()
    try:
        strike(mode, targets, held, struck)
    finally:
        # Whatever happened above, the last rank must not wait for us.
        released = release(d, deadline)
    closed = 0
    open_socks = list(held)
    while open_socks and time.monotonic() < deadline:
        ready, _, _ = select.select(open_socks, [], [],
                                    max(0.0, deadline - time.monotonic()))
        for s in ready:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                closed += 1
                open_socks.remove(s)
    for s in held:
        s.close()
    line = "stranger: %s: %d listening port(s) found, rank(s) %s struck" % (
        mode, len(set(targets)), ",".join(map(str, sorted(struck))) or "no")
    if held:
        line += "; the job closed %d of %d held connection(s)" % (closed,
                                                                 len(held))
    if not released:
        line += "; could not release the last rank"
    print(line, flush=True)
    ok = struck == set(early) and released and closed == len(held)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
