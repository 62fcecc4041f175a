"""The DALI operator graph: decode the view's region (nvJPEG `mixed` on CUDA, CPU operators
otherwise), resize it (bilinear or bicubic per sample), cut the window, mirror, apply the recipe's
pixel ops (datapipe.augment.dali), normalize by the recipe's mean and std. Every per-sample decision
(crop box, resize, window, flip, interpolation, ops and their parameters) comes from the source,
drawn by the planner (datapipe.augment.plan) exactly as the CPU backends draw it: no DALI random
operator, so the augmentation of a record depends on (seed, epoch, record) only, never on the rank,
the worker or a resume."""
from __future__ import annotations

from ...augment.dali import Context, apply_ops
from ...augment.plan import fill_color
from ...augment.recipe import Recipe
from ...augment.slots import OpBounds, op_bounds

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


OUTPUT_TYPES = ("float32", "float16", "uint8")  # the pipeline's image dtype (uint8: the pixels, not normalized)


def build_pipeline(source, *, batch_size: int, threads: int, py_workers: int, device_id: int | None,
                   start_method: str, seed: int, channels_last: bool, output: str = "float32",
                   recipe: Recipe | None = None, hw_decoder_load: float = HW_DECODER_LOAD, preallocate: bool = True):
    """A built-to-be DALI Pipeline whose outputs are images, labels, indices and replaced indices,
    then the source's field outputs where it sends them (wire.FIELDS). On CUDA the images and
    labels leave it on the GPU (labels.gpu(), as DALI's ResNet-50 example); the rest stay on the
    host, where the loader reads them. `recipe` gives the mean and
    std and the op slots to build where the source sends ops (the source's wire carries ops: train views of
    a recipe with ops); without them (the default recipe, eval) the graph has no op and no DALI
    conditional."""
    from nvidia.dali import pipeline_def

    from .forking import track

    if output not in OUTPUT_TYPES:
        raise ValueError(f"output must be one of {OUTPUT_TYPES}, got {output!r}")
    cuda = device_id is not None
    layout = source.bounds or op_bounds(None)
    recipe = recipe or Recipe()
    pipe = pipeline_def(_graph)(
        source=source, cuda=cuda, output=output, channels_last=channels_last, layout=layout,
        context=Context(fill=fill_color(recipe), cuda=cuda), mean=recipe.mean, std=recipe.std,
        decoder=mixed_decoder_arguments(hw_decoder_load, preallocate=preallocate) if cuda else {},
        py_workers=py_workers, enable_conditionals=layout.applies, batch_size=batch_size, num_threads=threads,
        device_id=device_id, seed=seed, py_num_workers=py_workers, py_start_method=start_method,
        prefetch_queue_depth=2)
    return track(pipe)  # a forked child never shuts it down (forking.py)


def _graph(source, cuda: bool, output: str, channels_last: bool, layout: OpBounds, context: Context, mean, std,
           decoder: dict, py_workers: int):
    """The graph (pipeline_def's function): source, decode the ROI, resize, window, ops, normalize."""
    from nvidia.dali import fn, types

    # prefetch_queue_depth: DALI schedules a batch on its workers only while fewer than this many
    # are ahead; its default, 1, keeps one worker busy and the others idle (on storage with latency
    # the source then starves the decoder). One batch ahead per worker keeps them all reading.
    # Memory: the encoded bytes of py_workers + 2 (the pipeline's queue) batches in shared memory.
    # Batch mode, not per-sample mode: the source returns the epoch's short last batch itself.
    wire = source.wire
    nodes = fn.external_source(source=source, num_outputs=len(wire.columns), batch=True, batch_info=True,
                               parallel=True, dtype=wire.dali_types(), prefetch_queue_depth=py_workers)
    s = dict(zip(wire.names, nodes))
    images = fn.decoders.image_slice(s["data"], s["roi_anchor"], s["roi_shape"], device="mixed" if cuda else "cpu",
                                     output_type=types.RGB, axis_names="WH", normalized_anchor=False,
                                     normalized_shape=False, **decoder)
    # interpolation: 0 bilinear, 1 bicubic (the source's codes) -> DALI's INTERP_LINEAR, INTERP_CUBIC
    interp = fn.cast(s["interpolation"] + int(types.INTERP_LINEAR), dtype=types.INTERP_TYPE)
    images = fn.resize(images, resize_x=s["resized"][0], resize_y=s["resized"][1], interp_type=interp, antialias=True)
    images = fn.slice(images, s["window"], s["window_shape"], axis_names="WH", normalized_anchor=False,
                      normalized_shape=False)
    mirror = s["flip"]
    if layout.applies:  # a Python bool: the op graph exists only where the source sends ops
        images = fn.flip(images, horizontal=mirror)  # the view's mirror before the ops, as on the CPU path
        mix = tuple(s[name] for name in ("mix_ops", "mix_matrices", "mix_weights", "mix_m")) if layout.chains else None
        images = apply_ops(images, s["ops"], s["matrices"], layout, context, mix)
        mirror = 0
    raw = output == "uint8"  # the pixels: no normalization
    dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}[output]
    images = fn.crop_mirror_normalize(images, mirror=mirror, mean=[0.0] * 3 if raw else [m * 255 for m in mean],
                                      std=[1.0] * 3 if raw else [v * 255 for v in std], dtype=dtype,
                                      output_layout="HWC" if channels_last else "CHW")
    fields = tuple(s[name] for name in ("fields", "fields_len") if name in s)  # passed through, on the host
    return (images, s["label"].gpu() if cuda else s["label"], s["index"], s["replaced"], *fields)
