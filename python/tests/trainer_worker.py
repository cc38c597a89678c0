# SPDX-License-Identifier: MIT
"""A small Llama (or Mixtral) from a config, trained by the Hugging Face
Trainer or Lightning with GNMR's callback against a real gnmrd; run by
test_integrations.py as one process or under torchrun (DDP on gloo).

    trainer_worker.py hf|lightning ENDPOINT JOB OUTDIR STEPS [llama|mixtral]

Writes OUTDIR/rankR.jsonl: one line per optimizer step (the callback's
result: step, active, nonfinite, skipped) and, per forward, the routes
the switchable linears had then; OUTDIR/trace.csv (rank 0): the norms
gnmrd decided from; OUTDIR/weights.pt (rank 0): the weights after the
step with a NaN and before it, to check that the skip changed nothing.
A NaN is put in one unit's gradient at step NAN_STEP on rank 1 (rank 0
when alone): every rank must skip that step.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import gnmr  # noqa: E402

NAN_STEP = 9
ACCUM = 2
NAN_UNIT = "model.layers.1.self_attn.q_proj"


def small_model(family, seed=0):
    import transformers
    torch.manual_seed(seed)
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if family == "mixtral":
        cfg = transformers.MixtralConfig(num_local_experts=4,
                                         num_experts_per_tok=2, **common)
        return transformers.MixtralForCausalLM(cfg)
    cfg = transformers.LlamaConfig(**common)
    return transformers.LlamaForCausalLM(cfg)


class Tokens(torch.utils.data.Dataset):
    """Deterministic synthetic token sequences (nothing downloaded)."""

    def __init__(self, n, length=16, vocab=128, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


PARAMS = dict(warmup_steps=2, max_active=1, lock_steps=1, alpha=1.3,
              beta=1.3)


def main():
    kind, endpoint, job, out, steps = sys.argv[1:6]
    if kind == "mismatch":
        return mismatch(endpoint, job)
    family = sys.argv[6] if len(sys.argv) > 6 else "llama"
    steps = int(steps)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    nan_rank = 1 if world > 1 else 0
    model = small_model(family)
    log = open(os.path.join(out, f"rank{rank}.jsonl"), "w")
    kw = dict(job=job, units="auto", recipe="fp8", endpoint=endpoint,
              params=gnmr.default_params(**PARAMS), wait_ms=5000)
    if rank == 0:
        kw["trace"] = os.path.join(out, "trace.csv")
    state = {"backward": 0, "forward_routes": []}

    def grad_hook(g):
        state["backward"] += 1
        step = (state["backward"] - 1) // ACCUM + 1
        if step == NAN_STEP and rank == nan_rank:
            g = g.clone()
            g[0, 0] = math.nan
        return g

    def record(res, skipped):
        log.write(json.dumps({"step": res.step, "active": sorted(res.active),
                              "nonfinite": sorted(res.nonfinite or []),
                              "skipped": skipped, "on_time": res.on_time,
                              "forwards": state["forward_routes"]}) + "\n")
        log.flush()
        state["forward_routes"] = []

    if kind == "hf":
        from gnmr.integrations.hf import GnmrCallback
        cb = GnmrCallback(**kw)
        run_hf(model, cb, out, steps, world, state, grad_hook, record)
    else:
        from gnmr.integrations.lightning import GnmrCallback
        cb = GnmrCallback(**kw)
        run_lightning(model, cb, out, steps, world, state, grad_hook, record)
    log.close()


def mismatch(endpoint, job):
    """Each rank a different unit pattern: an error on every rank."""
    torch.distributed.init_process_group("gloo")
    from gnmr.integrations._common import Session
    rank = torch.distributed.get_rank()
    s = Session(job=job, endpoint=endpoint, join_wait_ms=0,
                units=r"q_proj$" if rank == 0 else r"(q|k)_proj$")
    try:
        s.start(small_model("llama"))
    finally:
        s.close()
        torch.distributed.destroy_process_group()


def watch(model, state):
    """Per forward, the route each switchable linear had."""
    def pre(mod, args, kwargs):
        if mod.training:
            state["forward_routes"].append(sorted(
                n for n, m in mod.named_modules()
                if getattr(m, "recovery", False)))
    model.register_forward_pre_hook(pre, with_kwargs=True)


def step_recorder(session, record, snapshot, model):
    """Wraps session.step to record each result (and the weights around
    the NaN step): the skip is known there, the decision when the session
    takes it (begin_step, before the next forward)."""
    inner, begin, skipped = session.step, session.begin_step, {}

    def step(t, m):
        if t == NAN_STEP:
            snapshot["before"] = {k: v.detach().clone()
                                  for k, v in model.state_dict().items()}
        if t == NAN_STEP + 1:  # the weights NAN_STEP's update left
            snapshot["after"] = {k: v.detach().clone()
                                 for k, v in model.state_dict().items()}
        res, skipped[t] = inner(t, m)
        assert res is None, "overlapped: the decision is taken later"
        return res, skipped[t]

    def begin_step():
        res = begin()
        if res is not None:
            record(res, skipped.pop(res.step))
        return res
    session.step, session.begin_step = step, begin_step


def run_hf(model, cb, out, steps, world, state, grad_hook, record):
    import transformers
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUM, learning_rate=1e-3,
        logging_steps=4, report_to=["tensorboard"], save_strategy="no",
        use_cpu=True, ddp_backend="gloo" if world > 1 else None,
        dataloader_num_workers=0, disable_tqdm=True, seed=0,
        max_grad_norm=1.0)
    trainer = transformers.Trainer(model=model, args=args,
                                   train_dataset=Tokens(64),
                                   callbacks=[cb])
    snap = {}
    # after the Trainer made the callback convert the linears
    dict(model.named_parameters())[NAN_UNIT + ".weight"].register_hook(
        grad_hook)
    watch(model, state)
    step_recorder(cb.session, record, snap, model)
    trainer.train()
    finish(model, snap, out, trainer.state.log_history)


def run_lightning(model, cb, out, steps, world, state, grad_hook, record):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def training_step(self, batch, i):
            loss = self.net(**batch).loss
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    lm = Module(model)
    snap = {}
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy="ddp" if world > 1
        else "auto", max_steps=steps, accumulate_grad_batches=ACCUM,
        logger=L.pytorch.loggers.TensorBoardLogger(out, name="tb"),
        log_every_n_steps=4, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        gradient_clip_val=1.0, callbacks=[cb])
    dl = torch.utils.data.DataLoader(Tokens(64), batch_size=2)
    orig_setup = cb.setup

    def setup(trainer, pl_module, stage):
        orig_setup(trainer, pl_module, stage)
        dict(model.named_parameters())[NAN_UNIT + ".weight"].register_hook(
            grad_hook)
        watch(model, state)
        step_recorder(cb.session, record, snap, model)
    cb.setup = setup
    trainer.fit(lm, dl)
    finish(model, snap, out, [])


def finish(model, snap, out, history):
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save({"before": snap.get("before"), "after": snap.get("after"),
                    "history": history},
                   os.path.join(out, "weights.pt"))


if __name__ == "__main__":
    main()
