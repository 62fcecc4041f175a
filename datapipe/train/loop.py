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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import counted
from ..storage import redact
from ..storage.durable import write_text
from . import checkpoint, metrics_log
from .board import Board
from .clock import make_clock
from .config import TrainConfig, hparams, warmup_cosine
from .ddp import DistEnv, all_max, all_sum, gather_strings, setup, teardown
from .ema import ModelEma
from .figures import EpochSums, end_line, epoch_summary, finite
from .guard import NonFiniteGuard
from .loaders import build_loaders
from .models import build_model, check_image_sizes
from .objective import Criterion, count_correct, unlabelled
from .optim import build_optimizer
from .out_lock import out_lock
from .preempt import Preempted, Preemption
from .profiling import epoch_profiler
from .resume import CheckpointedRun

log = logging.getLogger("datapipe.train")


def resolve_amp(amp: str | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 by default where the GPU supports it, else none. fp16 works on a CPU
    too (autocast and GradScaler("cpu")), slowly: it is there to run the fp16 path anywhere."""
    if amp is None:
        amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "off"
    if amp == "fp16" and device.type == "cpu":
        log.warning("--amp fp16 on a CPU is slow (few fp16 kernels); --amp bf16 or off is the CPU choice")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[amp]


class Trainer(CheckpointedRun):
    """One rank of a training run; `fit()` runs it and returns the per-epoch metrics."""

    def __init__(self, config: TrainConfig, env: DistEnv = DistEnv()) -> None:
        self.config, self.env = config, env
        self.device = setup(env)
        self.out = Path(config.out)
        if env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        sizes = config.image_size.values() if isinstance(config.image_size, dict) else [config.image_size]
        check_image_sizes(config.model, [*sizes, config.eval_size])
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
        self._running: torch.Tensor | None = None  # the epoch's loss sum and correct count on the device
        self.guard = NonFiniteGuard(self.device, skip=config.skip_nonfinite)
        self.clock = make_clock(self.device)
        self.nonfinite = self.skipped = 0  # non-finite losses, skipped steps before this process (checkpoint)
        self.metrics: list[dict[str, Any]] = []
        self._logged_images = 0  # sums.images at the last log line (rank 0's interval figures)
        self._pool_mark = 0  # the pool's size history (backend ray) from the entry in force at the epoch's start
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

    # ---- training ---------------------------------------------------------------------------
    def fit(self, preemption: Preemption | None = None) -> list[dict[str, Any]]:
        """Train to the last epoch or --max-steps; on SIGTERM/SIGUSR1/SIGINT, checkpoint and raise
        Preempted (preempt.py). However it ends, an error included, it says what it trained (_report)."""
        self.preemption = (preemption or Preemption()).arm(device=self.device, log_every=self.config.log_every)
        try:
            try:
                ended = self._run_epochs()
            except BaseException as exc:
                self._report_quietly(exc)
                raise
            self._report(ended)
            self._write_summary()
        finally:
            self.preemption.disarm()  # first: the caller's handlers come back whatever fails below
            if self.board is not None:
                self.board.close()
            teardown()
        return self.metrics

    def _run_epochs(self) -> str:
        """The epochs left; how they ended: "epochs" or "max_steps"."""
        while self.epoch < self.config.epochs:
            if self._steps_done():
                return "max_steps"
            # A checkpoint taken at an epoch's last step restores the loader at the next epoch's
            # start: this epoch's data was all served, only its evaluation and metrics are left.
            if self.loader.epoch <= self.epoch:
                self.loader.set_epoch(self.epoch)  # keeps a position a resume restored
                if not self._train_epoch():
                    return "max_steps"  # inside the epoch: last.pt holds the position
            self._finish_epoch()
        return "epochs"

    def _steps_done(self) -> bool:
        return self.config.max_steps is not None and self.step >= self.config.max_steps

    def _train_epoch(self) -> bool:
        """Train until the epoch ends (True) or max_steps is reached inside it (False)."""
        self.net.train()
        # the epoch's loss sum and correct count, and the records without a label met since its start
        sums = torch.tensor([self.sums.loss_sum, self.sums.correct, 0.0], device=self.device)
        self._running = sums
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
                sums[2] += unlabelled(batch.labels)
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
        if self.step % self.config.log_every == 0:  # every rank: the checks agree over ranks
            self.clock.collect()
            self._refuse_unlabelled(sums)
            self.guard.check(self.epoch)
            if self.env.is_main:
                self._log_interval(sums)
        # max_steps at the epoch's last step: the epoch ends as usual (evaluated, its metrics line written)
        stop = self._steps_done() and self.loader.batches_done < len(self.loader)
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
        loss_sum, correct, _ = sums.tolist()
        images = max(1, self.sums.images)
        wait, seconds = self._fold_clock()
        rate = (self.sums.images - self._logged_images) * self.env.world_size / max(seconds, 1e-9)
        self._logged_images = self.sums.images
        lr = self.scheduler.get_last_lr()[0]
        log.info("epoch %d step %d loss %.4f acc %.3f lr %.4g %.0f img/s", self.epoch, self.step, loss_sum / images,
                 correct / images, lr, rate)
        if self.board is not None:
            pool = self.loader.pool_history
            self.board.interval(self.step, loss=loss_sum / images, accuracy=correct / images, lr=lr,
                                images_per_s=rate, data_wait_pct=100 * wait / max(seconds, 1e-9),
                                **({"pool_workers": pool[-1][1]} if pool else {}))

    def _fold_clock(self) -> tuple[float, float]:
        """The clock's (idle, elapsed) seconds since it was last read, added to the epoch's sums."""
        wait, seconds = self.clock.read()
        self.sums.wait += wait
        self.sums.seconds += seconds
        return wait, seconds

    def _account(self, sums: torch.Tensor) -> None:
        """Fold the time since the last account into the epoch's sums (a sync: epoch end or save only)."""
        self._fold_clock()
        self._refuse_unlabelled(sums)
        self.guard.check(self.epoch)
        self.sums.loss_sum, self.sums.correct = sums[:2].tolist()

    def _refuse_unlabelled(self, sums: torch.Tensor) -> None:
        """Records without a label (-1) in a dataset that has classes (e.g. shards where some samples have
        no .cls): counted on the device at each step while the loss ignores them, refused at the next
        read of the device (a log line, a checkpoint, the epoch's end), agreed over ranks."""
        found = int(all_sum([float(sums[2].item())], self.device)[0])
        if found:
            raise ValueError(f"{counted(found, 'train sample')} without a label (-1, or mixed with one) in epoch "
                             f"{self.epoch} by step {self.step}"
                             f" ({redact(self.loader.dataset.path)}): datapipe train trains a classifier and every "
                             "record needs a label: label them (a .cls member each) or leave them out")

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

    def _record(self, val_acc: float | None, ema_val_acc: float | None, *, agreed: bool,
                nonfinite: int) -> dict[str, Any]:
        """The epoch's metrics.jsonl record: over all ranks where every rank is here (`agreed`: collectives),
        else this rank's own figures (a run stopped by an error, where another rank may be gone)."""
        figures = [self.sums.loss_sum, self.sums.images, self.sums.correct, self.sums.wait / max(self.sums.seconds, 1e-9)]
        if agreed:
            loss_sum, images, correct, wait_share = all_sum(figures, self.device)
            seconds, ranks = all_max(self.sums.seconds, self.device), self.env.world_size
        else:
            (loss_sum, images, correct, wait_share), seconds, ranks = figures, self.sums.seconds, 1
        return {"epoch": self.epoch, "train_loss": finite(loss_sum / max(images, 1)),
                "train_acc": correct / max(images, 1), "val_acc": val_acc, "ema_val_acc": ema_val_acc,
                "recipe": self.config.recipe.name, "images": int(images), "images_per_s": images / max(seconds, 1e-9),
                "data_wait_pct": 100 * wait_share / ranks, "world_size": self.env.world_size,
                "backend": self.loader.backend, "image_size": self.loader.image_size_at(self.epoch),
                "eval_size": self.config.eval_size, "lr": self.scheduler.get_last_lr()[0], "steps": self.step,
                "seconds": seconds, "nonfinite_losses": nonfinite,
                "skipped_steps": self.skipped + int(self.guard.skipped.item()),
                "skipped_records": len(self.loader.skipped), **self._pool_sizes()}

    def _pool_sizes(self) -> dict[str, Any]:
        """A pool's size at the epoch's end and each size it had in the epoch (backend ray; pool_workers="auto"
        resizes it), or nothing for backends without a pool."""
        history = self.loader.pool_history
        if not history:
            return {}
        sizes = [size for _, size in history[min(self._pool_mark, len(history) - 1):]]
        return {"pool_workers": sizes[-1], "pool_sizes": sizes}

    def _finish_epoch(self) -> None:
        val_acc = self.evaluate()
        ema_val_acc = self.evaluate(self.ema.module) if self.ema is not None else None
        record = self._record(val_acc, ema_val_acc, agreed=True, nonfinite=self.nonfinite + self.guard.check(self.epoch))
        self.metrics.append(record)
        if self.env.is_main:
            log.info("%s", epoch_summary(record))
            if self.board is not None:  # before the checkpoint: a resume drops what it lacks
                self.board.epoch(self.epoch, record)
        self.epoch += 1
        self.sums, self._running = EpochSums(), None
        self._pool_mark = len(self.loader.pool_history or [None]) - 1
        self.loader.set_epoch(self.epoch)
        self._save()
        if self.env.is_main:  # after the checkpoint: metrics.jsonl never runs ahead of it
            metrics_log.rewrite(self.out, self.metrics)

    # ---- the end ----------------------------------------------------------------------------
    def _report(self, ended: str, *, agreed: bool = True) -> None:
        """Say what the run trained, however it ended (figures.ENDINGS). Stopped inside an epoch it trained
        in, metrics.jsonl gets that epoch's line so far ("partial": true; a resume rewrites the file from
        the checkpoint, so the line goes and the finished epoch's comes); rank 0 logs the run's last line.
        `agreed`: every rank is here (an error may have left the others elsewhere: no collective then)."""
        images = all_sum([self.sums.images], self.device)[0] if agreed else self.sums.images
        last = self.metrics[-1] if self.metrics else None
        if images and (last is None or last["epoch"] != self.epoch):
            if self._running is not None:  # the epoch's loss and hits so far, on the device
                self.sums.loss_sum, self.sums.correct = self._running[:2].tolist()
            if not agreed:
                self._fold_clock()
            nonfinite = self.nonfinite + self.guard.agreed
            last = {**self._record(None, None, agreed=agreed, nonfinite=nonfinite), "partial": True, "ended": ended}
            if self.env.is_main:
                metrics_log.rewrite(self.out, [*self.metrics, last])
        if self.env.is_main:
            log.info("%s", end_line(ended, steps=self.step, epochs_done=self.epoch, epochs=self.config.epochs,
                                    max_steps=self.config.max_steps, last=last))

    def _report_quietly(self, exc: BaseException) -> None:
        """_report on the way out of an exception, never hiding it: what cannot be read is a warning."""
        ended = ("preempted" if isinstance(exc, Preempted) else
                 "interrupted" if isinstance(exc, KeyboardInterrupt) else "error")
        try:
            self._report(ended, agreed=ended == "preempted")  # the ranks stop together on a signal
        except Exception as failed:  # noqa: BLE001 - the run's own error is the one to raise
            log.warning("what the run trained could not be written (%s: %s)", type(failed).__name__, failed)

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
