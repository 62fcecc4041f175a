"""The Trainer's checkpoint side: what OUT/last.pt holds, its save (every rank sums, rank 0 writes),
and a resume from it under this run's config. A mixin of datapipe.train.loop.Trainer, whose
__init__ builds everything these methods read and write."""
from __future__ import annotations

import logging
import warnings
from dataclasses import asdict
from typing import Any

from ..storage import redact
from . import checkpoint, metrics_log
from .config import RUN_SETTINGS
from .ddp import all_sum
from .ema import ModelEma
from .figures import EpochSums

log = logging.getLogger("datapipe.train")


class CheckpointedRun:
    """_state, _save and _restore of a Trainer (attributes: see Trainer.__init__)."""

    def _state(self, sums: EpochSums) -> dict[str, Any]:
        """What last.pt holds (rank 0 only, so no collective here: counts agreed at the last check)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "model_ema": self.ema.state_dict() if self.ema is not None else None,
                "recipe": self.config.recipe.to_dict(),
                "scaler": self.scaler.state_dict(), "scheduler": self.scheduler.state_dict(),
                "loader": self.loader.state_dict(), "epoch": self.epoch, "step": self.step,
                "sums": asdict(sums), "metrics": self.metrics,
                "config": {**self.config.record(), "data": redact(self.config.data) if isinstance(self.config.data, str)
                           else [redact(d) for d in self.config.data]},  # no credentials in last.pt
                "world_size": self.env.world_size, "nonfinite": self.nonfinite + self.guard.agreed,
                "skipped_steps": self.skipped + int(self.guard.skipped.item())}

    def _save(self) -> None:
        """Every rank calls it (the epoch's sums are summed over ranks); rank 0 writes."""
        loss_sum, images, correct = all_sum([self.sums.loss_sum, self.sums.images, self.sums.correct], self.device)
        if self.env.is_main:
            sums = EpochSums(loss_sum, int(images), self.sums.wait, self.sums.seconds, correct)
            checkpoint.save(self.out / "last.pt", self._state(sums))

    def _restore(self, state: dict[str, Any]) -> None:
        """Continue from last.pt under this run's config: a setting that differs from the checkpoint's
        (a new --lr, --epochs) wins and is logged; the schedule keeps its position. Another recipe or
        optimizer was refused before (checkpoint.refuse_another_course)."""
        self.model.load_state_dict(state["model"])
        self._load_ema(state.get("model_ema"))
        self._load_optimization(state)
        self.scaler.load_state_dict(state["scaler"])
        self.loader.load_state_dict(state["loader"])  # a global position: any world size resumes from it
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.sums, self.metrics = EpochSums(**state["sums"]), list(state["metrics"])
        if self.env.is_main:  # lines a crash left past the checkpoint go, lines it missed come back
            metrics_log.rewrite(self.out, self.metrics)
        else:  # the saved loss, images and correct are every rank's: rank 0 carries them
            self.sums.loss_sum, self.sums.images, self.sums.correct = 0.0, 0, 0.0
        self.nonfinite, self.skipped = int(state.get("nonfinite", 0)), int(state.get("skipped_steps", 0))
        saved = state.get("config", {})
        for name in RUN_SETTINGS:
            if name != "recipe" and name in saved and saved[name] != getattr(self.config, name):
                log.info("resume: %s %s -> %s (this run's setting)", name, saved[name], getattr(self.config, name))
        before = (int(state.get("world_size", self.env.world_size)), saved.get("batch_size", self.config.batch_size),
                  saved.get("accum_steps", self.config.accum_steps))
        if before != (self.env.world_size, self.config.batch_size, self.config.accum_steps):
            # elastic, or a new batch size: steps per epoch changed, count the steps done at this one
            self.step = self.loader.epoch * self.steps_per_epoch + self.loader.batches_done // self.config.accum_steps
            log.warning("resuming a run of world size %d, batch size %d, accumulation %d at %d, %d, %d: step %d of %d "
                        "per epoch", *before, self.env.world_size, self.config.batch_size, self.config.accum_steps,
                        self.step, self.steps_per_epoch)
        self.scheduler.last_epoch = self.step - 1
        with warnings.catch_warnings():  # at step 0 torch warns of a step before optimizer.step(): none was due
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()  # this run's lr at this step: its base lr times its schedule
        log.info("resumed at epoch %d, step %d, sample %d of the epoch, lr %.4g", self.epoch, self.step,
                 self.loader.state_dict()["samples_done"], self.scheduler.get_last_lr()[0])

    def _load_optimization(self, state: dict[str, Any]) -> None:
        """The optimizer's and the scheduler's state from the checkpoint (momentum buffers, position);
        their settings (base lr, momentum, weight decay) from this run's config, which built them."""
        settings = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in self.optimizer.param_groups]
        base_lrs = list(self.scheduler.base_lrs)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for group, mine in zip(self.optimizer.param_groups, settings):
            group.update(mine)
        self.scheduler.base_lrs = base_lrs

    def _load_ema(self, saved: dict[str, Any] | None) -> None:
        """The EMA weights from the checkpoint; a run that had none starts its EMA at the model's."""
        if self.ema is None:
            if saved is not None:
                log.info("resume: the checkpoint's model EMA is dropped (--model-ema not given)")
        elif saved is None:
            self.ema = ModelEma(self.model, self.config.model_ema_decay)
            log.info("resume: the checkpoint has no model EMA; it starts here from the model's weights")
        else:
            self.ema.load_state_dict(saved)
