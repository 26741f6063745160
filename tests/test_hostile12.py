"""Hostile input, round twelve: what a fresh sweep found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import pytest

import imagenet_classification as ic

# --- Arguments --------------------------------------------------------------------------------------


def test_a_second_sweep_flag_adds_its_settings_and_a_name_twice_is_refused(jpeg_set):
    # argparse kept the last --sweep alone: `--sweep num-threads=1,2 --sweep batch-size=2` swept the
    # batch size at the default 16 threads, and the thread counts asked for were dropped without a word.
    args = ic._parse_args(["--input-flist", str(jpeg_set), "--sweep", "num-threads=1,2", "--sweep", "batch-size=2"])
    assert ic._sweep_grid(args, 40)["num-threads"] == [1, 2] and ic._sweep_grid(args, 40)["batch-size"] == [2]
    args = ic._parse_args(["--input-flist", str(jpeg_set), "--sweep", "num-threads=1", "--sweep", "num-threads=2"])
    with pytest.raises(ic.InputError, match="num-threads is set twice"):
        ic._sweep_grid(args, 40)
