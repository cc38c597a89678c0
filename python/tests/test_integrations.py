# SPDX-License-Identifier: MIT
"""Where training loops live: GNMR's callbacks for the Hugging Face Trainer
and Lightning (a small Llama and a small Mixtral from a config, real
gnmrd, one process and DDP on gloo under torchrun), torchao float8 as a
switchable low-cost path, and Transformer Engine's debug API through
nvdlfw-inspect's own registry and YAML parsing.

For each trainer run: every rank got the same decisions, on time; the
step with a NaN (in one rank's gradient) was skipped on every rank and
left the weights as they were; the routes decided at step t were those
of the switchable linears at step t+1's forwards; gnmrd's decisions
equal `gnmrctl replay` of the trace the run recorded; the gnmr/* figures
reached the trainer's TensorBoard logs.
"""
import glob
import json
import math
import os
import shutil
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from test_gnmr import Daemon  # noqa: E402
from test_distributed import gnmrctl, live_and_replayed  # noqa: E402
import trainer_worker as W  # noqa: E402
import gnmr  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 16
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
           HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def tb_scalars(root):
    """{tag: [(step, value)]} of every TensorBoard event file under root."""
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    out = {}
    for f in glob.glob(os.path.join(root, "**", "events.out.tfevents.*"),
                       recursive=True):
        acc = EventAccumulator(f)
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value)
                                           for e in acc.Scalars(tag))
    return out


def te_namespace():
    """TE's namespace API when TE is installed, else the stand-in; made
    before gnmr.integrations.te registers its feature (nvdlfw-inspect
    logs, through a logger that initialize() makes, when a namespace
    API comes after its features)."""
    from nvdlfw_inspect.base import BaseNamespaceAPI
    from nvdlfw_inspect.registry import Registry
    try:
        import transformer_engine.debug  # noqa: F401
    except ImportError:
        class Defaults:
            def fp8_gemm_enabled(self, config, layer_name, gemm,
                                 iteration):
                return True, None

        @Registry.register_namespace_api(namespace="transformer_engine")
        class StandIn(BaseNamespaceAPI):
            def __init__(self):
                super().__init__()
                self._default_api_impl = Defaults()
                self._cacheable_api_kwargs_map = {
                    "fp8_gemm_enabled": ["gemm"]}

            def input_assertions_hook(self, api_name, **kw):
                assert "gemm" in kw

            def routing_condition(self, api_name, config, _, feat, **kw):
                return feat.parse_config_and_api(
                    config, gemm_parsing=True, tensor_parsing=False, **kw)

            def output_assertions_hook(self, api_name, ret, **kw):
                assert isinstance(ret, tuple)

            def is_multiple_feature_invocation_allowed(self, api_name):
                return True
    import gnmr.integrations.te  # noqa: F401 - its nvdlfw-inspect fix


te_namespace()


class TrainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def run_worker(self, kind, nproc, family="llama", job=None):
        out = tempfile.mkdtemp(prefix=f"gnmr-{kind}-")
        self.addCleanup(shutil.rmtree, out, True)
        job = job or f"{kind}-{family}-{nproc}"
        args = [os.path.join(HERE, "trainer_worker.py"), kind, self.d.agents,
                job, out, str(STEPS), family]
        cmd = [sys.executable, *args] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "--monitor-interval=0.2", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env=dict(ENV, TMPDIR=out))
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-6000:])
        self.stderr = p.stderr
        ranks = []
        for r in range(nproc):
            with open(os.path.join(out, f"rank{r}.jsonl")) as f:
                ranks.append([json.loads(line) for line in f])
        return job, out, ranks

    def check(self, kind, nproc, family="llama"):
        job, out, ranks = self.run_worker(kind, nproc, family)
        prefix = "net." if kind == "lightning" else ""
        nan_unit = prefix + W.NAN_UNIT
        for r, res in enumerate(ranks):
            self.assertEqual([x["step"] for x in res],
                             list(range(1, STEPS + 1)))
            self.assertTrue(all(x["on_time"] for x in res), (r, res))
            self.assertEqual(
                [(x["active"], x["nonfinite"], x["skipped"]) for x in res],
                [(x["active"], x["nonfinite"], x["skipped"])
                 for x in ranks[0]], f"rank {r} differs")
        res = ranks[0]
        self.assertEqual([x["step"] for x in res if x["skipped"]],
                         [W.NAN_STEP])
        # said at WARNING, once on each rank, naming the step and the unit
        # (on the rank that had it)
        said = [ln for ln in self.stderr.splitlines()
                if f"gnmr: step {W.NAN_STEP} was skipped" in ln]
        self.assertEqual(len(said), nproc, self.stderr[-3000:])
        self.assertTrue(any(nan_unit in ln for ln in said), said)
        self.assertEqual(res[W.NAN_STEP - 1]["nonfinite"], [nan_unit])
        w = torch.load(os.path.join(out, "weights.pt"))
        self.assertTrue(all(torch.equal(w["before"][k], w["after"][k])
                            for k in w["before"]), "the skipped step moved")
        # the routes decided at step t are the linears' at t+1's forwards
        for prev, cur in zip(res, res[1:]):
            want = sorted(n[len(prefix):] for n in prev["active"]
                          if ".experts." not in n)  # no switch: fused
            self.assertEqual(len(cur["forwards"]), W.ACCUM)
            for f in cur["forwards"]:
                self.assertEqual(f, want, cur["step"])
        # gnmrd's decisions are those of the recorded trace, replayed
        got, want = live_and_replayed(self.d, job,
                                      os.path.join(out, "trace.csv"))
        self.assertEqual(got, want)
        units = json.loads(gnmrctl(self.d, "units", job, "--json"))
        units = units["units"] if isinstance(units, dict) else units
        names = {u["id"]: u["name"] for u in units}
        self.assertEqual([sorted(x["active"]) for x in res],
                         [sorted(names[i] for i in a) for _, a in want])
        # the figures reached the trainer's TensorBoard logs
        tb = tb_scalars(out)
        skipped = [k for k in tb if k.endswith("gnmr/skipped_steps")]
        self.assertTrue(skipped, sorted(tb))
        self.assertEqual(max(v for _, v in tb[skipped[0]]), 1.0)
        # at every logging step, quiet or not; a score only when finite
        # (the NaN step's +inf was logged before, issue 63)
        exceeded = [k for k in tb if k.endswith("gnmr/exceeded_units")]
        self.assertTrue(exceeded, sorted(tb))
        self.assertEqual(len(tb[exceeded[0]]), len(tb[skipped[0]]))
        for k in tb:
            if "gnmr/max_score" in k or "gnmr/score/" in k:
                self.assertTrue(all(math.isfinite(v) for _, v in tb[k]),
                                (k, tb[k]))
        return names

    def test_hf_trainer_one_process(self):
        names = self.check("hf", 1)
        self.assertIn("model.layers.0.mlp.gate_proj", names.values())
        self.assertNotIn("lm_head", names.values())  # the head: not auto

    def test_hf_trainer_ddp(self):
        self.check("hf", 2)

    def test_lightning_one_process(self):
        self.check("lightning", 1)

    def test_lightning_ddp(self):
        self.check("lightning", 2)

    def test_hf_trainer_resumed_from_a_checkpoint_continues_its_run(self):
        """Issue 48, item 4: a Trainer that ran to its end (the run
        finished) and is then resumed from its checkpoint goes on with
        that run, its statistics and step numbers (one run in gnmrd's
        history, said at INFO); not a new run with its warm-up again."""
        import transformers
        from gnmr.integrations.hf import GnmrCallback
        out = tempfile.mkdtemp(prefix="gnmr-hf-resume-")
        self.addCleanup(shutil.rmtree, out, True)
        job = "hf-resume"

        def train(steps, resume):
            args = transformers.TrainingArguments(
                output_dir=out, max_steps=steps, per_device_train_batch_size=2,
                learning_rate=1e-3, save_strategy="steps", save_steps=4,
                report_to=[], use_cpu=True, dataloader_num_workers=0,
                disable_tqdm=True, seed=0)
            cb = GnmrCallback(job=job, units="auto", endpoint=self.d.agents,
                              params=gnmr.default_params(**W.PARAMS),
                              wait_ms=5000)
            trainer = transformers.Trainer(
                model=W.small_model("llama"), args=args,
                train_dataset=W.Tokens(64), callbacks=[cb])
            with self.assertLogs("gnmr", "INFO") as logs:
                trainer.train(resume_from_checkpoint=resume)
            return "\n".join(logs.output)

        first = train(4, None)
        self.assertRegex(first, r"a new run, \d+")
        run = re.search(r"a new run, (\d+)", first).group(1)
        second = train(8, os.path.join(out, "checkpoint-4"))
        self.assertIn(f"goes on with run {run} after step 4", second)
        rows = gnmrctl(self.d, "runs", job, "--csv").strip().splitlines()
        self.assertEqual(len(rows), 2, rows)  # the header and one run
        rows = gnmrctl(self.d, "decisions", job, "--csv").strip()
        self.assertEqual([int(r.split(",")[0]) for r in rows.splitlines()[1:]],
                         list(range(1, 9)), rows)  # steps 1-8, each once

    def test_mixtral_fused_experts_stay_out_of_the_budget(self):
        """recipe="fp8" switches converted nn.Linear: a Mixtral's fused
        experts have no path it can switch, so they are not units (they
        held the budget while nothing switched), said once at WARNING
        with their names; the attention projections are units."""
        names = set(self.check("hf", 1, family="mixtral").values())
        self.assertFalse([n for n in names if ".experts." in n], names)
        self.assertIn("model.layers.0.self_attn.q_proj", names)
        self.assertNotIn("model.layers.0.mlp.gate", names)  # the router
        said = [ln for ln in self.stderr.splitlines()
                if "the fused experts of 2 module(s)" in ln]
        self.assertEqual(len(said), 1, self.stderr[-3000:])
        self.assertIn("model.layers.0.mlp.experts (4 experts)", said[0])

    def test_unit_selection_differing_between_ranks_is_an_error(self):
        out = tempfile.mkdtemp(prefix="gnmr-mismatch-")
        self.addCleanup(shutil.rmtree, out, True)
        p = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", "--monitor-interval=0.2",
             os.path.join(HERE, "trainer_worker.py"), "mismatch",
             self.d.agents, "mismatch", out, "1"],
            capture_output=True, text=True, timeout=300,
            env=dict(ENV, TMPDIR=out))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("the ranks chose different units", p.stderr)


class OverlapTest(unittest.TestCase):
    """What the callbacks' session waits for (docs/python.md, "What
    waits"): overlapped (the default), nothing between the report and the
    optimizer step, and the same skips, routes and decisions as the
    synchronous session, which waits for gnmrd there."""

    def setUp(self):
        self.d = Daemon()

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def run_session(self, overlap, job):
        import gnmr
        from gnmr.integrations._common import Session
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                  torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                  torch.nn.Linear(8, 2))
        s = Session(job=job, endpoint=self.d.agents, overlap=overlap,
                    recipe=None, wait_ms=5000,
                    params=gnmr.default_params(**W.PARAMS))
        ctl = s.start(net)
        waits = []
        inner = ctl.agent.wait
        ctl.agent.wait = lambda *a: waits.append(a) or inner(*a)
        x = torch.randn(16, 8)
        out = []
        for t in range(1, 13):
            s.begin_step()
            net.zero_grad()
            net(x * (1 + t % 3)).pow(2).mean().backward()
            if t == 5:
                net[2].weight.grad.mul_(40.0)  # a spike: promoted
            if t == 8:
                net[0].bias.grad[0] = math.nan
            before = len(waits)
            res, skipped = s.step(t, net)
            out.append((t, skipped, len(waits) - before))
        s.close()
        return s, out

    def test_the_overlapped_session_waits_for_nothing_before_the_optimizer(
            self):
        from gnmr.integrations._common import Session  # noqa: F401
        a, got_a = self.run_session(True, "overlap-on")
        b, got_b = self.run_session(False, "overlap-off")
        self.assertEqual([w for _, _, w in got_a], [0] * 12)
        self.assertEqual([w for _, _, w in got_b], [1] * 12)
        self.assertEqual([k for _, k, _ in got_a], [k for _, k, _ in got_b])
        self.assertEqual([t for t, k, _ in got_a if k], [8])
        self.assertEqual((a.skipped, a.steps), (b.skipped, b.steps))
        # the same decisions: the runs' histories in gnmrd
        rows = [[(r["step"], r["active"]) for r in json.loads(gnmrctl(
                    self.d, "decisions", job, "--json"))["decisions"]]
                for job in ("overlap-on", "overlap-off")]
        self.assertEqual(rows[0], rows[1])
        self.assertEqual(len(rows[0]), 12)
        self.assertTrue(any(a for _, a in rows[0]), rows[0])


class Fp4RecipeTest(unittest.TestCase):
    """recipe="nvfp4" (issue 61): the callbacks' session converts the
    linears to QuantLinear (NVFP4, BF16 to recover), sends their measure
    as the measured signal, and a unit whose low path a latent outlier
    spoils is moved to its recovery path, named as the measure's."""

    def setUp(self):
        self.d = Daemon()

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def test_nvfp4_sends_its_measure_and_recovers_by_it(self):
        import gnmr
        from gnmr import recipes
        from gnmr.integrations._common import Session
        from gnmr.quant import QuantLinear
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(),
                                  torch.nn.Linear(48, 24))
        s = Session(job="nvfp4-job", endpoint=self.d.agents,
                    recipe="nvfp4", wait_ms=5000, overlap=False,
                    params=gnmr.default_params(warmup_steps=0))
        s.prepare(net)
        self.assertEqual(sorted(s.converted), ["0", "2"])
        self.assertTrue(all(isinstance(net[i], QuantLinear) and
                            net[i].low.name == "nvfp4" for i in (0, 2)))
        ctl = s.start(net)
        self.assertIs(ctl._reduction.measure, recipes.get("nvfp4").measure)
        self.assertIs(recipes.get("nvfp4").measure,
                      __import__("gnmr.recovery").recovery.low_error)
        x = torch.randn(21, 32)   # 21 tokens: the wgrad's blocks padded
        active = []
        for t in range(1, 11):
            s.begin_step()
            net.zero_grad()
            if t == 7:   # 3 features x4096 that the weights undo
                net[2].latent = ([5, 21, 37], 4096.0)
            net(x).pow(2).mean().backward()
            res, _ = s.step(t, net)
            active.append(list(res.active))
        s.close()
        self.assertEqual(active[:6], [[]] * 6)
        self.assertEqual(active[6], ["2"])
        rows = gnmrctl(self.d, "history", "nvfp4-job", "--kind", "exceed")
        self.assertIn("signal=measure", rows)


class Fp8SpikeTest(unittest.TestCase):
    """Issue 61's acceptance: under recipe="fp8" at every default, a unit
    promoted for a two-step gradient spike leaves its recovery path
    within lock_steps + 2 steps (a user's trial saw 22), and clean steps
    keep the budget empty."""

    def setUp(self):
        self.d = Daemon()

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def test_a_two_step_spike_is_held_at_most_lock_steps_plus_two(self):
        import gnmr
        from gnmr.integrations._common import Session
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 4))
        s = Session(job="fp8-spike", endpoint=self.d.agents, recipe="fp8",
                    wait_ms=5000, overlap=False)
        s.prepare(net)
        self.assertEqual(sorted(s.converted), ["0", "2", "4"])
        s.start(net)
        lock = gnmr.default_params().lock_steps
        x = torch.randn(32, 16)
        active = []
        for t in range(1, 61):
            s.begin_step()
            net.zero_grad()
            net(x * (1 + 0.1 * math.sin(t))).pow(2).mean().backward()
            if t in (30, 31):  # a two-step spike in one unit
                net[2].weight.grad.mul_(40.0)
                net[2].bias.grad.mul_(40.0)
            res, _ = s.step(t, net)
            active.append(list(res.active))
        s.close()
        held = [t for t, a in enumerate(active, 1) if "2" in a]
        self.assertTrue(held, active)  # the spike was acted on
        self.assertLessEqual(len(held), lock + 2, (held, active))
        self.assertTrue(all(t >= 30 for t in held), held)
        quiet = [a for t, a in enumerate(active, 1) if t < 30 or t > 40]
        self.assertEqual(sum(len(a) for a in quiet), 0, active)


class RecipesTest(unittest.TestCase):
    """Issue 51: one registry from a recipe's name to (convert, switch,
    shadow), read by the callbacks and a loop of one's own alike."""

    def test_the_callbacks_and_a_loop_read_one_registry(self):
        from gnmr import recipes, recovery
        from gnmr.integrations._common import Session
        for name in ("fp8", "int4", "torchao-float8",
                     "torchao-float8-rowwise", "te"):
            self.assertIn(name, recipes.names())
            self.assertEqual(Session(recipe=name)._recipe,
                             recipes.get(name))
        fp8 = recipes.get("fp8")
        # the measured signal, not the shadow (issue 61)
        self.assertIs(fp8.measure, recovery.low_error)
        self.assertIsNone(fp8.shadow)
        self.assertIs(fp8.switch, recovery.switch)
        self.assertIs(recipes.get("int4").measure, recovery.low_error)
        self.assertIsNone(recipes.get("te").convert)
        # a loop converts with the registry's recipe and switches with it
        model = W.small_model("llama")
        done = fp8.convert(model, pattern=r"layers\.0\.")
        self.assertEqual(len(done), 7)
        mods = [m for m in model.modules() if isinstance(m, fp8.select)]
        self.assertEqual(len(mods), 7)
        fp8.switch(done[0], mods[0], True)
        self.assertTrue(mods[0].recovery)
        # the callbacks convert the same modules for the same name
        other = W.small_model("llama")
        s = Session(units=r"layers\.0\.", recipe="fp8")
        s.prepare(other)
        self.assertEqual(sorted(s.converted), sorted(done))
        t = recipes.get("torchao-float8")
        self.assertEqual(t.name, "torchao-float8")
        with self.assertRaisesRegex(ValueError, "recipe='fp4': one of fp8"):
            recipes.get("fp4")


class MistakesTest(unittest.TestCase):
    def test_bad_selections_and_recipes_are_clear_errors(self):
        from gnmr.integrations._common import Session
        model = W.small_model("llama")
        with self.assertRaisesRegex(ValueError, "no nn.Linear is in"):
            Session(units=r"nothing\.here$", recipe="fp8").prepare(model)
        with self.assertRaisesRegex(ValueError, "not a regular expression"):
            Session(units="[")
        with self.assertRaisesRegex(ValueError, "'auto'"):
            Session(units=3)
        with self.assertRaisesRegex(ValueError, "recipe='fp4'"):
            Session(recipe="fp4")
        with self.assertRaisesRegex(ValueError, "tensorwise, rowwise"):
            Session(recipe="torchao-float8-blockwise9")
        s = Session(units=r"nothing\.here$", job="j",
                    endpoint="tcp://127.0.0.1:1", join_wait_ms=0)
        with self.assertRaisesRegex(ValueError, "matched no module"):
            s.start(model)

    def test_recipe_te_without_nvdlfw_inspect_says_what_to_install(self):
        # issue 48: a bare ModuleNotFoundError; a Python without the
        # package is made by hiding it (None in sys.modules)
        code = ("import sys; sys.modules['nvdlfw_inspect'] = None\n"
                "sys.modules['nvdlfw_inspect.api'] = None\n"
                "sys.path.insert(0, '..')\n"
                "import trainer_worker as W\n"
                "from gnmr.integrations._common import Session\n"
                "s = Session(job='j', recipe='te', "
                "endpoint='tcp://127.0.0.1:1', join_wait_ms=0)\n"
                "s.start(W.small_model('llama'))\n")
        p = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=ENV,
                           capture_output=True, text=True, timeout=300)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ImportError: recipe=\"te\" runs GNMR as a "
                      "Transformer Engine debug feature", p.stderr)
        self.assertIn("pip install 'gnmr[te]'", p.stderr)

    def test_auto_units_of_a_peft_model_are_its_trainable_linears(self):
        # LoRA on the small Llama: the frozen base linears never have a
        # gradient, so units="auto" leaves them out (and says so once);
        # the adapters' linears are the units
        import peft
        from gnmr.integrations._common import Session
        model = peft.get_peft_model(W.small_model("llama"), peft.LoraConfig(
            r=4, target_modules=["q_proj", "v_proj"]))
        s = Session(job="j", endpoint="tcp://127.0.0.1:1", join_wait_ms=0)
        with self.assertLogs("gnmr", "INFO") as logs:
            select, pattern = s._pattern(model)
            s._pattern(model)
        self.assertEqual(len(logs.output), 1)
        self.assertIn("INFO:gnmr:gnmr: units='auto' leaves out",
                      logs.output[0])
        # with a recipe that converts: a warning (the base stays as it is)
        s8 = Session(job="j", endpoint="tcp://127.0.0.1:1", join_wait_ms=0,
                     recipe="fp8")
        with self.assertLogs("gnmr", "WARNING") as logs:
            s8._pattern(model)
        self.assertIn("recipe='fp8' converts the trainable nn.Linear only",
                      logs.output[0])
        rx = re.compile(pattern)
        picked = [n for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and rx.search(n)]
        self.assertTrue(picked)
        self.assertTrue(all(".lora_A." in n or ".lora_B." in n
                            for n in picked), picked)
        trainable = [n for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and any(
                         p.requires_grad for p in m.parameters(
                             recurse=False))]
        self.assertEqual(sorted(picked), sorted(trainable))

    def test_a_trainer_without_the_hook_is_named(self):
        code = ("import transformers.trainer_callback as t\n"
                "del t.TrainerCallback.on_pre_optimizer_step\n"
                "import gnmr.integrations.hf\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                           text=True, timeout=120, env=dict(
                               ENV, PYTHONPATH=os.path.join(HERE, "..")))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("has no TrainerCallback.on_pre_optimizer_step",
                      p.stderr)


class TorchaoTest(unittest.TestCase):
    def setUp(self):
        import torchao.float8  # noqa: F401 - the test needs it
        from gnmr import recovery
        self.r = recovery
        torch.manual_seed(0)

    def pair(self, recipe):
        import copy
        import torchao.float8 as f8
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 32))
        ref = copy.deepcopy(m)
        cfg = f8.Float8LinearConfig.from_recipe_name(recipe)
        import dataclasses
        f8.convert_to_float8_training(
            ref, config=dataclasses.replace(cfg, emulate=True))
        self.assertEqual(self.r.torchao_float8(m, recipe=recipe), ["0", "2"])
        return m, ref

    def test_low_path_is_torchaos_float8_and_recovery_is_exact(self):
        x = torch.randn(8, 32)
        for recipe in ("tensorwise", "rowwise"):
            m, ref = self.pair(recipe)
            y, yr = m(x), ref(x)
            self.assertTrue(torch.equal(y, yr), recipe)
            y.square().sum().backward()
            yr.square().sum().backward()
            for a, b in zip(m.parameters(), ref.parameters()):
                self.assertTrue(torch.equal(a.grad, b.grad), recipe)
            exact = torch.nn.functional.linear(torch.relu(
                torch.nn.functional.linear(x, m[0].weight, m[0].bias)),
                m[2].weight, m[2].bias)
            self.assertGreater((y - exact).abs().max().item(), 1e-4)
            for mod in (m[0], m[2]):  # the switch, at the next forward
                self.r.switch("u", mod, True)
            self.assertTrue(torch.equal(m(x), exact), recipe)
            for p in m.parameters():
                p.grad = None
            m(x).square().sum().backward()
            w = m[2].weight.detach().requires_grad_()
            h = torch.relu(torch.nn.functional.linear(x, m[0].weight,
                                                      m[0].bias)).detach()
            torch.nn.functional.linear(h, w, m[2].bias.detach()) \
                .square().sum().backward()
            self.assertTrue(torch.equal(m[2].weight.grad, w.grad))

    def test_route_changes_under_compile_do_not_recompile(self):
        from torch._dynamo.utils import counters
        m, _ = self.pair("tensorwise")
        torch._dynamo.reset()
        counters.clear()
        f = torch.compile(m, backend="eager")
        x = torch.randn(8, 32)
        routes = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 0)]
        graphs = []
        for a, b in routes:
            self.r.switch("0", m[0], a)
            self.r.switch("2", m[2], b)
            y = f(x)
            want = m(x)  # eager, the same route
            self.assertTrue(torch.equal(y, want))
            graphs.append(counters["stats"]["unique_graphs"])
        # one graph, made at the first call, with both routes inside it
        # (torch.cond): no graph break, 0 recompiles over 6 route changes
        self.assertEqual(graphs, [1] * len(routes))
        self.assertEqual(sum(counters["recompiles"].values()), 0)
        self.assertEqual(sum(counters["graph_break"].values()), 0,
                         dict(counters["graph_break"]))
        # backward through the graph: torchao's gradients on either route
        x.requires_grad_(True)
        for a, b in routes[:4]:
            self.r.switch("0", m[0], a)
            self.r.switch("2", m[2], b)
            got = []
            for g in (f, m):
                for p in m.parameters():
                    p.grad = None
                x.grad = None
                g(x).square().sum().backward()
                got.append([x.grad] + [p.grad for p in m.parameters()])
            for u, v in zip(*got):
                self.assertTrue(torch.equal(u, v), (a, b))
        # under autocast (which cond's branches cannot run under) the
        # choice is made outside the graph, the numbers still eager's
        counters.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for a, b in routes[:3]:
                self.r.switch("0", m[0], a)
                self.r.switch("2", m[2], b)
                self.assertTrue(torch.equal(f(x), m(x)))
        self.assertGreaterEqual(sum(counters["graph_break"].values()), 2)

    def test_refusals(self):
        import torchao.float8 as f8
        m = torch.nn.Sequential(torch.nn.Linear(32, 32))
        with self.assertRaisesRegex(ValueError, "has no float8 recipe"):
            self.r.torchao_float8(m, recipe="nope")
        with self.assertRaisesRegex(ValueError, "high-precision weight"):
            self.r.torchao_float8(m, config=f8.Float8LinearConfig(
                enable_fsdp_float8_all_gather=True))
        with self.assertRaisesRegex(ValueError, "no nn.Linear matches"):
            self.r.torchao_float8(m, pattern="x")
        with self.assertRaisesRegex(ValueError, "no nn.Linear matches"):
            self.r.torchao_float8(m, module_filter_fn=lambda mod, n: False)


class TransformerEngineFeatureTest(unittest.TestCase):
    """nvdlfw-inspect's real registry, YAML parsing and API routing; TE's
    namespace API itself needs CUDA, so without TE a stand-in with TE's
    calling convention (fp8_gemm_enabled(layer_name=, gemm=, iteration=),
    default (True, None)) is registered under its namespace."""

    def test_layers_on_their_recovery_path_leave_fp8(self):
        import nvdlfw_inspect.api as debug_api
        from gnmr.integrations import te
        from gnmr.pytorch import Controller
        d = Daemon()
        logs = tempfile.mkdtemp(prefix="gnmr-te-")
        self.addCleanup(shutil.rmtree, logs, True)
        yaml = os.path.join(logs, "gnmr.yaml")
        with open(te.CONFIG) as f:  # the shipped YAML, fprop/wgrad only
            text = f.read().replace("[fprop, dgrad, wgrad]",
                                    "[fprop, wgrad]")
        with open(yaml, "w") as f:
            f.write(text)
        debug_api.initialize(config_file=yaml, feature_dirs=[te.FEATURES],
                             log_dir=logs)
        try:
            import gnmr
            net = torch.nn.Sequential(torch.nn.Linear(8, 8),
                                      torch.nn.Linear(8, 8))
            ctl = Controller(net, d.agents, "te", params=gnmr.default_params(
                warmup_steps=0, max_active=1, lock_steps=2))
            te.bind(ctl)
            ask = debug_api.transformer_engine.fp8_gemm_enabled
            x = torch.randn(4, 8)
            for step in (1, 2):
                net(x).sum().backward()
                if step == 2:
                    net[1].weight.grad[0, 0] = math.nan
                ctl.step(step, wait_ms=5000)
                net.zero_grad()
            self.assertEqual(ctl.high, [False, True])
            for it in (5, 6):
                self.assertEqual(ask(layer_name="model.1", gemm="fprop",
                                     iteration=it), (False, it + 1))
                self.assertEqual(ask(layer_name="model.1", gemm="wgrad",
                                     iteration=it), (False, it + 1))
                self.assertEqual(ask(layer_name="model.0", gemm="fprop",
                                     iteration=it), (True, it + 1))
            # dgrad is not in the YAML's gemms: TE's default, FP8
            self.assertEqual(ask(layer_name="model.1", gemm="dgrad",
                                 iteration=7)[0], True)
            with self.assertRaisesRegex(ValueError, "another Controller"):
                te.bind(object())
            te.unbind(ctl)
            ctl.close()
        finally:
            debug_api.end_debug()
            d.stop()

    def test_bad_feature_config_is_named(self):
        from gnmr.integrations.te import GnmrRoutes
        f = GnmrRoutes()
        with self.assertRaisesRegex(ValueError, "unexpected key"):
            f.parse_config_and_api({"enabled": True, "gemmz": ["fprop"]},
                                   gemm_parsing=True, gemm="fprop")
        with self.assertRaisesRegex(ValueError, "gemms="):
            f.parse_config_and_api({"gemms": ["fwd"]}, gemm_parsing=True,
                                   gemm="fprop")
        self.assertEqual(f.parse_config_and_api(
            {"gemms": ["wgrad"]}, gemm_parsing=True, gemm="fprop"),
            (False, None))


if __name__ == "__main__":
    unittest.main()
