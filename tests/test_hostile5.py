"""Hostile input, round five: what a fresh sweep found (2026-12-05). Each test fails on the code before it.

The worst (a batch whose images all failed taken as a warm-up batch: FPS some 100 times too low) is
pinned in tests/test_numbers.py, beside the other tests of the FPS window.
"""

from __future__ import annotations

import io
import os
import pty
import re
import sys
import threading
import time
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for warmup in (0, 1):  # none asked for, or one of three batches: the window leaves it out, nothing to say
            assert ic.measure_loader(iter(batches), "cpu", warmup_batches=warmup) > 0
    assert caught == []
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


# --- A notebook's arguments of the wrong kind ---------------------------------------------------


def test_a_notebooks_arguments_of_the_wrong_kind_are_named_where_they_are_given(tmp_path):
    # Each failed later, or deep in a library, naming no argument; or was taken (2.0 threads, rank=True).
    from tests.test_numbers import _batch, _bundle

    flist = tmp_path / "l.flist"
    flist.write_text("n01440764/a.JPEG\n")
    images, _ = _batch([1, 2])
    decode = ic.get_decode_func("cpu")
    cases = [
        (TypeError, "prefix=PosixPath(", lambda: ic.read_file_list(flist, prefix=tmp_path)),
        (TypeError, "expected a path, got 5", lambda: ic.parse_wnid(5)),
        (
            ValueError,
            "batch_size=2.5: expected at least 1, a whole number",
            lambda: ic.get_pipeline([], 2.5, decode, 1, 1, 1),
        ),
        (ValueError, "batch_size='4'", lambda: ic.get_pipeline([], "4", decode, 1, 1, 1)),
        (ValueError, "concurrency=1.5", lambda: ic.get_pipeline([], 4, decode, 1.5, 1, 1)),
        (ValueError, "num_threads=2.0", lambda: ic.get_pipeline([], 4, decode, 1, 1, 2.0)),
        (ValueError, "decode_processes=-1", lambda: ic.get_pipeline([], 4, decode, 1, 1, 1, decode_processes=-1)),
        (
            TypeError,
            "transform={'size': 64}: expected an EvalTransform",
            lambda: ic.get_decode_func("cpu", {"size": 64}),
        ),
        (TypeError, "policy='skip'", lambda: ic.get_decode_func("cpu", policy="skip")),
        (TypeError, "policy=False", lambda: ic.get_decode_func("cpu", policy=False)),  # acted as skip
        (TypeError, "policy='skip'", lambda: ic.benchmark([], _bundle(), policy="skip")),
        (ValueError, "loader_lead=-1", lambda: ic.benchmark([], _bundle(), loader_lead=-1)),
        (TypeError, "labels=[1, 2]: expected a tensor", lambda: ic.benchmark([(images, [1, 2])], _bundle())),
        (TypeError, "model_name=5", lambda: ic.get_model(5)),
        (TypeError, "checkpoint=3", lambda: ic.get_model("test_efficientnet", pretrained=False, checkpoint=3)),
        (ValueError, "dtype=torch.int64: expected a floating-point", lambda: ic.get_model(dtype=torch.int64)),
        (ValueError, "rank=True of world_size=2", lambda: list(ic.source(flist, rank=True, world_size=2))),
        (ValueError, "world_size=2.5", lambda: list(ic.source(flist, world_size=2.5))),
        (TypeError, "labels=[0]: expected labels by image name", lambda: ic.read_file_list(flist, labels=[0])),
        (TypeError, "labels=[0]: expected labels by image name", lambda: ic.scan_folder(tmp_path, labels=[0])),
        (TypeError, "model='resnet18': expected a ModelBundle", lambda: ic.benchmark([], "resnet18")),
        (TypeError, "decode_func=None: expected a function", lambda: ic.get_pipeline([], 4, None, 1, 1, 1)),
        # The 0-255 scale's mean classified noise; two values failed mid-run as the model's failure.
        (
            ValueError,
            "its mean (123.7, 116.3, 103.5) is not 3 numbers from 0 to 1",
            lambda: ic.Preprocessing((123.7, 116.3, 103.5), (0.229, 0.224, 0.225)),
        ),
        (ValueError, "its std (0.2, 0.2) is not 3 numbers", lambda: ic.Preprocessing((0.5, 0.5, 0.5), (0.2, 0.2))),
    ]
    if not torch.cuda.is_available():  # SPDL's multi-line "Failed to import libspdl_cuda", or torch's
        cases.append((ic.InputError, "cuda: CUDA is not available", lambda: ic.get_decode_func("cuda")))
    for error, words, call in cases:
        with pytest.raises(error, match=re.escape(words)):
            call()
    assert ic.parse_wnid(tmp_path / "n01440764" / "a.JPEG") == "n01440764"  # a Path is a path


# --- A list from a FIFO or a terminal ------------------------------------------------------------


def test_a_fifo_no_program_writes_to_is_an_error_in_time_and_one_written_to_is_read(tmp_path, monkeypatch):
    # open() waited forever for a writer (--timeout did not apply).
    monkeypatch.setattr(ic, "_FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "list"
    os.mkfifo(fifo)
    with pytest.raises(
        ic.InputError, match=re.escape(f"{fifo}: a FIFO that no program opened to write to within 0.3 s")
    ):
        ic.read_file_list(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("n01440764/a.JPEG\nn01443537/b.JPEG\n"))
    writer.start()
    assert ic.read_file_list(fifo).labels == (0, 1)
    writer.join()


def test_a_list_from_standard_input_that_is_a_terminal_is_refused_not_waited_for(monkeypatch):
    main, terminal = pty.openpty()
    with open(terminal) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(ic.InputError, match="<stdin>: is a terminal; pipe the list in"):
            ic.read_file_list("-")
    os.close(main)


# --- Windows that must hold the same batches (the numbers sweep) -----------------------------------


def test_reading_alones_bytes_are_those_of_the_batches_its_window_times():
    # A batch that read no file is no warm-up batch: the bytes were summed from a warm-up batch on
    # (1.5 MB an image here, for files of 1 MB).
    def batches():
        for batch in [(0, 0)] + [(4, 4_000_000)] * 4:
            time.sleep(0.01)
            yield (*batch, time.perf_counter())

    fps, mb_s = ic._measure_reads(batches(), warmup_batches=2)
    assert mb_s / fps == pytest.approx(1.0)


def test_a_stopped_jobs_fps_never_mixes_one_ranks_warmup_with_anothers_window():
    # Rank 1 stopped inside its warm-up (its 2 images timed from the start), rank 0 timed 7 after its
    # own: 9 images over rank 0's window was 29 % high, and the summary said the warm-up was included.
    cpu = torch.device("cpu")
    past = ic.RunResult(9, classified=9, frames_timed=7, elapsed_s=0.025, batches=6, batches_timed=5)
    within = ic.RunResult(8, classified=2, failed=1, frames_timed=2, elapsed_s=0.015, batches=1, batches_timed=1,
                          warmup_included=True, partial=True)  # fmt: skip
    shares = [ic._rank_share(past, 0, cpu), ic._rank_share(within, 1, cpu)]
    job = ic._job_total(shares, 17, past)
    assert (job.frames_timed, job.elapsed_s, job.batches_timed, job.warmup_included) == (7, 0.025, 5, False)
    assert (job.classified, job.failed, job.not_reached, job.batches) == (11, 1, 5, 7)  # every count summed
    both_within = ic._job_total([shares[1], shares[1]], 16, within)
    assert (both_within.frames_timed, both_within.elapsed_s, both_within.warmup_included) == (4, 0.015, True)


def test_the_model_alone_runs_as_many_batches_as_ran_the_model(tmp_path, capfd, monkeypatch):
    # 4 files that fail, then 16 images in batches of 4: 4 batches ran the model, all within a warm-up of
    # 4. Given 5, the model alone timed a batch past its warm-up against an end-to-end rate that held it.
    from tests.conftest import TINY, make_jpeg_set, run_main

    flist = make_jpeg_set(tmp_path / "data", 16)
    empty = [f"val/n01440764/empty{i}.JPEG" for i in range(4)]
    for name in empty:
        (flist.parent / name).write_bytes(b"")
    flist.write_text("".join(f"{name}\n" for name in empty) + flist.read_text())
    calls = []
    measure = ic._measure_model
    monkeypatch.setattr(ic, "_measure_model", lambda *args: calls.append(args[2]) or measure(*args))
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{flist.parent}/", *TINY, "--no-compile",
                    "--skip-bad", "-b", "4", "-j", "1", "--warmup-batches", "4", "--breakdown")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert calls == [4], calls
    assert "WARNING: the batches that ran the model were not more than the warm-up: FPS includes it" in proc.stdout


def test_under_torchrun_a_list_from_a_fifo_is_refused_as_stdin_is(tmp_path, capfd, monkeypatch):
    # Each rank would read the one stream: one rank got the list, the others an empty one or a part.
    from tests.conftest import TINY, run_main

    fifo = tmp_path / "list"
    os.mkfifo(fifo)
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", "29999")
    proc = run_main(capfd, "--input-flist", fifo, *TINY, "--no-compile")
    assert proc.returncode == 2, proc.stderr
    assert f"error: --input-flist {fifo}: under torchrun every rank would read this stream; give a file" in proc.stderr
