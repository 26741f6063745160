"""Hostile input, round thirteen: what the sweeps of outputs, parity, torchrun and the helper scripts
found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import imagenet_classification as ic
from tests.conftest import make_jpeg_set

# --- Outputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [["--max-samples", "4"], ["--trace", "TRACE", "--batch-size", "1"]])
def test_no_output_replaces_a_listed_image_past_the_cut(tmp_path, cut):
    # Only the first --max-samples paths (or --trace's few batches) were read, and only those were
    # checked: --results-file naming the list's 20th image replaced the user's photo with JSON.
    flist = make_jpeg_set(tmp_path, 64, sizes=((32, 24),))  # --trace: 60 batches
    victim = tmp_path / flist.read_text().splitlines()[63]  # the last, in folder order too
    before = victim.read_bytes()
    cut = [str(tmp_path / "t") if word == "TRACE" else word for word in cut]
    for inputs in (["--input-flist", str(flist), "--prefix", f"{tmp_path}/"], ["--data-dir", str(tmp_path / "val")]):
        args = ic._parse_args([*inputs, *cut, "--results-file", str(victim)])
        images = ic._read_images(args)
        assert str(victim) not in images.paths
        with pytest.raises(ic.InputError, match="one of the run's inputs or outputs"):
            ic._check_files(args, images)
    assert victim.read_bytes() == before
    # A name of the list's not its own: no file of that name is listed, so the output is taken.
    args = ic._parse_args(
        ["--input-flist", str(flist), "--prefix", f"{tmp_path}/", *cut, "--results-file", str(tmp_path / "r.json")]
    )
    shutil.copy(victim, tmp_path / "r.json")
    ic._check_files(args, ic._read_images(args))
