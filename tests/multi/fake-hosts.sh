#!/bin/sh
# fake-hosts.sh — plays KOLO_TEST_HOSTS hosts on one machine for the rank it
# starts: rank r is on host r / (KOLO_SIZE / KOLO_TEST_HOSTS). Only the
# placement changes (KOLO_CROSS_*, KOLO_LOCAL_*): every rank still reaches
# the others over loopback, and the runtime treats ranks of one "host" as
# sharing memory. tests/hosts/ runs real separate network namespaces.
#
# Usage: kolorun -np N tests/multi/fake-hosts.sh PROGRAM ARGS...
hosts=${KOLO_TEST_HOSTS:-2}
per=$((KOLO_SIZE / hosts))
if [ $((per * hosts)) -ne "$KOLO_SIZE" ]; then
    echo "fake-hosts.sh: $KOLO_SIZE ranks do not split into $hosts hosts" >&2
    exit 2
fi
KOLO_CROSS_RANK=$((KOLO_RANK / per))
KOLO_CROSS_SIZE=$hosts
KOLO_LOCAL_RANK=$((KOLO_RANK % per))
KOLO_LOCAL_SIZE=$per
export KOLO_CROSS_RANK KOLO_CROSS_SIZE KOLO_LOCAL_RANK KOLO_LOCAL_SIZE
exec "$@"
