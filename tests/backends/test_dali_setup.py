"""How the DALI backend sets DALI up, checked on any machine: the thread budget, the mixed
decoder's arguments against the installed DALI's own schema, the workers' start method."""
import pytest
import torch

from datapipe import make_loader
from datapipe.backends.dali import choose_start_method, cuda_initialized
from datapipe.backends.dali.graph import MIXED_THREADS, mixed_decoder_arguments, thread_budget


def test_on_cuda_the_decoder_threads_and_source_workers_share_the_rank_cpus():
    """The mixed decoder gets at most MIXED_THREADS (the references run 4-5), never the rank's whole
    share on top of the source workers; a CPU pipeline keeps its threads (they do the decode)."""
    for workers in (1, 2, 3, 8, 28):
        threads, py = thread_budget(workers, cuda=True)
        assert 1 <= threads <= MIXED_THREADS and py == max(1, workers // 2)
        assert threads + py <= max(workers, 2)
    assert thread_budget(28, cuda=True) == (4, 14)
    assert thread_budget(28, cuda=False) == (28, 14)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        thread_budget(0, cuda=True)


def test_the_mixed_decoder_arguments_exist_in_the_installed_dali():
    """The nvJPEG preallocation (as DALI's ResNet-50 example and DeepLearningExamples set it) and
    hw_decoder_load: every name is an argument of decoders.image_slice in this DALI, so a GPU build
    cannot fail on a misspelt one."""
    from nvidia.dali import backend

    schema = backend.GetSchema("decoders__ImageSlice")
    arguments = mixed_decoder_arguments(0.65)
    assert {"device_memory_padding", "host_memory_padding", "preallocate_width_hint", "preallocate_height_hint",
            "hw_decoder_load"} == set(arguments)
    assert all(schema.HasArgument(name) for name in arguments)
    assert arguments["device_memory_padding"] > 0 and mixed_decoder_arguments(0)["hw_decoder_load"] == 0.0
    assert mixed_decoder_arguments(0.65, preallocate=False) == {"hw_decoder_load": 0.65}  # eval: DALI's defaults
    with pytest.raises(ValueError, match="hw_decoder_load must be within 0..1"):
        mixed_decoder_arguments(1.5)


def test_source_workers_spawn_once_cuda_is_initialised_even_for_a_cpu_pipeline():
    """DALI refuses to fork once anything initialised CUDA in the process."""
    assert choose_start_method(None, cuda_device=False, cuda_initialized=False) == "fork"
    assert choose_start_method(None, cuda_device=False, cuda_initialized=True) == "spawn"
    assert choose_start_method(None, cuda_device=True, cuda_initialized=False) == "spawn"
    assert choose_start_method("forkserver", cuda_device=True, cuda_initialized=True) == "forkserver"


def test_a_cpu_pipeline_forks_while_cuda_is_not_initialised(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="dali", device="cpu", batch_size=4, image_size=32, num_workers=1)
    assert loader.start_method == ("spawn" if cuda_initialized() else "fork")
    if not torch.cuda.is_available():
        assert not cuda_initialized()
    images, labels, _ = next(iter(loader))
    assert images.device.type == labels.device.type == "cpu" and labels.dtype == torch.int64
