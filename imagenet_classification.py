"""Benchmark loading ImageNet-style JPEGs from local disk and classifying them.

An SPDL pipeline reads a file list, decodes, resizes and centre-crops the images in a pool
of threads (FFmpeg on the CPU, or nvJPEG / NVDEC on the GPU) and moves each batch to the
device, while the main thread runs a timm model on the batches one after another. The run
reports steady-state throughput (images per second, after a warm-up) and top-1 / top-5
accuracy, and accounts for every listed image: classified, failed, or not reached.

A file list holds one image path per line; the class comes from the WordNet ID
(``nXXXXXXXX``) in the path, as in ImageNet's ``train/`` and sorted ``val/`` folders::

    cd /data/imagenet && find val -name '*.JPEG' > ~/imagenet.val.flist

Run the benchmark::

    python imagenet_classification.py --input-flist ~/imagenet.val.flist --prefix /data/imagenet/

On a machine without a GPU or without access to the model hub::

    python imagenet_classification.py --input-flist val.flist --prefix data/ \\
        --device cpu --model efficientnet_lite0 --checkpoint lite0.pth --no-compile

From a notebook, each stage can be used alone::

    from imagenet_classification import source, get_decode_func, get_pipeline, get_model, benchmark

Exit status: 0 success; 1 the run stopped on a failure (bad image in strict mode, too many
bad images, loader error); 2 bad arguments or input found before the run; 3 the loader
stalled; 130 / 143 interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import math
import os
import pickle
import platform
import re
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import spdl.io
import spdl.io.utils
import torch
from spdl.pipeline import (
    AsyncQueue,
    Pipeline,
    PipelineBuilder,
    PipelineFailure,
    StageInfo,
    StatsQueue,
    TaskHook,
    TaskStatsHook,
)
from torch import Tensor

__all__ = [
    # The seed's names, kept for notebooks.
    "entrypoint",
    "benchmark",
    "source",
    "get_decode_func",
    "get_pipeline",
    "get_model",
    "ModelBundle",
    "Classification",
    "Preprocessing",
    "get_mappings",
    "parse_wnid",
    # Source and decode.
    "count_list",
    "Shard",
    "EvalTransform",
    "resize_region",
    "FilterGraphCache",
    "DecodeTracker",
    "ImageDecodeError",
    "FileListError",
    "check_gpu_decoder",
    "PipelineStats",
    "jpeg_frame_type",
    "nvdec_can_take",
    "decode_ffmpeg_image",
    # The DataLoader baseline.
    "decode_pil",
    "PILDataset",
    "collate_pil",
    "get_torch_loader",
    "torch_loader_batches",
    # Model, loop, measurement, results.
    "resolve_device",
    "RunResult",
    "Progress",
    "Breakdown",
    "measure_loader",
    "measure_model",
    "init_distributed",
    "reduce_results",
    "print_summary",
    "print_breakdown",
    "print_pipeline_stats",
    "environment",
    "write_results",
]

_LG = logging.getLogger(__name__)

DEFAULT_MODEL = "mobilenetv3_large_100"
CLASS_TSV = Path(__file__).with_name("imagenet_class.tsv")
TRACE_BATCHES = 60  # --trace keeps traces small: only this many batches are run.
EXIT_FAILED, EXIT_USAGE, EXIT_STALLED = 1, 2, 3
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


class UsageError(Exception):
    """Bad arguments or input found before the run: printed as one line, exit status 2."""


class FileListError(UsageError):
    """A file-list line that cannot be used; the message names the list file and line."""


################################################################################
# Arguments
################################################################################


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See README.md for every flag, the output and the results file.",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--input-flist", type=Path, required=True, help="file with one image path per line")
    data.add_argument("--prefix", default="", help="prepended to every path in the list")
    data.add_argument("--max-samples", type=int, default=math.inf, help="use only the first N listed images")

    loader = parser.add_argument_group("loader")
    loader.add_argument("--batch-size", type=int, default=32)
    loader.add_argument("--num-threads", type=int, default=16, help="decode threads")
    loader.add_argument("--queue-size", type=int, default=16, help="decoded batches buffered ahead of the model")
    loader.add_argument(
        "--loader", choices=("spdl", "torch"), default="spdl",
        help="spdl: the SPDL pipeline; torch: PyTorch DataLoader + PIL in --num-threads worker processes (baseline)",
    )  # fmt: skip
    decoder = loader.add_mutually_exclusive_group()
    decoder.add_argument("--use-nvjpeg", action="store_true", help="decode on the GPU with nvJPEG")
    decoder.add_argument("--use-nvdec", action="store_true", help="decode on the GPU with NVDEC")

    model = parser.add_argument_group("model")
    model.add_argument("--model", default=DEFAULT_MODEL, help="any timm model name")
    model.add_argument("--checkpoint", type=Path, help="local state dict to load (no model hub access)")
    model.add_argument("--no-pretrained", action="store_false", dest="pretrained", help="random weights")
    model.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    model.add_argument("--no-compile", action="store_false", dest="compile", help="skip torch.compile")
    model.add_argument("--no-bf16", action="store_false", dest="use_bf16", help="run the model in float32")

    run = parser.add_argument_group("run")
    run.add_argument("--warmup-batches", type=int, default=20, help="batches left out of the FPS window")
    run.add_argument("--skip-bad", action="store_true", help="skip and count undecodable images")
    run.add_argument("--max-bad", type=_parse_max_bad, help="with --skip-bad: stop after N or P%% bad images")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds without a batch before giving up")
    run.add_argument("--breakdown", action="store_true", help="also time the loader alone and the model alone")
    run.add_argument("--stats-interval", type=float, default=-1,
                     help="log SPDL's own stage statistics every S seconds and when the pipeline ends")  # fmt: skip
    run.add_argument("--results-file", type=Path, help="write the result as JSON here")
    run.add_argument("--trace", type=Path, help=f"write PATH.json and PATH.pftrace ({TRACE_BATCHES} batches)")
    run.add_argument("--debug", action="store_true")

    args = parser.parse_args(argv)
    for name in ("batch_size", "num_threads", "queue_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_samples < 1:
        parser.error("--max-samples must be at least 1")
    if args.warmup_batches < 0 or args.timeout <= 0:
        parser.error("--warmup-batches must be >= 0 and --timeout > 0")
    if args.max_bad is not None and not args.skip_bad:
        parser.error("--max-bad only applies with --skip-bad")
    if args.loader == "torch" and (args.use_nvjpeg or args.use_nvdec):
        parser.error("--loader torch decodes with PIL on the CPU; it does not take --use-nvjpeg / --use-nvdec")
    if args.checkpoint is not None:
        args.pretrained = False
    return args


def _parse_max_bad(text: str) -> tuple[float, bool]:
    """Parse ``N`` or ``P%`` into ``(value, is_percent)``."""
    is_percent = text.endswith("%")
    try:
        value = float(text[:-1]) if is_percent else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or P%, got {text!r}") from None
    if value < 0 or (is_percent and value > 100):
        raise argparse.ArgumentTypeError(f"out of range: {text!r}")
    return value, is_percent


################################################################################
# Source: file list -> (path, class index)
################################################################################


def get_mappings() -> dict[str, int]:
    """Map each ILSVRC2012 WordNet ID to its class index.

    The index is the position of the WNID in sorted order, which public ImageNet models use.

    Example:
        >>> get_mappings()["n03709823"]
        636
    """
    mapping = {}
    with open(CLASS_TSV, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                index, wnid = line.split("\t")[:2]
                mapping[wnid] = int(index)
    return mapping


def parse_wnid(s: str) -> str:
    """Return the first WordNet ID (``n`` and 8 digits) in ``s``; ValueError if there is none."""
    if match := re.search(r"n\d{8}", s):
        return match.group(0)
    raise ValueError(f"no WordNet ID (nXXXXXXXX) in {s!r}")


def _labelled_lines(path: Path, mapping: dict[str, int]) -> Iterator[tuple[str, int]]:
    """Yield ``(line text, class index)`` for each non-blank line; FileListError on a bad one."""
    with open(path, encoding="utf-8", newline=None) as f:
        for lineno, line in enumerate(f, start=1):
            if not (text := line.strip()):
                continue
            try:
                wnid = parse_wnid(text)
            except ValueError:
                raise FileListError(f"{path}:{lineno}: no WordNet ID (nXXXXXXXX) in {text!r}") from None
            if wnid not in mapping:
                raise FileListError(f"{path}:{lineno}: {wnid} is not one of the 1000 ImageNet classes")
            yield text, mapping[wnid]


def source(
    path: Path | str,
    prefix: str = "",
    max_samples: float = float("inf"),
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[str, int]]:
    """Iterate a file list, yielding ``(prefix + line, class index)`` for each non-blank line.

    Lines are stripped of surrounding whitespace (CRLF included). The list is read lazily, so
    memory does not grow with its length.

    Args:
        path: The file list.
        prefix: Prepended to each line.
        max_samples: Use only the first this many images of the list (before sharding).
        rank, world_size: Yield only this rank's shard: images ``rank, rank + world_size, …``.
            Every image goes to exactly one rank; shards differ in length by at most one.

    Raises:
        FileListError: a line has no WordNet ID, or one outside the 1000 classes; the message
            names the list file and line number.
    """
    mapping = get_mappings()
    for i, (text, label) in enumerate(_labelled_lines(Path(path), mapping)):
        if i >= max_samples:
            return
        if i % world_size == rank:
            yield prefix + text, label


def count_list(path: Path | str, max_samples: float = float("inf")) -> int:
    """Check a whole file list and return how many images it lists (at most ``max_samples``).

    Raises:
        UsageError: the list is missing, unreadable or empty.
        FileListError: a line is bad (see :py:func:`source`).
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: file list not found" if not path.exists() else f"{path}: not a file")
    try:
        listed = sum(1 for _ in source(path, max_samples=max_samples))
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read file list ({e})") from None
    if listed == 0:
        raise UsageError(f"{path}: the file list has no image paths")
    return listed


@dataclass(frozen=True)
class Shard:
    """This process's place in a torchrun job (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Shard:
        """Read RANK, WORLD_SIZE and LOCAL_RANK, which torchrun sets for each process."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))

    def size_of(self, listed: int, rank: int | None = None) -> int:
        """How many of ``listed`` images fall to ``rank`` (default: this one)."""
        return len(range(self.rank if rank is None else rank, listed, self.world_size))


################################################################################
# Decode: paths -> uint8 N x 3 x H x W on the device
################################################################################

_FFMPEG_SCALE_FLAGS = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "neighbor", "lanczos": "lanczos"}


@dataclass(frozen=True)
class EvalTransform:
    """The standard evaluation transform: resize the shorter side, then centre-crop a square.

    Attributes:
        size: Side of the square crop fed to the model, in pixels.
        crop_pct: The shorter side is resized to ``floor(size / crop_pct)`` before cropping.
        interpolation: ``bicubic``, ``bilinear``, ``nearest`` or ``lanczos``.
        mean, std: Per-channel normalisation on the 0-1 scale, RGB order.
    """

    size: int = 224
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> EvalTransform:
        """Read size, crop_pct, interpolation, mean and std from a timm model's pretrained config."""
        import timm.data

        cfg = timm.data.resolve_data_config({}, model=model)
        return cls(
            size=int(cfg["input_size"][-1]),
            crop_pct=float(cfg["crop_pct"]),
            interpolation=str(cfg["interpolation"]),
            mean=tuple(float(v) for v in cfg["mean"]),
            std=tuple(float(v) for v in cfg["std"]),
        )

    @property
    def resize_short(self) -> int:
        return math.floor(self.size / self.crop_pct)

    def geometry(self, width: int, height: int) -> tuple[int, int, int, int]:
        """Return ``(resized width, resized height, crop left, crop top)`` for an input size.

        Rounding follows torchvision's ``Resize(int)`` and ``CenterCrop``, which timm uses.

        Raises:
            ValueError: a size is not positive (a corrupt image header).
        """
        if width <= 0 or height <= 0:
            raise ValueError(f"invalid image size {width}x{height}")
        short = self.resize_short
        if width <= height:
            new_w, new_h = short, int(short * height / width)
        else:
            new_w, new_h = int(short * width / height), short
        return new_w, new_h, round((new_w - self.size) / 2), round((new_h - self.size) / 2)

    def ffmpeg_filter(self, width: int, height: int) -> str:
        """FFmpeg filter chain from a decoded frame to the ``size x size`` RGB crop.

        Only the part of the frame that the crop needs is resized (see :py:func:`resize_region`),
        in one swscale pass that also converts to planar RGB (chroma upsampled and colour
        converted in the same pass); then the crop is packed to RGB24. For any decoded pixel
        format (YUV, grey, RGB). ``bench/decode_paths.py`` compares it with the chains it replaced
        for speed and agreement with PIL; tests/test_decode.py bounds the latter.
        """
        new_w, new_h, left, top = self.geometry(width, height)
        x0, src_w, out_w, pad_x = resize_region(width, new_w, left, self.size)
        y0, src_h, out_h, pad_y = resize_region(height, new_h, top, self.size)
        flags = f"{_FFMPEG_SCALE_FLAGS[self.interpolation]}+full_chroma_int"
        # exact=1: keep an odd full side as it is (the other side's region is even-sized).
        region = "" if (src_w, src_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"
        crop = f"crop={self.size}:{self.size}:{pad_x}:{pad_y}"
        return f"{region}scale={out_w}:{out_h}:flags={flags},format=gbrp,{crop},format=rgb24"


REGION_TOLERANCE = 0.06  # source pixels


def resize_region(length: int, resized: int, offset: int, crop: int) -> tuple[int, int, int, int]:
    """Along one side: the part of a frame to resize so that a crop of the resized frame comes
    out as if the whole frame had been resized, with less work.

    Resizing ``length`` source pixels to ``resized`` and keeping ``crop`` pixels from ``offset``
    samples the source at ``(offset + k + 0.5) * length / resized - 0.5`` for crop pixel ``k``.
    This finds a source region (even start and length, so 4:2:0 chroma stays aligned) and its
    resized length such that the crop, taken ``pad`` pixels into the resized region, samples the
    source within :py:data:`REGION_TOLERANCE` of those positions, with at least 4 resized pixels
    either side for the filter's support. The smallest such region wins; when there is none (or
    the image is enlarged, where the filter reaches further), the whole side is resized.

    Returns:
        ``(start, source length, resized length, pad)``; ``(0, length, resized, offset)`` for the
        whole side.
    """
    whole = (0, length, resized, offset)
    ratio = length / resized
    if ratio < 1:
        return whole
    best, best_out = whole, resized
    for pad in range(4, 17):
        for out in range(crop + pad + 4, min(crop + pad + 40, best_out)):
            src_len = 2 * round(out * ratio / 2)
            step = src_len / out
            ideal_start = (offset + 0.5) * ratio - (pad + 0.5) * step
            start = 2 * round(ideal_start / 2)
            if start < 0 or start + src_len > length:
                continue
            first = start - ideal_start  # sampling error of crop pixel 0, then of the last one
            if max(abs(first), abs(first + (crop - 1) * (step - ratio))) <= REGION_TOLERANCE:
                best, best_out = (start, src_len, out, pad), out
                break
    return best


class ImageDecodeError(RuntimeError):
    """An image that could not be read or decoded.

    Attributes:
        path: The image's path as listed (with the prefix).
        reason: Why, in words (the OS error or FFmpeg's message).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class DecodeTracker:
    """Thread-safe record of a decode function's work: failed images, and images in progress.

    Give one to :py:func:`get_decode_func` to skip bad images one by one (their batch-mates
    are kept, labels stay aligned) instead of raising :py:class:`ImageDecodeError`. What is in
    progress tells which file a stalled run is stuck on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: list[ImageDecodeError] = []
        self._in_progress: dict[int, tuple[str, float]] = {}
        self._fallbacks = 0

    def add_fallback(self) -> None:
        """Count an image that a GPU decoder could not take, decoded by FFmpeg instead."""
        with self._lock:
            self._fallbacks += 1

    @property
    def fallbacks(self) -> int:
        with self._lock:
            return self._fallbacks

    def add_failure(self, error: ImageDecodeError) -> None:
        with self._lock:
            self._failures.append(error)

    @property
    def failed(self) -> int:
        with self._lock:
            return len(self._failures)

    def failures(self) -> list[ImageDecodeError]:
        with self._lock:
            return list(self._failures)

    @contextlib.contextmanager
    def working_on(self, path: str) -> Iterator[None]:
        """Mark ``path`` as being read or decoded by this thread for the duration."""
        key = threading.get_ident()
        with self._lock:
            self._in_progress[key] = (path, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._in_progress.pop(key, None)

    def oldest_in_progress(self) -> tuple[str, float] | None:
        """``(path, seconds)`` of the image in progress for the longest time, or None."""
        with self._lock:
            if not self._in_progress:
                return None
            path, started = min(self._in_progress.values(), key=lambda v: v[1])
        return path, time.monotonic() - started


def _read_image_file(path: str) -> bytes:
    """Read an image file whole, turning every way it can be unusable into ImageDecodeError."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise ImageDecodeError(path, "is a directory, not an image file") from None
    except OSError as e:
        raise ImageDecodeError(path, e.strerror or str(e)) from None
    if not data:
        raise ImageDecodeError(path, "empty file (0 bytes)")
    # FFmpeg decodes a truncated JPEG with only a log line and grey rows at the bottom, which
    # would count a damaged image in the accuracy. Report it instead, as PIL does.
    if data[:2] == b"\xff\xd8" and _jpeg_truncated(data):
        raise ImageDecodeError(path, "truncated JPEG (no end-of-image marker)")
    return data


def _jpeg_header_markers(data: bytes) -> Iterator[tuple[int, int]]:
    """``(marker, offset)`` of each segment of JPEG data after its start-of-image marker, up to
    and including the first start-of-scan (0xDA). Walks the segments by their lengths, so the
    markers of an EXIF thumbnail inside an APP1 segment are skipped. Stops early where the data
    ends or is no longer a chain of segments."""
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        yield marker, i
        if marker == 0xDA:
            return
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")


def _jpeg_truncated(data: bytes) -> bool:
    """Whether JPEG data ends before its image does: it does not end with the end-of-image
    marker, and none follows the start of the image's first scan. Data after the image's end (a
    camera's trailer, a second image) is fine, as PIL has it."""
    if data.endswith(b"\xff\xd9"):  # almost every file: no walk
        return False
    scan = next((offset for marker, offset in _jpeg_header_markers(data) if marker == 0xDA), 2)
    return data.find(b"\xff\xd9", scan) == -1


class FilterGraphCache:
    """Per-thread FFmpeg filter graphs for one transform, one per input size and pixel format.

    Setting up a filter graph costs more than decoding a 500 x 375 JPEG, and ImageNet's images
    come in few sizes, so each thread keeps the graphs it built and feeds them frame after frame
    (output identical to a new graph per image). The least recently used graph beyond
    ``capacity`` per thread is dropped, so memory does not grow with the list.
    """

    def __init__(self, transform: EvalTransform, capacity: int = 32) -> None:
        self.transform, self.capacity = transform, capacity
        self._local = threading.local()

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        """Resize, convert and crop one decoded frame into a ``size x size`` RGB frame."""
        graphs: dict = self._local.__dict__.setdefault("graphs", {})
        key = (frames.width, frames.height, frames.pix_fmt)
        graph = graphs.pop(key, None)  # re-inserted below: the dict's order is the LRU order
        if graph is None:
            source = f"buffer=video_size={key[0]}x{key[1]}:pix_fmt={key[2]}:time_base=1/25:pixel_aspect=1/1"
            graph = spdl.io.FilterGraph(f"{source},{self.transform.ffmpeg_filter(key[0], key[1])},buffersink")
            if len(graphs) >= self.capacity:
                del graphs[next(iter(graphs))]
        graph.add_frames(frames)
        output = graph.get_frames()
        graphs[key] = graph  # only a graph that worked goes back into the cache
        if output is None:
            raise RuntimeError("the filter graph produced no frame")
        return output


def _spdl_reason(error: Exception) -> str:
    return str(error).split(" (/", 1)[0]  # drop SPDL's C++ source location


_JPEG_START = b"\xff\xd8\xff"  # start-of-image marker, then the next marker


def _decode_image(data: bytes) -> spdl.io.ImageFrames:
    """Demux and decode one image's bytes with FFmpeg, in the image's own pixel format.

    JPEG data (data starting with JPEG's start-of-image marker) goes straight to FFmpeg's JPEG
    demuxer, as one packet, and is decoded with the IDCT in :py:func:`_jpeg_configs`; any other
    data (a PNG saved as .JPEG, for example) is probed and decoded with FFmpeg's defaults. A
    file holding several frames gives its first. ``bench/decode_paths.py`` measures each choice."""
    if not data.startswith(_JPEG_START):
        # num_frames=1: the first frame of an animated GIF or PNG, as PIL gives; SPDL would
        # fail on "multiple frames" otherwise.
        return spdl.io.decode_packets(spdl.io.demux_image(data), filter_desc=None, num_frames=1)
    demux_config, decode_config = _jpeg_configs()
    packets = spdl.io.demux_image(data, demux_config=demux_config)
    return spdl.io.decode_packets(packets, filter_desc=None, decode_config=decode_config, num_frames=1)


@functools.cache
def _jpeg_configs() -> tuple[spdl.io.DemuxConfig, spdl.io.DecodeConfig | None]:
    """How JPEG data is demuxed and decoded. Made on first use, not at import: making a config
    loads SPDL's native library.

    - FFmpeg's JPEG demuxer named: no format probe (about 0.06 ms per image).
    - Without FFmpeg's JPEG parser (``fflags=noparse``), the whole file is one packet, as PIL
      reads it: the decoder stops at the first image's end, so a file with a second image
      after it (an MPO, or a phone photo's HDR gain map) decodes to its primary image, where
      the parser splits it in two and SPDL fails on "multiple frames". It also skips the
      parser's pass over the bytes (about 0.04 ms per image).
    - On x86-64, FFmpeg's Xvid IDCT (SSE2): decoding 1.05x faster than with the default IDCT
      and slightly closer to PIL's (libjpeg's accurate integer IDCT). Elsewhere (ARM has no
      SIMD Xvid IDCT) FFmpeg picks.
    """
    demux_config = spdl.io.demux_config(format="jpeg_pipe", format_options={"fflags": "noparse"})
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return demux_config, None
    return demux_config, spdl.io.decode_config(decoder_options={"idct": "xvid"})


def _decode_ffmpeg(path: str, graphs: FilterGraphCache, data: bytes | None = None) -> spdl.io.VideoFrames:
    """Decode one image (its file's bytes, if already read) with FFmpeg into a ``size x size`` RGB frame."""
    data = _read_image_file(path) if data is None else data
    try:
        frames = _decode_image(data)
    # What SPDL raises for FFmpeg's errors, and its InternalError (an AssertionError) for data
    # it did not expect: either way this image, not the run.
    except (RuntimeError, ValueError, IndexError, AssertionError) as e:
        raise ImageDecodeError(path, f"FFmpeg cannot decode it: {_spdl_reason(e)}") from None
    # Corrupt data can decode to no frame at all, which would fail the whole batch's conversion;
    # so does an animated WebP, which FFmpeg's WebP decoder does not take.
    if frames.width <= 0:
        raise ImageDecodeError(path, "FFmpeg cannot decode it: no frame decoded (corrupt data, or an animated WebP)")
    try:
        return graphs.apply(frames)
    except (RuntimeError, ValueError) as e:  # e.g. a corrupt header declaring a 0 x 0 image
        raise ImageDecodeError(path, f"FFmpeg cannot decode it: {_spdl_reason(e)}") from None


def _decode_items(
    items: list[tuple[str, int]],
    decode_one: Callable[[str], object],
    tracker: DecodeTracker | None,
) -> tuple[list[object], list[int]]:
    """Decode each item; a failure raises, or is recorded and skipped if ``tracker`` is given."""
    decoded, labels = [], []
    for path, label in items:
        try:
            with tracker.working_on(path) if tracker else contextlib.nullcontext():
                decoded.append(decode_one(path))
        except ImageDecodeError as e:
            if tracker is None:
                raise
            tracker.add_failure(e)
            continue
        labels.append(label)
    return decoded, labels


def _cuda_config(device: torch.device) -> spdl.io.CUDAConfig:
    """SPDL's CUDA config that allocates through torch's caching allocator."""
    return spdl.io.cuda_config(
        device_index=device.index or 0,
        allocator=(torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete),
    )


def _label_tensor(labels: list[int], device: torch.device) -> Tensor:
    return torch.tensor(labels, dtype=torch.int64).view(-1, 1).to(device, non_blocking=True)


def _empty_batch(transform: EvalTransform, device: torch.device) -> tuple[Tensor, Tensor]:
    images = torch.empty((0, 3, transform.size, transform.size), dtype=torch.uint8, device=device)
    return images, _label_tensor([], device)


def _ffmpeg_decode_func(
    transform: EvalTransform, device: torch.device, tracker: DecodeTracker | None
) -> Callable[[list[tuple[str, int]]], tuple[Tensor, Tensor]]:
    cuda_config = _cuda_config(device) if device.type == "cuda" else None
    graphs = FilterGraphCache(transform)

    def decode_batch_ffmpeg(items: list[tuple[str, int]]) -> tuple[Tensor, Tensor]:
        frames, labels = _decode_items(items, lambda p: _decode_ffmpeg(p, graphs), tracker)
        if not frames:
            return _empty_batch(transform, device)
        buffer = spdl.io.convert_frames(frames)  # one N x 1 x H x W x 3 uint8 host buffer
        if cuda_config is not None:
            buffer = spdl.io.transfer_buffer(buffer, device_config=cuda_config)
        # NHWC memory seen as NCHW: the channels-last layout convolutions prefer.
        return spdl.io.to_torch(buffer).squeeze(1).permute(0, 3, 1, 2), _label_tensor(labels, device)

    return decode_batch_ffmpeg


def _resize_crop_on_device(image: Tensor, transform: EvalTransform) -> Tensor:
    """Resize a 3 x H x W uint8 image on its device and centre-crop it, like the FFmpeg path."""
    height, width = image.shape[-2:]
    new_w, new_h, left, top = transform.geometry(width, height)
    # torch has no lanczos; bicubic is the closest antialiased kernel.
    mode = "bicubic" if transform.interpolation == "lanczos" else transform.interpolation
    resized = torch.nn.functional.interpolate(
        image[None].float(), size=(new_h, new_w), mode=mode, antialias=mode != "nearest"
    )
    crop = resized[0, :, top : top + transform.size, left : left + transform.size]
    return crop.round_().clamp_(0, 255).to(torch.uint8)


def decode_ffmpeg_image(path: str, graphs: FilterGraphCache, device: torch.device, data: bytes) -> Tensor:
    """One image decoded by FFmpeg as uint8 ``3 x size x size`` on ``device``: a GPU decoder's fallback."""
    size = graphs.transform.size
    image = spdl.io.to_torch(spdl.io.convert_frames([_decode_ffmpeg(path, graphs, data)])).view(size, size, 3)
    return image.permute(2, 0, 1).to(device)


def _gpu_batch_func(
    decode_one: Callable[[str], Tensor], transform: EvalTransform, device: torch.device, tracker: DecodeTracker | None
) -> Callable[[list[tuple[str, int]]], tuple[Tensor, Tensor]]:
    """Batch a per-image GPU decoder: images stacked on ``device``, failures as for FFmpeg."""

    def decode_batch_gpu(items: list[tuple[str, int]]) -> tuple[Tensor, Tensor]:
        with torch.cuda.device(device):
            images, labels = _decode_items(items, decode_one, tracker)
            if not images:
                return _empty_batch(transform, device)
            return torch.stack(images), _label_tensor(labels, device)

    return decode_batch_gpu


def _nvjpeg_decode_func(
    transform: EvalTransform, device: torch.device, tracker: DecodeTracker | None
) -> Callable[[list[tuple[str, int]]], tuple[Tensor, Tensor]]:
    if spdl.io.utils.built_with_nvjpeg():
        cuda_config = _cuda_config(device)

        def decode_gpu(data: bytes) -> Tensor:
            return spdl.io.to_torch(spdl.io.decode_image_nvjpeg(data, device_config=cuda_config, pix_fmt="rgb"))
    else:
        import torchvision.io

        def decode_gpu(data: bytes) -> Tensor:
            encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return torchvision.io.decode_jpeg(encoded, mode=torchvision.io.ImageReadMode.RGB, device=device)

    graphs = FilterGraphCache(transform)

    def decode_one(path: str) -> Tensor:
        data = _read_image_file(path)
        try:
            image = decode_gpu(data)
        except RuntimeError:  # not a JPEG nvJPEG takes (PNG data, CMYK, corrupt): FFmpeg decides
            if tracker is not None:
                tracker.add_fallback()
            return decode_ffmpeg_image(path, graphs, device, data)
        return _resize_crop_on_device(image, transform)

    return _gpu_batch_func(decode_one, transform, device, tracker)


def jpeg_frame_type(data: bytes) -> int | None:
    """The JPEG start-of-frame marker (0xC0 baseline, 0xC2 progressive, …), or None if not JPEG."""
    if data[:2] != b"\xff\xd8":
        return None
    for marker, _ in _jpeg_header_markers(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn, not DHT/JPG/DAC
            return marker
        if marker == 0xDA:  # start of scan before any frame header: corrupt
            return None
    return None


def nvdec_can_take(data: bytes, codec_name: str, pix_fmt: str) -> bool:
    """NVDEC decodes sequential (baseline or extended) JPEGs with 4:2:0 chroma, nothing else."""
    return codec_name == "mjpeg" and pix_fmt in ("yuvj420p", "yuv420p") and jpeg_frame_type(data) in (0xC0, 0xC1)


def _nvdec_decode_func(
    transform: EvalTransform, device: torch.device, tracker: DecodeTracker | None
) -> Callable[[list[tuple[str, int]]], tuple[Tensor, Tensor]]:
    cuda_config = _cuda_config(device)
    graphs = FilterGraphCache(transform)

    def decode_one(path: str) -> Tensor:
        data = _read_image_file(path)
        try:
            packets = spdl.io.demux_video(data)
        except (RuntimeError, ValueError, IndexError) as e:
            raise ImageDecodeError(path, f"FFmpeg cannot read it: {_spdl_reason(e)}") from None
        if not nvdec_can_take(data, packets.codec.name, packets.codec.pix_fmt):
            if tracker is not None:
                tracker.add_fallback()
            return decode_ffmpeg_image(path, graphs, device, data)
        try:
            new_w, new_h, left, top = transform.geometry(packets.width, packets.height)
            buffer = spdl.io.decode_packets_nvdec(
                packets, device_config=cuda_config, pix_fmt="rgb", scale_width=new_w, scale_height=new_h
            )
        except (RuntimeError, ValueError) as e:
            raise ImageDecodeError(path, f"NVDEC cannot decode it: {_spdl_reason(e)}") from None
        frame = spdl.io.to_torch(buffer)[0]  # 3 x H x W
        return frame[:, top : top + transform.size, left : left + transform.size]

    return _gpu_batch_func(decode_one, transform, device, tracker)


def _probe_nvdec(device: torch.device) -> None:
    """Decode a small 4:2:0 JPEG with NVDEC; UsageError if this GPU or driver cannot."""
    import io

    from PIL import Image

    encoded = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 80, 40)).save(encoded, format="JPEG", subsampling=2)
    try:
        packets = spdl.io.demux_video(encoded.getvalue())
        spdl.io.decode_packets_nvdec(packets, device_config=_cuda_config(device), pix_fmt="rgb")
    except (RuntimeError, ValueError) as e:
        raise UsageError(
            f"--use-nvdec: NVDEC cannot decode a JPEG on {torch.cuda.get_device_name(device)} "
            f"({_spdl_reason(e)}); drop the flag to decode with FFmpeg"
        ) from None


def get_decode_func(
    device: torch.device | str = "cpu",
    transform: EvalTransform | None = None,
    decoder: str = "ffmpeg",
    tracker: DecodeTracker | None = None,
) -> Callable[[list[tuple[str, int]]], tuple[Tensor, Tensor]]:
    """Return a function that decodes a batch of ``(path, label)`` items.

    The function returns ``(images, labels)``: images uint8 of shape ``N x 3 x size x size``
    (RGB, channels-last in memory) and labels int64 of shape ``N x 1``, both on ``device``.
    With FFmpeg on CUDA, the decoded batch is copied through SPDL's CUDA transfer using
    torch's caching allocator; on the CPU there is no copy.

    Args:
        device: Where the batch is delivered.
        transform: Resize and crop to apply (default: 224 crop of 256, bicubic).
        decoder: ``ffmpeg`` (CPU), ``nvjpeg`` or ``nvdec`` (GPU; call
            :py:func:`check_gpu_decoder` first for a clear message if unavailable).
        tracker: If given, undecodable images are recorded there and left out of the batch,
            the rest kept with their labels. If None, the first one raises ImageDecodeError.
    """
    device = torch.device(device)
    transform = transform or EvalTransform()
    factories = {"ffmpeg": _ffmpeg_decode_func, "nvjpeg": _nvjpeg_decode_func, "nvdec": _nvdec_decode_func}
    if decoder not in factories:
        raise ValueError(f"unknown decoder {decoder!r}; expected one of {sorted(factories)}")
    return factories[decoder](transform, device, tracker)


def check_gpu_decoder(decoder: str, device: torch.device) -> str:
    """Check that a GPU decoder can run here; return the backend's name, or raise UsageError."""
    if decoder == "ffmpeg":
        return "ffmpeg"
    flag = f"--use-{decoder}"
    if device.type != "cuda" or not torch.cuda.is_available():
        raise UsageError(f"{flag} decodes on a CUDA GPU, but this run uses {device}; drop {flag} to decode with FFmpeg")
    if decoder == "nvjpeg":
        return "nvjpeg-spdl" if spdl.io.utils.built_with_nvjpeg() else "nvjpeg-torchvision"
    if not spdl.io.utils.built_with_nvcodec():
        raise UsageError(
            f"{flag}: the installed SPDL ({_version('spdl')}) is built without NVDEC support; "
            "install an SPDL build with NVDEC or drop the flag to decode with FFmpeg"
        )
    _probe_nvdec(device)
    return "nvdec"


################################################################################
# Pipeline
################################################################################


class _TimedQueue(StatsQueue):
    """SPDL's ``StatsQueue`` (its logs unchanged) that also keeps, from its stage's start or the
    last :py:meth:`restart` up to the last ``get`` from it, how long it was empty and how long
    ``get`` waited: SPDL's own figures for a queue stop when its stage ends, which for the sink
    queue is before the model has taken every batch."""

    def __init__(self, info: StageInfo, *, buffer_size: int = 1, interval: float = -1) -> None:
        super().__init__(info, buffer_size=buffer_size, interval=interval)
        self._lock = threading.Lock()  # restart() comes from the consumer's thread
        self.started: float | None = None
        self.empty_since: float | None = None
        self.empty_s = 0.0
        self.gets = 0
        self.get_wait_s = 0.0
        self.last_get: float | None = None

    def restart(self) -> None:
        """Count afresh from now."""
        with self._lock:
            self.started = now = time.monotonic()
            self.empty_s, self.gets, self.get_wait_s, self.last_get = 0.0, 0, 0.0, None
            self.empty_since = now if self.qsize() == 0 else None

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        with self._lock:
            self.started = self.empty_since = time.monotonic()
        async with super().stage_hook():
            yield

    async def put(self, item: object) -> None:
        with self._lock:
            if self.empty_since is not None:
                self.empty_s += time.monotonic() - self.empty_since
                self.empty_since = None
        await super().put(item)

    async def get(self) -> object:
        t0 = time.monotonic()
        item = await super().get()
        with self._lock:
            self.last_get = now = time.monotonic()
            self.gets += 1
            self.get_wait_s += now - max(t0, self.started or t0)  # a wait across a restart counts from it
            if self.qsize() == 0:
                self.empty_since = now
        return item

    def occupancy(self) -> float:
        """Fraction of the time from the start to the last ``get`` that a batch was waiting."""
        if self.started is None or self.last_get is None or self.last_get <= self.started:
            return 0.0
        empty = self.empty_s + (self.last_get - self.empty_since if self.empty_since is not None else 0.0)
        return max(0.0, 1.0 - empty / (self.last_get - self.started))


class PipelineStats:
    """Collect SPDL's per-stage statistics through the builder's public hooks, for a summary at
    the end of the run (SPDL's own logs, periodic with ``--stats-interval``, are kept).

    Read as SPDL's performance guide does: a sink queue that almost always holds a batch means the
    loader runs ahead of the model; one that is almost always empty means the model is starved and
    loading is the bottleneck. Each stage's average task time says which stage costs the most.
    Task times cover the pipeline's whole life (a task costs what it costs). The sink queue's
    figures do too, or start at the last :py:meth:`start_window`: pass that as
    :py:func:`benchmark`'s ``sync_clocks`` and they cover the FPS window, leaving out a warm-up
    whose minutes of compilation would otherwise read as a loader far ahead of the model.
    """

    def __init__(self, interval: float = -1) -> None:
        self.interval = interval
        self.hooks: list[TaskStatsHook] = []
        self.queues: list[_TimedQueue] = []

    def task_hooks(self, info: StageInfo) -> list[TaskHook]:
        """``task_hook_factory`` for :py:meth:`PipelineBuilder.build`."""
        hook = TaskStatsHook(info, interval=self.interval)
        self.hooks.append(hook)
        return [hook]

    def queue(self, info: StageInfo, *, buffer_size: int = 1) -> AsyncQueue:
        """``queue_class`` for :py:meth:`PipelineBuilder.build`; the last one made is the sink's."""
        q = _TimedQueue(info, buffer_size=buffer_size, interval=self.interval)
        self.queues.append(q)
        return q

    def start_window(self) -> None:
        """Measure the sink queue from now on, leaving out what came before (e.g. the warm-up)."""
        for q in self.queues:
            q.restart()

    def summary(self) -> dict | None:
        """``stages`` (name, tasks, failures, average task seconds) and the ``sink_queue``'s
        occupancy and average wait per ``get``; None if no pipeline was built with these hooks."""
        if not self.queues:
            return None
        sink = self.queues[-1]
        return {
            "stages": [
                {
                    "name": h.info.stage_name,
                    "concurrency": h.info.concurrency,
                    "tasks": h.num_tasks,
                    "failures": h.num_tasks - h.num_success,
                    "ave_task_s": h.ave_time,
                }
                for h in self.hooks
            ],
            "sink_queue": {
                "items": sink.gets,
                "occupancy": sink.occupancy(),
                "ave_get_wait_s": sink.get_wait_s / sink.gets if sink.gets else 0.0,
            },
        }


def _batched(items: Iterable[tuple[str, int]], batch_size: int) -> Iterator[list[tuple[str, int]]]:
    """Lists of ``batch_size`` items in order, the last one shorter if need be."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def get_pipeline(
    src: Iterable[tuple[str, int]],
    batch_size: int,
    decode_func: Callable[[list[tuple[str, int]]], tuple[Tensor, Tensor]],
    concurrency: int,
    buffer_size: int,
    num_threads: int,
    report_stats_interval: float = -1,
    stats: PipelineStats | None = None,
) -> Pipeline:
    """Build the loading pipeline: source -> aggregate -> pipe(decode) -> sink.

    Items are aggregated into batches as the source yields them, so SPDL's event loop hands
    over one list per batch rather than each item through an ``aggregate`` stage: 1.02-1.08x
    the images/s with one decode thread, 1.14-1.37x with two on two cores (``bench/decode_paths.py``).
    The last, partial batch is kept. Any exception escaping ``decode_func`` stops the pipeline
    (``max_failures=0``) instead of SPDL's default of dropping that batch and going on.

    Args:
        src: ``(path, label)`` items, e.g. from :py:func:`source`.
        batch_size: Items per batch.
        decode_func: From :py:func:`get_decode_func`.
        concurrency: Batches decoded at once.
        buffer_size: Decoded batches held ready for the consumer.
        num_threads: Threads in the pipeline's pool.
        report_stats_interval: Seconds between SPDL's stage statistics logs (-1: none until
            each stage ends, when SPDL always logs them at INFO); taken from ``stats`` when given.
        stats: Collects the stage statistics for :py:meth:`PipelineStats.summary`.
    """
    hooks = {}
    if stats is not None:
        hooks = {"queue_class": stats.queue, "task_hook_factory": stats.task_hooks}
        report_stats_interval = stats.interval
    return (
        PipelineBuilder()
        .add_source(_batched(src, batch_size))
        .pipe(decode_func, concurrency=concurrency, name="decode")
        .add_sink(buffer_size)
        .build(num_threads=num_threads, max_failures=0, report_stats_interval=report_stats_interval, **hooks)
    )


################################################################################
# Baseline loader: PyTorch DataLoader with PIL, for comparison on identical work
################################################################################

_PIL_RESAMPLE = {"bilinear": 2, "bicubic": 3, "nearest": 0, "lanczos": 1}  # PIL.Image.Resampling values


def decode_pil(path: str, transform: EvalTransform):
    """Decode one image with PIL and apply the same resize and crop; uint8 ``size x size x 3``."""
    import io

    import numpy as np
    from PIL import Image

    data = _read_image_file(path)
    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
        new_w, new_h, left, top = transform.geometry(*rgb.size)  # ValueError for a 0 x 0 header
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageDecodeError(path, f"PIL cannot decode it: {e}") from None
    resized = rgb.resize((new_w, new_h), _PIL_RESAMPLE[transform.interpolation])
    return np.asarray(resized.crop((left, top, left + transform.size, top + transform.size)))


class PILDataset(torch.utils.data.IterableDataset):
    """The file list decoded by PIL in DataLoader workers; each worker takes every n-th image.

    Yields ``(image or None, label, path, failure reason or None)``; see :py:func:`collate_pil`.
    """

    def __init__(self, flist: Path, prefix: str, max_samples: float, transform: EvalTransform, shard: Shard) -> None:
        super().__init__()
        self.flist, self.prefix, self.max_samples = flist, prefix, max_samples
        self.transform, self.shard = transform, shard

    def __iter__(self) -> Iterator[tuple]:
        worker = torch.utils.data.get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker else (0, 1)
        items = source(self.flist, self.prefix, self.max_samples, rank=self.shard.rank,
                       world_size=self.shard.world_size)  # fmt: skip
        for i, (path, label) in enumerate(items):
            if i % workers == worker_id:
                try:
                    yield decode_pil(path, self.transform), label, path, None
                except ImageDecodeError as e:
                    yield None, label, path, e.reason


def collate_pil(samples: list[tuple]) -> tuple[Tensor, Tensor, list[tuple[str, str]]]:
    """Batch decoded samples like the SPDL path (channels-last NCHW uint8, N x 1 labels); keep failures."""
    import numpy as np

    good = [(image, label) for image, label, _, reason in samples if reason is None]
    failures = [(path, reason) for _, _, path, reason in samples if reason is not None]
    if not good:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty((0, 1), dtype=torch.int64), failures
    images = torch.from_numpy(np.stack([image for image, _ in good])).permute(0, 3, 1, 2)
    return images, torch.tensor([[label] for _, label in good], dtype=torch.int64), failures


def torch_loader_batches(
    loader: torch.utils.data.DataLoader, device: torch.device, tracker: DecodeTracker | None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Move the DataLoader's batches to the device and record its failures in ``tracker``.

    Raises:
        TimeoutError: no batch within the DataLoader's ``timeout``.
    """
    batches = iter(loader)
    while True:
        try:
            images, labels, failures = next(batches)
        except StopIteration:
            return
        except RuntimeError as e:
            if "timed out" in str(e):  # the DataLoader's own time-out
                raise TimeoutError(str(e)) from None
            raise
        for path, reason in failures:
            if tracker is None:
                raise ImageDecodeError(path, reason)
            tracker.add_failure(ImageDecodeError(path, reason))
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def get_torch_loader(
    dataset: PILDataset, batch_size: int, num_workers: int, device: torch.device, timeout: float
) -> torch.utils.data.DataLoader:
    """A DataLoader over ``dataset`` in ``num_workers`` processes, pinned memory on CUDA."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_pil,
        pin_memory=device.type == "cuda", timeout=timeout if num_workers else 0,
    )  # fmt: skip


################################################################################
# Model: normalise -> timm model -> top-1 / top-5 counts
################################################################################


class Preprocessing(torch.nn.Module):
    """Turn uint8 images (0-255) into normalised float32; mean and std broadcast over N, H, W."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        """x: uint8 ``N x 3 x H x W``. Returns float32 of the same shape."""
        return (x.float() / 255.0 - self.mean) / self.std


class Classification(torch.nn.Module):
    """Count top-1 and top-5 hits of logits against labels."""

    def forward(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """logits: ``N x C``; labels: int64 ``N x 1`` (a label of -1 never matches).

        Returns:
            Two 0-d int64 tensors on the logits' device: top-1 and top-5 correct counts.
        """
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        hits = top == labels
        return hits[:, :1].sum(), hits.sum()


class ModelBundle(torch.nn.Module):
    """Preprocessing, the timm model and Classification in one module.

    Attributes:
        transform: The evaluation transform the model expects (from its pretrained config).
        batch_size: If set (when compiled), smaller batches are padded to it so the compiled
            graph is reused; padded rows get label -1 and are never counted.
    """

    def __init__(
        self,
        preprocessing: torch.nn.Module,
        model: torch.nn.Module,
        classification: torch.nn.Module,
        dtype: torch.dtype,
        transform: EvalTransform,
        batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.preprocessing, self.model, self.classification = preprocessing, model, classification
        self.dtype, self.transform, self.batch_size = dtype, transform, batch_size

    def forward(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """images: uint8 ``N x 3 x H x W``; labels: int64 ``N x 1``. Returns top-1, top-5 counts."""
        if self.batch_size is not None and 0 < images.shape[0] < self.batch_size:
            pad = self.batch_size - images.shape[0]
            images = torch.cat([images, images.new_zeros((pad, *images.shape[1:]))])
            labels = torch.cat([labels, labels.new_full((pad, 1), -1)])
        x = self.preprocessing(images).to(self.dtype)
        return self.classification(self.model(x).float(), labels)


def resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """Turn ``--device`` into a checked device.

    ``auto`` is ``cuda:LOCAL_RANK`` if CUDA is available, else ``cpu``; ``cuda`` without an
    index is ``cuda:LOCAL_RANK`` (``local_rank`` is 0 outside torchrun).
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"--device: {spec!r} is not a device (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {spec}: CUDA is not available on this machine; use --device cpu")
        device = torch.device("cuda", local_rank if device.index is None else device.index)
        if device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif device.type != "cpu":
        raise UsageError(f"--device {spec}: only cpu and cuda devices are supported")
    return device


def _load_checkpoint(model: torch.nn.Module, path: Path) -> None:
    """Load a local state dict safely (weights only), naming the first key that does not fit."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, pickle.UnpicklingError) as e:  # unreadable, not a zip, unsafe
        raise UsageError(f"{path}: cannot load checkpoint ({str(e).splitlines()[0]})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"{path}: not a state dict (found {type(state).__name__})")
    expected = model.state_dict()
    for key, value in expected.items():
        if key not in state:
            raise UsageError(f"{path}: checkpoint lacks {key!r}, which {type(model).__name__} needs")
        if tuple(state[key].shape) != tuple(value.shape):
            raise UsageError(
                f"{path}: {key!r} has shape {tuple(state[key].shape)} in the checkpoint, "
                f"the model expects {tuple(value.shape)}"
            )
    if extra := [k for k in state if k not in expected]:
        raise UsageError(f"{path}: checkpoint has {len(extra)} key(s) the model lacks, first {extra[0]!r}")
    model.load_state_dict(state)


def get_model(
    model_name: str = DEFAULT_MODEL,
    device: torch.device | str = "cpu",
    *,
    pretrained: bool = True,
    checkpoint: Path | str | None = None,
    compile: bool = True,
    use_bf16: bool = True,
    batch_size: int | None = None,
) -> ModelBundle:
    """Build the model bundle: normalisation, a timm model in eval mode, top-k counting.

    Args:
        model_name: Any name ``timm.create_model`` accepts.
        device: Where the model runs.
        pretrained: Load timm's pretrained weights (from the model hub or its cache).
        checkpoint: A local state dict to load instead; no hub access.
        compile: ``torch.compile`` the model and the normalisation (mode ``max-autotune``).
        use_bf16: Run the model in bfloat16.
        batch_size: With ``compile``, pad smaller batches to this size (see ModelBundle).
    """
    import timm

    device = torch.device(device)
    try:
        model = timm.create_model(model_name, pretrained=pretrained and checkpoint is None)
    except RuntimeError as e:  # timm: unknown model
        raise UsageError(f"--model {model_name}: {e}") from None
    except OSError as e:  # the hub is out of reach and the weights are not in its cache
        raise UsageError(
            f"--model {model_name}: cannot get its pretrained weights ({type(e).__name__}); "
            "pass --checkpoint PATH for local weights, or --no-pretrained for random ones"
        ) from None
    if checkpoint is not None:
        _load_checkpoint(model, Path(checkpoint))
    transform = EvalTransform.from_model(model)
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    model = model.eval().to(device=device, dtype=dtype)
    preprocessing = Preprocessing(transform.mean, transform.std).to(device)
    if compile:
        model = torch.compile(model, mode="max-autotune")
        preprocessing = torch.compile(preprocessing, mode="max-autotune")
    return ModelBundle(
        preprocessing, model, Classification(), dtype, transform, batch_size=batch_size if compile else None
    )


################################################################################
# Timed loop and its result
################################################################################


@dataclass
class RunResult:
    """What a run measured. ``classified + failed + not_reached == listed`` always holds.

    Attributes:
        listed: Images in the list (after ``--max-samples``); None when the loop was given an
            iterator of unknown length.
        classified: Images that went through the model.
        failed: Images that could not be decoded (see ``failures``).
        top1_correct, top5_correct: Hits among ``classified``.
        frames_timed, elapsed_s: Images and seconds in the FPS window (after the warm-up).
        decoder_fallbacks: Images a GPU decoder could not take, decoded by FFmpeg instead.
        partial: The run stopped before every listed image was classified or failed.
        stop_reason: Why it stopped early, or None.
    """

    listed: int | None
    classified: int = 0
    failed: int = 0
    top1_correct: int = 0
    top5_correct: int = 0
    frames_timed: int = 0
    elapsed_s: float = 0.0
    batches: int = 0
    decoder_fallbacks: int = 0
    warmup_included: bool = False
    partial: bool = False
    stop_reason: str | None = None
    failures: list[dict[str, str]] = field(default_factory=list)

    def record_failures(self, failures: list[ImageDecodeError]) -> None:
        self.failed = len(failures)
        self.failures = [{"path": f.path, "reason": f.reason} for f in failures]

    @property
    def not_reached(self) -> int:
        return 0 if self.listed is None else self.listed - self.classified - self.failed

    @property
    def fps(self) -> float:
        return self.frames_timed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def top1(self) -> float:
        return self.top1_correct / self.classified if self.classified else 0.0

    @property
    def top5(self) -> float:
        return self.top5_correct / self.classified if self.classified else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "not_reached": self.not_reached, "fps": self.fps, "top1": self.top1, "top5": self.top5}


class RunStopped(Exception):
    """Raised inside the loop to end a run early; ``exit_code`` says how the process exits."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.reason, self.exit_code = reason, exit_code


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a run. A KeyboardInterrupt, so that no library swallows it."""

    def __init__(self, signum: int) -> None:
        self.reason = f"interrupted by {signal.Signals(signum).name}"
        super().__init__(self.reason)
        self.exit_code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM


class _Clock:
    """Wall clock that first waits for the device to finish its queued work."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class _TimingWindow:
    """The FPS window: from the end of the warm-up to the last batch.

    If the run has no more batches than the warm-up, the window covers every batch. ``sync``
    runs before each clock start (a barrier across ranks).
    """

    def __init__(self, device: torch.device, warmup_batches: int, sync: Callable[[], None] | None = None) -> None:
        self.clock, self.warmup_batches, self.sync = _Clock(device), warmup_batches, sync or (lambda: None)
        self.batches = self.frames = self.frames_all = 0
        self.sync()
        self.t_start = self.t_warm = self.clock()

    def add(self, frames: int) -> None:
        """Count one batch of ``frames`` images, just finished."""
        self.batches += 1
        self.frames_all += frames
        if self.batches == self.warmup_batches:
            self.sync()
            self.t_warm = self.clock()
        elif self.batches > self.warmup_batches:
            self.frames += frames

    def close(self) -> tuple[int, float, bool]:
        """``(images timed, seconds, whether the warm-up is included)``."""
        t_end = self.clock()
        if self.batches > self.warmup_batches:
            return self.frames, t_end - self.t_warm, False
        return self.frames_all, t_end - self.t_start, True


def _check_failures(tracker: DecodeTracker | None, skip_bad: bool, max_bad: int | None) -> None:
    """Stop the run on the first failure (strict), or when more than ``max_bad`` failed."""
    if tracker is None or not (count := tracker.failed):
        return
    if not skip_bad:
        first = tracker.failures()[0]
        raise RunStopped(f"cannot decode {first.path}: {first.reason} (--skip-bad skips such images)", EXIT_FAILED)
    if max_bad is not None and count > max_bad:
        raise RunStopped(f"{count} images failed to decode, more than --max-bad allows ({max_bad})", EXIT_FAILED)


def _classify(model: ModelBundle, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Run the bundle on one batch, turning out-of-memory into advice on the batch size."""
    try:
        return model(images, labels)
    except torch.OutOfMemoryError:
        n = images.shape[0]
        raise RunStopped(
            f"out of memory on {images.device} with a batch of {n} images; try --batch-size {max(1, n // 2)}",
            EXIT_FAILED,
        ) from None


def benchmark(
    loader: Iterable[tuple[Tensor, Tensor]],
    model: ModelBundle,
    *,
    listed: int | None = None,
    warmup_batches: int = 20,
    tracker: DecodeTracker | None = None,
    skip_bad: bool = False,
    max_bad: int | None = None,
    sync_clocks: Callable[[], None] | None = None,
    progress: Callable[[int, Tensor], None] | None = None,
) -> RunResult:
    """Run the model over every batch and measure throughput and accuracy.

    The first ``warmup_batches`` batches count towards accuracy but not towards FPS; if the
    run has no more batches than that, FPS covers all of them and a warning says so.

    Args:
        loader: Yields ``(images, labels)`` batches, e.g. a pipeline's iterator.
        model: From :py:func:`get_model`.
        listed: How many images the loader was given, for the accounting.
        warmup_batches: Batches left out of the FPS window.
        tracker: The record the decode function writes failures to, if any.
        skip_bad: Go on after a decode failure (else stop at the first).
        max_bad: With ``skip_bad``, stop once more than this many images failed.
        sync_clocks: Called just before each clock start (loop start, end of warm-up), e.g. a
            barrier so that every rank of a distributed run starts its clock together.
        progress: Called after each batch with the images classified so far and the running
            top-1 count (a device tensor), e.g. a :py:class:`Progress`.

    Returns:
        A RunResult. If the run ends early (RunStopped, KeyboardInterrupt, a loader failure or
        time-out), the exception propagates with the partial result attached as ``exc.result``.
        If the loader ends without delivering every listed image, RunStopped says how many.
    """
    device = next(model.parameters()).device
    result = RunResult(listed=listed)
    # Counts stay on the device: reading them each batch would stall the GPU's queue.
    top1, top5 = (torch.zeros((), dtype=torch.int64, device=device) for _ in range(2))
    window = _TimingWindow(device, warmup_batches, sync_clocks)
    try:
        with torch.inference_mode():
            for i, (images, labels) in enumerate(loader):
                _check_failures(tracker, skip_bad, max_bad)
                with spdl.io.utils.trace_event(f"iter_{i}"), torch.profiler.record_function(f"iter_{i}"):
                    if images.shape[0]:
                        b1, b5 = _classify(model, images, labels)
                        top1 += b1
                        top5 += b5
                result.classified += int(images.shape[0])
                window.add(int(images.shape[0]))
                if progress is not None:
                    progress(result.classified, top1)
            _check_failures(tracker, skip_bad, max_bad)
            if result.listed is not None and result.classified + (tracker.failed if tracker else 0) != listed:
                raise RunStopped("the loader ended before delivering every listed image", EXIT_FAILED)
    except (RunStopped, KeyboardInterrupt, PipelineFailure, TimeoutError) as e:
        result.partial = True
        e.result = result  # type: ignore[attr-defined]
        raise
    finally:
        result.frames_timed, result.elapsed_s, result.warmup_included = window.close()
        result.batches = window.batches
        result.top1_correct, result.top5_correct = int(top1), int(top5)
        result.record_failures(tracker.failures() if tracker else [])
        result.decoder_fallbacks = tracker.fallbacks if tracker else 0
    return result


class Progress:
    """Images done, images/s and running top-1: a live line on a terminal, a log line otherwise.

    Reading the running top-1 waits for the device, so it is read only when a line is shown.
    """

    def __init__(self, total: int | None, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval = 0.5 if self.live else 30.0
        self.started = self.last = time.perf_counter()

    def __call__(self, done: int, top1_correct: Tensor) -> None:
        now = time.perf_counter()
        if now - self.last < self.interval:
            return
        self.last = now
        rate = done / (now - self.started)
        top1 = int(top1_correct) / done if done else 0.0
        text = f"{done}/{self.total or '?'} images, {rate:.0f} images/s, top-1 so far {top1:.2%}"
        if self.live:
            print(f"\r{text}", end="", file=self.stream, flush=True)
        else:
            _LG.info(text)

    def close(self) -> None:
        if self.live:
            print(file=self.stream, flush=True)


@dataclass
class Breakdown:
    """Throughput of the loader alone, the model alone and both together, in images/s.

    On a GPU the two sides overlap, so the bound is ``min(loader, model)``; on the CPU they share
    the cores, so it is ``1 / (1/loader + 1/model)``. ``efficiency`` is end-to-end over the bound.
    """

    loader_fps: float
    model_fps: float
    e2e_fps: float
    bound_fps: float
    bottleneck: str
    efficiency: float

    @classmethod
    def from_rates(cls, loader_fps: float, model_fps: float, e2e_fps: float, device: torch.device) -> Breakdown:
        if device.type == "cuda":
            bound = min(loader_fps, model_fps)
        else:
            bound = 1 / (1 / loader_fps + 1 / model_fps) if loader_fps and model_fps else 0.0
        bottleneck = "loader" if loader_fps < model_fps else "model"
        return cls(loader_fps, model_fps, e2e_fps, bound, bottleneck, e2e_fps / bound if bound else 0.0)


def _timed_rate(steps: Iterable[int], warmup_batches: int, device: torch.device) -> float:
    """Images/s over ``steps`` (each yields its batch's image count), in :py:func:`benchmark`'s window."""
    window = _TimingWindow(device, warmup_batches)
    for frames in steps:
        window.add(frames)
    frames, seconds, _ = window.close()
    return frames / seconds if seconds > 0 else 0.0


def measure_loader(batches: Iterable[tuple[Tensor, Tensor]], device: torch.device, warmup_batches: int) -> float:
    """Images/s of a loader iterated alone, batches delivered on ``device``, nothing computed."""
    return _timed_rate((images.shape[0] for images, _ in batches), warmup_batches, device)


def measure_model(model: ModelBundle, batch_size: int, num_batches: int, warmup_batches: int) -> float:
    """Images/s of the model alone, on synthetic uint8 batches already on its device."""
    device = next(model.parameters()).device
    size = model.transform.size
    images = torch.randint(0, 256, (batch_size, size, size, 3), dtype=torch.uint8, device=device)
    images = images.permute(0, 3, 1, 2)  # the loaders' channels-last layout
    labels = torch.zeros((batch_size, 1), dtype=torch.int64, device=device)

    def steps() -> Iterator[int]:
        for _ in range(num_batches):
            model(images, labels)
            yield batch_size

    with torch.inference_mode():
        return _timed_rate(steps(), warmup_batches, device)


################################################################################
# Scale out with torchrun: shards, synchronised clocks, exact totals
################################################################################


def init_distributed(shard: Shard, device: torch.device, timeout_s: float) -> None:
    """Join the torchrun job: NCCL on CUDA, Gloo on the CPU; collectives give up after ``timeout_s``."""
    import datetime

    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


def _warmup_for_all_ranks(shard: Shard, listed: int, batch_size: int, warmup_batches: int) -> int:
    """A warm-up every rank can reach, so the barrier at its end never waits on a finished rank.

    If the shortest shard has no more batches than the warm-up, return a count no rank reaches:
    every rank then times all of its batches, as a single process would.
    """
    fewest = math.ceil(shard.size_of(listed, shard.world_size - 1) / batch_size)
    most = math.ceil(shard.size_of(listed, 0) / batch_size)
    return warmup_batches if fewest > warmup_batches else most + 1


def _peer_gone(error: RuntimeError) -> str:
    """Why this rank stops when a collective fails: a peer stopped or died."""
    return f"another rank stopped ({str(error).splitlines()[0]})"


def _barrier() -> None:
    """Wait for every rank; a peer that stopped or died ends this rank's run with a clear reason."""
    import torch.distributed as dist

    try:
        dist.barrier()
    except RuntimeError as e:  # DistBackendError / timeout: a peer is gone
        raise RunStopped(_peer_gone(e), EXIT_FAILED) from None


def _rank_entry(result: RunResult, shard: Shard, device: torch.device) -> dict:
    """One rank's share of the job, as the results file lists it."""
    return {"rank": shard.rank, "classified": result.classified, "fps": result.fps,
            "elapsed_s": result.elapsed_s, "device": str(device)}  # fmt: skip


def reduce_results(result: RunResult, shard: Shard, device: torch.device) -> tuple[RunResult, list[dict]]:
    """Sum the counts of every rank exactly; the FPS window is the longest rank's.

    Returns:
        The job's totals (on every rank) and one dict per rank: rank, classified, fps,
        elapsed_s, device.
    """
    import torch.distributed as dist

    on = device if device.type == "cuda" else torch.device("cpu")
    fields = ("listed", "classified", "failed", "top1_correct", "top5_correct", "frames_timed", "batches",
              "decoder_fallbacks")  # fmt: skip
    counts = torch.tensor([getattr(result, f) for f in fields], dtype=torch.int64, device=on)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    flags = torch.tensor(
        [result.elapsed_s, float(result.partial), float(result.warmup_included)], dtype=torch.float64, device=on
    )
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    gathered: list[dict | None] = [None] * shard.world_size
    mine = {**_rank_entry(result, shard, device), "failures": result.failures}
    dist.all_gather_object(gathered, mine)
    total = RunResult(**dict(zip(fields, counts.tolist(), strict=True)))
    total.elapsed_s, total.partial, total.warmup_included = flags[0].item(), bool(flags[1]), bool(flags[2])
    total.failures = [f for rank in gathered for f in rank.pop("failures")]
    return total, gathered


################################################################################
# Reporting
################################################################################


def print_summary(result: RunResult, file: TextIO | None = None) -> None:
    """Print the seed's FPS and accuracy lines, then the accounting of every listed image."""
    file = file or sys.stdout
    if result.warmup_included:
        print(f"WARNING: only {result.batches} batch(es), not more than the warm-up: FPS includes it", file=file)
    print(f"FPS={result.fps:.2f} ({result.frames_timed}/{result.elapsed_s:.2f})", file=file)
    skipped = f", {result.failed} failed to decode" if result.failed else ""
    for k, correct, acc in (("1", result.top1_correct, result.top1), ("5", result.top5_correct, result.top5)):
        print(f"Accuracy (top{k})={acc:.2%} ({correct}/{result.classified}{skipped})", file=file)
    print(
        f"Images: listed={result.listed} classified={result.classified} failed={result.failed} "
        f"not_reached={result.not_reached}{' (PARTIAL RUN)' if result.partial else ''}",
        file=file,
    )
    if result.decoder_fallbacks:
        print(f"  {result.decoder_fallbacks} images decoded by FFmpeg: the GPU decoder cannot take them", file=file)
    for failure in result.failures[:10]:
        print(f"  failed: {failure['path']}: {failure['reason']}", file=file)
    if len(result.failures) > 10:
        print(f"  ... and {len(result.failures) - 10} more (all in the results file)", file=file)


def print_breakdown(breakdown: Breakdown, file: TextIO | None = None) -> None:
    """Print loader-only, model-only and end-to-end rates side by side, with the verdict."""
    b = breakdown
    print(f"Breakdown (images/s): loader alone {b.loader_fps:.1f} | model alone {b.model_fps:.1f} | "
          f"end-to-end {b.e2e_fps:.1f}", file=file or sys.stdout)  # fmt: skip
    print(f"Bound {b.bound_fps:.1f} images/s, set by the {b.bottleneck}; end-to-end reaches {b.efficiency:.0%} of it",
          file=file or sys.stdout)  # fmt: skip


def _queue_verdict(occupancy: float) -> str:
    if occupancy >= 0.8:
        return "the loader ran ahead of the model"
    if occupancy <= 0.2:
        return "the model waited for batches: loading is the bottleneck"
    return "loader and model ran at about the same pace"


def print_pipeline_stats(stats: dict, file: TextIO | None = None) -> None:
    """Print :py:meth:`PipelineStats.summary`: each stage's average task time, then the sink
    queue's occupancy read as SPDL's performance guide reads it."""
    file = file or sys.stdout
    stages = []
    for stage in stats["stages"]:
        failed = f" ({stage['failures']} failed)" if stage["failures"] else ""
        stages.append(f"{stage['name']} {stage['ave_task_s'] * 1e3:.2f} ms x {stage['tasks']}{failed}")
    print(f"SPDL stages (average task time x tasks): {', '.join(stages)}", file=file)
    sink = stats["sink_queue"]
    wait_ms = sink["ave_get_wait_s"] * 1e3
    print(f"SPDL sink queue: a batch was waiting {sink['occupancy']:.0%} of the time, the model waited "
          f"{wait_ms:.2f} ms per batch: {_queue_verdict(sink['occupancy'])}", file=file)  # fmt: skip


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def environment(device: torch.device) -> dict:
    """Versions and hardware that the numbers depend on."""
    ffmpeg = spdl.io.utils.get_ffmpeg_versions()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "spdl": _version("spdl"),
        "ffmpeg": {lib: ".".join(map(str, v)) for lib, v in ffmpeg.items()},
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
    }


def write_results(
    path: Path | str,
    result: RunResult,
    config: dict,
    env: dict,
    ranks: list[dict],
    breakdown: Breakdown | None = None,
    pipeline_stats: dict | None = None,
) -> None:
    """Write the result, the run's configuration, its environment and each rank's share as JSON,
    with the breakdown and this process's SPDL stage statistics when there are some."""
    payload = {**result.to_dict(), "world_size": len(ranks), "ranks": ranks, "config": config, "env": env}
    if breakdown is not None:
        payload["breakdown"] = asdict(breakdown)
    if pipeline_stats is not None:
        payload["pipeline_stats"] = pipeline_stats
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


################################################################################
# Entry point
################################################################################


def _check_output_path(flag: str, path: Path | None) -> None:
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: folder {parent} does not exist")
    if path.is_dir() or not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there")


def _preflight(args: argparse.Namespace, shard: Shard) -> tuple[int, torch.device, str]:
    """Check everything that can be checked before the model is built.

    Returns:
        ``(images listed in the whole list, device, decoder backend)``. Raises UsageError.
    """
    listed = count_list(args.input_flist, args.max_samples)
    if args.prefix.endswith(os.sep) and not Path(args.prefix).is_dir():
        raise UsageError(f"--prefix {args.prefix}: no such folder")
    first_path, _ = next(source(args.input_flist, args.prefix))
    if not os.path.lexists(first_path):
        raise UsageError(f"the first listed image, {first_path}, does not exist: is --prefix right?")
    if args.checkpoint is not None and not args.checkpoint.is_file():
        raise UsageError(f"--checkpoint {args.checkpoint}: no such file")
    _check_output_path("--results-file", args.results_file)
    if args.trace is not None:
        _check_output_path("--trace", args.trace.with_name(args.trace.name + ".json"))
    if args.breakdown and shard.world_size > 1:
        raise UsageError("--breakdown runs in a single process, not under torchrun")
    device = resolve_device(args.device, shard.local_rank)
    decoder = "nvjpeg" if args.use_nvjpeg else "nvdec" if args.use_nvdec else "ffmpeg"
    return listed, device, check_gpu_decoder(decoder, device)


def _max_bad_count(max_bad: tuple[float, bool] | None, listed: int) -> int | None:
    if max_bad is None:
        return None
    value, is_percent = max_bad
    return math.floor(value * listed / 100) if is_percent else int(value)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into RunInterrupted, so the partial result is still reported."""

    def handler(signum: int, _frame: object) -> None:
        for s in previous:  # a second signal while the run winds down ends the process at once
            signal.signal(s, signal.SIG_DFL)
        raise RunInterrupted(signum)

    # SPDL's native library installs glog's crash handler, SIGTERM included, when it first
    # loads; load it now so that our handler, installed after, is the one that runs.
    spdl.io.utils.get_ffmpeg_versions()
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _tracing(path: Path | None) -> Iterator[None]:
    """With a path, record torch's profiler trace (PATH.json) and SPDL's (PATH.pftrace)."""
    if path is None:
        yield
        return
    with torch.profiler.profile() as profiler, spdl.io.utils.tracing(f"{path}.pftrace"):
        yield
    profiler.export_chrome_trace(f"{path}.json")


def _run_config(args: argparse.Namespace, model: ModelBundle, device: torch.device, decoder: str) -> dict:
    t = model.transform
    return {
        "model": args.model,
        "weights": str(args.checkpoint) if args.checkpoint else ("pretrained" if args.pretrained else "random"),
        "batch_size": args.batch_size,
        "num_threads": args.num_threads,
        "decoder": decoder,
        "device": str(device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "compile": args.compile,
        "input_size": [3, t.size, t.size],
        "crop_pct": t.crop_pct,
        "interpolation": t.interpolation,
        "mean": list(t.mean),
        "std": list(t.std),
        "warmup_batches": args.warmup_batches,
        "loader": args.loader,
        "skip_bad": args.skip_bad,
    }


def _stall_reason(tracker: DecodeTracker, timeout: float) -> str:
    """Say which stage stalled: the decode stage (and on which file), or the source before it."""
    stuck = tracker.oldest_in_progress()
    if stuck is not None:
        path, seconds = stuck
        return f"no batch for {timeout:g} s (--timeout): the decode stage has been on {path} for {seconds:.0f} s"
    return f"no batch for {timeout:g} s (--timeout): the decode stage is idle, waiting for the file list source"


def _stop_pipeline(pipeline: Pipeline) -> bool:
    """Stop the pipeline; return False if a worker thread is stuck (e.g. in a hung read)."""
    try:
        pipeline.stop(timeout=1.5)
    except TimeoutError:
        return False
    return True


@dataclass
class _Loader:
    """A running loader: its batches, its SPDL stage statistics (None for ``--loader torch``),
    and whether it stopped cleanly (False when a worker thread was stuck, e.g. in a hung read)."""

    batches: Iterator[tuple[Tensor, Tensor]]
    stats: PipelineStats | None = None
    stopped_cleanly: bool = True


@contextlib.contextmanager
def _open_loader(
    args: argparse.Namespace,
    transform: EvalTransform,
    device: torch.device,
    decoder: str,
    shard: Shard,
    tracker: DecodeTracker,
) -> Iterator[_Loader]:
    """Start the loader chosen by ``--loader``; stop it on the way out."""
    if args.loader == "torch":
        dataset = PILDataset(args.input_flist, args.prefix, args.max_samples, transform, shard)
        loader = get_torch_loader(dataset, args.batch_size, args.num_threads, device, args.timeout)
        yield _Loader(torch_loader_batches(loader, device, tracker))
        return
    decode_func = get_decode_func(device, transform, decoder.split("-")[0], tracker)
    src = source(args.input_flist, args.prefix, args.max_samples, rank=shard.rank,
                 world_size=shard.world_size)  # fmt: skip
    stats = PipelineStats(args.stats_interval)
    pipeline = get_pipeline(src, args.batch_size, decode_func, args.num_threads, args.queue_size, args.num_threads,
                            stats=stats)  # fmt: skip
    pipeline.start()
    handle = _Loader(pipeline.get_iterator(timeout=args.timeout), stats)
    try:
        yield handle
    finally:
        handle.stopped_cleanly = _stop_pipeline(pipeline)


def _clock_start_hook(shard: Shard, stats: PipelineStats | None) -> Callable[[], None]:
    """What runs at each clock start: a barrier across ranks, and the stage statistics' window."""

    def at_clock_start() -> None:
        if shard.world_size > 1:
            _barrier()
        if stats is not None:
            stats.start_window()

    return at_clock_start


def _run_loop(
    args: argparse.Namespace, model: ModelBundle, loader: _Loader, tracker: DecodeTracker, listed: int, shard: Shard
) -> tuple[RunResult, int]:
    """Run the timed loop over the loader's batches. Returns ``(result, exit status)``."""
    progress = Progress(listed) if shard.rank == 0 else None
    try:
        with _tracing(args.trace if shard.rank == 0 else None):
            return benchmark(
                loader.batches, model, listed=listed,
                warmup_batches=_warmup_for_all_ranks(shard, args.listed_total, args.batch_size, args.warmup_batches),
                tracker=tracker, skip_bad=args.skip_bad, max_bad=_max_bad_count(args.max_bad, listed),
                sync_clocks=_clock_start_hook(shard, loader.stats), progress=progress,
            ), 0  # fmt: skip
    except (RunStopped, RunInterrupted) as e:
        result, exit_code, reason = e.result, e.exit_code, e.reason  # type: ignore[attr-defined]
    except TimeoutError as e:
        result, exit_code = e.result, EXIT_STALLED  # type: ignore[attr-defined]
        if args.loader == "torch":
            reason = f"no batch for {args.timeout:g} s (--timeout) from the DataLoader's workers"
        else:
            reason = _stall_reason(tracker, args.timeout)
    except PipelineFailure as e:
        result, exit_code = e.result, EXIT_FAILED  # type: ignore[attr-defined]
        reason = f"the loading pipeline failed: {e} (see the log above)"
    finally:
        if progress is not None:
            progress.close()
    result.stop_reason = reason
    return result, exit_code


def _measure_breakdown(
    args: argparse.Namespace, model: ModelBundle, device: torch.device, decoder: str, result: RunResult
) -> Breakdown:
    """After the end-to-end run: the same loader alone, then the model alone on as many batches."""
    _LG.info("Breakdown: timing the loader alone, then the model alone.")
    shard = Shard()
    with _open_loader(args, model.transform, device, decoder, shard, DecodeTracker()) as loader:
        loader_fps = measure_loader(loader.batches, device, args.warmup_batches)
    model_fps = measure_model(model, args.batch_size, max(result.batches, args.warmup_batches + 1),
                              args.warmup_batches)  # fmt: skip
    return Breakdown.from_rates(loader_fps, model_fps, result.fps, device)


def _combine_ranks(result: RunResult, shard: Shard, device: torch.device) -> tuple[RunResult, list[dict], int]:
    """Totals over the job: ``(result, per-rank list, exit status)``; a rank that failed stays alone."""
    mine = _rank_entry(result, shard, device)
    if shard.world_size == 1:
        return result, [mine], 0
    try:
        total, ranks = reduce_results(result, shard, device)
    except RuntimeError as e:  # a peer stopped before the final reduction
        result.partial, result.stop_reason = True, _peer_gone(e)
        return result, [mine], EXIT_FAILED
    return total, ranks, 0


def _run(args: argparse.Namespace, device: torch.device, decoder: str, shard: Shard) -> tuple[int, bool]:
    """Run alone, or as one rank of a torchrun job. Returns ``(exit status, stopped cleanly)``."""
    if shard.world_size == 1:
        return _run_rank(args, device, decoder, shard)
    import torch.distributed as dist

    # Compilation happens on the first batches, before the warm-up barrier: allow for it.
    init_distributed(shard, device, args.timeout + (1800 if args.compile else 0))
    try:
        return _run_rank(args, device, decoder, shard)
    finally:
        # Left to interpreter shutdown, Gloo's threads free tensors without the GIL and abort.
        dist.destroy_process_group()


def _run_rank(args: argparse.Namespace, device: torch.device, decoder: str, shard: Shard) -> tuple[int, bool]:
    """Build the model and the loader, run, report. Returns ``(exit status, stopped cleanly)``."""
    model = get_model(
        args.model, device, pretrained=args.pretrained, checkpoint=args.checkpoint,
        compile=args.compile, use_bf16=args.use_bf16, batch_size=args.batch_size,
    )  # fmt: skip
    listed = shard.size_of(args.listed_total)
    _LG.info("Model %s on %s, %s loader, decoder %s, %d images listed.", args.model, device, args.loader,
             decoder if args.loader == "spdl" else "pil", listed)  # fmt: skip
    tracker = DecodeTracker()
    with _open_loader(args, model.transform, device, decoder, shard, tracker) as loader:
        result, exit_code = _run_loop(args, model, loader, tracker, listed, shard)
    pipeline_stats = loader.stats.summary() if loader.stats else None
    if not loader.stopped_cleanly:
        return _report(args, result, model, device, decoder, shard, exit_code, [], pipeline_stats=pipeline_stats), False
    breakdown = None
    if args.breakdown and exit_code == 0:
        breakdown = _measure_breakdown(args, model, device, decoder, result)
    ranks: list[dict] = []
    if exit_code == 0:
        result, ranks, exit_code = _combine_ranks(result, shard, device)
    return _report(args, result, model, device, decoder, shard, exit_code, ranks, breakdown, pipeline_stats), True


def _report(
    args: argparse.Namespace,
    result: RunResult,
    model: ModelBundle,
    device: torch.device,
    decoder: str,
    shard: Shard,
    exit_code: int,
    ranks: list[dict],
    breakdown: Breakdown | None = None,
    pipeline_stats: dict | None = None,
) -> int:
    """Print the summary (rank 0, or a rank that stopped alone) and write the results file."""
    label = f"rank {shard.rank}: " if shard.world_size > 1 and (exit_code or not ranks) else ""
    if result.stop_reason:
        print(f"error: {label}{result.stop_reason}", file=sys.stderr)
    if shard.rank == 0 or label:
        print_summary(result)
        if pipeline_stats is not None:
            print_pipeline_stats(pipeline_stats)
        if breakdown is not None:
            print_breakdown(breakdown)
    if args.results_file and shard.rank == 0:
        ranks = ranks or [_rank_entry(result, shard, device)]
        config = _run_config(args, model, device, decoder)
        write_results(args.results_file, result, config, environment(device), ranks, breakdown, pipeline_stats)
    return exit_code


def _init_logging(debug: bool = False, spdl_stats: bool = False) -> None:
    """Log INFO and up (DEBUG with ``debug``). SPDL's own per-stage statistics lines, which it
    logs at INFO when each stage ends, only with ``spdl_stats`` or ``debug``: by default the
    end-of-run summary (:py:func:`print_pipeline_stats`) says it, over the FPS window."""
    fmt = "%(asctime)s [%(levelname)s] %(message)s"
    logging.basicConfig(format=fmt, level=logging.DEBUG if debug else logging.INFO)
    if not (debug or spdl_stats):
        logging.getLogger("spdl.pipeline").setLevel(logging.WARNING)


def entrypoint(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: check the inputs, build the model and loader, run, report."""
    args = _parse_args(argv)
    _init_logging(args.debug, spdl_stats=args.stats_interval > 0)
    if args.trace is not None:
        args.max_samples = min(args.max_samples, args.batch_size * TRACE_BATCHES)
    shard = Shard.from_env()
    if shard.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)  # one rank speaks for the job
    stopped_cleanly = True
    try:
        with _stop_on_signals():
            args.listed_total, device, decoder = _preflight(args, shard)
            exit_code, stopped_cleanly = _run(args, device, decoder, shard)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        exit_code = EXIT_USAGE
    except RunInterrupted as e:  # before the loop started
        print(f"error: {e.reason}", file=sys.stderr)
        exit_code = e.exit_code
    if not stopped_cleanly or shard.world_size > 1:
        # Everything is reported; skip the interpreter's shutdown, which would wait forever for
        # a decode thread stuck in a system call (a hung file system, a FIFO), or abort when
        # Gloo's threads free their last tensors while the interpreter is finalising.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    # Decoded batches left in reference cycles would otherwise outlive SPDL's bindings at
    # shutdown, and nanobind would print a "leaked instances" warning after the results.
    gc.collect()
    sys.exit(exit_code)


if __name__ == "__main__":
    entrypoint()
