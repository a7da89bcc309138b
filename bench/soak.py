"""bench/run --soak: the keyed case's minutes beside pgbench's seed pair's minutes, and the
targets of issue 33 checked on them (a report: nothing here fails a build).

Arguments: the proxy's per-minute JSON lines, the directory of pgbench's per-transaction
logs (`-l`: client, transaction, latency in µs, script, epoch seconds, µs), concurrency,
and (optional) the database's counters before the first minute: each proxy minute carries
them as of its end (`db`), and a second table shows what the server did in each minute.
"""
import glob
import json
import sys

soak_path, log_dir, conc = sys.argv[1:4]
proxy = [json.loads(line) for line in open(soak_path)]
db_start = json.load(open(sys.argv[4])) if len(sys.argv) > 4 else None

# pgbench: latencies per minute since its first transaction.
by_minute = {}
start = None
rows = []
for path in glob.glob(f"{log_dir}/seed*"):
    for line in open(path):
        f = line.split()
        if len(f) < 6:
            continue
        at = int(f[4]) + int(f[5]) / 1e6
        rows.append((at, int(f[2]) / 1000.0))
rows.sort()
if rows:
    start = rows[0][0]
for at, ms in rows:
    by_minute.setdefault(int((at - start) // 60) + 1, []).append(ms)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


print(f"## Soak: keyed on PostgreSQL, {conc} connections, {len(proxy)} minutes\n")
print("| minute | proxy req/s | p50 ms | p99 ms | p999 ms | RSS MiB | pgbench pairs/s | p50 ms | p99 ms | p999 ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for d in proxy:
    m = d["minute"]
    lat = by_minute.get(m, [])
    print(
        f"| {m} | {d['rps']:.0f} | {d['p50_ms']:.1f} | {d['p99_ms']:.1f} | {d['p999_ms']:.1f} | "
        f"{d['rss_kib'] / 1024:.1f} | {len(lat) / 60:.0f} | {pct(lat, 0.5):.1f} | {pct(lat, 0.99):.1f} | {pct(lat, 0.999):.1f} |"
    )

if proxy:
    first, last = proxy[0], proxy[-1]
    worst = max(proxy, key=lambda d: d["p99_ms"])
    over_first = [d["minute"] for d in proxy if d["p99_ms"] > 3 * first["p99_ms"]]
    over_pgbench = [
        d["minute"]
        for d in proxy
        if by_minute.get(d["minute"]) and d["p99_ms"] > 2 * pct(by_minute[d["minute"]], 0.99)
    ]
    rss = [d["rss_kib"] for d in proxy]
    print()
    print(f"- worst minute's p99: {worst['p99_ms']:.1f} ms (minute {worst['minute']}); first minute's: {first['p99_ms']:.1f} ms")
    print(f"- minutes with p99 over 3x the first minute's: {over_first or 'none'} (target: none)")
    print(f"- minutes with p99 over 2x pgbench's for that minute: {over_pgbench or 'none'} (target: none)")
    print(f"- last minute's rate {last['rps']:.0f}/s = {100 * last['rps'] / max(first['rps'], 1):.0f} % of the first (target: at least 90 %)")
    print(f"- RSS {min(rss) / 1024:.1f}–{max(rss) / 1024:.1f} MiB over the run")


# The database's side, per minute: what changed since the minute before.
if proxy and db_start and all("db" in d for d in proxy):
    print()
    print("The server during the proxy's minutes (differences per minute; dead/live at the minute's end):\n")
    print("| minute | checkpoints timed/requested | WAL MB | WAL KiB per request | updates HOT % | dead row versions | live rows | autovacuums | table MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    before = db_start
    for d in proxy:
        now = d["db"]
        requests = d["rps"] * 60
        wal = now["wal_bytes"] - before["wal_bytes"]
        upd = now["upd"] - before["upd"]
        hot = now["hot"] - before["hot"]
        print(
            f"| {d['minute']} | {now['ckpt_timed'] - before['ckpt_timed']}/{now['ckpt_req'] - before['ckpt_req']} | "
            f"{wal / 1048576:.0f} | {wal / 1024 / max(requests, 1):.1f} | {100 * hot / max(upd, 1):.0f} | "
            f"{now['dead']} | {now['live']} | {now['autovacuums'] - before['autovacuums']} | {now['table_mb']} |"
        )
        before = now
    print()
    print(f"- server settings: {json.dumps(proxy[-1]['db'].get('settings'), sort_keys=True)}")
    print(f"- the key table's storage parameters: {proxy[-1]['db'].get('reloptions')}")
