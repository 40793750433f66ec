#!/bin/sh
# rankpack rank launcher: mpirun starts this once per rank. It puts the rank into its own
# cgroup ("rank pod") before the solver starts, records its pid, then becomes the solver.
r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-}}}"
if [ -z "$r" ]; then
    echo "rankpack launcher: no MPI rank in the environment (not started by mpirun?)" >&2
    exit 97
fi
if [ -n "${RANKPACK_CGROUP_DIRS:-}" ]; then
    old_ifs=$IFS
    IFS=:
    for d in $RANKPACK_CGROUP_DIRS; do
        if ! echo $$ > "$d/rank-$r/cgroup.procs"; then
            echo "rankpack launcher: rank $r cannot join cgroup $d/rank-$r" >&2
            exit 98
        fi
    done
    IFS=$old_ifs
fi
if [ -n "${RANKPACK_PID_DIR:-}" ]; then
    echo $$ > "$RANKPACK_PID_DIR/rank-$r.pid"
fi
exec "$@"
