#!/usr/bin/env bash
# run-elastic.sh — the runtime's side of an elastic job: workers of
# tests/multi/test-elastic join the generations this script publishes in a
# file rendezvous, exactly as kolorun's elastic mode publishes them
# (runtime/elastic.c: elastic.<g>.members, elastic.<g>.update, then
# elastic.generation). Here the script plays the launcher so that each
# runtime promise is checked on its own; kolorun's elastic mode has tests
# of its own.
#
#   failure   3 workers; one SIGKILLs itself before step 3; generation 2
#             has the other two: they see KOLO_ERR_MEMBERSHIP, restore,
#             re-form at 2 ranks and finish with equal weights
#   added     2 workers on host localhost; after step 3 generation 2 adds
#             a worker on host 127.0.0.1 (a second host): the old ones see
#             kolo_hosts_updated() == 2 at a commit, re-form at 3 ranks
#             (the new one last, across two hosts), all finish equal; the
#             timeline of generation 2 is marked, and kolo-timeline
#             summary lists the mark
#   removed   3 workers; after step 3 generation 2 leaves the middle one
#             out: it gets KOLO_ERR_REMOVED, the others re-form at 2 ranks
#             keeping their order
#   overtaken a worker forms generation 1 while its peer never comes;
#             generation 2 leaves the peer out: kolo_init gives up on 1 at
#             once (KOLO_ERR_MEMBERSHIP, not the start timeout) and joins 2
#   ended     a worker waits for a generation that never comes; the store
#             says the job ended: kolo_init fails at once with the reason
#
# Every run is bounded by `timeout`. Prints one line per case and
# "N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=${KOLO_TOP_BUILDDIR:-.}
src=${KOLO_TOP_SRCDIR:-$here/../..}
prog=$top/tests/multi/test-elastic
python3=${KOLO_PYTHON:-/usr/bin/python3}
limit=${KOLO_TEST_TIMEOUT:-60}
steps=30

if [ ! -x "$prog" ]; then
    echo "run-elastic: '$prog' is not an executable file" >&2
    exit 2
fi

pass=0
fail=0
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-elastic.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

# publish DIR GEN UPDATE MEMBER... — as kolorun does: members and update
# first, each written whole (rename), the generation last.
publish() {
    local dir=$1 gen=$2 update=$3
    shift 3
    printf '%s\n' "$@" > "$dir/rdv/.tmp" && mv "$dir/rdv/.tmp" "$dir/rdv/elastic.$gen.members"
    printf '%s\n' "$update" > "$dir/rdv/.tmp" && mv "$dir/rdv/.tmp" "$dir/rdv/elastic.$gen.update"
    printf '%s\n' "$gen" > "$dir/rdv/.tmp" && mv "$dir/rdv/.tmp" "$dir/rdv/elastic.generation"
}

# start DIR ID [TIMELINE] — one worker, its output in DIR/out.ID.
start() {
    local dir=$1 id=$2 timeline=${3:-}
    (
        [ -n "$timeline" ] && export KOLO_TIMELINE=$timeline
        export KOLO_ELASTIC=1 KOLO_ELASTIC_ID=$id KOLO_HOSTNAME=${id%:*}
        export KOLO_RENDEZVOUS=file:$dir/rdv TEST_DIR=$dir
        export KOLO_ELASTIC_TIMEOUT=$limit KOLO_TIMEOUT_SECONDS=10
        export KOLO_START_TIMEOUT=20 KOLO_RANK=0 KOLO_SIZE=1
        exec timeout -k 5 "$limit" "$prog" "$steps" 40
    ) > "$dir/out.$id" 2>&1 &
    echo $! > "$dir/pid.$id"
}

# wait_progress DIR STEP ID... — until each worker committed STEP.
wait_progress() {
    local dir=$1 step=$2 t=0
    shift 2
    for id in "$@"; do
        while [ "$(cat "$dir/progress.$id" 2>/dev/null || echo 0)" -lt "$step" ]; do
            sleep 0.05
            t=$((t + 1))
            [ $t -gt $((limit * 20)) ] && return 1
        done
    done
}

# finish DIR ID... — waits for the workers; 0 when each exited 0.
finish() {
    local dir=$1 bad=0
    shift
    for id in "$@"; do
        wait "$(cat "$dir/pid.$id")" || bad=1
    done
    return $bad
}

report() {
    local name=$1 ok=$2 dir=$3
    if [ "$ok" = 1 ]; then
        pass=$((pass + 1))
        printf 'PASS %s\n' "$name"
    else
        fail=$((fail + 1))
        printf 'FAIL %s\n' "$name"
        for f in "$dir"/out.*; do
            echo "--- $f"
            tail -20 "$f"
        done
    fi
}

# The DONE lines of ids agree on the step and the weights; prints "gen size".
agree_done() {
    local dir=$1
    shift
    local line first=""
    for id in "$@"; do
        line=$(grep "^DONE $id " "$dir/out.$id") || return 1
        set -- $line
        [ "$3" = "$steps" ] || return 1
        if [ -z "$first" ]; then
            first="$4 $5 $6"
        elif [ "$first" != "$4 $5 $6" ]; then
            return 1
        fi
    done
    echo "${first#* }"
}

case_failure() {
    local d=$work/failure ok=1
    mkdir -p "$d/rdv"
    touch "$d/kill.localhost:2.3"
    publish "$d" 1 start localhost:0 localhost:1 localhost:2
    for id in localhost:0 localhost:1 localhost:2; do start "$d" "$id"; done
    # The launcher learns of the death from the process.
    { wait "$(cat "$d/pid.localhost:2")"; } 2>/dev/null
    publish "$d" 2 failure localhost:0 localhost:1
    finish "$d" localhost:0 localhost:1 || ok=0
    grep -q "^LOST localhost:0 3" "$d/out.localhost:0" || ok=0
    grep -q "^LOST localhost:1 3" "$d/out.localhost:1" || ok=0
    grep -q "^JOIN localhost:1 2 1 2" "$d/out.localhost:1" || ok=0
    [ "$(agree_done "$d" localhost:0 localhost:1)" = "2 2" ] || ok=0
    report "failure: a SIGKILLed worker, the survivors re-form" $ok "$d"
}

case_added() {
    local d=$work/added ok=1
    mkdir -p "$d/rdv"
    publish "$d" 1 start localhost:0 localhost:1
    start "$d" localhost:0 "$d/timeline.json"
    start "$d" localhost:1
    wait_progress "$d" 3 localhost:0 localhost:1 || ok=0
    publish "$d" 2 added localhost:0 localhost:1 127.0.0.1:0
    start "$d" 127.0.0.1:0
    finish "$d" localhost:0 localhost:1 127.0.0.1:0 || ok=0
    grep -q "^UPDATED localhost:0 2" "$d/out.localhost:0" || ok=0
    # The timeline of the last generation is marked with it.
    "$python3" "$src/tools/kolo-timeline" summary "$d/timeline.json" \
        > "$d/summary" 2>&1 || ok=0
    grep -q "rank 0: generation 2: 3 ranks (added)" "$d/summary" || ok=0
    grep -q "^JOIN 127.0.0.1:0 2 2 3" "$d/out.127.0.0.1:0" || ok=0
    [ "$(agree_done "$d" localhost:0 localhost:1 127.0.0.1:0)" = "2 3" ] || ok=0
    report "added: a second host joins at a commit" $ok "$d"
}

case_removed() {
    local d=$work/removed ok=1
    mkdir -p "$d/rdv"
    publish "$d" 1 start localhost:0 localhost:1 localhost:2
    for id in localhost:0 localhost:1 localhost:2; do start "$d" "$id"; done
    wait_progress "$d" 3 localhost:0 localhost:1 localhost:2 || ok=0
    publish "$d" 2 removed localhost:0 localhost:2
    finish "$d" localhost:0 localhost:1 localhost:2 || ok=0
    grep -q "^UPDATED localhost:1 1" "$d/out.localhost:1" || ok=0
    grep -q "^REMOVED localhost:1" "$d/out.localhost:1" || ok=0
    grep -q "^JOIN localhost:2 2 1 2" "$d/out.localhost:2" || ok=0
    [ "$(agree_done "$d" localhost:0 localhost:2)" = "2 2" ] || ok=0
    report "removed: the left-out worker is told, the others go on" $ok "$d"
}

case_ended() {
    local d=$work/ended ok=1
    mkdir -p "$d/rdv"
    start "$d" localhost:0
    sleep 0.5
    printf 'fewer than --min-np 2 ranks for 1 s\n' > "$d/rdv/elastic.end"
    finish "$d" localhost:0 && ok=0
    grep -q "kolorun ended the elastic job: fewer than --min-np 2" "$d/out.localhost:0" || ok=0
    report "ended: a waiting worker learns why the job ended" $ok "$d"
}

case_overtaken() {
    local d=$work/overtaken ok=1
    mkdir -p "$d/rdv"
    publish "$d" 1 start localhost:0 localhost:1
    start "$d" localhost:0 # localhost:1 never comes
    sleep 1
    publish "$d" 2 removed localhost:0
    finish "$d" localhost:0 || ok=0
    grep -q "^JOIN localhost:0 2 0 1" "$d/out.localhost:0" || ok=0
    grep -q "generation 2 of the elastic job was published while generation 1 formed" \
        "$d/out.localhost:0" || ok=0
    [ "$(agree_done "$d" localhost:0)" = "2 1" ] || ok=0
    report "overtaken: a generation published while one forms is joined instead" $ok "$d"
}

case_failure
case_overtaken
case_added
case_removed
case_ended
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
