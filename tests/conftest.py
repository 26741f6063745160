"""Shared fixtures: real JPEG sets written with PIL, the demo photos, a CLI runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

# A few real ImageNet classes: WNID -> class index in imagenet_class.tsv.
CLASSES = {"n01440764": 0, "n02123045": 281, "n03709823": 636, "n07920052": 967}


def label_colour(label: int) -> tuple[int, int, int]:
    """A colour that encodes a class index, so a decoded image tells which label it carries."""
    return (label * 37 % 256, label * 91 % 256, label * 53 % 256)


def write_jpeg(path: Path, size: tuple[int, int], colour: tuple[int, int, int], seed: int = 0, **save) -> Path:
    """A textured JPEG of the given (width, height) whose mean colour is about ``colour``."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    texture = 20 * np.sin(xx / 7.0)[..., None] * np.cos(yy / 5.0)[..., None] + rng.normal(0, 4, (h, w, 1))
    pixels = np.clip(np.array(colour, dtype=float) + texture, 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=save.pop("format", "JPEG"), quality=save.pop("quality", 90), **save)
    return path


def make_jpeg_set(root: Path, count: int, sizes=((500, 375), (375, 500), (320, 240), (260, 300))) -> Path:
    """``count`` JPEGs under ``root/val/<wnid>/``, colour-coded by class; returns the file list."""
    lines = []
    wnids = list(CLASSES)
    for i in range(count):
        wnid = wnids[i % len(wnids)]
        rel = Path("val") / wnid / f"ILSVRC2012_val_{i:08d}_{wnid}.JPEG"
        write_jpeg(root / rel, sizes[i % len(sizes)], label_colour(CLASSES[wnid]), seed=i)
        lines.append(str(rel))
    flist = root / "val.flist"
    flist.write_text("\n".join(lines) + "\n")
    return flist


@pytest.fixture(scope="session")
def jpeg_set(tmp_path_factory) -> Path:
    """A file list of 30 generated JPEGs (prefix: the list's folder)."""
    return make_jpeg_set(tmp_path_factory.mktemp("jpegs"), 30)


@pytest.fixture(scope="session")
def demo_photos(tmp_path_factory) -> Path:
    """The demo set of real photographs (scripts/make_demo_data.py); returns its file list."""
    from make_demo_data import make_demo_data

    return make_demo_data(tmp_path_factory.mktemp("photos"), variants=4)


@pytest.fixture(scope="session")
def lite0_checkpoint(tmp_path_factory) -> Path:
    """Real ImageNet weights for timm's efficientnet_lite0 (scripts/convert_efficientnet_lite0.py)."""
    from convert_efficientnet_lite0 import convert

    return convert(tmp_path_factory.mktemp("weights") / "efficientnet_lite0.pth")


TINY = ["--model", "test_efficientnet", "--no-pretrained", "--device", "cpu", "--num-threads", "2"]


def run_cli(*args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the benchmark as a user would, in a subprocess; output captured as text."""
    return subprocess.run(
        [sys.executable, str(ROOT / "imagenet_classification.py"), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def run_main(capfd, *args) -> subprocess.CompletedProcess:
    """``main(args)`` in this process, for a test about what a run reports (its results and
    summary), not about the process itself (its exit, signals, what the interpreter prints):
    no interpreter start and no imports of torch, timm and SPDL. The exit status (argparse's
    too), stdout and stderr, as :py:func:`run_cli` gives them."""
    from imagenet_classification import main

    argv = [str(a) for a in args]
    try:
        status = main(argv)
    except SystemExit as e:  # argparse
        status = e.code
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)
