#!/usr/bin/env python3
"""Sums an `ncu --csv` metric dump (one row per kernel): count and total duration."""
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
total, names = 0.0, {}
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    us = v / 1000 if r["Metric Unit"] in ("ns", "nsecond") else (v if r["Metric Unit"] in ("us", "usecond") else v * 1000)
    total += us
    k = r["Kernel Name"][:110]
    c, t = names.get(k, (0, 0.0))
    names[k] = (c + 1, t + us)
print(f"kernels={sum(c for c, _ in names.values())} gpu_us={total:.1f}")
for k, (c, t) in sorted(names.items(), key=lambda x: -x[1][1]):
    print(f"  {c:3d} x {t:8.1f} us  {k}")
