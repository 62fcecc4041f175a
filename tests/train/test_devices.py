"""Each rank's GPU, resolved once for every backend: LOCAL_RANK under torchrun, an explicit index
as given, the current device otherwise; CPU where there is no CUDA."""
import pytest
import torch

from datapipe import make_loader


def resolve(device, environ, count, current=0):
    from datapipe.devices import resolve_device

    return resolve_device(device, environ=environ, device_count=count, current=lambda: current)


def torchrun(local_rank: int) -> dict[str, str]:
    return {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}


@pytest.mark.parametrize("device", [None, "cuda"])
def test_under_torchrun_each_of_8_ranks_gets_its_own_gpu_and_share_one_when_one_is_visible(device):
    assert [resolve(device, torchrun(r), 8) for r in range(8)] == [torch.device("cuda", r) for r in range(8)]
    assert {resolve(device, torchrun(r), 1) for r in range(8)} == {torch.device("cuda", 0)}
    assert [resolve(device, torchrun(r), 4).index for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_an_explicit_index_or_cpu_is_kept_and_without_local_rank_the_current_device_is_used():
    assert resolve("cuda:3", torchrun(5), 8) == torch.device("cuda", 3)
    assert resolve("cpu", torchrun(5), 8) == torch.device("cpu")
    assert resolve(None, {}, 8, current=2) == resolve("cuda", {}, 8, current=2) == torch.device("cuda", 2)
    assert resolve(None, {"LOCAL_RANK": ""}, 8, current=6) == torch.device("cuda", 6)


def test_without_cuda_the_default_is_the_cpu_and_asking_for_a_gpu_is_an_error_naming_the_fix():
    assert resolve(None, torchrun(3), 0) == torch.device("cpu")
    assert resolve("cpu", {}, 0) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device='cuda' but no CUDA GPU is visible.*device='cpu'"):
        resolve("cuda", torchrun(3), 0)
    with pytest.raises(ValueError, match=r"device='cuda:3' but only 2 CUDA GPU\(s\) are visible"):
        resolve("cuda:3", {}, 2)


@pytest.fixture
def eight_gpus(monkeypatch):
    """torch.cuda as a node with 8 GPUs shows it to rank 5 of a torchrun job (current device 0)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "5")


def test_loader_options_carry_the_ranks_index(eight_gpus):
    from datapipe.backends.options import LoaderOptions

    assert LoaderOptions(device="cuda").torch_device == torch.device("cuda", 5)
    assert LoaderOptions().torch_device == torch.device("cuda", 5)
    assert LoaderOptions(device="cuda:2").torch_device == torch.device("cuda", 2)


def test_dali_decodes_on_the_ranks_gpu(eight_gpus, monkeypatch, packed_lmdb):
    from datapipe.backends import dali

    class Built(Exception):
        pass

    def capture(source, **kw):
        raise Built(kw["device_id"])

    monkeypatch.setattr(dali, "build_pipeline", capture)
    loader = make_loader(packed_lmdb, backend="dali", device="cuda", batch_size=4, image_size=32, num_workers=1)
    with pytest.raises(Built) as built:
        next(iter(loader))
    assert built.value.args == (5,)
