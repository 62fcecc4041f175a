"""`datapipe preview`: a few records over a few epochs as the training loop receives them, from each
backend side by side, in one PNG: the "same record, same view in every backend" promise made visible.

Each (backend, epoch) row is the epoch's first batch with batch_size = the number of records, so a
mixed image's partner is the real one training mixes it with. Images are un-normalized uint8
(dtype=torch.uint8); soft targets are captioned with their top-2 classes and weights."""
from __future__ import annotations

import logging
import textwrap
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .augment.recipe import Recipe, resolve_recipe
from .backends import make_loader
from .backends.registry import backend_spec, local_backends, preview_backends
from .checks import shown
from .errors import ExpectedError, counted, first_line
from .mix.sources import Mix

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)
PAD, LABEL_W, LINE_H, CAPTION_LINES = 4, 84, 12, 3  # pixels; caption lines under each tile
EVAL_ONLY = ("crop_pct", "eval_interpolation", "name")  # recipe fields that do not touch a train view


@dataclass(frozen=True)
class PreviewOptions:
    """What `preview` shows: `records` per row (the first batch of each epoch), `epochs` rows per backend.
    `max_bad_fraction`: 1.0 by default, so a folder with bad files still previews; the loader serves
    another record in a bad one's place, as in training, and the preview's notes name the bad files."""

    recipe: Recipe | str = "default"
    records: int = 6
    epochs: int = 3
    backends: tuple[str, ...] = field(default_factory=preview_backends)
    image_size: int = 128
    seed: int = 0
    split: str = "train"
    max_bad_fraction: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "recipe", resolve_recipe(self.recipe))
        if not isinstance(self.backends, (list, tuple)) or not all(isinstance(b, str) for b in self.backends):
            raise ValueError(f"backends must be a tuple of backend names, got {shown(self.backends)}")
        object.__setattr__(self, "backends", tuple(self.backends))
        if not 1 <= self.records <= 64 or not 1 <= self.epochs <= 16:
            raise ValueError(f"records must be within 1..64 and epochs within 1..16 (one picture), got "
                             f"records={self.records}, epochs={self.epochs}")
        allowed = local_backends()
        unknown = [b for b in self.backends if b not in allowed]
        if unknown or not self.backends or len(set(self.backends)) != len(self.backends):
            what = shown(unknown) if unknown else "names"
            raise ValueError(f"backends {shown(self.backends)}: unknown or repeated {what}; choose distinct ones of "
                             f"{','.join(allowed)}")
        if self.image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, got {self.image_size}")


@dataclass
class Row:
    """One backend's first batch of one epoch: uint8 N x 3 x H x W images on the host and their captions."""

    backend: str
    epoch: int
    images: torch.Tensor
    indices: list[int]
    captions: list[list[str]]


@dataclass
class Preview:
    """The rows (epoch-major: every backend's row of epoch 0, then epoch 1, ...), the notes on backends
    skipped or failed and bad records replaced (one line each), and the recipe shown."""

    recipe: Recipe
    options: PreviewOptions
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self, backend: str, epoch: int) -> Row:
        for row in self.rows:
            if row.backend == backend and row.epoch == epoch:
                return row
        raise KeyError(f"no row for backend {backend!r}, epoch {epoch}: shown are "
                       f"{[(r.backend, r.epoch) for r in self.rows]}")

    def header(self) -> str:
        o = self.options
        return (f"datapipe preview - recipe {describe_recipe(self.recipe)}; seed {o.seed}, {o.image_size} px, "
                f"split {o.split}: the first {o.records} records of each epoch, un-normalized uint8, as training "
                "receives them")

    def save(self, path: str | Path) -> Path:
        """Write the grid as a PNG (its folder is created); the path written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        render(self).save(path, format="PNG")
        return path


def describe_recipe(recipe: Recipe) -> str:
    """'deit (auto_augment=rand-m9-mstd0.5-inc1, mixup_alpha=0.8, ...)': the train-view fields that differ
    from Recipe()'s RandomResizedCrop + horizontal flip."""
    base, mine = Recipe().to_dict(), recipe.to_dict()
    changed = [f"{f.name}={mine[f.name]}" for f in fields(Recipe)
               if f.name not in EVAL_ONLY and mine[f.name] != base[f.name]]
    return f"{recipe.name} ({', '.join(changed) or 'RandomResizedCrop + hflip 0.5'})"


def preview(source: Any, options: PreviewOptions | None = None) -> Preview:
    """Each backend's first batch of epochs 0..epochs-1 over `source` (a path make_loader opens)."""
    options = options or PreviewOptions()
    shown = Preview(options.recipe, options)
    by_backend: dict[str, list[Row]] = {}
    bad: dict[str, str] = {}
    for backend in options.backends:
        try:
            spec = backend_spec(backend)
            if not spec.installed():
                shown.notes.append(f"{backend}: skipped, not installed ({spec.install_hint()})")
                continue
            by_backend[backend] = _backend_rows(source, backend, options, bad)
        except Exception as exc:  # one backend failing must not hide the others
            log.debug("preview: backend %s failed", backend, exc_info=True)
            shown.notes.append(f"{backend}: failed, not shown: {first_line(exc)}")
    if not by_backend:
        raise ExpectedError(f"no backend produced a batch: {'; '.join(shown.notes)}")
    if bad:
        listed = ", ".join(f"{path} ({reason})" for path, reason in list(bad.items())[:3])
        shown.notes.append(f"{counted(len(bad), 'bad record')} served as other records, as in training: {listed}"
                           + (" ..." if len(bad) > 3 else ""))
    shown.rows = [rows[epoch] for epoch in range(options.epochs) for rows in by_backend.values()]
    return shown


def _backend_rows(source: Any, backend: str, options: PreviewOptions, bad: dict[str, str]) -> list[Row]:
    """One loader of `backend`; the first batch of each epoch, captioned."""
    mixed = isinstance(source, Mix)  # each tile then names its source
    loader = make_loader(source, split=options.split, backend=backend, recipe=options.recipe, dtype=torch.uint8,
                         image_size=options.image_size, batch_size=options.records, seed=options.seed,
                         num_workers=1, max_bad_fraction=options.max_bad_fraction,
                         fields=("image", "label", "source") if mixed else ("image", "label"))
    classes = list(loader.dataset.classes)
    rows = []
    for epoch in range(options.epochs):
        loader.set_epoch(epoch)
        batches = iter(loader)
        try:
            batch = next(batches)
        finally:
            batches.close()  # the rest of the epoch is not read
        indices = batch.indices.tolist()
        names = [source.names[int(s)] for s in batch.sources] if mixed else None
        rows.append(Row(backend, epoch, batch.images.detach().cpu().contiguous(), indices,
                        captions(batch.labels.detach().cpu(), indices, classes, names)))
    bad.update({b.path: b.reason for b in loader.skipped})
    return rows


def captions(labels: torch.Tensor, indices: list[int], classes: list[str],
             sources: list[str] | None = None) -> list[list[str]]:
    """Per sample: its record index (a mix's: its source's name and the index inside it), then its
    class, or a soft target's top-2 classes with their weights."""
    name = lambda k: classes[k] if 0 <= k < len(classes) else str(k)  # noqa: E731
    out = []
    for i, index in enumerate(indices):
        head = f"#{index}" if sources is None else f"{sources[i]} #{index}"
        if labels.ndim == 1:
            out.append([head, name(int(labels[i]))])
            continue
        weights, top = labels[i].float().topk(min(2, labels.shape[1]))
        out.append([head] + [f"{name(int(k))} {float(w):.2f}" for w, k in zip(weights, top)])
    return out


def grid_layout(preview: Preview) -> tuple[int, int, int, list[str]]:
    """(width, height, top of the first row, header lines) of the picture."""
    columns = max(len(row.indices) for row in preview.rows)
    size = preview.options.image_size
    width = LABEL_W + columns * (size + PAD) + PAD
    header = textwrap.wrap(preview.header(), max(20, (width - 2 * PAD) // int(_font().getlength("m") + 1)))
    top = PAD + len(header) * LINE_H + PAD
    height = top + len(preview.rows) * row_height(size) + PAD
    return width, height, top, header


def row_height(size: int) -> int:
    return size + CAPTION_LINES * LINE_H + PAD


def tile_origin(preview: Preview, row: int, column: int) -> tuple[int, int]:
    """Where tile (row, column) sits in the picture: (left, top)."""
    top = grid_layout(preview)[2]
    return LABEL_W + column * (preview.options.image_size + PAD), top + row * row_height(preview.options.image_size)


def render(preview: Preview) -> "Image.Image":
    """The grid: the header, then per row its (epoch, backend) label and its tiles with their captions."""
    from PIL import Image, ImageDraw

    font = _font()
    width, height, _, header = grid_layout(preview)
    size = preview.options.image_size
    picture = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(picture)
    for k, line in enumerate(header):
        draw.text((PAD, PAD + k * LINE_H), line, fill="black", font=font)
    for r, row in enumerate(preview.rows):
        left, top = tile_origin(preview, r, 0)
        if r and row.epoch != preview.rows[r - 1].epoch:
            draw.line((PAD, top - PAD // 2, width - PAD, top - PAD // 2), fill="gray")
        draw.text((PAD, top), f"epoch {row.epoch}", fill="black", font=font)
        draw.text((PAD, top + LINE_H), row.backend, fill="black", font=font)
        for c, image in enumerate(row.images):
            left, top = tile_origin(preview, r, c)
            picture.paste(Image.fromarray(image.permute(1, 2, 0).contiguous().numpy()), (left, top))
            for k, line in enumerate(row.captions[c][:CAPTION_LINES]):
                draw.text((left, top + size + k * LINE_H), _fit(draw, line, size, font), fill="black", font=font)
    return picture


def _font() -> Any:
    """Pillow's default bitmap font (6 x 11 px): no font files needed."""
    from PIL import ImageFont

    return getattr(ImageFont, "load_default_imagefont", ImageFont.load_default)()


def _fit(draw: Any, text: str, width: int, font: Any) -> str:
    """`text` cut to `width` pixels."""
    while text and draw.textlength(text, font=font) > width:
        text = text[:-1]
    return text
