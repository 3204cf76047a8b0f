#!/usr/bin/env python3
"""Puts cten-bench and torch_ref.py results side by side.

Reads one or more JSON files written by `cten-bench --json` and
`bench/torch_ref.py --json` (cten on the CPU, cten on a GPU, PyTorch on the
CPU, PyTorch on a GPU: any subset, in any order) and writes

  - a markdown report: the machines and ceilings, then one row per case and
    device with cten's time, rate, share of the device's ceiling and ratio to
    its anchor, PyTorch's time and rate, cten's speed relative to PyTorch and
    each library's GPU/CPU speed-up;
  - a PNG chart (matplotlib): GPU against CPU per case, cten against PyTorch
    per case and device, and the share of each device's ceiling.

    python3 bench/report.py cten-cpu.json cten-gpu.json torch-cpu.json torch-gpu.json \\
        --png bench.png --md bench.md

Without matplotlib the markdown is still written (and the exit status is 0).
Records of the same suite, device type and case name from several files:
the last file wins.
"""
import argparse
import importlib.util
import json
import sys


def load(paths):
    docs, recs = [], {}
    order = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if d.get("schema") != "cten-bench/1":
            sys.exit(f"report: {p}: not a cten-bench/1 file")
        d["_path"] = p
        docs.append(d)
        for r in d["records"]:
            k = (r["suite"], r["device_type"], r["name"])
            recs[k] = r
            if (r["device_type"], r["name"]) not in order:
                order.append((r["device_type"], r["name"]))
    return docs, recs, order


def rate(r):
    """The record's throughput in its own unit, or None."""
    if not r or r.get("status") != "ok":
        return None
    for f in ("gflops", "gbs", "calls_per_s"):
        if r.get(f):
            return r[f]
    return None


def fmt_time(s):
    if s is None:
        return ""
    if s < 1e-6:
        return f"{s * 1e9:.1f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_rate(r):
    if not r or r.get("status") != "ok":
        return ""
    if r.get("gflops"):
        return f"{r['gflops']:.1f} GFLOP/s"
    if r.get("gbs"):
        return f"{r['gbs']:.1f} GB/s"
    return ""


def cell_time(r):
    if r is None:
        return ""
    if r.get("status") != "ok":
        return r.get("status", "")
    t = fmt_time(r["time_s"]["median"])
    spread = r.get("spread_pct")
    return f"{t} ±{spread:.0f}%" if spread is not None else t


def fmt_ratio(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def speedup_by_key(recs, suite):
    """GPU/CPU throughput per case key for one suite."""
    cpu, gpu = {}, {}
    for (s, dt, _), r in recs.items():
        if s != suite or rate(r) is None:
            continue
        (gpu if dt == "cuda" else cpu)[r["key"]] = rate(r)
    return {k: gpu[k] / cpu[k] for k in gpu if k in cpu and cpu[k] > 0}


CEIL_FIELD = {"gemm_f32": "gemm_f32_gflops", "gemm_tf32": "gemm_tf32_gflops",
              "gemm_bf16": "gemm_bf16_gflops", "copy": "copy_gbs"}


def device_ceilings(docs):
    """The highest ceiling of each kind measured for each device type by any file:
    the best estimate of what the device can do."""
    best = {}
    for d in docs:
        for c in d.get("ceilings", []):
            dt = "cuda" if c["device"].startswith("cuda") else "cpu"
            for kind, field in CEIL_FIELD.items():
                v = c.get(field)
                if v and v > best.get((dt, kind), 0):
                    best[(dt, kind)] = v
    return best


def pct_of_device(r, best):
    """r's rate against the device's best measured ceiling, in percent."""
    kind = (r.get("ceiling") or {}).get("kind")
    v = best.get((r["device_type"], kind))
    x = rate(r) if r.get("gflops") or r.get("gbs") else None
    return 100 * x / v if x and v else None


def markdown(docs, recs, order):
    out = ["# cten-bench report", ""]
    out.append("| file | suite | mode | date | machine | versions |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for d in docs:
        m, v = d.get("machine", {}), d.get("versions", {})
        gpus = ", ".join(g.get("name", "") for g in m.get("gpus", []))
        machine = f"{m.get('cpu', '')}, {m.get('threads', '')} threads"
        if gpus:
            machine += f"; {gpus}"
        vers = ", ".join(f"{k} {val}" for k, val in v.items() if val is not None)
        out.append(f"| {d['_path']} | {d['suite']} | {d.get('mode', '')} | {d.get('date', '')} | "
                   f"{machine} | {vers} |")
    out += ["", "## Ceilings measured at start", ""]
    out.append("| suite | device | GEMM | f32 GFLOP/s | TF32 GFLOP/s | bf16 GFLOP/s | copy GB/s |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for d in docs:
        for c in d.get("ceilings", []):
            def g(k):
                return f"{c[k]:.1f}" if c.get(k) else ""
            out.append(f"| {d['suite']} | {c['device']} | {c.get('gemm_routine', '')} "
                       f"{c.get('gemm_n', '')}³ | {g('gemm_f32_gflops')} | "
                       f"{g('gemm_tf32_gflops')} | {g('gemm_bf16_gflops')} | {g('copy_gbs')} |")
    su_cten, su_torch = speedup_by_key(recs, "cten"), speedup_by_key(recs, "torch")
    best = device_ceilings(docs)
    out += ["", "## Cases", "",
            "time: median per call ± spread of the middle 80% of repeats; %peak: rate against "
            "the device's ceiling (the highest measured by any of the files: a large GEMM for "
            "products, a large copy for bandwidth-bound ops); ×anchor: cten's rate / its "
            "anchor's rate (cblas_sgemm, cublasGemmEx, memcpy, cudaMemcpy called directly); "
            "vs torch: cten's speed / PyTorch's (above 1: cten faster); GPU/CPU: throughput "
            "on the GPU / on the CPU for the same case.", ""]
    out.append("| case | device | cten time | cten rate | %peak | anchor | ×anchor | torch time "
               "| torch rate | vs torch | GPU/CPU cten | GPU/CPU torch | cten routine |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dt, name in order:
        c, t = recs.get(("cten", dt, name)), recs.get(("torch", dt, name))
        any_r = c or t
        dev = any_r["device"]
        pct = pct_of_device(c, best) if c and c.get("status") == "ok" else None
        anchor = (c.get("anchor") or {}).get("name", "") if c else ""
        vs = rate(c) / rate(t) if rate(c) and rate(t) else None
        key = any_r["key"]
        su_c = su_cten.get(key) if dt == "cuda" else None
        su_t = su_torch.get(key) if dt == "cuda" else None
        routine = (c.get("routine") or "") if c else ""
        if c and c.get("status") not in (None, "ok"):
            routine = (c.get("note") or "")[:80]
        out.append(f"| {name} | {dev} | {cell_time(c)} | {fmt_rate(c)} | "
                   f"{'' if pct is None else f'{pct:.0f}%'} | {anchor} | "
                   f"{fmt_ratio(c.get('ratio_anchor') if c else None)} | {cell_time(t)} | "
                   f"{fmt_rate(t)} | {fmt_ratio(vs)} | {fmt_ratio(su_c, 1)} | "
                   f"{fmt_ratio(su_t, 1)} | {routine.replace('|', '/')} |")
    return "\n".join(out) + "\n"


# ---- the chart -----------------------------------------------------------------------------------
COLORS = {("cten", "cpu"): "#1f77b4", ("cten", "cuda"): "#ff7f0e",
          ("torch", "cpu"): "#9ecae1", ("torch", "cuda"): "#fdd0a2"}


def chart(docs, recs, order, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    # one row per case key, in run order
    keys = []
    for dt, name in order:
        k = next(r["key"] for (s, d, n), r in recs.items() if d == dt and n == name)
        if k not in keys:
            keys.append(k)
    by = {}  # (suite, device_type, key) -> record
    for (s, dt, _), r in recs.items():
        by[(s, dt, r["key"])] = r
    suites = sorted({s for s, _, _ in recs}, key=lambda s: s != "cten")
    dtypes = [d for d in ("cpu", "cuda") if any(dt == d for _, dt, _ in recs)]
    su = {s: speedup_by_key(recs, s) for s in suites}
    best = device_ceilings(docs)

    panels = []
    if "cuda" in dtypes and "cpu" in dtypes:
        panels.append("speedup")
    if "cten" in suites and "torch" in suites:
        panels.append("vs_torch")
    panels.append("peak")

    n = len(keys)
    fig_h = max(4.0, 0.4 * n + 1.8)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels) + 2.6, fig_h),
                             sharey=True, squeeze=False)
    axes = axes[0]
    ypos = list(range(n))

    def markers(ax, series):
        """series: list of (label, color, values): values as diamonds on the rows of
        the bar series they go with (same order)."""
        k = len(series)
        h = 0.8 / max(1, k)
        for i, (label, color, vals) in enumerate(series):
            off = (i - (k - 1) / 2) * h
            pts = [(v, y + off) for y, v in zip(ypos, vals) if v is not None and v > 0]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="none", marker="D",
                        markersize=4.5, markerfacecolor=color, markeredgecolor="0.2",
                        markeredgewidth=0.6, label=label)

    def bars(ax, series, log):
        """series: list of (label, color, values per key or None, texts for missing).
        Ratios (log) are drawn from 1, so that below 1 goes left and above 1 right."""
        k = len(series)
        h = 0.8 / max(1, k)
        for i, (label, color, vals, missing) in enumerate(series):
            off = (i - (k - 1) / 2) * h
            ys = [y + off for y in ypos]
            base = 1.0 if log else 0.0
            vv = [v - base if v is not None and v > 0 else 0 for v in vals]
            ax.barh(ys, vv, left=base, height=h, color=color, label=label, edgecolor="none")
            for y, v, m in zip(ys, vals, missing):
                if (v is None or v <= 0) and m:
                    ax.text(0.01, y, m, transform=ax.get_yaxis_transform(), fontsize=6.5,
                            va="center", color="0.45")
                elif v is not None and v > 0:
                    left = log and v < 1  # the bar grows leftwards: label on its left end
                    label_text = f"{v:.0f}" if v >= 10 else f"{v:.2g}"
                    ax.text(v, y, f"{label_text} " if left else f" {label_text}", fontsize=6.5,
                            va="center", ha="right" if left else "left", color="0.25")
        shown = [v for _, _, vals, _ in series for v in vals if v is not None and v > 0]
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            if shown:  # room for the labels on both sides of 1
                ax.set_xlim(min(min(shown), 1.0) / 2.2, max(max(shown), 1.0) * 2.2)
        elif shown:
            ax.set_xlim(0, max(max(shown), 100.0) * 1.12)
        ax.grid(axis="x", color="0.9", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.legend(fontsize=8, loc="lower right", framealpha=0.9)

    def missing_text(r):
        if r is None:
            return ""
        st = r.get("status")
        return "" if st == "ok" else st

    for ax, p in zip(axes, panels):
        if p == "speedup":
            series = []
            for s in suites:
                vals = [su[s].get(k) for k in keys]
                miss = [missing_text(by.get((s, "cuda", k))) or
                        ("" if by.get((s, "cuda", k)) else "") for k in keys]
                series.append((f"{s} GPU/CPU", COLORS[(s, "cuda")], vals, miss))
            bars(ax, series, log=True)
            ax.axvline(1, color="0.3", linewidth=0.8)
            ax.set_title("GPU speed-up over the CPU\n(throughput ratio, log scale)", fontsize=10)
        elif p == "vs_torch":
            series = []
            for dt in dtypes:
                vals, miss = [], []
                for k in keys:
                    c, t = by.get(("cten", dt, k)), by.get(("torch", dt, k))
                    vals.append(rate(c) / rate(t) if rate(c) and rate(t) else None)
                    miss.append(missing_text(c) or (missing_text(t) and f"torch {missing_text(t)}"))
                series.append((f"cten / PyTorch on {dt.upper()}", COLORS[("cten", dt)], vals, miss))
            bars(ax, series, log=True)
            ax.axvline(1, color="0.3", linewidth=0.8)
            ax.set_title("cten against PyTorch\n(speed ratio, log scale; > 1: cten faster)",
                         fontsize=10)
        else:
            # cten as bars, PyTorch as diamonds on the same rows
            series, dots = [], []
            for dt in dtypes:
                def pcts(s):
                    return [pct_of_device(by[(s, dt, k)], best) if by.get((s, dt, k)) else None
                            for k in keys]
                if any(by.get(("cten", dt, k)) for k in keys):
                    miss = [missing_text(by.get(("cten", dt, k))) for k in keys]
                    series.append((f"cten {dt.upper()}", COLORS[("cten", dt)], pcts("cten"), miss))
                    dots.append((f"PyTorch {dt.upper()}", COLORS[("torch", dt)], pcts("torch")))
            bars(ax, series, log=False)
            if "torch" in suites:
                markers(ax, dots)
                ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
                top = [v for _, _, vals in dots for v in vals if v]
                if top:  # room for diamonds beyond the longest bar
                    ax.set_xlim(0, max(ax.get_xlim()[1], max(top) * 1.08))
            ax.axvline(100, color="0.3", linewidth=0.8)
            ax.set_title("share of the device's ceiling (%)\n(large GEMM for products, large "
                         "copy for bandwidth)", fontsize=10)
    axes[0].set_yticks(ypos)
    axes[0].set_yticklabels(keys, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="files from cten-bench --json / torch_ref.py --json")
    ap.add_argument("--png", default="bench.png", help="chart to write (default bench.png)")
    ap.add_argument("--md", default="bench.md", help="markdown to write (default bench.md)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    docs, recs, order = load(a.json)
    with open(a.md, "w") as f:
        f.write(markdown(docs, recs, order))
    print(f"report: wrote {a.md}")
    if importlib.util.find_spec("matplotlib") is None:
        print("report: matplotlib is not installed (apt-get install python3-matplotlib); "
              "no chart written", file=sys.stderr)
        return 0
    machines = sorted({d.get("machine", {}).get("cpu", "") for d in docs})
    gpus = sorted({g.get("name", "") for d in docs for g in d.get("machine", {}).get("gpus", [])})
    title = a.title or "cten-bench: " + "; ".join(machines + gpus)
    chart(docs, recs, order, a.png, title)
    print(f"report: wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
