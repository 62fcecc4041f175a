"""LoaderOptions: what every backend needs to know, validated once, and the choices it accepts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..augment.recipe import Recipe
from ..augment.resolution import check_image_size
from ..checks import MAX_SEED, integer, probability, real, shown
from ..devices import rank_device
from ..pool_sizing import resource_pairs
from ..resources import cpus_per_rank
from .fields import DEFAULT_FIELDS, check_fields

ON_ERROR = ("skip", "raise")
START_METHODS = ("fork", "spawn", "forkserver")
SAMPLING = ("auto", "global", "shards")  # auto: shard-wise for remote datasets, a global permutation otherwise
# what the loader yields: "batch" Batch(images, labels, indices); "pair" (images, labels), the shape code
# written for DataLoader(ImageFolder) unpacks (`x, y = batch`: Ignite's default prepare_batch, Keras)
BATCH_FORMATS = ("batch", "pair")
MAX_WORKERS = 1024  # loader processes per rank: more than any node's cores; past it, a typo forks thousands
MAX_PREFETCH = 64  # batches each worker may hold ready (torch's default: 2)
# One batch at most this many bytes (batch_size x 3 x size^2 x the dtype's): more than an H100 holds
# (80 GB); a batch of 256 at 224 px float32 is 154 MB. The refusal comes before any allocation.
MAX_BATCH_BYTES = 64 << 30


@dataclass(frozen=True)
class LoaderOptions:
    """What every backend needs to know; validated here once."""

    batch_size: int = 256
    train: bool = True
    image_size: int = 224
    seed: int = 0
    drop_last: bool = False
    num_workers: int | None = None
    prefetch_factor: int = 2
    pin_memory: bool | None = None
    device: str | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    on_error: str = "skip"
    max_bad_fraction: float = 0.01
    persistent_workers: bool = True
    start_method: str | None = None
    sampling: str = "auto"
    cache_dir: str | None = None
    cache_limit: int | None = None
    # shard-wise sampling: shards one block interleaves (ShardOrder); None: 16, 1 for datapipe's own shards
    interleave_shards: int | None = None
    recipe: Recipe = Recipe(name="default")  # the augmentation (datapipe.augment); make_loader resolves names
    transform: Any = None  # your own per-record transform after the recipe (datapipe.augment.custom)
    batch_format: str = "batch"  # one of BATCH_FORMATS
    fields: tuple[str, ...] = DEFAULT_FIELDS  # what a batch carries (datapipe.backends.fields): ("image", "text")...
    tokenizer: Any = None  # caption -> token ids, run where samples are decoded; needs "text" in fields
    # backend="ray" (datapipe.backends.ray): actors in the pool (None: num_workers's value; "auto": from
    # 1, grown while the trainer waits on data and shrunk when it does not, datapipe.backends.ray.autoscale), the Ray
    # resources each asks for besides one CPU ({"datapipe": 1}: nodes started with that resource), and
    # whether a pool that cannot run any more falls back to decoding here (one warning) or raises
    pool_workers: int | str | None = None
    pool_resources: Any = None  # a mapping name -> amount; kept as sorted (name, amount) pairs
    pool_fallback: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", check_fields(self.fields))
        if self.tokenizer is not None and (not callable(self.tokenizer) or "text" not in self.fields):
            raise ValueError(f"tokenizer= must be a callable on one caption and needs 'text' in fields; got "
                             f"tokenizer={self.tokenizer!r}, fields={self.fields}")
        if self.batch_format == "pair" and len(self.fields) < 2:
            raise ValueError(f"batch_format='pair' yields the first two fields; fields={self.fields} has one: add one")
        block = self.interleave_shards
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):  # True is not 1
            raise ValueError(f"interleave_shards must be an int >= 1 (1: shard by shard) or None, got {shown(block)}")
        if self.batch_format not in BATCH_FORMATS:
            raise ValueError(f"batch_format must be one of {BATCH_FORMATS} (\"pair\": (images, labels) without the "
                             f"record indices), got {self.batch_format!r}")
        if self.sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {self.sampling!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.uint8):
            raise ValueError(f"dtype must be torch.float32, float16, bfloat16 or uint8 (un-normalized), got {self.dtype}")
        if not isinstance(self.recipe, Recipe):
            raise ValueError(f"recipe must be a datapipe.Recipe (make_loader also takes a preset name), got {self.recipe!r}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS} or None, got {self.start_method!r}")
        self._check_numbers()  # after dtype: the batch's bytes need its size
        self._check_pool()

    def _check_pool(self) -> None:
        """pool_workers an int in [1, MAX_WORKERS], "auto" or None; pool_resources a mapping of names to
        positive amounts (or None); pool_fallback a bool."""
        if self.pool_workers is not None and self.pool_workers != "auto":
            object.__setattr__(self, "pool_workers", integer("pool_workers", self.pool_workers, 1, MAX_WORKERS,
                                                             note=", \"auto\" or None: num_workers's value"))
        if not isinstance(self.pool_fallback, bool):
            raise ValueError(f"pool_fallback must be True or False, got {shown(self.pool_fallback)}")
        if self.pool_resources is not None:
            object.__setattr__(self, "pool_resources", resource_pairs(self.pool_resources))

    def _check_numbers(self) -> None:
        """Every numeric option of the right type (a bool is not a number), finite, within its range
        (datapipe.checks), and the batch within MAX_BATCH_BYTES."""
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (normalising a frozen instance)
        set_("batch_size", integer("batch_size", self.batch_size, 1))
        set_("image_size", check_image_size(self.image_size))
        set_("seed", integer("seed", self.seed, 0, MAX_SEED))
        if self.num_workers is not None:
            set_("num_workers", integer("num_workers", self.num_workers, 0, MAX_WORKERS, note="; None: this rank's "
                                        "share of the CPUs"))
        set_("prefetch_factor", integer("prefetch_factor", self.prefetch_factor, 1, MAX_PREFETCH,
                                        note=": batches each worker holds ready"))
        set_("max_bad_fraction", probability("max_bad_fraction", self.max_bad_fraction))
        if self.cache_limit is not None:
            real("cache_limit", self.cache_limit, 1, note=" (bytes the shard cache may hold) or None")
        self.check_batch(self.image_size)

    def check_batch(self, size: int, epoch: int | None = None) -> int:
        """`size` if a batch at it fits MAX_BATCH_BYTES, else one line naming batch_size, size and bytes."""
        nbytes = self.batch_size * 3 * size * size * self.dtype.itemsize
        if nbytes > MAX_BATCH_BYTES:
            at = "" if epoch is None else f" (epoch {epoch}'s image size)"
            raise ValueError(f"batch_size={self.batch_size} at image_size={size}{at} in {self.dtype} is "
                             f"{nbytes / 2**30:,.0f} GiB a batch, more than MAX_BATCH_BYTES="
                             f"{MAX_BATCH_BYTES >> 30} GiB: lower the batch size or the image size")
        return size

    @property
    def workers(self) -> int:
        """num_workers, or this rank's share of the node's CPUs (datapipe.resources)."""
        return cpus_per_rank() if self.num_workers is None else self.num_workers

    @property
    def pool_workers_resolved(self) -> int:
        """The Ray pool's actors (to start with): pool_workers, 1 for "auto", else num_workers's value (at least 1)."""
        if self.pool_workers == "auto":
            return 1
        return self.pool_workers if self.pool_workers is not None else max(1, self.workers)

    @property
    def torch_device(self) -> torch.device:
        """The device batches go to; on CUDA always with this rank's index (datapipe.devices)."""
        return rank_device(self.device)

    @property
    def pinned(self) -> bool:
        """pin_memory, or True when batches go to a CUDA device."""
        return self.pin_memory if self.pin_memory is not None else self.torch_device.type == "cuda"
