"""What the batches hold: the same pixels per record in every backend, dtypes, layouts, bad samples."""
import sys

import pytest
import torch

from datapipe import make_loader
from datapipe.backends import choose_backend
from datapipe.backends.normalize import IMAGENET_STD

STD = torch.tensor(IMAGENET_STD).view(3, 1, 1) * 255


def eval_views(source, backend, size=64, train=False, epoch=0, **kw):
    loader = make_loader(source, backend=backend, batch_size=8, image_size=size, train=train, num_workers=1, **kw)
    loader.set_epoch(epoch)
    return {i: img for images, _, indices in loader for i, img in zip(indices.tolist(), images)}


def pixel_diff(a, b):
    """Mean absolute difference in 0..255 levels after a 4x4 low-pass: DALI's resampling filter differs
    from Pillow's (torch's uint8 kernel equals Pillow's) in high frequencies only, while a wrong
    orientation, colour conversion or crop shows at every scale."""
    pooled = torch.nn.functional.avg_pool2d(((a - b) * STD)[None], 4)
    return pooled.abs().mean().item()


@pytest.mark.parametrize("name", ["packed_lmdb", "clean_folder"])
def test_eval_views_of_dataloader_and_dali_agree_per_record(request, name):
    source = request.getfixturevalue(name)
    pil, dali = eval_views(source, "dataloader"), eval_views(source, "dali")
    assert pil.keys() == dali.keys()
    for index in pil:  # measured: at most ~2 levels; a mirrored view of the same record is over 8 apart
        assert pixel_diff(pil[index], dali[index]) < 3, f"record {index} differs"
        assert pixel_diff(pil[index].flip(-1), dali[index]) > 6, f"control failed for record {index}"


@pytest.mark.parametrize("name", ["packed_lmdb", "clean_folder"])
def test_train_views_of_dataloader_and_dali_agree_per_record_on_every_rank(request, name):
    """The crop box and flip of a record depend on (seed, epoch, record) alone, in both backends:
    two DALI ranks draw different augmentations (they read different records) and each record's
    view equals the dataloader's. Measured: at most ~0.1 levels apart."""
    source = request.getfixturevalue(name)
    pil = eval_views(source, "dataloader", train=True, epoch=1)
    dali = {}
    for rank in (0, 1):
        dali.update(eval_views(source, "dali", train=True, epoch=1, rank=rank, world_size=2))
    assert pil.keys() == dali.keys()
    for index in pil:
        assert pixel_diff(pil[index], dali[index]) < 1, f"record {index} differs"
    other_epoch = eval_views(source, "dali", train=True, epoch=2)
    assert sorted(pixel_diff(other_epoch[i], dali[i]) for i in dali)[len(dali) // 2] > 5  # control: new crops


def test_eval_windows_are_pixel_aligned_when_the_margin_is_odd(tmp_path):
    """A textured image whose resized margin is odd (here 45 px): the centre window is computed once
    for both backends, so DALI cannot land a pixel off the dataloader's crop."""
    import numpy as np
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(100, 150), (150, 100), (99, 131)]):
        (tmp_path / "t").mkdir(exist_ok=True)
        noise = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).filter(ImageFilter.GaussianBlur(1.5))
        noise.save(tmp_path / "t" / f"{i}.jpg", quality=95)
    pil, dali = eval_views(tmp_path, "dataloader"), eval_views(tmp_path, "dali")
    for index in pil:
        assert pixel_diff(pil[index], dali[index]) < 1.5, f"record {index} is shifted"
        shifted = torch.roll(pil[index], 1, dims=1)
        assert pixel_diff(shifted, dali[index]) > 2 * pixel_diff(pil[index], dali[index])  # control


@pytest.mark.parametrize("backend", ["dataloader", "threads", "prefetch", "dali"])
def test_bf16_channels_last_output(packed_lmdb, backend):
    loader = make_loader(packed_lmdb, backend=backend, batch_size=4, image_size=32, num_workers=1,
                         dtype=torch.bfloat16, channels_last=True)
    images, labels, indices = next(iter(loader))
    assert images.dtype == torch.bfloat16 and images.shape == (4, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert -3 < images.float().mean().item() < 3  # normalized, not 0..255


def test_auto_picks_the_cpu_path_and_says_why(packed_lmdb, caplog):
    caplog.set_level("INFO", logger="datapipe")
    loader = make_loader(packed_lmdb, batch_size=4, image_size=32, num_workers=1)
    assert loader.backend == choose_backend("auto", torch.device("cpu"))[0] and loader.reason
    assert any(loader.backend in r.message and "backend" in r.message for r in caplog.records)
    assert choose_backend("auto", torch.device("cuda"))[0] == "dali"  # DALI is installed here
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        make_loader(packed_lmdb, backend="fast")


def test_dali_missing_raises_import_error_naming_the_extra(packed_lmdb, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # what an environment without DALI looks like
    with pytest.raises(ImportError, match=r"pip install 'datapipe\[dali-cu1[23]\]'"):
        make_loader(packed_lmdb, backend="dali")


def test_a_shard_pattern_is_one_split(foreign_shards):
    from datapipe import open_dataset
    from datapipe.records import SplitNotFound

    with pytest.raises(SplitNotFound, match="a shard pattern is one split"):
        open_dataset(foreign_shards, "val")


def test_bad_options_are_value_errors(packed_lmdb):
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        make_loader(packed_lmdb, batch_size=0)
    with pytest.raises(ValueError, match="on_error must be one of"):
        make_loader(packed_lmdb, on_error="ignore")
    with pytest.raises(ValueError, match="rank must be within 0..1"):
        make_loader(packed_lmdb, rank=2, world_size=2)
