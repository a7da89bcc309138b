"""Turns bench/run's JSON lines into one Markdown table with the ratios the issue asks for.

A case run in several rounds (interleaved with the cases it is compared with) is reported
by its median round; the range of its rates across rounds shows the machine's noise.
"""
import json
import platform
import statistics
import subprocess
import sys

results_path, hot, conc, dur, rate, rounds = sys.argv[1:7]
runs = {}
for line in open(results_path):
    d = json.loads(line)
    runs.setdefault(d["label"], []).append(d)


def median_run(label):
    """The round with the median rate (the lower middle one for an even count); for
    open-loop cases, where every round sends at the same rate, the median p50."""
    rs = runs.get(label, [])
    key = "p50_ms" if rs and rs[0].get("mode") == "open" else "rps"
    rs = sorted(rs, key=lambda d: d[key])
    return rs[(len(rs) - 1) // 2] if rs else {}


rows = {label: median_run(label) for label in runs}


def rps(label):
    return rows.get(label, {}).get("rps", 0.0)


def cell(label, key, fmt="{:.2f}"):
    v = rows.get(label, {}).get(key)
    return "–" if v is None else fmt.format(v)


def spread(label):
    rs = [d["rps"] for d in runs.get(label, [])]
    return f"{min(rs):.0f}–{max(rs):.0f}" if len(rs) > 1 and min(rs) != max(rs) else ""


cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print("# idemproxy benchmark\n")
print(f"Machine: {cpu or platform.processor()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
      f"load generator on the same machine. {conc} connections, {dur} s per case; the cases that are "
      f"compared with each other ran {rounds} interleaved rounds (median round shown, range of rates beside it).\n")
print("CPU per request: the proxy process's CPU time (the peer's, for `peer-redis`) and the store "
      "server's (PostgreSQL: the postmaster and all its processes; the peer: its Redis) over the "
      "case, divided by its requests.\n")
print("| case | mode | req/s | range | p50 ms | p99 ms | p99.9 ms | errors | proxy CPU share | proxy CPU µs/req | store CPU µs/req | proxy peak RSS MiB |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for label, d in rows.items():
    if d.get("mode") == "nodes":
        continue
    share = d.get("cpu_share")
    peak = d.get("peak_rss_kib")
    print(f"| {label} | {d.get('mode', '')} | {d['rps']:.0f} | {spread(label)} | {cell(label, 'p50_ms')} | "
          f"{cell(label, 'p99_ms')} | {cell(label, 'p999_ms')} | {d.get('errors', '–')} | "
          f"{'–' if share is None else f'{share:.0%}'} | {cell(label, 'cpu_us_per_req', '{:.0f}')} | "
          f"{cell(label, 'db_cpu_us_per_req', '{:.0f}')} | {'–' if peak is None else f'{peak / 1024:.1f}'} |")


def ratio(a, b):
    """The median over rounds of a's rate over b's in the same round: the two ran minutes
    apart at most, so the machine's drift over a run (the demo provider slows as it keeps
    every charge, and a shared machine's speed wanders) cancels out."""
    xs, ys = runs.get(a, []), runs.get(b, [])
    if all("round" in r for r in xs + ys):
        # Paired by round: a round whose baseline failed (bench/run goes on) has no ratio.
        by_round = {y["round"]: y for y in ys}
        pairs = [x["rps"] / by_round[x["round"]]["rps"] for x in xs
                 if x["round"] in by_round and by_round[x["round"]]["rps"]]
    else:
        pairs = [x["rps"] / y["rps"] for x, y in zip(xs, ys) if y["rps"]]
    return f"{statistics.median(pairs):.2f}" if pairs else "–"


def added_p50():
    """Median over rounds of (pass-through p50 − direct p50), each pair from one round."""
    pt = runs.get("passthrough-open", [])
    di = runs.get("direct-open", [])
    diffs = [p["p50_ms"] - d["p50_ms"] for p, d in zip(pt, di)]
    return f"{statistics.median(diffs):.3f}" if diffs else "–"


def peak(label):
    v = rows.get(label, {}).get("peak_rss_kib")
    return "–" if v is None else f"{v / 1024:.1f}"


def cpu_sum(label):
    """The proxy's and the database's CPU per request, added (median round)."""
    d = rows.get(label, {})
    if d.get("cpu_us_per_req") is None or d.get("db_cpu_us_per_req") is None:
        return "–"
    return f"{d['cpu_us_per_req'] + d['db_cpu_us_per_req']:.0f} ({d['cpu_us_per_req']:.0f} + {d['db_cpu_us_per_req']:.0f})"


print()
print("Ratios: the median over rounds of the two cases' rates in the same round.\n")
print("| ratio | value | target |")
print("| --- | ---: | ---: |")
print(f"| keyed (PostgreSQL) / pgbench, the seed's reserve + complete | {ratio('keyed-pg', 'pgbench-seed-pair')} | ≥ 1.5 |")
print(f"| keyed (PostgreSQL) / the Redis-backed peer | {ratio('keyed-pg', 'peer-redis')} | ≥ 1.0 |")
print(f"| keyed (embedded) / the Redis-backed peer | {ratio('keyed-embedded', 'peer-redis')} | ≥ 1.5 |")
print(f"| keyed (embedded) / pgbench, the seed's reserve + complete | {ratio('keyed-embedded', 'pgbench-seed-pair')} | |")
print(f"| replay (PostgreSQL) / pgbench, the seed's lookup | {ratio('replay-pg', 'pgbench-seed-lookup')} | ≥ 2.0 |")
print(f"| replay (embedded) / pgbench, the seed's lookup | {ratio('replay-embedded', 'pgbench-seed-lookup')} | |")
print(f"| keyed (PostgreSQL) CPU per request, proxy + PostgreSQL (µs) | {cpu_sum('keyed-pg')} | ≤ half of 2026-12-03's |")
print(f"| keyed p50, one client sending sequentially, PostgreSQL (ms) | {cell('keyed-pg-sequential', 'p50_ms', '{:.3f}')} | no worse than before |")
print(f"| keyed p50, one client sending sequentially, embedded (ms) | {cell('keyed-embedded-sequential', 'p50_ms', '{:.3f}')} | no worse than before |")
print(f"| pass-through / nginx | {ratio('passthrough', 'nginx')} | ≥ 1.2 |")
print(f"| pass-through added p50 at {rate} req/s (ms) | {added_p50()} | ≤ 0.2 |")
print(f"| idemproxy peak RSS, 1,000 pass-through connections (MiB) | {peak('passthrough-1000conn')} | ≤ 24 |")
print(f"| idemproxy peak RSS, 1,000 keyed connections, PostgreSQL (MiB) | {peak('keyed-pg-1000conn')} | ≤ 24 |")
print(f"| idemproxy peak RSS, 1,000 keyed connections, embedded (MiB) | {peak('keyed-embedded-1000conn')} | ≤ 24 |")
print(f"| completions as HOT updates | {hot} | |")
print()
print("Encryption's cost (`encryption:` with `hash_keys`, against the same proxy without it, interleaved):\n")
print("| ratio | value |")
print("| --- | ---: |")
for case in ["keyed-pg", "replay-pg", "keyed-embedded", "replay-embedded"]:
    print(f"| {case}: sealed / clear | {ratio(case + '-sealed', case + '-clear')} |")

if any(label.endswith("-citus") for label in runs):
    print()
    print("Past one primary: the same proxy on Citus (a coordinator and two workers) and on one PostgreSQL "
          "configured as the nodes are, all on this machine's cores, interleaved (bench/citus.sh):\n")
    print("| ratio | value | target |")
    print("| --- | ---: | ---: |")
    print(f"| keyed: Citus / one PostgreSQL | {ratio('keyed-citus', 'keyed-one-pg')} | ≥ 0.5 |")
    print(f"| replay: Citus / one PostgreSQL | {ratio('replay-citus', 'replay-one-pg')} | ≥ 0.5 |")
    print(f"| replay without the replay cache: Citus / one PostgreSQL | {ratio('replay-store-citus', 'replay-store-one-pg')} | |")
    print(f"| pgbench, the proxy's reserve + complete: Citus / one PostgreSQL | {ratio('pgbench-proxy-pair-citus', 'pgbench-proxy-pair-one-pg')} | |")
    print(f"| keyed on Citus / pgbench's reserve + complete on Citus | {ratio('keyed-citus', 'pgbench-proxy-pair-citus')} | |")
    print()
    print("| case | req/s | server CPU per request (µs): coordinator, worker 1, worker 2 | one PostgreSQL: req/s, server CPU (µs) |")
    print("| --- | ---: | ---: | ---: |")
    for case in ["keyed", "replay", "replay-store"]:
        n = rows.get(f"{case}-citus-nodes", {})
        one = rows.get(f"{case}-one-pg", {})
        split = ", ".join(str(n.get(f"{x}_us_per_req", "–")) for x in ("coordinator", "worker1", "worker2"))
        one_cpu = one.get("db_cpu_us_per_req")
        print(f"| {case} | {cell(case + '-citus', 'rps', '{:.0f}')} | {split} | "
              f"{cell(case + '-one-pg', 'rps', '{:.0f}')}, {'–' if one_cpu is None else f'{one_cpu:.0f}'} |")
