#!/usr/bin/env bash
# mpirun.sh — Open MPI's mpirun with the options every test run needs here:
# root may run it (containers), more ranks than cores, no binding of a rank
# to one core (its background thread shares the core with its training
# thread otherwise). Used by run-mpi.sh as the launcher of the multi-rank
# suites, in place of kolorun: mpirun.sh -np N prog args...
opts="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && opts="--allow-run-as-root $opts"
exec "${KOLO_MPIRUN:-mpirun}" $opts "$@"
