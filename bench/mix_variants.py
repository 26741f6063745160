"""Where the loader falls behind FFmpeg's decode alone on the realistic mix, and what closes it.

The module's decode path in several variants, side by side in one run, on the ``--mix imagenet``
set of ``compare_loaders.py``: per kind of image, one thread, FFmpeg decode alone against each
variant's decode + resize + crop of every image, timed one right after the other
(``compare_loaders.per_kind_rates``), the variants taking turns round after round; and each
variant's agreement with PIL (decode, bicubic resize, crop) on the first images of the set.

- ``before``: the path as it was before issue #17: a filter graph per size, which also packs
  the crop to RGB24, kept in a per-thread LRU cache of 32 from the first image of the size on;
  swscale told nothing of the input's colour range;
- ``in_range``: the scale filter told that the input is full range (JPEG, PNG);
- ``current`` (the module now): that, and a size's graph kept only from its second image on;
- ``one packer``: the current path, with the crops of every size packed to RGB24 in one graph
  per thread, so that a size's graph stops at the crop in planar RGB;
- ``grey kept grey``: the current path, with greyscale frames resized as grey and expanded to
  RGB only after the crop;
- ``lowres``: the current path, with JPEGs whose short side is at least twice the resize's
  decoded at half size by FFmpeg (``lowres=1``);
- ``all prebuilt`` (asked for by name only): a bound, the current graphs of every size in the set
  set up before the clock starts.

With ``--pipeline-repeats N``, also the whole loader (the SPDL pipeline as the CLI builds it) of
``--pipeline-variants`` (default ``before``, which also reads files as before issue #17, and
``current``; ``old read`` is the current path reading files as before) at 1..``--max-threads``
threads, against FFmpeg decode alone measured just before each.

Usage::

    python bench/mix_variants.py --out bench/out --rounds 5 --pipeline-repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]

import numpy as np  # noqa: E402
import spdl.io  # noqa: E402
import torch  # noqa: E402
from cli_checks import max_threads, of_the_set, out_file, out_folder, run, sub_folder  # noqa: E402
from compare_loaders import (  # noqa: E402
    MIXES,
    check_image_count,
    decodable,
    decodable_set,
    decode_only_rate,
    loader_rate,
    make_image_set,
    per_kind_rates,
)

import imagenet_classification as ic  # noqa: E402

CURRENT_FILTER, CURRENT_DECODE, CURRENT_READ = ic.EvalTransform.ffmpeg_filter, ic._decode_frames, ic._read_image_bytes


class _OneStageCache(ic._FilterGraphCache):
    """The cache before issue #17 (``admit_second = False``): a graph per size that also packs
    the crop to RGB24, kept from the first image of its size on; or kept from the second."""

    admit_second = False

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        graphs: dict = self._local.__dict__.setdefault("graphs", {})
        seen: dict = self._local.__dict__.setdefault("seen", {})
        key = (frames.width, frames.height, frames.pix_fmt)
        graph = graphs.pop(key, None)
        keep = graph is not None or not self.admit_second or seen.pop(key, False) is None
        if graph is None:
            graph = ic._filter_graph(*key, self.transform.ffmpeg_filter(key[0], key[1]))
        graph.add_frames(frames)
        output = graph.get_frames()
        if keep:
            graphs[key] = graph
            if len(graphs) > self.capacity:
                del graphs[next(iter(graphs))]
        else:
            seen[key] = None
        return output


class _TwoStageCache(ic._FilterGraphCache):
    """The current cache, with every size's graph stopping at the crop in planar RGB and one
    graph per thread, set up once, packing the crops of all sizes to RGB24."""

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        planar = super().apply(frames)
        if not hasattr(self._local, "packer"):
            size = self.transform.size
            self._local.packer = ic._filter_graph(size, size, "gbrp", "format=rgb24")
        self._local.packer.add_frames(planar)
        return self._local.packer.get_frames()


def _planar_filter(transform: ic.EvalTransform, width: int, height: int) -> str:
    return CURRENT_FILTER(transform, width, height).removesuffix(",format=rgb24")


class _PrebuiltCache(ic._FilterGraphCache):
    """A bound, not a path: the current graphs of every size in the set (:py:meth:`prebuild`),
    set up before the clock starts, so that no image pays for setting up a graph. Each thread
    has graphs of its own (a graph takes one thread's frames at a time), kept across caches:
    the calling thread's are set up by :py:meth:`prebuild`, a loader thread's at its first
    image, in the loader's warm-up batches (with up to 5 threads, one batch each)."""

    keys: tuple = ()  # (width, height, pixel format) of every image in the set
    _threads = threading.local()

    @classmethod
    def prebuild(cls, paths: list[str]) -> None:
        keys = {}
        for path in paths:
            frames = ic._decode_frames(Path(path).read_bytes())
            keys[(frames.width, frames.height, frames.pix_fmt)] = None
        cls.keys, cls._threads = tuple(keys), threading.local()
        cls._graphs(ic.EvalTransform())

    @classmethod
    def _graphs(cls, transform: ic.EvalTransform) -> dict:
        """This thread's graphs, every one of :py:attr:`keys`, set up at its first call."""
        if not hasattr(cls._threads, "graphs"):
            cls._threads.graphs = {key: ic._filter_graph(*key, transform.ffmpeg_filter(key[0], key[1]))
                                   for key in cls.keys}  # fmt: skip
        return cls._threads.graphs

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        graph = self._graphs(self.transform)[(frames.width, frames.height, frames.pix_fmt)]
        graph.add_frames(frames)
        return graph.get_frames()


def _range_untold_filter(transform: ic.EvalTransform, width: int, height: int) -> str:
    return CURRENT_FILTER(transform, width, height).replace(":in_range=full", "")


_grey = threading.local()  # whether the frame whose chain is being made is greyscale


class _GreyAwareCache(ic._FilterGraphCache):
    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        _grey.now = frames.pix_fmt == "gray"
        return super().apply(frames)


def _grey_kept_filter(transform: ic.EvalTransform, width: int, height: int) -> str:
    chain = CURRENT_FILTER(transform, width, height)
    if getattr(_grey, "now", False):
        return chain.replace("in_range=full", "in_range=full:out_range=full").replace(",format=gbrp,", ",format=gray,")
    return chain


def _lowres_decode(data: bytes) -> spdl.io.ImageFrames:
    header = ic._parse_jpeg_header(data)
    if header is None or min(header.width, header.height) < 2 * ic.EvalTransform().resize_short:
        return CURRENT_DECODE(data)
    options = {"err_detect": "explode", "lowres": "1"} | ({"idct": "xvid"} if ic.platform.machine() == "x86_64" else {})
    packets = spdl.io.demux_image(data, demux_config=ic._ffmpeg_jpeg_configs()[0])
    decode_config = spdl.io.decode_config(decoder_options=options)
    return spdl.io.decode_packets(packets, filter_desc=None, decode_config=decode_config, num_frames=1)


def _read_up_to_the_limit(path: str, max_bytes: int = ic.MAX_IMAGE_MB << 20) -> bytes:
    """The file read before issue #17, as it went for a valid image: the same system calls, and
    one read asking for up to the limit."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fstat(fd)
        with open(fd, "rb", buffering=0, closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    # The truncation check, as _read_image_bytes makes it (its answer does not matter here).
    _ = data.endswith(b"\xff\xd9") or data.find(b"\xff\xd9", ic._jpeg_scan(data)) != -1
    return data


# name: (filter graph cache class, filter chain, decode function, file read)
VARIANTS: dict[str, tuple[type, Callable, Callable, Callable]] = {
    "before": (_OneStageCache, _range_untold_filter, CURRENT_DECODE, _read_up_to_the_limit),
    "in_range": (_OneStageCache, CURRENT_FILTER, CURRENT_DECODE, CURRENT_READ),
    "current": (ic._FilterGraphCache, CURRENT_FILTER, CURRENT_DECODE, CURRENT_READ),
    "one packer": (_TwoStageCache, _planar_filter, CURRENT_DECODE, CURRENT_READ),
    "grey kept grey": (_GreyAwareCache, _grey_kept_filter, CURRENT_DECODE, CURRENT_READ),
    "lowres": (ic._FilterGraphCache, CURRENT_FILTER, _lowres_decode, CURRENT_READ),
    "old read": (ic._FilterGraphCache, CURRENT_FILTER, CURRENT_DECODE, _read_up_to_the_limit),
    "all prebuilt": (_PrebuiltCache, CURRENT_FILTER, CURRENT_DECODE, CURRENT_READ),
}
PER_IMAGE_VARIANTS = [name for name in VARIANTS if name != "old read"]  # the same per image as current
DEFAULT_VARIANTS = [name for name in PER_IMAGE_VARIANTS if name != "all prebuilt"]


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The module patched to decode as ``name`` does, for the duration. Only the loader reads
    files (``per_kind_rates`` has the bytes in memory)."""
    cache, chain, decode, read = VARIANTS[name]
    saved = ic._FilterGraphCache, ic.EvalTransform.ffmpeg_filter, ic._decode_frames, ic._read_image_bytes
    ic._FilterGraphCache, ic.EvalTransform.ffmpeg_filter, ic._decode_frames, ic._read_image_bytes = (
        cache, chain, decode, read)  # fmt: skip
    try:
        yield
    finally:
        ic._FilterGraphCache, ic.EvalTransform.ffmpeg_filter, ic._decode_frames, ic._read_image_bytes = saved


def pil_agreement(paths: list[str]) -> dict[str, float]:
    """Mean and largest per-image mean absolute difference (0-255) from PIL's decode, bicubic
    resize and crop, with the module as patched now."""
    transform, graphs, mads = ic.EvalTransform(), ic._FilterGraphCache(ic.EvalTransform()), []
    for path in paths:
        data = Path(path).read_bytes()
        crop = ic._crop_on_cpu(path, data, ic._parse_jpeg_header(data), graphs)
        ours = spdl.io.to_numpy(spdl.io.convert_frames([crop]))[0, 0].astype(np.int16)
        mads.append(float(np.abs(ours - ic._decode_pil(path, transform).astype(np.int16)).mean()))
    return {"mean": float(np.mean(mads)), "max": max(mads)}


def pipeline_rates(flist: Path, names: list[str], threads: list[int], repeats: int) -> dict:
    """The whole loader (SPDL pipeline as the CLI builds it, batches of 32, files read from disk)
    of each variant at each thread count, against FFmpeg decode alone measured just before it,
    on one thread (the strict yardstick: the loader's rate over ``threads`` times it) and on as
    many threads as the loader; the variants take turns.

    Returns:
        ``{variant: {threads: {"loader_fps", "strict", "same_threads"}}}``: medians over the
        repeats of the loader's rate and of its ratios to the two yardsticks.
    """
    paths = [f"{flist.parent}/{line}" for line in flist.read_text().splitlines()]
    if "all prebuilt" in names:
        _PrebuiltCache.prebuild(paths)
    runs: dict = {name: {t: [] for t in threads} for name in names}
    for _ in range(repeats):
        for t in threads:
            for name in names:
                one, same = decode_only_rate(paths[:1000], 1), decode_only_rate(paths[: 1000 * t], t)
                with variant(name):
                    runs[name][t].append((loader_rate("spdl", flist, t, 32, 5), one * t, same))
    return {name: {str(t): {"loader_fps": statistics.median(r for r, _, _ in rs),
                            "strict": statistics.median(r / one for r, one, _ in rs),
                            "same_threads": statistics.median(r / same for r, _, same in rs)}
                   for t, rs in by_t.items()} for name, by_t in runs.items()}  # fmt: skip


def per_kind_table(paths: list[str], names: list[str], rounds: int, agreement_images: int) -> dict:
    """Each variant's per-kind rates (``compare_loaders.per_kind_rates``, one pass a round, the
    variants taking turns so that drifts hit them alike) and PIL agreement; prints the table."""
    if "all prebuilt" in names:
        _PrebuiltCache.prebuild(paths)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names:
            with variant(name):
                runs[name].append(per_kind_rates(paths, 1, first_pass=round_))
        print(f"round {round_ + 1}/{rounds} done", file=sys.stderr)
    agreement = {}
    for name in names if agreement_images else []:
        with variant(name):
            agreement[name] = pil_agreement(paths[:agreement_images])
    kinds, fields = list(runs[names[0]][0]), ("ratio", "loader_fps", "decode_only_fps")
    table = {name: {kind: {field: statistics.median(r[kind][field] for r in runs[name]) for field in fields}
                    | {"images": runs[name][0][kind]["images"]} for kind in kinds}
             for name in names}  # fmt: skip
    print("loader / decode-only, one thread, medians of the rounds:")
    print(f"  {'':28s}" + "".join(f"{name:>16s}" for name in names))
    for kind in kinds:
        print(f"  {kind:28s}" + "".join(f"{table[name][kind]['ratio']:16.2f}" for name in names))
    if agreement:
        print(f"  {'PIL agreement, MAD mean/max':28s}" + "".join(
            f"{agreement[name]['mean']:>10.3f}/{agreement[name]['max']:.2f}" for name in names))  # fmt: skip
    return {"variants": table, "rounds": runs, "pil_agreement": agreement}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--images", type=ic._count, default=2000, help="images in the generated set")
    parser.add_argument("--mix", choices=sorted(MIXES), default="imagenet", help="the set (compare_loaders.py --mix)")
    parser.add_argument("--rounds", type=ic._count, default=5)
    parser.add_argument("--agreement-images", type=ic._count, help="default 400 (--images if fewer)")
    parser.add_argument("--variants", nargs="*", choices=PER_IMAGE_VARIANTS, default=DEFAULT_VARIANTS)
    parser.add_argument("--pipeline-repeats", type=ic._count0, default=0, help="also time the whole loader so often")
    parser.add_argument("--pipeline-variants", nargs="+", choices=list(VARIANTS), default=["before", "current"])
    parser.add_argument("--max-threads", type=max_threads, default=2)
    args = parser.parse_args()
    if not args.variants and not args.pipeline_repeats:  # a mix_variants.json of nothing would replace the last one
        parser.error("argument --variants: no names, and no --pipeline-repeats: nothing to measure")
    if args.pipeline_repeats:
        check_image_count(parser, args.images, threads=args.max_threads)  # 5 warm-up batches of 32, 1 to time
    args.agreement_images = of_the_set(parser, "--agreement-images", args.agreement_images, 400, args.images)
    out_folder(parser, "--out", args.out)
    out_file(parser, "--out", args.out / "mix_variants.json")  # now, not after the run's minutes
    sub_folder(parser, "--out", args.out / "images")
    flist = make_image_set(args.out / "images", args.images, mix=args.mix)
    # A reused set's images that no longer decode are left out, counted; the loader needs its batches.
    flist, _ = decodable_set(parser, flist, args.images) if args.pipeline_repeats else decodable(flist)
    paths = [f"{flist.parent}/{line}" for line in flist.read_text().splitlines()]
    if not paths:
        parser.error(f"argument --images: {args.images}: none of the set's images decode ({flist})")
    out = {"mix": args.mix, "env": ic._environment(torch.device("cpu"))}
    if args.variants and args.rounds:
        out |= per_kind_table(paths, args.variants, args.rounds, args.agreement_images)
    if args.pipeline_repeats:
        threads = list(range(1, args.max_threads + 1))
        out["pipeline"] = pipeline_rates(flist, args.pipeline_variants, threads, args.pipeline_repeats)
        print("the loader: images/s, over threads x one thread's decode-only rate, over decode-only on as many threads")
        for name, by_t in out["pipeline"].items():
            print(f"  {name:8s} " + "; ".join(f"{t} thread(s) {r['loader_fps']:.0f}, {r['strict']:.2f}, "
                                             f"{r['same_threads']:.2f}" for t, r in by_t.items()))  # fmt: skip
    ic._write_atomically(args.out / "mix_variants.json", json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out / 'mix_variants.json'}")


if __name__ == "__main__":
    run(main)
