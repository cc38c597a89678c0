# SPDX-License-Identifier: MIT
"""GNMR for Lightning, in three lines:

    from gnmr.integrations.lightning import GnmrCallback
    trainer = lightning.Trainer(..., callbacks=[GnmrCallback(job="my-run",
                                                             recipe="fp8")])

Units, recipes, the job and the skip of non-finite steps are those of
gnmr.integrations.hf (see there); from Lightning:

- the linears are converted in the callback's setup() (before
  configure_optimizers; their parameters are kept), the Controller is made
  at on_train_start, once the strategy has wrapped and sharded the model;
- the gradients are read in on_before_optimizer_step, which Lightning
  calls after backward (and after unscaling under 16-mixed) and before it
  clips (gradient_clip_val): GNMR sees them unclipped, and Lightning's
  own clip stays as configured;
- gnmrd's decision (the routes) is taken in on_train_batch_start,
  before the next forward, not in on_before_optimizer_step (overlap=False:
  there, as hf explains);
- steps are trainer.global_step + 1 (optimizer steps; with
  accumulate_grad_batches, one report per optimizer step);
- a non-finite step drops every gradient before the optimizer step
  (counted in gnmr/skipped_steps);
- gnmr/* figures are logged with LightningModule.log at every step, so
  they reach the trainer's loggers (TensorBoardLogger and the others)
  at log_every_n_steps.

Manual optimization (automatic_optimization=False) has no
on_before_optimizer_step from Lightning's loop before your own
optimizer.step(): call the callback's controller yourself there.
"""
import os

from ._common import Session

try:
    import lightning
    from lightning.pytorch import Callback
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError(f"gnmr.integrations.lightning needs lightning "
                      f"(pip install 'gnmr[lightning]'): {e}") from None

if not hasattr(Callback, "on_before_optimizer_step"):  # pragma: no cover
    raise ImportError(
        f"lightning {lightning.__version__} has no "
        "Callback.on_before_optimizer_step: use lightning 2.0 or newer")


def _writes_logs(trainer):
    """Whether Lightning writes the values logged at this step (its logger
    connector's rule, which its own LearningRateMonitor reads); every step
    where that cannot be read."""
    v = getattr(getattr(trainer, "_logger_connector", None),
                "should_update_logs", None)
    return True if v is None else bool(v)


class GnmrCallback(Callback):
    def __init__(self, job=None, units="auto", recipe=None, clip=False,
                 skip_nonfinite=True, max_logged_units=16, overlap=True,
                 options=None, **fields):
        """As gnmr.integrations.hf.GnmrCallback (clip False: Lightning
        clips after the hook)."""
        self.session = Session(job, units, recipe, clip, skip_nonfinite,
                               max_logged_units, overlap, options, **fields)

    @property
    def controller(self):
        return self.session.ctl

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            self.session.prepare(pl_module)

    def on_train_start(self, trainer, pl_module):
        logger = trainer.logger
        name = getattr(logger, "name", None) if logger is not None else None
        # fit(ckpt_path=...) has restored trainer.global_step by now
        self.session.start(pl_module, default_job=name or "lightning",
                           default_data_dir=os.path.join(
                               trainer.default_root_dir, "gnmr"),
                           resumed=trainer.global_step > 0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.session.begin_step()  # the last step's routes, for this one

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.session.step(trainer.global_step + 1, pl_module)
        # the figures since the last logging step, on the steps whose logged
        # values Lightning writes (log_dict costs a millisecond a step; the
        # values of other steps were overwritten unread), none without a
        # logger
        if trainer.logger is None or not _writes_logs(trainer):
            return
        m = self.session.metrics()
        if m:
            pl_module.log_dict(m, on_step=True, on_epoch=False,
                               logger=True, prog_bar=False)

    def on_train_end(self, trainer, pl_module):
        self.session.close()

    def on_exception(self, trainer, pl_module, exception):
        self.session.close()
