"""Which awkward images does DALI's mixed (nvJPEG / nvImageCodec) decoder get wrong, and how?

    python tools/dali_decode_probe.py [FOLDER] [--json OUT.json]

Each image under FOLDER (default: fixtures/imagefolder's good files) decoded by a bare DALI pipeline
in several ways, each compared with Pillow's RGB conversion (EXIF orientation applied, as DALI does):
`image` and `image_slice` (the loader's decoder, whole-image ROI) on `cpu` and `mixed`, the mixed one
with hw_decoder_load 0 and 0.65; and the same image first transcoded to an RGB PNG on the CPU. Prints
the mean absolute difference in 0..255 levels per variant (an image of another shape: `shape`).
Needs a CUDA GPU and DALI. A diagnostic for a lent GPU session, not a test.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[1]
BAD = {"truncated.jpg", "empty.jpg", "text.jpg", "bomb.png", "notes.txt"}


def reference(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


def as_png(data: bytes) -> bytes:
    out = io.BytesIO()
    Image.fromarray(reference(data)).save(out, format="PNG")
    return out.getvalue()


def decode_all(blobs: list[bytes], device: str, op: str, hw: float) -> list[np.ndarray]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=2, device_id=0 if device == "mixed" else None, exec_pipelined=False, exec_async=False,
                  prefetch_queue_depth=1)
    def pipe():
        data = fn.external_source(name="data", dtype=types.UINT8)
        extra = dict(hw_decoder_load=hw) if device == "mixed" else {}
        if op == "image":
            return fn.decoders.image(data, device=device, output_type=types.RGB, **extra)
        anchor = fn.external_source(name="anchor", dtype=types.FLOAT)
        shape = fn.external_source(name="shape", dtype=types.FLOAT)
        return fn.decoders.image_slice(data, anchor, shape,
                                       device=device, output_type=types.RGB, axis_names="WH",
                                       normalized_anchor=False, normalized_shape=False, **extra)

    p = pipe()
    p.build()
    images = []
    for blob in blobs:
        p.feed_input("data", [np.frombuffer(blob, np.uint8)])
        if op != "image":
            h, w = reference(blob).shape[:2]  # the ROI is given in the upright image's coordinates
            size = np.array([w, h], np.float32)
            p.feed_input("anchor", [np.zeros(2, np.float32)])
            p.feed_input("shape", [size])
        (out,) = p.run()
        out = out.as_cpu() if hasattr(out, "as_cpu") else out
        images.append(np.asarray(out.at(0)))
    return images


def loader_rows(root: Path) -> None:
    """Per record: the dali backend's view against the dataloader backend's (levels, 4x4 low-pass)."""
    import tempfile

    import torch

    sys.path.insert(0, str(ROOT))
    from converters import ConvertOptions, convert
    from datapipe import make_loader
    from datapipe.backends.normalize import IMAGENET_STD

    std = torch.tensor(IMAGENET_STD).view(3, 1, 1) * 255
    packed = Path(tempfile.mkdtemp()) / "probe.lmdb"
    convert(root, packed, ConvertOptions(workers=2, progress=False))
    for train, size in ((False, 64), (False, 128), (True, 128)):
        views = {}
        for backend in ("dali", "dataloader"):
            loader = make_loader(packed, backend=backend, batch_size=5, image_size=size, num_workers=2, train=train,
                                 **({"device": "cpu"} if backend == "dataloader" else {}))
            views[backend] = {i: img.float().cpu() for images, _, indices in loader
                              for i, img in zip(indices.tolist(), images)}
        diffs = {i: torch.nn.functional.avg_pool2d(((views["dali"][i] - img) * std)[None], 4).abs().mean().item()
                 for i, img in views["dataloader"].items()}
        bad = {i: round(d, 1) for i, d in diffs.items() if d >= 3}
        print(f"loader train={train} size={size}: {len(diffs)} records, over 3 levels: {bad}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "fixtures" / "imagefolder" / "train"))
    parser.add_argument("--json")
    parser.add_argument("--loader", action="store_true", help="also: the dali backend against the dataloader "
                        "backend per record, the folder's dataset packed to LMDB")
    args = parser.parse_args()
    files = sorted(p for p in Path(args.folder).rglob("*") if p.is_file() and p.name not in BAD)
    blobs = [p.read_bytes() for p in files]
    refs = [reference(b) for b in blobs]
    pngs = [as_png(b) for b in blobs]
    variants = {"cpu_image": (blobs, "cpu", "image", 0.0), "cpu_slice": (blobs, "cpu", "slice", 0.0),
                "mixed_image_hw0": (blobs, "mixed", "image", 0.0), "mixed_image_hw65": (blobs, "mixed", "image", 0.65),
                "mixed_slice_hw0": (blobs, "mixed", "slice", 0.0), "mixed_slice_hw65": (blobs, "mixed", "slice", 0.65),
                "mixed_slice_png": (pngs, "mixed", "slice", 0.65)}
    rows = {str(f.relative_to(args.folder)): {} for f in files}
    for name, (inputs, device, op, hw) in variants.items():
        try:
            outs = decode_all(inputs, device, op, hw)
        except Exception as exc:  # a variant that cannot run says why, the others still run
            print(f"{name}: {type(exc).__name__}: {str(exc)[-600:]}")
            continue
        for f, ref, out in zip(files, refs, outs):
            key = str(f.relative_to(args.folder))
            rows[key][name] = (round(float(np.abs(out.astype(np.float32) - ref).mean()), 2)
                               if out.shape == ref.shape else f"shape {out.shape} vs {ref.shape}")
    names = list(variants)
    print("file".ljust(36) + "".join(n.rjust(18) for n in names))
    for key, row in rows.items():
        print(key[:36].ljust(36) + "".join(str(row.get(n, "-")).rjust(18) for n in names))
    if args.loader:
        loader_rows(Path(args.folder).parent)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
