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

# start_all DIR ID... — one worker for each id.
start_all() {
    local dir=$1 id
    shift
    for id in "$@"; do start "$dir" "$id"; done
}

# case_dir NAME — a fresh directory for a case, with its rendezvous.
case_dir() {
    mkdir -p "$work/$1/rdv" && echo "$work/$1"
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

# finished DIR "GEN SIZE" ID... — the workers all exit 0 and agree on the
# step and the weights, in generation GEN of SIZE ranks.
finished() {
    local dir=$1 want=$2
    shift 2
    finish "$dir" "$@" && [ "$(agree_done "$dir" "$@")" = "$want" ]
}

# run_case NAME DESCRIPTION — case_NAME in a fresh directory, reported.
run_case() {
    local d ok=1
    d=$(case_dir "$1")
    "case_$1" "$d" || ok=0
    report "$1: $2" $ok "$d"
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

# printed DIR LINE... — whether each line starts a line of its worker's
# output (the worker is the line's second word: "JOIN localhost:1 2 1 2").
printed() {
    local dir=$1 line id
    shift
    for line in "$@"; do
        id=${line#* }
        id=${id%% *}
        grep -q "^$line" "$dir/out.$id" || return 1
    done
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
    local d=$1 ok=1
    touch "$d/kill.localhost:2.3"
    publish "$d" 1 start localhost:0 localhost:1 localhost:2
    start_all "$d" localhost:0 localhost:1 localhost:2
    # The launcher learns of the death from the process.
    { wait "$(cat "$d/pid.localhost:2")"; } 2>/dev/null
    publish "$d" 2 failure localhost:0 localhost:1
    finished "$d" "2 2" localhost:0 localhost:1 || ok=0
    printed "$d" "LOST localhost:0 3" "LOST localhost:1 3" \
        "JOIN localhost:1 2 1 2" || ok=0
    [ $ok = 1 ]
}

case_added() {
    local d=$1 ok=1
    publish "$d" 1 start localhost:0 localhost:1
    start "$d" localhost:0 "$d/timeline.json"
    start "$d" localhost:1
    wait_progress "$d" 3 localhost:0 localhost:1 || ok=0
    publish "$d" 2 added localhost:0 localhost:1 127.0.0.1:0
    start "$d" 127.0.0.1:0
    finished "$d" "2 3" localhost:0 localhost:1 127.0.0.1:0 || ok=0
    printed "$d" "UPDATED localhost:0 2" "JOIN 127.0.0.1:0 2 2 3" || ok=0
    # The timeline of the last generation is marked with it.
    "$python3" "$src/tools/kolo-timeline" summary "$d/timeline.json" \
        > "$d/summary" 2>&1 || ok=0
    grep -q "rank 0: generation 2: 3 ranks (added)" "$d/summary" || ok=0
    [ $ok = 1 ]
}

case_removed() {
    local d=$1 ok=1
    publish "$d" 1 start localhost:0 localhost:1 localhost:2
    start_all "$d" localhost:0 localhost:1 localhost:2
    wait_progress "$d" 3 localhost:0 localhost:1 localhost:2 || ok=0
    publish "$d" 2 removed localhost:0 localhost:2
    finish "$d" localhost:0 localhost:1 localhost:2 || ok=0
    printed "$d" "UPDATED localhost:1 1" "REMOVED localhost:1" \
        "JOIN localhost:2 2 1 2" || ok=0
    [ "$(agree_done "$d" localhost:0 localhost:2)" = "2 2" ] || ok=0
    [ $ok = 1 ]
}

case_ended() {
    local d=$1 ok=1
    start "$d" localhost:0
    sleep 0.5
    printf 'fewer than --min-np 2 ranks for 1 s\n' > "$d/rdv/elastic.end"
    finish "$d" localhost:0 && ok=0
    grep -q "kolorun ended the elastic job: fewer than --min-np 2" "$d/out.localhost:0" || ok=0
    [ $ok = 1 ]
}

case_overtaken() {
    local d=$1 ok=1
    publish "$d" 1 start localhost:0 localhost:1
    start "$d" localhost:0 # localhost:1 never comes
    sleep 1
    publish "$d" 2 removed localhost:0
    finished "$d" "2 1" localhost:0 || ok=0
    printed "$d" "JOIN localhost:0 2 0 1" || ok=0
    grep -q "generation 2 of the elastic job was published while generation 1 formed" \
        "$d/out.localhost:0" || ok=0
    [ $ok = 1 ]
}

run_case failure "a SIGKILLed worker, the survivors re-form"
run_case overtaken "a generation published while one forms is joined instead"
run_case added "a second host joins at a commit"
run_case removed "the left-out worker is told, the others go on"
run_case ended "a waiting worker learns why the job ended"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
