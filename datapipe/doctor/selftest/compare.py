"""The self-test's verdicts, apart from the GPU work that feeds them: comparisons with their stated
tolerances, the overlap of copy and compute intervals, the copy-bandwidth reading. All run on CPU."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ...backends.normalize import IMAGENET_STD
from .report import Result

# DALI's resampling filter differs from Pillow's in high frequencies only; after a 4x4 low-pass the
# eval views of the same record differ by at most ~2 levels of 255 (measured, tests/backends/test_views.py),
# while a mirrored, shifted or wrongly coloured view, or a corrupted decode, is far above 3.
DECODE_TOLERANCE = 3.0
SUM_RTOL = 1e-6  # the same images summed twice in float64 on one device: equal but for summation order

Views = Mapping[int, tuple[torch.Tensor, int]]  # record index -> (normalized CHW image, label)


def view_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute difference of two normalized CHW images in 0..255 levels, after a 4x4 low-pass."""
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32).view(3, 1, 1) * 255
    diff = (a.detach().float().cpu() - b.detach().float().cpu()) * std
    return torch.nn.functional.avg_pool2d(diff[None], 4).abs().mean().item()


def _coverage(check: str, got: Views, expected: Views) -> Result | None:
    """A failure when the two sides served different records or labels, else None."""
    if got.keys() != expected.keys():
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        return Result(check, "fail", f"{len(got)} records vs {len(expected)}",
                      f"records missing {missing[:8]}, unexpected {extra[:8]}")
    wrong = [i for i in got if int(got[i][1]) != int(expected[i][1])]
    if wrong:
        return Result(check, "fail", f"{len(wrong)} of {len(got)} labels differ", f"records {wrong[:8]}")
    if not got:
        return Result(check, "fail", "no records", "the loaders served nothing: is the dataset empty?")
    return None


def compare_views(check: str, got: Views, expected: Views, *, tolerance: float = DECODE_TOLERANCE) -> Result:
    """A GPU decode (`got`) against the CPU decode of the same records: every record, its label, and
    its pixels within `tolerance` levels of 255 (view_difference)."""
    bad = _coverage(check, got, expected)
    if bad is not None:
        return bad
    diffs = {i: view_difference(got[i][0], expected[i][0]) for i in got}
    worst = max(diffs, key=diffs.get)
    over = sorted(i for i, d in diffs.items() if d > tolerance)
    values = {"records": len(diffs), "worst": round(diffs[worst], 3), "worst_record": worst, "tolerance": tolerance,
              "over_tolerance": over}
    figure = f"{len(diffs)} records, worst {diffs[worst]:.2f} levels (tolerance {tolerance:g})"
    if over:
        return Result(check, "fail", figure, f"records {over[:8]} differ from the CPU decode beyond the tolerance: "
                                             "a wrong or corrupted GPU decode", values)
    return Result(check, "pass", figure, values=values)


def compare_exact(check: str, got: Views, expected: Views) -> Result:
    """Two paths that must agree bit for bit (the same normalize on the same device)."""
    bad = _coverage(check, got, expected)
    if bad is not None:
        return bad
    unequal = sorted(i for i in got if not torch.equal(got[i][0].cpu(), expected[i][0].cpu()))
    figure = f"{len(got) - len(unequal)} of {len(got)} records identical"
    if unequal:
        return Result(check, "fail", figure, f"records {unequal[:8]} differ from the dataloader backend's",
                      {"records": len(got), "unequal": unequal})
    return Result(check, "pass", figure, values={"records": len(got)})


def compare_sums(check: str, late: Sequence[float], eager: Sequence[float], *, rtol: float = SUM_RTOL) -> Result:
    """Checksums of batches read late (after their references were dropped and later batches
    decoded) against the same batches read at once: equal unless their memory was reused meanwhile."""
    if len(late) != len(eager) or not eager:
        return Result(check, "fail", f"{len(late)} batches vs {len(eager)}", "the two passes served different batches")
    changed = [k for k, (a, b) in enumerate(zip(late, eager)) if abs(a - b) > rtol * max(abs(b), 1.0)]
    figure = f"{len(eager) - len(changed)} of {len(eager)} batches intact"
    if changed:
        return Result(check, "fail", figure, f"batches {changed[:8]} changed while the step still read them: "
                                             "their memory was reused too early", {"changed": changed})
    return Result(check, "pass", figure, values={"batches": len(eager)})


def overlaps(copies: Sequence[tuple[float, float]], steps: Sequence[tuple[float, float]]) -> int:
    """How many copy intervals (start, end) intersect some step interval: copies that ran while the
    model's work ran on the other stream."""
    return sum(any(c0 < s1 and c1 > s0 for s0, s1 in steps) for c0, c1 in copies)


def overlap_result(check: str, copies: Sequence[tuple[float, float]], steps: Sequence[tuple[float, float]]) -> Result:
    """The prefetcher's copies against the steps (CUDA event times, ms). The first copy precedes
    every step, so it is left out. Pass: at least half the others overlapped a step."""
    later = list(copies[1:])
    if not later or not steps:
        return Result(check, "skip", "too few batches", "the dataset gave fewer than 3 batches")
    hit = overlaps(later, steps)
    copy_ms = sum(c1 - c0 for c0, c1 in later) / len(later)
    step_ms = sum(s1 - s0 for s0, s1 in steps) / len(steps)
    figure = f"{hit} of {len(later)} copies overlapped a step (copy {copy_ms:.2f} ms, step {step_ms:.1f} ms)"
    values = {"overlapped": hit, "copies": len(later), "copy_ms": round(copy_ms, 3), "step_ms": round(step_ms, 2)}
    if hit == 0:
        return Result(check, "fail", figure, "every copy waited for the step: the side stream is not overlapping", values)
    if 2 * hit < len(later):
        return Result(check, "warn", figure, "fewer than half overlapped: the host may be too slow to run ahead", values)
    return Result(check, "pass", figure, values=values)


def bandwidth_result(check: str, pinned_gbs: float, pageable_gbs: float, *, intact: bool) -> Result:
    """Pinned against pageable host-to-device copies. Wrong bytes fail; pinned no faster than
    pageable is a warning (pinned memory is what the loaders use for asynchronous copies)."""
    ratio = pinned_gbs / pageable_gbs if pageable_gbs > 0 else float("inf")
    figure = f"pinned {pinned_gbs:.1f} GB/s, pageable {pageable_gbs:.1f} GB/s ({ratio:.1f}x)"
    values = {"pinned_gb_s": round(pinned_gbs, 2), "pageable_gb_s": round(pageable_gbs, 2), "ratio": round(ratio, 2)}
    if not intact:
        return Result(check, "fail", figure, "the copied bytes differ from the host's", values)
    if ratio < 1:
        return Result(check, "warn", figure, "pinned copies are not faster: check the PCIe link "
                                             "(nvidia-smi -q: 'Link Width') and the memlock limit", values)
    return Result(check, "pass", figure, values=values)
