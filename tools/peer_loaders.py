"""The loader rows of tools/compare_peers.py: one function per peer, each in that peer's own idiom.

Every row runs in a fresh process (the peers' venv or datapipe's) and returns one dict: images/s
over `epochs` epochs after a warm-up epoch, and the timed window (time.monotonic, the clock the
driver's CPU and memory sampler uses). The protocol is the same for all: RandomResizedCrop 224
(torchvision's sampling) + horizontal flip + float normalize to NCHW, batch 64, `workers` workers
(processes or threads, as the peer does it), random order. Loaders that read the folder get the
files Pillow can decode (good_files: FFCV's, DALI's and the naive readers stop at a bad file);
datapipe reads what `datapipe convert` accepted. torchvision is not installed in datapipe's venv,
so the PIL-based rows use pil_train_view: torchvision's RandomResizedCrop and ToTensor+Normalize
written with PIL and NumPy (the same PIL calls torchvision makes).
"""
from __future__ import annotations

import io
import json
import math
import random
import time
from pathlib import Path

BATCH, SIZE, EPOCHS = 64, 224, 2
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def image_files(folder: Path) -> list[tuple[Path, int]]:
    """(path, label) of every image file under folder/train, classes sorted, bad files included.
    (Not datapipe.formats.scan: this runs in the peers' venv too, where importing datapipe needs h5py.)"""
    classes = sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())
    return [(p, label) for label, c in enumerate(classes)
            for p in sorted((folder / "train" / c).rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES]


def good_files(folder: Path) -> list[tuple[str, int]]:
    """(path, label) of the files Pillow decodes within its pixel limit: what the folder readers get."""
    from PIL import Image

    good = []
    for path, label in image_files(folder):
        try:
            with Image.open(path) as img:
                if img.width * img.height <= Image.MAX_IMAGE_PIXELS:
                    img.convert("RGB").load()
                    good.append((str(path), label))
        except Exception:  # noqa: BLE001 - a bad file: the folder readers cannot take it
            pass
    return good


def timed_epochs(batches, epochs: int) -> dict:
    """images/s over `epochs` epochs after one warm-up epoch; `batches(epoch)` iterates one epoch."""
    for _ in batches(0):
        pass
    started, images = time.monotonic(), 0
    for epoch in range(1, epochs + 1):
        for images_batch, *_ in batches(epoch):
            images += len(images_batch)
    ended = time.monotonic()
    return {"images_per_s": images / (ended - started), "images": images, "t0": started, "t1": ended}


# ---- the PIL view shared by the naive, SPDL, torchdata.nodes and LitData rows -------------------

def rrc_box(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3) as a PIL box."""
    for _ in range(10):
        area = width * height * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = random.randint(0, width - w), random.randint(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)  # torchvision's fallback, simplified to the centred square
    return (width - side) // 2, (height - side) // 2, (width + side) // 2, (height + side) // 2


def pil_train_view(img):
    """RGB, RandomResizedCrop 224 (crop + bilinear resize in one Pillow call), flip, ToTensor +
    Normalize: a float32 CHW array."""
    import numpy as np
    from PIL import Image

    img = img.convert("RGB")
    img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=rrc_box(*img.size))
    if random.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(img, dtype=np.float32) / 255
    return ((pixels - np.array(MEAN, np.float32)) / np.array(STD, np.float32)).transpose(2, 0, 1)


class FolderImages:
    """ImageFolder-style map dataset over (path, label): index -> (float CHW array, label)."""

    def __init__(self, files_json: str) -> None:
        self.files = json.loads(Path(files_json).read_text())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        from PIL import Image

        path, label = self.files[index]
        with Image.open(path) as img:
            return pil_train_view(img), label


def stack(samples: list) -> tuple:
    """Collate (array, label) samples into (float NCHW tensor, int64 labels)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.stack([s[0] for s in samples])), torch.tensor([s[1] for s in samples])


# ---- the rows ----------------------------------------------------------------------------------

def load_naive(files_json: str, workers: int, epochs: int) -> dict:
    """What a tutorial writes: an ImageFolder-style dataset doing the PIL transforms in __getitem__,
    torch DataLoader(shuffle=True, num_workers) and its default collate (float tensors over IPC)."""
    import torch

    loader = torch.utils.data.DataLoader(FolderImages(files_json), batch_size=BATCH, shuffle=True,
                                         num_workers=workers)
    return timed_epochs(lambda epoch: loader, epochs)


def load_tdnodes(files_json: str, workers: int, epochs: int, method: str) -> dict:
    """torchdata.nodes 0.11 as its DataLoader migration guide builds it: SamplerWrapper(RandomSampler)
    -> ParallelMapper(dataset.__getitem__, num_workers, method) -> Batcher -> Mapper(collate) ->
    Prefetcher -> Loader; iterating the Loader again runs the next epoch."""
    import torch
    from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, Prefetcher, SamplerWrapper

    dataset = FolderImages(files_json)
    node = SamplerWrapper(torch.utils.data.RandomSampler(dataset))
    node = ParallelMapper(node, map_fn=dataset.__getitem__, num_workers=workers, method=method)
    node = Prefetcher(Mapper(Batcher(node, batch_size=BATCH, drop_last=False), map_fn=stack), prefetch_factor=2)
    loader = Loader(node)
    return timed_epochs(lambda epoch: loader, epochs)


def load_spdl(files_json: str, workers: int, epochs: int) -> dict:
    """SPDL 0.8 as its docs build an image pipeline: PipelineBuilder, source = a shuffled index
    order, .pipe(load, concurrency=workers) on the pipeline's thread pool (PIL releases the GIL while
    it decodes and resizes), .aggregate(batch), .pipe(collate), a sink; one pipeline per epoch."""
    from spdl.pipeline import PipelineBuilder

    dataset = FolderImages(files_json)

    def epoch_batches(epoch: int):
        order = random.sample(range(len(dataset)), len(dataset))
        pipeline = (PipelineBuilder().add_source(order).pipe(dataset.__getitem__, concurrency=workers)
                    .aggregate(BATCH).pipe(stack).add_sink(3).build(num_threads=workers))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()

    return timed_epochs(epoch_batches, epochs)


def load_dali(files_json: str, workers: int, epochs: int) -> dict:
    """DALI's CPU pipeline as its ImageNet example (device_id=None): readers.file with shuffling,
    decoders.image_random_crop (libjpeg-turbo, ROI decode), resize, crop_mirror_normalize with a
    coin-flip mirror; num_threads = workers; DALIGenericIterator hands torch tensors over."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    files = json.loads(Path(files_json).read_text())

    @pipeline_def(batch_size=BATCH, num_threads=workers, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(files=[f for f, _ in files], labels=[label for _, label in files],
                                        random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        return images, labels

    iterator = DALIGenericIterator(pipe(), ["images", "labels"], reader_name="reader", auto_reset=True,
                                   last_batch_policy=LastBatchPolicy.PARTIAL)
    return timed_epochs(lambda epoch: ((b[0]["images"], b[0]["labels"]) for b in iterator), epochs)


def load_litdata(optimized: str, workers: int, epochs: int) -> dict:
    """LitData as its README streams images: StreamingDataset(shuffle=True, transform=decode+augment)
    over its `optimize` output (raw encoded bytes + label), StreamingDataLoader(num_workers)."""
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(optimized, shuffle=True, transform=_litdata_view)
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    return timed_epochs(lambda epoch: ((batch["image"], batch["label"]) for batch in loader), epochs)


def _litdata_view(item: dict) -> dict:
    from PIL import Image

    with Image.open(io.BytesIO(item["image"])) as img:
        return {"image": pil_train_view(img), "label": item["label"]}


def load_ffcv(beton: str, workers: int, epochs: int) -> dict:
    """FFCV's own pipeline over its .beton (RGBImageField(write_mode="jpg")): its numba-compiled
    RandomResizedCrop decoder, flip and normalize, Loader(order=RANDOM, num_workers=workers)."""
    import numpy as np
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

    mean, std = np.array(MEAN) * 255, np.array(STD) * 255
    # NormalizeImage before ToTensor: on the CPU it is numba-compiled, and a compiled stage after the
    # two torch ones makes FFCV 1.0.2's Graph.group_operations loop forever (libffcv/ffcv#396).
    loader = Loader(beton, batch_size=BATCH, num_workers=workers, order=OrderOption.RANDOM, drop_last=False,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip(),
                                         NormalizeImage(mean, std, np.float32), ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor()]})
    return timed_epochs(lambda epoch: loader, epochs)


def load_datapipe(path: str, workers: int, epochs: int, backend: str = "dataloader") -> dict:
    """datapipe's make_loader over a converted dataset, defaults (seed 0, set_epoch each epoch)."""
    from datapipe import make_loader

    loader = make_loader(path, backend=backend, batch_size=BATCH, image_size=SIZE, num_workers=workers)

    def epoch_batches(epoch: int):
        loader.set_epoch(epoch)
        return loader

    return timed_epochs(epoch_batches, epochs)


def ceiling(path: str, workers: int, epochs: int) -> dict:
    """The physical limit: one core's rate of the work no loader can skip (decode of the crop region
    at the DCT scale used, resize to 224, flip: datapipe.augment.view.plan_and_decode, the region decoder
    where built), on the records and crop boxes datapipe's row draws (seed 0, the same epochs),
    read into memory first; times `workers` cores."""
    import torch

    from datapipe.formats import open_dataset
    from datapipe.augment.view import plan_and_decode

    torch.set_num_threads(1)
    dataset = open_dataset(path, "train")
    records = [dataset[i].data for i in range(len(dataset))]
    started = time.monotonic()
    for epoch in range(1, epochs + 1):
        for index, data in enumerate(records):
            plan_and_decode(data, None, 0, epoch, index, SIZE, train=True)
    ended = time.monotonic()
    one_core = len(records) * epochs / (ended - started)
    return {"images_per_s": one_core * workers, "one_core": one_core, "images": len(records) * epochs,
            "t0": started, "t1": ended}


def write_beton(folder: str, beton: str, workers: int) -> None:
    """FFCV's writer over the good images (it hangs on the bad ones, see issue #12)."""
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    class Images:
        def __init__(self, files):
            self.files = files

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            path, label = self.files[i]
            return np.asarray(Image.open(path).convert("RGB")), label

    DatasetWriter(beton, {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                  num_workers=workers).from_indexed_dataset(Images(good_files(Path(folder))))


def write_litdata(files_json: str, out_dir: str, workers: int) -> None:
    """LitData's optimize over the good images: raw encoded bytes and the label per sample."""
    from litdata import optimize

    optimize(fn=litdata_sample, inputs=[tuple(f) for f in json.loads(Path(files_json).read_text())],
             output_dir=out_dir, chunk_bytes="64MB", num_workers=workers, mode="overwrite")


def litdata_sample(item: tuple[str, int]) -> dict:
    path, label = item
    return {"image": Path(path).read_bytes(), "label": label}


def profile_datapipe(path: str, workers: int, epochs: int) -> dict:
    """Where datapipe's row spends its time beyond the ceiling's work, in one thread: cProfile of
    the `threads` backend with num_workers=0 (the decode threads' work, done in the caller): after a
    warm-up epoch, one epoch's CPU time (process_time) plain, then one profiled epoch split into
    decode_view (the ceiling's work), the record read, normalization and the rest (per-sample
    Python: sampler, substitution policy, batching), scaled to the plain epoch's CPU time."""
    import cProfile
    import pstats

    import torch

    from datapipe import make_loader

    torch.set_num_threads(1)  # one core, as in a worker (and no OpenMP spinning in the CPU time)
    loader = make_loader(path, backend="threads", batch_size=BATCH, image_size=SIZE, num_workers=0)
    for _ in loader:
        pass
    loader.set_epoch(1)
    started = time.process_time()
    images = sum(len(batch.images) for batch in loader)
    cpu = time.process_time() - started
    loader.set_epoch(2)
    profile = cProfile.Profile(time.process_time)  # CPU time, as `cpu`: other load on the machine drops out
    started = time.process_time()
    profile.enable()
    sum(len(batch.images) for batch in loader)
    profile.disable()
    scale = cpu / (time.process_time() - started)  # cProfile's own overhead taken out, pro rata
    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, ncalls, tottime, cumtime, callers)

    def cumulative(function: str, where: str) -> float:
        return sum(v[3] for (file, _, name), v in stats.items() if name == function and where in file)

    parts = {"decode_view (ceiling work)": cumulative("decode_view", "view.py"),
             "record read": cumulative("__getitem__", "formats"),
             "normalize (uint8 -> float, per sample)": cumulative("sample_into", "backends/normalize.py")}
    parts = {k: v * scale for k, v in parts.items()}
    parts["per-sample Python and the rest"] = cpu - sum(parts.values())
    return {"images": images, "ms_per_image": {k: 1e3 * v / images for k, v in parts.items()},
            "cpu_ms_per_image": 1e3 * cpu / images}
