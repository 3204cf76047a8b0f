#!/usr/bin/env python3
"""Before/after table from cten-bench JSON files of alternating rounds.

For each case (name and device): the median over rounds of each build's
median time, the ratio after/before, and the noise of the run: the largest
spread between rounds of the same build (max/min - 1, over both builds). A
case is "slower" only when its ratio exceeds 1 + noise.
"""
import argparse
import json
import statistics


def load(paths):
    times = {}
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for r in doc["records"]:
            if r.get("status") != "ok" or not r.get("time_s"):
                continue
            times.setdefault((r["name"], r["device"]), []).append(r["time_s"]["median"])
    return times


def fmt_time(s):
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.1f} ns"


def spread(ts):
    return max(ts) / min(ts) - 1 if len(ts) > 1 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    a = ap.parse_args()
    before, after = load(a.before), load(a.after)
    print("| case | device | before | after | after/before | noise | verdict |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    worse = 0
    for key in sorted(before, key=lambda k: (k[1], k[0])):
        if key not in after:
            continue
        b, h = statistics.median(before[key]), statistics.median(after[key])
        ratio = h / b
        noise = max(spread(before[key]), spread(after[key]))
        verdict = "slower" if ratio > 1 + noise else ("faster" if ratio < 1 - noise else "same")
        worse += verdict == "slower"
        print(f"| {key[0]} | {key[1]} | {fmt_time(b)} | {fmt_time(h)} | {ratio:.3f} | "
              f"{100 * noise:.1f}% | {verdict} |")
    print(f"\n{worse} case(s) slower than the run's noise")


if __name__ == "__main__":
    main()
