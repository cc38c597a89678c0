# SPDX-License-Identifier: MIT
"""The lora setting's base model before fine-tuning: its validation loss
and next-byte accuracy on the held-out task text, exact and through each
path of the frozen base (int8-row, bf16), so that the fine-tuning's gain
and the base's own quantization cost can be read beside
docs/results/lora.md. The same base, data and evaluation as

    experiments/paper.py --setting lora

(the base is built or read from build/experiments as there). Prints one
line per path; single-threaded, the same numbers on a rerun."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import paper  # noqa: E402
import torch  # noqa: E402


def main(argv=None):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    st = paper.Paper("lora")
    args, _, _ = harness.parse_args(st, ["--setting", "lora"] +
                                    list(argv or sys.argv[1:]),
                                    paper.defaults_for("lora"),
                                    doc=__doc__)
    data = st.load(args)
    out = {}
    for path, variant, high in (("exact", "fp", False),
                                (args.low, "low", False),
                                (args.high, "low", True)):
        b = st.build(variant, 0, args, data)   # LoRA's B is 0: the base
        for u in b.units:
            st.set_route(u, high)
        e = st.evaluate(b.model, data, args)
        out[path] = e
        print(f"base, {path:9s} val {e['val']:.4f} acc {e['acc']:.4f}")
    return out


if __name__ == "__main__":
    main()
