#!/usr/bin/env python3
"""Before/after table from cten-bench JSON files of alternating rounds.

For each case (name and device): each build's best round (the smallest of
its rounds' median times: a shared machine only ever adds time), the ratio
after/before of those, the ratio of the builds' medians over rounds, and the
noise of the run: how far the two best rounds of one build lie apart
(second best / best - 1, the larger over both builds). A case is "slower"
only when its best-round ratio exceeds 1 + noise. For cases with an anchor,
xanchor is the median over rounds of the case's rate against its anchor's
(for the copy anchor: the fraction of memcpy's bandwidth for the bytes the
op moves), before and after.
"""
import argparse
import json
import statistics


def load(paths):
    times, ratios = {}, {}
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for r in doc["records"]:
            if r.get("status") != "ok" or not r.get("time_s"):
                continue
            times.setdefault((r["name"], r["device"]), []).append(r["time_s"]["median"])
            if r.get("ratio_anchor"):
                ratios.setdefault((r["name"], r["device"]), []).append(r["ratio_anchor"])
    return times, ratios


def fmt_ratio(rs):
    return f"{statistics.median(rs):.2f}" if rs else "-"


def fmt_time(s):
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.1f} ns"


def spread(ts):
    best = sorted(ts)
    return best[1] / best[0] - 1 if len(best) > 1 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    a = ap.parse_args()
    (before, xb), (after, xa) = load(a.before), load(a.after)
    print("| case | device | before | after | after/before | medians after/before | noise | verdict "
          "| xanchor before | xanchor after |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    worse = 0
    for key in sorted(before, key=lambda k: (k[1], k[0])):
        if key not in after:
            continue
        b, h = min(before[key]), min(after[key])
        ratio = h / b
        mratio = statistics.median(after[key]) / statistics.median(before[key])
        noise = max(spread(before[key]), spread(after[key]))
        verdict = "slower" if ratio > 1 + noise else ("faster" if ratio < 1 - noise else "same")
        worse += verdict == "slower"
        print(f"| {key[0]} | {key[1]} | {fmt_time(b)} | {fmt_time(h)} | {ratio:.3f} | "
              f"{mratio:.3f} | {100 * noise:.1f}% | {verdict} | {fmt_ratio(xb.get(key))} | "
              f"{fmt_ratio(xa.get(key))} |")
    print(f"\n{worse} case(s) slower than the run's noise")


if __name__ == "__main__":
    main()
