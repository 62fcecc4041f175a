"""A Mix with a remote .wds source (moto's S3 on 127.0.0.1): read shard by shard through the node's
cache (mix.draws.ShardStream), the same (source, record) sequence as the same shards read locally."""
from __future__ import annotations

import pytest

from datapipe import Mix, make_loader, open_dataset

OPTIONS = dict(batch_size=4, image_size=16, fields=("image", "label", "source"), seed=2, backend="dataloader",
               num_workers=2)


def served(loader):
    names = loader.mix.names
    return [(names[s], int(i), int(l)) for b in loader for s, i, l in zip(b.sources, b.indices, b.labels)]


def test_a_remote_source_is_read_shard_by_shard_as_the_same_shards_locally(s3_wds, packed_wds, packed_lmdb, within):
    remote = Mix({"local": str(packed_lmdb), "web": s3_wds}, weights={"local": 1, "web": 1}, epoch_size=40)
    assert len(open_dataset(s3_wds).shard_sizes()) > 1
    loader = make_loader(remote, **OPTIONS)  # sampling "auto": the remote source shard by shard
    assert loader.order.state.shard_sizes[0] is None and loader.order.state.shard_sizes[1] is not None
    local = Mix({"local": str(packed_lmdb), "web": str(packed_wds)}, weights={"local": 1, "web": 1}, epoch_size=40)
    expected = served(make_loader(local, sampling="shards", **OPTIONS))
    global_order = served(make_loader(local, sampling="global", **OPTIONS))
    assert served(loader) == expected
    assert [r for r in expected if r[0] == "web"] != [r for r in global_order if r[0] == "web"]


def test_a_state_is_refused_mid_epoch_under_another_way_of_reading(s3_wds, packed_lmdb):
    mix = Mix({"local": str(packed_lmdb), "web": s3_wds}, weights={"local": 1, "web": 1}, epoch_size=40)
    loader = make_loader(mix, **OPTIONS)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = make_loader(mix, sampling="global", **OPTIONS)
    with pytest.raises(ValueError, match="other ways of reading the sources"):
        other.load_state_dict(state)
