"""bench/run --soak: the keyed case's minutes beside pgbench's seed pair's minutes, and the
targets of issue 33 checked on them (a report: nothing here fails a build).

Arguments: the proxy's per-minute JSON lines, the directory of pgbench's per-transaction
logs (`-l`: client, transaction, latency in µs, script, epoch seconds, µs), concurrency,
and (optional) the database's counters before the first minute: each proxy minute carries
them as of its end (`db`), and a second table shows what the server did in each minute;
then the proxy's stages before that minute, a label for the server, and the server's log
(checkpoints and autovacuum runs, by the minute each ended in).
"""
import glob
import json
import sys

soak_path, log_dir, conc = sys.argv[1:4]
proxy = [json.loads(line) for line in open(soak_path)]
db_start = json.load(open(sys.argv[4])) if len(sys.argv) > 4 and sys.argv[4] else None
stages_start = json.load(open(sys.argv[5])) if len(sys.argv) > 5 and sys.argv[5] else None
server = sys.argv[6] if len(sys.argv) > 6 and sys.argv[6] else "the server at DATABASE_URL"

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


print(f"## Soak: keyed on PostgreSQL ({server}), {conc} connections, {len(proxy)} minutes\n")
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


def index_sizes(db):
    """`pkey 40, expires_at 12, …`: each index of the key table, in MB."""
    sizes = sorted((db.get("index_mb") or {}).items())
    return ", ".join(f"{name.replace('idempotency_keys_', '')} {mb}" for name, mb in sizes)


# The database's side, per minute: what changed since the minute before.
if proxy and db_start and all("db" in d for d in proxy):
    print()
    print("The server during the proxy's minutes (differences per minute; dead/live at the minute's end):\n")
    print("| minute | checkpoints timed/requested | WAL MB | WAL KiB per request | updates HOT % | dead row versions | live rows | autovacuums | table MB | indexes MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
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
            f"{now['dead']} | {now['live']} | {now['autovacuums'] - before['autovacuums']} | {now['table_mb']} | "
            f"{index_sizes(now)} |"
        )
        before = now
    print()
    print(f"- server settings: {json.dumps(proxy[-1]['db'].get('settings'), sort_keys=True)}")
    print(f"- the key table's storage parameters: {proxy[-1]['db'].get('reloptions')}")


# The server's log, per minute (the throwaway cluster logs every checkpoint and every
# autovacuum run): what each checkpoint and each vacuum of the key table cost, by the
# minute it ended in — the proxy's minute m is the 60 s before its `end` (epoch seconds),
# pgbench's counts from its first transaction, and its vacuums are of the seed's table.
server_log = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] else None
if proxy and server_log and all("end" in d for d in proxy):
    import datetime
    import re

    entries = []
    for line in open(server_log, errors="replace"):
        head = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC \[\d+\] \w+:\s+(.*)", line)
        if head:
            at = datetime.datetime.strptime(head.group(1), "%Y-%m-%d %H:%M:%S.%f")
            entries.append([at.replace(tzinfo=datetime.timezone.utc).timestamp(), head.group(2)])
        elif entries and line.startswith("\t"):
            entries[-1][1] += " " + line.strip()

    def work(since, until, table):
        """Checkpoints and vacuums of `table` that ended in (since, until]."""
        ckpts, vacs = [], []
        for at, text in entries:
            if not since < at <= until:
                continue
            ckpt = re.search(r"checkpoint complete: wrote \d+ buffers.*total=([\d.]+) s.*distance=(\d+) kB", text)
            if ckpt:
                ckpts.append((float(ckpt.group(1)), int(ckpt.group(2)) / 1024))
            if "automatic vacuum of table" in text and f".{table}\"" in text:
                scanned = re.search(r"scanned \(([\d.]+)% of total\)", text)
                wal = re.search(r"(\d+) full page images, (\d+) bytes", text)
                elapsed = re.search(r"elapsed: ([\d.]+) s", text)
                vacs.append((
                    float(elapsed.group(1)) if elapsed else 0.0,
                    float(scanned.group(1)) if scanned else 0.0,
                    int(wal.group(1)) if wal else 0,
                    int(wal.group(2)) / 1048576 if wal else 0.0,
                ))
        return ckpts, vacs

    def cells(ckpts, vacs):
        joined = lambda xs: " + ".join(xs) or "-"
        return [
            joined([f"{t:.0f} s, {mb:.0f} MB" for t, mb in ckpts]),
            joined([f"{e:.0f} s, {s:.0f} %" for e, s, _, _ in vacs]),
            f"{sum(w for *_, w in vacs):.0f} ({sum(f for _, _, f, _ in vacs)})" if vacs else "-",
        ]

    print()
    print("The server's log per minute (what ended in it): each checkpoint (write + sync, WAL since the one")
    print("before) and each autovacuum run of the key table — the proxy's, then the seed's in pgbench's minutes")
    print("(elapsed, heap scanned), with the WAL vacuum wrote (full-page images):\n")
    print("| minute | proxy: checkpoints | vacuums | vacuum WAL MB | pgbench: checkpoints | vacuums | vacuum WAL MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for d in proxy:
        m = d["minute"]
        ours = cells(*work(d["end"] - 60, d["end"], "idempotency_keys"))
        seed = cells(*work(start + 60 * (m - 1), start + 60 * m, "idempotency")) if start else ["-"] * 3
        print(f"| {m} | " + " | ".join(ours + seed) + " |")


def histograms(before, now, name):
    """Per label set (without `le`): the bucket counts added between two scrapes."""
    out = {}
    for series, value in now.items():
        if not series.startswith(name + "{"):
            continue
        labels = series[len(name) + 1 : -1].split(",")
        le = next(l for l in labels if l.startswith("le="))[4:-1]
        key = ",".join(l for l in labels if not l.startswith("le="))
        out.setdefault(key, []).append((float("inf") if le == "+Inf" else float(le), value - before.get(series, 0.0)))
    return {k: sorted(v) for k, v in out.items()}


def quantile(buckets, q):
    """The upper bound of the bucket holding quantile q (cumulative buckets), in ms."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    for le, count in buckets:
        if count >= q * total:
            return le * 1000
    return None


def ms(v):
    return "-" if v is None else ("inf" if v == float("inf") else f"{v:g}")


# The proxy's own stages, per minute: which of them the tail is in.
if proxy and stages_start and all("proxy" in d for d in proxy):
    before = stages_start
    rows = []
    ops = set()
    for d in proxy:
        now = d["proxy"]
        store = histograms(before, now, "idemproxy_store_duration_seconds_bucket")
        upstream = histograms(before, now, "idemproxy_upstream_duration_seconds_bucket")
        batches = now.get("idemproxy_store_batches_total", 0) - before.get("idemproxy_store_batches_total", 0)
        writes = now.get("idemproxy_store_batched_writes_total", 0) - before.get("idemproxy_store_batched_writes_total", 0)
        per_op = {k.split('"')[1]: quantile(v, 0.99) for k, v in store.items() if v and v[-1][1] > 0}
        ops |= set(per_op)
        up = [quantile(v, 0.99) for v in upstream.values() if v and v[-1][1] > 0]
        rows.append((d["minute"], per_op, max(up) if up else None, batches, writes))
        before = now
    ops = sorted(ops)
    print()
    print("The proxy's own stages (p99 by histogram bucket, ms: the bucket's upper bound; the group commit's batches):\n")
    print("| minute | " + " | ".join(f"store {o}" for o in ops) + " | upstream | batches/s | writes per batch |")
    print("| --- | " + " | ".join("---" for _ in ops) + " | --- | --- | --- |")
    for minute, per_op, up, batches, writes in rows:
        print(
            f"| {minute} | " + " | ".join(ms(per_op.get(o)) for o in ops)
            + f" | {ms(up)} | {batches / 60:.0f} | {writes / max(batches, 1):.1f} |"
        )


# The statements the server spent its time on, per minute (pg_stat_statements, when the
# server has it): the three with the most time, each with its calls per second and mean.
if proxy and db_start and all((d.get("db") or {}).get("statements") for d in proxy):
    print()
    print("The server's statements by time spent, per minute (calls/s, mean ms):\n")
    print("| minute | first | second | third |")
    print("| --- | --- | --- | --- |")
    before = db_start.get("statements") or {}
    for d in proxy:
        now = d["db"]["statements"]
        spent = []
        for qid, st in now.items():
            was = before.get(qid, {"calls": 0, "ms": 0.0})
            calls, t = st["calls"] - was["calls"], st["ms"] - was["ms"]
            if calls > 0:
                spent.append((t, calls, st["q"]))
        spent.sort(reverse=True)
        cells = [f"`{q}` {c / 60:.0f}/s, {t / c:.2f}" for t, c, q in spent[:3]]
        cells += [""] * (3 - len(cells))
        print(f"| {d['minute']} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        before = now
