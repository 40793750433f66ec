#!/bin/sh
# rankpack rank launcher: mpirun starts this once per rank. It puts the rank into its run's
# cgroup (its own below it if $RANKPACK_CGROUP_PER_RANK is set) before the solver starts,
# records its pid, then becomes the solver, at its nice value from $RANKPACK_RANK_NICE
# (comma-separated, one per rank: its share of the run's cgroup).
r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-}}}"
if [ -z "$r" ]; then
    echo "rankpack launcher: no MPI rank in the environment (not started by mpirun?)" >&2
    exit 97
fi
if [ -n "${RANKPACK_CGROUP_DIRS:-}" ]; then
    old_ifs=$IFS
    IFS=:
    for d in $RANKPACK_CGROUP_DIRS; do
        if [ -n "${RANKPACK_CGROUP_PER_RANK:-}" ]; then
            d="$d/rank-$r"
        fi
        if ! echo $$ > "$d/cgroup.procs"; then
            echo "rankpack launcher: rank $r cannot join cgroup $d" >&2
            exit 98
        fi
    done
    IFS=$old_ifs
fi
if [ -n "${RANKPACK_PID_DIR:-}" ]; then
    echo $$ > "$RANKPACK_PID_DIR/rank-$r.pid"
fi
n=0
if [ -n "${RANKPACK_RANK_NICE:-}" ]; then
    n=$(echo "$RANKPACK_RANK_NICE" | cut -d, -f"$((r + 1))")
fi
case "$n" in
    ''|0|*[!0-9]*) exec "$@" ;;
    *) exec nice -n "$n" "$@" ;;
esac
