# SPDX-License-Identifier: MIT
"""GNMR for the Hugging Face Trainer, in three lines:

    from gnmr.integrations.hf import GnmrCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[GnmrCallback(job="my-run", recipe="fp8")])

What it does, from the trainer's own state:

- Units: units="auto" is every nn.Linear but the output head (q/k/v/o,
  gate/up/down of a Llama), and each expert of fused MoE weights (Mixtral,
  Qwen-MoE); or a regular expression on module names (r"layers\\.\\d+$":
  the blocks). recipe says what a unit's recovery path is: "fp8"
  (gnmr.recovery.FP8Linear), "int4" (KBitLinear), "torchao-float8"
  (torchao's float8 training, tensorwise; "-rowwise" and
  "-rowwise_with_gw_hp" for its other recipes), "te" (Transformer
  Engine's debug API: gnmr.integrations.te), None (observe: decisions
  are made and logged, nothing switches), or on_route(name, module,
  high). The linears are converted when the Trainer is made, keeping
  their parameters.
- Job and ranks: job= or GNMR_JOB, else the run name (args.run_name,
  else output_dir's name); the ranks from torch.distributed as the
  Trainer set it up; every rank must choose the same units (an error
  otherwise). Steps are the Trainer's global steps (the first is 1);
  with gradient accumulation GNMR reports once per optimizer step.
- Clipping: the Trainer clips (max_grad_norm) before its
  on_pre_optimizer_step hook, which would hide a unit's spike behind a
  common factor. The callback therefore sets args.max_grad_norm to 0
  for the run (restored at the end) and clips itself, after GNMR read
  the gradients, with the same max_grad_norm (Controller.clip_grad_norm_,
  torch's clip). The Trainer's logged grad_norm is still the norm before
  clipping. (DeepSpeed clips inside its engine: GNMR then reads clipped
  gradients.)
- Non-finite gradients: when any unit of the job has NaN/Inf (every rank
  sees the same set), every gradient is dropped (set to None) before
  optimizer.step(), so the weights and the optimizer's moments do not
  change: the step is skipped, as GradScaler skips one; the learning-rate
  schedule still advances. gnmr/skipped_steps counts them;
  skip_nonfinite=False leaves them to the optimizer.
- Waiting: the gradients are reported in on_pre_optimizer_step and the
  skip is decided from the ranks' own counts there, without waiting for
  gnmrd; its decision (the routes) is taken in on_step_begin, before the
  next forward, by when its round trip is spent. overlap=False waits for
  it in on_pre_optimizer_step instead (docs/python.md, "What waits").
- Logging: gnmr/* figures (GnmrSession.metrics) are added to the
  Trainer's logs at its logging steps, so TensorBoard and every other
  reporter in report_to show them; the callback moves itself first in
  the Trainer's callback list for that (docs/python.md, "The trainer
  callbacks"). So a callback of yours that changes the gradients in
  on_pre_optimizer_step runs after GNMR read them: change them in
  the model's backward hooks, or pass them to GNMR yourself.

options= (a gnmr.Options) or its fields as keywords go to the Controller;
they are checked when the callback is made, before training starts.
"""
import os
import sys

from ._common import Session

try:
    import transformers
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError(f"gnmr.integrations.hf needs transformers "
                      f"(pip install 'gnmr[hf]'): {e}") from None

if not hasattr(TrainerCallback, "on_pre_optimizer_step"):
    raise ImportError(
        f"transformers {transformers.__version__} has no "
        "TrainerCallback.on_pre_optimizer_step, the hook GNMR reads the "
        "gradients in: use transformers 4.47 or newer")


class GnmrCallback(TrainerCallback):
    def __init__(self, job=None, units="auto", recipe=None, clip=True,
                 skip_nonfinite=True, max_logged_units=16, overlap=True,
                 options=None, **fields):
        """units, recipe, clip, skip_nonfinite, max_logged_units, overlap:
        the callback's own (docs/python.md); options and fields: the
        Controller's (gnmr.Options), checked here, before training."""
        self.session = Session(job, units, recipe, clip, skip_nonfinite,
                               max_logged_units, overlap, options, **fields)
        self._clip = None
        self._first = False

    @property
    def controller(self):
        return self.session.ctl

    def on_init_end(self, args, state, control, model=None, **kw):
        self.session.prepare(model)
        self._first = _move_first(self)

    def on_train_begin(self, args, state, control, model=None, **kw):
        if args.max_grad_norm and args.max_grad_norm > 0 and \
                self.session.clip:
            self._clip, args.max_grad_norm = args.max_grad_norm, 0.0
        name = args.run_name or os.path.basename(
            os.path.normpath(args.output_dir or "trainer"))
        # resume_from_checkpoint has restored state.global_step by now
        self.session.start(model, default_job=name, default_data_dir=(
            os.path.join(args.output_dir or "trainer", "gnmr")),
            resumed=state.global_step > 0)

    def on_step_begin(self, args, state, control, **kw):
        self.session.begin_step()  # the last step's routes, for this one

    def on_pre_optimizer_step(self, args, state, control, model=None,
                              **kw):
        res, skipped = self.session.step(state.global_step + 1, model)
        if not skipped and self._clip:
            self.session.ctl.clip_grad_norm_(model.parameters(), self._clip)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is not None and "loss" in logs:  # a training log
            logs.update(self.session.metrics())

    def on_train_end(self, args, state, control, **kw):
        if self._clip is not None:
            args.max_grad_norm, self._clip = self._clip, None
        self.session.close()


def _move_first(cb):
    """Puts cb first in the CallbackHandler that is calling it (so that
    its on_log adds GNMR's figures before the reporters write the logs).
    Safe inside the handler's loop: the callbacks after cb keep their
    positions. False when no handler is found (the figures then reach
    only the callbacks after it)."""
    f = sys._getframe(1)
    while f is not None:
        h = f.f_locals.get("self")
        if isinstance(h, CallbackHandler) and cb in h.callbacks:
            h.callbacks.remove(cb)
            h.callbacks.insert(0, cb)
            return True
        f = f.f_back
    return False
