# SPDX-License-Identifier: MIT
"""The experiments' figures: paired differences, the summary written to
JSON, its markdown table and the loss-curve plot (experiments/harness.py
defines what is measured)."""
import math
import os
import statistics
import subprocess
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MISS_CAUSES = ("warmup", "first", "gap", "hidden", "not_chosen")


def paired(results, a, b, key="val"):
    d = [x[key] - y[key] for x, y in zip(results[a], results[b])]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return {"mean": statistics.mean(d), "se": se, "per_seed": d}


COMPARISONS = [("low", "high"), ("oracle", "random"), ("gnmr", "random"),
               ("gnmr", "low"), ("oracle_now", "random"),
               ("rawnorm", "random"), ("global", "random"),
               ("gnmr", "rawnorm"), ("gnmr", "global"), ("gnmr", "oracle"),
               ("high", "fp"), ("nanonly", "low"),
               ("gnmr", "nanonly"), ("gnmr", "nanonly_random"),
               ("nanonly_random", "random"), ("gnmr_shadow", "gnmr"),
               ("gnmr_shadow", "random"), ("gnmr_shadow", "oracle"),
               ("gnmr_shadow", "nanonly"), ("static", "low"),
               ("static", "high"), ("gnmr", "static"),
               ("gnmr_measured", "low"), ("gnmr_measured", "random"),
               ("gnmr_measured", "rawnorm"), ("gnmr_measured", "global"),
               ("gnmr_measured", "nanonly"), ("gnmr_measured", "oracle"),
               ("gnmr_rerun", "low"), ("gnmr_rerun", "random"),
               ("gnmr_rerun", "rawnorm"), ("gnmr_rerun", "global"),
               ("gnmr_rerun", "nanonly"), ("gnmr_rerun", "oracle"),
               ("gnmr_rerun", "high"),
               # the fp4 setting: GNMR on the measure against the static
               # recipe, the best static set, random, the measure alone
               ("gnmr_measure", "static"), ("gnmr_measure", "static_best"),
               ("gnmr_measure", "random"), ("gnmr_measure", "measure_alone"),
               ("gnmr_measure", "low"), ("gnmr_measure", "gnmr"),
               ("static_best", "static"), ("static_best", "low"),
               ("measure_alone", "static"), ("measure_alone", "low"),
               ("random", "static"), ("random", "low"),
               ("gnmr_measure_now", "static"), ("gnmr_measure_now", "random"),
               ("gnmr_measure_now", "measure_alone"),
               ("gnmr_measure_now", "gnmr_measure"),
               ("gnmr_measure_now", "low"), ("gnmr_measure_now", "high"),
               ("gnmr_measure", "high"), ("gnmr_measure", "oracle"),
               ("gnmr_measure", "nanonly"), ("gnmr_measure", "rawnorm")]


def _round(p):
    return {"mean": round(p["mean"], 6), "se": round(p["se"], 6),
            "t": round(p["mean"] / p["se"], 2) if p["se"] else None,
            "per_seed": [round(x, 6) for x in p["per_seed"]]}


def summarise(setting, results, args, seeds, argv, commit):
    pins = "".join(f"{k}={os.environ[k]} " for k in
                   ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                   if os.environ.get(k))
    out = {"command": pins +
           f"build/venv/bin/python {setting.script} " +
           " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": commit, "seeds": seeds,
           "torch": torch.__version__, "machine": machine(),
           "settings": {k: v for k, v in sorted(vars(args).items())
                        if k not in ("json", "gnmrd_bin", "jobs")},
           "variants": {}, "paired": {}}
    if setting.name:
        out["setting"] = setting.name
    first = next(iter(results.values()))[0]
    if "units" in first:
        out["units"] = first["units"]
    extras = setting.extra_figures()
    for v, rs in results.items():
        out["variants"][v] = {
            "val": [round(r["val"], 6) for r in rs],
            "share": [round(r["share"], 6) for r in rs],
            "precision": [round(r["precision"], 6) for r in rs],
            "coverage": [round(r["coverage"], 6) for r in rs],
            "damage": [round(r["damage"], 6) for r in rs],
            "skipped": [r["skipped"] for r in rs],
            "reruns": [r.get("reruns", 0) for r in rs],
            "same_steps": [r.get("same_steps", 0) for r in rs],
            "exceed": [round(r["exceed"], 6) for r in rs],
            "nonfinite": [round(r["nonfinite"], 6) for r in rs],
            "damage_unit_steps": [r["damage_steps"] for r in rs],
            "misses_by_cause": {c: [r["misses"][c] for r in rs]
                                for c in MISS_CAUSES}}
        for key in ("damage_in_episode", "exceed_in_episode"):
            if key in rs[0]:
                out["variants"][v][key] = [round(r[key], 6) for r in rs]
        if "damage_outside_by_unit" in rs[0]:
            out["variants"][v]["damage_outside_by_unit"] = [
                round(statistics.mean(r["damage_outside_by_unit"][u]
                                      for r in rs), 4)
                for u in range(len(rs[0]["damage_outside_by_unit"]))]
        out["variants"][v]["step_ms"] = [round(r["step_ms"], 2)
                                         for r in rs]
        # each seed's clean validation loss curve: [(step, loss)]
        out["variants"][v]["curve"] = [[[s, round(x, 6)] for s, x in
                                        r["curve"]] for r in rs]
        for key, _, _ in extras:
            out["variants"][v][key] = [round(r[key], 6) for r in rs]
    for a, b in COMPARISONS:
        if a in results and b in results:
            out["paired"][f"{a}-{b}"] = _round(paired(results, a, b))
            for key, _, _ in extras:
                out.setdefault("paired_" + key, {})[f"{a}-{b}"] = _round(
                    paired(results, a, b, key))
    if all(v in results for v in ("gnmr", "random", "oracle")):
        g = -statistics.mean(out["paired"]["gnmr-random"]["per_seed"])
        o = -statistics.mean(out["paired"]["oracle-random"]["per_seed"])
        out["gnmr_gain_over_oracle_gain"] = round(g / o, 4) if o else None
    # the share of the low-high gap (of mean final losses) each closes
    if "low" in results and "high" in results:
        lo = statistics.mean(r["val"] for r in results["low"])
        gap = lo - statistics.mean(r["val"] for r in results["high"])
        out["gap_closed"] = {
            v: round((lo - statistics.mean(r["val"] for r in rs)) / gap, 4)
            for v, rs in results.items()
            if v not in ("low", "high", "fp")} if gap else {}
    return out


def machine():
    """What the numbers depend on beyond the command: the CPU, and the
    kernels OpenBLAS chose for it (another CPU gives other bits)."""
    cpu, core = "unknown", "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import ctypes
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            fn = ctypes.CDLL(name).openblas_get_corename
            fn.restype = ctypes.c_char_p
            core = "OpenBLAS " + fn().decode()
            break
        except (OSError, AttributeError):
            continue
    return {"cpu": cpu, "cpus": os.cpu_count(), "blas": core}


def git_commit():
    """HEAD, with "-dirty" when a tracked file differs from it (the code
    that ran is then not HEAD's)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True,
                              cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain",
                                "--untracked-files=no"], check=True,
                               capture_output=True, text=True,
                               cwd=ROOT).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(summary, extras=()):
    """The results as markdown."""
    var = summary["variants"]
    gap = summary.get("gap_closed", {})
    head = ["variant", "final val loss (mean ± sd)"] + \
        [f"{label} (mean ± sd)" for _, label, _ in extras] + \
        ["recovery share", "exceed", "nonfinite", "precision", "coverage",
         "skipped steps", "gap closed"]
    if extras:
        head.append("step ms")
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]

    def msd(xs, fmt):
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):{fmt}} ± {sd:{fmt}}"
    for v, r in var.items():
        g = f"{gap[v]:+.2f}" if v in gap else "-"
        row = [v, msd(r["val"], ".4f")] + \
            [msd(r[k], ".4f") for k, _, _ in extras] + [
            f"{statistics.mean(r['share']):.3f}",
            f"{statistics.mean(r['exceed']):.4f}",
            f"{statistics.mean(r['nonfinite']):.4f}",
            f"{statistics.mean(r['precision']):.2f}",
            f"{statistics.mean(r['coverage']):.2f}",
            f"{statistics.mean(r['skipped']):.1f}", g]
        if extras:
            row.append(f"{statistics.mean(r['step_ms']):.1f}")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Damage unit-steps not recovered, by cause, as a share of "
              "all damage unit-steps (mean over seeds; "
              "experiments/harness.py defines the causes):", "",
              "| variant | coverage | " + " | ".join(MISS_CAUSES) + " |",
              "|---|---|" + "---|" * len(MISS_CAUSES)]
    for v, r in var.items():
        m, n = r.get("misses_by_cause"), r.get("damage_unit_steps")
        if m is None or n is None or 0 in n:
            continue
        shares = [statistics.mean(k / d for k, d in zip(m[c], n))
                  for c in MISS_CAUSES]
        lines.append(f"| {v} | {statistics.mean(r['coverage']):.2f} | " +
                     " | ".join(f"{x:.2f}" for x in shares) + " |")
    for key, label in [("paired", "final validation loss")] + \
            [("paired_" + k, lb) for k, lb, _ in extras]:
        lines += ["", f"Paired differences of {label} (the first minus "
                  "the second), mean ± standard error over seeds:", "",
                  "| difference | mean ± se | mean/se | per seed |",
                  "|---|---|---|---|"]
        for k, p in summary.get(key, {}).items():
            t = "-" if p["t"] is None else f"{p['t']:+.1f}"
            lines.append(f"| {k} | {p['mean']:+.4f} ± {p['se']:.4f} | {t} "
                         "| " + " ".join(f"{x:+.4f}" for x in p["per_seed"])
                         + " |")
    rows = [(v, r) for v, r in var.items() if "damage_in_episode" in r]
    if rows:
        lines += ["", "Where the damage and the exceedances fall (mean over "
                  "seeds): the share of damage unit-steps in an episode of "
                  "that unit, the share of finite exceedances in one, and "
                  "the units damaged on more than 20% of their steps "
                  "outside episodes (a persistent problem):", "",
                  "| variant | damage in episodes | exceedances in episodes "
                  "| units damaged outside episodes |", "|---|---|---|---|"]
        names = summary.get("units", [])
        for v, r in rows:
            bad = [f"{names[u] if u < len(names) else u} "
                   f"{x:.2f}" for u, x in
                   enumerate(r.get("damage_outside_by_unit", []))
                   if x > 0.2]
            de = statistics.mean(r["damage_in_episode"])
            ee = statistics.mean(r["exceed_in_episode"])
            lines.append(f"| {v} | {de:.2f} | {ee:.2f} | "
                         f"{', '.join(bad) or '-'} |")
    lines += ["", "exceed: unit-steps after warm-up whose finite GNMR or "
              "Δ-GNMR crossed a threshold; nonfinite: those with a NaN/Inf "
              "norm (both as a share of the unit-steps after warm-up); gap "
              "closed: (low − variant) / (low − high) of the mean final "
              "losses. Validation loss is measured with no episode active."]
    if summary.get("gnmr_gain_over_oracle_gain") is not None:
        lines += ["", "GNMR's gain over random as a fraction of the lagged "
                  f"oracle's: {summary['gnmr_gain_over_oracle_gain']:.2f}"]
    return "\n".join(lines) + "\n"


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: python3-matplotlib is not installed")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for v, rs in results.items():
        steps = [s for s, _ in rs[0]["curve"]]
        mean = [statistics.mean(r["curve"][i][1] for r in rs)
                for i in range(len(steps))]
        ax.plot(steps, mean, label=v)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


