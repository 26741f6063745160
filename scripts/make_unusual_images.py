"""Write images that are unusual but valid, each in a ``.JPEG`` file as ImageNet names them.

Every decoder must decode each of them to what PIL gives (or fall back to FFmpeg for it):
greyscale, CMYK, progressive and 4:4:4 JPEGs, PNG data, an 8000 x 6000 and an 8 x 8 image, a
JPEG with a second image after its end (as in an MPO file or a phone photo carrying an HDR
gain map), one with a camera's trailer after its end, and an animated GIF (its first frame).
Used by the bad-input tests and by the GPU check (``bench/gpu_check.py``).

Usage::

    python scripts/make_unusual_images.py FOLDER    # writes FOLDER/*.JPEG
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from cli_checks import out_folder, run
from PIL import Image


def make_unusual_images(folder: Path, seed: int = 1) -> list[Path]:
    """Write the images into ``folder`` (made if need be); return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = np.clip(np.random.default_rng(seed).normal(128, 40, (375, 500, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    saves = {
        "gray.JPEG": lambda p: image.convert("L").save(p),
        "cmyk.JPEG": lambda p: image.convert("CMYK").save(p),
        "progressive.JPEG": lambda p: image.save(p, progressive=True),
        "chroma-444.JPEG": lambda p: image.save(p, subsampling=0, quality=95),
        "png-data.JPEG": lambda p: image.save(p, format="PNG"),
        "huge.JPEG": lambda p: image.resize((8000, 6000)).save(p, quality=70),
        "tiny.JPEG": lambda p: image.resize((8, 8)).save(p),
        "animated-gif.JPEG": lambda p: image.save(p, format="GIF", save_all=True, append_images=[image.rotate(90)]),
    }
    paths = []
    for name, save in saves.items():
        save(folder / name)
        paths.append(folder / name)
    primary = io.BytesIO()
    image.save(primary, format="JPEG")
    after_the_end = {
        "two-images.JPEG": (folder / "tiny.JPEG").read_bytes(),  # a second image
        "trailer.JPEG": b"SEFH" + bytes(4000),  # a camera's trailer, kilobytes without an end marker
    }
    for name, extra in after_the_end.items():
        (folder / name).write_bytes(primary.getvalue() + extra)
        paths.append(folder / name)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    folder = out_folder(parser, "folder", parser.parse_args().folder)
    for path in make_unusual_images(folder):
        print(path)


if __name__ == "__main__":
    run(main)
