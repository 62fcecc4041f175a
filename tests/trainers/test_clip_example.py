"""docs/examples/clip_train.py, the image-text page's example, on a sample in img2dataset's layout
(tools/make_img2dataset_sample.py): the page quotes it whole, the loader it builds pairs every image
with its own caption's tokens, and its contrastive loss falls over a few steps."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from datapipe import make_loader, open_dataset
from tools.make_img2dataset_sample import make

DOCS = Path(__file__).parents[2] / "docs"
sys.path.insert(0, str(DOCS / "examples"))
import clip_train  # noqa: E402  (the example script, as the page quotes it)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("clip") / "i2d"
    make(root, shards=2, per_shard=20, failed=2, seed=3)
    return str(root / "{00000..00001}.tar")


def test_the_page_quotes_the_example_whole():
    assert (DOCS / "examples" / "clip_train.py").read_text().rstrip("\n") in (DOCS / "image-text.md").read_text()


@pytest.mark.parametrize("backend", ["threads", "dataloader"])
def test_each_image_comes_with_its_own_captions_tokens(sample, backend):
    captions = {i: r.fields.text for i, r in enumerate(map(open_dataset(sample).record, range(36)))}
    loader = make_loader(sample, batch_size=8, image_size=32, device="cpu", backend=backend, num_workers=2,
                         fields=("image", "text"), tokenizer=clip_train.byte_tokens)
    seen = []
    for images, texts, indices in loader:
        assert images.shape == (len(indices), 3, 32, 32) and texts.shape == (len(indices), clip_train.CONTEXT)
        for tokens, index in zip(texts, indices.tolist()):
            assert torch.equal(tokens, clip_train.byte_tokens(captions[index]))
            seen.append(index)
    assert sorted(seen) == list(range(36))  # 2 shards of 20 URLs, 2 failed each: 36 image-text pairs


def test_the_contrastive_loss_falls(sample):
    losses = clip_train.train(sample, steps=12, batch_size=12, image_size=32, backend="threads")
    assert len(losses) == 12 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
