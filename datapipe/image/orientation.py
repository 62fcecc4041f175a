"""EXIF orientation on decoded pixels, as PIL's `ImageOps.exif_transpose` applies it.

A stored (unrotated) JPEG keeps its original bytes; the decoder applies the orientation to what it
decoded. Only a crop is decoded on the train path, so a box in the upright image is mapped back to
the stored image (`stored_box`), decoded, then turned upright (`orient`): orient(S)[box] ==
orient(S[stored_box(box)]) for every orientation (tested).
"""
from __future__ import annotations

import numpy as np

ROTATING = (5, 6, 7, 8)  # EXIF orientations that swap width and height
Box = tuple[int, int, int, int]  # left, top, right, bottom (right and bottom exclusive)


def upright_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) of a width x height stored image once turned upright."""
    return (height, width) if orientation in ROTATING else (width, height)


def orient(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """HWC pixels of the stored image turned upright (a view; PIL's transpose for each tag)."""
    if orientation == 2:
        return pixels[:, ::-1]
    if orientation == 3:
        return pixels[::-1, ::-1]
    if orientation == 4:
        return pixels[::-1]
    if orientation == 5:
        return pixels.transpose(1, 0, 2)
    if orientation == 6:
        return np.rot90(pixels, -1)
    if orientation == 7:
        return pixels[::-1, ::-1].transpose(1, 0, 2)
    if orientation == 8:
        return np.rot90(pixels, 1)
    return pixels


def stored_box(box: Box, orientation: int, width: int, height: int) -> Box:
    """The box of the width x height stored image that `orient` turns into `box` of the upright one."""
    left, top, right, bottom = box
    w, h = width, height
    return {
        2: (w - right, top, w - left, bottom),
        3: (w - right, h - bottom, w - left, h - top),
        4: (left, h - bottom, right, h - top),
        5: (top, left, bottom, right),
        6: (top, h - right, bottom, h - left),
        7: (w - bottom, h - right, w - top, h - left),
        8: (w - bottom, left, w - top, right),
    }.get(orientation, box)
