"""`datapipe train`: build the run from the flags (and a checkpoint's settings on --resume), run it,
and say how it ended, a stop on a signal included. Imported by the CLI only, when the command runs."""
from __future__ import annotations

import argparse
import logging
import sys


def run_train(args: argparse.Namespace) -> int:
    """`datapipe train ARGS`: the run, or its stop on a signal (one line, exit 75: datapipe.train.preempt)."""
    import dataclasses
    import os
    from pathlib import Path

    from ..backends.deaths import WorkerDied
    from .mix import parse_weights
    from .recipe import train_recipe
    from ..train import DistEnv, TrainConfig, train
    from ..train.checkpoint import run_settings
    from ..train.preempt import INTERRUPTED_EXIT, PREEMPTED_EXIT, Preempted, Preemption

    env = DistEnv(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                  int(os.environ.get("LOCAL_RANK", 0)))
    if not env.is_main:
        logging.getLogger().setLevel(logging.WARNING)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    given["data"] = args.data[0] if len(args.data) == 1 else list(args.data)
    if hasattr(args, "weights"):
        given["weights"] = parse_weights(args.weights, len(args.data))
    if hasattr(args, "no_channels_last"):
        given["channels_last"] = False
    if hasattr(args, "image_size_schedule"):
        given["image_size"] = size_schedule_file(args)
    saved = run_settings(given["resume"]) if given.get("resume") else {}
    recipe = train_recipe(args, saved)
    if recipe is not None:
        given["recipe"] = recipe
    # Armed from here to the exit: a signal while the Trainer is built counts too, and one after the
    # stop (Slurm's SIGTERM once the job is requeued) is only counted.
    with Preemption().armed() as preemption:
        try:
            train(TrainConfig(**{**saved, **given}), env, preemption)
        except Preempted as stop:
            if env.is_main:
                print(after_preemption(stop, args, os.environ), file=sys.stderr)
            return PREEMPTED_EXIT
        except WorkerDied as died:  # the signal reached the loader's workers too, maybe
            raise preemption.worker_death(died, Path(args.out) / "last.pt") from died
        except KeyboardInterrupt:
            if env.is_main:
                print(f"datapipe train: interrupted (a second Ctrl-C): stopped at once, without a checkpoint of this "
                      f"step; {args.out}/last.pt, if there, is the last one written", file=sys.stderr)
            return INTERRUPTED_EXIT
    return 0  # the run's last log line said what it trained, however it ended (datapipe.train.figures)


# The most bytes --image-size-schedule reads: a size for each of 100,000 epochs is ~0.6 MB; past it a
# link to /dev/zero or a 1 GB file would be read whole (a schedule names its changes only).
SCHEDULE_MAX_BYTES = 4 << 20
SCHEDULE_EXAMPLE = '{"0": 160, "10": 192}'
SCHEDULE_FORM = f"{SCHEDULE_EXAMPLE} (epoch: size from then on) or a list of sizes, one an epoch"


def size_schedule_file(args: argparse.Namespace) -> object:
    """--image-size-schedule FILE's JSON ({epoch: size} or a list of sizes), checked as TrainConfig checks it.
    A regular file only (dataset_files.open_regular: a FIFO never blocks, a device is never read), of at
    most SCHEDULE_MAX_BYTES; each refusal one line naming the file and the fix."""
    import os

    from ..augment.resolution import run_sizes
    from ..storage.dataset_files import BadDatasetFile, open_regular

    if hasattr(args, "image_size"):
        raise ValueError("--image-size and --image-size-schedule both give the train sizes: keep one")
    path = args.image_size_schedule
    where = f"--image-size-schedule {path if path.isprintable() else repr(path)}"
    try:
        fd = open_regular(path, what="size schedule", fix="write the schedule to a file and give its path")
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size  # read(n) allocates n bytes first: n is the file's size
            raw = fh.read(size + 1) if size <= SCHEDULE_MAX_BYTES else b""
            if size < len(raw) <= SCHEDULE_MAX_BYTES:  # it grew since: the rest, up to the bound
                raw += fh.read(SCHEDULE_MAX_BYTES + 1 - len(raw))
    except BadDatasetFile as exc:
        raise ValueError(f"{where} {exc.reason}") from None
    except OSError as exc:  # a missing file, permission denied
        raise ValueError(f"{where}: cannot read it as JSON ({exc.strerror or exc}); give a file holding "
                         f"{SCHEDULE_FORM}") from None
    if max(size, len(raw)) > SCHEDULE_MAX_BYTES:
        raise ValueError(f"{where} is {max(size, len(raw)):,} bytes, over the {SCHEDULE_MAX_BYTES:,} bytes a size "
                         f"schedule may hold: give the sizes where they change, {SCHEDULE_EXAMPLE}")
    value = schedule_json(raw, where)
    try:
        run_sizes(value, 1)  # the schedule's own faults, named with the file (TrainConfig checks it again)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return value


def schedule_json(raw: bytes, where: str) -> object:
    """The JSON value of a size schedule file's bytes: UTF-8 (a BOM allowed), one key once, not null."""
    import json

    try:
        value = json.loads(raw.decode("utf-8-sig"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not UTF-8 text (byte {exc.start}); write it as UTF-8: {SCHEDULE_FORM}") from None
    except RecursionError:  # "[[[[..." past the interpreter's limit: json raises this, not a ValueError
        raise ValueError(f"{where} nests JSON too deep to read (past {sys.getrecursionlimit()} levels); a schedule "
                         f"is flat: {SCHEDULE_FORM}") from None
    except ValueError as exc:  # not JSON, a key given twice, a number past int's 4,300 digits
        raise ValueError(f"{where}: cannot read it as JSON ({exc}); give a file holding {SCHEDULE_FORM}") from None
    if value is None:
        raise ValueError(f"{where} holds null, not a schedule; give a file holding {SCHEDULE_FORM}")
    return value


def _unique_keys(pairs: list) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice (json keeps the last one silently)."""
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key[:40]!r} is given twice: keep one")
        found[key] = value
    return found


def after_preemption(stop, args: argparse.Namespace, environ) -> str:
    """Rank 0, once training stopped on a signal with its checkpoint written: requeue the Slurm job
    where asked (SIGUSR1, --requeue auto), and the one line to print: checkpoint, resume command."""
    import shlex

    from ..storage.redaction import redact
    from ..train.preempt import REQUEUE_SIGNAL, requeue, slurm_job_id

    job = slurm_job_id(environ)
    requeued = ""
    if job is not None and REQUEUE_SIGNAL in stop.signals and getattr(args, "requeue", "auto") == "auto":
        requeued = f"; Slurm job {job} requeued" if (failed := requeue(job)) is None else f"; {failed}"
    resume = shlex.join(["datapipe", "train", *args.data, "--out", args.out, "--resume", str(stop.checkpoint)])
    return redact(f"datapipe train: preempted by {'/'.join(s.name for s in stop.signals)} at epoch {stop.epoch}, "
                  f"step {stop.step}: checkpoint {stop.checkpoint} written; resume: the same command with --resume "
                  f"{stop.checkpoint} (e.g. {resume}){requeued}")
