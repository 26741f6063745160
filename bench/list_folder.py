"""How long listing an ImageNet-sized folder takes: the module's ``scan_folder`` beside
torchvision's ``ImageFolder`` listing (``make_dataset``), on the same tree, in one run.

Builds (once) a tree of empty files laid out as ImageNet's ``train/``: 1000 class folders named
by WordNet ID, ``--files`` files in all (a tree made before with another count is refused). Usage::

    python bench/list_folder.py --root /tmp/imagenet-tree --files 1281167
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from cli_checks import out_folder, run  # noqa: E402

import imagenet_classification as ic  # noqa: E402


def tree_files(root: Path) -> int | None:
    """The files of a tree :py:func:`make_tree` made whole in ``root`` (its ``.complete`` holds
    their count; counted for one made before it did), or None."""
    if not (root / ".complete").is_file():
        return None
    text = (root / ".complete").read_text().strip()
    return int(text) if text.isdigit() else sum(len(os.listdir(d)) for d in os.scandir(root) if d.is_dir())


def make_tree(root: Path, files: int) -> None:
    """Empty files under 1000 WordNet-ID folders, as many in each (the last ones one more), in a
    folder this made (``.complete`` once whole, holding the count) or a new or empty one: never
    beside real images."""
    if tree_files(root) is not None:
        return
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        sys.exit(f"error: --root {root}: not an empty folder; this fills it with empty .JPEG files, so give a new one")
    wnids = sorted(ic.get_mappings())
    for i, wnid in enumerate(wnids):
        folder = root / wnid
        folder.mkdir(parents=True, exist_ok=True)
        count = files // len(wnids) + (i >= len(wnids) - files % len(wnids))
        for j in range(count):
            (folder / f"{wnid}_{j}.JPEG").touch()
    (root / ".complete").write_text(f"{files}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="a new folder, filled with empty .JPEG files")
    parser.add_argument("--files", type=ic._count, default=1_281_167, help="files in all (default: ImageNet's train)")
    args = parser.parse_args()
    if (made := tree_files(args.root)) not in (None, args.files):
        parser.error(f"argument --files: {args.files}: --root {args.root} holds a tree of {made} files made "
                     f"before; give --files {made}, or a new --root")  # fmt: skip
    if made is None:  # a tree to make: a folder it can write in (else a PermissionError traceback)
        out_folder(parser, "--root", args.root)
    if args.files < (classes := len(ic.get_mappings())):  # an empty class folder: torchvision's make_dataset fails
        parser.error(f"argument --files: {args.files}: at least {classes}, a file in each class folder")
    make_tree(args.root, args.files)
    os.sync()
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    for _ in range(2):  # the second pass is the one that counts: the file system's caches are warm
        started = time.perf_counter()
        ours = ic.scan_folder(args.root)
        scan_s = time.perf_counter() - started
        started = time.perf_counter()
        theirs = make_dataset(str(args.root), find_classes(str(args.root))[1], IMG_EXTENSIONS)
        torchvision_s = time.perf_counter() - started
    print(f"{len(ours)} files: scan_folder {scan_s:.3g} s, torchvision's make_dataset {torchvision_s:.3g} s "
          f"({torchvision_s / scan_s:.3g}x); the same files: {list(ours.paths) == [p for p, _ in theirs]}")  # fmt: skip


if __name__ == "__main__":
    run(main)
