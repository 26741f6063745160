"""Build the real-photo set that ``bench/parity.py`` measures agreement on.

Every photograph in scikit-image's bundled data folder (as installed, nothing downloaded) is
cut into random crops, resized to ImageNet-like sizes (300 x 250 to 800 x 600, both
orientations, most near 500 x 375) and saved with PIL as JPEG the way photo sites and cameras
save them: quality 75-95, mostly 4:2:0 chroma, some 4:4:4, some progressive. Colour photos
give more crops than greyscale ones, since only colour JPEGs carry chroma to upsample.

Usage::

    python bench/parity_set.py bench/out/parity_set    # writes the JPEGs and parity_set.flist
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from cli_checks import out_folder, run, whole  # noqa: E402
from PIL import Image  # noqa: E402

# The real photographs among scikit-image's bundled images (not the synthetic ones: colour
# wheel, phantom, chessboards, logo, horse silhouette; nor the 102 x 102 microaneurysms crop).
COLOUR_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
                 "motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png")  # fmt: skip
GREY_PHOTOS = ("camera.png", "brick.png", "grass.png", "gravel.png", "moon.png", "coins.png", "cell.png",
               "clock_motion.png", "page.png", "text.png")  # fmt: skip
# (width, height) before the orientation is chosen: ImageNet's common shapes weigh most.
SIZES = ((500, 375), (500, 375), (500, 333), (500, 333), (500, 400), (640, 480), (800, 600), (400, 300),
         (375, 300), (300, 250), (450, 300), (500, 500), (600, 400), (700, 525))  # fmt: skip


def skimage_photo(name: str) -> Path:
    """Path of a photo in scikit-image's data folder."""
    import skimage

    return Path(skimage.__file__).parent / "data" / name


def _crop_to_shape(image: Image.Image, size: tuple[int, int], rng: random.Random) -> Image.Image:
    """A random crop of ``image`` with ``size``'s aspect ratio, 35-100 % of the largest such
    crop's area, maybe mirrored, resized to ``size`` (Lanczos, as photo tools do)."""
    w, h = image.size
    aspect = size[0] / size[1]
    max_w, max_h = (w, w / aspect) if w / h < aspect else (h * aspect, h)
    scale = rng.uniform(0.35, 1.0) ** 0.5
    cw, ch = max(8, int(max_w * scale)), max(8, int(max_h * scale))
    left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
    crop = image.crop((left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return crop.resize(size, Image.Resampling.LANCZOS)


def _save_options(rng: random.Random) -> dict:
    """JPEG settings as found in the wild: quality 75-95, 4:2:0 mostly, some 4:4:4 and progressive."""
    options = {"quality": rng.choice([75, 80, 85, 90, 95]), "subsampling": "4:2:0"}
    if rng.random() < 0.2:
        options["subsampling"] = "4:4:4"
    if rng.random() < 0.2:
        options["progressive"] = True
    return options


def make_parity_set(root: Path, colour_crops: int = 40, grey_crops: int = 10, seed: int = 0) -> Path:
    """Write ``root/<photo>_<k>.jpg`` for every photo and ``root/parity_set.flist`` (one file
    name a line); return the list's path. The same arguments give the same files."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for photo, crops in [(p, colour_crops) for p in COLOUR_PHOTOS] + [(p, grey_crops) for p in GREY_PHOTOS]:
        image = Image.open(skimage_photo(photo))
        image = image.convert("RGB" if photo in COLOUR_PHOTOS else "L")
        for k in range(crops):
            size = rng.choice(SIZES)
            if rng.random() < 0.3:
                size = size[::-1]  # portrait
            name = f"{Path(photo).stem}_{k:02d}.jpg"
            _crop_to_shape(image, size, rng).save(root / name, **_save_options(rng))
            names.append(name)
    flist = root / "parity_set.flist"
    flist.write_text("".join(f"{name}\n" for name in names))
    return flist


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--colour-crops", type=whole(0), default=40, help="crops per colour photo")
    parser.add_argument("--grey-crops", type=whole(0), default=10, help="crops per greyscale photo")
    args = parser.parse_args()
    if args.colour_crops == args.grey_crops == 0:
        parser.error("arguments --colour-crops and --grey-crops: both 0: no JPEG to write")
    out_folder(parser, "root", args.root)
    flist = make_parity_set(args.root, args.colour_crops, args.grey_crops)
    print(f"wrote {len(flist.read_text().splitlines())} JPEGs and {flist}")


if __name__ == "__main__":
    run(main)
