# SPDX-License-Identifier: MIT
"""What the controller did, as a picture: `gnmrctl plot JOB -o FILE.png`
(or .svg), or `python -m gnmr.plot JOB -o FILE.png`.

It reads a job's history with `gnmrctl export` (from gnmrd, or from a
store with --store: live or finished, SQLite or PostgreSQL) and draws,
for each chosen unit, its GNMR (g) and delta-GNMR (d) against alpha and
beta over the steps, with the steps it spent on the recovery path as
bands; under them, the number of active units per step against the
budget (max_active) and the units that were risky. The store keeps a
unit's g and d at the steps where it was risky (its policy events), not
at every step, so those are the points drawn; alpha and beta follow every
`gnmrctl set`.

Drawn with matplotlib (a well-kept library whose Agg backend needs no
display and writes PNG and SVG), through this package rather than in C,
so that the same code serves `gnmrctl plot` and Python users."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

POLICY_EVENTS = ("exceed", "promote", "demote", "nonfinite")


class PlotError(Exception):
    """A mistake in what was asked (exit 2) or a failure to read it (1)."""

    def __init__(self, msg, code=2):
        super().__init__(msg)
        self.code = code


def parse_steps(text):
    """'A:B', 'A:' or ':B' -> (A or None, B or None)."""
    m = re.fullmatch(r"(\d*):(\d*)", text or "")
    if not m or (m.group(1) == "" and m.group(2) == ""):
        raise PlotError(f"--steps {text!r}: expected A:B, A: or :B "
                        f"(step numbers)")
    a = int(m.group(1)) if m.group(1) else None
    b = int(m.group(2)) if m.group(2) else None
    if a is not None and b is not None and b < a:
        raise PlotError(f"--steps {text!r}: {b} is below {a}")
    return a, b


def read_export(job, gnmrctl="gnmrctl", run=None, admin=None, store=None,
                extra=()):
    """The job's history: `gnmrctl export JOB` as a dict."""
    argv = [gnmrctl] + list(extra)
    if admin:
        argv.append(f"--admin={admin}")
    if store:
        argv.append(f"--store={store}")
    argv += ["export", job] + ([f"--run={run}"] if run else [])
    try:
        r = subprocess.run(argv, capture_output=True, text=True,
                           timeout=600)
    except FileNotFoundError:
        raise PlotError(f"{gnmrctl}: not found (give --gnmrctl PATH)", 1)
    if r.returncode != 0:
        raise PlotError(r.stderr.strip() or f"gnmrctl export: exit "
                        f"{r.returncode}", 1)
    return json.loads(r.stdout)


def series(export, units=None, steps=(None, None), most=6):
    """What the picture shows, as data: {"units": [{name, id, g: [(step,
    v)], d: [...], active: [(first, last)]}], "alpha"/"beta": [(from_step,
    v)], "steps": [step], "n_active", "pool", "budget": [...]}.

    units: names or regular expressions (None: the units that were ever
    active, most promoted first, at most `most`)."""
    lo, hi = steps
    inside = lambda s: (lo is None or s >= lo) and (hi is None or s <= hi)
    names = {u["id"]: u["name"] for u in export["units"]}
    ids = {v: k for k, v in names.items()}
    last_pass = max([s["pass"] for s in export["steps"]] or [1])
    rows = [s for s in export["steps"]
            if s["pass"] == last_pass and inside(s["step"])]
    if export["steps"] and not rows:
        raise PlotError(f"--steps: the job has steps "
                        f"{export['steps'][0]['step']} to "
                        f"{export['steps'][-1]['step']}, none in "
                        f"{lo if lo is not None else ''}:"
                        f"{hi if hi is not None else ''}")
    active_at = {s["step"]: {int(x) for x in s["active"].split()}
                 for s in rows}
    if units is None:
        promos = {}
        for e in export["events"]:
            if e["kind"] == "promote" and e["unit"] is not None and \
                    inside(e["step"]):
                promos[e["unit"]] = promos.get(e["unit"], 0) + 1
        chosen = sorted(promos, key=lambda u: (-promos[u], u))[:most]
    else:
        chosen = []
        for want in units:
            if want in ids:
                hits = [ids[want]]
            else:
                try:
                    rx = re.compile(want)
                except re.error as e:
                    raise PlotError(f"--units {want!r}: not a unit name nor "
                                    f"a regular expression ({e})")
                hits = sorted(i for n, i in ids.items() if rx.search(n))
            if not hits:
                raise PlotError(f"--units {want!r}: job "
                                f"{export['job']['name']!r} has no such "
                                f"unit (gnmrctl units JOB lists them)")
            chosen += [h for h in hits if h not in chosen]
        if len(chosen) > 24:
            raise PlotError(f"--units matched {len(chosen)} units: at most "
                            f"24 in one picture")
    out = {"job": export["job"]["name"], "run": export["job"].get("run"),
           "units": []}
    for uid in chosen:
        g = [(e["step"], e["g"]) for e in export["events"]
             if e["unit"] == uid and e["kind"] in POLICY_EVENTS and
             e["g"] is not None and inside(e["step"]) and
             e["pass"] == last_pass]
        d = [(e["step"], e["d"]) for e in export["events"]
             if e["unit"] == uid and e["kind"] in POLICY_EVENTS and
             e["d"] is not None and inside(e["step"]) and
             e["pass"] == last_pass]
        bands, start, prev = [], None, None
        for s in sorted(active_at):
            on = uid in active_at[s]
            if on and start is None:
                start = s
            if not on and start is not None:
                bands.append((start, prev))
                start = None
            prev = s
        if start is not None:
            bands.append((start, prev))
        # the steps its gradient was not finite (g and d cannot be drawn
        # there: marked at the axis' top instead, issue 63)
        bad = sorted({e["step"] for e in export["events"]
                      if e["unit"] == uid and e["kind"] in
                      ("nonfinite", "shadowed") and inside(e["step"]) and
                      e["pass"] == last_pass})
        out["units"].append({"id": uid, "name": names.get(uid, str(uid)),
                             "g": sorted(set(g)), "d": sorted(set(d)),
                             "active": bands, "nonfinite": bad})
    params = [p for p in export["params"] if p["pass"] == last_pass] or \
        export["params"]
    out["alpha"] = [(p["from_step"], p["alpha"]) for p in params]
    out["beta"] = [(p["from_step"], p["beta"]) for p in params]
    out["budget"] = [(p["from_step"], p["max_active"]) for p in params]
    out["steps"] = [s["step"] for s in rows]
    out["n_active"] = [s["n_active"] for s in rows]
    out["pool"] = [s["pool"] for s in rows]
    return out


def _stairs(points, first, last):
    """[(from_step, v)] -> xs, ys of a step line from first to last."""
    xs, ys = [], []
    for i, (s, v) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else last
        xs += [max(s, first), end]
        ys += [v, v]
    return xs, ys


def _plain(v, _pos=None):
    """A log axis' tick as a plain number: 0.01, 6, 200."""
    return f"{v:g}"


def _plain_minor(v, _pos=None):
    """Minor ticks labelled 2 and 5 of each decade only."""
    lead = f"{v:.0e}"[0]
    return f"{v:g}" if lead in "25" else ""


def draw(data, path):
    """Writes the picture of series() to path (.png or .svg)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".png", ".svg"):
        raise PlotError(f"-o {path!r}: the picture is a .png or an .svg")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError as e:
        raise PlotError(f"matplotlib is not installed for {sys.executable} "
                        f"({e}): pip install matplotlib, or set GNMR_PYTHON "
                        f"to a Python that has it", 1)
    steps = data["steps"]
    first, last = (steps[0], steps[-1]) if steps else (0, 1)
    n = len(data["units"])
    fig_h = 1.9 * n + 2.8
    fig, axes = plt.subplots(n + 1, 1, sharex=True, squeeze=False,
                             figsize=(10, fig_h),
                             gridspec_kw={"height_ratios": [2] * n + [1.6]})
    axes = [a[0] for a in axes]
    for ax, u in zip(axes, data["units"]):
        for a, b in u["active"]:
            ax.axvspan(a - 0.5, b + 0.5, color="tab:orange", alpha=0.18,
                       lw=0)
        ax.step(*_stairs(data["alpha"], first, last), where="post",
                color="tab:blue", ls="--", lw=1, label="α")
        ax.step(*_stairs(data["beta"], first, last), where="post",
                color="tab:red", ls=":", lw=1, label="β")
        if u["g"]:
            ax.plot(*zip(*u["g"]), "o", ms=3, color="tab:blue",
                    label="GNMR g")
        if u["d"]:
            ax.plot(*zip(*u["d"]), "s", ms=3, color="tab:red",
                    label="Δ-GNMR d")
        if u.get("nonfinite"):
            ax.plot(u["nonfinite"], [0.92] * len(u["nonfinite"]), "x",
                    ms=6, mew=1.5, color="k", label="non-finite gradient",
                    transform=ax.get_xaxis_transform(), clip_on=False)
        ax.set_ylabel(u["name"], rotation=0, ha="right", va="center",
                      fontsize=8)
        ax.set_yscale("log")
        # plain numbers on the log axis (it read 6×10^0 over a decade)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(_plain))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(_plain_minor))
    if data["units"]:
        h, lab = axes[0].get_legend_handles_labels()
        h.append(plt.Rectangle((0, 0), 1, 1, color="tab:orange", alpha=0.18))
        lab.append("on the recovery path")
        fig.legend(h, lab, loc="upper center", fontsize=7, ncol=5,
                   frameon=False, bbox_to_anchor=(0.5, 1 - 0.35 / fig_h))
    else:
        axes[0].set_title("no unit was ever promoted", fontsize=9)
    ax = axes[-1]
    ax.step(steps, data["n_active"], where="mid", color="tab:orange",
            label="active units")
    ax.step(steps, data["pool"], where="mid", color="0.5", lw=0.8,
            label="risky units")
    ax.step(*_stairs(data["budget"], first, last), where="post",
            color="k", ls="--", lw=1, label="budget (max_active)")
    ax.set_xlabel("step")
    ax.legend(loc="upper left", fontsize=7, ncol=3, frameon=False)
    run = f", run {data['run']}" if data.get("run") else ""
    fig.suptitle(f"GNMR job {data['job']}{run}: g and d at the steps a "
                 f"unit was risky", fontsize=10, y=1 - 0.12 / fig_h)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig_h))
    fig.savefig(path, dpi=110, metadata={"Software": "GNMR"} if ext ==
                ".png" else None)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog=os.environ.get("GNMR_PLOT_PROG", "python -m gnmr.plot"),
        description="Draws a job's GNMR and delta-GNMR against alpha and "
                    "beta, its active set and its budget, from its history.")
    ap.add_argument("job", metavar="JOB")
    ap.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="the picture: FILE.png or FILE.svg")
    ap.add_argument("--units", nargs="+", metavar="UNIT",
                    help="unit names or regular expressions (default: the "
                         "units ever active, most promoted first, at most "
                         "6)")
    ap.add_argument("--steps", metavar="A:B", help="a step range: A:B, A: "
                    "or :B")
    ap.add_argument("--run", type=int, metavar="ID",
                    help="a run of the job name (gnmrctl runs JOB)")
    ap.add_argument("--admin", metavar="ENDPOINT", help="gnmrd's admin "
                    "endpoint (as gnmrctl --admin)")
    ap.add_argument("--store", metavar="URL|FILE", help="read the history "
                    "from a store, without gnmrd (as gnmrctl --store)")
    ap.add_argument("--gnmrctl", default=shutil.which("gnmrctl") or
                    "gnmrctl", help=argparse.SUPPRESS)
    a, extra = ap.parse_known_args(argv)
    bad = [x for x in extra if not x.startswith("--curve-server-key=") and
           not x.startswith("--key-file=")]
    if bad:
        ap.error(f"unrecognized arguments: {' '.join(bad)}")
    try:
        steps = parse_steps(a.steps) if a.steps else (None, None)
        if os.path.splitext(a.output)[1].lower() not in (".png", ".svg"):
            raise PlotError(f"-o {a.output!r}: the picture is a .png or an "
                            f".svg")
        export = read_export(a.job, a.gnmrctl, a.run, a.admin, a.store,
                             extra)
        data = series(export, a.units, steps)
        draw(data, a.output)
    except PlotError as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return e.code
    print(f"{a.output}: {len(data['units'])} unit(s), steps "
          f"{data['steps'][0] if data['steps'] else '-'} to "
          f"{data['steps'][-1] if data['steps'] else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
