# SPDX-License-Identifier: MIT
"""experiments/paper.py, the paper's three settings, on tiny models: a
real gnmrd, the recovery paths switching, Mixtral's experts as units,
the LoRA base cached, clean validation, and the same numbers again from
one seed and variant alone."""
import io
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402

from test_gnmr import BIN  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
TINY = ["--steps", "24", "--warmup", "4", "--eval-every", "12",
        "--eval-batches", "2", "--d", "32", "--ffn", "64", "--layers", "1",
        "--heads", "2", "--ctx", "16", "--batch", "4", "--episode-rate",
        "0.1", "--gnmrd-bin", BIN, "--base-steps", "10"]


def _have(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


@unittest.skipUnless(_have("transformers"), "transformers is not installed")
class PaperTest(unittest.TestCase):
    def main(self, args):
        import paper
        out = io.StringIO()
        det, threads = (torch.are_deterministic_algorithms_enabled(),
                        torch.get_num_threads())
        try:
            with contextlib.redirect_stdout(out):
                res = paper.main(TINY + args)
        finally:
            torch.use_deterministic_algorithms(det)
            torch.set_num_threads(threads)
        return res, out.getvalue()

    def test_act4_every_variant_json_and_a_rerun(self):
        tmp = tempfile.mkdtemp(prefix="gnmr-paper-test-")
        try:
            js = os.path.join(tmp, "act4.json")
            res, text = self.main(["--setting", "act4", "--seed-list", "1",
                                   "--variants", "fp,high,low,gnmr,random,"
                                   "oracle,oracle_now,nanonly", "--json", js])
            for v in ("fp", "high", "low", "gnmr", "nanonly"):
                self.assertTrue(math.isfinite(res[v][0]["val"]), v)
            self.assertEqual(res["high"][0]["share"], 1.0)
            self.assertEqual(res["low"][0]["share"], 0.0)
            # episodes damage the low path's copy; fp has no low path
            self.assertGreater(res["low"][0]["damage_steps"], 0)
            self.assertEqual(res["fp"][0]["damage_steps"], 0)
            self.assertEqual(res["oracle_now"][0]["precision"], 1.0)
            g = res["gnmr"][0]
            self.assertGreater(g["share"], 0.0)
            self.assertTrue(all(len(a) <= 2 for a in g["active"]))
            # the 4-bit path differs from the 8-bit one
            self.assertNotEqual(res["low"][0]["val"], res["high"][0]["val"])
            low = res["low"][0]
            self.assertTrue(0 < low["damage_in_episode"] <= 1)
            self.assertTrue(0 <= low["exceed_in_episode"] <= 1)
            self.assertEqual(len(low["damage_outside_by_unit"]),
                             len(low["units"]))
            self.assertEqual(res["fp"][0]["damage_in_episode"], 0.0)
            with open(js) as f:
                doc = json.load(f)
            self.assertEqual(doc["setting"], "act4")
            self.assertEqual(doc["units"], low["units"])
            self.assertIn("| units damaged outside episodes |", text)
            self.assertIn("experiments/paper.py --steps", doc["command"])
            self.assertIn("gnmr-nanonly", doc["paired"])
            self.assertIn("| gnmr |", text)
            again, _ = self.main(["--setting", "act4", "--seed-list", "1",
                                  "--variants", "random"])
            self.assertEqual(again["random"][0]["val"],
                             res["random"][0]["val"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_kept_runs_are_taken_again_and_only_for_the_same_run(self):
        """--keep-runs: a sweep cut off goes on where it stopped. The
        second sweep takes GNMR's run and random's from the directory (the
        same numbers, nothing run: the pickles are the only source), a
        changed option runs again, a torn file is run again, not read."""
        tmp = tempfile.mkdtemp(prefix="gnmr-keep-test-")
        try:
            keep = ["--setting", "act4", "--seed-list", "2", "--keep-runs",
                    tmp]
            res, text = self.main(keep + ["--variants", "gnmr,random"])
            self.assertNotIn("taken from", text)
            kept = sorted(os.listdir(tmp))
            self.assertEqual(len(kept), 2, kept)
            again, text = self.main(keep + ["--variants", "gnmr,random"])
            self.assertIn("2 of 2 runs taken from", text)
            for v in ("gnmr", "random"):
                self.assertEqual(again[v][0], res[v][0], v)
            # what is taken is the file's: a changed kept value shows
            import pickle
            path = os.path.join(tmp, kept[0])
            with open(path, "rb") as f:
                r = pickle.load(f)
            r["val"] = 123.0
            with open(path, "wb") as f:
                pickle.dump(r, f)
            third, _ = self.main(keep + ["--variants", "gnmr,random"])
            self.assertIn(123.0, [third[v][0]["val"] for v in third])
            # a torn file is not a run: run again and rewritten
            with open(path, "wb") as f:
                f.write(b"\x80\x04trunc")
            fourth, text = self.main(keep + ["--variants", "gnmr,random"])
            self.assertIn("1 of 2 runs taken from", text)
            self.assertEqual(sorted(os.listdir(tmp)), kept)
            for v in ("gnmr", "random"):
                self.assertEqual(fourth[v][0]["val"], res[v][0]["val"], v)
            # a sweep of fewer variants (or other seeds) takes the runs
            # it shares: which runs a sweep holds is not in the key
            fifth, text = self.main(keep + ["--variants", "gnmr"])
            self.assertIn("1 of 1 runs taken from", text)
            self.assertEqual(fifth["gnmr"][0]["val"], res["gnmr"][0]["val"])
            # another option is another run
            _, text = self.main(keep + ["--variants", "gnmr", "--lr",
                                        "0.002"])
            self.assertNotIn("taken from", text)
            self.assertEqual(len(os.listdir(tmp)), 3)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_fp8_on_mixtral_has_experts_as_units(self):
        import paper
        res, _ = self.main(["--setting", "fp8", "--experts", "4",
                            "--seed-list", "2", "--variants",
                            "high,low,gnmr"])
        st = paper.Paper("fp8")
        import harness
        args, _, _ = harness.parse_args(st, TINY + ["--setting", "fp8"])
        b = st.build("gnmr", 2, args, None)
        experts = [n for n in b.names if ".experts." in n]
        self.assertEqual(len(experts), 4)
        self.assertEqual(len(b.names), 4 + 4)     # q, k, v, o + experts
        # an expert unit switches every quantized linear inside it
        st.set_route(b.units[b.names.index(experts[0])], True)
        self.assertTrue(st.on_recovery(b.units[b.names.index(experts[0])]))
        self.assertFalse(st.on_recovery(b.units[b.names.index(experts[1])]))
        self.assertTrue(all(math.isfinite(res[v][0]["val"])
                            for v in res))
        self.assertGreater(res["gnmr"][0]["share"], 0.0)

    def test_lora_trains_adapters_on_a_frozen_int8_base(self):
        res, text = self.main(["--setting", "lora", "--seed-list", "3",
                               "--variants", "fp,high,low,gnmr"])
        for v in res:
            self.assertTrue(0.0 < res[v][0]["acc"] < 1.0, v)
        self.assertIn("task accuracy", text)
        self.assertNotEqual(res["low"][0]["val"], res["fp"][0]["val"])
        import paper
        import harness
        st = paper.Paper("lora")
        args, _, _ = harness.parse_args(st, TINY + ["--setting", "lora"])
        data = st.load(args)        # the cached base: no training again
        b = st.build("low", 3, args, data)
        self.assertEqual(len(b.units), 7)
        trained = {id(p) for p in b.params}
        for n, p in b.model.named_parameters():
            self.assertEqual(id(p) in trained, "lora_" in n, n)

    def test_latent_stress_measured_signal_rerun_and_traces(self):
        tmp = tempfile.mkdtemp(prefix="gnmr-latent-test-")
        try:
            res, text = self.main([
                "--setting", "lora", "--seed-list", "5", "--episode-mode",
                "latent", "--episode-scales", "256,512,512", "--variants",
                "low,gnmr,gnmr_measured,gnmr_rerun,random", "--share-of",
                "gnmr_rerun", "--trace-dir", tmp])
            low = res["low"][0]
            # silent (no non-finite norm), damaging, inside the episodes
            self.assertEqual(low["nonfinite"], 0.0)
            self.assertGreater(low["damage_steps"], 0)
            self.assertGreater(low["damage_in_episode"], 0.5)
            m, r = res["gnmr_measured"][0], res["gnmr_rerun"][0]
            # the measure promotes damaged units: most of what they
            # recover was damaged, against random's base rate
            self.assertGreater(m["coverage"], 0.0)
            self.assertGreater(m["precision"], low["damage"])
            # the same-step path ran steps again, and random took its share
            self.assertGreater(r["reruns"], 0)
            self.assertAlmostEqual(res["random"][0]["share"], r["share"],
                                   delta=0.1)
            self.assertIn("| gnmr_rerun |", text)
            # the traces: what gnmrctl replay and experiments/defaults.py
            # read, with the episodes
            path = os.path.join(tmp, "lora-low-5.csv")
            sys.path.insert(0, os.path.join(ROOT, "experiments"))
            import defaults
            eps = defaults.read_episodes(path)
            self.assertTrue(eps)
            import subprocess
            out = subprocess.run([os.path.join(BIN, "gnmrctl"), "replay",
                                  path], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(len(out.stdout.splitlines()), 1 + 24)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                defaults.main([path, "--damaged", path])
            self.assertIn("detected", buf.getvalue())
            bad = os.path.join(tmp, "bad.csv")
            with open(bad, "w") as f:
                f.write("# episode 1 x\nstep,unit,norm\n1,0,1\n")
            with self.assertRaises(ValueError):
                defaults.read_episodes(bad)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_static_recovers_the_units_its_pattern_names(self):
        res, text = self.main(["--setting", "act4", "--seed-list", "4",
                               "--variants", "static,low",
                               "--static-pattern", r"down_proj$"])
        st = res["static"][0]
        names = st["units"]
        down = [i for i, n in enumerate(names) if n.endswith("down_proj")]
        self.assertEqual(len(down), 1)
        self.assertEqual(st["active"][1:], [down] * 24)
        self.assertAlmostEqual(st["share"], 1 / len(names))
        self.assertIn("| static-low |", text)

    def test_keep_high_is_a_mixed_recipe_not_units(self):
        """--keep-high: the projections it names run the recovery path's
        recipe on every step and in every variant, and are not units."""
        import harness
        import paper
        from gnmr.quant import QuantLinear
        argv = ["--setting", "act4", "--keep-high", r"down_proj$"]
        res, _ = self.main(argv + ["--seed-list", "4",
                                   "--variants", "low,gnmr"])
        names = res["low"][0]["units"]
        self.assertFalse([n for n in names if n.endswith("down_proj")])
        self.assertEqual(len(names), 6)   # q, k, v, o, gate, up
        self.assertEqual(res["gnmr"][0]["units"], names)
        s = paper.Paper("act4")
        a = harness.parse_args(s, TINY + argv, paper.defaults_for("act4"))[0]
        b = s.build("low", 1, a, None)
        down = b.model.get_submodule("model.layers.0.mlp.down_proj")
        up = b.model.get_submodule("model.layers.0.mlp.up_proj")
        self.assertIsInstance(down, QuantLinear)
        self.assertEqual((down.low.name, down.high.name),
                         ("int8-g32", "int8-g32"))
        self.assertEqual((up.low.name, up.high.name),
                         ("int4-g32", "int8-g32"))

    def test_the_docs_quote_the_committed_results(self):
        """docs/experiments.md gives each paper setting's final loss
        (mean ± sd) of every variant as its json has it, and the low -
        high difference; the README the same differences."""
        import statistics
        with open(os.path.join(ROOT, "docs", "experiments.md")) as f:
            page = f.read()
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        for setting in ("act4", "fp8", "lora", "lora_latent", "fp8_latent",
                        "fp8_latent_mixed", "act4_defaults", "fp8_defaults",
                        "lora_defaults"):
            with open(os.path.join(ROOT, "docs", "results",
                                   setting + ".json")) as f:
                doc = json.load(f)
            self.assertEqual(doc["seeds"], [21, 22, 23, 24, 25])
            for v, r in doc["variants"].items():
                if v in ("rawnorm", "global", "nanonly_random") and \
                        setting == "lora":
                    continue   # the lora table leaves them to the md
                got = (f"{statistics.mean(r['val']):.4f} ± "
                       f"{statistics.stdev(r['val']):.4f}")
                self.assertIn(got, page, f"{setting} {v}")
            # the difference that says whether there is harm; where
            # there is no high run (GNMR at the defaults), GNMR's to low
            p = doc["paired"].get("low-high") or doc["paired"]["gnmr-low"]
            diff = f"{p['mean']:+.4f} ± {p['se']:.4f}"
            self.assertIn(diff, page, setting)
            self.assertIn(diff, readme, setting)

    def test_the_stdlib_corpus_trains_and_is_recorded(self):
        """Issue 50: the text a GPU machine has (the Python standard
        library's sources), its size and hash in the results."""
        import corpus
        tmp = tempfile.mkdtemp(prefix="gnmr-paper-test-")
        try:
            js = os.path.join(tmp, "s.json")
            res, _ = self.main(["--setting", "act4", "--corpus", "stdlib",
                                "--corpus-mb", "0.5", "--seed-list", "1",
                                "--variants", "low", "--episode-rate", "0",
                                "--json", js])
            self.assertTrue(math.isfinite(res["low"][0]["val"]))
            self.assertEqual(res["low"][0]["damage_in_episode"], 0.0)
            with open(js) as f:
                info = json.load(f)["settings"]["corpus_info"]
            want = corpus.stdlib_corpus(0.5)[1]
            self.assertEqual(info, want)
            self.assertEqual(info["bytes"], 1 << 19)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_bad_arguments_are_clear_errors(self):
        import paper
        for bad, msg in ((["--setting", "act4", "--low", "int4-g33x"],
                          "unknown recipe"),
                         (["--setting", "lora", "--model", "mixtral"],
                          "trains a Llama"),
                         (["--setting", "nope"], "invalid choice"),
                         (["--setting", "act4", "--variants", "static"],
                          "needs --static-pattern"),
                         (["--setting", "act4", "--variants", "static",
                           "--static-pattern", "("], "--static-pattern:"),
                         (["--setting", "act4", "--keep-high", "("],
                          "--keep-high '(':"),
                         (["--setting", "lora", "--keep-high", "q_proj"],
                          "the lora setting's units are its adapters"),
                         (["--setting", "lora", "--corpus", "stdlib"],
                          "task is a held-out licence text"),
                         (["--setting", "act4", "--corpus", "stdlib",
                           "--corpus-mb", "0"], "--corpus-mb: corpus: mb"),
                         (["--setting", "act4", "--corpus", "stdlib",
                           "--corpus-mb", "nan"], "--corpus-mb: corpus: mb"),
                         (["--setting", "act4", "--corpus", "web"],
                          "invalid choice"),
                         (["--setting", "act4", "--device", "tpu"],
                          "invalid choice")) + ((
                         (["--setting", "act4", "--device", "cuda"],
                          "--device cuda: torch sees no GPU"),)
                         if not torch.cuda.is_available() else ()):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), \
                    self.assertRaises(SystemExit) as cm:
                paper.main(TINY + bad)
            self.assertEqual(cm.exception.code, 2)
            self.assertIn(msg, err.getvalue())


class CorpusTest(unittest.TestCase):
    def test_sources_in_path_order_cut_and_hashed(self):
        import hashlib
        import corpus
        root = tempfile.mkdtemp(prefix="gnmr-corpus-test-")
        self.addCleanup(shutil.rmtree, root, True)
        files = {"b.py": b"bbb\n", "a/z.py": b"zz\n", "a/c.py": b"c\n",
                 "site-packages/x.py": b"no\n", "a/__pycache__/c.py": b"no",
                 "notes.txt": b"no"}
        for rel, body in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)),
                        exist_ok=True)
            with open(os.path.join(root, rel), "wb") as f:
                f.write(body)
        data, info = corpus.stdlib_corpus(1, root=root)
        self.assertEqual(data, b"c\nzz\nbbb\n")  # a/c, a/z, b
        self.assertEqual(info["files"], 3)
        self.assertEqual(info["sha256"], hashlib.sha256(data).hexdigest())
        cut, info = corpus.stdlib_corpus(4 / (1 << 20), root=root)
        self.assertEqual((cut, info["files"], info["bytes"]),
                         (b"c\nzz", 2, 4))
        self.assertEqual(corpus.stdlib_corpus(1, root=root), (data, dict(
            info, files=3, bytes=9, sha256=hashlib.sha256(data)
            .hexdigest())))  # the same twice
        with self.assertRaises(SystemExit):
            corpus.stdlib_corpus(1, root=os.path.join(root, "none"))
        for bad in (0, -1, math.inf, math.nan):
            with self.assertRaises(ValueError):
                corpus.stdlib_corpus(bad, root=root)


class PlanTest(unittest.TestCase):
    """experiments/gpu_plan.py's planning on a fake clock (issue 50): runs
    start while what they are expected to take fits the time left, pairs
    of the static variants first, and what can no longer fit is skipped
    once nothing runs that could make the estimate smaller."""

    def test_runs_start_while_they_fit_and_the_rest_are_skipped(self):
        import gpu_plan
        now = [0.0]
        p = gpu_plan.Plan(100, clock=lambda: now[0], guess_s=10,
                          parallel=2)
        a, b = p.next(), p.next()
        self.assertEqual([a, b], [("A", 1, ("low",)), ("A", 1, ("high",))])
        self.assertIsNone(p.next())  # both slots taken
        now[0] = 30.0
        p.finished(a)
        p.finished(b)  # 30 s each: 36 s expected from now on
        c, d = p.next(), p.next()
        self.assertEqual([c[1], d[1]], [2, 2])
        self.assertAlmostEqual(p.expected(c), 36.0)
        now[0] = 60.0
        p.finished(c)
        e = p.next()  # 60 + 36 <= 100
        self.assertEqual(e[:2], ("A", 3))
        now[0] = 70.0
        # 70 + 36 > 100, but d still runs: wait, skip nothing yet
        self.assertIsNone(p.next())
        self.assertEqual(p.skipped, [])
        p.finished(d)
        p.finished(e)
        # nothing runs now: what cannot fit in the 30 s left is skipped
        self.assertIsNone(p.next())
        self.assertEqual([t[:2] for t in p.skipped],
                         [("A", 3), ("B", 1), ("B", 2), ("B", 3)])
        self.assertTrue(p.done())
        # B's estimate: its three variants, each the median of its own
        # (or of all variants, before any of its own finished)
        self.assertAlmostEqual(p.expected(("B", 1, ("gnmr", "random",
                                                    "nanonly"))),
                               3 * 30.0 * 1.2)
        for bad in (dict(budget_s=0), dict(budget_s=10, guess_s=0),
                    dict(budget_s=10, parallel=0)):
            with self.assertRaises(ValueError):
                gpu_plan.Plan(**bad)

    def test_fp4_on_the_gpu_plans_its_harm_first_then_its_budget(self):
        import argparse
        import gpu_plan
        t = gpu_plan.tasks("fp4")
        self.assertEqual(t[:2], [("A", 1, ("low",)), ("A", 1, ("high",))])
        self.assertEqual(t[-1], ("B", 3, ("static", "random",
                                          "gnmr_measure")))
        self.assertEqual(len(t), 9)
        a = argparse.Namespace(experiment="fp4", corpus_mb=64.0,
                               device="cuda", steps=1000, gnmrd_bin="",
                               size="60m")
        args = gpu_plan.paper_args(t[-1], a, "x.json")
        self.assertEqual(args[:2], ["--setting", "fp4"])
        # NVIDIA's static choice is the last block: layers.11 of 12
        i = args.index("--static-pattern")
        self.assertEqual(args[i + 1], "layers[.]11[.]")
        self.assertEqual(args[args.index("--max-active") + 1], "7")
        self.assertEqual(args[args.index("--share-of") + 1], "static")
        a.experiment = "act4"
        self.assertEqual(gpu_plan.paper_args(t[0], a, "x.json")[:2],
                         ["--setting", "act4"])
        with self.assertRaises(KeyError):
            gpu_plan.tasks("fp8")

    def test_the_table_so_far(self):
        import gpu_plan
        r = {"seeds": [1], "variants": {
            v: {"val": [x], "exceed": [0.01], "damage": [0.2],
                "step_ms": [14.0]} for v, x in (("low", 2.5),
                                               ("high", 2.4))}}
        r2 = {"seeds": [2], "variants": {
            v: {"val": [x], "exceed": [0.0], "damage": [0.1],
                "step_ms": [15.0]} for v, x in (("low", 2.7),
                                               ("high", 2.5))}}
        md = gpu_plan.summary_md([r, r2])
        self.assertIn("| low | 1,2 | 2.6000 | 0.0050 | 0.1500 | 14.5 |", md)
        self.assertIn("low - high over seeds [1, 2]: +0.1500 +- 0.0500 (SE)"
                      ", 3.0 SE", md)
        self.assertNotIn("low - high", gpu_plan.summary_md([]))


class ReadsTest(unittest.TestCase):
    def test_a_steps_reads_are_one_and_the_same_numbers(self):
        """The harness reads the units' norms and the gradients'
        finiteness at once (one synchronisation a step on a GPU): the
        same numbers as reading each parameter."""
        import harness
        torch.manual_seed(0)
        units = [torch.nn.Linear(5, 3), torch.nn.Linear(3, 2, bias=False),
                 torch.nn.Linear(2, 2)]
        for m in units[:2]:
            for p in m.parameters():
                p.grad = torch.randn_like(p)
        units[2].weight.grad = torch.randn_like(units[2].weight)
        want = []
        for m in units:
            s = 0.0
            for p in m.parameters():
                if p.grad is not None:
                    s += float(p.grad.double().pow(2).sum())
            want.append(math.sqrt(s))
        self.assertEqual(harness.unit_norms(units), want)
        params = [p for m in units for p in m.parameters()]
        self.assertTrue(harness.all_finite(params))
        units[1].weight.grad[0, 0] = math.inf
        self.assertFalse(harness.all_finite(params))
        self.assertTrue(harness.all_finite([]))
        self.assertEqual(harness.unit_norms([torch.nn.Linear(2, 2)]), [0.0])


if __name__ == "__main__":
    unittest.main()


def _measured_trace(path, seed, episodes=()):
    """A measured trace of 8 units over 300 steps: steady norms, a
    steady measure (1% noise), and in each (unit, first step) of
    episodes a 5-step outlier that doubles the unit's measure, with its
    damage lines (0.5 in the episode, 0.01 outside)."""
    import random
    rng = random.Random(seed)
    ep = {(t, u) for u, t0 in episodes for t in range(t0, t0 + 5)}
    with open(path, "w") as f:
        for u in range(8):
            f.write(f"# unit {u} model.layers.0.u{u}\n")
        for t, u in sorted(ep):
            f.write(f"# episode {t} {u}\n")
        for t in range(1, 301):
            for u in range(8):
                f.write(f"# damage {t} {u} {0.5 if (t, u) in ep else 0.01}\n")
        f.write("step,unit,norm,measure\n")
        for t in range(1, 301):
            for u in range(8):
                x = (0.1 + 0.01 * u) * (1 + 0.01 * rng.uniform(-1, 1))
                if (t, u) in ep:
                    x *= 2
                n = 1 + 0.05 * rng.uniform(-1, 1)
                f.write(f"{t},{u},{n!r},{x!r}\n")


class NoiseRuleTest(unittest.TestCase):
    """experiments/measure_noise.py: the measure judged in units of each
    unit's own noise, replayed offline beside the ratios in force."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gnmr-noise-test-")
        self.clean = os.path.join(self.tmp, "clean.csv")
        self.hurt = os.path.join(self.tmp, "hurt.csv")
        _measured_trace(self.clean, 1)
        _measured_trace(self.hurt, 2, [(u, 40 + 30 * u) for u in range(8)])

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_a_doubled_steady_measure_is_seen_in_its_own_noise(self):
        import measure_noise as mn
        import measure_defaults as md
        from gnmr.policy import read_trace
        trace, n, meas = read_trace(self.hurt, measures=True)
        dmg = md.read_damage(self.hurt, 0.2)
        self.assertEqual(len(dmg), 40)
        force = dict(measure_alpha=4, measure_beta=3)
        dec, _, _, _ = md.run(trace, n, meas, force)
        self.assertEqual(md.routed(dec, dmg, n)[0], 0.0)  # 2x < αm 4
        make = lambda n, **kw: mn.NoisePolicy(n, 8, clip=True, **kw)  # noqa
        dec, _, _, _ = md.run(trace, n, meas, force, make)
        cov, prec, share = md.routed(dec, dmg, n)
        self.assertGreaterEqual(cov, 0.6)   # the first step is the lag's
        self.assertGreater(prec, 0.3)  # the base rate: 40 of 2,400
        # quiet on the clean trace: no measured exceedance
        trace, n, meas = read_trace(self.clean, measures=True)
        _, risky, elig, _ = md.run(trace, n, meas, force, make)
        self.assertEqual(risky, 0)
        self.assertGreater(elig, 0)
        # a κ no z reaches: the policy's own decisions, step for step
        huge = lambda n, **kw: mn.NoisePolicy(n, 1e12, **kw)  # noqa
        trace, n, meas = read_trace(self.hurt, measures=True)
        self.assertEqual(md.run(trace, n, meas, force)[0],
                         md.run(trace, n, meas, force, huge)[0])

    def test_the_tables_and_baselines_print_and_bad_input_is_refused(self):
        import measure_noise as mn
        bounds = os.path.join(self.tmp, "tuned.json")
        with open(bounds, "w") as f:
            json.dump({"bounds": {f"model.layers.0.u{u}": 0.13 + 0.01 * u
                                  for u in range(8)}}, f)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            mn.md.main([self.clean, "--damaged", self.hurt,
                        "--damage-error", "0.2"], sets=mn.SETS,
                       doc=mn.__doc__)
            mn.baselines([self.hurt], bounds, 0.2)
        out = buf.getvalue()
        self.assertIn("| am=4 bm=3 + kappa=8 clipped |", out)
        self.assertIn("the measure alone", out)
        self.assertIn("40 unit-steps in an episode", out)
        bad = os.path.join(self.tmp, "bad.csv")
        with open(bad, "w") as f:
            f.write("# damage 1 x 0.5\nstep,unit,norm,measure\n1,0,1,0.1\n")
        with self.assertRaises(ValueError):
            mn.md.read_damage(bad, 0.2)
        with contextlib.redirect_stderr(io.StringIO()), \
                self.assertRaises(SystemExit):
            mn.md.main([os.path.join(self.tmp, "absent.csv")], sets=mn.SETS)
