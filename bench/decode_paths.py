"""Why the FFmpeg loader is built the way it is: its alternatives, side by side in one run.

Part 1, one thread, per image, from bytes already in memory: FFmpeg decode alone (the
demuxer probing the format, as compare_loaders.py's yardstick does; then the JPEG demuxer
named; then without its parser, one packet per file; then as the loader decodes), and decode
+ resize + crop with each filter chain this project has used (a new filter graph per image,
then graphs cached per size, resizing packed RGB, 4:4:4 YUV or planar RGB, then only the
region the crop needs, then each decoding step above; the last row is the current path). The
yardstick is measured just before every row and each row is reported with that yardstick's
median and one ratio, the median of its per-round ratios to those. Each chain also gets its
largest mean absolute difference from PIL (decode, bicubic resize, crop) on the real demo photos.

Part 2, the whole loader (files read from disk): SPDL's ``aggregate`` stage versus batches
formed in the source (the current ``get_pipeline``), at 1..N threads. The loader against the
decode-only rate per core, the issue's target, is ``compare_loaders.py``'s figure.

Usage::

    python bench/decode_paths.py --out bench/out --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]

import numpy as np  # noqa: E402
import spdl.io  # noqa: E402
import torch  # noqa: E402
from cli_checks import max_threads, of_the_set, out_file, out_folder, run, sub_folder  # noqa: E402
from compare_loaders import check_image_count, decodable_set, make_image_set  # noqa: E402
from make_demo_data import make_demo_data  # noqa: E402
from spdl.pipeline import PipelineBuilder  # noqa: E402

import imagenet_classification as ic  # noqa: E402

T = ic.EvalTransform()


def _earlier_chain(kind: str) -> Callable[[int, int], str]:
    """Filter chains this project used before the current one, for the same geometry."""

    def chain(width: int, height: int) -> str:
        new_w, new_h, left, top = T.geometry(width, height)
        crop = f"crop={T.size}:{T.size}:{left}:{top}"
        scale = f"scale={new_w}:{new_h}:flags=bicubic+accurate_rnd+full_chroma_int"
        if kind == "rgb":
            return f"{scale},format=rgb24,{crop}"
        if kind == "planar":
            return f"scale={new_w}:{new_h}:flags=bicubic+full_chroma_int,format=gbrp,{crop},format=rgb24"
        return f"{scale},format=yuv444p,{crop},scale=flags=accurate_rnd,format=rgb24"

    return chain


YARDSTICK = "decode only (demuxer probed, as compare_loaders.py's yardstick)"
# How an image is demuxed and decoded: FFmpeg's defaults (the format probed), the JPEG demuxer
# named, the same without its parser (one packet per file), or as the module does (all that
# and, on x86-64, the Xvid IDCT).
PROBED, NAMED, ONE_PACKET, LOADER = "probed", "named", "one packet", "loader"
ROWS: dict[str, tuple[Callable[[int, int], str] | None, bool, str]] = {
    # name: (chain for a width and height or None to decode only, graphs cached per size, decoding)
    "decode only, JPEG demuxer named (no probe)": (None, False, NAMED),
    "decode only, the same without FFmpeg's JPEG parser (one packet per file)": (None, False, ONE_PACKET),
    "decode only, as the loader decodes (also the Xvid IDCT on x86-64)": (None, False, LOADER),
    "new graph per image, resize in packed RGB": (_earlier_chain("rgb"), False, PROBED),
    "cached graphs, resize in packed RGB": (_earlier_chain("rgb"), True, PROBED),
    "cached graphs, resize to 4:4:4 YUV, convert the crop": (_earlier_chain("yuv444"), True, PROBED),
    "cached graphs, resize to planar RGB, pack the crop": (_earlier_chain("planar"), True, PROBED),
    "cached graphs, resize only the crop's region to planar RGB": (T.ffmpeg_filter, True, PROBED),
    "the same, JPEG demuxer named": (T.ffmpeg_filter, True, NAMED),
    "the same, one packet per file": (T.ffmpeg_filter, True, ONE_PACKET),
    "the same, decoded as the loader decodes (current)": (T.ffmpeg_filter, True, LOADER),
}
CURRENT = "the same, decoded as the loader decodes (current)"  # through the module's own graph cache


def _graphs(name: str) -> _Graphs | ic._FilterGraphCache:
    """The row's filter graphs: the module's own cache for the current path (kept from a size's
    second image, 32 per thread), else this script's, cached per size or made per image."""
    chain, cached, _ = ROWS[name]
    return ic._FilterGraphCache(T) if name == CURRENT else _Graphs(chain, cached)


class _Graphs:
    """Filter graphs for one chain, cached per (size, pixel format) or built per image."""

    def __init__(self, chain: Callable[[int, int], str], cached: bool) -> None:
        self.chain, self.cached, self.graphs = chain, cached, {}

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        key = (frames.width, frames.height, frames.pix_fmt)
        graph = self.graphs.get(key) if self.cached else None
        if graph is None:
            src = f"buffer=video_size={key[0]}x{key[1]}:pix_fmt={key[2]}:time_base=1/25:pixel_aspect=1/1"
            graph = spdl.io.FilterGraph(f"{src},{self.chain(key[0], key[1])},buffersink")
            if self.cached:
                self.graphs[key] = graph
        graph.add_frames(frames)
        return graph.get_frames()


def _decode(data: bytes, decoding: str = PROBED) -> spdl.io.ImageFrames:
    """FFmpeg demux and decode, one of the ways in ``ROWS``."""
    if decoding == LOADER:
        return ic._decode_frames(data)
    config = {
        PROBED: None,
        NAMED: spdl.io.demux_config(format="jpeg_pipe"),
        ONE_PACKET: ic._ffmpeg_jpeg_configs()[0],
    }[decoding]
    return spdl.io.decode_packets(spdl.io.demux_image(data, demux_config=config), filter_desc=None)


def per_image_rate(datas: list[bytes], graphs: _Graphs | None, decoding: str = PROBED) -> float:
    """Images/s in this thread: decode alone (``graphs`` None) or decode + filter chain, after
    a short untimed warm-up on the same images."""

    def run(images: list[bytes]) -> None:
        for data in images:
            frames = _decode(data, decoding)
            if graphs is not None:
                graphs.apply(frames)

    run(datas[:50])
    started = time.perf_counter()
    run(datas)
    return len(datas) / (time.perf_counter() - started)


def pil_mad(paths: list[str], graphs: _Graphs, decoding: str) -> float:
    """Largest per-image mean absolute difference (0-255) from PIL's decode + resize + crop."""
    worst = 0.0
    for path in paths:
        frames = graphs.apply(_decode(Path(path).read_bytes(), decoding))
        ours = spdl.io.to_numpy(spdl.io.convert_frames([frames])).reshape(T.size, T.size, 3).astype(np.int16)
        worst = max(worst, float(np.abs(ours - ic._decode_pil(path, T).astype(np.int16)).mean()))
    return worst


def loader_rate(flist: Path, threads: int, in_source: bool, warmup: int = 5) -> float:
    """Images/s of the FFmpeg loader on the CPU, batching in the source or in an aggregate stage."""
    decode = ic.get_decode_func("cpu", T)
    src = ic.source(flist, f"{flist.parent}/")
    if in_source:
        pipeline = ic.get_pipeline(src, 32, decode, threads, 16, threads)
    else:
        builder = PipelineBuilder().add_source(src).aggregate(32, drop_last=False)
        pipeline = builder.pipe(decode, concurrency=threads).add_sink(16).build(num_threads=threads, max_failures=0)
    with pipeline.auto_stop():
        return ic.measure_loader(pipeline.get_iterator(timeout=120), torch.device("cpu"), warmup)


def part1_lines(rates: dict[str, list[float]], beside: dict[str, list[float]], mads: dict[str, float],
                images: int) -> list[str]:  # fmt: skip
    """Part 1's table: each row's median rate, the median of the yardstick measured just before
    it, and one ratio: the median over the rounds of the row's rate over that yardstick (paired,
    so a drift of the machine's speed cancels out; the ratio of the two medians can differ)."""
    lines = [f"Part 1, one thread ({images} images); ratio: median over the rounds of the row's rate / the "
             "yardstick's measured just before it",
             f"  {'':76s} images/s  yardstick beside it  ratio  max MAD vs PIL"]  # fmt: skip
    for name, row in rates.items():
        yardstick = beside.get(name, row)  # the yardstick's own row: all its measurements
        ratio = statistics.median(r / y for r, y in zip(row, yardstick, strict=True))
        mad = f"{mads[name]:.2f}" if name in mads else "-"
        lines.append(f"  {name:76s} {statistics.median(row):6.0f}   {statistics.median(yardstick):12.0f}"
                     f"         {ratio:5.2f}  {mad}")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--images", type=ic._count, default=2000, help="images in the generated set")
    parser.add_argument("--per-image", type=ic._count, help="images timed per chain in part 1 (default 500, "
                        "or --images if fewer; at most --images)")  # fmt: skip
    parser.add_argument("--repeats", type=ic._count, default=5)
    parser.add_argument("--max-threads", type=max_threads, default=os.cpu_count())
    args = parser.parse_args()
    check_image_count(parser, args.images, threads=args.max_threads)  # part 2's loader: 5 warm-up batches of 32
    args.per_image = of_the_set(parser, "--per-image", args.per_image, 500, args.images)
    out_folder(parser, "--out", args.out)
    out_file(parser, "--out", args.out / "decode_paths.json")  # now, not after the run's minutes
    for folder in ("images", "photos"):
        sub_folder(parser, "--out", args.out / folder)
    made = make_image_set(args.out / "images", args.images)
    flist, _ = decodable_set(parser, made, args.images)  # a reused set's images that no longer decode: left out
    datas = [(flist.parent / line).read_bytes() for line in flist.read_text().splitlines()[: args.per_image]]
    photos = make_demo_data(args.out / "photos", variants=4)
    photo_paths = [f"{photos.parent}/{line}" for line in photos.read_text().splitlines()]

    threads = list(range(1, args.max_threads + 1))
    part1: dict[str, list[float]] = {YARDSTICK: [], **{name: [] for name in ROWS}}
    beside: dict[str, list[float]] = {name: [] for name in ROWS}  # the yardstick measured just before each row
    part2: dict[str, list[float]] = {f"{where}, {t} thread(s)": [] for where in ("aggregate stage", "in source")
                                     for t in threads}  # fmt: skip
    for repeat in range(args.repeats):  # interleaved, so drifts hit every variant alike
        for name, (chain, _, decoding) in ROWS.items():  # the yardstick beside each row
            beside[name].append(per_image_rate(datas, None))
            part1[YARDSTICK].append(beside[name][-1])
            part1[name].append(per_image_rate(datas, chain and _graphs(name), decoding))
        for t in threads:
            for where, in_source in (("aggregate stage", False), ("in source", True)):
                part2[f"{where}, {t} thread(s)"].append(loader_rate(flist, t, in_source))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)

    # Each row against the yardstick measured just before it, the median of those ratios: a
    # drift of the machine's speed during the run cancels out.
    ratios = {name: statistics.median(r / y for r, y in zip(part1[name], beside[name], strict=True)) for name in ROWS}
    mads = {name: pil_mad(photo_paths, _graphs(name), decoding) for name, (chain, _, decoding) in ROWS.items() if chain}
    print("\n".join(part1_lines(part1, beside, mads, len(datas))))
    print("Part 2, the loader (SPDL pipeline, batches of 32):")
    for t in threads:
        aggs, srcs = (part2[f"{w}, {t} thread(s)"] for w in ("aggregate stage", "in source"))
        agg, src = statistics.median(aggs), statistics.median(srcs)
        ratio = statistics.median(s / a for s, a in zip(srcs, aggs, strict=True))  # paired, in each repeat
        print(f"  {t} thread(s): aggregate stage {agg:6.0f}, batched in source {src:6.0f} images/s: {ratio:.2f}x")
    out = {
        "decode_paths": part1,
        "vs_yardstick": ratios,  # the median of the per-round ratios
        "yardstick_beside": {name: statistics.median(v) for name, v in beside.items()},
        "pil_mad": mads,
        "loader": part2,
        "env": ic._environment(torch.device("cpu")),
    }
    ic._write_atomically(args.out / "decode_paths.json", json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out / 'decode_paths.json'}")


if __name__ == "__main__":
    run(main)
