"""Hostile input, round eighteen (2026-12-07). Each test fails on the code before it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT, write_jpeg


def test_a_bad_images_record_holds_none_of_its_batchs_images(tmp_path: Path):
    # Each skipped image was kept with its traceback, whose frames held the decoded images of its
    # batch: all kept until the run's end (a list with a bad image in each batch of 32 held 160 MB
    # more), and in a notebook, nanobind's "leaked" lines at exit despite README's `del batch`.
    good = write_jpeg(tmp_path / "good.JPEG", (320, 240), (200, 40, 40))
    (tmp_path / "bad.JPEG").write_bytes(b"not a JPEG")
    script = f"""
        import imagenet_classification as ic
        decode = ic.get_decode_func("cpu", ic.EvalTransform(), policy=ic.BadImagePolicy(skip=True))
        batch = decode([({str(good)!r}, 1), ({str(tmp_path / "bad.JPEG")!r}, 2), ({str(good)!r}, 3)])
        failures = batch.failures
        del batch
        print(len(failures), failures[0].path.endswith("bad.JPEG"), failures[0].__traceback__)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "True", "None"]
    assert "leaked" not in proc.stderr, proc.stderr
