"""Which process-group backend a rank joins: NCCL only with a GPU per local rank."""
from datapipe.train.ddp import DistEnv, group_backend


def test_ranks_sharing_a_gpu_use_gloo_because_nccl_refuses_duplicate_gpus():
    assert group_backend(cuda=True, local_ranks=2, gpus=2) == "nccl"
    assert group_backend(cuda=True, local_ranks=8, gpus=8) == "nccl"
    assert group_backend(cuda=True, local_ranks=2, gpus=1) == "gloo"  # NCCL: "Duplicate GPU detected"
    assert group_backend(cuda=False, local_ranks=2, gpus=0) == "gloo"
    assert DistEnv(0, 2, 0).local_world_size is None  # torchrun's LOCAL_WORLD_SIZE then
