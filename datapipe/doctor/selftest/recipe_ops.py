"""The `recipe_op_*` rows of `datapipe doctor --gpu`: every op kind of the op table (augment/ops.py)
applied by DALI's operators (augment.dali: on the GPU, the images moved there before the ops as the
dali backend's decoder leaves them, or on DALI's CPU operators) against the CPU applier (augment.cpu)
on the same plans and uint8 images, within the tolerances docs/augmentation.md states ("Tolerances").
tests/backends/test_dali_recipes.py asserts the same table on the fixture photos. DALI is imported
only by the function that builds the graph."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...augment.cpu import apply_ops as cpu_apply_ops
from ...augment.dali import Context, apply_ops, modules, slot_matrices
from ...augment.ops import KIND_ID, KINDS
from ...augment.plan import Op, fill_color
from ...augment.recipe import PRESETS
from ...augment.slots import OpBounds, ops_row
from .report import Result

# DALI vs augment.cpu on the same uint8 input, per kind: (mean |difference| in levels, share of values
# more than 2 levels off), upper bounds set from what tests/backends/test_dali_recipes.py measures
# (measured_differences: 10 fixture photos at 64 px and two textures, over CASES) with a margin. Measured,
# DALI 2.4 on the CPU:
# exact (0, 0): invert, posterize, solarize, solarize_add, color, contrast, brightness, sharpness, vflip,
# grayscale; auto_contrast 0.001 (float32 vs PIL's doubles), equalize 0.25 (rebuilt from DALI's
# OpenCV-style one, <= 1 level); with the compiled warp (datapipe._warp: Pillow's values, truncated as
# Pillow stores them) rotate 0.0004, shear 0.001-0.004, translate exact; with torch's grid_sample fallback
# (float32) translate_x 0.24 with 0.4% off by more than 2 levels (the pixel whose centre maps exactly
# onto the right edge), shear 0.012-0.014, translate_y 0.035; "chain" (two slots) 0.04-0.06; hue
# 0.0017 with 0.03% off by more than 2 levels (PIL's HSV in float32 arithmetic: a hue byte at a rounding edge).
KIND_TOLERANCE = {
    "auto_contrast": (0.01, 0.0), "equalize": (0.5, 0.001), "invert": (0.0, 0.0), "rotate": (0.01, 0.001),
    "posterize": (0.0, 0.0), "solarize": (0.0, 0.0), "solarize_add": (0.0, 0.0), "color": (0.0, 0.0),
    "contrast": (0.0, 0.0), "brightness": (0.0, 0.0), "sharpness": (0.0, 0.0), "shear_x": (0.03, 0.001),
    "shear_y": (0.03, 0.001), "translate_x": (0.5, 0.006), "translate_y": (0.2, 0.001), "vflip": (0.0, 0.0),
    "grayscale": (0.0, 0.0), "hue": (0.01, 0.001), "chain": (0.1, 0.001),
}
# Parameters per kind: timm's and TrivialAugmentWide's ranges and their ends (a kind not named: 0).
CASES = {
    "rotate": (-30, 12.5, 45, -135), "posterize": (0, 1, 4, 6), "solarize": (0, 64, 128, 200, 256),
    "solarize_add": (20, 110), "color": (0.1, 0.6, 1.5, 1.9), "contrast": (0.1, 0.6, 1.5, 1.9),
    "brightness": (0.1, 0.6, 1.5, 1.9), "sharpness": (0.1, 0.6, 1.5, 1.99), "shear_x": (-0.3, 0.17, 0.99),
    "shear_y": (0.3, -0.17, -0.99), "translate_x": (-32, 10.5, 3.25, 70), "translate_y": (32, -10.5, -3.25, -70),
    "hue": (10, 64, 128, 200, 250),
}
CHAINS = (("color", 1.5, "rotate", 20.0), ("rotate", 20.0, "solarize", 128.0), ("solarize", 128.0, "rotate", 20.0),
          ("equalize", 0.0, "shear_x", -0.2), ("vflip", 0.0, "translate_x", 9.0), ("grayscale", 0.0, "contrast", 1.7))
FILL = fill_color(PRESETS["deit"])  # timm's img_mean fill (124, 116, 104), as the RandAugment presets have it
CONTROL = 20  # an op must change the images by 20x its tolerated mean (and a level): else agreement proves nothing
SIZE = 64  # the tolerances were measured at 64 px
Ops = tuple[Op, ...]


@dataclass(frozen=True)
class Agreement:
    """One kind over its cases: mean |DALI - CPU| in levels, the share of values more than 2 levels
    off, and mean |CPU - input| (how much the op changes the images: the control)."""

    kind: str
    mean: float
    share: float
    change: float

    @property
    def tolerance(self) -> tuple[float, float]:
        return KIND_TOLERANCE.get(self.kind, (0.0, 0.0))  # a kind with none declared is held to exact

    def problem(self) -> str | None:
        """Why this kind fails its tolerance or the control, else None."""
        top_mean, top_share = self.tolerance
        if self.mean > top_mean or self.share > top_share:
            return (f"mean {self.mean:.4f} levels (tolerance {top_mean:g}), {self.share:.3%} of values more than "
                    f"2 levels off (tolerance {top_share:.1%})")
        if self.change <= max(1.0, CONTROL * top_mean):
            return f"control: the op changes the images by {self.change:.2f} levels only"
        return None


def textures(size: int = SIZE) -> list[torch.Tensor]:
    """Two uint8 CHW images where sharpness and the warps' sampling show: noise, and blurred noise."""
    from PIL import Image, ImageFilter

    noise = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    blurred = np.array(Image.fromarray(noise).filter(ImageFilter.GaussianBlur(1.5)))
    return [torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).contiguous() for a in (noise, blurred)]


def synthetic_images(photos: int = 4, size: int = SIZE) -> list[torch.Tensor]:
    """Photo-like images that need no dataset (smooth colour over a gradient, a little sensor
    noise: selftest.sample's texture) and the two textures(); deterministic."""
    from .sample import smooth_texture

    rng = np.random.default_rng(1)
    out = []
    for _ in range(photos):
        smooth = np.asarray(smooth_texture(rng, size, size), dtype=np.float32)
        pixels = np.clip(smooth + rng.normal(0, 3, smooth.shape), 0, 255).astype(np.uint8)
        out.append(torch.from_numpy(pixels).permute(2, 0, 1).contiguous())
    return out + textures(size)


def run_graph(images: Sequence[torch.Tensor], op_lists: Sequence[Ops], *, fill=FILL,
              device_id: int | None = None) -> list[torch.Tensor]:
    """DALI's apply_ops (one slot per op, every kind built) on uint8 CHW images: on GPU `device_id`
    (the images moved there first, Context(cuda=True), as the dali backend's graph) or on DALI's CPU
    operators (None). uint8 CHW out, on the host."""
    fn, _, _ = modules()  # an ImportError naming the extra without DALI
    from nvidia.dali import pipeline_def

    cuda = device_id is not None
    bounds = OpBounds(max(len(ops) for ops in op_lists), tuple(KINDS))
    batch = [np.ascontiguousarray(image.permute(1, 2, 0).numpy()) for image in images]
    rows = [np.array(ops_row(ops), np.float32) for ops in op_lists]
    matrices = [slot_matrices(ops, image.shape[-1]) for ops, image in zip(op_lists, images)]

    @pipeline_def(batch_size=len(batch), num_threads=1, device_id=device_id, enable_conditionals=True)
    def graph():
        x = fn.external_source(source=[batch], layout="HWC")
        row, matrix = fn.external_source(source=[rows]), fn.external_source(source=[matrices])
        return apply_ops(x.gpu() if cuda else x, row, matrix, bounds, Context(fill=fill, cuda=cuda))

    pipe = graph()
    pipe.build()
    images_out = pipe.run()[0]
    out = [np.array(image) for image in (images_out.as_cpu() if cuda else images_out)]
    off = sorted({KINDS[int(kind)] for o, ops in zip(out, op_lists) for kind, _ in ops
                  if o.dtype != np.float32 or not np.array_equal(o, np.clip(np.floor(o), 0, 255))})
    if off:
        raise RuntimeError(f"DALI's apply_ops returned values that are not whole levels 0..255 for {off}")
    return [torch.from_numpy(o.astype(np.uint8)).permute(2, 0, 1) for o in out]


def cases() -> list[tuple[str, Ops]]:
    """(kind or "chain", ops): each kind of the table over its CASES, and the CHAINS (two slots)."""
    single = [(name, ((KIND_ID[name], float(v)),)) for name in KINDS[1:] for v in CASES.get(name, (0.0,))]
    return single + [("chain", ((KIND_ID[a], va), (KIND_ID[b], vb))) for a, va, b, vb in CHAINS]


def measured_differences(images: Sequence[torch.Tensor], *, device_id: int | None = None,
                         broken: Callable[[Ops], Ops] | None = None) -> dict[str, Agreement]:
    """Per kind (and "chain"): DALI's pixels (device_id as run_graph's) against augment.cpu's over
    every case and image. `broken` (a control) changes the ops DALI alone is given."""
    inputs = [(name, ops, image) for name, ops in cases() for image in images]
    dali = run_graph([image for *_, image in inputs], [ops if broken is None else broken(ops) for _, ops, _ in inputs],
                     device_id=device_id)
    stats: dict[str, list] = {}
    for (name, ops, image), out in zip(inputs, dali):
        expected = cpu_apply_ops(image, ops, fill=FILL).to(torch.int32)
        diff = (out.to(torch.int32) - expected).abs()
        stats.setdefault(name, []).append((diff.float().mean(), (diff > 2).float().mean(),
                                           (expected - image.to(torch.int32)).abs().float().mean()))
    return {name: Agreement(name, *(float(torch.stack(column).mean()) for column in zip(*rows)))
            for name, rows in stats.items()}


def recipe_op_results(device: torch.device, images: Sequence[torch.Tensor] | None = None) -> list[Result]:
    """The doctor's rows, one per kind: DALI's operators on `device` (a CUDA device: its GPU
    operators; the CPU: its CPU operators) against the CPU applier on synthetic_images()."""
    device_id = None if device.type != "cuda" else (torch.cuda.current_device() if device.index is None else device.index)
    where = "DALI's CPU operators" if device_id is None else f"DALI's GPU operators (cuda:{device_id})"
    measured = measured_differences(images if images is not None else synthetic_images(), device_id=device_id)
    return [_result(agreement, where) for agreement in measured.values()]


def _result(agreement: Agreement, where: str) -> Result:
    (top_mean, top_share), problem = agreement.tolerance, agreement.problem()
    figure = (f"{agreement.mean:.4f} levels, {agreement.share:.3%} > 2 off (tolerance {top_mean:g}, "
              f"{top_share:.1%}); the op changes {agreement.change:.1f}")
    values = {"kind": agreement.kind, "mean": round(agreement.mean, 5), "share_over_2": round(agreement.share, 6),
              "change": round(agreement.change, 3), "tolerance": [top_mean, top_share], "applier": where}
    detail = (f"{agreement.kind}: {where} differ from the CPU applier beyond docs/augmentation.md's tolerance: "
              f"{problem}") if problem else ""
    return Result(f"recipe_op_{agreement.kind}", "fail" if problem else "pass", figure, detail, values)
