"""Build a small ImageNet-style folder of real photographs, with its file list.

The photos are the ones scikit-image bundles, each with an obvious ImageNet class. Each is
cropped and resized to ImageNet-like sizes (about 500 x 375, both orientations) and saved as
a JPEG under ``val/<wnid>/``, so the class comes from the folder name as in ImageNet.

Usage::

    python scripts/make_demo_data.py demo/          # writes demo/val/... and demo/val.flist
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from cli_checks import out_folder, run, whole
from PIL import Image

# scikit-image photo -> the ImageNet class it shows (WordNet ID).
PHOTOS = {
    "chelsea.png": "n02123045",  # tabby cat
    "coffee.png": "n07920052",  # espresso
    "camera.png": "n04485082",  # tripod (the cameraman's camera stands on one; greyscale photo)
    "rocket.jpg": "n03773504",  # missile
    "motorcycle_left.png": "n03785016",  # moped
}


def photo_path(name: str) -> Path:
    """Path of a photo in scikit-image's bundled data folder."""
    import skimage

    return Path(skimage.__file__).parent / "data" / name


def _variant(image: Image.Image, rng: random.Random) -> Image.Image:
    """A random crop of 70-100 % of the area, maybe mirrored, resized to an ImageNet-like size."""
    w, h = image.size
    scale = rng.uniform(0.7, 1.0) ** 0.5
    cw, ch = int(w * scale), int(h * scale)
    left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
    crop = image.crop((left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    long_side = rng.choice([400, 500, 500, 640])
    ratio = long_side / max(cw, ch)
    return crop.resize((max(1, round(cw * ratio)), max(1, round(ch * ratio))), Image.Resampling.BICUBIC)


def make_demo_data(root: Path, variants: int = 8, seed: int = 0) -> Path:
    """Write ``root/val/<wnid>/<wnid>_<photo>_<k>.JPEG`` and ``root/val.flist``; return the list's path.

    The first variant of each photo is the whole photo, resized; the others are random crops.
    """
    rng = random.Random(seed)
    lines = []
    for name, wnid in PHOTOS.items():
        image = Image.open(photo_path(name))
        image = image.convert("L" if image.mode in ("L", "I;16") else "RGB")
        folder = root / "val" / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(variants):
            out = image.resize((500, round(500 * image.height / image.width))) if k == 0 else _variant(image, rng)
            rel = Path("val") / wnid / f"{wnid}_{Path(name).stem}_{k}.JPEG"
            out.save(root / rel, quality=rng.choice([75, 85, 90, 95]))
            lines.append(str(rel))
    flist = root / "val.flist"
    flist.write_text("".join(f"{line}\n" for line in lines))
    return flist


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--variants", type=whole(1), default=8, help="images per photo")
    args = parser.parse_args()
    out_folder(parser, "root", args.root)
    out_folder(parser, "root", args.root / "val")
    flist = make_demo_data(args.root, args.variants)
    print(f"wrote {len(flist.read_text().splitlines())} images and {flist}")


if __name__ == "__main__":
    run(main)
