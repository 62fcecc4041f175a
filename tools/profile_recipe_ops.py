"""A recipe's CPU cost per image, op by op, on ImageNet-sized photos (issue #39 item 4), and
prototypes of fused kernels beside today's (item 4's "compile the plan"). Rerun after an optimisation.
(Ported to the one-planner-call API: augment.plan.plan_sample, transforms.open_encoded + decode_view,
the op table augment.ops.TABLE; the "before" copy of this tool is at commit 7104ee5.)

    PYTHONPATH=. .venv/bin/python tools/profile_recipe_ops.py /work/peers-data/imagenet-like \
        [--recipe deit] [--images 400] [--fusions] [--json benchmarks/recipes-profile/ops.json]
    PYTHONPATH=. .venv/bin/python tools/profile_recipe_ops.py LMDB --loop threads --batches 40   # for py-spy

One thread (torch.set_num_threads(1), as each decode thread or worker runs), the stages timed call by
call in this thread's CPU time (time.thread_time_ns, immune to a loaded machine's preemption): the
decode + crop-resize (transforms.open_encoded + decode_view: the header and the decode; the view's
draws are now the planner's), the planner's call (plan.plan_sample: every draw of the record, view and
ops), each op kind's CPU kernel (augment.ops.TABLE[name].cpu) on 224 x 224 views
with the parameters the planner drew for it, the normalize (threads: Normalizer.sample_into per
sample; dataloader: the batch normalize), the erasing and the mixing (augment/batch.BatchStage) per
batch of 64 divided by 64. "per image" weighs each op kind by how often the recipe's plans hold it
(counted over --plans plans), so the rows add up to the recipe's per-image CPU cost on one core.

--fusions times prototypes (this file only; datapipe/ is untouched) against today's kernels on the
same images, with their largest pixel difference: point ops (brightness, contrast, posterize,
solarize...) as one composed lookup table; the affine ops: today's cpu.affine (the compiled
datapipe._warp where built) against the old torch path (cpu.affine_grid_sample), Pillow's uint8
Image.transform, an analytic-grid grid_sample and a separable shift; the crop-resize and an affine op
as one resampling from the decoded crop.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datapipe.augment import cpu_kernels as cpu  # noqa: E402
from datapipe.augment.cpu import apply_ops  # noqa: E402
from datapipe.augment.batch import BatchStage  # noqa: E402
from datapipe.augment.batch_plan import plan_mix  # noqa: E402
from datapipe.augment.ops import KINDS, TABLE  # noqa: E402
from datapipe.augment.plan import fill_color, plan_sample  # noqa: E402
from datapipe.augment.recipe import resolve_recipe  # noqa: E402
from datapipe.backends.normalize import Normalizer  # noqa: E402
from datapipe.image.geometry import scaled_box  # noqa: E402
from datapipe.augment.view import decode_view, open_encoded  # noqa: E402

SIZE, BATCH = 224, 64
WARP = "compiled datapipe._warp" if cpu._warp is not None else "affine_grid_sample (datapipe._warp not built)"
POINT = ("posterize", "solarize", "solarize_add", "invert", "brightness", "auto_contrast", "equalize", "contrast")


def clock(fn, *args, **kw) -> tuple[float, object]:
    """(this thread's CPU ms for the call, its result): CPU time, not wall time, so a loaded
    machine's preemptions do not count (every kernel here runs in this one thread)."""
    t = time.thread_time_ns()
    out = fn(*args, **kw)
    return (time.thread_time_ns() - t) / 1e6, out


def stats(ms: list[float]) -> dict:
    return {"n": len(ms), "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
            "p90_ms": float(np.percentile(ms, 90))}


def photos(folder: Path, count: int, seed: int = 0) -> list[bytes]:
    """`count` files of the corpus (its whole mix: JPEGs, PNGs, CMYK...), a fixed random sample."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.upper() in (".JPEG", ".JPG", ".PNG"))
    random.Random(seed).shuffle(files)
    out = []
    for p in files:
        data = p.read_bytes()
        try:
            with Image.open(p) as img:
                img.verify()
        except Exception:  # the corpus's bad files
            continue
        out.append(data)
        if len(out) == count:
            break
    return out


# ---- today's stages -----------------------------------------------------------------------------

def profile(datas: list[bytes], recipe, plans: int, repeat: int) -> dict:
    torch.set_num_threads(1)
    fill = fill_color(recipe)
    decode_ms, plan_ms, views, ops_seen = [], [], [], []
    for i, data in enumerate(datas):
        t = time.thread_time_ns()
        encoded = open_encoded(data)
        header = time.thread_time_ns() - t
        ms, plan = clock(plan_sample, recipe, 0, 0, i, SIZE, encoded.width, encoded.height, train=True)
        plan_ms.append(ms)
        ms, view = clock(decode_view, encoded, plan)
        decode_ms.append(ms + header / 1e6)
        views.append(view)
        ops_seen.extend(plan.ops)
    # how often each kind is in a plan: the plans of `plans` records (one planner call each, as a backend)
    freq: Counter = Counter()
    params: dict[str, list[float]] = {}
    for i in range(plans):
        for kind, value in plan_sample(recipe, 1, 0, i, SIZE, 500, 375, train=True).ops:
            name = KINDS[int(kind)]
            freq[name] += 1
            params.setdefault(name, []).append(float(value))
    rows = {"decode + crop-resize (decode_view)": {**stats(decode_ms), "per_image": 1.0},
            "plan_sample (all the record's draws)": {**stats(plan_ms), "per_image": 1.0}}
    for name in sorted(freq, key=lambda n: -freq[n]):
        ms = []
        values = params[name]
        for r in range(repeat):
            for k, view in enumerate(views):
                value = values[(k + r * len(views)) % len(values)]
                ms.append(clock(TABLE[name].cpu, view, value, fill)[0])
        rows[f"op {name}"] = {**stats(ms), "per_image": freq[name] / plans}
    # apply_ops' own loop on an empty plan (the dispatch beside the kernels)
    ms = [clock(apply_ops, v, (), fill=fill)[0] for v in views]
    rows["apply_ops dispatch (empty plan)"] = {**stats(ms), "per_image": 1.0}
    # normalize: the threads backend's per-sample sample_into, and the dataloader's batch normalize
    norm = Normalizer(torch.device("cpu"), torch.float32, False, mean=recipe.mean, std=recipe.std)
    batch_views = [views[k % len(views)] for k in range(BATCH)]
    batch_u8 = torch.stack(batch_views)
    out = norm.empty(BATCH, SIZE)
    ms = [clock(norm.sample_into, out[k % BATCH], v)[0] for r in range(repeat) for k, v in enumerate(views)]
    rows["normalize, per sample (threads: sample_into)"] = {**stats(ms), "per_image": 1.0, "threads_only": True}
    ms = [clock(norm, batch_u8)[0] / BATCH for _ in range(5 * repeat)]
    rows["normalize, per batch / 64 (dataloader)"] = {**stats(ms), "per_image": 1.0, "dataloader_only": True}
    ms = [clock(torch.stack, batch_views)[0] / BATCH for _ in range(5 * repeat)]
    rows["collate torch.stack / 64 (dataloader)"] = {**stats(ms), "per_image": 1.0, "dataloader_only": True}
    # the batch stage: erasing, then the mixing and soft targets, per batch of 64 / 64
    stage = BatchStage(recipe, seed=0, num_classes=20)
    normalized = norm(batch_u8)
    erase_ms, mix_ms = [], []
    for b in range(5 * repeat):
        images = normalized.clone()
        indices = torch.arange(b * BATCH, (b + 1) * BATCH)
        erase_ms.append(clock(stage.erase, images, indices, 0)[0] / BATCH)
        labels = torch.randint(0, 20, (BATCH,))
        t = time.thread_time_ns()
        mix = plan_mix(recipe, 0, 0, b, 0, BATCH, SIZE, SIZE)
        mixed, lam = (stage._mix_batch if recipe.mix_mode == "batch" else stage._mix_elem)(images, mix)
        stage.targets(labels, lam)
        mix_ms.append((time.thread_time_ns() - t) / 1e6 / BATCH)
    rows["erasing (BatchStage.erase) / 64"] = {**stats(erase_ms), "per_image": 1.0}
    rows["mixup/cutmix + targets / 64"] = {**stats(mix_ms), "per_image": 1.0}
    for row in rows.values():
        row["expected_ms_per_image"] = row["mean_ms"] * row["per_image"]
    return {"rows": rows, "ops_per_image": sum(freq.values()) / plans, "plans": plans, "images": len(datas)}


def print_profile(result: dict) -> None:
    rows = result["rows"]
    total = {b: sum(r["expected_ms_per_image"] for r in rows.values() if not r.get(f"{o}_only"))
             for b, o in (("threads", "dataloader"), ("dataloader", "threads"))}
    base = {b: rows["decode + crop-resize (decode_view)"]["expected_ms_per_image"]
            + rows["normalize, per sample (threads: sample_into)" if b == "threads" else
                   "normalize, per batch / 64 (dataloader)"]["expected_ms_per_image"]
            + (rows["collate torch.stack / 64 (dataloader)"]["expected_ms_per_image"] if b == "dataloader" else 0)
            for b in total}
    print(f"{result['images']} photos, {result['plans']} plans ({result['ops_per_image']:.2f} ops an image); "
          f"one thread; ms per 224 x 224 image")
    print("| stage | median ms/call | mean ms/call | calls/img | expected ms/img | share (threads total) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        share = "" if r.get("dataloader_only") else f"{100 * r['expected_ms_per_image'] / total['threads']:.1f}%"
        print(f"| {name} | {r['median_ms']:.3f} | {r['mean_ms']:.3f} | {r['per_image']:.3f} "
              f"| {r['expected_ms_per_image']:.3f} | {share} |")
    for b in total:
        print(f"{b}: total {total[b]:.2f} ms/img; decode+resize+normalize{'+collate' if b == 'dataloader' else ''} "
              f"{base[b]:.2f}; the recipe's own {total[b] - base[b]:.2f} ms/img")
    result["totals"] = {b: {"total_ms": total[b], "view_and_normalize_ms": base[b], "recipe_ms": total[b] - base[b]}
                        for b in total}


# ---- fusion prototypes ---------------------------------------------------------------------------

def lut_of(name: str, value: float, image: torch.Tensor | None = None) -> np.ndarray:
    """The 256-entry table (or 3 x 256) of a point op, equal to cpu.py's kernel value for value."""
    i = np.arange(256)
    if name == "posterize":
        bits = int(value)
        return i if bits >= 8 else i & (~(2 ** (8 - bits) - 1) & 0xFF)
    if name == "solarize":
        return np.where(i >= value, 255 - i, i)
    if name == "solarize_add":
        return np.where(i < 128, np.minimum(255, i + int(value)), i)
    if name == "invert":
        return 255 - i
    if name == "brightness":  # float32, as the kernel: x * f clamped, truncated
        return np.clip(i.astype(np.float32) * np.float32(value), 0, 255).astype(np.uint8)
    if name == "contrast":
        mean = int(cpu._gray_float(image.to(torch.float32)).to(torch.float64).mean().item() + 0.5)
        m = np.float32(mean)
        return np.clip((i.astype(np.float32) - m) * np.float32(value) + m, 0, 255).astype(np.uint8)
    raise KeyError(name)


def gray_mean_int(image: torch.Tensor) -> int:
    """contrast's mean of PIL's L image, in integers on uint8 (no float image): the same value."""
    px = image.numpy().reshape(3, -1)
    # per-channel histograms are not enough (the floor is per pixel): one int32 pass
    lum = (px[0].astype(np.int32) * 19595 + px[1].astype(np.int32) * 38470 + px[2].astype(np.int32) * 7471
           + 32768) >> 16
    return int(lum.mean() + 0.5)


def pil_affine(image: torch.Tensor, matrix, fill, resample=Image.Resampling.BILINEAR) -> torch.Tensor:
    """Pillow's uint8 Image.transform(AFFINE) (what timm runs), from and to CHW tensors."""
    hwc = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
    out = Image.fromarray(hwc).transform((image.shape[2], image.shape[1]), Image.Transform.AFFINE, matrix,
                                         resample=resample, fillcolor=tuple(fill))
    return torch.from_numpy(np.array(out)).permute(2, 0, 1).contiguous()


def fusions(datas: list[bytes], recipe, repeat: int) -> dict:
    torch.set_num_threads(1)
    fill = fill_color(recipe)
    views = []
    for i, d in enumerate(datas):
        encoded = open_encoded(d)
        views.append(decode_view(encoded, plan_sample(recipe, 0, 0, i, SIZE, encoded.width, encoded.height)))
    out: dict[str, dict] = {}

    def row(name, today, proto, check=None, note=""):
        a = [clock(today, v)[0] for _ in range(repeat) for v in views]
        b = [clock(proto, v)[0] for _ in range(repeat) for v in views]
        diff = max(int((today(v).int() - proto(v).int()).abs().max()) for v in views[:50]) if check is None else check
        out[name] = {"today_median_ms": statistics.median(a), "proto_median_ms": statistics.median(b),
                     "today_mean_ms": statistics.fmean(a), "proto_mean_ms": statistics.fmean(b),
                     "x_faster": statistics.median(a) / statistics.median(b), "max_abs_diff": diff, "note": note}

    # 1. the float point ops as a LUT (exact: a function of each value alone)
    row("brightness 1.3: float kernel -> LUT", lambda v: cpu.brightness(v, 1.3),
        lambda v: cpu.lut(v, lut_of("brightness", 1.3)))
    row("contrast 1.3: float kernel -> int mean + LUT", lambda v: cpu.contrast(v, 1.3),
        lambda v: cpu.lut(v, _contrast_table(v, 1.3)))
    row("posterize 6: torch bitwise -> LUT", lambda v: TABLE["posterize"].cpu(v, 6, fill),
        lambda v: cpu.lut(v, lut_of("posterize", 6)))
    # 2. two consecutive point ops composed into one table
    two = (("solarize", 200.0), ("brightness", 1.3))
    row("solarize then brightness: 2 kernels -> 1 composed LUT",
        lambda v: cpu.brightness(TABLE["solarize"].cpu(v, 200.0, fill), 1.3),
        lambda v: cpu.lut(v, np.take(lut_of(*two[1]), lut_of(*two[0]))))
    # a shared uint8 LUT kernel: torch's index on a flattened view against NumPy's take, 1 table
    table = lut_of("solarize", 128.0).astype(np.uint8)
    t_table = torch.from_numpy(table)
    row("LUT: np.take (today) vs torch.take", lambda v: cpu.lut(v, table), lambda v: t_table[v.long()], check=0,
        note="torch's int64 gather, for scale")
    # 3. the affine ops. 3a: the old torch path (affine_grid + grid_sample, float32: "today" here)
    # against cpu.affine as shipped (the compiled uint8 warp where built): the C warp's gain
    for kind, value in (("rotate", 13.5), ("shear_x", 0.15), ("shear_y", -0.15), ("translate_x", 45.3),
                        ("translate_y", 45.3)):
        m = TABLE[kind].affine(value, SIZE, SIZE)
        row(f"{kind}: cpu.affine_grid_sample (old torch path) -> cpu.affine ({WARP})",
            lambda v: cpu.affine_grid_sample(v, m, fill), lambda v: cpu.affine(v, m, fill),
            note="the shipped kernel against the one it replaced")
    # 3b. today's cpu.affine against Pillow's uint8 transform (timm's own kernel)
    for kind, value in (("rotate", 13.5), ("shear_x", 0.15), ("translate_x", 45.0)):
        m = TABLE[kind].affine(value, SIZE, SIZE)
        row(f"{kind}: cpu.affine -> Pillow uint8 transform (bilinear)", lambda v: cpu.affine(v, m, fill),
            lambda v: pil_affine(v, m, fill), note="rounding differs where a sample lands between levels")
    # 3c. grid_sample with its grid and PIL's inside-mask built analytically (two broadcast adds)
    # instead of affine_grid's batched matmul and a 4-D comparison, against today's cpu.affine
    for kind, value in (("rotate", 13.5), ("shear_y", -0.15), ("translate_y", 45.3)):
        m = TABLE[kind].affine(value, SIZE, SIZE)
        row(f"{kind}: cpu.affine -> analytic grid + grid_sample", lambda v: cpu.affine(v, m, fill),
            lambda v: lean_affine(v, m, fill), note="the before run's best torch set-up")
    row("translate_x 45.3: cpu.affine -> slice + 1 lerp (separable shift)",
        lambda v: cpu.affine(v, TABLE["translate_x"].affine(45.3, SIZE, SIZE), fill),
        lambda v: shift_x(v, 45.3, fill), note="a pure shift is a 2-tap filter along one axis")
    # 4. crop-resize + an affine op as one resampling (no second pass, no float image)
    out.update(fused_crop_affine(datas, recipe, fill, repeat))
    return out


_AXIS = torch.arange(SIZE, dtype=torch.float32) + 0.5  # pixel centres


def lean_affine(image: torch.Tensor, matrix, fill) -> torch.Tensor:
    """cpu.affine_grid_sample with the grid as (a x + c) + (b y) broadcast sums in grid_sample's -1..1 units,
    and PIL's inside test on the same numbers."""
    _, h, w = image.shape
    a, b, c, d, e, f = matrix
    xs, ys = _AXIS[:w], _AXIS[:h]
    u = (xs * (2 * a / w) + (2 * c / w - 1))[None, :] + (ys * (2 * b / w))[:, None]
    v = (xs * (2 * d / h))[None, :] + (ys * (2 * e / h) + (2 * f / h - 1))[:, None]
    grid = torch.stack((u, v), -1)[None]
    out = F.grid_sample(image.to(torch.float32)[None], grid, mode="bilinear", padding_mode="border",
                        align_corners=False)[0]
    inside = (u >= -1) & (u < 1) & (v >= -1) & (v < 1)
    colour = torch.tensor(fill, dtype=torch.float32).view(3, 1, 1)
    return torch.where(inside, out, colour).round_().clamp_(0, 255).to(torch.uint8)


def shift_x(image: torch.Tensor, value: float, fill) -> torch.Tensor:
    """translate_x as PIL computes it (input x = x + value, bilinear, border-clamped taps, the fill
    where a centre maps outside): one lerp of two column slices."""
    _, h, w = image.shape
    s = math.floor(value)
    frac = value - s
    x = image.to(torch.float32)
    out = torch.empty((3, h, w), dtype=torch.float32)
    out[:] = torch.tensor(fill, dtype=torch.float32).view(3, 1, 1)
    # output column j samples input at j + 0.5 + value - 0.5 = j + s + frac between columns j+s and j+s+1,
    # clamped at the border; inside when 0 <= j + 0.5 + value < w
    lo, hi = max(0, math.ceil(-0.5 - value)), min(w, math.ceil(w - 0.5 - value))
    if lo < hi:
        left = (torch.arange(lo, hi) + s).clamp_(0, w - 1)
        right = (torch.arange(lo, hi) + s + 1).clamp_(0, w - 1)
        out[:, :, lo:hi] = torch.lerp(x[:, :, left], x[:, :, right], frac)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _contrast_table(v: torch.Tensor, factor: float) -> np.ndarray:
    i = np.arange(256, dtype=np.float32)
    m = np.float32(gray_mean_int(v))
    return np.clip((i - m) * np.float32(factor) + m, 0, 255).astype(np.uint8)


def fused_crop_affine(datas: list[bytes], recipe, fill, repeat: int) -> dict:
    """From the decoded pixels: today's crop-resize (antialiased bicubic) then rotate 13.5 degrees
    (cpu.affine) against one Pillow transform of the crop with the composed matrix (bicubic, uint8,
    no antialias: Pillow's transform filters at the output's scale only) and one grid_sample."""
    import simplejpeg

    from datapipe.augment.plan import random_resized_crop
    from datapipe.augment.view import _resize

    two, one_pil, one_grid, diffs = [], [], [], []
    for i, data in enumerate(datas):
        try:
            pixels = simplejpeg.decode_jpeg(data, colorspace="RGB")
        except Exception:
            continue
        h, w = pixels.shape[:2]
        crop = random_resized_crop(w, h, random.Random(i), recipe.scale, recipe.ratio, 0.0)
        left, top, right, bottom = scaled_box(crop, w, h, w, h)
        region = pixels[top:bottom, left:right]
        rw, rh = right - left, bottom - top
        a, b, c, d, e, f = TABLE["rotate"].affine(13.5, SIZE, SIZE)
        sx, sy = rw / SIZE, rh / SIZE  # output-of-resize coords -> region coords
        composed = (a * sx, b * sx, c * sx, d * sy, e * sy, f * sy)

        def today():
            return cpu.affine(_resize(region, SIZE, SIZE, "bicubic"), (a, b, c, d, e, f), fill)

        def fused_pil():
            img = Image.fromarray(np.ascontiguousarray(region))
            o = img.transform((SIZE, SIZE), Image.Transform.AFFINE, composed, resample=Image.Resampling.BICUBIC,
                              fillcolor=tuple(fill))
            return torch.from_numpy(np.array(o)).permute(2, 0, 1).contiguous()

        for _ in range(repeat):
            two.append(clock(today)[0])
            one_pil.append(clock(fused_pil)[0])
        one_grid.append(clock(_affine_sized, region, composed, fill)[0])
        if len(diffs) < 50:
            ta, fb = today().float(), fused_pil().float()
            diffs.append(float((ta - fb).abs().mean()))
    return {"crop-resize + rotate: 2 resamplings -> 1 Pillow transform (bicubic, uint8)": {
                "today_median_ms": statistics.median(two), "proto_median_ms": statistics.median(one_pil),
                "today_mean_ms": statistics.fmean(two), "proto_mean_ms": statistics.fmean(one_pil),
                "x_faster": statistics.median(two) / statistics.median(one_pil),
                "mean_abs_diff": statistics.fmean(diffs),
                "note": "decode excluded; no antialias when the crop is > 224 px (aliasing vs today's)"},
            "crop-resize + rotate: 2 resamplings -> 1 grid_sample from the crop (float)": {
                "today_median_ms": statistics.median(two), "proto_median_ms": statistics.median(one_grid),
                "today_mean_ms": statistics.fmean(two), "proto_mean_ms": statistics.fmean(one_grid),
                "x_faster": statistics.median(two) / statistics.median(one_grid),
                "note": "bilinear, the crop converted to float whole"}}


def _affine_sized(region: np.ndarray, matrix, fill) -> torch.Tensor:
    """cpu.affine_grid_sample's grid_sample from a region of any size to SIZE x SIZE (the composed map)."""
    image = torch.from_numpy(np.ascontiguousarray(region)).permute(2, 0, 1)
    _, h, w = image.shape
    a, b, c, d, e, f = matrix
    # output pixel centres (SIZE grid) -> input points -> grid_sample's -1..1 over the input
    ys, xs = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32) + 0.5, torch.arange(SIZE, dtype=torch.float32) + 0.5,
                            indexing="ij")
    u, v = a * xs + b * ys + c, d * xs + e * ys + f
    grid = torch.stack((2 * u / w - 1, 2 * v / h - 1), -1)[None]
    out = F.grid_sample(image.to(torch.float32)[None], grid, mode="bilinear", padding_mode="border",
                        align_corners=False)[0]
    inside = ((grid >= -1) & (grid < 1)).all(-1)
    colour = torch.tensor(fill, dtype=torch.float32).view(3, 1, 1)
    return torch.where(inside, out, colour).round_().clamp_(0, 255).to(torch.uint8)


def print_fusions(result: dict) -> None:
    print("| prototype | today median ms | prototype median ms | x faster | largest pixel diff / note |")
    print("|---|---|---|---|---|")
    for name, r in result.items():
        diff = (f"max |diff| {r['max_abs_diff']:.0f}; " if "max_abs_diff" in r else
                f"mean |diff| {r['mean_abs_diff']:.2f}; " if "mean_abs_diff" in r else "")
        print(f"| {name} | {r['today_median_ms']:.3f} | {r['proto_median_ms']:.3f} | {r['x_faster']:.2f} "
              f"| {diff}{r['note']} |")


# ---- a loader loop to attach py-spy to -----------------------------------------------------------

def loop(path: str, backend: str, batches: int, recipe: str | None) -> dict:
    from datapipe import make_loader

    kw = {"recipe": recipe} if recipe else {"interpolation": "bicubic"}
    loader = make_loader(path, backend=backend, batch_size=BATCH, image_size=SIZE, num_workers=2, **kw)
    loader.set_epoch(0)
    t, n = time.monotonic(), 0
    for k, batch in enumerate(loader):
        n += len(batch[0])
        if k + 1 == batches:
            break
    return {"images": n, "images_per_s": n / (time.monotonic() - t)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="an image folder (the profile) or an LMDB (--loop)")
    parser.add_argument("--recipe", default="deit")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--plans", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fusions", action="store_true")
    parser.add_argument("--loop", choices=("threads", "dataloader"))
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--plain", action="store_true", help="--loop without the recipe (crop + flip, bicubic)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.loop:
        print(json.dumps(loop(args.data, args.loop, args.batches, None if args.plain else args.recipe)))
        return 0
    recipe = resolve_recipe(args.recipe)
    datas = photos(Path(args.data), args.images)
    result = {"recipe": args.recipe, "torch": torch.__version__, "profile": profile(datas, recipe, args.plans,
                                                                                      args.repeat)}
    print_profile(result["profile"])
    if args.fusions:
        result["fusions"] = fusions(datas[: min(len(datas), 200)], recipe, args.repeat)
        print()
        print_fusions(result["fusions"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
