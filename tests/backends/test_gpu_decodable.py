"""What the DALI source sends a GPU (mixed) decoder: PNGs with transparency as an RGB PNG of the same
pixels (nvImageCodec decodes them to white: found on an H100, docs/gpu.md), everything else as stored."""
import numpy as np
import pytest

from datapipe.backends.dali.source import gpu_decodable
from datapipe.image.decode import decode_rgb
from datapipe.image.headers import png_has_transparency
from tests.conftest import IMAGEFOLDER

AWKWARD = ["train/fish/palette_alpha.png", "train/dog/palette.png", "train/dog/rgba.png", "train/dog/gray16.png",
           "train/cat/cmyk.jpg", "train/cat/exif_rotated.jpg", "train/cat/progressive.jpg"]


def test_only_pngs_with_a_trns_chunk_are_found():
    found = {name for name in AWKWARD if png_has_transparency((IMAGEFOLDER / name).read_bytes())}
    assert found == {"train/fish/palette_alpha.png"}
    assert not png_has_transparency(b"\x89PNG\r\n\x1a\n\x00\x00")  # cut short: no chunk, no error


@pytest.mark.parametrize("name", AWKWARD)
def test_the_gpu_gets_the_same_pixels_and_only_transparent_pngs_are_transcoded(name):
    data = (IMAGEFOLDER / name).read_bytes()
    sent = gpu_decodable(data)
    assert (sent is data) == (name != "train/fish/palette_alpha.png")
    assert np.array_equal(np.asarray(decode_rgb(sent)), np.asarray(decode_rgb(data)))
    assert not png_has_transparency(sent)
