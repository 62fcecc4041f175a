import io

import numpy as np
import pytest
from PIL import Image

from datapipe.image.decode import check_image, decode_rgb, to_rgb
from datapipe.image.headers import BadImageError


@pytest.fixture(scope="module")
def train(imagefolder):
    return imagefolder / "train"


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(decode_rgb(data))


@pytest.mark.parametrize("name", ["cat/cat_000.jpg", "cat/gray.JPEG", "cat/progressive.jpg"])
def test_plain_images_keep_their_original_bytes(train, name):
    raw = (train / name).read_bytes()
    checked = check_image(raw)
    assert checked.data == raw and checked.converted == "" and checked.ext == "jpg"


AWKWARD_ORIGINALS = ["cat/cmyk.jpg", "cat/exif_rotated.jpg", "dog/rgba.png", "dog/palette.png",
                     "fish/palette_alpha.png"]


@pytest.mark.parametrize("name", AWKWARD_ORIGINALS)
def test_awkward_images_keep_their_original_bytes_by_default(train, name):
    """Every backend applies the RGB rule to these when decoding (tests/backends/test_views.py,
    tests/test_transforms.py), so the converter stores them as they are."""
    raw = (train / name).read_bytes()
    checked = check_image(raw)
    assert checked.data == raw and checked.converted == ""


@pytest.mark.parametrize("name", AWKWARD_ORIGINALS + ["dog/gray16.png"])
def test_awkward_images_become_png_of_the_rgb_rule_when_asked(train, name):
    raw = (train / name).read_bytes()
    checked = check_image(raw, awkward="png")
    assert checked.ext == "png" and checked.converted
    stored = Image.open(io.BytesIO(checked.data))
    assert stored.mode == "RGB"
    assert np.array_equal(np.asarray(stored), np.asarray(to_rgb(Image.open(io.BytesIO(raw)))))


def test_images_no_backend_decodes_by_the_rule_still_become_png(train):
    checked = check_image((train / "dog/gray16.png").read_bytes())
    assert checked.ext == "png" and "converted" in checked.converted
    with pytest.raises(ValueError, match="awkward must be one of"):
        check_image((train / "cat/cat_000.jpg").read_bytes(), awkward="jpeg")


@pytest.mark.parametrize("awkward", ["original", "png"])
def test_exif_rotation_is_applied(train, awkward):
    checked = check_image((train / "cat/exif_rotated.jpg").read_bytes(), awkward=awkward)
    assert (checked.width, checked.height) == (60, 80)  # stored 80x60, orientation 6 turns it upright


def test_sixteen_bit_scales_instead_of_clipping(train):
    img = to_rgb(Image.open(train / "dog/gray16.png"))
    assert 0 < np.asarray(img).mean() < 255 and np.asarray(img).max() > 100


def test_png_named_jpeg_is_stored_as_png(train):
    checked = check_image((train / "dog/png_as_jpeg.JPEG").read_bytes())
    assert checked.ext == "png" and checked.converted == ""


@pytest.mark.parametrize("name, reason", [("cat/truncated.jpg", "truncated"), ("dog/empty.jpg", "empty file"),
                                          ("dog/text.jpg", "not an image"), ("fish/bomb.png", "decompression bomb")])
def test_bad_inputs_raise_with_a_reason(train, name, reason):
    with pytest.raises(BadImageError, match=reason):
        check_image((train / name).read_bytes())


@pytest.mark.parametrize("cut", [100, 300])
def test_a_jpeg_cut_inside_its_header_is_a_bad_file(train, cut):
    """Pillow raises OSError('Truncated File Read') while it opens one; that is the file's fault, not
    the disk's (the converter used to stop the whole run on it)."""
    with pytest.raises(BadImageError, match="truncated"):
        check_image((train / "cat/cat_000.jpg").read_bytes()[:cut])


def test_resize_max_reencodes_smaller_jpeg(train):
    checked = check_image((train / "cat/progressive.jpg").read_bytes(), resize_max=40, quality=80)
    assert checked.ext == "jpg" and min(checked.width, checked.height) == 40 and "re-encoded" in checked.converted


def test_resize_max_still_rejects_truncated_files(train):
    with pytest.raises(BadImageError, match="truncated"):
        check_image((train / "cat/truncated.jpg").read_bytes(), resize_max=32)


def test_draft_decode_keeps_at_least_the_requested_size(train):
    img = decode_rgb((train / "cat/progressive.jpg").read_bytes(), min_size=(30, 20))
    assert img.size[0] >= 30 and img.size[1] >= 20 and img.size[0] < 120


@pytest.mark.parametrize("validate", ["decode", "fast"])
@pytest.mark.parametrize("cut", [2, 40, 1000])
def test_both_validations_catch_truncation(train, validate, cut):
    raw = (train / "cat/progressive.jpg").read_bytes()
    with pytest.raises(BadImageError, match="truncated"):
        check_image(raw[:-cut], validate=validate)


def test_fast_validation_keeps_good_files_and_skips_thumbnail_eoi(train):
    from datapipe.image.headers import jpeg_scan_start

    raw = (train / "cat/cat_001.jpg").read_bytes()
    assert check_image(raw, validate="fast").data == raw
    exif = (train / "cat/exif_rotated.jpg").read_bytes()
    assert jpeg_scan_start(exif) > exif.find(b"Exif")  # the walk passes over APP1
    assert check_image(raw + b"trailing junk", validate="fast").data == raw + b"trailing junk"
