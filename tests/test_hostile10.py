"""Hostile input, round ten: what a fresh sweep found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import imagenet_classification as ic
from tests.test_hostile5 import _decoded, _photo_bytes, _timm_crop

# --- JPEGs FFmpeg decodes unlike PIL -------------------------------------------------------------------


def _ycck_jpeg(photo: Image.Image) -> bytes:
    """The photo as Adobe YCCK (transform 2), what Photoshop saves for CMYK: YCbCr of the inverted
    RGB, black 0, inverted as Adobe stores it."""
    inverted = 255 - np.asarray(photo, dtype=np.float64)
    r, g, b = inverted[..., 0], inverted[..., 1], inverted[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    ycck = np.stack([y, cb, cr, np.full(y.shape, 255.0)], -1)
    stored = Image.fromarray(255 - np.clip(np.round(ycck), 0, 255).astype(np.uint8), mode="CMYK")
    buffer = io.BytesIO()
    stored.save(buffer, format="JPEG", quality=95)  # PIL writes Adobe's segment, transform 0
    data = bytearray(buffer.getvalue())
    adobe = data.find(b"Adobe")
    data[adobe + 11] = 2  # its transform byte: YCCK
    return bytes(data)


def test_a_ycck_jpeg_is_decoded_in_its_colours(tmp_path):
    # FFmpeg decoded it 42 levels from PIL on average: top-1 on the demo's 40 photos as YCCK was 27.5 %
    # against timm's 97.5 %, with no warning (--use-nvjpeg hands such a JPEG to the same path).
    photo = Image.open(io.BytesIO(_photo_bytes())).convert("RGB").resize((300, 300))
    path = tmp_path / "ycck.JPEG"
    path.write_bytes(_ycck_jpeg(photo))
    with Image.open(path) as image:
        read_back = np.asarray(image.convert("RGB"), dtype=np.int16)  # a YCCK JPEG: PIL reads the photo back
    assert image.info.get("adobe_transform") == 2 and np.abs(read_back - np.asarray(photo)).mean() < 2
    assert np.abs(_decoded(path, ic.EvalTransform(size=224)) - _timm_crop(path, 224)).mean() < 1.0


@pytest.mark.parametrize("size", [(9, 9), (33, 300), (300, 65), (77, 77)])
def test_a_small_jpeg_with_an_odd_side_is_decoded_as_timm_decodes_it(tmp_path, size):
    # FFmpeg's chroma at an odd edge of a 4:2:0 JPEG, enlarged to 224 pixels, was 1.2 to 2.1 levels
    # from libjpeg's on average (the PIL path: 0).
    photo = Image.open(io.BytesIO(_photo_bytes())).convert("RGB").resize(size, Image.Resampling.LANCZOS)
    path = tmp_path / "small.JPEG"
    photo.save(path, quality=95, subsampling=2)
    assert np.abs(_decoded(path, ic.EvalTransform(size=224)) - _timm_crop(path, 224)).mean() < 0.5


# --- Parity over the images both decoded -----------------------------------------------------------


def test_parity_says_how_many_images_only_one_side_decoded(demo_photos, tmp_path):
    # A cut scan with its end marker put back: FFmpeg refuses it, PIL decodes it. Parity said
    # "on 2 images" of 3 asked, and nothing of the third.
    paths = [demo_photos.parent / line.split()[0] for line in demo_photos.read_text().splitlines()[:2]]
    data = paths[0].read_bytes()
    sos = data.index(b"\xff\xda")
    cut = tmp_path / "cut.JPEG"
    cut.write_bytes(data[: sos + (len(data) - sos) // 2] + b"\xff\xd9")
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    decode = ic.get_decode_func("cpu", model.transform, policy=ic.BadImagePolicy(skip=True))
    items = [(str(paths[0]), 0), (str(cut), 0), (str(paths[1]), 1)]
    parity = ic._measure_parity(items, decode, model, batch_size=2)
    assert (parity.images, parity.loader_only, parity.reference_only) == (2, 0, 1)
    assert parity.summary().endswith("; 1 image only timm's transform decoded, not compared")
    assert "only the loader" not in parity.summary()
