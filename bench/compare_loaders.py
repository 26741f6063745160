"""Compare image loaders on identical work, side by side, in one run.

Generates an ImageNet-like JPEG set (real photographs cropped to ImageNet's common sizes and
qualities; with ``--mix imagenet``, sizes and kinds drawn as in ImageNet's validation set as far as
published: see bench/README.md, "A realistic mix"), then measures, interleaved and repeated:

- FFmpeg decode-only rate (demux + decode, no resize) at 1..N threads: the ceiling per core;
- the SPDL loader (decode, resize, crop, batch) at 1..N threads;
- the PyTorch DataLoader with PIL at 1..N worker processes, same transform and batching;
- the model alone and end-to-end, on a subset;
- a scaling check: the SPDL loader over 1k and 8k listed images, in fresh processes, comparing
  throughput and peak RSS;
- per kind of image (baseline or progressive, greyscale, CMYK, 4:2:0 or 4:4:4 chroma, small or
  large, a common size or one of its own), one thread: FFmpeg decode alone against the loader's
  decode + resize + crop of each image, one right after the other.

Every image of the set is decoded once first, as the loader decodes it: one that fails is left
out of every measurement, and their count is printed (``left_out`` in the results).

Writes ``OUT/results.json`` and ``OUT/loaders.png`` and prints the ratios. Usage::

    python bench/compare_loaders.py --out bench/out --images 2000 --repeats 5
    python bench/compare_loaders.py --out bench/out-imagenet --mix imagenet
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]

import spdl.io  # noqa: E402
import torch  # noqa: E402
from cli_checks import max_threads, of_the_set, out_file, out_folder, run, sub_folder  # noqa: E402
from make_demo_data import PHOTOS, photo_path  # noqa: E402
from parity_set import _crop_to_shape  # noqa: E402
from PIL import Image  # noqa: E402

import imagenet_classification as ic  # noqa: E402

# ImageNet's most common sizes, roughly in proportion, and a spread of others.
SIZES = [(500, 375)] * 8 + [(375, 500)] * 3 + [(500, 333)] * 3 + [(333, 500), (500, 500), (400, 300), (640, 480)]


@dataclass(frozen=True)
class ImageMix:
    """How the images of a generated set are drawn: each field is the chance that an image has
    that property. bench/README.md ("A realistic mix") gives the source of each figure, or says
    that there is none and where the figure comes from instead.

    Attributes:
        common_size: One of :py:data:`SIZES`; otherwise a size of its own (:py:func:`own_size`).
        progressive: Progressive JPEG, else baseline.
        chroma_444: A colour image without chroma subsampling (4:4:4), else 4:2:0.
        quality_96: Saved at quality 96, else at 75, 85, 90 or 95.
        grey: Greyscale (one component).
        cmyk: CMYK (four components, as Photoshop saves them).
    """

    common_size: float
    progressive: float
    chroma_444: float
    quality_96: float
    grey: float
    cmyk: float


IMAGENET_MIX = ImageMix(common_size=0.6, progressive=0.2, chroma_444=0.75, quality_96=0.75, grey=0.05, cmyk=0.001)
MIXES = {"default": None, "imagenet": IMAGENET_MIX}  # default: the set make_image_set has always made


def own_size(rng: random.Random) -> tuple[int, int]:
    """A size that few other images share: the long side 500 (half the time) or any from 333 to
    800, the short side any from 0.56 of it (16:9) to all of it, landscape three times in four."""
    long = 500 if rng.random() < 0.5 else rng.randint(333, 800)
    short = rng.randint(max(250, round(0.56 * long)), long)
    return (long, short) if rng.random() < 0.75 else (short, long)


def _save_in_mix(photo: Image.Image, path: Path, mix: ImageMix, rng: random.Random) -> None:
    """A random crop of an RGB photo, with a size drawn from the mix and that size's aspect
    ratio, saved as JPEG as one of the mix's kinds."""
    size = rng.choice(SIZES) if rng.random() < mix.common_size else own_size(rng)
    image = _crop_to_shape(photo, size, rng)
    kind = rng.random()
    options = {"quality": 96 if rng.random() < mix.quality_96 else rng.choice([75, 85, 90, 95]),
               "progressive": rng.random() < mix.progressive}  # fmt: skip
    if kind < mix.cmyk:
        image = image.convert("CMYK")
    elif kind < mix.cmyk + mix.grey:
        image = image.convert("L")
    else:
        options["subsampling"] = "4:4:4" if rng.random() < mix.chroma_444 else "4:2:0"
    image.save(path, format="JPEG", **options)


def make_image_set(
    root: Path, count: int, seed: int = 0, photos: list[tuple[Path, str]] | None = None, mix: str = "default"
) -> Path:
    """Write ``count`` JPEGs under ``root/val/<wnid>/`` and their list; reuse an existing set.
    The same arguments give the same files.

    Args:
        photos: ``(image path, wnid)`` pairs to cut from; default scikit-image's demo photos.
        mix: ``default`` (the common sizes, baseline 4:2:0 colour JPEGs, quality 70-95) or a name
            in :py:data:`MIXES`.
    """
    # Each mix in a folder of its own: the same names in one folder would write one mix's images over
    # another's, which a list kept from before then reads as its own.
    default = mix == "default"
    folder, flist = ("val", f"val{count}.flist") if default else (f"val-{mix}", f"{mix}-{count}.flist")
    flist = root / flist
    if flist.exists():
        return flist
    rng = random.Random(seed)
    photos = photos or [(photo_path(name), wnid) for name, wnid in PHOTOS.items()]
    sources = [(Image.open(path).convert("RGB"), wnid) for path, wnid in photos]
    image_mix = MIXES[mix]
    lines = []
    for i in range(count):
        image, wnid = rng.choice(sources)
        rel = Path(folder) / wnid / f"{wnid}_{i:06d}.JPEG"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if image_mix is None:
            _save_default(image, root / rel, rng)
        else:
            _save_in_mix(image, root / rel, image_mix, rng)
        lines.append(str(rel))
    flist.write_text("\n".join(lines) + "\n")
    return flist


def _save_default(image: Image.Image, path: Path, rng: random.Random) -> None:
    """A crop of half to all of each side of ``image``, resized to a common size, as a baseline JPEG."""
    w, h = image.size
    scale = rng.uniform(0.5, 1.0)
    cw, ch = int(w * scale), int(h * scale)
    left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
    size = rng.choice(SIZES)
    crop = image.crop((left, top, left + cw, top + ch)).resize(size, Image.Resampling.BICUBIC)
    crop.save(path, quality=rng.choice([70, 80, 85, 90, 95]))


WARMUP_BATCHES = 5  # left out of each loader's timing (measure_loader's warm-up)
MODEL_WARMUP_BATCHES = 1  # left out of the model's and end-to-end timing


def min_images(batch_size: int = 32, warmup: int = WARMUP_BATCHES) -> int:
    """The fewest images that give a loader its warm-up batches and one batch to time."""
    return (warmup + 1) * batch_size


def window_overstates(images: int, batch_size: int = 32, threads: int = 1, warmup: int = WARMUP_BATCHES) -> float:
    """How far the loader's rate at ``threads`` threads over ``images`` may be too high (inf: it may be
    that of batches decoded before its window): the window opens with up to ``threads`` batches under
    way (the module's bound for the breakdown's loader alone), which a short window counts as its own."""
    timed = images // batch_size - warmup
    return math.inf if timed <= threads else threads / (timed - threads)


def check_image_count(
    parser: argparse.ArgumentParser, images: int, batch_size: int = 32, threads: int = 1, warmup: int = WARMUP_BATCHES
) -> None:
    """``parser.error`` unless a set of ``images`` fills the loader's warm-up batches and one to time
    (fewer would time the warm-up, or nothing); a warning where the loader at ``threads`` threads
    may be timed too high: its window opens with up to ``threads`` batches under way (the module's
    bound for the breakdown's loader alone), which a short window counts as decoded in it."""
    if images < (need := min_images(batch_size, warmup)):
        parser.error(f"argument --images: {images}: at least {need} images ({warmup} warm-up batches "
                     f"of {batch_size} and 1 to time)")  # fmt: skip
    timed = images // batch_size - warmup
    if (over := window_overstates(images, batch_size, threads, warmup)) > ic.FPS_WINDOW_SLACK:
        enough = (warmup + threads + math.ceil(threads / ic.FPS_WINDOW_SLACK)) * batch_size
        bound = "be that of batches already decoded" if over == math.inf else f"be up to {over:.0%} high"
        print(f"{parser.prog}: warning: --images {images}: at {threads} threads the loader's timed window of "
              f"{timed} batches opens with up to {threads} under way: its rates may {bound} (--images {enough} "
              f"keeps it within {ic.FPS_WINDOW_SLACK:.0%})", file=sys.stderr)  # fmt: skip


def decodable(flist: Path, batch_size: int = 32) -> tuple[Path, list[ic.ImageDecodeError]]:
    """The set's images that the module's decode function decodes, each decoded once (as the
    loader does, bad images skipped) before anything is timed: ``(flist, [])`` if all do; else a
    list of those that do, beside it (``<name>.decodable.flist``), and the error of each one left
    out, their count printed. The loaders and yardsticks then time the same good images. A list
    that is not UTF-8 text, which the module's read_file_list refuses (a reused one, edited), ends
    the program with one line."""
    try:
        lines = flist.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {flist}: not UTF-8 text (byte {e.start}); delete it, and this "
                 "program makes the set anew")  # fmt: skip
    decode = ic.get_decode_func("cpu", ic.EvalTransform(), policy=ic.BadImagePolicy(skip=True))
    bad: list[ic.ImageDecodeError] = []
    for start in range(0, len(lines), batch_size):
        bad += decode([(f"{flist.parent}/{line}", 0) for line in lines[start : start + batch_size]]).failures
    if not bad:
        return flist, []
    failed = {e.path for e in bad}
    good = [line for line in lines if f"{flist.parent}/{line}" not in failed]
    kept = flist.with_name(f"{flist.stem}.decodable.flist")
    kept.write_text("".join(f"{line}\n" for line in good))
    print(f"{Path(sys.argv[0]).stem}: left out {len(bad)} of the set's {len(lines)} images, which do not decode "
          f"(the first: {bad[0]}); timing the other {len(good)}, listed in {kept}", file=sys.stderr)  # fmt: skip
    return kept, bad


def decodable_set(
    parser: argparse.ArgumentParser, flist: Path, images: int, batch_size: int = 32, warmup: int = WARMUP_BATCHES
) -> tuple[Path, list[ic.ImageDecodeError]]:
    """:py:func:`decodable`, or ``parser.error`` where too few decode for the loaders' warm-up and a batch to time."""
    flist, left_out = decodable(flist, batch_size)
    if (count := len(flist.read_text().splitlines())) < (need := min_images(batch_size, warmup)):
        parser.error(f"argument --images: {images}: only {count} of them decode, and the loaders need "
                     f"{need} ({warmup} warm-up batches and 1 to time)")  # fmt: skip
    return flist, left_out


def decode_only_rate(paths: list[str], threads: int = 1, as_loader: bool = False) -> float:
    """Images/s of FFmpeg demux + decode, native pixel format, no resize, in ``threads`` threads
    at once (each its share of ``paths``), after a short untimed warm-up. FFmpeg's defaults (the
    format probed: the issue's yardstick), or ``as_loader``: decoded as the module's decode
    function decodes (``decode_frames``: JPEG demuxer named, one packet per file, its IDCT)."""

    def decode(path: str) -> None:
        data = Path(path).read_bytes()
        if as_loader:
            ic._decode_frames(data)
        else:
            spdl.io.decode_packets(spdl.io.demux_image(data), filter_desc=None)

    def run(files: list[str]) -> None:
        for path in files:
            decode(path)

    shares = [paths[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:  # SPDL releases the GIL while it demuxes and decodes
        list(pool.map(run, [share[:50] for share in shares]))
        started = time.perf_counter()
        list(pool.map(run, shares))
        return len(paths) / (time.perf_counter() - started)


def image_kinds(data: bytes) -> list[str]:
    """The kinds one JPEG counts in, read from its frame header (``whole mix`` for every one)."""
    header = ic._parse_jpeg_header(data)
    kinds = ["whole mix", "progressive" if header.frame_type == 0xC2 else "baseline"]
    if header.components == 3:
        kinds.append("colour 4:2:0" if header.chroma_420 else "colour 4:4:4" if header.sampling[0] == 0x11
                     else "colour, other chroma")  # fmt: skip
    else:
        kinds.append({1: "greyscale", 4: "CMYK"}.get(header.components, f"{header.components} components"))
    kinds.append("small (long side <= 500)" if max(header.width, header.height) <= 500 else "large (> 500)")
    common = (header.width, header.height) in SIZES
    kinds.append("one of the common sizes" if common else "a size of its own")
    return kinds


def _decode_and_load_s(path: str, data: bytes, graphs: ic._FilterGraphCache, load_first: bool) -> tuple[float, float]:
    """Seconds for FFmpeg to decode one image alone (FFmpeg's defaults, the format probed), and
    for the loader's own work on it (the module's decode, resize and crop), one right after the
    other."""

    def decode() -> None:
        spdl.io.decode_packets(spdl.io.demux_image(data), filter_desc=None)

    def load() -> None:
        ic._crop_on_cpu(path, data, ic._parse_jpeg_header(data), graphs)

    spent = {}
    for step in (load, decode) if load_first else (decode, load):
        started = time.perf_counter()
        step()
        spent[step] = time.perf_counter() - started
    return spent[decode], spent[load]


def per_kind_rates(paths: list[str], repeats: int, first_pass: int = 0) -> dict[str, dict]:
    """Per kind of image (:py:func:`image_kinds`), one thread, from bytes in memory: FFmpeg decode
    alone (the strict yardstick of :py:func:`decode_only_rate`) against the loader's own work on
    each image, the two timed one right after the other on each image (which goes first
    alternates between passes, counted from ``first_pass``), over the list in its order. The
    loader's cache of filter graphs starts empty on every pass, as each loader thread's does.

    Returns:
        ``{kind: {"images", "decode_only_fps", "loader_fps", "ratio"}}``: medians over the
        ``repeats`` passes; ``ratio`` is the median of each pass's loader rate over its
        decode-only rate.
    """
    datas = [Path(path).read_bytes() for path in paths]
    kinds = [image_kinds(data) for data in datas]
    names = list(dict.fromkeys(kind for of_image in kinds for kind in of_image))
    warm = ic._FilterGraphCache(ic.EvalTransform())
    for path, data in list(zip(paths, datas, strict=True))[:50]:  # untimed: the code paths, the allocator
        _decode_and_load_s(path, data, warm, False)
    passes: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for repeat in range(first_pass, first_pass + repeats):
        graphs, spent = ic._FilterGraphCache(ic.EvalTransform()), {name: [0.0, 0.0] for name in names}
        for path, data, of_image in zip(paths, datas, kinds, strict=True):
            decode_s, load_s = _decode_and_load_s(path, data, graphs, load_first=repeat % 2 == 1)
            for kind in of_image:
                spent[kind][0] += decode_s
                spent[kind][1] += load_s
        for name, (decode_s, load_s) in spent.items():
            passes[name].append((decode_s, load_s))
    counts = {name: sum(name in of_image for of_image in kinds) for name in names}
    return {
        name: {
            "images": counts[name],
            "decode_only_fps": statistics.median(counts[name] / d for d, _ in passes[name]),
            "loader_fps": statistics.median(counts[name] / lo for _, lo in passes[name]),
            "ratio": statistics.median(d / lo for d, lo in passes[name]),
        }
        for name in names
    }


@contextlib.contextmanager
def open_loader(kind: str, flist: Path, threads: int, batch_size: int, transform: ic.EvalTransform) -> Iterator:
    """Batches on the CPU from the SPDL pipeline or the DataLoader baseline, built alike and as
    the benchmark's CLI builds them (with a bad-image policy, which the CLI always has)."""
    images, cpu = ic.read_file_list(flist, f"{flist.parent}/"), torch.device("cpu")
    if kind == "torch":
        loader = ic._get_torch_loader(ic._PILDataset(images, transform, batch_size=batch_size), threads, cpu, 120)
        yield ic._torch_loader_batches(loader, cpu)
        return
    decode = ic.get_decode_func(cpu, transform, policy=ic.BadImagePolicy())
    pipeline = ic.get_pipeline(images, batch_size, decode, threads, 16, threads)
    with pipeline.auto_stop():
        yield pipeline.get_iterator(timeout=120)


def loader_rate(kind: str, flist: Path, threads: int, batch_size: int, warmup: int) -> float:
    """Images/s of one loader, iterated alone on the CPU."""
    with open_loader(kind, flist, threads, batch_size, ic.EvalTransform()) as batches:
        return ic.measure_loader(batches, torch.device("cpu"), warmup)


def steady_loader_rate(flist: Path, threads: int, batch_size: int, warmup: int, tail: int) -> float:
    """Images/s of the SPDL loader between its first ``warmup`` and last ``tail`` batches: the
    steady state, without the start-up and the end where fewer batches are left than threads."""
    stamps, sizes = [], []
    with open_loader("spdl", flist, threads, batch_size, ic.EvalTransform()) as batches:
        for images, _ in batches:
            stamps.append(time.perf_counter())
            sizes.append(images.shape[0])
    end = len(stamps) - 1 - tail
    return sum(sizes[warmup + 1 : end + 1]) / (stamps[end] - stamps[warmup])


def model_rates(flist: Path, model_name: str, batch_size: int, threads: int, warmup: int) -> dict:
    """Model-only and end-to-end images/s with the SPDL loader, through the benchmark's loop."""
    model = ic.get_model(model_name, "cpu", pretrained=False, compile=False, dtype="float32")
    with open_loader("spdl", flist, threads, batch_size, model.transform) as batches:
        result = ic.benchmark(batches, model, listed=len(ic.read_file_list(flist)), warmup_batches=warmup)
    return {"model_fps": ic._measure_model(model, batch_size, result.batches, warmup), "e2e_fps": result.fps}


SCALING_CHILD = """
import resource, statistics, sys, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from compare_loaders import steady_loader_rate
rates = [steady_loader_rate(__import__("pathlib").Path({flist!r}), {threads}, 32, 5, 4) for _ in range({passes})]
print(statistics.median(rates), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
# The child's steady_loader_rate needs 11 batches of 32: 5 of warm-up, 2 to time between, 4 at the end.
SCALING_MIN = 10 * 32 + 1


def scaling_check(flist: Path, threads: int, repeats: int, sizes: tuple[int, int] = (1000, 8000)) -> dict:
    """SPDL loader over ``sizes`` (1k and 8k) listed images, each in fresh processes, interleaved
    ``repeats`` times: median steady-state throughput (:py:func:`steady_loader_rate`) and median
    peak RSS (KiB). The smaller list is gone over as often as the larger one's images need (the
    median pass counts)."""
    lines = flist.read_text().splitlines()
    runs: dict[int, list[tuple[float, int]]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in runs:
            sub = flist.with_name(f"scaling{n}.flist")
            sub.write_text("\n".join((lines * (n // len(lines) + 1))[:n]) + "\n")
            code = SCALING_CHILD.format(root=str(ROOT), bench=str(ROOT / "bench"), flist=str(sub), threads=threads,
                                        passes=max(1, max(sizes) // n))  # fmt: skip
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if proc.returncode:  # its own error (without nanobind's leak report), not a bare CalledProcessError
                tail = "\n".join(proc.stderr.split("\nnanobind:")[0].strip().splitlines()[-5:])
                raise SystemExit(f"compare_loaders: the scaling check over {n} images failed "
                                 f"(exit status {proc.returncode}):\n{tail}")  # fmt: skip
            rate, rss = proc.stdout.split()
            runs[n].append((float(rate), int(rss)))
    return {
        n: {"fps": statistics.median(r for r, _ in rs), "peak_rss_kib": statistics.median(m for _, m in rs)}
        for n, rs in runs.items()
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    threads = results["threads"]
    for kind, label in (("spdl", "SPDL pipeline (FFmpeg)"), ("torch", "PyTorch DataLoader + PIL")):
        ax.plot(threads, [statistics.median(results["loaders"][kind][str(t)]) for t in threads], "o-", label=label)
    decode_only = [statistics.median(results["decode_only"][str(t)]) for t in threads]
    ax.plot(threads, decode_only, "k--", label="FFmpeg decode only (no resize)")
    ax.set_xlabel("threads / worker processes")
    ax.set_ylabel("images / s")
    ax.set_xticks(threads)
    ax.set_title(f"Loading {results['images']} ImageNet-like JPEGs, {os.cpu_count()} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--images", type=ic._count, default=2000)
    parser.add_argument("--repeats", type=ic._count, default=5)
    parser.add_argument("--max-threads", type=max_threads, default=os.cpu_count())
    parser.add_argument("--batch-size", type=ic._count, default=32)
    parser.add_argument("--model", default="mobilenetv3_large_100")
    parser.add_argument("--model-images", type=ic._count, help="images for model-only and end-to-end (default 256, "
                        "or --images if fewer; at least 2 batches: one of warm-up, one to time)")  # fmt: skip
    parser.add_argument(
        "--scaling-sizes",
        type=int,
        nargs=2,
        default=[1000, 8000],
        metavar=("SMALL", "LARGE"),
        help=f"the two list lengths of the scaling check, each at least {SCALING_MIN} (default 1000 8000)",
    )
    parser.add_argument("--no-plot", action="store_false", dest="plot", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--mix", choices=sorted(MIXES), default="default",
                        help="the set's sizes and kinds: default, or imagenet (see bench/README.md)")  # fmt: skip
    args = parser.parse_args()
    if min(args.scaling_sizes) < SCALING_MIN:
        parser.error(f"argument --scaling-sizes: {min(args.scaling_sizes)}: at least {SCALING_MIN} images "
                     "(11 batches of 32: 5 of warm-up, 2 to time between, 4 at the end)")  # fmt: skip
    if args.scaling_sizes[0] >= args.scaling_sizes[1]:
        parser.error("argument --scaling-sizes: {} {}: SMALL must be less than LARGE".format(*args.scaling_sizes))
    check_image_count(parser, args.images, args.batch_size, args.max_threads)
    model_min = min_images(args.batch_size, MODEL_WARMUP_BATCHES)
    args.model_images = of_the_set(parser, "--model-images", args.model_images, max(256, model_min), args.images)
    if args.model_images < model_min:  # else the model's window holds its warm-up batch (WarmupIncluded)
        parser.error(f"argument --model-images: {args.model_images}: at least {model_min} images "
                     f"({MODEL_WARMUP_BATCHES} warm-up batch of {args.batch_size} and 1 to time)")  # fmt: skip
    if args.plot:  # now, not after the measuring: the plot is an optional extra
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("the plot needs matplotlib, which is not installed: pip install matplotlib, or pass --no-plot")
    out_folder(parser, "--out", args.out)
    out_file(parser, "--out", args.out / "results.json")
    sub_folder(parser, "--out", args.out / "images")
    if args.plot:
        out_file(parser, "--out", args.out / "loaders.png")
    try:  # now, not after the loaders' minutes
        ic._pretrained_config(args.model)
    except ic.InputError as e:
        parser.error(f"argument --model: {e}")
    made = make_image_set(args.out / "images", args.images, mix=args.mix)
    flist, left_out = decodable_set(parser, made, args.images, args.batch_size)
    paths = [f"{flist.parent}/{line}" for line in flist.read_text().splitlines()]
    threads = list(range(1, args.max_threads + 1))
    by_threads = lambda: {str(t): [] for t in threads}  # noqa: E731
    results = {"images": len(paths), "left_out": [str(e) for e in left_out], "mix": args.mix, "threads": threads,
               "decode_only": by_threads(), "decode_only_as_loader": by_threads(),
               "loaders": {"spdl": by_threads(), "torch": by_threads()}}  # fmt: skip
    warmup = WARMUP_BATCHES
    for repeat in range(args.repeats):  # interleaved, so drifts hit every loader alike
        for t in threads:
            results["decode_only"][str(t)].append(decode_only_rate(paths[: 1000 * t], t))
            results["decode_only_as_loader"][str(t)].append(decode_only_rate(paths[: 1000 * t], t, as_loader=True))
            for kind in ("spdl", "torch"):
                results["loaders"][kind][str(t)].append(loader_rate(kind, flist, t, args.batch_size, warmup))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    results["per_kind"] = per_kind_rates(paths, args.repeats)
    subset = flist.with_name("model_subset.flist")
    subset.write_text("\n".join(flist.read_text().splitlines()[: args.model_images]) + "\n")
    results["model"] = model_rates(subset, args.model, args.batch_size, args.max_threads, MODEL_WARMUP_BATCHES)
    results["scaling"] = scaling_check(flist, args.max_threads, args.repeats, tuple(args.scaling_sizes))
    results["env"] = ic._environment(torch.device("cpu"))

    med = {name: {t: statistics.median(results[name][str(t)]) for t in threads}
           for name in ("decode_only", "decode_only_as_loader")}  # fmt: skip
    top = threads[-1]
    # SPDL over the DataLoader paired in each repeat, as the other ratios are.
    over_torch = [s / t for s, t in zip(results["loaders"]["spdl"][str(top)], results["loaders"]["torch"][str(top)],
                                        strict=True)]  # fmt: skip
    scale, (small, large) = results["scaling"], args.scaling_sizes

    def paired(loader_threads: int, yardstick: str, yardstick_threads: int, times: int = 1) -> float:
        """Median over the repeats of the loader's rate over the yardstick's measured just before
        it in the same repeat (times ``times``): a drift of the machine's speed cancels out."""
        rates = results["loaders"]["spdl"][str(loader_threads)]
        return statistics.median(r / (y * times) for r, y in zip(rates, results[yardstick][str(yardstick_threads)],
                                                                  strict=True))  # fmt: skip

    results["ratios"] = {
        # The target, per core: the loader against FFmpeg decoding alone on as many cores.
        "spdl_1thread_over_decode_only": paired(1, "decode_only", 1),
        "spdl_over_decode_only_at_max_threads": paired(top, "decode_only", top),
        # Stricter: against one thread's decode-only rate times the threads, as if decoding scaled perfectly.
        "spdl_over_decode_only_1thread_x_threads": paired(top, "decode_only", 1, top),
        # Against decoding alone as the loader decodes (JPEG demuxer named, one packet, its IDCT).
        "spdl_1thread_over_decode_as_loader": paired(1, "decode_only_as_loader", 1),
        "spdl_over_decode_as_loader_at_max_threads": paired(top, "decode_only_as_loader", top),
        "spdl_over_torch_at_max_threads": statistics.median(over_torch),
        "scaling_fps_8k_over_1k": scale[large]["fps"] / scale[small]["fps"],
        "scaling_rss_8k_over_1k": scale[large]["peak_rss_kib"] / scale[small]["peak_rss_kib"],
    }
    ic._write_atomically(args.out / "results.json", json.dumps(results, indent=2) + "\n")
    for t in threads:
        s, p = (statistics.median(results["loaders"][k][str(t)]) for k in ("spdl", "torch"))
        print(f"{t} thread(s): FFmpeg decode only {med['decode_only'][t]:6.0f} "
              f"({med['decode_only_as_loader'][t]:.0f} decoded as the loader decodes)   "
              f"SPDL {s:6.0f}   DataLoader+PIL {p:6.0f} images/s   SPDL/DataLoader {s / p:.2f}")  # fmt: skip
    print(f"Model alone {results['model']['model_fps']:.0f}, end-to-end {results['model']['e2e_fps']:.0f} images/s "
          f"({args.model}, float32, CPU)")  # fmt: skip
    print("Ratios, each the median over the repeats of the ratio within a repeat (the scaling's: of the medians):")
    for name, value in results["ratios"].items():
        print(f"{name:46s} {value:.2f}")
    print("Per kind, one thread (images/s): FFmpeg decode only | the loader's decode + resize + crop | ratio, the "
          "median of the per-pass ratios (not the quotient of the two medians)")  # fmt: skip
    for kind, rates in results["per_kind"].items():
        print(f"  {kind:28s} {rates['images']:5d} images  {rates['decode_only_fps']:6.0f} | "
              f"{rates['loader_fps']:6.0f} | {rates['ratio']:.2f}")  # fmt: skip
    if args.plot:  # after the table: a failure here loses no figure
        plot(results, args.out / "loaders.png")
    print(f"wrote {args.out / 'results.json'}" + (f" and {args.out / 'loaders.png'}" if args.plot else ""))


if __name__ == "__main__":
    run(main)
