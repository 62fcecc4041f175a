"""backend="ray" on a small Ray cluster on loopback (ray.cluster_utils.Cluster: a head without CPUs
and two 2-CPU nodes offering the "datapipe" resource, one cluster for the module): the threads
backend's batches bit for bit (default recipe, DeiT, a Mix) and a mid-epoch state resumed there, a
node removed mid-epoch (its actors and the batches in its object store lost) with the epoch still
exact, the fallback (one warning, also when the last pool node goes mid-epoch) and pool_fallback=False's
one line; pool_workers="auto" growing under a starved trainer and shrinking under a slow one (its clock
injected), and non-persistent pools taking turns on a full cluster; and first, before the cluster, a
loader that started its own Ray leaves no Ray process."""
from __future__ import annotations

import json

import gc
import os
import re
import tempfile
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest
import torch

ray = pytest.importorskip("ray")

from datapipe import make_loader  # noqa: E402
from datapipe.backends.ray import PoolUnavailable, pool as pool_module  # noqa: E402
from datapipe.backends.ray.loader import PoolFallback  # noqa: E402
from tests.backends.test_mix_loader import OPTIONS as MIX_OPTIONS, mix_of, sources  # noqa: E402,F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
POOL = dict(pool_workers=2, pool_resources={"datapipe": 1})
POOL1 = dict(POOL, pool_workers=1)  # where one actor is enough (each starts a Python with torch)
TINY = dict(batch_size=4, image_size=32, num_workers=1, seed=7)
DEATH_S = 60
WHOLE_NODE = {"datapipe": 2}  # one actor a node: the cluster holds two
NODE = dict(num_cpus=2, resources={"datapipe": 2}, node_ip_address="127.0.0.1", object_store_memory=80 << 20)


@pytest.fixture(scope="module")
def cluster(ray_home):
    """Head (no CPUs: the driver's node) + two pool nodes, all on 127.0.0.1; the driver connected."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(ray_home))  # Ray's auth token goes under ~/.ray (tests/conftest.py)
        env.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # for Ray's own processes
        env.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read at import: loopback, not the host's address
        system = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3}
        c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, node_ip_address="127.0.0.1",
                                                              include_dashboard=False, temp_dir=str(ray_home / "c"),
                                                              object_store_memory=80 << 20, _system_config=system))
        nodes = [c.add_node(**NODE) for _ in range(2)]
        ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
        try:
            yield c, nodes
        finally:
            ray.shutdown()
            c.shutdown()


def remove(c, nodes, node, actors):
    """`node` removed, and once its actors are dead: an actor's worker outlives its raylet a moment and
    may still answer the calls the driver sends it straight."""
    c.remove_node(node, allow_graceful=False)
    nodes.remove(node)
    deadline = time.monotonic() + DEATH_S
    for actor in actors:
        while True:
            try:
                ray.get(actor.ready.remote(), timeout=DEATH_S)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, f"a pool actor still answers {DEATH_S} s after its node was removed"
            time.sleep(0.2)


def room_back() -> None:
    """The module's earlier loaders, and their actors, gone, and their resources back (an actor's end is
    asynchronous): both nodes free."""
    gc.collect()
    deadline = time.monotonic() + DEATH_S
    while ray.available_resources().get("datapipe", 0) < 2 * WHOLE_NODE["datapipe"]:
        assert time.monotonic() < deadline, f"earlier actors still hold {ray.available_resources()}"
        time.sleep(0.2)


def batches(loader, stop=None):
    out = []
    for k, b in enumerate(loader):
        out.append(b)
        if stop is not None and k + 1 == stop:
            break
    return out


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w)
        for x, y in zip(g, w):
            assert torch.equal(x, y)


def test_a_loader_that_started_its_own_ray_leaves_no_ray_process(ray_home, packed_lmdb, within):
    """First in the module: no Ray is connected yet (the cluster fixture starts after)."""
    assert not ray.is_initialized()
    temp = ray_home / "own"  # the loader's Ray puts its session here (tempfile's folder): its processes name it
    temp.mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(ray_home))
        env.setattr(tempfile, "tempdir", str(temp))
        env.delenv("RAY_ADDRESS", raising=False)
        loader = make_loader(packed_lmdb, backend="ray", pool_workers=1, **TINY)
        assert ray.is_initialized()
        assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"  # not the machine's own address
        ours = {c.pid for c in psutil.Process().children(recursive=True)}
        listening = {c.laddr.ip for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.pid in ours | {os.getpid()}}
        assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening  # was '*': every interface
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        assert temp in session.parents  # its files in a folder of its own there (was /tmp/ray/session_*)
        second = make_loader(packed_lmdb, backend="ray", pool_workers=1, **TINY)  # shares the Ray
        assert sum(len(b.indices) for b in loader) == 27
        del loader
        gc.collect()
        assert ray.is_initialized() and sum(len(b.indices) for b in second) == 27  # not stopped under `second`
        second.close()
        with pytest.raises(ValueError, match="^backend='ray': this loader was closed"):
            next(iter(second))
        del second
        gc.collect()
    assert not ray.is_initialized()
    left = [p for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or [])]
    assert left == []
    assert not session.exists() and list(temp.iterdir()) == []  # removed with it (was: left, ~220 KB a run)


@pytest.mark.parametrize("recipe", ["default", "deit"])
def test_the_threads_backends_batches_bit_for_bit(cluster, packed_lmdb, recipe, within):
    """Two epochs; then a mid-epoch state of epoch 2 resumed in the threads backend."""
    kw = dict(TINY, recipe=recipe, dtype=torch.uint8)
    loader = make_loader(packed_lmdb, backend="ray", **POOL1, **kw)
    threads = make_loader(packed_lmdb, backend="threads", **kw)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        threads.set_epoch(epoch)
        same(batches(loader), batches(threads))
    assert loader.pool.reissued == 0 and loader.local_batches == 0
    loader.set_epoch(2)
    batches(loader, stop=3)
    state = loader.state_dict()
    assert state["backend"] == "ray" and state["epoch"] == 2 and state["batches_done"] == 3
    resumed = make_loader(packed_lmdb, backend="threads", **kw)
    resumed.load_state_dict(state)
    threads.set_epoch(2)
    same(batches(resumed), batches(threads)[3:])


def test_a_mix_bit_for_bit_with_its_sources_and_normalized(cluster, sources, within):  # noqa: F811
    got = batches(make_loader(mix_of(sources), backend="ray", **POOL1, **MIX_OPTIONS))
    same(got, batches(make_loader(mix_of(sources), backend="threads", **MIX_OPTIONS)))
    assert got[0].images.dtype == torch.float32


class Clock:
    """Each reading 1 s after the last, plus what the test adds (`away`): the sizing's time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def dead(handle) -> bool:
    try:
        ray.get(handle.ready.remote(), timeout=DEATH_S)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_auto_grows_while_the_trainer_starves_and_shrinks_while_it_trains(cluster, packed_lmdb, within):
    """Hungry (1 s waited for each batch, 1 s away): the pool grows from 1 to what the cluster holds,
    then asks the autoscaler for one more; slow (100 s more away a batch): it shrinks back to 1, the
    leaving actor's leased batches received. Every epoch bit for bit the threads backend's."""
    room_back()
    kw = dict(TINY, batch_size=1)  # 27 batches an epoch: 6 windows of 4
    loader = make_loader(packed_lmdb, backend="ray", pool_workers="auto", pool_resources=WHOLE_NODE, **kw)
    threads = make_loader(packed_lmdb, backend="threads", **kw)
    clock = loader.sizing.clock = Clock()
    loader.sizing.window = 4
    assert len(loader.pool.members) == 1
    same(batches(loader), batches(threads))  # its second window: one actor more
    assert [size for _, size in loader.pool.size_history] == [1, 2]
    ray.get([m.ready for m in loader.pool.members])  # the new actor up (seconds)
    same(batches(loader), batches(threads))  # starved still, and the cluster full: the autoscaler asked
    assert [size for _, size in loader.pool.size_history] == [1, 2] and loader.pool.requested == 3
    handles = [m.handle for m in loader.pool.members]
    got, leaving = [], []
    for b in loader:
        got.append(b)
        leaving.append(len(loader.pool.leaving))
        clock.t += 100.0
    same(got, batches(threads))
    assert [size for _, size in loader.pool.size_history] == [1, 2, 1] and loader.pool.requested == 1
    assert [size for _, size in loader.pool_history] == [1, 2, 1]  # what datapipe train reports (#48 row 10)
    assert max(leaving) == 1 and loader.pool.leaving == []  # it left with leases out, all received
    assert loader.pool.reissued == 0 and loader.local_batches == 0
    assert sorted(dead(h) for h in handles) == [False, True]
    loader.close()
    assert loader.pool.requested == 0


def test_a_broken_off_iteration_cancels_its_leases_and_counts_none_of_them(cluster, packed_lmdb, within, monkeypatch):
    """A loop left after one batch: the batches leased ahead are cancelled (each returns or raises
    TaskCancelledError, nothing else) and no member counts them any more (before: until the next
    iteration); the next iteration serves what the threads backend's does after the same break."""
    loader = make_loader(packed_lmdb, backend="ray", **POOL1, **TINY)
    leased = []
    issue = loader._issue
    monkeypatch.setattr(loader, "_issue", lambda lease, leases: (leased.append(lease), issue(lease, leases)))
    it = iter(loader)
    next(it)
    it.close()
    assert len(leased) > 1 and all(m.in_flight == 0 for m in loader.pool.members)
    for lease in leased[1:]:
        try:
            ray.get(lease.ref, timeout=DEATH_S)
        except ray.exceptions.TaskCancelledError:
            pass
    threads = make_loader(packed_lmdb, backend="threads", **TINY)
    mirror = iter(threads)
    next(mirror)
    mirror.close()
    same(batches(loader), batches(threads))  # what a loop broken off the same way goes on to serve


def test_non_persistent_pools_take_turns_on_a_full_cluster(cluster, packed_lmdb, within, monkeypatch):
    """A train pool of two whole-node actors fills the cluster; released at the end of its epoch, the
    val pool's actor runs (before: given up after START_S, and a PoolFallback); the train pool starts again."""
    gc.collect()
    monkeypatch.setattr(pool_module, "START_S", 30.0)  # 5 s gave up actors still starting on a loaded machine
    kw = dict(TINY, backend="ray", persistent_workers=False, pool_resources=WHOLE_NODE)
    train = make_loader(packed_lmdb, pool_workers=2, **kw)
    val = make_loader(packed_lmdb, split="val", train=False, pool_workers=1, **kw)
    assert train.pool.members == [] and val.pool.members == []  # started by an iteration
    threads = make_loader(packed_lmdb, backend="threads", **TINY)
    threads_val = make_loader(packed_lmdb, backend="threads", split="val", train=False, **TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolFallback)
        abandoned, mirror = iter(train), iter(threads)  # an iteration left open after one batch, on both
        same([next(abandoned)], [next(mirror)])
        current = iter(train)
        got = [next(current)]
        del abandoned  # ends during `current`: it must not release the pool `current` reads from
        gc.collect()
        same(got + list(current), batches(threads))
        assert train.pool.members == []
        same(batches(val), batches(threads_val))
        assert val.pool.members == []
        same(batches(train, stop=2), batches(threads)[:2])
    assert train.local_batches == val.local_batches == 0 and not train.fell_back and not val.fell_back


def test_a_loader_on_a_cluster_another_loader_fills_says_so_once_and_falls_back(cluster, packed_lmdb, within,
                                                                               monkeypatch, caplog):
    """A first persistent loader holds both nodes; a second one's actor waits START_S (injected: 5 s) for
    room, then one line says the cluster is full, what holds it and what to do, and the batches are
    decoded here (before: 'a Ray pool actor was lost' every START_S, replaced, for minutes, serving
    nothing); once the first is closed, the second's next epoch runs on its pool again."""
    room_back()
    monkeypatch.setattr(pool_module, "START_S", 5.0)
    kw = dict(TINY, backend="ray", pool_resources=WHOLE_NODE)
    first = make_loader(packed_lmdb, pool_workers=2, **kw)
    ray.get([m.ready for m in first.pool.members])
    second = make_loader(packed_lmdb, pool_workers=1, **kw)
    threads = make_loader(packed_lmdb, backend="threads", **TINY)
    with pytest.warns(PoolFallback) as caught:
        same(batches(second), batches(threads))
    [warning] = [str(w.message) for w in caught if w.category is PoolFallback]
    assert "the Ray cluster is full" in warning and "close the other loader, lower pool_workers, or add nodes" in warning
    assert re.search(r"held by actors not of this pool: \d+ BatchActor \(another backend='ray' loader", warning), warning
    assert "\n" not in warning and second.pool.replaced == 0 and "was lost" not in caplog.text
    first.close()
    room_back()
    done = second.local_batches
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolFallback)
        same(batches(second), batches(threads))
    assert second.local_batches == done and not second.pool.full
    second.close()


def test_datapipe_train_builds_both_ray_loaders_non_persistent_with_its_pool_options(cluster, packed_lmdb, tmp_path):
    """`datapipe train --backend ray`: both pools non-persistent (nothing started before an iteration)."""
    from datapipe.train.config import TrainConfig
    from datapipe.train.loaders import build_loaders

    from datapipe.cli.main import build_parser

    argv = ["train", str(packed_lmdb), "--out", str(tmp_path), "--backend", "ray", "--pool-workers", "auto",
            "--pool-resources", "node=1"]
    args = build_parser().parse_args(argv)
    assert (args.pool_workers, args.pool_resources) == ("auto", (("node", 1.0),))
    config = TrainConfig(data=str(packed_lmdb), out=str(tmp_path), batch_size=4, image_size=32, workers=1, backend="ray",
                         pool_workers=args.pool_workers, pool_resources=args.pool_resources)
    loaders = build_loaders(config, torch.device("cpu"))
    assert [(lo.options.persistent_workers, lo.pool.members) for lo in loaders] == [(False, [])] * 2
    assert [(lo.options.pool_workers, lo.options.pool_resources) for lo in loaders] == [("auto", (("node", 1.0),))] * 2


def test_datapipe_train_reports_the_pools_size_in_metrics_jsonl_and_tensorboard(cluster, packed_lmdb, tmp_path):
    """#48 row 10: nothing in the logs, metrics.jsonl or summary showed the pool's size."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from datapipe.train.config import TrainConfig
    from datapipe.train.loop import train

    room_back()
    config = TrainConfig(data=str(packed_lmdb), out=str(tmp_path), model="resnet18", epochs=1, batch_size=4,
                         image_size=32, workers=1, backend="ray", pool_workers=1, log_every=2,
                         tensorboard=str(tmp_path / "tb"))
    metrics = train(config)
    assert (metrics[0]["pool_workers"], metrics[0]["pool_sizes"]) == (1, [1])
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert (line["pool_workers"], line["pool_sizes"]) == (1, [1])
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"epoch/pool_workers", "train/pool_workers"} <= set(events.Tags()["scalars"])
    assert [e.value for e in events.Scalars("epoch/pool_workers")] == [1.0]


def test_a_node_removed_mid_epoch_the_epoch_still_exact(cluster, packed_lmdb, within):
    c, nodes = cluster
    kw = dict(TINY, image_size=112)  # a batch over 100 KB: kept in its node's object store, lost with it
    loader = make_loader(packed_lmdb, backend="ray", **POOL, **kw)
    ray.get([m.ready for m in loader.pool.members])
    where = ray.get(loader.pool.members[0].ready)
    node = next(n for n in nodes if n.node_id == where)
    got = []
    for k, b in enumerate(loader):
        got.append(b)
        if k == 0:
            remove(c, nodes, node, [m.handle for m in loader.pool.members if ray.get(m.ready) == where])
    same(got, batches(make_loader(packed_lmdb, backend="threads", **kw)))
    assert loader.pool.reissued > 0 and loader.pool.replaced > 0 and loader.local_batches == 0
    assert all(ray.get(m.ready) != where for m in loader.pool.members)


def test_no_node_with_the_resources_falls_back_with_one_warning(cluster, packed_lmdb, within):
    kw = dict(TINY, num_workers=2, pool_workers=2, pool_resources={"absent": 1})
    with pytest.warns(PoolFallback) as caught:
        loader = make_loader(packed_lmdb, backend="ray", **kw)
        got = batches(loader) + batches(loader)
    assert len([w for w in caught if w.category is PoolFallback]) == 1
    fallback = [t for t in threading.enumerate() if t.name.startswith("datapipe-fallback")]
    assert len(fallback) == 2  # decoded on num_workers threads, as the threads backend would
    loader.close()
    for t in fallback:
        t.join(timeout=30)
        assert not t.is_alive()
    threads = make_loader(packed_lmdb, backend="threads", **TINY)
    same(got, batches(threads) + batches(threads))


def test_pool_fallback_false_raises_one_line(cluster, packed_lmdb, within):
    loader = make_loader(packed_lmdb, backend="ray", pool_fallback=False, **dict(TINY, pool_resources={"absent": 1}))
    with pytest.raises(PoolUnavailable, match=r"^backend='ray': no pool actor can run") as err:
        batches(loader)
    assert "\n" not in str(err.value)


@pytest.mark.full  # make test-full and CI; a removed node and the fallback are each in make test
def test_the_last_pool_node_removed_mid_epoch_falls_back_exactly(cluster, packed_lmdb, within):
    c, nodes = cluster
    loader = make_loader(packed_lmdb, backend="ray", **POOL, **TINY)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, b in enumerate(loader):
            got.append(b)
            if k == 0:
                actors, last = [m.handle for m in loader.pool.members], list(nodes)
                for node in last[:-1]:
                    remove(c, nodes, node, [])
                remove(c, nodes, last[-1], actors)
    same(got, batches(make_loader(packed_lmdb, backend="threads", **TINY)))
    assert loader.fell_back and loader.local_batches > 0 and len([w for w in caught if w.category is PoolFallback]) == 1


def test_pool_options_are_checked_in_one_line(capsys):
    """Amounts within Ray's limits (a node offers at most 1e14 of a resource, in steps of 0.0001): before,
    1e308 passed and Ray's own check overflowed (a bare OverflowError naming no option; a traceback
    from the CLI)."""
    for bad in (dict(pool_workers=0), dict(pool_workers="many"), dict(pool_resources={"CPU": 1}), dict(pool_resources={"x": -1}),
                dict(pool_fallback="no"), dict(pool_resources={"datapipe": 1e308}), dict(pool_resources={"datapipe": 2e14}),
                dict(pool_resources={"datapipe": 1e-5}), dict(pool_resources={"datapipe": float("nan")}),
                dict(pool_resources=[("datapipe", 1), ("datapipe", 2)])):
        with pytest.raises(ValueError, match=r"^pool_") as err:
            make_loader(ROOT / "fixtures" / "imagefolder", backend="ray", **bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"pool_resources\['datapipe'\] must be .* within \[0.0001, 1e\+14\] \(Ray's limits"):
        make_loader(ROOT / "fixtures" / "imagefolder", backend="ray", pool_resources={"datapipe": 1e308})
    from datapipe.cli.main import build_parser
    for command in ("train", "bench"):
        argv = [command, "data", "--pool-resources", "datapipe=1e308"] + (["--out", "x"] if command == "train" else [])
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "--pool-resources['datapipe'] must be a finite number within [0.0001, 1e+14]" in err, err
        assert "Traceback" not in err
