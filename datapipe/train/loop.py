"""The reference AMP/DDP training loop: the loader at full speed, and the numbers that show it.

No host sync per step: losses accumulate on the device and are read once per log interval.

`data_wait_pct` says whether the loader starves the device: on each rank, 100 x the time the device
sat idle because the next batch had not arrived, divided by the rank's training time of the epoch
(from asking for its first batch to its last step's work done, evaluation excluded; the wait for
the first batch counts), then averaged over ranks. On CUDA the idle time is the GPU's, from CUDA
events: from the end of a step's queued work to the moment the next batch was in the host's hands
(GPU work the loader queues on the training stream counts as busy). On a CPU, where compute is
synchronous, it is the host's time blocked in the loader. See datapipe.train.clock.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..storage import redact
from ..durable import write_text
from . import checkpoint, metrics_log
from .board import Board
from .clock import make_clock
from .config import RUN_SETTINGS, TrainConfig, hparams, warmup_cosine
from .ddp import DistEnv, all_max, all_sum, gather_strings, setup, teardown
from .ema import ModelEma
from .guard import NonFiniteGuard
from .loaders import build_loaders
from .models import build_model
from .objective import Criterion, count_correct
from .out_lock import out_lock
from .optim import build_optimizer
from .preempt import Preemption
from .profiling import epoch_profiler

log = logging.getLogger("datapipe.train")


@dataclass
class EpochSums:
    """Running totals of one epoch on this rank. A checkpoint holds loss_sum and images summed over
    ranks (rank 0 takes them back, the others start at 0: right at any world size) and rank 0's
    wait and seconds (per-rank figures: every rank takes them back)."""

    loss_sum: float = 0.0
    images: int = 0
    wait: float = 0.0
    seconds: float = 0.0
    correct: float = 0.0  # train images classified right (top-1, before the step)


def resolve_amp(amp: str | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 by default where the GPU supports it, else none. fp16 works on a CPU
    too (autocast and GradScaler("cpu")), slowly: it is there to run the fp16 path anywhere."""
    if amp is None:
        amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "off"
    if amp == "fp16" and device.type == "cpu":
        log.warning("--amp fp16 on a CPU is slow (few fp16 kernels); --amp bf16 or off is the CPU choice")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[amp]


class Trainer:
    """One rank of a training run; `fit()` runs it and returns the per-epoch metrics."""

    def __init__(self, config: TrainConfig, env: DistEnv = DistEnv()) -> None:
        self.config, self.env = config, env
        self.device = setup(env)
        self.out = Path(config.out)
        if env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        saved = checkpoint.load(config.resume) if config.resume else None
        if saved is not None:  # before anything is built or written: a refusal is one line, nothing left behind
            checkpoint.refuse_another_course(saved, config)
        self.loader, self.val_loader = build_loaders(config, self.device)
        model = build_model(config.model, len(self.loader.dataset.classes),
                            checkpoint_activations=config.checkpoint_activations).to(self.device)
        self.model = model.to(memory_format=torch.channels_last) if config.channels_last else model
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        self.net: nn.Module = self.model
        if env.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if config.compile:
            self.net = torch.compile(self.net)
        self._build_optimization()
        self.epoch, self.step, self.sums = 0, 0, EpochSums()
        self.guard = NonFiniteGuard(self.device, skip=config.skip_nonfinite)
        self.clock = make_clock(self.device)
        self.nonfinite = self.skipped = 0  # non-finite losses, skipped steps before this process (checkpoint)
        self.metrics: list[dict[str, Any]] = []
        self._logged_images = 0  # sums.images at the last log line (rank 0's interval figures)
        if saved is not None:
            self._restore(saved)
        resume_at = (self.step, self.epoch) if saved is not None else None  # events past it are dropped
        self.board = Board.open(config.tensorboard, self.out, resume_at=resume_at) if env.is_main else None
        if self.board is not None:
            self.board.hparams(hparams(config))

    def _build_optimization(self) -> None:
        """Optimizer (--opt), warm-up + cosine schedule, AMP and its scaler, the loss, the EMA copy."""
        config = self.config
        self.optimizer = build_optimizer(self.model, config)
        self.steps_per_epoch = math.ceil(len(self.loader) / config.accum_steps)
        schedule = functools.partial(warmup_cosine, warmup=int(config.warmup_epochs * self.steps_per_epoch),
                                     total=self.steps_per_epoch * config.epochs, start=config.warmup_lr / config.lr,
                                     floor=config.min_lr / config.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.amp = resolve_amp(config.amp, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == torch.float16)
        self.criterion = Criterion(config.loss_smoothing)  # soft targets: never smoothed again
        self.ema = ModelEma(self.model, config.model_ema_decay) if config.model_ema else None
        log.info("recipe %s (%s labels), --opt %s, lr %.4g, weight decay %.4g%s", config.recipe.name,
                 "soft" if config.recipe.soft_targets else "integer", config.opt, config.lr, config.weight_decay,
                 f", model EMA decay {config.model_ema_decay}" if self.ema else "")

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    # ---- state ------------------------------------------------------------------------------
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

    # ---- training ---------------------------------------------------------------------------
    def fit(self, preemption: Preemption | None = None) -> list[dict[str, Any]]:
        """Train to the last epoch; on SIGTERM/SIGUSR1/SIGINT, checkpoint and raise Preempted (preempt.py)."""
        self.preemption = (preemption or Preemption()).arm(device=self.device, log_every=self.config.log_every)
        try:
            while self.epoch < self.config.epochs:
                # A checkpoint taken at an epoch's last step restores the loader at the next epoch's
                # start: this epoch's data was all served, only its evaluation and metrics are left.
                if self.loader.epoch <= self.epoch:
                    self.loader.set_epoch(self.epoch)  # keeps a position a resume restored
                    if not self._train_epoch():
                        break  # max_steps reached: last.pt holds the position
                self._finish_epoch()
            self._write_summary()
        finally:
            self.preemption.disarm()  # first: the caller's handlers come back whatever fails below
            if self.board is not None:
                self.board.close()
            teardown()
        return self.metrics

    def _train_epoch(self) -> bool:
        """Train until the epoch ends (True) or max_steps is reached (False)."""
        self.net.train()
        sums = torch.tensor([self.sums.loss_sum, self.sums.correct], device=self.device)  # loss, correct
        self._logged_images = self.sums.images
        self.clock.start()
        self._stop_if_preempted(sums)  # a signal in start-up, an evaluation or the epoch-end bookkeeping
        profiler = epoch_profiler(self.config.profile and self.env.is_main and self.epoch == 0, self.device, self.out)
        with profiler or contextlib.nullcontext():
            batches = iter(self.loader)
            while True:
                self.clock.waiting()
                batch = next(batches, None)
                self.clock.arrived()
                if batch is None:
                    break
                number = self.loader.batches_done
                boundary = number % self.config.accum_steps == 0 or number == len(self.loader)
                loss, correct = self._forward_backward(batch, sync=boundary)
                sums[0] += self.guard.observe(loss, self.step) * len(batch.labels)
                sums[1] += correct
                self.sums.images += len(batch.labels)
                if profiler is not None:
                    profiler.step()
                if boundary and not self._after_step(sums):
                    return False
                self.clock.queued()
        self._account(sums)
        return True

    def _forward_backward(self, batch, *, sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's loss and how many of its images the model got right (device tensors, no sync)."""
        images, labels, _ = batch
        no_sync = getattr(self.net, "no_sync", None)
        with (no_sync() if no_sync is not None and not sync else contextlib.nullcontext()):
            with self._autocast():
                logits = self.net(images)
                loss = self.criterion(logits, labels)
            self.scaler.scale(loss / self.config.accum_steps).backward()
        return loss.detach().float(), count_correct(logits.detach(), labels)

    def _after_step(self, sums: torch.Tensor) -> bool:
        """Optimizer step, schedule, logging and checkpoints; False when max_steps is reached.
        `sums`: the epoch's loss sum and correct count on this rank, on the device."""
        self.guard.step(self.scaler, self.optimizer, self.model)  # skipped if inf/NaN; the schedule goes on
        if self.ema is not None:
            self.ema.update(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.step % self.config.log_every == 0:  # every rank: the check agrees over ranks
            self.clock.collect()
            self.guard.check(self.epoch)
            if self.env.is_main:
                self._log_interval(sums)
        stop = self.config.max_steps is not None and self.step >= self.config.max_steps
        if stop or (self.config.save_every and self.step % self.config.save_every == 0):
            self._account(sums)
            self._save()
        if not stop:
            self._stop_if_preempted(sums, self.step)
        return not stop

    def _stop_if_preempted(self, sums: torch.Tensor, step: int | None = None) -> None:
        """A signal came (to any rank: they agree here): checkpoint at this boundary, raise Preempted."""
        if self.preemption.requested(step):
            self._account(sums)
            self._save()
            raise self.preemption.stopped(self.out / "last.pt", self.epoch, self.step)

    def _log_interval(self, sums: torch.Tensor) -> None:
        """Rank 0's log line and TensorBoard scalars: the epoch's running loss and train accuracy, the
        lr, and images/s and data_wait_pct since the last log line (rank 0's, images/s times the world
        size: DDP ranks step together). Reads the device once (the log line's sync)."""
        loss_sum, correct = sums.tolist()
        images = max(1, self.sums.images)
        wait, seconds = self._fold_clock()
        rate = (self.sums.images - self._logged_images) * self.env.world_size / max(seconds, 1e-9)
        self._logged_images = self.sums.images
        lr = self.scheduler.get_last_lr()[0]
        log.info("epoch %d step %d loss %.4f acc %.3f lr %.4g %.0f img/s", self.epoch, self.step, loss_sum / images,
                 correct / images, lr, rate)
        if self.board is not None:
            self.board.interval(self.step, loss=loss_sum / images, accuracy=correct / images, lr=lr,
                                images_per_s=rate, data_wait_pct=100 * wait / max(seconds, 1e-9))

    def _fold_clock(self) -> tuple[float, float]:
        """The clock's (idle, elapsed) seconds since it was last read, added to the epoch's sums."""
        wait, seconds = self.clock.read()
        self.sums.wait += wait
        self.sums.seconds += seconds
        return wait, seconds

    def _account(self, sums: torch.Tensor) -> None:
        """Fold the time since the last account into the epoch's sums (a sync: epoch end or save only)."""
        self._fold_clock()
        self.guard.check(self.epoch)
        self.sums.loss_sum, self.sums.correct = sums.tolist()

    # ---- epoch end --------------------------------------------------------------------------
    def evaluate(self, model: nn.Module | None = None) -> float | None:
        """Top-1 accuracy of `model` (the trained one by default; the EMA copy) on the val split over all
        ranks (padding that evens out ranks not counted)."""
        if self.val_loader is None:
            return None
        net = self.net if model is None else model
        net.eval()
        real = self.val_loader.real_samples
        correct, seen = torch.zeros((), device=self.device), 0
        with torch.no_grad(), self._autocast():
            for images, labels, _ in self.val_loader:
                keep = max(0, min(len(labels), real - seen))
                seen += len(labels)
                correct += (net(images).argmax(1)[:keep] == labels[:keep]).sum()
        total_correct, total = all_sum([float(correct.item()), float(min(seen, real))], self.device)
        return total_correct / max(1.0, total)

    def _finish_epoch(self) -> None:
        val_acc = self.evaluate()
        ema_val_acc = self.evaluate(self.ema.module) if self.ema is not None else None
        loss_sum, images, correct, wait_share = all_sum([self.sums.loss_sum, self.sums.images, self.sums.correct,
                                                         self.sums.wait / max(self.sums.seconds, 1e-9)], self.device)
        seconds = all_max(self.sums.seconds, self.device)
        record = {"epoch": self.epoch, "train_loss": loss_sum / max(images, 1), "train_acc": correct / max(images, 1),
                  "val_acc": val_acc, "ema_val_acc": ema_val_acc, "recipe": self.config.recipe.name, "images": int(images),
                  "images_per_s": images / max(seconds, 1e-9), "data_wait_pct": 100 * wait_share / self.env.world_size,
                  "world_size": self.env.world_size, "backend": self.loader.backend,
                  "image_size": self.loader.image_size_at(self.epoch), "eval_size": self.config.eval_size,
                  "lr": self.scheduler.get_last_lr()[0], "steps": self.step, "seconds": seconds,
                  "nonfinite_losses": self.nonfinite + self.guard.check(self.epoch),
                  "skipped_steps": self.skipped + int(self.guard.skipped.item()),
                  "skipped_records": len(self.loader.skipped)}
        self.metrics.append(record)
        if self.env.is_main:
            log.info("epoch %d: %s", self.epoch, json.dumps(record))
            if self.board is not None:  # before the checkpoint: a resume drops what it lacks
                self.board.epoch(self.epoch, record)
        self.epoch += 1
        self.sums = EpochSums()
        self.loader.set_epoch(self.epoch)
        self._save()
        if self.env.is_main:  # after the checkpoint: metrics.jsonl never runs ahead of it
            metrics_log.rewrite(self.out, self.metrics)

    def _write_summary(self) -> None:
        digests = gather_strings(checkpoint.weights_digest(self.model))
        if self.env.is_main:
            summary = {"epochs_done": self.epoch, "steps": self.step, "weights_digest_per_rank": digests,
                       "last": self.metrics[-1] if self.metrics else None, "recipe": self.config.recipe.to_dict(),
                       "opt": self.config.opt, "model_ema_decay": self.config.model_ema_decay if self.ema else None}
            write_text(self.out / "summary.json", json.dumps(summary, indent=1))


def train(config: TrainConfig, env: DistEnv = DistEnv(), preemption: Preemption | None = None) -> list[dict[str, Any]]:
    """Run a training job (one rank of it under torchrun), --out locked by rank 0 for the whole run;
    returns the per-epoch metrics."""
    with out_lock(config.out, env):
        return Trainer(config, env).fit(preemption)
