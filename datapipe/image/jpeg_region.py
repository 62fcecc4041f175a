"""The optional region JPEG decoder, datapipe._jpeg_region, loaded only when it decodes correctly.

It is compiled against the libjpeg headers found at install; at run time the process may bind
another libjpeg (a different version, or one loaded globally by another library). That would fail
or mis-decode every image, so the decoder is probed once at import and, if it is wrong, switched
off with a warning: the train view then decodes whole images (same pixels, slower).
"""
from __future__ import annotations

import logging
from types import ModuleType

import numpy as np
import simplejpeg

log = logging.getLogger(__name__)


def probe(ext: ModuleType) -> str:
    """'' when `ext` decodes a region of a small JPEG to the pixels simplejpeg gives, else why not."""
    rgb = (np.arange(16 * 24 * 3) * 7 % 251).astype(np.uint8).reshape(16, 24, 3)
    data = simplejpeg.encode_jpeg(rgb, quality=90)
    want = simplejpeg.decode_jpeg(data, colorspace="RGB")[3:11, 5:20]
    out = np.zeros(ext.region_buffer_size(15, 8), np.uint8)
    try:
        ext.decode_region(data, 1, 5, 3, 15, 8, out)
    except ValueError as exc:
        return str(exc)
    if not np.array_equal(out[:8 * 15 * 3].reshape(8, 15, 3), want):
        return "its pixels differ from simplejpeg's"
    return ""


def load() -> ModuleType | None:
    """The compiled decoder if it was built and passes the probe, else None."""
    try:
        from .. import _jpeg_region
    except ImportError:  # built without libjpeg headers (setup.py makes it optional)
        return None
    problem = probe(_jpeg_region)
    if problem:
        log.warning("region JPEG decoder switched off (%s): the train view decodes whole images", problem)
        return None
    return _jpeg_region
