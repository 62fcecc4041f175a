"""`datapipe train`: its flags; the run built from them (and a checkpoint's settings on --resume), run,
and how it ended, a stop on a signal included."""
from __future__ import annotations

import argparse
import logging
import sys

from ..backends.registry import backend_choices
from .flags import add_remote_options, join_ray_address, pool_size, ray_resources
from .mix import add_mix_arguments, parse_weights


def add_command(sub: argparse._SubParsersAction) -> None:
    from .recipe import add_recipe_options

    # Options left out stay out of the namespace: TrainConfig's defaults apply, or on --resume the
    # checkpoint's run settings (what the command line gives wins).
    p = sub.add_parser("train", help="reference AMP/DDP training loop (run under torchrun for several GPUs)",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("data", nargs="+", help="packed dataset or image folder (train split; val split evaluated if "
                                           "present); several (NAME=PATH or a path) with --weights: their mix")
    add_mix_arguments(p)
    _add_train_optimization(p)
    _add_train_data(p)
    _add_train_run(p)
    add_remote_options(p)
    add_recipe_options(p)
    p.add_argument("--out", required=True, help="folder for metrics.jsonl, last.pt, summary.json")
    p.add_argument("--resume", metavar="LAST_PT",
                   help="continue from a checkpoint (mid-epoch included) with its settings, but for those given again")
    p.add_argument("--requeue", choices=["auto", "off"],
                   help="SIGTERM, SIGUSR1, SIGINT: finish the step, write OUT/last.pt, exit 75. auto (default): on "
                        "SIGUSR1 under Slurm (SLURM_JOB_ID set) also `scontrol requeue` the job; off: never")
    p.set_defaults(run=run_train)


def _add_train_optimization(p: argparse.ArgumentParser) -> None:
    """`datapipe train`'s model, optimizer and schedule."""
    p.add_argument("--model", metavar="NAME", help="resnet18|34|50|101, deit_tiny|small|base (or timm's names: "
                   "deit_small_patch16_224, vit_small_patch16_224, ...), timm/NAME or torchvision/NAME where that "
                   "package is installed; default: resnet50")
    p.add_argument("--epochs", type=int, help="default: 1")
    p.add_argument("--batch-size", type=int, help="per GPU (per process); default: 256")
    p.add_argument("--opt", choices=["sgd", "adamw"], help="default: sgd (momentum 0.9); adamw: no weight decay on "
                   "biases and norm weights, as timm")
    p.add_argument("--lr", type=float, help="default: 0.1 (sgd), 1e-3 (adamw)")
    p.add_argument("--weight-decay", type=float, help="default: 1e-4 (sgd), 0.05 (adamw)")
    p.add_argument("--warmup-epochs", type=float, help="default: 1")
    p.add_argument("--warmup-lr", type=float, help="the warm-up rises from this lr; default: 0")
    p.add_argument("--min-lr", type=float, help="the cosine decays to this lr; default: 0")
    p.add_argument("--label-smoothing", type=float,
                   help="smoothing of integer labels in the loss; default: 0.1. A recipe with soft targets (mixup, "
                        "cutmix, --smoothing) carries its own smoothing and is not smoothed again")
    p.add_argument("--model-ema", action="store_true", help="keep an EMA of the weights, saved and evaluated too")
    p.add_argument("--model-ema-decay", type=float, help="default: 0.9998")


def _add_train_data(p: argparse.ArgumentParser) -> None:
    """`datapipe train`'s image sizes and loader."""
    p.add_argument("--image-size", metavar="N|MIN:MAX",
                   help="train size: N px, or MIN:MAX, FFCV's ramp over the run (from 3/4 to 7/8 of --epochs, by "
                        "32 px); default: the recipe's (ffcv-rn50 160:192, rsb-a3 160, tv-v2 176, else 224)")
    p.add_argument("--image-size-schedule", metavar="FILE",
                   help='train sizes from a JSON file: {"0": 128, "10": 160} (epoch: size from then on) or a list, one '
                        "size an epoch (the last continues); instead of --image-size")
    p.add_argument("--eval-size", type=int, metavar="N", help="val size (FixRes: larger than train); default: the "
                   "recipe's with its train sizes (ffcv-rn50 256, rsb-a3 and tv-v2 224), else the last train size")
    p.add_argument("--backend", choices=backend_choices(),
                   help="default: auto; ray: a pool of Ray actors decodes (the Ray at RAY_ADDRESS, else a local one; "
                        "docs/pool.md)")
    p.add_argument("--workers", type=int, help="loader workers per process (default: this rank's share of the CPUs)")
    p.add_argument("--pool-workers", type=pool_size, metavar="N|auto",
                   help="backend ray: actors in each rank's pool, or auto (grows while training waits on data; "
                        "default: --workers's value)")
    p.add_argument("--pool-resources", type=ray_resources, metavar="NAME=N[,NAME=N]",
                   help="backend ray: Ray resources each actor asks for, e.g. datapipe=1 (docs/clusters.md)")


def _add_train_run(p: argparse.ArgumentParser) -> None:
    """`datapipe train`'s precision, compilation, logging, checkpoints and stops."""
    p.add_argument("--amp", choices=["bf16", "fp16", "off"], help="default: bf16 where the GPU supports it, else off")
    p.add_argument("--accum-steps", type=int, help="gradient accumulation steps; default: 1")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--checkpoint-activations", action="store_true", help="recompute activations (big models)")
    p.add_argument("--no-channels-last", action="store_true", help="keep NCHW contiguous memory format")
    p.add_argument("--profile", action="store_true", help="write a torch.profiler trace of a few steps to OUT/profile")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="TensorBoard scalars (rank 0) in DIR; default: OUT/tensorboard when tensorboard is installed; "
                        "'off': none")
    p.add_argument("--seed", type=int, help="default: 0")
    p.add_argument("--log-every", type=int, help="steps between loss logs (the only host syncs); default: 50")
    p.add_argument("--save-every", type=int, help="also checkpoint every N steps (default: epoch ends)")
    p.add_argument("--max-steps", type=int, help="stop after N optimizer steps, checkpointing the position")
    p.add_argument("--skip-nonfinite", action="store_true",
                   help="skip steps whose loss or gradients are inf/NaN and count them (default: stop with an error)")
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"],
                   help="worker start method (default: fork; DALI on CUDA: spawn)")


def run_train(args: argparse.Namespace) -> int:
    """`datapipe train ARGS`: the run, or its stop on a signal (one line, exit 75: datapipe.train.preempt)."""
    import dataclasses
    import os
    from pathlib import Path

    from ..backends.deaths import WorkerDied
    from ..train import DistEnv, TrainConfig, train
    from ..train.checkpoint import run_settings
    from ..train.preempt import INTERRUPTED_EXIT, PREEMPTED_EXIT, Preempted, Preemption
    from .recipe import train_recipe

    if getattr(args, "backend", None) == "ray":  # unset options are absent
        join_ray_address()
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
