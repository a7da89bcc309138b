"""Turns bench/run's JSON lines into one Markdown table with the ratios the issue asks for."""
import json
import platform
import subprocess
import sys

results_path, peak_pg, peak_em, hot, conc, dur, rate = sys.argv[1:8]
rows = {}
for line in open(results_path):
    d = json.loads(line)
    rows[d["label"]] = d


def rps(label):
    return rows.get(label, {}).get("rps", 0.0)


def cell(label, key, fmt="{:.2f}"):
    v = rows.get(label, {}).get(key)
    return "–" if v is None else fmt.format(v)


cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"# idemproxy benchmark\n")
print(f"Machine: {cpu or platform.processor()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
      f"load generator on the same machine. {conc} connections, {dur} s per case.\n")
print("| case | mode | req/s | p50 ms | p99 ms | p99.9 ms | errors | idemproxy CPU share |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for label, d in rows.items():
    share = d.get("cpu_share")
    print(f"| {label} | {d.get('mode', '')} | {d['rps']:.0f} | {cell(label, 'p50_ms')} | {cell(label, 'p99_ms')} | "
          f"{cell(label, 'p999_ms')} | {d.get('errors', '–')} | {'–' if share is None else f'{share:.0%}'} |")


def ratio(a, b):
    return f"{rps(a) / rps(b):.2f}" if rps(b) else "–"


added = rows.get("passthrough-open", {}).get("p50_ms", 0) - rows.get("direct-open", {}).get("p50_ms", 0)
print()
print("| ratio | value | target |")
print("| --- | ---: | ---: |")
print(f"| keyed (PostgreSQL) / pgbench pair | {ratio('keyed-pg', 'pgbench-pair')} | ≥ 0.5 |")
print(f"| replay (PostgreSQL) / pgbench replay | {ratio('replay-pg', 'pgbench-replay')} | ≥ 0.5 |")
print(f"| pass-through / nginx | {ratio('passthrough', 'nginx')} | ≥ 0.9 |")
print(f"| pass-through added p50 at {rate} req/s (ms) | {added:.3f} | ≤ 0.2 |")
print(f"| idemproxy peak RSS, PostgreSQL store (MiB) | {int(peak_pg) / 1024:.1f} | ≤ 64 |")
print(f"| idemproxy peak RSS, embedded store (MiB) | {int(peak_em) / 1024:.1f} | |")
print(f"| completions as HOT updates | {hot} | |")
