# bench/run's Citus section (sourced, not run): the same proxy configuration on a Citus
# cluster (a coordinator and two workers, tests/citus) and on one PostgreSQL configured as
# the cluster's nodes are (tests/citus plain), keyed and replay, in interleaved rounds; the
# server CPU each node spends per request; and pgbench running the proxy's own reserve and
# complete statements on both — not a baseline for the proxy (bench/run's baselines are the
# seed's), but what the cluster itself reaches for the statements a keyed request needs.
# On one machine the three nodes share its cores: no scale-out can show, only the cost of
# every statement crossing two servers. The load spreads over 64 client ids (each client's
# keys live on one shard), on both stores. Skipped when Citus is not installed.
#
# Uses bench/run's run, proxy_config, start_proxy, port, wait_port, server_ticks, $WORK,
# $RESULTS, $CONC, $DUR, $ROUNDS, $POOL, $BIN, $PGBENCH, $PIDS.
citus_section() {
  if [ ! -f "$(pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)/citus.so" ]; then
    echo "== Citus is not installed (../shared/citus/build.sh): no Citus cases" >&2
    return 0
  fi
  echo "== past one primary: Citus (coordinator + 2 workers) against one PostgreSQL, $ROUNDS interleaved rounds" >&2
  # Directories of their own: the nodes run as the postgres OS user, who cannot enter $WORK.
  local cdir pdir curl purl
  cdir=$(mktemp -d /tmp/idemproxy-bench-citus.XXXXXX)
  pdir=$(mktemp -d /tmp/idemproxy-bench-plain.XXXXXX)
  CITUS_STOP=("$cdir" "$pdir")
  curl=$(tests/citus start "$cdir")
  purl=$(tests/citus plain "$pdir")
  DATABASE_URL="$curl" "$BIN" migrate 2>/dev/null
  DATABASE_URL="$purl" "$BIN" migrate 2>/dev/null
  local cp cpa op opa cn=0 on=0
  cp=$(port); cpa=$(port); op=$(port); opa=$(port)
  proxy_config "$cp" "$cpa" "store:
  postgres:
    url: \"$curl\"
    pool_size: $POOL" > "$WORK/citus.yaml"
  proxy_config "$op" "$opa" "store:
  postgres:
    url: \"$purl\"
    pool_size: $POOL" > "$WORK/one-pg.yaml"
  # The store's replay path, without the replay cache answering from memory.
  local cs csa os osa
  cs=$(port); csa=$(port); os=$(port); osa=$(port)
  { proxy_config "$cs" "$csa" "store:
  replay_cache: 0
  postgres:
    url: \"$curl\"
    pool_size: $POOL"; } > "$WORK/citus-nocache.yaml"
  { proxy_config "$os" "$osa" "store:
  replay_cache: 0
  postgres:
    url: \"$purl\"
    pool_size: $POOL"; } > "$WORK/one-pg-nocache.yaml"
  start_proxy citus "$WORK/citus.yaml"; local c_pid=$PROXY_PID
  start_proxy one-pg "$WORK/one-pg.yaml"; local o_pid=$PROXY_PID
  start_proxy citus-nocache "$WORK/citus-nocache.yaml"; local cs_pid=$PROXY_PID
  start_proxy one-pg-nocache "$WORK/one-pg-nocache.yaml"; local os_pid=$PROXY_PID
  wait_port "$cp"; wait_port "$op"; wait_port "$cs"; wait_port "$os"
  local nodes=(coordinator worker1 worker2) pms=() n
  for n in "${nodes[@]}"; do pms+=("$(head -n1 "$cdir/$n/postmaster.pid")"); done
  local plain_pm
  plain_pm=$(head -n1 "$pdir/plain/postmaster.pid")
  # run() counts the database server's CPU through db_ticks: here every node of the case's
  # cluster, and each node's share is reported beside it.
  db_ticks() { local s=0 p; for p in $CASE_PMS; do s=$((s + $(server_ticks "$p"))); done; echo "$s"; }
  node_case() { # label pid args...: run, then each node's server CPU per request
    local label=$1 before=() after=() i
    for i in "${!pms[@]}"; do before+=("$(server_ticks "${pms[$i]}")"); done
    CASE_PMS="${pms[*]}" STORE_PID=1 run "$@"
    for i in "${!pms[@]}"; do after+=("$(server_ticks "${pms[$i]}")"); done
    python3 - "$label" "$RESULTS" "${before[*]}" "${after[*]}" "$DUR" "$WARM" <<'PY' | tee -a "$RESULTS" >&2
import json, sys
label, results, before, after, dur, warm = sys.argv[1:]
last = [json.loads(l) for l in open(results) if json.loads(l)["label"] == label][-1]
requests = max(last["rps"] * (float(dur) + float(warm)), 1)
nodes = ["coordinator", "worker1", "worker2"]
us = {n: (int(a) - int(b)) * 1e4 / requests for n, b, a in zip(nodes, before.split(), after.split())}
print(json.dumps({"label": label + "-nodes", "round": last["round"], "mode": "nodes", "rps": last["rps"], **{n + "_us_per_req": round(v) for n, v in us.items()}}))
PY
  }
  local pair=bench/sql/proxy-pair.sql
  for ROUND in $(seq 1 "$ROUNDS"); do export ROUND
    node_case keyed-citus "$c_pid" --url "http://127.0.0.1:$cp/payments" --concurrency "$CONC" --keys unique --clients 64
    CASE_PMS=$plain_pm STORE_PID=1 run keyed-one-pg "$o_pid" --url "http://127.0.0.1:$op/payments" --concurrency "$CONC" --keys unique --clients 64
    node_case replay-citus "$c_pid" --url "http://127.0.0.1:$cp/payments" --concurrency "$CONC" --keys pool --key-pool 1000 --clients 64
    CASE_PMS=$plain_pm STORE_PID=1 run replay-one-pg "$o_pid" --url "http://127.0.0.1:$op/payments" --concurrency "$CONC" --keys pool --key-pool 1000 --clients 64
    node_case replay-store-citus "$cs_pid" --url "http://127.0.0.1:$cs/payments" --concurrency "$CONC" --keys pool --key-pool 1000 --clients 64
    CASE_PMS=$plain_pm STORE_PID=1 run replay-store-one-pg "$os_pid" --url "http://127.0.0.1:$os/payments" --concurrency "$CONC" --keys pool --key-pool 1000 --clients 64
    citus_pgbench pgbench-proxy-pair-citus "$curl" "$pair"
    citus_pgbench pgbench-proxy-pair-one-pg "$purl" "$pair"
  done
  kill "$c_pid" "$o_pid" "$cs_pid" "$os_pid" 2>/dev/null || true
  wait "$c_pid" "$o_pid" "$cs_pid" "$os_pid" 2>/dev/null || true
  tests/citus stop "$cdir"; tests/citus stop "$pdir"
  CITUS_STOP=()
}

citus_pgbench() { # label url script
  if [ -n "${BENCH_CASES:-}" ] && ! [[ "$1" =~ $BENCH_CASES ]]; then return 0; fi
  local tps
  if ! tps=$("$PGBENCH" -n -M prepared -c "$CONC" -j 2 -T "$DUR" -f "$3" "$2" 2>"$WORK/pgbench.err" | awk '/^tps/ {print $3; exit}'); then
    echo "== pgbench $1 failed: $(tail -n 3 "$WORK/pgbench.err")" >&2
    return 0
  fi
  echo "{\"label\":\"$1\",\"round\":${ROUND:-0},\"mode\":\"closed\",\"rps\":${tps:-0}}" | tee -a "$RESULTS" >&2
}
