# The database server's CPU from /proc, for bench/run and bench/batch-shape (sourced, not run).
#
# postmaster_pid URL: the server's postmaster when it runs on this machine and its data
# directory can be read from here, 0 otherwise.
postmaster_pid() {
  local pid
  pid=$(head -n1 "$(psql "$1" -Atc 'SHOW data_directory' 2>/dev/null)/postmaster.pid" 2>/dev/null || echo 0)
  [ -r "/proc/$pid/stat" ] && echo "$pid" || echo 0
}
# server_ticks PID: the postmaster's own CPU ticks, its reaped children's (backends that
# ended), and every live child's (backends, WAL writer, checkpointer...); 0 for PID 0.
server_ticks() {
  [ "$1" != 0 ] || { echo 0; return; }
  { awk '{print $14+$15+$16+$17}' "/proc/$1/stat"
    # A backend that ends between the listing and the read (pgbench's, as it finishes) is
    # skipped, not an error: under `set -e` it ended whole runs.
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do awk '{print $14+$15}' "/proc/$c/stat" 2>/dev/null || true; done
  } | awk '{s+=$1} END {print s+0}'
}
