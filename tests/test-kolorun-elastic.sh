#!/usr/bin/env bash
# test-kolorun-elastic.sh — kolorun's elastic driver, with real processes.
#
#   tests/test-kolorun-elastic.sh [path/to/kolorun]      (default ./kolorun)
#
# The workers are a small shell program (written below) that plays the
# runtime's part of the contract (ELASTIC-CONTRACT.md, §1 and §2): it reads
# KOLO_ELASTIC_ID, reads elastic.generation and elastic.G.members from the
# file:DIR rendezvous, logs its rank in each generation it sees (or that it
# was removed, or that the job ended), and fails or finishes when a file
# appears. So these test the launcher alone; the tests with the real
# runtime are elsewhere. Hosts localhost and 127.0.0.1 are two hosts of
# this machine. Every case runs kolorun under `timeout`, so a hang fails
# the case, and checks that no rendezvous directory is left behind.
# Prints "ok - ..." or "FAIL - ..." per case, then "N passed, M failed".
# The scripts are single-quoted on purpose: they expand in the workers.
# shellcheck disable=SC2016
set -u

. "$(dirname "$0")/script-lib.sh"
skip_if_sanitized thread "kolorun has one thread and these ranks are shell commands: nothing for ThreadSanitizer to see (the plain and ASan suites run this)"
kolorun_cases test-kolorun-elastic "${1:-}"
unset KOLO_HOSTNAME KOLO_RENDEZVOUS HOROVOD_ELASTIC_TIMEOUT
# D: what the workers leave for the checks: log, env
W=$WORK/worker.sh

cat >"$W" <<'WORKER'
#!/bin/bash
# One worker: logs "ID gen G rank R size S UPDATE" for each generation that
# includes it, "ID removed G" (and exits 0) for one that does not, "ID end
# TEXT" (and exits 1) once elastic/end is there. Fails (exit 3) when
# $D/fail.HOST_SLOT appears (removing it, so that a later worker of the
# same id does not fail too), exits 4 when $D/failall appears, and 0 when
# $D/finish does.
dir=${KOLO_RENDEZVOUS#file:}
id=$KOLO_ELASTIC_ID
safe=$(echo "$id" | tr ':' '_')
echo "$id env $KOLO_RANK $KOLO_SIZE $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_CROSS_RANK $KOLO_CROSS_SIZE $KOLO_HOSTNAME $KOLO_ELASTIC $HOROVOD_ELASTIC $KOLO_ELASTIC_TIMEOUT" >>"$D/env"
last=0
while :; do
    if [ -e "$dir/elastic.end" ]; then
        echo "$id end $(cat "$dir/elastic.end")" >>"$D/log"
        exit 1
    fi
    g=$(cat "$dir/elastic.generation" 2>/dev/null)
    if [ -n "$g" ] && [ "$g" != "$last" ]; then
        r=$(grep -n -x -F "$id" "$dir/elastic.$g.members" | cut -d: -f1)
        if [ -z "$r" ]; then
            echo "$id removed $g" >>"$D/log"
            exit 0
        fi
        echo "$id gen $g rank $((r - 1)) size $(wc -l <"$dir/elastic.$g.members") $(cat "$dir/elastic.$g.update")" >>"$D/log"
        last=$g
    fi
    if [ -e "$D/fail.$safe" ]; then
        rm -f "$D/fail.$safe"
        echo "$id failing" >>"$D/log"
        exit 3
    fi
    [ -e "$D/failall" ] && exit 4
    [ -e "$D/finish" ] && exit 0
    sleep 0.05
done
WORKER
chmod +x "$W"

rc=
pid=

begin() {
    name=$1
    why=
    rc=
    rm -rf "$D" "${TMPDIR:?}"/*
    mkdir -p "$D"
    touch "$D/log" "$D/env"
}

eq() { [ "$1" = "$2" ]; }
has() { grep -q -e "$2" "$1"; }
hasnt() { ! grep -q -e "$2" "$1"; }

end() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    pid=
    case_end 12 || {
        echo "    workers' log:"
        head -n 16 "$D/log" 2>/dev/null | cut -c1-200 | sed 's/^/      | /'
    }
}

# start ARGS...: kolorun ARGS in the background, at most 40 s.
start() {
    timeout -k 5 40 "$KOLORUN" "$@" >"$OUT" 2>"$ERR" </dev/null &
    pid=$!
}

# finish: waits for the background kolorun; its status in $rc.
finish() {
    wait "$pid"
    rc=$?
    pid=
}

# kr ARGS...: kolorun ARGS in the foreground, at most 40 s.
kr() {
    timeout -k 5 40 "$KOLORUN" "$@" >"$OUT" 2>"$ERR" </dev/null
    rc=$?
}

# waitfor PATTERN [COUNT] [SECONDS]: until the workers' log has COUNT (1)
# lines matching PATTERN, at most SECONDS (15); fails otherwise.
waitfor() {
    local n=${2:-1} t=$((${3:-15} * 20))
    while [ "$(grep -c -e "$1" "$D/log")" -lt "$n" ]; do
        t=$((t - 1))
        [ "$t" -gt 0 ] || return 1
        sleep 0.05
    done
}

hosts() { printf '%s\n' "$@" >"$D/hosts.new" && mv "$D/hosts.new" "$D/hosts"; }

begin "fixed hosts: a failure blacklists its host; the survivors keep their order"
start -H localhost:2,127.0.0.1:2 -np 2 --min-np 2 "$W"
expect "generation 1 has all 4 slots (-np 2 only asks for 2 to start)" waitfor " gen 1 .* size 4 start" 4
expect "localhost:0's environment (rank size local cross, host, elastic, timeout)" \
    has "$D/env" "^localhost:0 env 0 4 0 2 0 2 localhost 1 1 600$"
expect "127.0.0.1:1's environment" has "$D/env" "^127.0.0.1:1 env 3 4 1 2 1 2 127.0.0.1 1 1 600$"
touch "$D/fail.localhost_0"
expect "127.0.0.1:0 is rank 0 of generation 2 (failure)" waitfor "^127.0.0.1:0 gen 2 rank 0 size 2 failure$"
expect "127.0.0.1:1 is rank 1 of generation 2" waitfor "^127.0.0.1:1 gen 2 rank 1 size 2 failure$"
touch "$D/finish"
finish
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "localhost:1 was stopped with its host, before seeing generation 2" hasnt "$D/log" "^localhost:1 \(gen 2\|removed\)"
expect "the failure is named" has "$ERR" "^kolorun: rank 0 of generation 1 (localhost:0, pid [0-9]*) exited with status 3$"
expect "the host is blacklisted" has "$ERR" "^kolorun: blacklisting host localhost; stopping its other workers$"
expect "generation 2 is announced" has "$ERR" "^kolorun: generation 2 (failure): 2 ranks: 127.0.0.1:0 127.0.0.1:1$"
end

begin "discovery: a host added (new slots appended), then a host removed"
hosts localhost:2
start --host-discovery-script "cat $D/hosts" -np 2 --min-np 2 --max-np 4 "$W"
expect "generation 1: localhost's 2 slots" waitfor " gen 1 .* size 2 start" 2
hosts localhost:2 127.0.0.1:2
expect "localhost:0 stays rank 0 in generation 2 (added)" waitfor "^localhost:0 gen 2 rank 0 size 4 added$"
expect "127.0.0.1:1 is rank 3 of generation 2" waitfor "^127.0.0.1:1 gen 2 rank 3 size 4 added$"
expect "the new worker 127.0.0.1:0 starts as rank 2 of 4 (local 0 of 2, cross 1 of 2)" \
    has "$D/env" "^127.0.0.1:0 env 2 4 0 2 1 2 127.0.0.1 1 1 600$"
hosts 127.0.0.1:2
expect "127.0.0.1:0 is rank 0 of generation 3 (removed)" waitfor "^127.0.0.1:0 gen 3 rank 0 size 2 removed$"
expect "localhost's workers learn they were removed" waitfor "^localhost:[01] removed 3$" 2
touch "$D/finish"
finish
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "no warning" hasnt "$ERR" "warning"
end

begin "--max-np: the newest host's slots are cut first"
start -H localhost:2,127.0.0.1:2 -np 1 --min-np 1 --max-np 3 "$W"
expect "generation 1 has 3 ranks, 127.0.0.1:0 last" waitfor "^127.0.0.1:0 gen 1 rank 2 size 3 start$"
sleep 0.5
touch "$D/finish"
finish
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "127.0.0.1:1 never started" hasnt "$D/env" "^127.0.0.1:1"
end

begin "every rank fails: non-zero, one line naming them"
start -H localhost:1,127.0.0.1:1 -np 2 --min-np 1 "$W"
expect "generation 1 starts" waitfor " gen 1 " 2
touch "$D/failall"
finish
expect "exit status 4, the first failed rank's (got $rc)" eq "$rc" 4
expect "one line names both" has "$ERR" "^kolorun: every rank failed: rank [01] ([a-z0-9.]*:0, pid [0-9]*) exited with status 4; rank [01] ([a-z0-9.]*:0, pid [0-9]*) exited with status 4$"
expect "no generation 2" hasnt "$ERR" "generation 2"
end

begin "--reset-limit 1: the second reset ends the job; with 2 it goes on"
hosts localhost:1
start --host-discovery-script "cat $D/hosts" -np 1 --min-np 1 --reset-limit 1 "$W"
expect "generation 1" waitfor "^localhost:0 gen 1 "
hosts localhost:1 127.0.0.1:1
expect "generation 2 (reset 1)" waitfor "^127.0.0.1:0 gen 2 rank 1 size 2 added$"
hosts 127.0.0.1:1
finish
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "one line says why" has "$ERR" "^kolorun: the job needs another reset (removed), and --reset-limit 1 allows no more$"
expect "the workers read elastic/end" has "$D/log" "^127.0.0.1:0 end the job needs another reset"
expect "no generation 3" hasnt "$D/log" " gen 3 "
rm -f "$D/log" "$D/env" && touch "$D/log" "$D/env"
rm -f "${TMPDIR:?}"/*
hosts localhost:1
start --host-discovery-script "cat $D/hosts" -np 1 --min-np 1 --reset-limit 2 "$W"
expect "generation 1 (limit 2)" waitfor "^localhost:0 gen 1 "
hosts localhost:1 127.0.0.1:1
expect "generation 2 (limit 2)" waitfor "^127.0.0.1:0 gen 2 rank 1 size 2 added$"
hosts 127.0.0.1:1
expect "generation 3 (limit 2)" waitfor "^127.0.0.1:0 gen 3 rank 0 size 1 removed$"
touch "$D/finish"
finish
expect "limit 2: exit status 0 (got $rc)" eq "$rc" 0
end

begin "fewer than --min-np for longer than --elastic-timeout: the job ends"
start -H localhost:2,127.0.0.1:2 -np 4 --min-np 4 --elastic-timeout 2 "$W"
expect "generation 1" waitfor " gen 1 " 4
touch "$D/fail.localhost_1"
finish
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "it says it waits" has "$ERR" "^kolorun: 2 slots available, fewer than --min-np 4: waiting up to 2 s for more$"
expect "one line says why it ended" has "$ERR" "^kolorun: fewer than --min-np 4 ranks for 2 s$"
expect "the survivors read elastic/end" waitfor "^127.0.0.1:[01] end fewer than --min-np 4" 2 1
end

begin "too few slots at the start for --elastic-timeout: an error"
start --host-discovery-script "echo localhost:1" -np 2 --elastic-timeout 1 "$W"
finish
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "one line says why" has "$ERR" "^kolorun: timed out after 1 s waiting for -np 2 slots (the hosts offer 1)$"
expect "no worker started" eq "$(cat "$D/env")" ""
end

begin "a discovery script that prints garbage, then fails: one warning each, the job goes on"
hosts localhost:1
start --host-discovery-script "cat $D/hosts" -np 1 "$W"
expect "generation 1" waitfor "^localhost:0 gen 1 "
hosts localhost:1 'bad host!'
sleep 3
rm "$D/hosts"
sleep 3
hosts localhost:1 127.0.0.1:1
expect "then a good list adds a host" waitfor "^127.0.0.1:0 gen 2 rank 1 size 2 added$"
touch "$D/finish"
finish
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "one warning for the garbage (said $(grep -c "not understand" "$ERR"))" \
    eq "$(grep -c "^kolorun: warning: the host discovery script 'cat .*' printed a line kolorun does not understand ('bad host!' is not a host name kolorun can use); keeping the hosts it gave before$" "$ERR")" 1
expect "one warning for the failure (said $(grep -c "exited with" "$ERR"))" \
    eq "$(grep -c "^kolorun: warning: the host discovery script 'cat .*' exited with status 1; keeping the hosts it gave before$" "$ERR")" 1
expect "no generation from the bad lists" hasnt "$ERR" "removed"
end

begin "a discovery script that fails from the start: an error after --elastic-timeout"
kr --host-discovery-script "exit 3" --min-np 1 --elastic-timeout 2 "$W"
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "one warning" eq "$(grep -c "^kolorun: warning: the host discovery script 'exit 3' exited with status 3; no hosts yet$" "$ERR")" 1
expect "then why it ends" has "$ERR" "^kolorun: timed out after 2 s waiting for -np 1 slots (the hosts offer 0)$"
end

begin "--blacklist-cooldown-range: the host comes back after its cooldown, as added"
start -H localhost:1,127.0.0.1:1 -np 1 --min-np 1 --blacklist-cooldown-range 1 1 "$W"
expect "generation 1" waitfor " gen 1 " 2
touch "$D/fail.localhost_0"
expect "generation 2 without localhost" waitfor "^127.0.0.1:0 gen 2 rank 0 size 1 failure$"
expect "generation 3: localhost back, after the survivor" waitfor "^localhost:0 gen 3 rank 1 size 2 added$" 1 10
touch "$D/finish"
finish
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "the cooldown is said" has "$ERR" "^kolorun: blacklisting host localhost for 1.0 s$"
end

begin "the command line: what goes with what"
bad() {
    local what=$1
    shift
    kr "$@" true
    expect "$* -> status 2 (got $rc)" eq "$rc" 2
    expect "$* -> one line: $what (said: $(head -c 300 "$ERR"))" eq "$(grep -c "^kolorun: .*$what" "$ERR")/$(wc -l <"$ERR")" 1/1
}
bad "--mpi cannot run an elastic job" --mpi -np 2 --min-np 1
bad "--max-np only goes with an elastic job" -np 2 --max-np 4
bad "--blacklist-cooldown-range wants two whole numbers" -H localhost:2 --min-np 1 --blacklist-cooldown-range 0 5
bad "--min-np 3 is more than -np 2" -H localhost:4 -np 2 --min-np 3
bad "give --host-discovery-script or -H/--hostfile, not both" -H localhost:2 --host-discovery-script true --min-np 1
bad "an elastic job needs its hosts" -np 2 --min-np 1
bad "--elastic-timeout wants a whole number" --host-discovery-script true --min-np 1 --elastic-timeout x
kr --help
for f in --min-np --max-np --host-discovery-script --slots-per-host --elastic-timeout --reset-limit --blacklist-cooldown-range; do
    expect "--help explains $f" has "$OUT" "^  $f"
done
end

begin "Redis rendezvous (--start-redis): the records are SET under the job's name, behind the job's password, with its MAC"
if command -v redis-server >/dev/null; then
    # The worker derives the server's password and the records' MACs from
    # KOLO_SECRET as README and runtime/auth.c say, on its own.
    cat >"$WORK/redis-worker.py" <<'RW'
import hashlib, hmac, os, socket, sys, time
secret = os.environ["KOLO_SECRET"].encode()
r = os.environ["KOLO_RENDEZVOUS"][len("redis:"):]
hp, job = r.split("/", 1)
host, port = hp.rsplit(":", 1)
key = hashlib.sha256(b"kolo job secret v1\0" + secret).digest()
def derive(label, data):
    return hmac.new(key, label.encode() + b"\0" + data, hashlib.sha256).digest()
def call(f, s, *args):
    s.sendall(b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    line = f.readline().strip()
    if line.startswith(b"$"):
        n = int(line[1:])
        return None if n < 0 else f.read(n + 2)[:-2]
    return line
def get(f, s, name):
    v = call(f, s, b"GET", (job + "/" + name).encode())
    if v is None:
        return None
    mac = hmac.new(derive("kolo store entry", job.encode()),
                   name.encode() + b"\0" + v[:-64], hashlib.sha256).hexdigest()
    if v[-64:].decode() != mac:
        sys.exit("%s: not the job's MAC" % name)
    return v[:-64].decode()
s = socket.create_connection((host, int(port)))
f = s.makefile("rb")
if not call(f, s, b"GET", b"x").startswith(b"-NOAUTH"):
    sys.exit("the server answered without a password")
pw = derive("kolo redis password", b"").hex().encode()
if call(f, s, b"AUTH", pw) != b"+OK":
    sys.exit("the derived password was refused")
for _ in range(100):
    g = get(f, s, "elastic/generation")
    if g:
        members = get(f, s, "elastic/%s/members" % g).replace("\n", " ")
        update = get(f, s, "elastic/%s/update" % g)
        with open(os.environ["D"] + "/log", "a") as out:
            out.write("%s gen %s %s%s\n" % (os.environ["KOLO_ELASTIC_ID"], g,
                                            members, update))
        sys.exit(0)
    time.sleep(0.1)
sys.exit(5)
RW
    kr --start-redis -H localhost:1,127.0.0.1:1 --min-np 1 /usr/bin/env python3 "$WORK/redis-worker.py"
    expect "exit status 0 (got $rc: $(head -c 300 "$ERR"))" eq "$rc" 0
    expect "both read generation 1 from Redis" eq "$(grep -c "^[a-z0-9.]*:0 gen 1 localhost:0 127.0.0.1:0  *start$" "$D/log")" 2
else
    echo "    (no redis-server here: skipped)"
fi
end

begin "SIGTERM to kolorun: the workers stop, no new generation, kolorun ends by SIGTERM"
start -H localhost:1,127.0.0.1:1 --min-np 1 "$W"
expect "generation 1" waitfor " gen 1 " 2
kill -TERM "$pid"
finish
expect "status 143 (got $rc)" eq "$rc" 143
expect "no generation 2" hasnt "$ERR" "generation 2"
end

cases_summary
