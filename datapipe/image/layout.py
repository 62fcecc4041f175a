"""An encoded image's layout (stored size and EXIF orientation) and upright size, what its view is
planned from. The pure-Python header reader (datapipe.image.headers) answers for JPEGs and PNGs; Pillow and
simplejpeg are imported only where it is unsure, inside the functions, so DALI's source workers, which
compute views and decode nothing, do not load them for ordinary files.
"""
from __future__ import annotations

from .headers import Layout, header_layout
from .orientation import upright_size


def jpeg_layout(data: bytes) -> Layout | None:
    """(stored width, stored height, EXIF orientation) when libjpeg-turbo may decode `data` straight
    to the RGB rule (a YCbCr or grayscale JPEG within Pillow's pixel limit; the orientation is
    applied to the decoded pixels). Else None: Pillow decodes it. Pillow is opened only when an EXIF
    segment exists."""
    if not data.startswith(b"\xff\xd8\xff"):
        return None
    import simplejpeg
    from PIL import Image

    from .decode import exif_orientation, open_image
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray") or width * height > Image.MAX_IMAGE_PIXELS:
        return None
    orientation = exif_orientation(open_image(data)) if b"Exif\x00\x00" in data[:65536] else 1
    return width, height, orientation


def image_dims(data: bytes) -> tuple[int, int]:
    """(width, height) of an image as the RGB rule decodes it (EXIF rotation applied), from its
    header alone: the header reader's answer, else libjpeg's and Pillow's (the same, where both answer)."""
    layout = header_layout(data) or jpeg_layout(data)
    if layout:
        return upright_size(*layout)
    from .decode import open_image, upright_image_size
    return upright_image_size(open_image(data))
