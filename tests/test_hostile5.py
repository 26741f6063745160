"""Hostile input, round five: what a fresh sweep found (2026-12-05). Each test fails on the code before it.

The worst (a batch whose images all failed taken as a warm-up batch: FPS some 100 times too low) is
pinned in tests/test_numbers.py, beside the other tests of the FPS window.
"""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
import pytest
import timm.data
import torch
from PIL import Image

import imagenet_classification as ic
from tests.conftest import write_jpeg


def _timm_crop(path, size: int) -> np.ndarray:
    """timm's evaluation transform up to the crop (PIL's resize, then CenterCrop), as int16."""
    transform = timm.data.create_transform(input_size=(3, size, size), crop_pct=0.875, interpolation="bicubic")
    resize, crop = transform.transforms[:2]
    with Image.open(path) as image:
        return np.asarray(crop(resize(image.convert("RGB"))), dtype=np.int16)


def _decoded(path, transform: ic.EvalTransform) -> np.ndarray:
    decode = ic.get_decode_func("cpu", transform)
    images, _ = decode([(str(path), 0)])
    return images[0].permute(1, 2, 0).numpy().astype(np.int16)


# --- Labels that are no class index --------------------------------------------------------------


def test_labels_that_are_no_class_index_are_refused_by_name(tmp_path):
    # Each would have been a silent miss (5000), or a failure mid-run naming nothing (a WordNet ID).
    for labels, words in (
        ((5000,), "a.JPEG: label 5000 is no class index (0-999)"),
        (("n01440764",), "a.JPEG: label 'n01440764' is no class index"),
        ((True,), "label True is no class index"),
        ((1, 2), "1 paths, 2 labels"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            ic.ImageList(("a.JPEG",), labels)
    flist = tmp_path / "l.flist"
    flist.write_text("x/a.JPEG\n")
    with pytest.raises(ValueError, match=r"l.flist: x/a.JPEG: label 5000 is no class index"):
        ic.read_file_list(flist, labels={"a": 5000})  # a plain dict, as the README allows
    assert ic.read_file_list(flist, labels={"a": np.int64(7)}).labels == (7,)


def test_a_decode_items_label_that_is_no_whole_number_is_refused_not_cut(tmp_path):
    path = write_jpeg(tmp_path / "a.JPEG", (64, 48), (200, 30, 30))
    decode = ic.get_decode_func("cpu", ic.EvalTransform(size=32))
    assert decode([(str(path), 7)])[1].tolist() == [[7]]
    for label in (1.7, "n01440764"):  # 1.7 was cut to 1
        with pytest.raises(ValueError, match="expected whole numbers, class indices"):
            decode([(str(path), label)])


# --- measure_loader, the public loader-alone rate ---------------------------------------------------


def test_measure_loader_takes_a_device_name_warns_of_an_included_warmup_and_keeps_failures_in_a_list():
    batches = [(torch.zeros((2, 3, 8, 8), dtype=torch.uint8), torch.zeros((2, 1), dtype=torch.int64))] * 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ic.measure_loader(iter(batches), "cpu", warmup_batches=50) > 0  # "cpu": an AttributeError
    assert [w.category for w in caught] == [ic.WarmupIncluded], caught  # its rate included the warm-up, unsaid
    with pytest.raises(TypeError, match="failures=\\(\\): expected a list"):  # += on a tuple kept none
        ic.measure_loader(iter(batches), "cpu", 0, failures=())


# --- Pixels as timm's transform has them -----------------------------------------------------------


def test_a_32_bit_greyscale_tiff_is_converted_as_pil_converts_it_not_black(tmp_path):
    # Mode I with values 0-255: scaled as if 16-bit, it was black (a mean difference of 126 levels).
    grey = (np.arange(64 * 48).reshape(48, 64) % 200 + 20).astype(np.int32)
    path = tmp_path / "grey.tiff"
    Image.fromarray(grey).save(path)
    with Image.open(path) as image:
        assert image.mode == "I"
    ours = _decoded(path, ic.EvalTransform(size=32))
    assert np.abs(ours - _timm_crop(path, 32)).mean() < 1.0


@pytest.mark.parametrize(("size", "fmt"), [((2, 2), "JPEG"), ((2, 2), "PNG"), ((4, 4), "JPEG"), ((4, 4), "PNG"),
                                           ((17, 1), "JPEG")])  # fmt: skip
def test_an_image_with_a_side_under_8_pixels_is_resized_as_timm_resizes_it(tmp_path, size, fmt):
    # swscale resized these 3 to 20 levels away from PIL on average (from 8 x 8 on: under 2, on a photo).
    photo = Image.open(io.BytesIO(_photo_bytes())).convert("RGB").resize(size, Image.Resampling.LANCZOS)
    path = tmp_path / f"tiny.{fmt.lower()}"
    photo.save(path, format=fmt)
    ours = _decoded(path, ic.EvalTransform(size=32))
    assert np.abs(ours - _timm_crop(path, 32)).mean() < 1.0


def _photo_bytes() -> bytes:
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.astronaut()).save(buffer, format="PNG")
    return buffer.getvalue()
