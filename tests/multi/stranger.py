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
  impostor  connect, send 64 bytes that look like kolo's old hello with
            another identity, and hold
  hello     connect, send a well-formed hello for the pair of the last
            rank and the struck one (magic, ranks, a fresh nonce), read
            the reply, send a proof made up of random bytes, and hold
  replay    connect to every port of rank R once for each handshake that
            a rank sent rank R in an earlier job with the same secret, as
            captured on the wire (STRANGER_REPLAY: a file of lines "TO
            HEX", written by wire.py), send it, and hold
  flood     open 20 connections to every port, send nothing, hold them
  redis     (kolorun --start-redis) PING, KEYS, GET, SET, CONFIG and a
            made-up AUTH to the job's Redis server: every one refused
  rdv       (torchrun, KOLO_SECRET set) the same to the rendezvous rank
            0 serves, then a well-formed KOLO.HELLO for a guessed job
  overwrite (kolorun --redis, a server with a password the stranger has
            too: STRANGER_REDIS_PASSWORD) writes an address of its own over
            every entry of the job, while the last rank waits to read them

Where it runs as root it finds the ranks' ports, reads rank 0's secret
(KOLO_SECRET, which kolorun gave it) and opens DIR/go first, then strikes
as another user (nobody): as that user it also looks for the secret in
every process's command line and environment it can read, and tries to
list the rendezvous directory; each one found or listed fails the run.

Held connections are kept until the job closes them (the connection phase
is over) or until the bound; it reports how many the job closed, and
whether any byte beyond a handshake reply came back. Prints one line
"stranger: MODE: N listening port(s) found, rank(s) R struck ..." and
exits 0 when it struck every rank but the last (and, when it held
connections, the job closed them all), 1 otherwise. It never leaves the
last rank waiting: it writes DIR/go whatever happens (while the rank
reads it, within the bound, STRANGER_BOUND seconds, 60 by default).
"""
import errno
import os
import pwd
import select
import socket
import struct
import sys
import time

# auth.h: the hello (magic, from, to, nonce) and what answers it.
HELLO_BYTES, REPLY_BYTES, PROOF_BYTES = 48, 64, 32

BOUND = float(os.environ.get("STRANGER_BOUND", "60"))


def listening_inodes(pid):
    """inode -> (address, port) of every TCP socket in LISTEN state in the
    network namespace of process pid (the stranger may be in another)."""
    out = {}
    for path, family in (("/proc/%d/net/tcp" % pid, socket.AF_INET),
                         ("/proc/%d/net/tcp6" % pid, socket.AF_INET6)):
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


def open_go(d, deadline):
    """The write end of DIR/go once the last rank reads it (bounded), or
    None."""
    path = os.path.join(d, "go")
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:
                return None
            time.sleep(0.05)  # no reader yet


def release(fd):
    """Lets the last rank go."""
    if fd is None:
        return False
    try:
        os.write(fd, b"go\n")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def become_nobody():
    """Drops root for the user nobody; the name of the user it runs as."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    pw = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    return "nobody"


def look_for_secret(secret, rdv_dir):
    """What another user finds of the job: the secret in a readable
    command line or environment, the rendezvous directory's entries."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                with open("/proc/%s/%s" % (pid, what), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if secret and secret.encode() in data:
                found.append("the secret in /proc/%s/%s" % (pid, what))
    if rdv_dir:
        try:
            found.append("the rendezvous directory's entries %s"
                         % os.listdir(rdv_dir)[:3])
        except OSError:
            pass
    return found


def replays_for(rank):
    """The captured handshakes to send to `rank` (STRANGER_REPLAY)."""
    out = []
    path = os.environ.get("STRANGER_REPLAY", "")
    with open(path) as f:
        for line in f:
            to, hexa = line.split()
            if int(to) == rank:
                out.append(bytes.fromhex(hexa))
    return out


def resp(*args):
    """A request in Redis's protocol."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def ask(f, s, *args):
    """Sends one request; its reply's first line (b"" when closed)."""
    try:
        s.sendall(resp(*args))
        line = f.readline()
        if line.startswith(b"$") and int(line[1:]) >= 0:
            f.read(int(line[1:]) + 2)
        return line.strip()
    except (OSError, ValueError):
        return b""


def overwrite(host, port, password, job):
    """Someone who has the Redis server's password but not the job's
    secret: writes an address of theirs over every entry of the job.
    Returns what went wrong (a list)."""
    try:
        s = socket.create_connection((host, port), timeout=10)
    except OSError as e:
        return ["cannot reach Redis at %s:%d: %s" % (host, port, e)]
    f = s.makefile("rb")
    if ask(f, s, "AUTH", password) != b"+OK":
        return ["the Redis server refused the password"]
    s.sendall(resp("KEYS", job + "/*"))
    n = int(f.readline()[1:])
    keys = []
    for _ in range(n):
        ln = int(f.readline()[1:])
        keys.append(f.read(ln + 2)[:-2])
    for k in keys:
        ask(f, s, b"SET", k, b"127.0.0.1 9")
    s.close()
    return [] if keys else ["no entry of job %s to overwrite" % job]


def rendezvous_strike(mode, host, port):
    """What a stranger gets from the job's rendezvous (the Redis server
    kolorun started, or rank 0's): a list of what should not have
    happened (an answer that is not a refusal)."""
    bad = []
    try:
        s = socket.create_connection((host, port), timeout=10)
    except OSError as e:
        return ["cannot reach the rendezvous at %s:%d: %s" % (host, port, e)]
    f = s.makefile("rb")
    for cmd in (["PING"], ["KEYS", "*"], ["GET", "x"],
                ["SET", "kolo-stranger", "x"], ["EXISTS", "x"],
                ["CONFIG", "GET", "requirepass"],
                ["AUTH", "guess-" + os.urandom(4).hex()], ["KEYS", "*"]):
        reply = ask(f, s, *cmd)
        if not reply.startswith(b"-") and reply != b"":
            bad.append("%s answered %r" % (cmd[0], reply[:40]))
    s.close()
    if mode == "rdv":
        # A well-formed hello, for a job it has to guess.
        s = socket.create_connection((host, port), timeout=10)
        f = s.makefile("rb")
        hello = b"KOLOSTOR" + struct.pack(">II", 0, 0) + os.urandom(32)
        reply = ask(f, s, b"KOLO.HELLO", hello, b"torchrun-guess")
        if not reply.startswith(b"-"):
            bad.append("KOLO.HELLO for a guessed job answered %r" % reply[:40])
        s.close()
    return bad


def strike(mode, targets, held, struck, np):
    """Hits every (rank, family, addr, port) of targets as MODE says,
    appending the connections it holds to held and the ranks it reached
    to struck."""
    # A socket of a pair between two early ranks may stop listening before
    # it is reached: the connection is refused, or, when it was already
    # waiting in the listener's backlog as the listener closed, reset at
    # the first send. Only the ports of the pairs with the last rank listen
    # until it is released, and every early rank has some.
    for rank, family, addr, port in sorted(set(targets)):
        replays = replays_for(rank) if mode == "replay" else []
        times = {"flood": 20, "replay": len(replays)}.get(mode, 1)
        for i in range(times):
            try:
                s = socket.create_connection((addr, port), timeout=10)
            except OSError:
                break
            try:
                if mode == "garbage":
                    s.sendall(b"GET")
                elif mode == "impostor":
                    s.sendall(b"KOLOPAIR" + bytes(range(56)))
                elif mode == "hello":
                    s.sendall(b"KOLOPAIR" + struct.pack(">II", np - 1, rank) +
                              os.urandom(32))
                    s.settimeout(5)
                    reply = b""
                    try:
                        while len(reply) < REPLY_BYTES:
                            part = s.recv(REPLY_BYTES - len(reply))
                            if not part:
                                break
                            reply += part
                    except OSError:
                        pass  # dropped as soon as it read the hello
                    # The ring's socket answers only its left neighbour's
                    # hello (KOLORING): nothing comes back there.
                    if len(reply) == REPLY_BYTES:
                        s.sendall(os.urandom(PROOF_BYTES))
                elif mode == "replay":
                    s.sendall(replays[i])  # one handshake per connection
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
    stable = None
    # Wait until every early rank listens (Gloo creates its pairs, and
    # their listening sockets, before it waits for the last rank's address).
    while time.monotonic() < deadline:
        targets = []
        ready = True
        for r in early:
            pid = read_pid(d, r)
            ports = ports_of(pid, listening_inodes(pid)) if pid else []
            if not ports:
                ready = False
            targets += [(r,) + p for p in ports]
        # Ready when every early rank listens and the ports have not
        # changed for a moment (Gloo's pairs listen just after kolo's ring).
        if ready and stable == sorted(targets):
            break
        stable = sorted(targets) if ready else None
        time.sleep(0.2 if ready else 0.05)
    else:
        targets = []
    held = []
    struck = set()
    found = []
    # What rank 0 was given (read as root, before becoming the stranger):
    # its secret, which kolorun drew, and its rendezvous directory.
    secret = ""
    rdv_dir = ""
    rdv = None  # (host, port) of the job's Redis server or rank 0's
    job = ""
    master = {}
    pid0 = read_pid(d, 0)
    try:
        with open("/proc/%d/environ" % pid0, "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"KOLO_RENDEZVOUS=file:"):
                    rdv_dir = var.split(b":", 1)[1].decode()
                elif var.startswith(b"KOLO_RENDEZVOUS=redis:"):
                    hp, job = var.split(b":", 1)[1].decode().split("/", 1)
                    rdv = (hp.rsplit(":", 1)[0], int(hp.rsplit(":", 1)[1]))
                elif var.startswith(b"KOLO_SECRET="):
                    secret = var.split(b"=", 1)[1].decode()
                elif var.startswith((b"MASTER_ADDR=", b"MASTER_PORT=")):
                    k, v = var.decode().split("=", 1)
                    master[k] = v
    except (OSError, TypeError):
        pass
    if mode == "rdv" and len(master) == 2:
        rdv = (master["MASTER_ADDR"], int(master["MASTER_PORT"]) + 1)
    if os.geteuid() == 0 and len(secret) < 16:
        found.append("no KOLO_SECRET in rank 0's environment")
    go = None
    try:
        go = open_go(d, deadline)
        user = become_nobody()
        found = look_for_secret(secret, rdv_dir)
        if mode == "overwrite":
            found += overwrite(rdv[0], rdv[1],
                               os.environ.get("STRANGER_REDIS_PASSWORD", ""),
                               job)
            struck.update(r for r, _, _, _ in targets)
        elif mode in ("redis", "rdv"):
            if rdv is None:
                found.append("no rendezvous server in rank 0's environment")
            else:
                found += rendezvous_strike(mode, *rdv)
                struck.update(r for r, _, _, _ in targets)
        else:
            strike(mode, targets, held, struck, np)
    finally:
        # Whatever happened above, the last rank must not wait for us.
        released = release(go)
    closed = 0
    leaked = 0
    # A hello for the pair (hello, replay) is answered: a nonce and a MAC,
    # nothing of the job. Anything more is a leak.
    allowed = {s: REPLY_BYTES if mode == "replay" else 0 for s in held}
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
            else:
                ok_bytes = min(len(data), allowed[s])
                allowed[s] -= ok_bytes
                leaked += len(data) - ok_bytes
    for s in held:
        s.close()
    line = "stranger (%s): %s: %d listening port(s) found, rank(s) %s " \
        "struck" % (user, mode, len(set(targets)),
                    ",".join(map(str, sorted(struck))) or "no")
    if held:
        line += "; the job closed %d of %d held connection(s)" % (closed,
                                                                 len(held))
    if leaked:
        line += "; %d byte(s) came back beyond the handshake" % leaked
    if found:
        line += "; found " + ", ".join(found)
    if not released:
        line += "; could not release the last rank"
    print(line, flush=True)
    ok = (struck == set(early) and released and closed == len(held) and
          not leaked and not found)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
