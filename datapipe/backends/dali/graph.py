"""The DALI operator graph: decode the view's region (nvJPEG `mixed` on CUDA, CPU operators
otherwise), resize it, cut the window, mirror, normalize. Every per-sample decision (crop box,
resize, window, flip) comes from the source, computed by datapipe.transforms exactly as the
dataloader backend computes it: no DALI random operator, so the augmentation of a record depends on
(seed, epoch, record) only, never on the rank, the worker or a resume."""
from __future__ import annotations

from ..normalize import IMAGENET_MEAN, IMAGENET_STD


def build_pipeline(source, *, batch_size: int, threads: int, py_workers: int, device_id: int | None,
                   start_method: str, seed: int, size: int, channels_last: bool, half: bool):
    """A built-to-be DALI Pipeline whose outputs are images, labels, indices and replaced indices."""
    from nvidia.dali import Pipeline, fn, types

    from .forking import track
    from .source import OUTPUTS

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
        images = fn.decoders.image_slice(data, roi_anchor, roi_shape, device="mixed" if device_id is not None else "cpu",
                                         output_type=types.RGB, axis_names="WH", normalized_anchor=False,
                                         normalized_shape=False)
        images = fn.resize(images, resize_x=resized[0], resize_y=resized[1], interp_type=types.INTERP_LINEAR,
                           antialias=True)
        images = fn.slice(images, window, fn.constant(fdata=[size, size]), axis_names="WH",
                          normalized_anchor=False, normalized_shape=False)
        images = fn.crop_mirror_normalize(images, mirror=flip, mean=[m * 255 for m in IMAGENET_MEAN],
                                          std=[s * 255 for s in IMAGENET_STD],
                                          dtype=types.FLOAT16 if half else types.FLOAT,
                                          output_layout="HWC" if channels_last else "CHW")
        pipe.set_outputs(images, labels, indices, replaced)
    return pipe
