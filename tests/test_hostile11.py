"""Hostile input, round eleven: what a fresh sweep found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import json

import imagenet_classification as ic
from tests.conftest import CLASSES, TINY, label_colour, run_main, write_jpeg

# --- What the CPU path decodes with PIL, counted ---------------------------------------------------------


def test_the_images_pil_decodes_on_the_cpu_path_are_counted_and_said(tmp_path, capfd):
    # A folder of BMPs (or CMYK JPEGs, or animated PNGs) is decoded by PIL, not FFmpeg: the run's
    # FPS was PIL's, and nothing said so (decoder_backends was empty on the CPU path).
    wnid = "n01440764"
    lines = []
    for i in range(6):
        kind = "BMP" if i % 3 == 0 else "JPEG"
        path = tmp_path / wnid / f"img{i}.{kind.lower()}"
        lines.append(str(write_jpeg(path, (100 + 2 * i, 120), label_colour(CLASSES[wnid]), format=kind)))
    batch = ic.get_decode_func("cpu", ic.EvalTransform(size=32))([(p, 0) for p in lines])
    assert batch.decoded_by == {"ffmpeg": 4, "pil": 2}
    flist = tmp_path / "list.txt"
    flist.write_text("\n".join(lines) + "\n")
    results = tmp_path / "r.json"
    run = run_main(capfd, "--input-flist", flist, *TINY, "-b", "3", "--warmup-batches", "0", "--results-file", results)
    assert run.returncode == 0, run.stderr
    assert json.loads(results.read_text())["decoder_backends"] == {"ffmpeg": 4, "pil": 2}
    assert "2 images (33.3%) decoded by PIL, not FFmpeg" in run.stdout
    assert "decoded on the GPU" not in run.stdout


def test_a_run_that_pil_never_decodes_says_nothing_of_pil(jpeg_set, capfd):
    run = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "-b", "10",
                   "--warmup-batches", "0", "--img-size", "32")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "decoded by PIL" not in run.stdout and "decoded on the GPU" not in run.stdout
