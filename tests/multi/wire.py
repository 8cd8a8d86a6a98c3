#!/usr/bin/env python3
"""wire.py -- what a stranger on the wire sees of a Gloo job's handshakes,
for tests/multi/run-stranger.sh.

    wire.py DIR

Captures every TCP segment on the loopback interface (a packet socket:
root only) until the file DIR/stop appears (bounded by WIRE_BOUND
seconds, 120 by default), then puts each connection's two byte streams
back together and looks at those that begin with one of kolo's hellos
("KOLOPAIR": a pair of Gloo's, "KOLORING": kolo's ring). It checks:

  - every handshake is whole: the hello and the proof one way, the reply
    the other (auth.h: 48 + 32 and 64 bytes);
  - no 16 bytes of the part that changes (the nonce, the reply, the
    proof: all but the hello's magic and ranks) appear in another
    connection's handshake: nothing repeats across pairs;
  - the job's secret (WIRE_SECRET) appears nowhere in any captured byte,
    nor the key kolo derives from it (its SHA-256, auth.c).

Only the job's own connections count: other jobs may run on the same
loopback (make -j2 test runs two tests at once). While it captures, it
notes every TCP port held by a process whose environment holds the job's
secret, and keeps the connections with such a port at either end.

It writes DIR/replay: one line "TO HEX" per handshake, the bytes the
connecting rank sent (hello and proof), for stranger.py's replay mode.
Prints "wire: N handshake(s) (P pair(s), R ring), ..." and exits 0 when
every check holds and it saw at least one handshake of each kind, 1
otherwise; 77 when it cannot capture (not root).
"""
import hashlib
import os
import select
import socket
import struct
import sys
import time

HELLO_BYTES, REPLY_BYTES, PROOF_BYTES = 48, 64, 32
ETH_P_ALL = 0x0003
PACKET_HOST = 0


def parse(frame):
    """(src, sport, dst, dport, seq, flags, payload) of an IPv4 or IPv6 TCP
    segment in an Ethernet frame (loopback has an all-zero header), or
    None."""
    if len(frame) < 14:
        return None
    ethertype = struct.unpack(">H", frame[12:14])[0]
    ip = frame[14:]
    if ethertype == 0x0800 and len(ip) >= 20:
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        if ip[9] != 6:
            return None
        src, dst = ip[12:16], ip[16:20]
        tcp = ip[ihl:total]
    elif ethertype == 0x86DD and len(ip) >= 40:
        if ip[6] != 6:
            return None
        plen = struct.unpack(">H", ip[4:6])[0]
        src, dst = ip[8:24], ip[24:40]
        tcp = ip[40:40 + plen]
    else:
        return None
    if len(tcp) < 20:
        return None
    sport, dport, seq = struct.unpack(">HHI", tcp[0:8])
    off = (tcp[12] >> 4) * 4
    flags = tcp[13]
    return src, sport, dst, dport, seq, flags, bytes(tcp[off:])


def streams(segments):
    """(src, sport, dst, dport) -> the bytes sent that way, in order."""
    by_dir = {}
    for src, sport, dst, dport, seq, flags, payload in segments:
        d = by_dir.setdefault((src, sport, dst, dport), {"isn": None, "data": {}})
        if flags & 0x02:  # SYN: the first byte is isn + 1
            d["isn"] = seq
        if payload:
            d["data"][seq] = payload
    out = {}
    for key, d in by_dir.items():
        if d["isn"] is None or not d["data"]:
            continue
        buf = bytearray()
        want = (d["isn"] + 1) & 0xFFFFFFFF
        chunks = d["data"]
        while want in chunks:
            buf += chunks[want]
            want = (want + len(chunks[want])) & 0xFFFFFFFF
        out[key] = bytes(buf)
    return out


def job_ports(secret):
    """The local TCP ports of every socket held by a process whose
    environment holds the job's secret."""
    inode_port = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                for line in f.read().splitlines()[1:]:
                    fields = line.split()
                    inode_port[fields[9]] = int(fields[1].split(":")[1], 16)
        except OSError:
            pass
    ports = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if b"KOLO_SECRET=" + secret not in f.read():
                    continue
            for fd in os.listdir("/proc/%s/fd" % pid):
                link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if link.startswith("socket:[") and link[8:-1] in inode_port:
                    ports.add(inode_port[link[8:-1]])
        except OSError:
            pass
    return ports


def main():
    d = sys.argv[1]
    bound = float(os.environ.get("WIRE_BOUND", "120"))
    secret = os.environ.get("WIRE_SECRET", "").encode()
    if os.geteuid() != 0:
        print("wire: not root: no packet capture")
        return 77
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                             socket.htons(ETH_P_ALL))
        sock.bind(("lo", 0))
    except OSError as e:
        print("wire: cannot capture on lo: %s" % e)
        return 77
    try:  # as root, past net.core.rmem_max: no frame of the job lost
        sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    with open(os.path.join(d, "capturing"), "w") as f:
        f.write("yes\n")
    segments = []
    raw = []
    deadline = time.monotonic() + bound
    stop = os.path.join(d, "stop")
    ours = set()
    looked = 0.0
    while time.monotonic() < deadline:
        if secret and time.monotonic() - looked > 0.05:
            ours |= job_ports(secret)
            looked = time.monotonic()
        ready, _, _ = select.select([sock], [], [], 0.1)
        if ready:
            frame, addr = sock.recvfrom(1 << 16)
            if addr[2] != PACKET_HOST:  # loopback shows each frame twice
                continue
            seg = parse(frame)
            if seg is not None:
                segments.append(seg)
        elif os.path.exists(stop):
            break
    sock.close()

    segments = [g for g in segments if g[1] in ours or g[3] in ours]
    raw = [g[6] for g in segments if g[6]]
    flows = streams(segments)
    problems = []
    shakes = []  # (kind, to, sent, reply)
    for (src, sport, dst, dport), sent in flows.items():
        kind = sent[:8]
        if kind not in (b"KOLOPAIR", b"KOLORING"):
            continue
        to = struct.unpack(">I", sent[12:16])[0]
        reply = flows.get((dst, dport, src, sport), b"")[:REPLY_BYTES]
        hs = sent[:HELLO_BYTES + PROOF_BYTES]
        if len(hs) < HELLO_BYTES + PROOF_BYTES or len(reply) < REPLY_BYTES:
            problems.append("a %s handshake to rank %d is not whole (%d "
                            "bytes sent, %d answered)"
                            % (kind.decode(), to, len(hs), len(reply)))
            continue
        shakes.append((kind, to, hs, reply))
    varying = [hs[16:] + reply for _, _, hs, reply in shakes]
    for i, a in enumerate(varying):
        for j, b in enumerate(varying):
            if i >= j:
                continue
            for k in range(0, len(a) - 15):
                if a[k:k + 16] in b:
                    problems.append("bytes %d.. of handshake %d appear in "
                                    "handshake %d" % (k, i, j))
                    break
    key = hashlib.sha256(b"kolo job secret v1\0" + secret).digest()
    everything = b"".join(raw)
    if secret and secret in everything:
        problems.append("the job's secret crossed the wire")
    if key in everything:
        problems.append("the job's key crossed the wire")
    with open(os.path.join(d, "replay"), "w") as f:
        for _, to, hs, _ in shakes:
            f.write("%d %s\n" % (to, hs.hex()))
    pairs = sum(1 for s in shakes if s[0] == b"KOLOPAIR")
    rings = len(shakes) - pairs
    if not pairs or not rings:
        problems.append("not a handshake of each kind was seen")
    print("wire: %d handshake(s) (%d pair(s), %d ring), %d segment(s), "
          "%d byte(s) captured%s" % (len(shakes), pairs, rings, len(segments),
                                     len(everything),
                                     "; " + "; ".join(problems[:5])
                                     if problems else ""), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
