"""The DALI operator graph: decode the view's region (nvJPEG `mixed` on CUDA, CPU operators
otherwise), resize it, cut the window, mirror, normalize. Every per-sample decision (crop box,
resize, window, flip) comes from the source, computed by datapipe.transforms exactly as the
dataloader backend computes it: no DALI random operator, so the augmentation of a record depends on
(seed, epoch, record) only, never on the rank, the worker or a resume."""
from __future__ import annotations

from ..normalize import IMAGENET_MEAN, IMAGENET_STD

# nvJPEG's buffers sized once, up front, in training pipelines, with the values DALI's ResNet-50
# example and NVIDIA's DeepLearningExamples use for ImageNet (the paddings cover its largest images,
# the hints are its largest image, for the hardware decoder); their validation pipelines keep DALI's
# defaults (16 MiB device, 8 MiB host). Too small, a buffer is reallocated whenever a larger image
# arrives (cudaFree synchronizes the device). Per decode thread: the device padding once, the host
# padding twice (double-buffered pinned memory), so MIXED_THREADS bounds the total: ~0.8 GiB of GPU
# and ~1.1 GiB of pinned host memory per training pipeline.
DEVICE_MEMORY_PADDING = 211_025_920
HOST_MEMORY_PADDING = 140_544_512
PREALLOCATE_WIDTH_HINT = 5980
PREALLOCATE_HEIGHT_HINT = 6430
# The mixed decoder's CPU threads (Huffman decoding, when the hardware decoder does not take the
# image): DALI's ResNet-50 example runs 4 (its -j default), DeepLearningExamples 5.
MIXED_THREADS = 4
HW_DECODER_LOAD = 0.65  # DALI's default share of baseline JPEGs for the hardware decoder (A100, H100...)


def thread_budget(workers: int, *, cuda: bool) -> tuple[int, int]:
    """(DALI CPU threads, parallel source worker processes) for a rank's `workers` CPUs. The source
    workers (reading, view geometry) get half. On CUDA the decode runs on the GPU: its threads get at
    most MIXED_THREADS of the rest, so the two pools stay within the rank's share. On a CPU device
    DALI's threads do the whole decode and keep the full count (tools/bench_dali_workers.py)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    py_workers = max(1, workers // 2)
    if not cuda:
        return workers, py_workers
    return max(1, min(MIXED_THREADS, workers - py_workers)), py_workers


def mixed_decoder_arguments(hw_decoder_load: float, *, preallocate: bool = True) -> dict:
    """The mixed (nvJPEG) decoder's hardware-decoder share and, with `preallocate` (training
    pipelines: the references pad those and leave their validation pipelines at DALI's defaults),
    its preallocated buffers. The CPU decoder takes none of them."""
    if not 0 <= hw_decoder_load <= 1:
        raise ValueError(f"hw_decoder_load must be within 0..1 (0: no hardware decoder), got {hw_decoder_load}")
    if not preallocate:
        return dict(hw_decoder_load=float(hw_decoder_load))
    return dict(device_memory_padding=DEVICE_MEMORY_PADDING, host_memory_padding=HOST_MEMORY_PADDING,
                preallocate_width_hint=PREALLOCATE_WIDTH_HINT, preallocate_height_hint=PREALLOCATE_HEIGHT_HINT,
                hw_decoder_load=float(hw_decoder_load))


def build_pipeline(source, *, batch_size: int, threads: int, py_workers: int, device_id: int | None,
                   start_method: str, seed: int, size: int, channels_last: bool, half: bool,
                   hw_decoder_load: float = HW_DECODER_LOAD, preallocate: bool = True):
    """A built-to-be DALI Pipeline whose outputs are images, labels, indices and replaced indices.
    On CUDA the images and labels leave it on the GPU (labels.gpu(), as DALI's ResNet-50 example);
    indices and replaced stay on the host, where the loader reads them."""
    from nvidia.dali import Pipeline, fn, types

    from .forking import track
    from .source import OUTPUTS

    cuda = device_id is not None
    pipe = Pipeline(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed,
                    py_num_workers=py_workers, py_start_method=start_method, prefetch_queue_depth=2)
    track(pipe)  # a forked child never shuts it down (forking.py)
    dtypes = [types.UINT8, types.INT64, types.INT64, types.FLOAT, types.FLOAT, types.FLOAT, types.FLOAT,
              types.INT32, types.INT64]
    with pipe:
        # prefetch_queue_depth: DALI schedules a batch on its workers only while fewer than this many
        # are ahead; its default, 1, keeps one worker busy and the others idle (on storage with latency
        # the source then starves the decoder). One batch ahead per worker keeps them all reading.
        # Memory: the encoded bytes of py_workers + 2 (the pipeline's queue) batches in shared memory.
        # Batch mode, not per-sample mode: the source returns the epoch's short last batch itself.
        data, labels, indices, roi_anchor, roi_shape, resized, window, flip, replaced = fn.external_source(
            source=source, num_outputs=OUTPUTS, batch=True, batch_info=True, parallel=True, dtype=dtypes,
            prefetch_queue_depth=py_workers)
        decoder = mixed_decoder_arguments(hw_decoder_load, preallocate=preallocate) if cuda else {}
        images = fn.decoders.image_slice(data, roi_anchor, roi_shape, device="mixed" if cuda else "cpu",
                                         output_type=types.RGB, axis_names="WH", normalized_anchor=False,
                                         normalized_shape=False, **decoder)
        images = fn.resize(images, resize_x=resized[0], resize_y=resized[1], interp_type=types.INTERP_LINEAR,
                           antialias=True)
        images = fn.slice(images, window, fn.constant(fdata=[size, size]), axis_names="WH",
                          normalized_anchor=False, normalized_shape=False)
        images = fn.crop_mirror_normalize(images, mirror=flip, mean=[m * 255 for m in IMAGENET_MEAN],
                                          std=[s * 255 for s in IMAGENET_STD],
                                          dtype=types.FLOAT16 if half else types.FLOAT,
                                          output_layout="HWC" if channels_last else "CHW")
        pipe.set_outputs(images, labels.gpu() if cuda else labels, indices, replaced)
    return pipe
