# SPDX-License-Identifier: MIT
"""Where a setting's damage falls: one seed of the low variant (no
recovery), and per unit the share of its steps outside any episode on
which its low path was damaged, with the share of all damage that fell
in an episode and of the finite exceedances that did. A unit damaged on
most of its calm steps has a persistent problem, which a controller of
transient ones does not fix.

    experiments/where.py --setting act4|fp8|lora [paper.py options]

The same model, data, schedule and damage as experiments/paper.py
(harness.where_it_falls); prints a table."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import paper  # noqa: E402
import torch  # noqa: E402


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    name = argv[argv.index("--setting") + 1] if "--setting" in argv else ""
    if name not in paper.DEFAULTS:
        raise SystemExit(f"where.py: --setting one of "
                         f"{', '.join(paper.DEFAULTS)}")
    st = paper.Paper(name)
    args, seeds, _ = harness.parse_args(st, argv + ["--variants", "low"],
                                        paper.defaults_for(name),
                                        doc=__doc__)
    data = st.load(args)
    for seed in seeds:
        r = harness.run(st, "low", seed, args, data)
        print(f"{name}, seed {seed}, low, {args.steps} steps: damage in "
              f"episodes {r['damage_in_episode']:.2f}, exceedances in "
              f"episodes {r['exceed_in_episode']:.2f}")
        print("| unit | damaged share of its steps outside episodes |")
        print("|---|---|")
        for n, x in zip(r["units"], r["damage_outside_by_unit"]):
            print(f"| {n} | {x:.2f} |")


if __name__ == "__main__":
    main()
