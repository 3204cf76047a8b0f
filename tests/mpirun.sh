#!/bin/sh
# Runs a test program as N ranks of one MPI job on this machine:
#   mpirun.sh MPIRUN N PROGRAM [ARGS...]
# --oversubscribe: CI has 2 cores and may run other tests beside. The
# shared-memory and self transports only: the ranks are on one machine, and
# Open MPI then does not probe network devices (which a container may lack).
# Open MPI refuses to run as root without the two variables; the tests run
# as root in CI.
set -eu
mpirun=$1
n=$2
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$mpirun" --oversubscribe -np "$n" --mca btl self,vader "$@"
