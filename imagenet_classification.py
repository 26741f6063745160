"""Benchmark loading ImageNet-style JPEGs from local disk and classifying them.

An SPDL pipeline reads a list of images, decodes, resizes and centre-crops them in a pool of
threads (FFmpeg on the CPU, or nvJPEG / NVDEC on the GPU) and moves each batch to the device,
while the main thread runs a timm model on the batches one after another. The run reports
steady-state throughput (images per second, after a warm-up) and top-1 / top-5 accuracy, and
accounts for every listed image: classified, failed, or not reached.

The images come from a file list (one path per line; the class from the WordNet ID
``nXXXXXXXX`` in the path, or from a label column), or from a folder (``--data-dir``, class
folders as torchvision's ``ImageFolder`` reads them, or a flat folder with ``--labels``)::

    cd /data/imagenet && find val -name '*.JPEG' > ~/imagenet.val.flist
    python imagenet_classification.py --input-flist ~/imagenet.val.flist --prefix /data/imagenet/
    python imagenet_classification.py --data-dir /data/imagenet/val

On a machine without a GPU or without access to the model hub::

    python imagenet_classification.py --input-flist val.flist --prefix data/ \\
        --device cpu --model efficientnet_lite0 --checkpoint lite0.pth --no-compile

From a notebook, each stage can be used alone::

    from imagenet_classification import source, get_decode_func, get_pipeline, get_model, benchmark

Exit status: 0 success; 1 the run stopped on a failure (bad image in strict mode, too many
bad images, loader error, out of memory, results not written); 2 bad arguments or input found
before the run; 3 the loader stalled; 130 / 143 interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import gc
import io
import itertools
import json
import logging
import math
import os
import pickle
import platform
import re
import signal
import stat
import struct
import sys
import tempfile
import threading
import time
import warnings
import zipfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, NamedTuple, TextIO

if __name__ == "__main__":  # a signal while the libraries below load: one line, not a traceback

    def _interrupted_while_starting(signum: int, _frame: object) -> None:
        os.write(2, f"error: interrupted by {signal.Signals(signum).name} while starting\n".encode())
        os._exit(128 + signum)

    for _signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_signum, _interrupted_while_starting)

import spdl.io  # noqa: E402
import spdl.io.utils  # noqa: E402
import torch  # noqa: E402
from spdl.io import convert_frames, to_torch, transfer_buffer  # noqa: E402
from spdl.io.lib import _libspdl  # noqa: E402
from spdl.pipeline import (  # noqa: E402
    AsyncQueue,
    Pipeline,
    PipelineBuilder,
    PipelineFailure,
    StageInfo,
    StatsQueue,
    TaskHook,
    TaskStatsHook,
)
from spdl.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig  # noqa: E402
from torch import Tensor  # noqa: E402

# Every ``spdl.io.X`` goes through that module's ``__getattr__`` (6-24 us a name): the decode path,
# run for every image in every thread, uses the names bound here once. ``_libspdl`` is SPDL's
# native module, loaded on its first use (not at import), its names then plain attributes.

__all__ = [
    # The design's names: each stage can be called alone.
    "entrypoint",
    "main",
    "source",
    "get_decode_func",
    "get_pipeline",
    "get_model",
    "benchmark",
    "ModelBundle",
    "Preprocessing",
    "Classification",
    "get_mappings",
    "parse_wnid",
    # What a notebook composes with them.
    "ImageList",
    "read_file_list",
    "read_labels",
    "scan_folder",
    "EvalTransform",
    "BadImagePolicy",
    "RunResult",
    "measure_loader",
    # Errors, and the warning of a run too short for its warm-up.
    "InputError",
    "ImageDecodeError",
    "RunStopped",
    "RunInterrupted",
    "WarmupIncluded",
]

__version__ = "0.1.0"  # pyproject.toml reads it from here

_LG = logging.getLogger(__name__)

DEFAULT_MODEL = "mobilenetv3_large_100"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
COMPILE_MODE = "default"  # what compile=True and the CLI use: seconds to compile; max-autotune took minutes
NUM_CLASSES = 1000
TRACE_BATCHES = 60  # --trace keeps traces small: only this many batches are run.
MAX_IMAGE_MB = 64  # the default cap on one image file's size (--max-image-mb)
MAX_IMAGE_PIXELS = 178_956_970  # larger images are refused before decoding, as PIL refuses them
EXIT_FAILED, EXIT_USAGE, EXIT_STALLED = 1, 2, 3
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


################################################################################
# Errors: what a library call raises on purpose. The entry point alone turns them into exit
# statuses (see _explain).
################################################################################


class InputError(Exception):
    """Input that cannot be used, found before the run: a file list, label file or folder (the
    message names the file and line), an argument, a model, checkpoint, device or decoder.

    Attributes:
        flag: The command-line flag that takes the input, when one does (``--model``, ...).
        advice: What to do about it, in the command line's words ("" for none).
    """

    def __init__(self, message: str, flag: str | None = None, advice: str = "") -> None:
        super().__init__(message)
        self.flag, self.advice = flag, advice


_FFMPEG_ADVICE = "drop the flag to decode with FFmpeg"
_WEIGHTS_ADVICE = "pass --checkpoint PATH for local weights, or --no-pretrained for random ones"


class ImageDecodeError(Exception):
    """An image that could not be read or decoded.

    Attributes:
        path: The image's path as listed (with the prefix).
        reason: Why, in words (the OS error or the decoder's message).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason

    def __reduce__(self) -> tuple:  # a batch's failures travel from a --decode-processes worker
        return type(self), (self.path, self.reason)


class RunStopped(Exception):
    """A run that ended before every listed image was classified or failed.

    Attributes:
        kind: Why: ``bad_image`` (the policy is strict), ``too_many_bad``, ``stalled`` (no batch
            within the loader's time-out), ``incomplete`` (the loader ended early), ``loader``
            (it failed), ``out_of_memory``, ``model`` (the model failed on a batch) or ``peer``
            (another rank of a torchrun job stopped).
        advice: What to do about it, in the command line's words ("" for none).
        where: For ``stalled``: what the decode stage was doing.
        result: The partial :py:class:`RunResult`, set by :py:func:`benchmark` (None when
            raised outside it).
    """

    def __init__(self, message: str, kind: str, advice: str = "", where: str = "") -> None:
        super().__init__(message)
        self.kind, self.advice, self.where = kind, advice, where
        self.result: RunResult | None = None


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a run: a KeyboardInterrupt, so that no library swallows it.

    Attributes:
        signum: The signal.
        result: The partial :py:class:`RunResult` once :py:func:`benchmark` has attached it.
    """

    def __init__(self, signum: int = signal.SIGINT, result: RunResult | None = None) -> None:
        self.signum, self.result = signum, result
        self.reason = f"interrupted by {signal.Signals(signum).name}"
        super().__init__(self.reason)


################################################################################
# Arguments
################################################################################


def _number(kind: type, low: float, what: str) -> Callable[[str], Any]:
    """An argparse type: a finite ``kind`` (int or float) of at least ``low``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_count = _number(int, 1, "a whole number of at least 1")


MAX_IMG_SIZE = 4096  # --img-size: larger crops are a typo, not a model's input


def _img_size(text: str) -> int:
    value = _count(text)
    if value > MAX_IMG_SIZE:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_IMG_SIZE} pixels, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = _number(float, 1e-6, "a number in (0, 1]")(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


_count0 = _number(int, 0, "a whole number of at least 0")
_seconds = _number(float, 1e-3, "a number of seconds above 0")


def _timeout(text: str) -> float:
    value = _seconds(text)
    if value > 1e6:  # longer waits overflow the DataLoader's and threading's clocks
        raise argparse.ArgumentTypeError(f"expected at most 1e6 seconds, got {text!r}")
    return value


def _max_bad(text: str) -> tuple[float, bool]:
    """Parse ``N`` or ``P%`` into ``(value, is_percent)``."""
    is_percent = text.endswith("%")
    value = _number(float if is_percent else int, 0, "N or P% (0-100)")(text[:-1] if is_percent else text)
    if is_percent and value > 100:
        raise argparse.ArgumentTypeError(f"expected N or P% (0-100), got {text!r}")
    return value, is_percent


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every default in ``--help``, except the off state of switches and an absent value."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, "") or isinstance(action.default, bool) or "default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action) or ""


def _data_flags(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    where = data.add_mutually_exclusive_group(required=True)
    where.add_argument("data", nargs="?", type=Path, metavar="DATA_DIR",
                       help="the same as --data-dir, as timm's scripts take it")  # fmt: skip
    where.add_argument("--input-flist", type=Path,
                       help="file list: one image path per line, optionally a label; - reads stdin")  # fmt: skip
    where.add_argument("--data-dir", type=Path,
                       help="a folder of class folders (nXXXXXXXX/...), or a flat folder with --labels")  # fmt: skip
    data.add_argument("--prefix", default="", help="prepended to every path in the file list")
    data.add_argument("--labels", type=Path,
                      help="labels by file name: Kaggle's LOC_val_solution.csv, or 'name label' lines")  # fmt: skip
    data.add_argument("--max-samples", "--num-samples", type=_count, help="use only the first N images (default: all)")
    data.add_argument("--max-image-mb", type=_count, default=MAX_IMAGE_MB, help="a larger image file is a bad image")


def _loader_flags(parser: argparse.ArgumentParser) -> None:
    loader = parser.add_argument_group("loader")
    loader.add_argument("-b", "--batch-size", type=_count, default=32, help="images per batch")
    loader.add_argument("-j", "--num-threads", "--workers", type=_count, default=16,
                        help="decode threads (SPDL), or worker processes (--loader torch)")  # fmt: skip
    loader.add_argument("--queue-size", type=_count, default=16, help="decoded batches held ready for the model")
    loader.add_argument("--decode-processes", type=_count0, default=0, metavar="N",
                        help="decode in N worker processes of --num-threads threads each (FFmpeg; 0: in this "
                             "process), for when one process's threads stop scaling")  # fmt: skip
    loader.add_argument("--loader", choices=("spdl", "torch"), default="spdl",
                        help="torch: the baseline, a PyTorch DataLoader decoding with PIL")  # fmt: skip
    decoder = loader.add_mutually_exclusive_group()
    decoder.add_argument("--use-nvjpeg", action="store_true", help="decode on the GPU with nvJPEG")
    decoder.add_argument("--use-nvdec", action="store_true", help="decode on the GPU with NVDEC")
    loader.add_argument("--check-decoder", type=_count0, metavar="N",
                        help=f"compare a GPU decoder with FFmpeg on the CPU on N images first, 0: off "
                             f"(default: {CHECK_DECODER_IMAGES})")  # fmt: skip


def _model_flags(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("-m", "--model", default=DEFAULT_MODEL, help="any timm model name")
    model.add_argument("--checkpoint", type=Path, help="local state dict to load (no model hub access)")
    pretrained = model.add_mutually_exclusive_group()
    pretrained.add_argument("--pretrained", action="store_true", default=True,
                            help="timm's pretrained weights (the default)")  # fmt: skip
    pretrained.add_argument("--no-pretrained", action="store_false", dest="pretrained", help="random weights")
    model.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    compile = model.add_mutually_exclusive_group()
    compile.add_argument("--compile", action="store_const", const=True, default=None,
                         help="torch.compile the model (default: on a GPU, not on the CPU)")  # fmt: skip
    compile.add_argument("--torchcompile", nargs="?", const="inductor", choices=("inductor",), metavar="inductor",
                         help="timm's name for --compile (its one backend here: inductor)")  # fmt: skip
    compile.add_argument("--no-compile", action="store_const", const=False, dest="compile", help="skip torch.compile")
    model.add_argument("--compile-mode", choices=COMPILE_MODES,
                       help=f"torch.compile's mode, and compile on (default: {COMPILE_MODE}, which compiles in "
                            "seconds; max-autotune tunes every kernel: minutes on a GPU, before the timed "
                            "window)")  # fmt: skip
    model.add_argument("--dtype", "--amp-dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto",
                       help="the model's precision; auto: bfloat16 where the hardware has it (README)")  # fmt: skip
    model.add_argument("--amp", action="store_const", const="auto", dest="dtype",
                       help="timm's flag for reduced precision: the same as --dtype auto, the default")  # fmt: skip
    model.add_argument("--no-bf16", action="store_const", const="float32", dest="dtype", help="same as --dtype float32")
    _transform_flags(parser)


def _transform_flags(parser: argparse.ArgumentParser) -> None:
    transform = parser.add_argument_group("evaluation transform (default: the model's pretrained config)")
    transform.add_argument("--img-size", type=_img_size, metavar="N", help="side of the square crop fed to the model")
    transform.add_argument("--crop-pct", type=_fraction, metavar="F",
                           help="the shorter side is resized to img-size / F before the centre crop")  # fmt: skip
    transform.add_argument("--interpolation", choices=sorted(_FFMPEG_SCALE_FLAGS), help="the resize's filter")
    for name in ("mean", "std"):
        transform.add_argument(f"--{name}", type=_number(float, 0, "a number"), nargs=3, metavar=("R", "G", "B"),
                               help=f"per-channel {name} on the 0-1 scale")  # fmt: skip


def _run_flags(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--warmup-batches", type=_count0, default=20, help="batches left out of the FPS window")
    run.add_argument("--skip-bad", action="store_true", help="skip and count undecodable images instead of stopping")
    run.add_argument("--max-bad", type=_max_bad, help="with --skip-bad: stop once more than N or P%% failed")
    run.add_argument("--timeout", type=_timeout, default=120.0, help="seconds without a batch before giving up")
    run.add_argument("--breakdown", action="store_true", help="also time the loader alone and the model alone")
    run.add_argument("--cold-cache", action="store_true",
                     help="evict the listed files from the page cache before the run (and before each --breakdown "
                          "pass that reads them), to time reading them from the disk")  # fmt: skip
    run.add_argument("--parity", type=_count0, default=0, metavar="N",
                     help="compare the loader with timm's reference transform on the first N images")  # fmt: skip
    run.add_argument("--stats-interval", type=_seconds, help="also log SPDL's own stage statistics every S seconds")
    run.add_argument("--results-file", type=Path, help="write the result as JSON here")
    run.add_argument("--predictions-file", type=Path, help="write one row per image here (.csv or .jsonl)")
    run.add_argument("--trace", type=Path, help=f"write PATH.json and PATH.pftrace ({TRACE_BATCHES} batches)")
    run.add_argument("--plot", type=Path, help="draw the run's timeline (or the sweep) into this PNG")
    run.add_argument("--sweep", nargs="+", metavar="SPEC",
                     help="instead of one run, time the loader at each setting: auto, or e.g. num-threads=1,2,4 "
                          "batch-size=64,128 queue-size=8,16; then end to end the best few")  # fmt: skip
    run.add_argument("--debug", action="store_true", help="debug logging")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="README.md describes every flag, the output, the results file and the exit statuses.",
        formatter_class=_HelpFormatter,
    )
    for add_flags in (_data_flags, _loader_flags, _model_flags, _run_flags):
        add_flags(parser)
    args = parser.parse_args(argv)
    if args.data is not None:
        args.data_dir = args.data
    if args.compile is False and (args.compile_mode or args.torchcompile):
        parser.error(f"--{'compile-mode' if args.compile_mode else 'torchcompile'} compiles the model; "
                     "--no-compile says not to: give one")  # fmt: skip
    if args.torchcompile or args.compile is None and args.compile_mode:
        args.compile = True  # asked for by timm's name, or by naming a mode
    if args.max_bad is not None and not args.skip_bad:
        parser.error("--max-bad only applies with --skip-bad")
    if args.loader == "torch" and (args.use_nvjpeg or args.use_nvdec):
        parser.error("--loader torch decodes with PIL on the CPU; it does not take --use-nvjpeg / --use-nvdec")
    if args.loader == "torch" and args.check_decoder is not None:
        parser.error("--check-decoder compares a GPU decoder with FFmpeg; --loader torch decodes with PIL on the CPU")
    if args.loader == "torch" and args.stats_interval is not None:
        parser.error("--stats-interval logs SPDL's stage statistics; --loader torch has no SPDL stages")
    if args.data_dir is not None and args.prefix:
        parser.error("--prefix applies to --input-flist, not to --data-dir")
    if args.trace is not None and args.breakdown:
        parser.error("--trace profiles the run, which --breakdown would compare with unprofiled ones; use one")
    given = {"--breakdown": args.breakdown, "--trace": args.trace, "--parity": args.parity,
             "--predictions-file": args.predictions_file, "--max-bad": args.max_bad}  # fmt: skip
    if args.sweep and (clash := [flag for flag, value in given.items() if value]):
        parser.error(f"--sweep runs the loader at many settings, skipping bad images; it takes no {clash[0]}")
    if args.sweep and args.cold_cache:
        parser.error("--sweep times many settings over the same files, warm after the first; it takes no --cold-cache")
    return args


################################################################################
# Source: the list of images, read once -> (path, class index)
################################################################################

# What torchvision's ImageFolder takes as images, matched case-insensitively.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_MAX_LINE_BYTES = 8192  # a longer line is no path: the file is not a file list (e.g. /dev/zero)
_WNID = re.compile(r"n\d{8}")


CLASS_TSV = Path(__file__).with_name("imagenet_class.tsv")  # index, WordNet ID, name; the wheel carries it


@functools.cache
def _class_table() -> tuple[tuple[str, str], ...]:
    """ImageNet-1k's ``(WordNet ID, name)`` pairs in class-index order, from ``imagenet_class.tsv``
    beside this module (scripts/make_class_tsv.py writes it from timm's lists)."""
    try:
        rows = [line.split("\t") for line in CLASS_TSV.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{CLASS_TSV}: cannot read the class table ({e})") from None
    if [row[0] for row in rows] != [str(i) for i in range(NUM_CLASSES)] or any(len(row) != 3 for row in rows):
        raise InputError(f"{CLASS_TSV}: not the {NUM_CLASSES} classes as 'index<TAB>wnid<TAB>name' lines")
    return tuple((wnid, name.strip()) for _, wnid, name in rows)


@functools.cache
def _class_index() -> dict[str, int]:
    """WordNet ID -> class index, read once; never handed out (see get_mappings)."""
    return {wnid: index for index, (wnid, _) in enumerate(_class_table())}


def _class_name(index: int) -> str:
    """The short name of an ImageNet-1k class index (its first WordNet lemma), e.g. 636 -> 'mailbag'."""
    return _class_table()[index][1].split(",")[0]


def get_mappings() -> dict[str, int]:
    """Map each ILSVRC2012 WordNet ID to its class index.

    The index is the position of the WNID in sorted order, which public ImageNet models use.

    Example:
        >>> get_mappings()["n03709823"]
        636
    """
    return dict(_class_index())


def parse_wnid(s: str) -> str:
    """The class's WordNet ID (``n`` and 8 digits) in a path: the last folder named by one
    (``train/n01440764/n01440764_10026.JPEG``), else the first one standing alone in a name
    (``ILSVRC2012_val_00000001_n01751748.JPEG``). ValueError if there is none."""
    if folders := [part for part in re.split(r"[/\\]", s)[:-1] if _WNID.fullmatch(part)]:
        return folders[-1]
    if match := re.search(r"(?<![A-Za-z0-9])n\d{8}(?!\d)", s):
        return match.group(0)
    raise ValueError(f"no WordNet ID (nXXXXXXXX) in {s!r}")


@dataclass(frozen=True)
class ImageList:
    """The images of a run, read once: paths (prefix included) and class indices, in order.

    Every stage (pre-flight, count, shards, loader, breakdown, parity) works from this one
    snapshot, so a list that changes on disk during the run changes nothing.

    Attributes:
        paths: Image paths.
        labels: Class indices (0-999), one per path.
        origin: What the list was read from, for messages.
    """

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    origin: str = "<list>"

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return zip(self.paths, self.labels, strict=True)

    def head(self, count: int) -> ImageList:
        """The first ``count`` images."""
        return replace(self, paths=self.paths[:count], labels=self.labels[:count])

    def shard(self, rank: int, world_size: int) -> ImageList:
        """Images ``rank, rank + world_size, …``: each image to exactly one rank; shards differ
        in length by at most one."""
        return replace(self, paths=self.paths[rank::world_size], labels=self.labels[rank::world_size])


class _Labels(dict):
    """Class index by image name (file name without its extension), and the file it came from."""

    def __init__(self, origin: str, by_name: dict[str, int]) -> None:
        super().__init__(by_name)
        self.origin = origin


def _image_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _parse_label(text: str, where: str) -> int | None:
    """A label field: a WordNet ID or a class index (0-999); None if ``text`` is neither."""
    if _WNID.fullmatch(text):
        if (index := _class_index().get(text)) is None:
            raise InputError(f"{where}: {text} is not one of the {NUM_CLASSES} ImageNet classes")
        return index
    if re.fullmatch(r"[+-]?\d+", text):
        if not 0 <= int(text) < NUM_CLASSES:
            raise InputError(f"{where}: class index {text} is out of range (0-{NUM_CLASSES - 1})")
        return int(text)
    return None


def _text_lines(path: Path | str) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of a text file (``-``: standard input), read once.

    Raises:
        InputError: the file is missing, a folder, unreadable, not UTF-8 text, or not a list
            of lines at all (a line longer than any path, as ``/dev/zero`` gives).
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        f = sys.stdin.buffer if name == "<stdin>" else open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a folder, not a file") from None
    except OSError as e:
        raise InputError(f"{name}: cannot read it ({e.strerror or e})") from None
    try:
        for lineno in itertools.count(1):
            try:
                raw = f.readline(_MAX_LINE_BYTES)
            except OSError as e:
                raise InputError(f"{name}: cannot read it ({e.strerror or e})") from None
            if not raw:
                return
            if len(raw) == _MAX_LINE_BYTES and not raw.endswith(b"\n") or b"\0" in raw:
                raise InputError(
                    f"{name}:{lineno}: binary data or a line over {_MAX_LINE_BYTES} bytes: not a text list"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{name}:{lineno}: not UTF-8 text") from None
            yield lineno, text.removeprefix("\ufeff") if lineno == 1 else text
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def read_labels(path: Path | str) -> _Labels:
    """Read labels for a flat folder of images, by image name.

    Two formats: Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString``; the first
    WordNet ID of the prediction string is the class) and lines of ``name label``, where the
    label is a WordNet ID or a class index. Names are matched without their extension.

    Raises:
        InputError: an unreadable file or a bad line, named with its line number.
    """
    by_name: dict[str, int] = {}
    for lineno, line in _text_lines(path):
        if not (text := line.strip()):
            continue
        where = f"{path}:{lineno}"
        if "," in text:  # Kaggle: ImageId,PredictionString ("n01751748 0 0 100 100 …")
            name, _, rest = text.partition(",")
            if not by_name and name.strip().lower() == "imageid":
                continue  # the header
            fields = rest.split()
        else:
            name, _, last = _split_last(text)
            fields = [last] if last else []
        label = _parse_label(fields[0], where) if fields else None
        if label is None:
            raise InputError(f"{where}: expected 'name label' or 'ImageId,WNID …', got {text!r}")
        by_name[_image_name(name.strip())] = label
    if not by_name:
        raise InputError(f"{path}: no labels in it")
    return _Labels(str(path), by_name)


def _split_last(text: str) -> tuple[str, str, str]:
    """``text`` cut before its last whitespace-separated field: ``(before, " ", last)``."""
    parts = text.rsplit(None, 1)
    return (parts[0], " ", parts[1]) if len(parts) == 2 else (text, "", "")


def read_file_list(
    path: Path | str, prefix: str = "", max_samples: int | None = None, *, labels: _Labels | None = None
) -> ImageList:
    """Read a file list once, checking every line.

    Each non-blank line is an image path (surrounding whitespace and CRLF stripped), in one of
    three forms, the same for every line of a list:

    - ``path``: the class is the first WordNet ID in the path (``…/n01440764/…``);
    - ``path label``: the label is a WordNet ID or a class index (0-999, sorted-WordNet-ID
      order, as Caffe-style ``val.txt`` lists have); the path is everything before the last
      whitespace-separated field, so it may hold spaces;
    - ``path`` with ``labels``: the class is looked up by the file's name without extension.

    Args:
        path: The list; ``-`` reads standard input.
        prefix: Prepended to each path.
        max_samples: Read only the first this many images.
        labels: From :py:func:`read_labels`, for a list of a flat folder's files.

    Raises:
        InputError: the list is unreadable or empty, or a line is bad (named with its number).
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    paths: list[str] = []
    classes: list[int] = []
    first_with_column: bool | None = None
    for lineno, line in _text_lines(path):
        if max_samples is not None and len(paths) >= max_samples:
            break
        if not (text := line.strip()):
            continue
        where = f"{name}:{lineno}"
        before, _, last = _split_last(text)
        label = _parse_label(last, where) if before is not text else None
        if first_with_column is None:
            first_with_column = label is not None
        if (label is not None) != first_with_column:
            has = "has no label column" if label is None else "has a label column"
            raise InputError(f"{where}: {has}, unlike the list's first line (a list mixes nothing)")
        if label is None:
            label = _label_from_path(text, where, labels)
        elif labels is not None:
            raise InputError(f"{where}: has a label column; labels by file name are for lists without one")
        paths.append(prefix + (before if first_with_column else text))
        classes.append(label)
    if not paths:
        raise InputError(f"{name}: the file list has no image paths")
    return ImageList(tuple(paths), tuple(classes), name)


def _label_from_path(text: str, where: str, labels: _Labels | None) -> int:
    if labels is not None:
        if (label := labels.get(_image_name(text))) is None:
            raise InputError(f"{where}: {labels.origin} has no label for {_image_name(text)!r}")
        return label
    try:
        wnid = parse_wnid(text)
    except ValueError:
        raise InputError(f"{where}: no WordNet ID (nXXXXXXXX) in {text!r}, and no label column") from None
    label = _parse_label(wnid, where)
    assert label is not None  # a WordNet ID is a label or an error
    return label


def _image_files(folder: str) -> Iterator[str]:
    """Image files under ``folder`` in ``ImageFolder``'s order (``sorted(os.walk(folder))``: the
    folders by path, each one's files by name), hidden files and folders left out; each entry's
    type comes from the directory listing, without a stat where it can."""
    folders, pending = [], [folder]
    while pending:
        with os.scandir(path := pending.pop()) as it:
            entries = [e for e in it if e.name[0] != "."]
        names = [e.name for e in entries if e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file()]
        folders.append((path, sorted(names)))
        pending += [e.path for e in entries if e.is_dir()]
    for path, names in sorted(folders):
        yield from (os.path.join(path, name) for name in names)


def scan_folder(root: Path | str, max_samples: int | None = None, *, labels: _Labels | None = None) -> ImageList:
    """List a folder's images as torchvision's ``ImageFolder`` and timm's folder dataset do.

    Without ``labels``, ``root`` holds one folder per class, named by its WordNet ID (ImageNet's
    ``train/`` and a sorted ``val/``); with ``labels`` (a flat ``val/`` as the archive gives it),
    the class of each image is looked up by its file name. Files are sorted, extensions
    (:py:data:`IMAGE_EXTENSIONS`) matched case-insensitively, hidden files skipped.

    Raises:
        InputError: no such folder, a class folder that is not an ImageNet WordNet ID, an
            image without a label, or no images at all.
    """
    root = str(root)
    if not os.path.isdir(root):
        raise InputError(f"{root}: no such folder")
    _class_index()  # read before the listing, whose OSErrors name the folder
    paths: list[str] = []
    classes: list[int] = []
    try:
        for folder, label in _class_folders(root, labels):
            if max_samples is not None and len(paths) >= max_samples:
                break
            for path in itertools.islice(
                _image_files(folder), None if max_samples is None else max_samples - len(paths)
            ):
                paths.append(path)
                classes.append(label if label is not None else _label_from_path(path, path, labels))
    except OSError as e:
        raise InputError(f"{root}: cannot list it ({e.strerror or e})") from None
    if not paths:
        raise InputError(f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) in it")
    return ImageList(tuple(paths), tuple(classes), root)


def _class_folders(root: str, labels: _Labels | None) -> list[tuple[str, int | None]]:
    """``(folder, class index)`` to list: each class folder of ``root``, or ``root`` itself with
    labels by file name (index None)."""
    if labels is not None:
        return [(root, None)]
    with os.scandir(root) as it:
        top = sorted((e for e in it if e.name[0] != "."), key=lambda e: e.name)
    if loose := next((e.name for e in top if e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file()), None):
        raise InputError(
            f"{root}: holds image files beside class folders (e.g. {loose}); a flat folder needs labels"
        )
    folders = []
    for entry in (e for e in top if e.is_dir()):
        if (label := _class_index().get(entry.name)) is None:
            raise InputError(f"{entry.path}: the folder name is not one of the {NUM_CLASSES} ImageNet WordNet IDs")
        folders.append((entry.path, label))
    return folders


def _limit(max_samples: float | None) -> int | None:
    return None if max_samples is None or math.isinf(max_samples) else int(max_samples)


def source(
    path: Path | str,
    prefix: str = "",
    max_samples: float | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[str, int]]:
    """Iterate a file list, yielding ``(prefix + path, class index)`` for each image.

    The list is read and checked whole first (see :py:func:`read_file_list` for its forms).

    Args:
        path: The file list.
        prefix: Prepended to each path.
        max_samples: Use only the first this many images of the list (before sharding).
        rank, world_size: Yield only this rank's shard: images ``rank, rank + world_size, …``.

    Raises:
        InputError: a bad line; the message names the list file and line number.
    """
    yield from read_file_list(path, prefix, _limit(max_samples)).shard(rank, world_size)


def _count_list(path: Path | str, max_samples: float | None = None) -> int:
    """How many images a file list holds (at most ``max_samples``), checking every line.

    Raises:
        InputError: the list is missing, unreadable or empty, or a line is bad.
    """
    return len(read_file_list(path, max_samples=_limit(max_samples)))


@dataclass(frozen=True)
class _Shard:
    """This process's place in a torchrun job (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> _Shard:
        """Read RANK, WORLD_SIZE and LOCAL_RANK, which torchrun sets for each process."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))

    def size_of(self, listed: int, rank: int | None = None) -> int:
        """How many of ``listed`` images fall to ``rank`` (default: this one)."""
        return len(range(self.rank if rank is None else rank, listed, self.world_size))


################################################################################
# Page cache: how much of the listed files' data is in memory; --cold-cache evicts it
################################################################################

_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore's vector: bit 0 of each byte says resident


@functools.cache
def _libc() -> Any | None:
    """libc's mmap, munmap and mincore through ctypes (Python's mmap has no mincore); None
    where the platform lacks them (then residency is unknown)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        calls = libc.mmap, libc.munmap, libc.mincore
    except (OSError, AttributeError, TypeError):
        return None
    calls[0].restype = ctypes.c_void_p
    calls[0].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    calls[1].argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    calls[2].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def _resident_bytes(fd: int, size: int) -> int | None:
    """Bytes of the open regular file ``fd`` (``size`` bytes long) in the page cache, from
    mincore over a read-only mapping of the whole file (mapping reads nothing); None if unknown."""
    import ctypes
    import mmap

    libc = _libc()
    if libc is None:
        return None
    if size == 0:
        return 0
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:  # MAP_FAILED: a file system without mmap
        return None
    try:
        pages = -(-size // mmap.PAGESIZE)
        vector = ctypes.create_string_buffer(pages)
        if libc.mincore(addr, size, vector) != 0:
            return None
    finally:
        libc.munmap(addr, size)
    flags = vector.raw.translate(_LOW_BIT)
    tail = size - (pages - 1) * mmap.PAGESIZE  # the last page holds only this much of the file
    return flags.count(1) * mmap.PAGESIZE - (mmap.PAGESIZE - tail if flags[-1] else 0)


@dataclass
class _PageCache:
    """How much of the listed files' data was in the page cache before a run, and after
    ``--cold-cache`` evicted it. Only file data is evicted: directory entries and inodes stay.

    Attributes:
        cold: The files were evicted first (``posix_fadvise(POSIX_FADV_DONTNEED)``, which drops
            clean pages only: pages not yet written to disk stay).
        files: Regular files examined (this rank's shard, or the whole job's once reduced).
        skipped: Listed paths not examined: missing, unreadable or not a regular file (the run
            counts them as failures).
        bytes: The examined files' total size.
        resident_bytes: Of those, bytes in the page cache before eviction; None if unknown
            (no mincore, or a file system that cannot map files).
        resident_after_bytes: After eviction, when ``cold``; else None.
    """

    cold: bool
    files: int = 0
    skipped: int = 0
    bytes: int = 0
    resident_bytes: int | None = 0
    resident_after_bytes: int | None = None

    @staticmethod
    def _share(part: int | None, whole: int) -> float | None:
        return None if part is None else part / whole if whole else 0.0

    @property
    def resident(self) -> float | None:
        """Share of ``bytes`` in the page cache before the run (before eviction), or None."""
        return self._share(self.resident_bytes, self.bytes)

    @property
    def resident_after(self) -> float | None:
        """Share of ``bytes`` in the page cache after eviction, or None."""
        return self._share(self.resident_after_bytes, self.bytes)

    def to_dict(self) -> dict:
        return {**asdict(self), "resident": self.resident, "resident_after": self.resident_after}

    @classmethod
    def total(cls, parts: Sequence[_PageCache]) -> _PageCache:
        """The sum of every rank's ``PageCache``: a count unknown on one rank is unknown."""

        def add(name: str) -> int | None:
            values = [getattr(p, name) for p in parts]
            return None if any(v is None for v in values) else sum(values)

        return cls(parts[0].cold, *(add(name) for name in ("files", "skipped", "bytes", "resident_bytes",
                                                          "resident_after_bytes")))  # fmt: skip


def _add(total: int | None, part: int | None) -> int | None:
    return None if total is None or part is None else total + part


def _examine_file(path: str, evict: bool) -> tuple[int, int | None, int | None] | None:
    """``(size, resident bytes, resident bytes after eviction or None)`` of one file; None if it
    cannot be opened or is no regular file (opened with O_NONBLOCK: a FIFO cannot hang here)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        before = _resident_bytes(fd, info.st_size)
        if not evict:
            return info.st_size, before, None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return info.st_size, before, _resident_bytes(fd, info.st_size)
    except OSError:  # fstat or fadvise refused: not examined
        return None
    finally:
        os.close(fd)


def _examine_page_cache(paths: Iterable[str], evict: bool = False) -> _PageCache:
    """Measure how much of each file's data is in the page cache; with ``evict``, drop it from
    the cache (``POSIX_FADV_DONTNEED``: no root needed) and measure again. A path that cannot be
    opened, or is no regular file, is counted in ``skipped``, not fatal."""
    cache = _PageCache(evict, resident_after_bytes=0 if evict else None)
    for path in paths:
        examined = _examine_file(path, evict)
        if examined is None:
            cache.skipped += 1
            continue
        size, before, after = examined
        cache.files, cache.bytes = cache.files + 1, cache.bytes + size
        cache.resident_bytes = _add(cache.resident_bytes, before)
        if evict:
            cache.resident_after_bytes = _add(cache.resident_after_bytes, after)
    return cache


################################################################################
# Decode: paths -> uint8 N x 3 x H x W on the device
################################################################################

# bicubic: bilinear for the chroma planes (swscale's bicublin). PIL, the reference, upsamples 4:2:0
# chroma bilinearly before its bicubic resize, which blurs chroma more than a bicubic from the
# half-size planes does; bench/parity.py measures it (closer to PIL, no slower).
_FFMPEG_SCALE_FLAGS = {"bilinear": "bilinear", "bicubic": "bicublin", "nearest": "neighbor", "lanczos": "lanczos"}
_PIL_RESAMPLE = {"bilinear": 2, "bicubic": 3, "nearest": 0, "lanczos": 1}  # PIL.Image.Resampling values


def _pretrained_config(model_name: str) -> dict:
    """timm's pretrained config of ``name``, ``name.tag``, ``hf-hub:…`` or ``local-dir:…``, read
    without building the model. Raises InputError: not a timm model, or its config is unreadable."""
    import timm
    from timm.models import _hub, get_pretrained_cfg

    source, _, model_id = model_name.partition(":") if ":" in model_name else ("", "", model_name)
    try:
        if source == "hf-hub":
            config = _hub.load_model_config_from_hf(model_id)[0]
        elif source == "local-dir":
            config = _hub.load_model_config_from_path(model_id)[0]
        elif source or not model_name or not timm.is_model(model_name):
            raise InputError(f"{model_name!r} is not a timm model", "--model")
        else:
            config = get_pretrained_cfg(model_name)
    except (OSError, ValueError, KeyError, TypeError) as e:  # unreachable hub, bad config.json
        raise InputError(f"{model_name}: cannot read its config ({type(e).__name__}: {e})", "--model") from None
    return config.to_dict() if hasattr(config, "to_dict") else dict(config or {})


def _check_imagenet_head(model_name: str, num_classes: int | None) -> None:
    """The model predicts ImageNet-1k's 1000 classes, which the labels index."""
    if num_classes is not None and num_classes != NUM_CLASSES:
        raise InputError(
            f"{model_name} has {num_classes} output classes, not ImageNet-1k's {NUM_CLASSES}: the accuracy "
            "would be meaningless; pick a model or tag trained or fine-tuned on ImageNet-1k (…in1k)",
            "--model",
        )


@dataclass(frozen=True)
class EvalTransform:
    """The evaluation transform: the shorter side (``crop_mode="squash"``: both) resized to
    ``floor(size / crop_pct)`` with ``interpolation`` (bicubic, bilinear, nearest or lanczos), then
    a centred ``size x size`` crop; ``mean`` and ``std`` per RGB channel, on the 0-1 scale."""

    size: int = 224
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    crop_mode: str = "center"

    @classmethod
    def from_model(cls, model: torch.nn.Module, overrides: dict | None = None) -> EvalTransform:
        """From a timm model's pretrained config; ``overrides`` as timm's ``resolve_data_config``
        takes them (``img_size``, ``crop_pct``, ``interpolation``, ``mean``, ``std``)."""
        import timm.data

        return cls._from_data_config(timm.data.resolve_data_config(overrides or {}, model=model))

    @classmethod
    def from_model_name(cls, model_name: str, overrides: dict | None = None) -> EvalTransform:
        """The same from a model's name, without building the model. Raises InputError: not a timm
        model, or a transform this loader does not reproduce."""
        import timm.data

        config = _pretrained_config(model_name)
        return cls._from_data_config(timm.data.resolve_data_config(overrides or {}, pretrained_cfg=config))

    @classmethod
    def _from_data_config(cls, cfg: dict) -> EvalTransform:
        height, width = cfg["input_size"][-2:]
        crop_mode = cfg.get("crop_mode") or "center"
        interpolation = str(cfg["interpolation"])
        reasons = []
        if height != width:
            reasons.append(f"its input is {width} x {height}, not square")
        if interpolation not in _FFMPEG_SCALE_FLAGS:
            reasons.append(f"its interpolation {interpolation!r} is not one of {sorted(_FFMPEG_SCALE_FLAGS)}")
        if crop_mode not in ("center", "squash"):
            reasons.append(f"its crop mode {crop_mode!r} is neither center nor squash")
        if reasons:
            raise InputError(f"its evaluation transform cannot be reproduced here: {'; '.join(reasons)}", "--model")
        mean, std = (tuple(float(v) for v in cfg[key]) for key in ("mean", "std"))
        return cls(int(width), float(cfg["crop_pct"]), interpolation, mean, std, crop_mode)

    @property
    def resize_short(self) -> int:
        return math.floor(self.size / self.crop_pct)

    def geometry(self, width: int, height: int) -> tuple[int, int, int, int]:
        """``(resized width, resized height, crop left, crop top)``, rounded as torchvision's
        ``Resize(int)`` and ``CenterCrop`` (timm's) round. ValueError: a size is not positive."""
        if width <= 0 or height <= 0:
            raise ValueError(f"invalid image size {width}x{height}")
        short = self.resize_short
        if self.crop_mode == "squash":
            new_w = new_h = short
        elif width <= height:
            new_w, new_h = short, int(short * height / width)
        else:
            new_w, new_h = int(short * width / height), short
        return new_w, new_h, _crop_start(new_w, self.size), _crop_start(new_h, self.size)

    def ffmpeg_filter(self, width: int, height: int) -> str:
        """FFmpeg's filter chain from a decoded frame of any pixel format to the RGB24 crop: only
        the region the crop needs (:py:func:`_resize_region`) is resized, in one swscale pass
        that also converts to planar RGB. ``bench/decode_paths.py`` compares other chains."""
        new_w, new_h, left, top = self.geometry(width, height)
        flags = f"{_FFMPEG_SCALE_FLAGS[self.interpolation]}+full_chroma_int"
        if min(new_w, new_h) < self.size:  # crop_pct > 1: the crop is padded with black, as torchvision pads it
            inside = f"crop={min(new_w, self.size)}:{min(new_h, self.size)}:{max(left, 0)}:{max(top, 0)}"
            pad = f"pad={self.size}:{self.size}:{max(-left, 0)}:{max(-top, 0)}:color=black"
            return f"scale={new_w}:{new_h}:flags={flags}:in_range=full,format=gbrp,{inside},{pad},format=rgb24"
        x0, src_w, out_w, pad_x = _resize_region(width, new_w, left, self.size)
        y0, src_h, out_h, pad_y = _resize_region(height, new_h, top, self.size)
        # exact=1: keep an odd full side as it is (the other side's region is even-sized).
        region = "" if (src_w, src_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"
        crop = f"crop={self.size}:{self.size}:{pad_x}:{pad_y}"
        # in_range=full: JPEG and PNG data are full range, as their frames say. Told so, swscale
        # is set up once per graph; otherwise it sets itself up again on the first frame, when it
        # learns the frame's range: the same pixels, at twice the cost of a new graph.
        scale = f"scale={out_w}:{out_h}:flags={flags}:in_range=full"
        return f"{region}{scale},format=gbrp,{crop},format=rgb24"


def _crop_start(length: int, crop: int) -> int:
    """Where torchvision's ``CenterCrop`` starts along a side; a crop longer than the side first
    pads it with ``(crop - length) // 2`` black pixels before it (``crop_pct`` > 1, volo_d4_448's)."""
    return round((length - crop) / 2) if length >= crop else -((crop - length) // 2)


REGION_TOLERANCE = 0.06  # source pixels


def _resize_region(length: int, resized: int, offset: int, crop: int) -> tuple[int, int, int, int]:
    """Along one side, the part of a frame to resize for a crop as if the whole frame were resized:
    ``(start, source length, resized length, pad)``, the crop ``pad`` pixels into the resized region.

    Crop pixel ``k`` samples the source at ``(offset + k + 0.5) * length / resized - 0.5``: the
    smallest region (even start and length: 4:2:0 chroma stays aligned) whose crop samples within
    :py:data:`REGION_TOLERANCE` of that, 4 resized pixels either side for the filter, wins; with none,
    or an enlarged side (the filter reaches further), the whole side: ``(0, length, resized, offset)``.
    """
    whole = (0, length, resized, offset)
    ratio = length / resized
    if ratio < 1:
        return whole
    return _best_region(length, resized, offset, crop, ratio) or whole


@functools.lru_cache(maxsize=8192)
def _best_region(length: int, resized: int, offset: int, crop: int, ratio: float) -> tuple[int, int, int, int] | None:
    """:py:func:`_resize_region`'s search over every candidate at once: per ``pad`` the smallest
    qualifying length, the smallest over the pads (the first on a tie), or None. Cached: sizes share sides."""
    import numpy as np

    pads = np.arange(4, 17)[:, None]
    out = crop + pads + 4 + np.arange(36)  # out in crop + pad + 4 .. crop + pad + 39, per pad
    src_len = 2 * np.round(out * ratio / 2)
    step = src_len / out
    ideal_start = (offset + 0.5) * ratio - (pads + 0.5) * step
    start = 2 * np.round(ideal_start / 2)
    first = start - ideal_start  # sampling error of crop pixel 0, then of the last one
    last = first + (crop - 1) * (step - ratio)
    ok = (start >= 0) & (start + src_len <= length) & (np.maximum(np.abs(first), np.abs(last)) <= REGION_TOLERANCE)
    rows = np.arange(len(ok))
    k = ok.argmax(axis=1)  # each pad's first qualifying length (0 where none does)
    smallest = np.where(ok[rows, k], out[rows, k], resized)
    row = int(smallest.argmin())  # the first pad on a tie
    if smallest[row] >= resized:
        return None
    return int(start[row, k[row]]), int(src_len[row, k[row]]), int(smallest[row]), row + 4


@dataclass(frozen=True)
class BadImagePolicy:
    """What a run does with images that cannot be decoded.

    Strict (the default): the run stops at the first bad image (RunStopped ``bad_image``). With
    ``skip=True`` each bad image is left out of its batch alone (labels stay aligned) and counted;
    ``max_bad`` (a count) or ``max_bad_percent`` (of the images listed, rounded down) then stop the
    run (``too_many_bad``) once more failed. Decode functions list a batch's bad images in
    ``batch.failures``; :py:func:`benchmark` records them and applies the policy.
    """

    skip: bool = False
    max_bad: int | None = None
    max_bad_percent: float | None = None

    def __post_init__(self) -> None:
        if not self.skip and (self.max_bad is not None or self.max_bad_percent is not None):
            raise ValueError("a limit on bad images applies only when they are skipped (skip=True)")
        if self.max_bad is not None and self.max_bad_percent is not None:
            raise ValueError("give max_bad or max_bad_percent, not both")

    def limit(self, listed: int | None) -> int | None:
        """How many bad images the run may meet, for ``listed`` images; None for no limit."""
        if self.max_bad_percent is None or listed is None:
            return self.max_bad
        # Exact decimal arithmetic: 10% of 30 is 3, never 2.9999.
        from fractions import Fraction

        return math.floor(Fraction(str(self.max_bad_percent)) * listed / 100)

    def check(self, failures: Sequence[ImageDecodeError], listed: int | None = None) -> None:
        """Raise RunStopped (``bad_image``, ``too_many_bad``) if ``failures``, the bad images met so
        far in the order met, must stop the run; ``listed``: the images listed, for a percentage."""
        if not failures:
            return
        if not self.skip:
            raise RunStopped(
                f"cannot decode {failures[0].path}: {failures[0].reason}", "bad_image", "--skip-bad skips such images"
            )
        if (limit := self.limit(listed)) is not None and len(failures) > limit:
            raise RunStopped(
                f"{len(failures)} images failed to decode, more than --max-bad allows ({limit})", "too_many_bad"
            )


# What decoders raise for data they cannot take: SPDL (FFmpeg's errors, and its InternalError,
# an AssertionError, for data it did not expect), torchvision's nvJPEG, and PIL (which raises
# most of these for corrupt files).
_DECODER_ERRORS = (RuntimeError, ValueError, IndexError, AssertionError, OSError, EOFError, SyntaxError)


def _spdl_reason(error: BaseException) -> str:
    return str(error).split(" (/", 1)[0].strip() or type(error).__name__  # drop SPDL's C++ source location


@contextlib.contextmanager
def _decoder_errors(path: str, decoder: str, also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn what a decoder raises for one image's data into that image's ImageDecodeError."""
    try:
        yield
    except (*_DECODER_ERRORS, *also) as e:
        raise ImageDecodeError(path, f"{decoder} cannot decode it: {_spdl_reason(e)}") from None


def _read_image_bytes(path: str, max_bytes: int = MAX_IMAGE_MB << 20) -> bytes:
    """One image file, whole. Raises ImageDecodeError: not a regular file (a folder, a FIFO, a
    device such as ``/dev/zero``: refused before any read), over ``max_bytes``, empty, or a JPEG
    without its end (FFmpeg would fill the rest with grey, with only a log line; PIL refuses it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise ImageDecodeError(path, "is a directory, not an image file") from None
    except OSError as e:
        raise ImageDecodeError(path, e.strerror or str(e)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            mode = info.st_mode
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
            raise ImageDecodeError(path, f"is {kind}, not an image file")
        if info.st_size > max_bytes:
            mib = info.st_size / 2**20
            raise ImageDecodeError(path, f"file of {mib:.1f} MiB, over the {max_bytes / 2**20:g} MiB limit")
        # As many bytes as the file has, and one more to see if it grew: asking for max_bytes at
        # once would allocate that much for every image. os.read, not a file object per image.
        data = os.read(fd, min(info.st_size, max_bytes) + 1)
        if len(data) > info.st_size:
            data += os.read(fd, max_bytes + 1 - len(data))
    except OSError as e:
        raise ImageDecodeError(path, e.strerror or str(e)) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise ImageDecodeError(path, f"file over the {max_bytes / 2**20:g} MiB limit")
    if not data:
        raise ImageDecodeError(path, "empty file (0 bytes)")
    if data[:2] == b"\xff\xd8" and _jpeg_truncated(data):
        raise ImageDecodeError(path, "truncated JPEG (no end-of-image marker)")
    return data


################################################################################
# JPEG headers: what each decoder needs to know before it decodes
################################################################################

_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start of frame; not DHT, JPG, DAC
_ARITHMETIC_SOF = frozenset({0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})  # arithmetic coding, which FFmpeg lacks
_SOS = 0xDA  # start of scan
_SEGMENT = struct.Struct(">BBH")  # a segment's 0xFF, marker and length
_SOF_FIELDS = struct.Struct(">BHHB")  # after a start-of-frame segment's length: precision, height, width, components


class _JpegHeader(NamedTuple):
    """A JPEG's frame header: its marker (0xC0 baseline, 0xC1 extended, 0xC2 progressive, …),
    pixels, components (1 grey, 3 YCbCr, 4 CMYK), each component's sampling factors (``h << 4 | v``),
    and where the next segment starts."""

    frame_type: int
    width: int
    height: int
    components: int
    sampling: bytes
    end: int

    @property
    def chroma_420(self) -> bool:  # YCbCr, chroma at half the resolution both ways
        return self.sampling == b"\x22\x11\x11"


def _parse_jpeg_header(data: bytes) -> _JpegHeader | None:
    """The frame header of JPEG data, or None: not JPEG, or no frame header before the first scan
    (corrupt). Parsed once per image, and passed on. The segments are walked by their lengths, so
    the markers of an EXIF thumbnail inside APP1 are skipped."""
    if data[:2] != b"\xff\xd8":
        return None
    i, end = 2, len(data) - 4
    while i <= end:
        fill, marker, length = _SEGMENT.unpack_from(data, i)
        if fill != 0xFF or marker == _SOS:
            return None
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in _SOF_MARKERS:
            if i + 10 > len(data):
                return None
            _, height, width, components = _SOF_FIELDS.unpack_from(data, i + 4)
            sampling = data[i + 11 : i + 10 + 3 * components : 3]  # each component: id, sampling, table
            return _JpegHeader(marker, width, height, components, sampling, i + 2 + length)
        else:
            i += 2 + length
    return None


def _jpeg_scan(data: bytes, i: int = 2) -> int:
    """The offset of JPEG data's first start of scan, the segments walked from offset ``i`` (a
    header's ``end`` goes on from there); 2 if the data ends or stops being segments first."""
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == _SOS:
            return i
        i += 1 if marker == 0xFF else 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return 2


def _jpeg_truncated(data: bytes) -> bool:
    """JPEG data that ends before its image does: no end-of-image marker after its first scan
    starts. Data after the image's end (a camera's trailer, a second image) is fine, as in PIL."""
    return not data.endswith(b"\xff\xd9") and data.find(b"\xff\xd9", _jpeg_scan(data)) == -1


################################################################################
# Decode on the CPU: FFmpeg for JPEG and PNG data, PIL for any other container
################################################################################

_JPEG_START = b"\xff\xd8\xff"  # start-of-image marker, then the next marker
_PNG_START = b"\x89PNG\r\n\x1a\n"


class _FilterGraphCache:
    """Per-thread FFmpeg filter graphs of one transform, by input size and pixel format: a graph's
    set-up costs about a decode, so each thread feeds a size's graph frame after frame (the same
    output). Kept from a size's second image on, so that the long tail of sizes met once never pushes
    out the common ones; at most ``capacity`` per thread (LRU), ``remembered`` sizes met once."""

    def __init__(self, transform: EvalTransform, capacity: int = 32, remembered: int = 4096) -> None:
        self.transform, self.capacity, self.remembered = transform, capacity, remembered
        self._local = threading.local()

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        """Resize, convert and crop one decoded frame into a ``size x size`` RGB frame."""
        state = self._local.__dict__
        graphs: dict = state.setdefault("graphs", {})  # the dict's order is the LRU order
        seen: dict = state.setdefault("seen", {})  # sizes met once, oldest first
        key = (frames.width, frames.height, frames.pix_fmt)
        graph = graphs.pop(key, None)
        keep = graph is not None or seen.pop(key, False) is None
        if graph is None:
            graph = _filter_graph(*key, self.transform.ffmpeg_filter(key[0], key[1]))
        graph.add_frames(frames)
        output = graph.get_frames()
        if keep:  # only a graph that worked goes into the cache
            graphs[key] = graph
            if len(graphs) > self.capacity:
                del graphs[next(iter(graphs))]
        else:
            seen[key] = None
            if len(seen) > self.remembered:
                del seen[next(iter(seen))]
        if output is None:
            raise RuntimeError("the filter graph produced no frame")
        return output


def _filter_graph(width: int, height: int, pix_fmt: str, chain: str) -> spdl.io.FilterGraph:
    # SPDL's make_filter_graph releases the GIL while FFmpeg configures the graph (about 1 ms);
    # spdl.io.FilterGraph(desc) holds it all that time (SPDL 0.8; bench/gil.py).
    source = f"buffer=video_size={width}x{height}:pix_fmt={pix_fmt}:time_base=1/25:pixel_aspect=1/1"
    return _libspdl.make_filter_graph(f"{source},{chain},buffersink")


@functools.cache
def _ffmpeg_jpeg_configs() -> tuple[spdl.io.DemuxConfig, spdl.io.DecodeConfig]:
    """How JPEG data is demuxed and decoded (made on first use: a config loads SPDL's native library).

    - The JPEG demuxer is named: no format probe.
    - ``fflags=noparse``: the whole file is one packet, as PIL reads it, so a second image after the
      first (an MPO, a phone photo's gain map) is not split off into a frame SPDL refuses.
    - On x86-64, the Xvid IDCT (SSE2): faster than the default and closer to PIL's libjpeg.
    - ``err_detect=explode``: damaged scan data fails, instead of a frame of garbage classified.
    """
    demux_config = spdl.io.demux_config(format="jpeg_pipe", format_options={"fflags": "noparse"})
    options = {"err_detect": "explode"}
    if platform.machine().lower() in ("x86_64", "amd64"):
        options["idct"] = "xvid"
    return demux_config, spdl.io.decode_config(decoder_options=options)


def _decode_frames(data: bytes) -> spdl.io.ImageFrames:
    """One image's JPEG or PNG data decoded by FFmpeg in its own pixel format; the first frame of
    several (an animated PNG), as PIL. Raises what SPDL raises for bad data (:py:data:`_DECODER_ERRORS`)."""
    # SPDL's native calls, as spdl.io.demux_image and decode_packets make them, without their
    # Python wrappers (a Demuxer object, a context manager, a usage log) around each image.
    demux_config, decode_config = _ffmpeg_jpeg_configs() if data.startswith(_JPEG_START) else (None, None)
    demuxer = _libspdl.make_demuxer(memoryview(data), demux_config=demux_config)
    try:
        packets = demuxer.demux_image(bsf=None)
    finally:
        demuxer._drop()
    return _libspdl.decode_packets(packets, decode_config=decode_config, filter_desc=None, num_frames=1)


def _decode_pil(path: str, transform: EvalTransform, data: bytes | None = None) -> Any:
    """One image decoded by PIL, resized and cropped as timm's validation does: a uint8
    ``size x size x 3`` numpy array. Raises ImageDecodeError: the file is unusable, or PIL cannot
    decode it."""
    import numpy as np
    from PIL import Image

    data = _read_image_bytes(path) if data is None else data
    with _decoder_errors(path, "PIL", also=(Image.DecompressionBombError,)):
        try:
            opened = Image.open(io.BytesIO(data))
        except Image.UnidentifiedImageError:
            raise ImageDecodeError(path, "not an image: its data is no format PIL or FFmpeg is used for") from None
        with opened as image:
            _check_size(path, image.size, transform)
            rgb = _pil_rgb(image)
        new_w, new_h, left, top = transform.geometry(*rgb.size)
        resized = rgb.resize((new_w, new_h), _PIL_RESAMPLE[transform.interpolation])
    return np.asarray(resized.crop((left, top, left + transform.size, top + transform.size)))


def _pil_rgb(image: Any) -> Any:
    """A PIL image in RGB, 16- and 32-bit grey scaled to 8 bits (PIL's conversion clips them: white)."""
    import numpy as np
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        return Image.fromarray((np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8)).convert("RGB")
    if image.mode == "I":  # 32-bit integers, as PIL opens 16-bit PNGs and TIFFs
        pixels = np.asarray(image, dtype=np.int64)
        return Image.fromarray((np.clip(pixels, 0, 65535) >> 8).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")


def _check_size(path: str, size: tuple[int, int] | None, transform: EvalTransform) -> None:
    """Refuse before decoding an image too large to decode (a small file declaring a huge image)
    or whose resize would be huge (a 65500 x 1 strip)."""
    if size is None or min(size) <= 0:
        return
    width, height = size
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageDecodeError(path, f"{width} x {height} pixels, over the limit of {MAX_IMAGE_PIXELS:,}")
    short = transform.resize_short
    if short * short * max(width, height) <= MAX_IMAGE_PIXELS * min(width, height):
        return  # the resize is at most short x (short x long / short): no need to work out its geometry
    new_w, new_h, _, _ = transform.geometry(width, height)
    if new_w * new_h > MAX_IMAGE_PIXELS:
        raise ImageDecodeError(path, f"a {width} x {height} image would be resized to {new_w} x {new_h}")


def _crop_on_cpu(
    path: str, data: bytes, header: _JpegHeader | None, graphs: _FilterGraphCache
) -> spdl.io.VideoFrames | Any:
    """One image decoded, resized and cropped on the CPU (``header``: its :py:func:`_parse_jpeg_header`):
    an RGB frame from FFmpeg for JPEG and still PNG; a numpy array from PIL, the reference, for
    arithmetic-coded JPEG (FFmpeg lacks it), animated PNG (FFmpeg picks another frame) and other
    containers (FFmpeg may decode a frame that is not the image: a JPEG-compressed TIFF is black)."""
    if data.startswith(_JPEG_START) and (header is None or header.frame_type not in _ARITHMETIC_SOF):
        size = (header.width, header.height) if header else None
    elif data.startswith(_PNG_START) and data.find(b"acTL", 8, max(data.find(b"IDAT"), 8)) == -1:
        size = (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) if len(data) >= 24 else None
    else:
        return _decode_pil(path, graphs.transform, data)
    _check_size(path, size, graphs.transform)
    try:  # what _decoder_errors does, without a context manager's objects for every image
        frames = _decode_frames(data)
        # Corrupt data can decode to no frame at all, which would fail the whole batch's conversion.
        if frames.width <= 0:
            raise ValueError("no frame decoded (corrupt data)")
        return graphs.apply(frames)
    except _DECODER_ERRORS as e:
        raise ImageDecodeError(path, f"FFmpeg cannot decode it: {_spdl_reason(e)}") from None


def _image_tensor(image: spdl.io.VideoFrames | Any) -> Tensor:
    """A cropped image as a uint8 ``S x S x 3`` CPU tensor."""
    if isinstance(image, _libspdl.VideoFrames):
        return to_torch(convert_frames([image]))[0, 0]
    return torch.from_numpy(image.copy())


################################################################################
# Batches: items -> (images, labels) on the device, bad images listed with their batch
################################################################################


class _Batch(tuple):
    """A decoded batch, unpacked as ``images, labels = batch``: images uint8 ``N x 3 x S x S``
    (RGB, channels-last in memory), labels int64 ``N x 1``, both on the device. ``paths`` names
    each row's image; ``failures`` are its bad images, left out; a GPU decoder's ``fallbacks`` are
    the images it left to the CPU, ``decoded_by`` those each backend decoded. :py:func:`benchmark`
    records them, once, as it receives the batch."""

    def __new__(cls, images: Tensor, labels: Tensor, paths: Sequence[str] = (),
                failures: Sequence[ImageDecodeError] = (), fallbacks: int = 0,
                decoded_by: dict[str, int] | None = None) -> _Batch:  # fmt: skip
        batch = super().__new__(cls, (images, labels))
        batch.paths, batch.failures = tuple(paths), tuple(failures)
        batch.fallbacks, batch.decoded_by = fallbacks, decoded_by or {}
        return batch

    def __reduce__(self) -> tuple:  # from a --decode-processes worker (its tensors through shared memory)
        return type(self), (*self, self.paths, self.failures, self.fallbacks, self.decoded_by)


def _record_batch(batch: tuple, result: RunResult, failures: list[ImageDecodeError]) -> None:
    """What :py:func:`benchmark` takes from each batch it receives: its bad images into ``failures``
    (in the order met), its GPU fallbacks and backends into ``result``."""
    failures += getattr(batch, "failures", ())
    result.decoder_fallbacks += getattr(batch, "fallbacks", 0)
    for backend, count in getattr(batch, "decoded_by", {}).items():
        result.decoder_backends[backend] = result.decoder_backends.get(backend, 0) + count


def _label_tensor(labels: list[int], device: torch.device) -> Tensor:
    return torch.tensor(labels, dtype=torch.int64).view(-1, 1).to(device, non_blocking=True)


def _empty_batch(transform: EvalTransform, device: torch.device, failures: Sequence[ImageDecodeError]) -> _Batch:
    images = torch.empty((0, transform.size, transform.size, 3), dtype=torch.uint8, device=device)
    return _Batch(images.permute(0, 3, 1, 2), _label_tensor([], device), (), failures)


# The stall registry: thread ident -> (path, time.monotonic() when it began) of the image that
# decode thread is on, None between batches. Each thread stores only its own entry, one dict store
# (atomic under the GIL): no lock per image. A stalled run names the oldest (_oldest_in_progress).
_DECODING: dict[int, tuple[str, float] | None] = {}


@contextlib.contextmanager
def _working_on(path: str) -> Iterator[None]:
    """Mark ``path`` as this thread's image for the duration (a GPU decoder's batched call)."""
    key = threading.get_ident()
    _DECODING[key] = (path, time.monotonic())
    try:
        yield
    finally:
        _DECODING[key] = None


def _oldest_in_progress() -> tuple[str, float] | None:
    """``(path, seconds)`` of the image a decode thread has been on the longest, or None."""
    marks = [mark for mark in list(_DECODING.values()) if mark is not None]  # list(): one step
    if not marks:
        return None
    path, started = min(marks, key=lambda mark: mark[1])
    return path, time.monotonic() - started


def _decode_items(
    items: Sequence[tuple[str, int]],
    decode_one: Callable[[str], Any],
    policy: BadImagePolicy | None,
    failures: list[ImageDecodeError],
) -> tuple[list[Any], list[int], list[str]]:
    """``(decoded images, their labels, their paths)``: a bad image added to ``failures`` and left
    out (raised without a policy); another error (out of memory, a bug) raised with its image's path
    in ``_while_decoding``, for :py:func:`_loader_failed`. Each image is marked in :py:data:`_DECODING`."""
    decoded, labels, paths = [], [], []
    marks, key = _DECODING, threading.get_ident()
    try:
        for path, label in items:
            marks[key] = (path, time.monotonic())
            try:
                decoded.append(decode_one(path))
            except ImageDecodeError as e:
                if policy is None:
                    raise
                failures.append(e)
                continue
            except Exception as e:
                e._while_decoding = path
                raise
            labels.append(label)
            paths.append(path)
    finally:
        marks[key] = None
    return decoded, labels, paths


def _ffmpeg_decode_func(
    transform: EvalTransform, device: torch.device, policy: BadImagePolicy | None, max_bytes: int
) -> Callable[[Sequence[tuple[str, int]]], _Batch]:
    cuda_config = _spdl_cuda_config(device) if device.type == "cuda" else None
    graphs = _FilterGraphCache(transform)

    def decode_one(path: str) -> Any:
        data = _read_image_bytes(path, max_bytes)
        return _crop_on_cpu(path, data, _parse_jpeg_header(data), graphs)

    def decode_batch_ffmpeg(items: Sequence[tuple[str, int]]) -> _Batch:
        failures: list[ImageDecodeError] = []
        crops, labels, paths = _decode_items(items, decode_one, policy, failures)
        if not crops:
            return _empty_batch(transform, device, failures)
        if all(isinstance(crop, _libspdl.VideoFrames) for crop in crops):  # one conversion for the batch
            buffer = convert_frames(crops)
            images = to_torch(buffer if cuda_config is None else transfer_buffer(buffer, device_config=cuda_config))
            images = images.squeeze(1).to(device)
        else:  # PIL decoded some of them
            images = torch.stack([_image_tensor(crop) for crop in crops]).to(device)
        # NHWC memory seen as NCHW: the channels-last layout convolutions prefer.
        return _Batch(images.permute(0, 3, 1, 2), _label_tensor(labels, device), paths, failures)

    return decode_batch_ffmpeg


################################################################################
# Decode on the GPU: nvJPEG through nvImageCodec (or torchvision), and NVDEC (SPDL)
################################################################################

NVIMGCODEC_BACKENDS = ("hardware", "cuda", "hybrid")  # nvImageCodec's on a GPU, each its own decoder, in this order
NVIMGCODEC_CPU_THREADS = 1  # per decoder: each pipeline thread has decoders of its own
NVDEC_CONCURRENCY = 4  # batches decoded at once with NVDEC: one hardware decoder per thread
NVDEC_MIN_SIDE, NVDEC_MAX_SIZE = 64, (32768, 16384)  # JPEG on A100 / H100 (SPDL's capability table)
FPS_WINDOW_SLACK = 0.1  # the most FPS may overstate a loader-bound rate without a warning
CHECK_DECODER_IMAGES = 8  # images a GPU decoder is compared with FFmpeg on before a run (--check-decoder)
DECODER_TOLERANCE = 3.0  # mean absolute difference (0-255) a GPU decoder may show against FFmpeg, per image


def _spdl_cuda_error() -> str | None:
    """Why SPDL's CUDA extension cannot load here (e.g. a missing ``libnvcuvid.so``), or None.
    SPDL's ``built_with_*`` functions say only False in that case."""
    import spdl.io.lib

    try:
        spdl.io.lib._import_libspdl_cuda()
    except (RuntimeError, ImportError, OSError) as e:
        # One "module: reason" per build SPDL tried (one per FFmpeg version): the distinct reasons.
        reasons = dict.fromkeys(re.findall(r'"[\w.]+: ([^"]+)"', str(e))) or [str(e)]
        text = "; ".join(reasons)
        if "libnvcuvid" in text:
            text += (" (link libnvcuvid.so to the driver's libnvcuvid.so.1; in a container, "
                     "NVIDIA_DRIVER_CAPABILITIES must include video)")  # fmt: skip
        return text
    return None


def _spdl_cuda_config(device: torch.device, stream: torch.cuda.Stream | None = None) -> spdl.io.CUDAConfig:
    """SPDL's CUDA config: allocations through torch's caching allocator, work on ``stream``
    (default: SPDL's per-thread default stream)."""
    kwargs = {} if stream is None else {"stream": stream.cuda_stream}
    return spdl.io.cuda_config(
        device_index=device.index or 0,
        allocator=(torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete),
        **kwargs,
    )


class _ThreadStreams:
    """A CUDA stream and SPDL config per decode thread. SPDL's copies and allocations and torch's
    work on a batch go in order on the thread's stream, and the thread waits for it once per
    batch, before handing the batch to the model on another stream. On the CPU (where the
    nvJPEG path runs torchvision's CPU decoder, for tests), nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._local = threading.local()

    def get(self) -> tuple[torch.cuda.Stream | None, spdl.io.CUDAConfig | None]:
        if self.device.type != "cuda":
            return None, None
        if not hasattr(self._local, "stream"):
            self._local.stream = torch.cuda.Stream(self.device)
            self._local.config = _spdl_cuda_config(self.device, self._local.stream)
        return self._local.stream, self._local.config

    @contextlib.contextmanager
    def on(self, stream: torch.cuda.Stream | None) -> Iterator[None]:
        """Run the block on ``stream`` (and its device); then wait for the stream's work."""
        if stream is None:
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            yield
        stream.synchronize()


def _resize_crop_on_device(image: Tensor, transform: EvalTransform, size: tuple[int, int] | None = None) -> Tensor:
    """Resize a ``3 x H x W`` image on its device and centre-crop it, as the CPU path does:
    antialiased, with the geometry of an image of ``size`` (width, height; default: its own).
    torch's antialiased bicubic is PIL's; torch has no lanczos, so bicubic stands in for it."""
    return _resize_crop(image[None], transform, size or (image.shape[-1], image.shape[-2]))[0]


def _resize_crop(images: Tensor, transform: EvalTransform, size: tuple[int, int]) -> Tensor:
    """:py:func:`resize_crop_on_device` for uint8 ``N x 3 x H x W`` images in one call: uint8 ``N x 3 x S x S``."""
    new_w, new_h, left, top = transform.geometry(*size)
    mode = "bicubic" if transform.interpolation == "lanczos" else transform.interpolation
    resized = torch.nn.functional.interpolate(
        images.float(), size=(new_h, new_w), mode=mode, antialias=mode != "nearest"
    )
    if left < 0 or top < 0:  # crop_pct > 1: the crop is padded with black, as on the CPU
        s = transform.size
        resized = torch.nn.functional.pad(resized, (-min(left, 0), max(left + s - new_w, 0), -min(top, 0),
                                                    max(top + s - new_h, 0)))  # fmt: skip
        left, top = max(left, 0), max(top, 0)
    crop = resized[:, :, top : top + transform.size, left : left + transform.size]
    return crop.round_().clamp_(0, 255).to(torch.uint8)


def _resize_crop_groups(images: Sequence[Tensor], transform: EvalTransform) -> list[Tensor]:
    """Resize and crop ``3 x H x W`` uint8 images on their device as :py:func:`resize_crop_on_device`
    does, with one call for all the images of one size: a batch's few sizes (ImageNet's 500 x 375
    and 375 x 500 are most of it) make few kernels, not several per image.

    Returns:
        uint8 ``3 x S x S`` per image, in the order given (views into one tensor per size).
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault((int(image.shape[-1]), int(image.shape[-2])), []).append(i)
    out: dict[int, Tensor] = {}
    for size, members in groups.items():
        out.update(zip(members, _resize_crop(torch.stack([images[i] for i in members]), transform, size), strict=True))
    return [out[i] for i in range(len(images))]


def _nv12_to_rgb(nv12: Tensor) -> Tensor:
    """Full-range BT.601 (JFIF) NV12 to RGB: a JPEG's colours, as libjpeg and FFmpeg give them.

    Args:
        nv12: uint8 ``1.5H x W`` (H and W even): the luma plane, then the chroma plane with U
            and V interleaved, as NVDEC returns it.

    Returns:
        float32 ``3 x H x W`` on the same device, 0-255 (not rounded). Chroma is upsampled
        bilinearly, sited between the luma samples as JPEG places it.
    """
    height, width = nv12.shape[0] * 2 // 3, nv12.shape[1]
    y = nv12[:height].float()
    uv = nv12[height:].view(height // 2, width // 2, 2).permute(2, 0, 1).float() - 128.0
    u, v = torch.nn.functional.interpolate(uv[None], size=(height, width), mode="bilinear", align_corners=False)[0]
    return torch.stack([y + 1.402 * v, y - 0.344136 * u - 0.714136 * v, y + 1.772 * u]).clamp_(0, 255)


def _nvdec_can_take(header: _JpegHeader | None) -> bool:
    """NVDEC decodes sequential (baseline or extended) 8-bit 4:2:0 JPEGs within its size range."""
    return (
        header is not None
        and header.frame_type in (0xC0, 0xC1)
        and header.chroma_420
        and NVDEC_MIN_SIDE <= header.width <= NVDEC_MAX_SIZE[0]
        and NVDEC_MIN_SIDE <= header.height <= NVDEC_MAX_SIZE[1]
    )


def _nvjpeg_can_take(header: _JpegHeader | None) -> bool:
    """nvJPEG takes baseline, extended and progressive JPEGs of 1 or 3 components; CMYK decodes
    to wrong colours without an error, so it goes to FFmpeg."""
    return header is not None and header.frame_type in (0xC0, 0xC1, 0xC2) and header.components in (1, 3)


def _nvjpeg_takes(header: _JpegHeader | None, transform: EvalTransform) -> bool:
    """nvJPEG is given the JPEGs it takes (:py:func:`_nvjpeg_can_take`) within the size limits;
    the CPU refuses the others, naming the limit (see :py:func:`_check_size`)."""
    if not _nvjpeg_can_take(header) or min(header.width, header.height) <= 0:
        return False
    new_w, new_h, _, _ = transform.geometry(header.width, header.height)
    return max(header.width * header.height, new_w * new_h) <= MAX_IMAGE_PIXELS


def _first_jpeg_image(data: bytes, start: int = 2) -> bytes:
    """JPEG data cut after its first image's end: NVDEC gets neither a second image (an MPO, a
    gain map) nor a trailer, as FFmpeg decodes only the first. ``start``: a header's ``end``."""
    end = data.find(b"\xff\xd9", _jpeg_scan(data, start))
    return data if end == -1 else data[: end + 2]


@functools.cache
def _nvimgcodec() -> tuple[Any | None, str]:
    """nvImageCodec's module (None when it is not installed), and what its import printed (its
    lines; why it is not installed).

    The import prints a line to stderr for each library it cannot load (nvJPEG2000 and nvTIFF,
    which JPEGs do not need; nvJPEG, which a GPU does): taken here, once, so that a run's output
    does not carry them, and kept for the reason a GPU has no decoder. Its log is silent unless
    ``PYNVIMGCODEC_VERBOSITY`` says otherwise: what it cannot decode is counted here instead.
    While it imports, whatever another thread writes to stderr lands in the same place.
    """
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)
        try:
            from nvidia import nvimgcodec
        except ImportError as e:
            nvimgcodec, error = None, f"nvImageCodec is not installed ({e})"
        else:
            error = ""
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        text = "\n".join(line.strip() for line in said.read().decode(errors="replace").splitlines() if line.strip())
    if text:
        _LG.debug("nvImageCodec's import printed: %s", text)
    return nvimgcodec, error or text


def _nvimgcodec_decoder(backend: str, device_id: int) -> Any:
    """An nvImageCodec decoder with one backend: ``hardware`` (the GPU's JPEG engines), ``cuda``
    (CUDA kernels alone), ``hybrid`` (nvJPEG's CUDA decoder, which nvImageCodec files under
    HYBRID_CPU_GPU: Huffman decoding on the GPU for baseline images over a megapixel, on the CPU
    otherwise) or ``cpu`` (libjpeg-turbo; ``device_id`` NVIMGCODEC_DEVICE_CPU_ONLY). Chroma is
    upsampled by interpolation ("fancy"), as libjpeg and FFmpeg upsample it.

    Raises:
        RuntimeError: nvImageCodec has no decoder of that kind here (no JPEG engine, no nvJPEG).
    """
    nvimgcodec, _ = _nvimgcodec()
    kinds = {"hardware": nvimgcodec.HW_GPU_ONLY, "cuda": nvimgcodec.GPU_ONLY, "hybrid": nvimgcodec.HYBRID_CPU_GPU,
             "cpu": nvimgcodec.CPU_ONLY}  # fmt: skip
    return nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=NVIMGCODEC_CPU_THREADS,
                              backends=[nvimgcodec.Backend(kinds[backend])], options=":fancy_upsampling=1")  # fmt: skip


def _nvimgcodec_decoders(device: torch.device, errors: list[str] | None = None) -> list[tuple[str, Any]]:
    """``(backend, decoder)`` in the order a batch goes through them, each taking the images those
    before it left: on a GPU, those of :py:data:`NVIMGCODEC_BACKENDS` that nvImageCodec has there
    (``hardware`` only where the GPU has JPEG engines); on the CPU (for tests), libjpeg-turbo.
    Why each missing one is missing goes to ``errors``."""
    nvimgcodec, _ = _nvimgcodec()
    if device.type != "cuda":
        return [("cpu", _nvimgcodec_decoder("cpu", nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY))]
    decoders = []
    for backend in NVIMGCODEC_BACKENDS:
        try:
            decoders.append((backend, _nvimgcodec_decoder(backend, device.index or 0)))
        except RuntimeError as e:  # "Could not create decoder": none of that kind on this GPU
            _LG.debug("nvImageCodec has no %s decoder on %s: %s", backend, device, e)
            if errors is not None:
                errors.append(f"{backend}: {e}")
    return decoders


@functools.cache
def _nvimgcodec_params() -> Any:
    """8-bit interleaved RGB, EXIF orientation not applied (PIL and timm's reference do not apply it)."""
    nvimgcodec, _ = _nvimgcodec()
    return nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.SRGB, allow_any_depth=False,
                                   sample_format=nvimgcodec.I_RGB)  # fmt: skip


def _nvimgcodec_tensor(image: Any) -> Tensor:
    """An nvImageCodec image as a ``3 x H x W`` uint8 tensor, without a copy: from the device
    through DLPack (which orders the consumer's stream after the decode), from host memory
    through numpy (nvImageCodec's DLPack export calls CUDA even for a host image)."""
    if image.device_id is None:
        import numpy as np

        return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
    return torch.from_dlpack(image).permute(2, 0, 1)


def _decode_nvimgcodec(
    datas: list[bytes], headers: list[_JpegHeader | None], transform: EvalTransform, decoders: list[tuple[str, Any]],
    stream: int,
) -> tuple[list[Tensor | None], dict[str, int]]:
    """Decode the JPEGs nvJPEG takes (:py:func:`_nvjpeg_takes`) with nvImageCodec, one batched
    call per decoder (each takes what the one before it left), then resize and crop them by size
    (:py:func:`_resize_crop_groups`).

    EXIF orientation is not applied (:py:func:`_nvimgcodec_params`). The file bytes are read
    where they are (a ``CodeStream`` keeps a reference to them, not a copy).

    Args:
        stream: The ``cudaStream_t`` the decoded images are ordered on (0 on the CPU).

    Returns:
        uint8 ``3 x S x S`` per image, None for each left to the CPU; and how many images each
        backend decoded.
    """
    nvimgcodec, _ = _nvimgcodec()
    code_streams = {}
    for i, (data, header) in enumerate(zip(datas, headers, strict=True)):
        if _nvjpeg_takes(header, transform):
            with contextlib.suppress(RuntimeError):  # "Failed to get image info": left to the CPU
                code_streams[i] = nvimgcodec.CodeStream(data)
    left, params = list(code_streams), _nvimgcodec_params()
    decoded: dict[int, Tensor] = {}
    counts: dict[str, int] = {}
    for backend, decoder in decoders:
        if not left:
            break
        images = decoder.decode([code_streams[i] for i in left], params=params, cuda_stream=stream)
        done = {i: _nvimgcodec_tensor(image) for i, image in zip(left, images, strict=True) if image is not None}
        counts[backend] = len(done)
        decoded.update(done)
        left = [i for i in left if i not in done]
    crops = dict(zip(decoded, _resize_crop_groups(list(decoded.values()), transform), strict=True))
    return [crops.get(i) for i in range(len(datas))], counts


def _decode_nvjpeg(
    datas: list[bytes], headers: list[_JpegHeader | None], transform: EvalTransform, device: torch.device
) -> tuple[list[Tensor | None], dict[str, int]]:
    """Decode the JPEGs nvJPEG takes in one batched call to torchvision (which serialises calls
    behind a lock), then resize and crop them by size; None for each image left to the CPU. A
    batch that fails is retried image by image, so one bad image does not send the others to
    the CPU. Used for ``nvjpeg`` where nvImageCodec is not installed."""
    import torchvision.io

    out: list[Tensor | None] = [None] * len(datas)
    takes = [i for i, header in enumerate(headers) if _nvjpeg_takes(header, transform)]
    if not takes:
        return out, {}
    encoded = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in takes]
    mode = torchvision.io.ImageReadMode.RGB
    try:
        decoded: list[Tensor | None] = list(torchvision.io.decode_jpeg(encoded, mode=mode, device=device))
    except RuntimeError:
        decoded = []
        for tensor in encoded:
            try:
                decoded.append(torchvision.io.decode_jpeg(tensor, mode=mode, device=device))
            except RuntimeError:
                decoded.append(None)
    kept = [(i, image) for i, image in zip(takes, decoded, strict=True) if image is not None]
    for (i, _), crop in zip(kept, _resize_crop_groups([image for _, image in kept], transform), strict=True):
        out[i] = crop
    return out, {"torchvision": len(kept)}


def _decode_nvdec_one(
    data: bytes, header: _JpegHeader | None, transform: EvalTransform, config: spdl.io.CUDAConfig,
    bound: threading.local,
) -> Tensor | None:
    """One JPEG through NVDEC, or None if NVDEC cannot take it or fails on it.

    SPDL keeps one NVDEC decoder per thread and keeps the CUDA config (stream, allocator) of
    its first use for good (``NvDecDecoderCore::init_decoder`` takes a new one only for another
    device). ``bound.config`` is the config this thread's decoder was made with: for another
    (a new decode function, the start-up probe before it), the decoder is made afresh, so that
    its NV12 buffers are allocated and copied on the stream that then reads them.

    NVDEC returns NV12 at the image's size made even (SPDL refuses odd sizes; a 1-pixel
    stretch), converted here with JPEG's colour matrix, then resized and cropped with the
    geometry of the original size, antialiased, as the CPU path does (NVDEC's own scaler has no
    antialiasing)."""
    if not _nvdec_can_take(header):
        return None
    try:
        packets = spdl.io.demux_video(_first_jpeg_image(data, header.end))
        width, height = packets.width, packets.height
        even_w, even_h = width + width % 2, height + height % 2
        decoder = spdl.io.nvdec_decoder(
            config, packets.codec, use_cache=getattr(bound, "config", None) is config,
            scale_width=even_w if even_w != width else -1, scale_height=even_h if even_h != height else -1,
        )  # fmt: skip
        bound.config = config
        nv12 = spdl.io.to_torch(decoder.decode_packets(packets))
    except _DECODER_ERRORS as e:
        _LG.debug("NVDEC left an image to the CPU: %s", _spdl_reason(e))
        return None
    return _resize_crop_on_device(_nv12_to_rgb(nv12[0]), transform, (width, height))


def _fall_back(
    path: str, data: bytes, header: _JpegHeader | None, graphs: _FilterGraphCache, device: torch.device,
    policy: BadImagePolicy | None, failures: list[ImageDecodeError],
) -> Tensor | None:  # fmt: skip
    """An image a GPU decoder left, decoded on the CPU as the FFmpeg loader decodes it: uint8
    ``3 x S x S`` on ``device``; None if it is a bad image."""

    def decode(p: str) -> Tensor:
        return _image_tensor(_crop_on_cpu(p, data, header, graphs)).permute(2, 0, 1).to(device)

    decoded, _, _ = _decode_items([(path, 0)], decode, policy, failures)
    return decoded[0] if decoded else None


def _gpu_decode_func(
    decode_on_gpu: Callable[..., tuple[list[Tensor | None], dict[str, int]]],
    transform: EvalTransform,
    device: torch.device,
    policy: BadImagePolicy | None,
    max_bytes: int,
) -> Callable[[Sequence[tuple[str, int]]], _Batch]:
    """The batch function of a GPU decoder: read the files, let ``decode_on_gpu(datas, headers,
    stream, config)`` decode those it takes on the thread's stream (it says how many each of its
    backends decoded), decode the rest on the CPU one by one (the batch's fallbacks); a bad image
    as the policy says."""
    graphs = _FilterGraphCache(transform)
    streams = _ThreadStreams(device)

    def decode_batch_gpu(items: Sequence[tuple[str, int]]) -> _Batch:
        stream, config = streams.get()
        failures: list[ImageDecodeError] = []
        with streams.on(stream):
            datas, labels, paths = _decode_items(items, lambda path: _read_image_bytes(path, max_bytes), policy, failures)
            headers = [_parse_jpeg_header(data) for data in datas]  # once per image, for each decoder
            with _working_on(paths[0]) if paths else contextlib.nullcontext():
                on_gpu, counts = decode_on_gpu(datas, headers, stream, config)
            images, kept, fallbacks = [], [], 0
            for i, image in enumerate(on_gpu):
                if image is None:
                    image = _fall_back(paths[i], datas[i], headers[i], graphs, device, policy, failures)
                    if image is None:
                        continue
                    fallbacks += 1
                images.append(image)
                kept.append(i)
            if not images:
                return _empty_batch(transform, device, failures)
            # One memory layout for every batch, as the FFmpeg path delivers: a compiled model
            # would recompile for another.
            batch = torch.stack(images).contiguous(memory_format=torch.channels_last)
            batch_labels = _label_tensor([labels[i] for i in kept], device)
        decoded_by = {backend: count for backend, count in counts.items() if count}
        return _Batch(batch, batch_labels, [paths[i] for i in kept], failures, fallbacks, decoded_by)

    return decode_batch_gpu


def _nvjpeg_library() -> str:
    """What decodes for ``nvjpeg``: ``nvimgcodec`` where it is installed (batched, every backend,
    the hardware engines), else ``torchvision`` (one decoder behind one lock, CUDA only)."""
    return "torchvision" if _nvimgcodec()[0] is None else "nvimgcodec"


def _nvjpeg_decode_func(
    transform: EvalTransform, device: torch.device, policy: BadImagePolicy | None, max_bytes: int,
    library: str | None = None,
) -> Callable[[Sequence[tuple[str, int]]], _Batch]:  # fmt: skip
    """The ``nvjpeg`` batch function, with ``library`` (default :py:func:`_nvjpeg_library`)."""
    if (library or _nvjpeg_library()) == "torchvision":
        return _gpu_decode_func(
            lambda datas, headers, _stream, _config: _decode_nvjpeg(datas, headers, transform, device), transform,
            device, policy,
            max_bytes,
        )  # fmt: skip
    local = threading.local()  # nvImageCodec's decoders are not for concurrent calls: a set per thread

    def decode_on_gpu(
        datas: list[bytes], headers: list, stream: torch.cuda.Stream | None, _config: Any
    ) -> tuple[list, dict]:
        if not hasattr(local, "decoders"):
            local.decoders = _nvimgcodec_decoders(device)
        cuda_stream = 0 if stream is None else stream.cuda_stream
        return _decode_nvimgcodec(datas, headers, transform, local.decoders, cuda_stream)

    return _gpu_decode_func(decode_on_gpu, transform, device, policy, max_bytes)


def _nvdec_decode_func(
    transform: EvalTransform, device: torch.device, policy: BadImagePolicy | None, max_bytes: int
) -> Callable[[Sequence[tuple[str, int]]], _Batch]:
    if device.type != "cuda":
        raise ValueError(f"nvdec decodes on a CUDA GPU, not on {device}")

    bound = threading.local()  # the config each thread's NVDEC decoder was made with

    def decode_on_gpu(
        datas: list[bytes], headers: list, _stream: Any, config: spdl.io.CUDAConfig | None
    ) -> tuple[list, dict]:
        pairs = zip(datas, headers, strict=True)
        images = [_decode_nvdec_one(data, header, transform, config, bound) for data, header in pairs]
        return images, {"nvdec": sum(image is not None for image in images)}

    return _gpu_decode_func(decode_on_gpu, transform, device, policy, max_bytes)


_DECODERS = {"ffmpeg": _ffmpeg_decode_func, "nvjpeg": _nvjpeg_decode_func, "nvdec": _nvdec_decode_func}


def get_decode_func(
    device: torch.device | str = "cpu",
    transform: EvalTransform | None = None,
    decoder: str = "ffmpeg",
    policy: BadImagePolicy | None = None,
    *,
    max_image_bytes: int = MAX_IMAGE_MB << 20,
) -> Callable[[Sequence[tuple[str, int]]], _Batch]:
    """Return a function that decodes a batch of ``(path, label)`` items into a :py:class:`Batch`.

    ``images, labels = decode(items)``: images uint8 ``N x 3 x size x size`` (RGB,
    channels-last in memory), labels int64 ``N x 1``, both on ``device``; ``.paths`` names each
    row's image. With FFmpeg on CUDA the decoded batch is copied through SPDL's CUDA transfer,
    into memory from torch's caching allocator; on the CPU there is no copy.

    Args:
        device: Where the batch is delivered.
        transform: Resize and crop to apply (default: 224 crop of 256, bicubic).
        decoder: ``ffmpeg`` (CPU), ``nvjpeg`` or ``nvdec`` (GPU; call
            :py:func:`check_gpu_decoder` first for a clear message if unavailable). A GPU
            decoder hands the images it cannot take to the CPU, one by one. ``nvjpeg`` decodes
            with nvImageCodec where it is installed, else with torchvision; on the CPU it runs
            the same path with their CPU decoders (libjpeg-turbo; for tests).
        policy: Where bad images are recorded and left out of the batch (labels stay aligned),
            and GPU fallbacks and each GPU backend's images counted; give the same one to
            :py:func:`benchmark`. Without one,
            the first bad image raises ImageDecodeError.
        max_image_bytes: A larger image file is a bad image.
    """
    device = torch.device(device)
    if decoder not in _DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; expected one of {sorted(_DECODERS)}")
    return _DECODERS[decoder](transform or EvalTransform(), device, policy, max_image_bytes)


def _probe_image() -> bytes:
    """A 256 x 192 baseline 4:2:0 JPEG of one colour, well inside every GPU decoder's range."""
    from PIL import Image

    encoded = io.BytesIO()
    Image.new("RGB", (256, 192), (200, 80, 40)).save(encoded, format="JPEG", subsampling=2, quality=95)
    return encoded.getvalue()


def _check_gpu_decoder(decoder: str, device: torch.device) -> str:
    """Check that a decoder can run on ``device``: SPDL's CUDA extension loads, and a GPU decoder
    decodes a small JPEG to the right colour. Returns the backend's name.

    Raises:
        InputError: with the reason (the real import error, the driver's message, …).
    """
    cuda_error = _spdl_cuda_error() if device.type == "cuda" else None
    if decoder == "ffmpeg":
        if cuda_error is not None:
            raise InputError(f"SPDL's CUDA extension, which copies batches to {device}, cannot load: {cuda_error}",
                             "--device")
        return "ffmpeg"
    flag = f"--use-{decoder}"
    if device.type != "cuda" or not torch.cuda.is_available():
        raise InputError(f"{flag} decodes on a CUDA GPU, but this run uses {device}", flag, _FFMPEG_ADVICE)
    if cuda_error is not None:
        raise InputError(f"SPDL's CUDA extension cannot load: {cuda_error}", flag, _FFMPEG_ADVICE)
    if decoder == "nvdec" and not spdl.io.utils.built_with_nvcodec():
        raise InputError(f"the installed SPDL ({_version('spdl')}) is built without NVDEC", flag, _FFMPEG_ADVICE)
    backend = _nvimgcodec_check(device) if decoder == "nvjpeg" and _nvjpeg_library() == "nvimgcodec" else None
    transform, policy = EvalTransform(size=128, crop_pct=1.0), BadImagePolicy(skip=True)
    try:
        with tempfile.NamedTemporaryFile(suffix=".JPEG") as f:
            f.write(_probe_image())
            f.flush()
            batch = get_decode_func(device, transform, decoder, policy)([(f.name, 0)])
    except _DECODER_ERRORS as e:
        raise InputError(f"{flag} cannot decode a JPEG on {_device_name(device)}: {_spdl_reason(e)}", flag,
                         _FFMPEG_ADVICE) from None
    images = batch[0]
    if batch.failures or batch.fallbacks or not len(images):
        raise InputError(f"{flag} cannot decode a plain JPEG on {_device_name(device)}", flag, _FFMPEG_ADVICE)
    colour = images.float().mean(dim=(0, 2, 3)).tolist()
    if max(abs(c - e) for c, e in zip(colour, (200, 80, 40), strict=True)) > 4:
        raise InputError(f"{flag} decodes a JPEG of RGB (200, 80, 40) to {[round(c) for c in colour]}", flag,
                         _FFMPEG_ADVICE)
    return backend or ("torchvision" if decoder == "nvjpeg" else "spdl")


def _nvimgcodec_check(device: torch.device) -> str:
    """``nvimgcodec (hardware, hybrid)``: the backends nvImageCodec has on ``device``.

    Raises:
        InputError: it has none (nvJPEG's library missing, a driver too old for CUDA 13).
    """
    errors: list[str] = []
    backends = [backend for backend, _ in _nvimgcodec_decoders(device, errors)]
    if not backends:
        # What its import printed (when it was first imported here) about nvJPEG, not about the
        # libraries JPEGs do not need.
        said = [line for line in _nvimgcodec()[1].splitlines() if "nvjpeg library" in line.lower()]
        hint = " (pip install nvidia-nvjpeg, CUDA 13's nvJPEG)" if said else ""
        reasons = "; ".join([*said, *errors])
        raise InputError(f"nvImageCodec has no JPEG decoder on {device}{hint}: {reasons}", "--use-nvjpeg",
                         _FFMPEG_ADVICE)
    return f"nvimgcodec ({', '.join(backends)})"


@dataclass
class _DecoderCheck:
    """A decoder against FFmpeg on the CPU, image by image (see :py:func:`check_decoder`).

    Attributes:
        decoder: The decoder checked.
        images: Images compared (those both decoded).
        mad_mean, mad_max: Mean and largest per-image mean absolute difference (0-255).
        worst: The image with the largest difference.
        tolerance: The largest per-image difference allowed.
    """

    decoder: str
    images: int
    mad_mean: float
    mad_max: float
    worst: str | None
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.mad_max <= self.tolerance


def _check_decoder(
    decode: Callable[[Sequence[tuple[str, int]]], _Batch],
    items: Sequence[tuple[str, int]],
    transform: EvalTransform,
    decoder: str,
    tolerance: float = DECODER_TOLERANCE,
) -> _DecoderCheck:
    """Decode ``items`` with ``decode`` and with FFmpeg on the CPU, and compare the pixels.

    Images either decoder cannot decode are left out (the run's policy deals with them).

    Raises:
        InputError: an image differs by more than ``tolerance``: the decoder, on this
            hardware and driver, does not deliver the images FFmpeg does.
    """
    reference = get_decode_func("cpu", transform)
    mads: dict[str, float] = {}
    for item in items:
        try:
            (theirs, _), (ours, _) = decode([item]), reference([item])
        except ImageDecodeError:
            continue
        if len(theirs) and len(ours):
            mads[item[0]] = (theirs[0].cpu().float() - ours[0].float()).abs().mean().item()
    worst = max(mads, key=mads.__getitem__, default=None)
    values = list(mads.values())
    check = _DecoderCheck(decoder, len(values), sum(values) / len(values) if values else 0.0,
                         max(values, default=0.0), worst, tolerance)  # fmt: skip
    if not check.ok:
        raise InputError(
            f"{decoder} decodes {worst} with a mean absolute difference of {check.mad_max:.1f} "
            f"(0-255) from FFmpeg on the CPU, more than {tolerance:g}",
            *(("--device",) if decoder == "ffmpeg" else (f"--use-{decoder}", _FFMPEG_ADVICE)),
        )
    return check


################################################################################
# Pipeline
################################################################################


_SPDL_STAGE_BUFFER = 2  # batches SPDL's queue between the decode stage and the sink holds (its _BUFFER_SIZE)


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
        self.changes: list[tuple[float, bool]] = []  # (time, whether a batch is now waiting)
        self.taken = 0  # batches taken over the queue's whole life, never restarted
        self.window_opened: tuple[float, int] | None = None  # (time, taken) at the last restart

    def restart(self) -> None:
        """Count afresh from now."""
        with self._lock:
            self.started = now = time.monotonic()
            self.empty_s, self.gets, self.get_wait_s, self.last_get = 0.0, 0, 0.0, None
            self.empty_since = now if self.qsize() == 0 else None
            self.window_opened = (now, self.taken)

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        with self._lock:
            self.started = self.empty_since = time.monotonic()
        async with super().stage_hook():
            yield

    async def put(self, item: object) -> None:
        with self._lock:
            now = time.monotonic()
            if self.empty_since is not None:
                self.empty_s += now - self.empty_since
                self.empty_since = None
            self.changes.append((now, True))
        await super().put(item)

    async def get(self) -> object:
        t0 = time.monotonic()
        item = await super().get()
        with self._lock:
            self.last_get = now = time.monotonic()
            self.gets += 1
            self.taken += 1
            self.get_wait_s += now - max(t0, self.started or t0)  # a wait across a restart counts from it
            if self.qsize() == 0:
                self.empty_since = now
                self.changes.append((now, False))
        return item

    def waiting_per_interval(
        self, start: float, end: float, interval: float = 1.0, bins: int | None = None
    ) -> list[float]:
        """The share of each ``interval`` from ``start`` to ``end`` (``time.monotonic`` readings)
        in which a batch was waiting in the queue; ``bins`` of them (default: as many as cover
        the span), to match the timeline's images."""
        bins = [0.0] * (bins or _bin_count(end - start, interval))
        with self._lock:
            changes = [*self.changes, (end, False)]
        waiting, since = False, start
        for t, now_waiting in changes:
            t = min(max(t, start), end)
            if waiting:
                _add_span(bins, since - start, t - start, interval)
            waiting, since = now_waiting, t
        return [round(b / interval, 4) for b in bins]

    def occupancy(self) -> float:
        """Fraction of the time from the start to the last ``get`` that a batch was waiting."""
        if self.started is None or self.last_get is None or self.last_get <= self.started:
            return 0.0
        empty = self.empty_s + (self.last_get - self.empty_since if self.empty_since is not None else 0.0)
        return max(0.0, 1.0 - empty / (self.last_get - self.started))


class _TaskEnds(TaskHook):
    """When each task of a stage ended (``time.monotonic``), and when the stage started."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.ends: list[float] = []

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        self.started = time.monotonic()
        yield

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        yield
        self.ends.append(time.monotonic())  # a task that raised is no batch: not reached


class _PipelineStats:
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
        self.task_ends: list[_TaskEnds] = []
        self.queues: list[_TimedQueue] = []

    def task_hooks(self, info: StageInfo) -> list[TaskHook]:
        """``task_hook_factory`` for :py:meth:`PipelineBuilder.build`."""
        hook, ends = TaskStatsHook(info, interval=self.interval), _TaskEnds()
        self.hooks.append(hook)
        self.task_ends.append(ends)
        return [hook, ends]

    def queue(self, info: StageInfo, *, buffer_size: int = 1) -> AsyncQueue:
        """``queue_class`` for :py:meth:`PipelineBuilder.build`; the last one made is the sink's."""
        q = _TimedQueue(info, buffer_size=buffer_size, interval=self.interval)
        self.queues.append(q)
        return q

    def waiting_per_interval(
        self, start: float, end: float, interval: float = 1.0, bins: int | None = None
    ) -> list[float] | None:
        """The sink queue's occupancy in each ``interval`` of the run (see the timeline)."""
        return self.queues[-1].waiting_per_interval(start, end, interval, bins) if self.queues else None

    def start_window(self) -> None:
        """Measure the sink queue from now on, leaving out what came before (e.g. the warm-up)."""
        for q in self.queues:
            q.restart()

    def window_lead(self, concurrency: int) -> tuple[int, float | None] | None:
        """What the loader had done when the FPS window opened (the last :py:meth:`start_window`),
        from when its last stage's tasks (the decode, one batch each) ended: the batches decoded
        that the model had not taken, plus those it may have had under way (at most
        ``concurrency``, never more than it went on to decode); and the rate, in batches/s, that
        it is known to reach: the better of all its batches over the time from its start to the
        last, and of those it decoded after the window opened (less those that may have been
        under way) over the time to the last. Each rate is a lower bound: a full queue or a slow
        start only slows a loader. None without a pipeline or before the window opened."""
        if not self.queues or not self.task_ends or (opened := self.queues[-1].window_opened) is None:
            return None
        t0, taken0 = opened
        stage = self.task_ends[-1]
        ends = sorted(stage.ends)
        done0 = sum(1 for t in ends if t <= t0)
        under_way = min(concurrency, len(ends) - done0)
        rates = [0.0]
        if ends and stage.started is not None and ends[-1] > stage.started:
            rates.append(len(ends) / (ends[-1] - stage.started))
        if (new_work := len(ends) - done0 - under_way) > 0 and ends[-1] > t0:
            rates.append(new_work / (ends[-1] - t0))
        return max(0, done0 - taken0) + under_way, max(rates) or None

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


def _add_span(bins: list[float], t0: float, t1: float, interval: float) -> None:
    """Add the span ``t0 .. t1`` (seconds) to the per-interval totals ``bins``."""
    while t0 < t1:
        i = min(int(t0 // interval), len(bins) - 1)
        stop = t1 if i == len(bins) - 1 else min(t1, (i + 1) * interval)
        if stop <= t0:  # rounding at a bin's edge
            stop = min(t1, t0 + interval / 2)
        bins[i] += stop - t0
        t0 = stop


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
    stats: _PipelineStats | None = None,
    decode_processes: int = 0,
) -> Pipeline:
    """Build the loading pipeline: source -> aggregate -> pipe(decode) -> sink.

    Items are aggregated into batches as the source yields them, so SPDL's event loop hands
    over one list per batch rather than each item through an ``aggregate`` stage
    (``bench/decode_paths.py`` measures both). The last, partial batch is kept. Any exception
    escaping ``decode_func`` stops the pipeline (``max_failures=0``) instead of SPDL's default
    of dropping that batch and going on; bad images do not raise when the decode function has a
    :py:class:`BadImagePolicy`.

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
        decode_processes: Run the decode stage in this many worker processes instead, each
            decoding ``concurrency`` batches at once in its own threads: SPDL's execution region
            (``PipelineBuilder.to``), the batches handed back through shared memory (torch's
            tensor pickling). ``decode_func`` must then be picklable (:py:class:`_ProcessDecode`).
    """
    hooks = {}
    if stats is not None:
        hooks = {"queue_class": stats.queue, "task_hook_factory": stats.task_hooks}
        report_stats_interval = stats.interval
    builder = PipelineBuilder().add_source(_batched(src, batch_size))
    if decode_processes:
        # spawn, not fork: the main process has threads (torch's, SPDL's) by the time the pool starts.
        pool = ProcessPoolExecutorConfig(max_workers=decode_processes, mp_context="spawn",
                                         initializer=_decode_worker_init)  # fmt: skip
        builder = builder.to(pool).pipe(decode_func, concurrency=concurrency, name="decode").to(MAIN_PROCESS)
    else:
        builder = builder.pipe(decode_func, concurrency=concurrency, name="decode")
    return builder.add_sink(buffer_size).build(num_threads=num_threads, max_failures=0,
                                               report_stats_interval=report_stats_interval, **hooks)  # fmt: skip


def _decode_worker_init() -> None:
    """In each ``--decode-processes`` worker: a Ctrl-C (sent to the whole process group) is the
    main process's to handle, which stops the workers (the worker would print a traceback); the
    SIGTERM that ends a worker ends it quietly (SPDL's native library installs glog's handler,
    which prints a stack trace: loaded now, so that the default is put back after it); and the
    worker skips the interpreter's teardown, as the main process does (nanobind would list SPDL's
    objects still alive)."""
    import atexit

    spdl.io.utils.get_ffmpeg_versions()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    atexit.register(os._exit, 0)  # runs after multiprocessing's own exit handling, before the teardown


class _ProcessDecode:
    """The FFmpeg decode function, made in the worker process that runs it (a closure cannot be
    pickled to a spawned worker): batches come back on the CPU, bad images left out and listed
    in ``Batch.failures``, which travel back with the batch to :py:func:`benchmark`."""

    def __init__(self, transform: EvalTransform, max_image_bytes: int) -> None:
        self.transform, self.max_image_bytes = transform, max_image_bytes
        self._decode: Callable[[Sequence[tuple[str, int]]], _Batch] | None = None

    def __getstate__(self) -> dict:
        return {"transform": self.transform, "max_image_bytes": self.max_image_bytes, "_decode": None}

    def __call__(self, items: Sequence[tuple[str, int]]) -> _Batch:
        if self._decode is None:  # once per worker; a skipping policy lists the bad images
            self._decode = get_decode_func("cpu", self.transform, "ffmpeg", BadImagePolicy(skip=True),
                                           max_image_bytes=self.max_image_bytes)  # fmt: skip
        return self._decode(items)


def _received(batches: Iterator[_Batch], device: torch.device) -> Iterator[_Batch]:
    """Batches from ``--decode-processes`` workers, copied to ``device`` in this process, where the
    model is. While it waits for a batch, the stall registry says so (a worker's images are not
    known here)."""
    marks = _DECODING
    while True:
        marks[-1] = ("a batch in a --decode-processes worker", time.monotonic())  # -1: no thread's ident
        batch = next(batches, None)
        marks[-1] = None
        if batch is None:
            return
        if device.type != "cpu":
            images, labels = batch
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            batch = _Batch(images, labels, batch.paths, batch.failures)
        yield batch


################################################################################
# Baseline loader: PyTorch DataLoader with PIL, for comparison on identical work
################################################################################


class _PILDataset(torch.utils.data.IterableDataset):
    """Batches of images decoded by PIL (:py:func:`decode_pil`) in DataLoader workers: the list
    cut into batches of ``batch_size`` in order, as the SPDL loader cuts it, each worker taking
    every n-th batch (the DataLoader hands them out in that order again).

    Yields :py:func:`collate_pil`'s batches.
    """

    def __init__(
        self, images: ImageList, transform: EvalTransform, max_bytes: int = MAX_IMAGE_MB << 20, batch_size: int = 1
    ) -> None:
        super().__init__()
        self.images, self.transform, self.max_bytes, self.batch_size = images, transform, max_bytes, batch_size

    def __iter__(self) -> Iterator[tuple]:
        worker = torch.utils.data.get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker else (0, 1)
        for i, items in enumerate(_batched(self.images, self.batch_size)):
            if i % workers == worker_id:
                yield _collate_pil([self._sample(path, label) for path, label in items])

    def _sample(self, path: str, label: int) -> tuple:
        """``(image or None, label, path, failure reason or None)``."""
        try:
            return _decode_pil(path, self.transform, _read_image_bytes(path, self.max_bytes)), label, path, None
        except ImageDecodeError as e:
            return None, label, path, e.reason


def _collate_pil(samples: list[tuple]) -> tuple[Tensor, Tensor, list[str], list[tuple[str, str]]]:
    """Batch decoded samples like the SPDL path (channels-last NCHW uint8, N x 1 labels):
    ``(images, labels, paths, failures)``, each failure ``(path, reason)``."""
    import numpy as np

    good = [(image, label, path) for image, label, path, reason in samples if reason is None]
    failures = [(path, reason) for _, _, path, reason in samples if reason is not None]
    if not good:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty((0, 1), dtype=torch.int64), [], failures
    images = torch.from_numpy(np.stack([image for image, _, _ in good])).permute(0, 3, 1, 2)
    labels = torch.tensor([[label] for _, label, _ in good], dtype=torch.int64)
    return images, labels, [path for _, _, path in good], failures


_DATALOADER_DIED = "DataLoader worker"  # the start of torch's message when a worker died


def _torch_loader_batches(
    loader: torch.utils.data.DataLoader | Iterator, device: torch.device, policy: BadImagePolicy | None
) -> Iterator[_Batch]:
    """Move the DataLoader's batches (from the loader, or an iterator over it) to the device, their
    bad images listed in each batch's ``failures``.

    Raises:
        TimeoutError: no batch within the DataLoader's ``timeout``.
        RunStopped: (``loader``) a worker died (its message, or the connection it broke).
        ImageDecodeError: a bad image, without a policy.
    """
    batches = iter(loader)
    while True:
        try:
            images, labels, paths, failures = next(batches)
        except StopIteration:
            return
        except RuntimeError as e:
            if "timed out" in str(e):  # the DataLoader's own time-out
                raise TimeoutError(str(e)) from None
            if _DATALOADER_DIED in str(e):  # killed (the out-of-memory killer?) or failed
                raise RunStopped(f"the DataLoader failed: {str(e).splitlines()[0].strip()}", "loader") from None
            raise
        except (ConnectionError, EOFError) as e:  # a worker died while its batch was handed over
            raise RunStopped(f"the DataLoader failed: a worker's connection broke ({type(e).__name__}: {e})",
                             "loader") from None
        errors = [ImageDecodeError(path, reason) for path, reason in failures]
        if errors and policy is None:
            raise errors[0]
        yield _Batch(images.to(device, non_blocking=True), labels.to(device, non_blocking=True), paths, errors)


def _get_torch_loader(
    dataset: _PILDataset, batch_size: int, num_workers: int, device: torch.device, timeout: float
) -> torch.utils.data.DataLoader:
    """A DataLoader over ``dataset``'s images in batches of ``batch_size`` (the SPDL loader's
    batches), in ``num_workers`` processes, pinned memory on CUDA."""
    batches = _PILDataset(dataset.images, dataset.transform, dataset.max_bytes, batch_size)
    return torch.utils.data.DataLoader(
        batches, batch_size=None, num_workers=num_workers, collate_fn=_as_batched,
        pin_memory=device.type == "cuda", timeout=timeout if num_workers else 0,
    )  # fmt: skip


def _as_batched(batch: tuple) -> tuple:
    """The DataLoader's collate function for a dataset that yields whole batches: as they are."""
    return batch


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
        dtype: The model's precision.
        batch_size: If set (when compiled), smaller batches are padded to it so that the
            compiled graph is reused; the padded rows' outputs are dropped.
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

    def logits(self, images: Tensor) -> Tensor:
        """images: uint8 ``N x 3 x H x W``. Returns float32 logits ``N x C``.

        Every batch reaches the model channels-last and contiguous, padded ones too, so that a
        compiled model sees one kind of input and never recompiles for another.
        """
        n = images.shape[0]
        # Made outside inference mode, as the loader's batches are: an inference tensor has other
        # dispatch keys, which a compiled model would recompile for too.
        with torch.inference_mode(False):
            if self.batch_size is not None and 0 < n < self.batch_size:
                images = torch.cat([images, images.new_zeros((self.batch_size - n, *images.shape[1:]))])
            images = images.contiguous(memory_format=torch.channels_last)
        return self.model(self.preprocessing(images).to(self.dtype))[:n].float()

    def forward(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """images: uint8 ``N x 3 x H x W``; labels: int64 ``N x 1``. Returns top-1, top-5 counts."""
        return self.classification(self.logits(images), labels)


def _resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """Turn a device name into a checked device.

    ``auto`` is ``cuda:LOCAL_RANK`` if CUDA is available, else ``cpu``; ``cuda`` without an
    index is ``cuda:LOCAL_RANK`` (``local_rank`` is 0 outside torchrun).

    Raises:
        InputError: not a device, or not one this machine has.
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise InputError(f"{spec!r} is not a device (use auto, cpu, cuda or cuda:N)", "--device") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{spec}: CUDA is not available on this machine", "--device")
        device = torch.device("cuda", local_rank if device.index is None else device.index)
        if device.index >= torch.cuda.device_count():
            raise InputError(f"{spec}: only {torch.cuda.device_count()} CUDA device(s) here", "--device")
    elif device.type != "cpu":
        raise InputError(f"{spec}: only cpu and cuda devices are supported", "--device")
    return device


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _auto_dtype(cuda_capability: tuple[int, int] | None, cpu_bf16: bool) -> tuple[torch.dtype, str]:
    """The precision that suits the hardware, and why: bfloat16 where it is native, float16 on
    CUDA GPUs without it, float32 on CPUs without it (where bfloat16 is emulated, many times
    slower)."""
    if cuda_capability is not None:
        major, minor = cuda_capability
        if cuda_capability >= (8, 0):
            return torch.bfloat16, f"CUDA capability {major}.{minor} has native bfloat16"
        return torch.float16, f"CUDA capability {major}.{minor} lacks native bfloat16 (8.0 and up)"
    if cpu_bf16:
        return torch.bfloat16, "torch reports native bfloat16 on this CPU"
    return torch.float32, "this CPU lacks native bfloat16 (it would be emulated)"


def _choose_dtype(device: torch.device, requested: str = "auto") -> tuple[torch.dtype, str]:
    """The model's precision on ``device``: ``requested`` (``bfloat16``, ``float16``,
    ``float32``), or for ``auto`` the one that suits the hardware; with the reason, in words."""
    if requested != "auto":
        return _DTYPES[requested], "asked for"
    if device.type == "cuda":
        return _auto_dtype(torch.cuda.get_device_capability(device), False)
    return _auto_dtype(None, torch.ops.mkldnn._is_mkldnn_bf16_supported())


# What torch.load raises for a file that is no checkpoint (text, empty, a cut zip, a refused pickle).
_CHECKPOINT_ERRORS = (OSError, RuntimeError, ValueError, EOFError, KeyError, IndexError, AttributeError,
                      UnicodeDecodeError, pickle.UnpicklingError, zipfile.BadZipFile)  # fmt: skip


def _load_state_dict(path: Path) -> dict[str, Tensor]:
    """A checkpoint's state dict, loaded safely (weights only). InputError if it is none."""

    def fail(reason: str) -> InputError:
        return InputError(f"{path}: cannot load checkpoint ({reason})", "--checkpoint")

    if not path.is_file():
        raise fail("no such file" if not path.exists() else "not a regular file")
    if path.stat().st_size == 0:
        raise fail("empty file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # torch refused it: it holds more than tensors
        found = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise fail(f"it holds Python objects{what}, not only tensors, and is not loaded; save the model's "
                   "weights with torch.save(model.state_dict(), PATH)") from None  # fmt: skip
    except _CHECKPOINT_ERRORS as e:
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines()[0] if str(e) else ""
        detail = f"{type(e).__name__}: {first}" if len(first) > 8 else "neither torch.save's archive nor a pickle"
        raise fail(f"not a PyTorch checkpoint ({detail})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise fail(f"not a state dict, found {type(state).__name__}")
    for key, value in state.items():
        if not isinstance(value, Tensor) or value.layout != torch.strided:
            kind = f"a {value.layout} tensor" if isinstance(value, Tensor) else f"a {type(value).__name__}"
            raise fail(f"{key!r} is {kind}, not a dense tensor")
    return state


def _load_checkpoint(model: torch.nn.Module, path: Path) -> None:
    """Load a local state dict into ``model``, naming the first key that does not fit."""
    state = _load_state_dict(path)
    expected = model.state_dict()
    for key, value in expected.items():
        if key not in state:
            raise InputError(f"{path}: checkpoint lacks {key!r}, which {type(model).__name__} needs", "--checkpoint")
        if tuple(state[key].shape) != tuple(value.shape):
            raise InputError(
                f"{path}: {key!r} has shape {tuple(state[key].shape)} in the checkpoint, "
                f"the model expects {tuple(value.shape)}",
                "checkpoint",
            )
    if extra := [k for k in state if k not in expected]:
        raise InputError(
            f"{path}: checkpoint has {len(extra)} key(s) the model lacks, first {extra[0]!r}", "checkpoint"
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise InputError(f"{path}: cannot load checkpoint ({str(e).splitlines()[-1].strip()})", "--checkpoint") from None


HUB_CHECK_S = 3.0  # seconds to wait for the model hub's server before calling it out of reach


def _hub_unreachable(config: dict) -> str | None:
    """Why the Hugging Face hub, where timm fetches these weights, cannot be reached (one
    connection attempt of at most :py:data:`HUB_CHECK_S`), or None: it answers, the weights come
    from elsewhere, the user set ``HF_HUB_OFFLINE`` (the cache alone), or a proxy stands between."""
    import socket
    import urllib.parse

    from huggingface_hub import constants

    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if not config.get("hf_hub_id") or constants.HF_HUB_OFFLINE or proxied:
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=HUB_CHECK_S).close()
    except OSError as e:
        return f"{url.hostname}: {e.strerror or e}"
    return None


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """huggingface_hub's offline mode (what ``HF_HUB_OFFLINE=1`` sets) for the block: weights from
    its cache, without the minute of retries it spends on a hub out of reach."""
    from huggingface_hub import constants

    before, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _create_timm_model(model_name: str, pretrained: bool) -> torch.nn.Module:
    import timm

    config = _pretrained_config(model_name)
    _check_imagenet_head(model_name, config.get("num_classes"))
    logging.getLogger("huggingface_hub").propagate = not logging.getLogger("huggingface_hub").handlers  # once
    unreachable = _hub_unreachable(config) if pretrained else None
    try:
        with _hub_offline() if unreachable else contextlib.nullcontext():
            model = timm.create_model(model_name, pretrained=pretrained)
    except OSError as e:  # the hub is out of reach and the weights are not in its cache
        where = f"the model hub is out of reach ({unreachable})" if unreachable else type(e).__name__
        raise InputError(f"{model_name}: cannot get its pretrained weights ({where}, and they are not in "
                         "its cache)", "--model", _WEIGHTS_ADVICE) from None  # fmt: skip
    except Exception as e:  # e.g. no pretrained weights, or a corrupt cached file (SafetensorError)
        raise InputError(f"{model_name}: cannot load its pretrained weights ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})", "--model", _WEIGHTS_ADVICE) from None  # fmt: skip
    _check_imagenet_head(model_name, getattr(model, "num_classes", None))
    return model


def get_model(
    model_name: str = DEFAULT_MODEL,
    device: torch.device | str = "cpu",
    *,
    pretrained: bool = True,
    checkpoint: Path | str | None = None,
    compile: bool | str = True,
    dtype: torch.dtype | str = "auto",
    use_bf16: bool | None = None,
    batch_size: int | None = None,
    transform: dict | None = None,
) -> ModelBundle:
    """Build the model bundle: normalisation, a timm model in eval mode, top-k counting.

    Args:
        model_name: Any name ``timm.create_model`` accepts.
        device: Where the model runs.
        pretrained: Load timm's pretrained weights (from the model hub or its cache).
        checkpoint: A local state dict to load instead; no hub access.
        compile: ``torch.compile`` the model and the normalisation: True for mode
            :py:data:`COMPILE_MODE`, or one of :py:data:`COMPILE_MODES`.
        dtype: The model's precision: a torch dtype, its name, or ``auto`` (see :py:func:`choose_dtype`).
        use_bf16: The design's switch, kept for notebooks: True is bfloat16, False float32.
        batch_size: With ``compile``, pad smaller batches to this size (see ModelBundle).
        transform: Overrides of the model's evaluation transform, as timm's ``resolve_data_config``
            takes them: ``img_size``, ``crop_pct``, ``interpolation``, ``mean``, ``std``.

    Raises:
        InputError: an unknown model, weights out of reach, or a checkpoint that does not fit.
    """
    device = torch.device(device)
    if use_bf16 is not None:
        dtype = torch.bfloat16 if use_bf16 else torch.float32
    if not isinstance(dtype, torch.dtype):
        dtype = _choose_dtype(device, dtype)[0]
    model = _create_timm_model(model_name, pretrained and checkpoint is None)
    if checkpoint is not None:
        _load_checkpoint(model, Path(checkpoint))
    transform = EvalTransform.from_model(model, transform)
    model = model.eval().to(device=device, dtype=dtype)
    preprocessing = Preprocessing(transform.mean, transform.std).to(device)
    if compile:
        mode = COMPILE_MODE if compile is True else compile
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile={compile!r}: True, False or one of {', '.join(COMPILE_MODES)}")
        model = torch.compile(model, mode=mode)
        preprocessing = torch.compile(preprocessing, mode=mode)
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
        batches: Batches that went through the model.
        decoder_fallbacks: Images a GPU decoder could not take, decoded on the CPU instead.
        decoder_backends: Images each backend of a GPU decoder decoded, warm-up included (see
            :py:attr:`BadImagePolicy.decoded_by`); empty for FFmpeg.
        warmup_included: The run had no more batches than the warm-up, so the FPS window
            covers them all.
        batches_timed: Batches in the FPS window.
        loader_lead: Batches the loader can have decoded or in progress ahead of the model
            (its buffer and its concurrent decodes), when known: see ``fps_max_overstatement``.
            After an SPDL run, what it had when the window opened (never more than the window's batches).
        loader_min_fps: Images/s the loader is known to have reached in the window, from when it
            delivered its batches (SPDL's sink queue), when known: see ``fps_max_overstatement``.
        partial: The run stopped before every listed image was classified or failed.
        stop_reason: Why it stopped early, or None.
        failures: Path and reason of each image that failed.
        timeline: Per-second images and the FPS window (see :py:func:`benchmark`).
        page_cache: How much of the listed files' data was in the page cache before the run,
            and whether ``--cold-cache`` evicted it first; None when not examined.
        predictions: One row per classified image when asked for (not in :py:meth:`to_dict`).
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
    decoder_backends: dict[str, int] = field(default_factory=dict)
    warmup_included: bool = False
    batches_timed: int = 0
    loader_lead: int | None = None
    loader_min_fps: float | None = None
    partial: bool = False
    stop_reason: str | None = None
    failures: list[dict[str, str]] = field(default_factory=list)
    timeline: dict | None = None
    page_cache: _PageCache | None = None
    predictions: list[dict] | None = field(default=None, repr=False)

    def record_failures(self, failures: Sequence[ImageDecodeError]) -> None:
        self.failed = len(failures)
        self.failures = [{"path": f.path, "reason": f.reason} for f in failures]

    @property
    def not_reached(self) -> int:
        return 0 if self.listed is None else max(0, self.listed - self.classified - self.failed)

    @property
    def fps(self) -> float:
        return self.frames_timed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def fps_max_overstatement(self) -> float | None:
        """How much FPS can overstate a loader-bound rate, as a share (0.1: up to 10 %).

        When the FPS window opens, the loader may already hold ``loader_lead`` batches ready or
        in progress (never more than the window's T batches); the window then needs only
        T - lead batches from the loader, so FPS is at most T / (T - lead) times the loader's
        rate (inf: the window may be all buffered, and FPS is then the model's rate). A loader
        known to reach ``loader_min_fps`` overstates FPS by at most FPS / loader_min_fps - 1 (0
        when it kept up). None when the lead is unknown or the window includes the start (when
        nothing is buffered yet).
        """
        if self.loader_lead is None or self.warmup_included or not self.batches_timed:
            return None
        lead = min(self.loader_lead, self.batches_timed)
        bound = math.inf if self.batches_timed <= lead else lead / (self.batches_timed - lead)
        if self.loader_min_fps:
            bound = min(bound, max(0.0, self.fps / self.loader_min_fps - 1))
        return bound

    @property
    def top1(self) -> float:
        return self.top1_correct / self.classified if self.classified else 0.0

    @property
    def top5(self) -> float:
        return self.top5_correct / self.classified if self.classified else 0.0

    def to_dict(self) -> dict:
        fields = {k: v for k, v in asdict(self).items() if k != "predictions"}
        fields["page_cache"] = self.page_cache.to_dict() if self.page_cache is not None else None  # with its shares
        over = self.fps_max_overstatement
        return {**fields, "not_reached": self.not_reached, "fps": self.fps,
                "fps_max_overstatement": None if over == math.inf else over,  # a number or null: valid JSON
                "fps_window_may_be_buffered": over == math.inf, "top1": self.top1, "top5": self.top5}  # fmt: skip


class _Clock:
    """Wall clock that first waits for the device to finish its queued work."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class _TimingWindow:
    """The FPS window: from the end of the warm-up to the last batch, and a timeline of the run.

    If the run has no more batches than the warm-up, the window covers every batch. ``sync``
    runs before each clock start (a barrier across ranks). Each batch's end is marked without
    waiting for the device (a CUDA event on a GPU), for the timeline.
    """

    def __init__(self, device: torch.device, warmup_batches: int, sync: Callable[[], None] | None = None) -> None:
        self.clock, self.warmup_batches, self.sync = _Clock(device), warmup_batches, sync or (lambda: None)
        self.cuda = device.type == "cuda"
        self.batches = self.frames = self.frames_all = 0
        self.marks: list[tuple[Any, int]] = []  # (CUDA event or time.monotonic(), images) per batch
        self.sync()
        self.t_start = self.t_warm = self.clock()
        self.started_at = time.monotonic()
        self._start_mark = self._mark()

    def _mark(self) -> Any:
        if not self.cuda:
            return time.monotonic()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, frames: int) -> None:
        """Count one batch of ``frames`` images, just finished."""
        self.batches += 1
        self.frames_all += frames
        self.marks.append((self._mark(), frames))
        if self.batches == self.warmup_batches:
            self.sync()
            self.t_warm = self.clock()
        elif self.batches > self.warmup_batches:
            self.frames += frames

    def close(self) -> tuple[int, float, bool]:
        """``(images timed, seconds, whether the warm-up is included)``."""
        self.t_end = self.clock()
        if self.batches > self.warmup_batches:
            return self.frames, self.t_end - self.t_warm, False
        return self.frames_all, self.t_end - self.t_start, True

    def timeline(self, interval: float = 1.0) -> dict:
        """Images finished in each ``interval`` of the run since its start, and where the FPS
        window lies (seconds from the start); call after :py:meth:`close`."""
        if self.cuda:
            times = [self._start_mark.elapsed_time(event) / 1e3 for event, _ in self.marks]
        else:
            times = [t - self._start_mark for t, _ in self.marks]
        # As many bins as the run's span has (the sink queue's occupancy gets as many), and one
        # more only for a batch marked past the end (a GPU's events and the host clock differ).
        last = int(max(times, default=0.0) // interval) + 1
        images = [0] * max(_bin_count(self.t_end - self.t_start, interval), last)
        for t, frames in zip(times, (f for _, f in self.marks), strict=True):
            images[int(t // interval)] += frames
        timed = self.batches > self.warmup_batches
        return {
            "interval_s": interval,
            "images": images,
            "images_per_s": [n / interval for n in images],
            "batch_end_s": [round(t, 6) for t in times],
            "batch_images": [frames for _, frames in self.marks],
            "warmup_end_s": (self.t_warm - self.t_start) if timed else 0.0,
            "end_s": self.t_end - self.t_start,
            "started_at": self.started_at,  # time.monotonic() at the start, to align other traces
        }


def _bin_count(span_s: float, interval: float) -> int:
    """Bins of ``interval`` seconds that cover ``span_s`` seconds: at least one."""
    return max(1, math.ceil(span_s / interval))


def _model_device(model: torch.nn.Module) -> torch.device:
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def _is_out_of_memory(error: BaseException) -> bool:
    text = str(error)
    return (
        isinstance(error, torch.OutOfMemoryError | MemoryError)
        or "can't allocate memory" in text
        or ("out of memory" in text.lower())
    )


@contextlib.contextmanager
def _out_of_memory_stops(device: torch.device, batch_size: int) -> Iterator[None]:
    """Memory running out in the block (a synthetic batch, the model, the loader's batches)
    stops with out_of_memory and its advice, as it does in the run."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if not _is_out_of_memory(e):
            raise
        raise _out_of_memory(device, batch_size) from None


def _logits(model: ModelBundle, images: Tensor) -> Tensor:
    """The bundle's logits for one batch; RunStopped (out_of_memory, model) for what can go wrong there."""
    try:
        return model.logits(images)
    except (RuntimeError, MemoryError) as e:
        if _is_out_of_memory(e):
            raise _out_of_memory(images.device, images.shape[0]) from None
        if _DATALOADER_DIED in str(e):  # torch raises it from its SIGCHLD handler, wherever the loop is
            raise RunStopped(f"the DataLoader failed: {str(e).splitlines()[0].strip()}", "loader") from None
        raise RunStopped(f"the model failed on a batch of {images.shape[0]} images: {str(e).splitlines()[0]}",
                         "model", "--debug shows where; --no-compile if torch.compile failed") from e


class _Predictions:
    """Per-image top-5 classes and probabilities, kept on the device until the run ends."""

    def __init__(self) -> None:
        self.batches: list[tuple[Tensor, Tensor, Tensor, tuple[str, ...]]] = []

    def add(self, logits: Tensor, labels: Tensor, paths: Sequence[str]) -> None:
        probs, classes = logits.softmax(dim=-1).topk(min(5, logits.shape[-1]), dim=-1)
        self.batches.append((classes, probs, labels[:, 0], tuple(paths)))

    def rows(self) -> list[dict]:
        rows = []
        for classes, probs, labels, paths in self.batches:
            classes_l, probs_l, labels_l = classes.tolist(), probs.tolist(), labels.tolist()
            names = paths if len(paths) == len(labels_l) else [None] * len(labels_l)
            for path, label, top, p in zip(names, labels_l, classes_l, probs_l, strict=True):
                rows.append({"path": path, "label": label, "label_name": _class_name(label) if label >= 0 else None,
                             "top5": top, "top5_names": [_class_name(c) for c in top],
                             "probs": [round(x, 6) for x in p], "correct1": top[0] == label,
                             "correct5": label in top})  # fmt: skip
        return rows


def benchmark(
    loader: Iterable[tuple[Tensor, Tensor]],
    model: ModelBundle,
    *,
    listed: int | None = None,
    warmup_batches: int = 20,
    policy: BadImagePolicy | None = None,
    sync_clocks: Callable[[], None] | None = None,
    progress: Callable[[int, Tensor], None] | None = None,
    predictions: bool = False,
    loader_lead: int | None = None,
) -> RunResult:
    """Run the model over every batch and measure throughput and accuracy.

    The first ``warmup_batches`` batches count towards accuracy but not towards FPS; if the
    run has no more batches than that, FPS covers all of them (``warmup_included``).

    Args:
        loader: Yields ``(images, labels)`` batches, e.g. a pipeline's iterator.
        model: From :py:func:`get_model`.
        listed: How many images the loader was given, for the accounting.
        warmup_batches: Batches left out of the FPS window.
        policy: The bad-image policy, applied to the failures of each batch as it is received.
        sync_clocks: Called just before each clock start (loop start, end of warm-up), e.g. a
            barrier so that every rank of a distributed run starts its clock together.
        progress: Called after each batch with the images classified so far and the running
            top-1 count (a device tensor), e.g. a :py:class:`Progress`.
        predictions: Keep each image's top-5 classes and probabilities (``result.predictions``).
        loader_lead: Batches the loader can hold ahead of the model (the CLI passes
            :py:attr:`RunConfig.loader_lead`), for ``result.fps_max_overstatement``.

    Returns:
        A RunResult, with its ``timeline``.

    Raises:
        RunStopped: (a subclass saying why) the run ended early; ``error.result`` holds the
            partial result. RunInterrupted likewise for SIGINT / SIGTERM / Ctrl-C.
    """
    policy = policy or BadImagePolicy()
    loop = _Loop(model, RunResult(listed=listed, loader_lead=loader_lead), warmup_batches, sync_clocks, predictions)
    failures: list[ImageDecodeError] = []  # the one record of the bad images, in the order received
    try:
        with _stopped_runs(loop.result), torch.inference_mode():
            for batch in loader:
                _record_batch(batch, loop.result, failures)
                policy.check(failures, listed)
                loop.classify(batch)
                if progress is not None:
                    progress(loop.result.classified, loop.top1)
            _check_delivered(loop.result.classified + len(failures), listed)
    finally:
        loop.close(failures)
    if loop.result.warmup_included and warmup_batches:  # the command line's summary says it itself
        warnings.warn(f"only {loop.result.batches} batch(es), not more than warmup_batches={warmup_batches}: the "
                      "FPS window includes the warm-up (compilation, caches, thread start-up); pass more images "
                      "or a smaller warmup_batches", WarmupIncluded, stacklevel=2)  # fmt: skip
    return loop.result


class WarmupIncluded(UserWarning):
    """:py:func:`benchmark`'s run had no more batches than its warm-up: FPS includes the warm-up."""


@contextlib.contextmanager
def _stopped_runs(result: RunResult) -> Iterator[None]:
    """Whatever ends the loop early leaves as a RunStopped (or RunInterrupted) that carries the
    partial result: the loader's time-out and failure become RunStopped (stalled, loader)."""
    try:
        yield
    except RunStopped as e:
        result.partial, e.result = True, result
        raise
    except KeyboardInterrupt as e:
        result.partial = True
        raise RunInterrupted(getattr(e, "signum", signal.SIGINT), result) from None
    except (PipelineFailure, TimeoutError) as e:
        result.partial = True
        error: RunStopped = (
            _stalled(_oldest_in_progress()) if isinstance(e, TimeoutError) else _loader_failed(e)
        )
        error.result = result
        raise error from None


class _Loop:
    """The timed loop's state: hit counts kept on the device (reading them each batch would
    stall the GPU's queue), the timing window, and the predictions when asked for."""

    def __init__(self, model: ModelBundle, result: RunResult, warmup_batches: int,
                 sync_clocks: Callable[[], None] | None, predictions: bool) -> None:  # fmt: skip
        device = _model_device(model)
        self.model, self.result = model, result
        self.top1, self.top5 = (torch.zeros((), dtype=torch.int64, device=device) for _ in range(2))
        self.window = _TimingWindow(device, warmup_batches, sync_clocks)
        self.kept = _Predictions() if predictions else None

    def classify(self, batch: tuple[Tensor, Tensor]) -> None:
        """Run the model on one batch and count it."""
        images, labels = batch
        n = int(images.shape[0])
        if n:
            i = self.window.batches
            with spdl.io.utils.trace_event(f"iter_{i}"), torch.profiler.record_function(f"iter_{i}"):
                logits = _logits(self.model, images)
                b1, b5 = self.model.classification(logits, labels)
                self.top1 += b1
                self.top5 += b5
            if self.kept is not None:
                self.kept.add(logits, labels, getattr(batch, "paths", ()))
        self.result.classified += n
        self.window.add(n)

    def close(self, failures: Sequence[ImageDecodeError]) -> None:
        """Fill the result from the loop's state, whether the loop ended or stopped."""
        result, window = self.result, self.window
        result.frames_timed, result.elapsed_s, result.warmup_included = window.close()
        result.batches = window.batches
        result.batches_timed = window.batches if result.warmup_included else window.batches - window.warmup_batches
        result.top1_correct, result.top5_correct = int(self.top1), int(self.top5)
        result.record_failures(failures)
        result.timeline = window.timeline()
        if self.kept is not None:
            result.predictions = self.kept.rows()


def _stalled(stuck_on: tuple[str, float] | None) -> RunStopped:
    """No batch within the loader's time-out; ``stuck_on`` is ``(path, seconds)`` of the image a
    decode thread has been on the longest, or None if none was (the source was not delivering)."""
    if stuck_on is None:
        where = "the decode stage is idle, waiting for the list source"
    else:
        where = f"the decode stage has been on {stuck_on[0]} for {stuck_on[1]:.0f} s"
    return RunStopped(f"no batch within the loader's time-out: {where}", "stalled", where=where)


def _out_of_memory(device: torch.device, batch_size: int) -> RunStopped:
    return RunStopped(f"out of memory on {device} with a batch of {batch_size} images; "
                      f"try --batch-size {max(1, batch_size // 2)}", "out_of_memory")  # fmt: skip


def _loader_failed(error: BaseException) -> RunStopped:
    """What a pipeline failure was: out of memory while decoding an image, another error there
    (named), or something else (SPDL's log above says what)."""
    # A stage's error is SPDL's "failed N times", raised from the first error of the stage's
    # function: the one _decode_items named the image of.
    causes = [e.__cause__ or e for e in getattr(error, "exceptions", ())]
    cause = next((e for e in causes if hasattr(e, "_while_decoding")), None)
    if cause is None:
        return RunStopped(f"the loading pipeline failed: {error} (the log above says why)", "loader")
    path = cause._while_decoding
    if isinstance(cause, MemoryError):
        return RunStopped(f"out of memory while decoding {path}; fewer --num-threads need less", "loader")
    return RunStopped(f"the loading pipeline failed on {path}: {type(cause).__name__}: {cause}", "loader")


def _check_delivered(delivered: int, listed: int | None) -> None:
    """The loader delivered every listed image, once: else the counts would not add up."""
    if listed is None or delivered == listed:
        return
    if delivered < listed:
        raise RunStopped(f"the loader ended before delivering every listed image ({delivered} of {listed})",
                         "incomplete")
    raise RunStopped(f"the loader delivered {delivered} images, more than the {listed} listed", "loader")


class _Progress:
    """Images done, images/s and running top-1: a live line on a terminal, a log line otherwise.

    Reading the running top-1 waits for the device, so it is read only when a line is shown.
    """

    def __init__(self, total: int | None, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stderr
        self.live = _isatty(self.stream)
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
            with contextlib.suppress(OSError, ValueError):  # a closed terminal does not stop the run
                print(f"\r{text}", end="", file=self.stream, flush=True)
        else:
            _LG.info(text)

    def close(self) -> None:
        if self.live:
            with contextlib.suppress(OSError, ValueError):
                print(file=self.stream, flush=True)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


@dataclass
class _Breakdown:
    """Throughput of the loader alone, the model alone and both together, in images/s.

    The bound is ``min(loader, model)``: neither side runs faster beside the other than alone.
    On the CPU the two share the cores, so ``shared_fps``, ``1 / (1/loader + 1/model)``, is what
    they would reach taking turns with no overlap; end-to-end between the two means partial
    overlap. ``efficiency`` is end-to-end over the bound; above 1 only by measurement noise.

    ``read_fps`` and ``read_mb_s`` (MB: 10^6 bytes) are the read ceiling: the listed files read
    alone, with the loader's reads and as many threads, no decode, which the loader cannot
    outrun; ``read_resident`` is the share of their bytes in the page cache as that pass began
    (after eviction when ``read_cold``). The bottleneck is the ``disk`` when the loader is the
    slower side and reading alone, from the disk, is at most ``READ_BOUND_SLACK`` faster than the
    loader: the reads set its pace. The bound stays the slower side's rate.
    """

    loader_fps: float
    model_fps: float
    e2e_fps: float
    bound_fps: float
    bottleneck: str
    efficiency: float
    shared_fps: float | None = None
    read_fps: float | None = None
    read_mb_s: float | None = None
    read_resident: float | None = None
    read_cold: bool = False

    @classmethod
    def from_rates(cls, loader_fps: float, model_fps: float, e2e_fps: float, device: torch.device,
                   read: tuple[float, float, float | None, bool] | None = None) -> _Breakdown:  # fmt: skip
        """The breakdown of these rates; ``read``: ``(read_fps, read_mb_s, read_resident, read_cold)``."""
        bound = min(loader_fps, model_fps)
        shared = 1 / (1 / loader_fps + 1 / model_fps) if loader_fps > 0 and model_fps > 0 else 0.0
        bottleneck = "loader" if loader_fps < model_fps else "model"
        if read is not None and bottleneck == "loader" and _disk_bound(loader_fps, read[0], read[2]):
            bottleneck = "disk"
        return cls(loader_fps, model_fps, e2e_fps, bound, bottleneck, e2e_fps / bound if bound else 0.0,
                   shared if device.type == "cpu" else None, *(read or ()))  # fmt: skip


READ_BOUND_SLACK = 0.1  # a loader within 10 % of reading alone spends its time waiting for reads
IN_MEMORY = 0.95  # a read pass that began with this share of the bytes in the page cache read from memory


def _disk_bound(loader_fps: float, read_fps: float, read_resident: float | None) -> bool:
    """Whether the disk sets the loader's pace: reading alone is no more than READ_BOUND_SLACK
    faster than the whole loader, and read from the disk (not from memory; unknown counts as the
    disk). A pass that read nothing (every file refused) says nothing about the disk."""
    from_disk = read_resident is None or read_resident < IN_MEMORY
    return from_disk and 0 < read_fps <= loader_fps * (1 + READ_BOUND_SLACK)


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


def _read_batch_func(max_bytes: int) -> Callable[[Sequence[tuple[str, int]]], tuple[int, int]]:
    """A function that reads a batch's files as the loader does (:py:func:`read_image_bytes`) and
    decodes nothing: ``(images read, bytes read)``. A file it refuses counts as neither: the run
    already counted it as failed."""

    def read_batch(items: Sequence[tuple[str, int]]) -> tuple[int, int]:
        images = size = 0
        for path, _ in items:
            try:
                size += len(_read_image_bytes(path, max_bytes))
            except ImageDecodeError:
                continue
            images += 1
        return images, size

    return read_batch


def _read_batches(
    images: Iterable[tuple[str, int]], batch_size: int, threads: int, max_bytes: int, timeout: float
) -> Iterator[tuple[int, int]]:
    """Each batch's ``(images read, bytes read)``, in order, ``threads`` batches read at once in
    a thread pool: the reads alone, without SPDL's hand-off of each batch, which on files in
    memory costs more than reading them.

    Raises:
        RunStopped: (``loader``) no batch within ``timeout`` seconds (a hung read).
    """
    import collections
    import concurrent.futures

    read_batch = _read_batch_func(max_bytes)
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="read_alone")
    pending: collections.deque[concurrent.futures.Future] = collections.deque()
    try:
        for batch in itertools.chain(_batched(images, batch_size), [None]):
            if batch is not None:
                pending.append(pool.submit(read_batch, batch))
            while pending and (batch is None or len(pending) > threads):
                yield pending.popleft().result(timeout)
    except concurrent.futures.TimeoutError:
        raise RunStopped(f"reading alone: no batch read within {timeout:g} s (--timeout)", "loader") from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung read must not hang the run


def _measure_reads(batches: Iterable[tuple[int, int]], warmup_batches: int) -> tuple[float, float]:
    """Images/s and MB/s (10^6 bytes) over batches of ``(images, bytes)``, in :py:func:`benchmark`'s window."""
    window = _TimingWindow(torch.device("cpu"), warmup_batches)
    timed = every = 0
    for images, size in batches:
        window.add(images)
        every += size
        timed += size if window.batches > warmup_batches else 0
    frames, seconds, warmup_included = window.close()
    size = every if warmup_included else timed
    return (frames / seconds, size / 1e6 / seconds) if seconds > 0 else (0.0, 0.0)


def _measure_model(model: ModelBundle, batch_size: int, num_batches: int, warmup_batches: int) -> float:
    """Images/s of the model alone, on synthetic uint8 batches already on its device."""
    device = _model_device(model)
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


def _init_distributed(device: torch.device, timeout_s: float) -> None:
    """Join the torchrun job: NCCL on CUDA, Gloo on the CPU; collectives give up after ``timeout_s``.

    Raises:
        RunStopped: (``peer``) the other ranks did not join within ``timeout_s``.
    """
    import datetime

    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {}
    if device.type == "cuda":
        if device.index is None:  # NCCL's device_id needs an index
            device = torch.device("cuda", torch.cuda.current_device())
        # Collectives on objects (all_gather_object) use the current device, which device_id
        # does not set: without this, every rank would use cuda:0.
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    except RuntimeError as e:  # DistStoreError: the other ranks did not all come (or the store is gone)
        raise RunStopped(f"the job's other ranks did not join within {timeout_s:g} s "
                         f"({str(e).splitlines()[0]})", "peer") from None  # fmt: skip


def _warmup_for_all_ranks(shard: _Shard, listed: int, batch_size: int, warmup_batches: int) -> int:
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
        raise RunStopped(_peer_gone(e), "peer") from None


def _rank_entry(result: RunResult, shard: _Shard, device: torch.device) -> dict:
    """One rank's share of the job, as the results file lists it."""
    return {"rank": shard.rank, "classified": result.classified, "fps": result.fps,
            "elapsed_s": result.elapsed_s, "device": str(device)}  # fmt: skip


def _reduce_results(result: RunResult, shard: _Shard, device: torch.device) -> tuple[RunResult, list[dict]]:
    """Sum the counts of every rank exactly; the FPS window is the longest rank's.

    Returns:
        The job's totals (on every rank) and one dict per rank: rank, classified, fps,
        elapsed_s, device.
    """
    import torch.distributed as dist

    on = device if device.type == "cuda" else torch.device("cpu")
    fields = ("listed", "classified", "failed", "top1_correct", "top5_correct", "frames_timed", "batches",
              "batches_timed", "decoder_fallbacks")  # fmt: skip
    counts = torch.tensor([getattr(result, f) for f in fields], dtype=torch.int64, device=on)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    flags = torch.tensor(
        [result.elapsed_s, float(result.partial), float(result.warmup_included)], dtype=torch.float64, device=on
    )
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    gathered: list[dict | None] = [None] * shard.world_size
    mine = {**_rank_entry(result, shard, device), "failures": result.failures, "predictions": result.predictions,
            "decoder_backends": result.decoder_backends, "page_cache": result.page_cache}  # fmt: skip
    dist.all_gather_object(gathered, mine)
    total = RunResult(**dict(zip(fields, counts.tolist(), strict=True)))
    total.elapsed_s, total.partial, total.warmup_included = flags[0].item(), bool(flags[1]), bool(flags[2])
    total.failures = [f for rank in gathered for f in rank.pop("failures")]
    for backends in [rank.pop("decoder_backends") for rank in gathered]:
        for backend, count in backends.items():
            total.decoder_backends[backend] = total.decoder_backends.get(backend, 0) + count
    rows = [rank.pop("predictions") for rank in gathered]
    total.predictions = None if any(r is None for r in rows) else [row for r in rows for row in r]
    total.timeline = result.timeline  # rank 0's
    caches = [rank.pop("page_cache") for rank in gathered]  # each rank examined its own shard
    total.page_cache = None if any(c is None for c in caches) else _PageCache.total(caches)
    if result.loader_lead is not None:  # every rank's loader holds as many batches ahead
        total.loader_lead = result.loader_lead * shard.world_size
    return total, gathered


def _agree_on_job(config: _RunConfig) -> None:
    """Check that every rank read the same list (its length and a hash of its paths and labels)
    and was given the same settings: a list still being written while the ranks read it would
    give each its own, and images that no rank classifies. Every rank gets the same answer, so
    all stop or none.

    Raises:
        InputError: the ranks' lists or settings differ (the same line on every rank).
        RunStopped: (``peer``) a rank stopped before it could compare.
    """
    import hashlib

    import torch.distributed as dist

    images = config.images
    digest = hashlib.sha256("\n".join(images.paths).encode("utf-8", "surrogateescape"))
    digest.update(repr(images.labels).encode())
    # May differ from node to node, or from rank to rank (each its own output files, its own clock).
    local = ("device", "decoder_backend", "dtype_reason", "images_from", "command", "start_time")
    settings = {k: v for k, v in config.to_dict().items() if k not in local}
    seen: list = [None] * config.shard.world_size
    try:
        dist.all_gather_object(seen, (len(images), digest.hexdigest(), settings))
    except RuntimeError as e:
        raise RunStopped(_peer_gone(e), "peer") from None
    if len({(n, h) for n, h, _ in seen}) > 1:
        counts = ", ".join(f"rank {rank}: {n}" for rank, (n, _, _) in enumerate(seen))
        raise InputError(f"{images.origin}: the ranks read different lists (images {counts}): was it still "
                            "being written? Write the list first, then start torchrun")  # fmt: skip
    if differ := [k for k in settings if len({json.dumps(other[k]) for _, _, other in seen}) > 1]:
        given = "; ".join(f"{k}: " + ", ".join(f"rank {r}: {other[k]}" for r, (_, _, other) in enumerate(seen))
                          for k in differ)  # fmt: skip
        raise InputError(f"the ranks were given different settings ({given}): start them with the same flags")


_STOPPED_KEY = "imagenet_classification/stopped/"  # + rank: a stopped rank's share, in the job's store


def _publish_stop(entry: dict, rank: int) -> None:
    """Leave a stopped rank's share (counts, failures, why) in torchrun's store, where rank 0 can
    read it after this rank is gone; nothing if the store is gone too."""
    import torch.distributed.distributed_c10d as c10d

    with contextlib.suppress(RuntimeError, ValueError):
        c10d._get_default_store().set(f"{_STOPPED_KEY}{rank}", json.dumps(entry))


def _stopped_peers(shard: _Shard, wait_s: float) -> list[dict]:
    """The shares other ranks left when they stopped (see ``_publish_stop``), waiting up to
    ``wait_s`` for those not there yet; a rank still running, or killed, leaves none."""
    import torch.distributed.distributed_c10d as c10d

    found: dict[int, dict] = {}
    deadline = time.monotonic() + wait_s
    # RunInterrupted: torchrun ending this rank while it waits; what was found stands
    with contextlib.suppress(RuntimeError, ValueError, RunInterrupted):
        store = c10d._get_default_store()
        while True:
            for rank in set(range(shard.world_size)) - {shard.rank} - set(found):
                if store.check([f"{_STOPPED_KEY}{rank}"]):
                    found[rank] = json.loads(store.get(f"{_STOPPED_KEY}{rank}"))
            if len(found) == shard.world_size - 1 or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    return [found[rank] for rank in sorted(found)]


################################################################################
# Parity: does the loader change what the model sees and predicts?
################################################################################


@dataclass
class _Parity:
    """The loader's images against timm's own validation transform (PIL decode, resize, centre
    crop, from the model's pretrained config), on the same images, through the same model.

    Attributes:
        images: Images compared (those both decoded).
        mad_mean, mad_max: Mean and largest per-image mean absolute pixel difference (0-255).
        worst: The image with the largest difference.
        top1_agree: Share of images whose top-1 class is the same both ways.
        top5_agree: Share of images whose five top classes are the same set both ways.
        top1_loader, top1_reference: Top-1 accuracy against the labels, each way.
    """

    images: int
    mad_mean: float
    mad_max: float
    worst: str | None
    top1_agree: float
    top5_agree: float
    top1_loader: float
    top1_reference: float


def _timm_reference(transform: EvalTransform) -> Callable[[Any], Any]:
    """timm's evaluation transform for ``transform``'s config, up to the crop (a PIL image in and out)."""
    import timm.data
    import torchvision.transforms

    t = transform
    full = timm.data.create_transform(input_size=(3, t.size, t.size), crop_pct=t.crop_pct, crop_mode=t.crop_mode,
                                      interpolation=t.interpolation, mean=t.mean, std=t.std)  # fmt: skip
    steps = itertools.takewhile(lambda step: "ToTensor" not in type(step).__name__, full.transforms)
    return torchvision.transforms.Compose(list(steps))


def _reference_images(items: Sequence[tuple[str, int]], transform: EvalTransform) -> dict[str, Tensor]:
    """Each image as timm's validation reads it (``Image.open(...).convert("RGB")``) and
    transforms it: uint8 ``3 x S x S`` by path; images PIL cannot decode are left out."""
    import numpy as np
    from PIL import Image

    reference, out = _timm_reference(transform), {}
    for path, _ in items:
        try:
            with _decoder_errors(path, "PIL", also=(Image.DecompressionBombError,)):
                with Image.open(io.BytesIO(_read_image_bytes(path))) as image:
                    cropped = reference(image.convert("RGB"))
        except ImageDecodeError:
            continue
        out[path] = torch.from_numpy(np.array(cropped)).permute(2, 0, 1)
    return out


def _measure_parity(
    items: Sequence[tuple[str, int]],
    decode: Callable[[Sequence[tuple[str, int]]], _Batch],
    model: ModelBundle,
    batch_size: int = 32,
) -> _Parity:
    """Decode ``items`` with the loader's ``decode`` (made with a skipping policy) and with timm's
    reference transform, and compare pixels and the model's predictions."""
    ours: dict[str, Tensor] = {}
    labels = dict(items)
    for start in range(0, len(items), batch_size):
        batch = decode(items[start : start + batch_size])
        ours.update(zip(batch.paths, batch[0].cpu(), strict=True))
    reference = _reference_images(items, model.transform)
    paths = [path for path, _ in items if path in ours and path in reference]
    mads = [(ours[p].float() - reference[p].float()).abs().mean().item() for p in paths]
    device = _model_device(model)
    agree1 = agree5 = hits_ours = hits_ref = 0
    with torch.inference_mode():
        for start in range(0, len(paths), batch_size):
            chunk = paths[start : start + batch_size]
            a = _logits(model, torch.stack([ours[p] for p in chunk]).to(device)).topk(5, dim=-1).indices.cpu()
            b = _logits(model, torch.stack([reference[p] for p in chunk]).to(device)).topk(5, dim=-1).indices.cpu()
            truth = torch.tensor([labels[p] for p in chunk])
            agree1 += int((a[:, 0] == b[:, 0]).sum())
            agree5 += sum(set(x.tolist()) == set(y.tolist()) for x, y in zip(a, b, strict=True))
            hits_ours, hits_ref = hits_ours + int((a[:, 0] == truth).sum()), hits_ref + int((b[:, 0] == truth).sum())
    n = len(paths)
    worst = paths[mads.index(max(mads))] if mads else None
    return _Parity(n, sum(mads) / n if n else 0.0, max(mads, default=0.0), worst, agree1 / n if n else 0.0,
                  agree5 / n if n else 0.0, hits_ours / n if n else 0.0, hits_ref / n if n else 0.0)  # fmt: skip


################################################################################
# Tuning: the loader's settings swept, the end-to-end rate of the best ones
################################################################################

SWEEP_FLAGS = {"num-threads": "decode_threads", "batch-size": "batch_size", "queue-size": "queue_size",
               "decode-processes": "decode_processes"}  # fmt: skip
SWEEP_TOLERANCE = 0.05  # the recommended setting is the smallest within this of the best


def _parse_sweep(specs: Sequence[str], defaults: dict[str, int], cpu_count: int) -> dict[str, list[int]]:
    """The values to sweep for each of ``num-threads``, ``batch-size``, ``queue-size`` and
    ``decode-processes``, from ``auto`` (threads doubling from 1 to the CPU count) or
    ``NAME=V1,V2,...`` specs; a setting not named keeps its value from ``defaults``.

    Raises:
        ValueError: a spec that is neither, an unknown name, or a value that is not a whole number
            of at least 1 (at least 0 for ``decode-processes``, where 0 decodes in the main process).
    """
    grid = {name: [value] for name, value in defaults.items()}
    for spec in specs:
        if spec == "auto":
            threads = [1 << i for i in range(cpu_count.bit_length()) if 1 << i < cpu_count] + [cpu_count]
            grid["num-threads"] = sorted(set(threads))
            continue
        name, _, values = spec.partition("=")
        if name not in SWEEP_FLAGS or not values:
            raise ValueError(f"{spec!r}: expected auto or NAME=V1,V2,... with NAME one of {', '.join(SWEEP_FLAGS)}")
        try:
            numbers = sorted({int(v) for v in values.split(",")})
        except ValueError:
            raise ValueError(f"{spec!r}: the values must be whole numbers") from None
        if numbers[0] < (0 if name == "decode-processes" else 1):
            raise ValueError(f"{spec!r}: the values must be at least {0 if name == 'decode-processes' else 1}")
        grid[name] = numbers
    return grid


@dataclass
class _SweepPoint:
    """One setting of the loader, and what it reached (images/s)."""

    num_threads: int
    batch_size: int
    queue_size: int
    loader_fps: float
    model_fps: float
    e2e_fps: float | None = None
    decode_processes: int = 0  # worker processes of num_threads threads each; 0: threads in the main process

    @property
    def bound_fps(self) -> float:
        """What this setting can reach end to end: the slower of the loader and the model."""
        return min(self.loader_fps, self.model_fps)

    def flags(self) -> str:
        flags = f"--num-threads {self.num_threads} --batch-size {self.batch_size} --queue-size {self.queue_size}"
        return flags + (f" --decode-processes {self.decode_processes}" if self.decode_processes else "")

    @property
    def threads(self) -> int:
        """Decode threads in all: ``num_threads`` in each worker process, or in the main one."""
        return self.num_threads * max(1, self.decode_processes)


@dataclass
class _Sweep:
    """A sweep's points, in the order run, and the images each loader setting was timed on."""

    points: list[_SweepPoint]
    images: int
    stop_reason: str | None = None  # why it stopped before every setting was measured (then partial)
    error: BaseException | None = field(default=None, repr=False)  # what stopped it, for the exit status

    @property
    def candidates(self) -> list[_SweepPoint]:
        """The settings whose bound is within ``SWEEP_TOLERANCE`` of the best, smallest first
        (fewest threads in all, then processes, batch, queue): those worth running end to end."""
        best = max((p.bound_fps for p in self.points), default=0.0)
        near = [p for p in self.points if p.bound_fps >= (1 - SWEEP_TOLERANCE) * best]
        return sorted(near, key=lambda p: (p.threads, p.decode_processes, p.batch_size, p.queue_size))

    @property
    def recommended(self) -> _SweepPoint | None:
        """The smallest setting run end to end whose end-to-end rate is within
        ``SWEEP_TOLERANCE`` of the best one measured (the bound alone says too little where the
        loader and the model share a CPU's cores); the smallest candidate if none was run; None
        if the sweep stopped before any setting was measured."""
        measured = [p for p in self.candidates if p.e2e_fps is not None]
        if not measured:
            return self.candidates[0] if self.points else None
        best = max(p.e2e_fps or 0.0 for p in measured)
        return next(p for p in measured if (p.e2e_fps or 0.0) >= (1 - SWEEP_TOLERANCE) * best)

    def to_dict(self) -> dict:
        best = self.recommended
        return {"images_per_setting": self.images, "points": [asdict(p) for p in self.points],
                "recommended": None if best is None else asdict(best), "tolerance": SWEEP_TOLERANCE,
                "partial": self.error is not None, "stop_reason": self.stop_reason}  # fmt: skip


def _sweep_settings(config: _RunConfig, threads: int, batch_size: int, queue_size: int, processes: int = 0) -> _RunConfig:
    concurrency = min(threads, NVDEC_CONCURRENCY) if config.decoder == "nvdec" else threads
    return replace(config, decode_threads=threads, decode_concurrency=concurrency, loader_workers=threads,
                   batch_size=batch_size, queue_size=queue_size, decode_processes=processes)  # fmt: skip


def _run_sweep(config: _RunConfig, model: ModelBundle, grid: dict[str, list[int]], e2e_runs: int = 3) -> _Sweep:
    """Time the loader alone at every setting of ``grid`` (from :py:func:`parse_sweep`), each on
    the first images of the list (two warm-up batches, then enough batches to keep every thread
    busy), and the model alone per batch size; then end to end the setting with the best bound
    and the smallest of the candidates (at most ``e2e_runs`` runs in all).

    What stops the sweep (a signal, out of memory, a stalled loader) keeps the settings measured
    so far: ``sweep.error`` holds it, and the sweep is partial."""
    sweep_warmup = 2
    grid = {"decode-processes": [config.decode_processes], **grid}
    most = max(grid["batch-size"]) * (2 * max(grid["num-threads"]) * max(1, *grid["decode-processes"]) + 8 +
                                      sweep_warmup)  # fmt: skip
    images = config.my_images.head(min(len(config.my_images), most))
    sweep, model_fps = _Sweep([], len(images)), {}
    try:
        for threads, batch_size, queue_size, processes in itertools.product(*(grid[n] for n in SWEEP_FLAGS)):
            if batch_size not in model_fps:  # measured when first needed: a stop keeps whole points only
                with _out_of_memory_stops(config.device, batch_size):
                    model_fps[batch_size] = _measure_model(model, batch_size, 10, sweep_warmup)
            settings = _sweep_settings(config, threads, batch_size, queue_size, processes)
            loader_fps = _sweep_timed(settings, images, lambda loader, _: measure_loader(loader.batches,
                                      config.device, sweep_warmup))  # fmt: skip
            sweep.points.append(_SweepPoint(threads, batch_size, queue_size, loader_fps, model_fps[batch_size],
                                           decode_processes=processes))  # fmt: skip
            _LG.info("Sweep: %s: the loader alone %.1f images/s", sweep.points[-1].flags(), loader_fps)
        best = max(sweep.points, key=lambda p: p.bound_fps)
        for point in [best, *[p for p in sweep.candidates if p is not best][: e2e_runs - 1]]:
            settings = _sweep_settings(config, point.num_threads, point.batch_size, point.queue_size,
                                       point.decode_processes)  # fmt: skip
            point.e2e_fps = _sweep_timed(settings, images, lambda loader, policy: benchmark(
                loader.batches, model, listed=len(images), warmup_batches=sweep_warmup, policy=policy).fps)  # fmt: skip
            _LG.info("Sweep: %s: end to end %.1f images/s", point.flags(), point.e2e_fps)
    except (RunStopped, RunInterrupted) as e:
        sweep.error = e
    return sweep


def _sweep_timed(settings: _RunConfig, images: ImageList, measure: Callable[[_Loader, BadImagePolicy], float]) -> float:
    """``measure(loader, policy)`` on a loader of ``settings`` over ``images``, skipping bad images
    (speed, whatever the images); an interrupt stops the loader at once."""
    policy = BadImagePolicy(skip=True)
    with _open_loader(settings, images, policy) as loader:
        try:
            with _out_of_memory_stops(settings.device, settings.batch_size):
                return measure(loader, policy)
        except RunInterrupted:
            loader.stop_at_once = True
            raise


################################################################################
# Reporting
################################################################################


@dataclass
class _RunReport:
    """Everything a run reports: the result and what it was measured with.

    Attributes:
        result: The job's result (every rank's, summed).
        config: The run's settings, as the results file holds them.
        env: Versions and hardware (:py:func:`environment`).
        ranks: Each rank's share (one entry outside torchrun).
        breakdown: The loader alone, the model alone, end-to-end (``--breakdown``).
        breakdown_cut: Why the breakdown did not finish (an interrupt), if it did not.
        pipeline_stats: SPDL's stage statistics (:py:meth:`PipelineStats.summary`).
        decoder_check: The decoder against FFmpeg on the CPU, before the run.
        parity: The loader against timm's reference transform, before the run.
        world_size: The job's processes (torchrun's WORLD_SIZE).
    """

    result: RunResult
    config: dict
    env: dict
    ranks: list[dict]
    breakdown: _Breakdown | None = None
    breakdown_cut: str | None = None
    pipeline_stats: dict | None = None
    decoder_check: _DecoderCheck | None = None
    parity: _Parity | None = None
    world_size: int | None = None  # the job's processes (default: one per entry of ``ranks``)

    def to_dict(self) -> dict:
        payload = {**self.result.to_dict(), "world_size": self.world_size or len(self.ranks), "ranks": self.ranks,
                   "config": self.config, "env": self.env}  # fmt: skip
        extras = {"breakdown": self.breakdown, "decoder_check": self.decoder_check, "parity": self.parity}
        payload.update({k: asdict(v) for k, v in extras.items() if v is not None})
        if self.breakdown_cut is not None:
            payload["breakdown_cut"] = self.breakdown_cut
        if self.pipeline_stats is not None:
            payload["pipeline_stats"] = self.pipeline_stats
        return payload


def _print_summary(result: RunResult, file: TextIO | None = None) -> None:
    """Print the design's FPS and accuracy lines, then the accounting of every listed image."""
    file = file or sys.stdout
    if result.warmup_included:
        print(f"WARNING: only {result.batches} batch(es), not more than the warm-up: FPS includes it", file=file)
    over = result.fps_max_overstatement
    if over is not None and over > FPS_WINDOW_SLACK:
        lead = min(result.loader_lead or 0, result.batches_timed)
        had = "all of them" if lead == result.batches_timed else f"{lead}"
        bound = "FPS may be the model's rate alone" if over == math.inf else f"FPS may be up to {over:.0%} high"
        print(f"WARNING: the FPS window holds {result.batches_timed} batches and the loader may have had "
              f"{had} ready or under way when it opened: if the loader is the bottleneck, {bound}; "
              f"list more images (repeating the list is fine)", file=file)  # fmt: skip
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
        share = result.decoder_fallbacks / result.classified if result.classified else 1.0
        note = "; the figures are mostly the CPU's" if share > FALLBACK_WARNING else ""
        print(f"  {result.decoder_fallbacks} images ({share:.1%}) decoded on the CPU: the GPU decoder cannot "
              f"take them{note}", file=file)  # fmt: skip
    if result.decoder_backends:
        counts = ", ".join(f"{backend} {count}" for backend, count in sorted(result.decoder_backends.items()))
        print(f"  decoded on the GPU, per backend: {counts}", file=file)
    if result.page_cache is not None:
        for line in _page_cache_lines(result.page_cache):
            print(line, file=file)
    for failure in result.failures[:10]:
        print(f"  failed: {failure['path']}: {failure['reason']}", file=file)
    if len(result.failures) > 10:
        print(f"  ... and {len(result.failures) - 10} more (all in the results file)", file=file)


FALLBACK_WARNING = 0.05  # a share of images decoded on the CPU that makes a GPU decoder's figures mostly the CPU's
COLD_RESIDUE = 0.05  # a share of the listed bytes still in memory after eviction that makes a cold run not cold


def _size_text(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def _page_cache_lines(cache: _PageCache) -> list[str]:
    """The summary's lines on the page cache: cold or warm, and how much was in memory."""
    line = "Page cache: cold run (--cold-cache)" if cache.cold else "Page cache: warm run (no --cold-cache)"
    listed = f"the listed {_size_text(cache.bytes)}"
    if cache.resident is None or (cache.cold and cache.resident_after is None):
        line += f"; how much of {listed} was in memory is unknown (mincore could not tell)"
    else:
        line += f"; before it, {cache.resident:.1%} of {listed} was in memory"
        line += f", {cache.resident_after:.1%} after eviction" if cache.resident_after is not None else ""
    if cache.skipped:
        line += f"; {cache.skipped} listed paths not examined (not opened as regular files)"
    lines = [line]
    after = cache.resident_after
    if cache.cold and after is not None and after > COLD_RESIDUE:
        effect = "had no effect" if after >= (cache.resident or 0.0) else f"left {after:.1%} of the bytes in memory"
        lines.append(f"  WARNING: eviction {effect}: the file system ignores it (tmpfs, some network file "
                     "systems) or those pages are not yet written to disk (run sync first); they were read from "
                     "memory")  # fmt: skip
    return lines


def _print_breakdown(breakdown: _Breakdown, file: TextIO | None = None) -> None:
    """Print loader-only, model-only and end-to-end rates side by side, with the verdict."""
    b, file = breakdown, file or sys.stdout
    print(f"Breakdown (images/s): loader alone {b.loader_fps:.1f} | model alone {b.model_fps:.1f} | "
          f"end-to-end {b.e2e_fps:.1f}", file=file)  # fmt: skip
    if b.read_fps is not None:
        share = "unknown" if b.read_resident is None else f"{b.read_resident:.1%}"
        cache = f"{'cold' if b.read_cold else 'warm'}: {share} of the bytes in memory"
        print(f"Reading alone (the loader's reads, as many batches at once, no decode; {cache}): "
              f"{b.read_fps:.1f} images/s, {b.read_mb_s:.1f} MB/s", file=file)  # fmt: skip
    noise = (
        " (above 100 %: measurement noise, or a window too short for the loader's buffer)" if b.efficiency > 1 else ""
    )
    print(f"Bound {b.bound_fps:.1f} images/s, set by the {b.bottleneck}; end-to-end reaches "
          f"{b.efficiency:.0%} of it{noise}", file=file)  # fmt: skip
    if b.bottleneck == "disk" and b.read_fps and b.loader_fps <= b.read_fps:
        print(f"The loader runs at {b.loader_fps / b.read_fps:.0%} of reading alone: the disk sets its pace, not "
              "the decode (more threads help only while the disk has bandwidth to spare)", file=file)  # fmt: skip
    elif b.bottleneck == "disk":
        print("Reading alone was slower than the loader, which reads the same files: the disk's rate changed "
              "between the passes (other readers, pages cached in between)", file=file)  # fmt: skip
    if b.shared_fps is not None:
        print(f"On the CPU the two share the cores: taking turns, with no overlap, they would reach "
              f"{b.shared_fps:.1f} images/s", file=file)  # fmt: skip


def _print_parity(parity: _Parity, file: TextIO | None = None) -> None:
    """Print the loader against timm's reference transform."""
    p = parity
    print(f"Parity with timm's reference transform on {p.images} images: pixels differ by {p.mad_mean:.2f} "
          f"on average (worst {p.mad_max:.2f}, 0-255); top-1 agrees on {p.top1_agree:.1%}, top-5 on "
          f"{p.top5_agree:.1%}; top-1 {p.top1_loader:.1%} here vs {p.top1_reference:.1%} there",
          file=file or sys.stdout)  # fmt: skip


def _print_sweep(sweep: _Sweep, command: Sequence[str], file: TextIO | None = None) -> None:
    """The sweep as a table, then the recommended setting as a command line to copy."""
    file = file or sys.stdout
    print(f"Sweep ({sweep.images} images per setting; images/s):", file=file)
    processes = any(p.decode_processes for p in sweep.points)  # a column only when processes were swept or set
    print(f"{'processes':>9} " * processes + f"{'threads':>8} {'batch':>6} {'queue':>6} {'loader':>9} {'model':>9} "
          f"{'end-to-end':>11}", file=file)  # fmt: skip
    noisy = False
    for p in sweep.points:
        e2e = f"{p.e2e_fps:11.1f}" if p.e2e_fps is not None else f"{'-':>11}"
        mark = " *" if p.e2e_fps is not None and p.e2e_fps > p.bound_fps else ""
        noisy = noisy or bool(mark)
        print(f"{p.decode_processes:>9} " * processes + f"{p.num_threads:>8} {p.batch_size:>6} {p.queue_size:>6} "
              f"{p.loader_fps:9.1f} {p.model_fps:9.1f} {e2e}{mark}", file=file)  # fmt: skip
    if noisy:
        print("  * end to end above min(loader, model), which neither side can beat beside the other: measurement "
              "noise (a short, buffered window); the ranking near it is uncertain", file=file)  # fmt: skip
    if (best := sweep.recommended) is None:  # stopped before any setting was measured
        return
    print(f"The smallest setting within {SWEEP_TOLERANCE:.0%} of the best: {best.flags()}", file=file)
    print(f"  {_shell_join(_with_settings(command, best))}", file=file)


# The sweep's own flags, and the settings it sets, by every name the parser takes.
_SWEEP_DROPPED = {"--sweep", "--plot", "--results-file", "--num-threads", "-j", "--workers", "--batch-size", "-b",
                  "--queue-size"}  # fmt: skip


def _with_settings(command: Sequence[str], point: _SweepPoint) -> list[str]:
    """The command line as typed, without the sweep's own flags (--sweep, --plot, --results-file)
    and the settings it chose, which come last from the point."""
    out, skipping = [], False
    for word in command:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            name = word.split("=")[0]
            skipping = name in _SWEEP_DROPPED or name[:2] in ("-j", "-b") and not name.startswith("--")
        if not skipping:
            out.append(word)
    return [*out, *point.flags().split()]


def _pyplot() -> Any:
    """matplotlib's pyplot drawing to files, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


PLOT_HINT = "pip install matplotlib (or, in the checkout, pip install '.[plot]') to draw it"


def _plot_sweep(sweep: _Sweep, path: Path | str, title: str = "") -> bool:
    """Images/s against decode threads: the loader alone, one line per batch size (and queue
    size); the end-to-end rates measured, as crosses, the recommended one circled; the model
    alone per batch size, a dashed line named at its end. The axes read in plain numbers
    (threads 1, 2, 4; images/s on a log scale when the model is far faster than the loader).
    False where matplotlib is missing."""
    if (plt := _pyplot()) is None:
        return False
    from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(11, 5))
    threads = sorted({p.threads for p in sweep.points})
    groups = sorted({(p.batch_size, p.queue_size, p.decode_processes) for p in sweep.points})
    for batch_size, queue_size, procs in groups:
        mine = sorted((p for p in sweep.points if (p.batch_size, p.queue_size, p.decode_processes) ==
                       (batch_size, queue_size, procs)), key=lambda p: p.threads)  # fmt: skip
        where = f", batch {batch_size}, queue {queue_size}" + (f", {procs} processes" if procs else "")
        colour = ax.plot([p.threads for p in mine], [p.loader_fps for p in mine], marker="o",
                         label=f"loader alone{where}")[0].get_color()  # fmt: skip
        if ran := [p for p in mine if p.e2e_fps is not None]:
            ax.plot([p.threads for p in ran], [p.e2e_fps for p in ran], marker="X", markersize=10, linestyle="none",
                    color=colour, label=f"end to end{where}")  # fmt: skip
    for batch_size in sorted({p.batch_size for p in sweep.points}):
        model = next(p.model_fps for p in sweep.points if p.batch_size == batch_size)
        ax.axhline(model, linestyle="--", color="grey", linewidth=1)
        rate = f"{model:,.0f}" if model >= 100 else f"{model:.3g}"
        ax.annotate(f"model alone, batch {batch_size}: {rate}/s", (threads[-1], model), fontsize=8,
                    xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom", color="dimgrey")  # fmt: skip
    best = sweep.recommended
    ax.plot([best.threads], [best.e2e_fps or best.loader_fps], marker="o", markersize=18, fillstyle="none",
            color="black", linestyle="none", label=f"recommended: {best.flags()}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(threads))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    rates = [r for p in sweep.points for r in (p.loader_fps, p.model_fps, p.e2e_fps) if r]
    if rates and max(rates) > 20 * min(rates):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom=0 if ax.get_yscale() == "linear" else None, top=max(rates, default=1) * 1.3)
    ax.set(xlabel="decode threads (in all processes)", ylabel="images/s",
           title=title or f"Sweep: {sweep.images} images per setting")  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    _save(fig, plt, path)
    return True


def _sliding_rate(ends: Sequence[float], images: Sequence[int], batches: int) -> list[float]:
    """Images/s at each batch's end over the last ``batches`` batches (from the start, 0 s, for
    the first ones): ``sum(images[i-k+1 .. i]) / (ends[i] - ends[i-k])``. 0 where no time passed."""
    rates = []
    for i, end in enumerate(ends):
        first = max(0, i - batches + 1)
        since = ends[first - 1] if first else 0.0
        rates.append(sum(images[first : i + 1]) / (end - since) if end > since else 0.0)
    return rates


def _plot_timeline(timeline: dict, path: Path | str, title: str = "") -> bool:
    """The run as it went: images/s over a sliding window of batches (a tenth of the run, 2 to
    20 batches), the first batch (start-up, and compilation when on) and the warm-up shaded,
    the FPS window and its rate marked, and the sink queue's occupancy per interval where
    measured; every line in the legend. False where matplotlib is missing."""
    if (plt := _pyplot()) is None:
        return False
    ends, images = timeline["batch_end_s"], timeline["batch_images"]
    window = min(20, max(2, len(ends) // 10))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(ends, _sliding_rate(ends, images, window), marker="." if len(ends) < 60 else None,
            label=f"images/s over the last {window} batches")  # fmt: skip
    if ends:
        ax.axvspan(0, ends[0], color="tab:red", alpha=0.15, label="first batch: start-up (and compilation)")
    warm = timeline["warmup_end_s"]
    if warm > 0:
        ax.axvspan(ends[0] if ends else 0, warm, color="grey", alpha=0.2, label="warm-up: not in FPS")
    timed = [(e, n) for e, n in zip(ends, images, strict=True) if e > warm]
    if timed and timeline["end_s"] > warm:
        fps = sum(n for _, n in timed) / (timeline["end_s"] - warm)
        ax.hlines(fps, warm, timeline["end_s"], color="black", linestyle="--", label=f"FPS window: {fps:,.1f} images/s")
    ax.set(xlabel="seconds since the start", ylabel="images/s", title=title or "The run, batch by batch")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    if occupancy := timeline.get("sink_occupancy"):
        twin = ax.twinx()
        interval = timeline["interval_s"]
        handles += twin.step([i * interval for i in range(len(occupancy))], occupancy, where="post", alpha=0.6,
                             color="tab:orange", label=f"a batch waiting (share of each {interval:g} s)")  # fmt: skip
        twin.set(ylim=(0, 1.05), ylabel="share of the time a batch was waiting")
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    _save(fig, plt, path)
    return True


def _save(fig: Any, plt: Any, path: Path | str) -> None:
    """Save a figure as PNG, atomically (see ``_write_atomically``)."""
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    _write_atomically(path, buffer.getvalue())


def _queue_verdict(occupancy: float) -> str:
    if occupancy >= 0.8:
        return "the loader ran ahead of the model"
    if occupancy <= 0.2:
        return "the model waited for batches: loading is the bottleneck"
    return "loader and model ran at about the same pace"


def _print_pipeline_stats(stats: dict, file: TextIO | None = None) -> None:
    """Print :py:meth:`PipelineStats.summary`: each stage's average task time, then the sink
    queue's occupancy read as SPDL's performance guide reads it."""
    file = file or sys.stdout
    stages = []
    for stage in stats["stages"]:
        failed = f" ({stage['failures']} failed)" if stage["failures"] else ""
        stages.append(f"{stage['name']} {stage['ave_task_s'] * 1e3:.2f} ms x {stage['tasks']}{failed}")
    if stages:
        print(f"SPDL stages (average task time x tasks): {', '.join(stages)}", file=file)
    else:  # --decode-processes: the decode stage's tasks run, and are timed, in the worker processes
        print("SPDL stages: none timed in this process (the decode stage runs in worker processes)", file=file)
    sink = stats["sink_queue"]
    if not sink["items"]:
        print("SPDL sink queue: no batch was taken in the FPS window", file=file)
        return
    wait_ms = sink["ave_get_wait_s"] * 1e3
    print(f"SPDL sink queue: a batch was waiting {sink['occupancy']:.0%} of the time, the model waited "
          f"{wait_ms:.2f} ms per batch: {_queue_verdict(sink['occupancy'])}", file=file)  # fmt: skip


def _print_report(report: _RunReport, file: TextIO | None = None) -> None:
    """The summary, then SPDL's statistics, the parity, and the breakdown (or why it was cut)."""
    _print_summary(report.result, file)
    if report.pipeline_stats is not None:
        _print_pipeline_stats(report.pipeline_stats, file)
    if report.parity is not None:
        _print_parity(report.parity, file)
    if report.breakdown is not None:
        _print_breakdown(report.breakdown, file)
    if report.breakdown_cut is not None:
        print(f"Breakdown cut short ({report.breakdown_cut}): the end-to-end result above is complete", file=file)


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


def _environment(device: torch.device) -> dict:
    """Versions and hardware that the numbers depend on."""
    ffmpeg = spdl.io.utils.get_ffmpeg_versions()
    env = {
        "imagenet_classification": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "spdl": _version("spdl"),
        "ffmpeg": {lib: ".".join(map(str, v)) for lib, v in ffmpeg.items()},
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return env


def _write_atomically(path: Path | str, text: str | bytes) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over
    ``path``: a reader sees the old file or the new one, never a part, and a failed write leaves
    the old one. A symbolic link is followed, so the file it names is replaced.

    Raises:
        OSError: the write failed (no space, the folder gone, no permission, not a regular file).
    """
    if (problem := _not_a_file(path)) is not None:  # the start-up check's own test (_check_output_path)
        raise OSError(errno.EINVAL, problem, str(path))
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            # surrogateescape: a name that is not UTF-8 (read with the file system's own
            # surrogateescape) is written back as the bytes it has on disk, not refused
            f.write(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _not_a_file(path: Path | str) -> str | None:
    """Why ``path`` cannot take an output, or None: it names (links followed, ``/dev/stdout``'s
    too) a folder, a device, a FIFO or a pipe, or the file this process's stdin, stdout or stderr
    is (``--results-file /dev/stdout > run.log``: its link leads to run.log, and replacing that
    would lose the summary)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:  # /dev/stdout with stdout closed leads to /proc, where no file can be made
        in_proc = Path(os.path.realpath(path)).parts[1:2] == ("proc",)
        return "a process's file descriptor (/proc), not a regular file" if in_proc else None
    if not stat.S_ISREG(found.st_mode):
        return "not a regular file (a folder, device, FIFO or pipe)"
    for fd, stream in enumerate(("stdin", "stdout", "stderr")):
        with contextlib.suppress(OSError):
            if os.path.samestat(found, os.fstat(fd)):
                return f"that is the file the run's {stream} goes to, which it would replace; give another name"
    return None


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    return 0o022


def _write_results(path: Path | str, report: _RunReport) -> None:
    """Write the report as one JSON object, or for a ``.csv`` path one CSV row as timm's
    validate.py and benchmark.py write theirs (see :py:func:`_results_row`); atomically (see
    ``_write_atomically``).

    Raises:
        OSError: the file could not be written; an existing one is left as it was.
    """
    if str(path).lower().endswith(".csv"):
        row = _results_row(report.to_dict())
        _write_atomically(path, _csv_text([row], row))
    else:
        _write_atomically(path, json.dumps(report.to_dict(), indent=2) + "\n")


def _results_row(payload: dict) -> dict:
    """The results as one flat row: timm's column names where it has them, in its units (top-1
    and top-5 in percent, as validate.py writes them; ``infer_*`` as benchmark.py does), then
    this tool's figures (fractions and images/s, as in the JSON)."""
    c = payload["config"]
    top1, top5 = 100 * payload["top1"], 100 * payload["top5"]
    return {
        "model": c["model"], "top1": round(top1, 4), "top1_err": round(100 - top1, 4), "top5": round(top5, 4),
        "top5_err": round(100 - top5, 4), "img_size": c["input_size"][-1], "crop_pct": c["crop_pct"],
        "interpolation": c["interpolation"], "infer_samples_per_sec": round(payload["fps"], 2),
        "infer_batch_size": c["batch_size"], "fps": payload["fps"], "elapsed_s": payload["elapsed_s"],
        "frames_timed": payload["frames_timed"], "listed": payload["listed"], "classified": payload["classified"],
        "failed": payload["failed"], "not_reached": payload["not_reached"], "partial": payload["partial"],
        "warmup_included": payload["warmup_included"], "fps_max_overstatement": payload["fps_max_overstatement"],
        "fps_window_may_be_buffered": payload["fps_window_may_be_buffered"], "world_size": payload["world_size"],
        "device": c["device"], "dtype": c["dtype"], "compile": c["compile"], "weights": c["weights"],
        "loader": c["loader"], "decoder": c["decoder"], "num_threads": c["num_threads"],
        "queue_size": c["queue_size"], "version": payload["env"]["imagenet_classification"],
        "start_time": c["start_time"], "command": c["command"],
    }  # fmt: skip


def _csv_text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Rows as CSV under a header of ``columns`` (the header alone where there is no row); None
    as an empty field."""
    import csv

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _write_predictions(path: Path | str, rows: Sequence[dict]) -> None:
    """Write one row per classified image: CSV for a ``.csv`` path, JSON Lines otherwise.

    Columns: path, label, label_name, top5 (class indices, best first), top5_names (their
    names; in CSV joined by `` | ``), probs (their softmax probabilities), correct1, correct5.

    Raises:
        OSError: the file could not be written.
    """
    if str(path).lower().endswith(".csv"):
        flat = [{**r, "top5": " ".join(map(str, r["top5"])), "top5_names": " | ".join(r["top5_names"]),
                 "probs": " ".join(map(str, r["probs"])), "correct1": int(r["correct1"]),
                 "correct5": int(r["correct5"])} for r in rows]  # fmt: skip
        columns = ("path", "label", "label_name", "top5", "top5_names", "probs", "correct1", "correct5")
        _write_atomically(path, _csv_text(flat, columns))
    else:
        _write_atomically(path, "".join(json.dumps(r) + "\n" for r in rows))


################################################################################
# Entry point: pre-flight checks, a frozen config, the run, the report, exit statuses
################################################################################


@dataclass(frozen=True)
class _RunConfig:
    """The run's settings, built once from the arguments after the pre-flight checks.

    Attributes:
        images: The whole job's images (every rank's), read once.
        shard: This process's place in a torchrun job.
        device: Where the batches go and the model runs.
        loader: ``spdl``, or ``torch`` for the DataLoader baseline.
        decoder, decoder_backend: ``ffmpeg``, ``nvjpeg`` or ``nvdec`` (``pil`` with the DataLoader),
            and what implements it.
        transform: Size, crop and normalisation, from the model's pretrained config.
        decode_threads: Threads in SPDL's pool (in each worker process, with decode_processes).
        decode_concurrency: Batches SPDL decodes at once (in each worker process).
        decode_processes: Worker processes of the decode stage; 0 decodes in this process.
        loader_workers: The DataLoader's worker processes.
        dtype, dtype_reason: The model's precision, and why.
        max_bad: ``(value, is_percent)`` from ``--max-bad``, or None.
        stats_interval: Seconds between SPDL's own statistics logs; -1 for none.
        cold_cache: Evict the images from the page cache before the run, and before each
            breakdown pass that reads them (``--cold-cache``).
    """

    images: ImageList
    shard: _Shard
    device: torch.device
    loader: str
    decoder: str
    decoder_backend: str
    transform: EvalTransform
    batch_size: int
    decode_threads: int
    decode_concurrency: int
    loader_workers: int
    queue_size: int
    model: str
    weights: str
    checkpoint: Path | None
    dtype: torch.dtype
    dtype_reason: str
    compile: bool | str
    warmup_batches: int
    skip_bad: bool
    max_bad: tuple[float, bool] | None
    max_image_bytes: int
    timeout: float
    breakdown: bool
    parity: int
    check_decoder: int
    stats_interval: float
    results_file: Path | None
    predictions_file: Path | None
    trace: Path | None
    plot: Path | None = None
    cold_cache: bool = False
    sweep: dict[str, list[int]] | None = None
    command: tuple[str, ...] = ()
    transform_overrides: dict = field(default_factory=dict)
    start_time: str = ""
    decode_processes: int = 0

    @property
    def my_images(self) -> ImageList:
        """This rank's shard of the images."""
        return self.images.shard(self.shard.rank, self.shard.world_size)

    @property
    def loader_lead(self) -> int:
        """Batches the loader can hold ahead of the model: SPDL's sink buffer, the one its sink
        stage holds on the way there, its queue before the sink and the batches decoded at once;
        the DataLoader's prefetch (2 per worker)."""
        if self.loader == "torch":
            return 2 * self.loader_workers
        return self.queue_size + 1 + _SPDL_STAGE_BUFFER + self.decode_concurrency * max(1, self.decode_processes)

    def policy(self) -> BadImagePolicy:
        """A fresh bad-image policy as the flags ask."""
        if self.max_bad is None:
            return BadImagePolicy(skip=self.skip_bad)
        value, is_percent = self.max_bad
        return BadImagePolicy(True, None if is_percent else int(value), value if is_percent else None)

    def to_dict(self) -> dict:
        """The settings as the results file's ``config`` holds them."""
        t = self.transform
        return {
            "model": self.model, "weights": self.weights, "loader": self.loader, "batch_size": self.batch_size,
            "num_threads": self.decode_threads, "decode_concurrency": self.decode_concurrency,
            "decode_processes": self.decode_processes,
            "loader_workers": self.loader_workers, "queue_size": self.queue_size, "decoder": self.decoder,
            "decoder_backend": self.decoder_backend, "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."), "dtype_reason": self.dtype_reason,
            "compile": self.compile, "input_size": [3, t.size, t.size], "crop_pct": t.crop_pct,
            "crop_mode": t.crop_mode, "interpolation": t.interpolation, "mean": list(t.mean), "std": list(t.std),
            "warmup_batches": self.warmup_batches, "skip_bad": self.skip_bad,
            "max_bad": None if self.max_bad is None else f"{self.max_bad[0]:g}{'%' if self.max_bad[1] else ''}",
            "max_image_mb": self.max_image_bytes >> 20, "images_from": self.images.origin,
            "cold_cache": self.cold_cache,
            "command": _shell_join(self.command), "start_time": self.start_time,
        }  # fmt: skip


def _shell_join(words: Sequence[str]) -> str:
    """A command line to paste into a shell (each word quoted as it needs)."""
    import shlex

    return shlex.join(words)


def _read_images(args: argparse.Namespace) -> ImageList:
    """The run's images, read once from the list or the folder (with the labels file, if any)."""
    limit = args.max_samples
    if args.trace is not None:  # --trace keeps traces small
        limit = min(limit or math.inf, args.batch_size * TRACE_BATCHES)
    labels = read_labels(args.labels) if args.labels is not None else None
    if args.data_dir is not None:
        return scan_folder(args.data_dir, limit, labels=labels)
    images = read_file_list(args.input_flist, args.prefix, limit, labels=labels)
    if args.prefix.endswith(os.sep) and not os.path.isdir(args.prefix):
        raise InputError(f"--prefix {args.prefix}: no such folder")
    if not os.path.lexists(images.paths[0]):
        raise InputError(f"the first listed image, {images.paths[0]}, does not exist: is --prefix right?")
    return images


def _check_outputs(args: argparse.Namespace, images: ImageList) -> None:
    """Every file the run will write: a file name in an existing, writable folder, no folder,
    device or FIFO, and none of the run's inputs (the list, the labels, the checkpoint, an image)
    nor another output: each would be overwritten."""
    outputs = [("--results-file", args.results_file), ("--predictions-file", args.predictions_file),
               ("--plot", args.plot)]  # fmt: skip
    if args.trace is not None:
        _check_output_path("--trace", args.trace)  # a file name, PATH.json and PATH.pftrace beside it
        outputs += [("--trace", Path(f"{args.trace}{suffix}")) for suffix in (".json", ".pftrace")]
    inputs = {os.path.realpath(p) for p in (args.input_flist, args.labels, args.checkpoint) if p and str(p) != "-"}
    seen: set[str] = set()
    for flag, path in outputs:
        if path is None:
            continue
        target = _check_output_path(flag, path)
        listed = {os.path.realpath(p) for p in images.paths if os.path.basename(p) == os.path.basename(target)}
        if target in inputs | listed | seen:
            raise InputError(
                f"{flag} {path}: that file is one of the run's inputs or outputs; writing would replace it"
            )
        seen.add(target)
    if args.predictions_file is not None and not str(args.predictions_file).lower().endswith(PREDICTION_SUFFIXES):
        raise InputError(f"--predictions-file {args.predictions_file}: the name must end in .csv or .jsonl")
    if args.plot is not None and not str(args.plot).lower().endswith(".png"):
        raise InputError(f"--plot {args.plot}: the name must end in .png")


PREDICTION_SUFFIXES = (".csv", ".jsonl")


def _check_output_path(flag: str, path: Path) -> str:
    """One file the run will write (see _check_outputs); returns its real path."""
    if str(path) == "-":  # stdout carries the summary; a file beside it is what was meant, or a mistake
        raise InputError(f"{flag} -: the summary goes to stdout; give a file name (- is none)")
    if path.name in ("", ".", "..") or str(path).endswith(os.sep):
        raise InputError(f"{flag} {path}: not a file name")
    if (problem := _not_a_file(path)) is not None:
        raise InputError(f"{flag} {path}: {problem}")
    target = Path(os.path.realpath(path))
    if not target.parent.is_dir():
        raise InputError(f"{flag} {path}: folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"{flag} {path}: cannot write there")
    return str(target)


def _check_caches(device: torch.device, compile: bool) -> None:
    """torch's cache folder, which importing timm already creates (and torch.compile fills on the
    first batch), and Triton's when compiling for a GPU: find an unwritable one now, in words."""
    import getpass

    try:  # where torch puts it (torch._inductor.runtime.cache_dir_utils, which creates it on import)
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    default = Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    folders = {"TORCHINDUCTOR_CACHE_DIR": Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default)}
    if compile and device.type == "cuda":
        folders["TRITON_CACHE_DIR"] = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    for variable, folder in folders.items():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as e:
            raise InputError(f"torch cannot write its cache in {folder} ({e.strerror or e}); "
                             f"set {variable} to a writable folder") from None  # fmt: skip


def _preflight(args: argparse.Namespace, shard: _Shard, command: Sequence[str] = ()) -> _RunConfig:
    """Check everything that can be checked before the model is built; build the run's config."""
    if shard.world_size > 1 and str(args.input_flist) == "-":
        raise InputError("--input-flist -: under torchrun every rank would read stdin; give the list as a file")
    images = _read_images(args)
    try:
        if args.checkpoint is not None and not args.checkpoint.is_file():
            what = "no such file" if not args.checkpoint.exists() else "not a regular file"
            raise InputError(f"--checkpoint {args.checkpoint}: {what}")
        _check_outputs(args, images)
    except OSError as e:  # e.g. a name too long for the file system
        raise InputError(f"{e.filename}: {e.strerror or e}") from None
    if args.breakdown and shard.world_size > 1:
        raise InputError("--breakdown runs in a single process, not under torchrun")
    if args.cold_cache and not hasattr(os, "posix_fadvise"):
        raise InputError(f"--cold-cache: {platform.system()} has no posix_fadvise to evict files from the page cache")
    if args.parity and shard.world_size > 1:  # rank 0 alone would compare, while the others wait out --timeout
        raise InputError("--parity compares in a single process, not under torchrun")
    device = _resolve_device(args.device, shard.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # so that no library makes a context on cuda:0 for this rank
    decoder = "nvjpeg" if args.use_nvjpeg else "nvdec" if args.use_nvdec else "ffmpeg"
    if args.decode_processes and (decoder != "ffmpeg" or args.loader == "torch"):
        raise InputError("--decode-processes runs FFmpeg's decode in worker processes; "
                         f"not with {'--loader torch' if args.loader == 'torch' else f'--use-{decoder}'}")  # fmt: skip
    backend = _check_gpu_decoder(decoder, device)
    dtype, dtype_reason = _choose_dtype(device, args.dtype)
    compile = args.compile if args.compile is not None else device.type == "cuda"
    _check_caches(device, compile)
    transform = EvalTransform.from_model_name(args.model, _transform_overrides(args))
    torch_loader = args.loader == "torch"
    # A thread or worker with no image idles, and costs memory (a process each for the DataLoader).
    # (The queue is a bound that allocates nothing: it stays as given.)
    check_images = CHECK_DECODER_IMAGES if args.check_decoder is None else args.check_decoder
    threads = min(args.num_threads, max(1, shard.size_of(len(images))))
    if threads < args.num_threads:
        _LG.info("--num-threads %d capped at %d, the images this process has.", args.num_threads, threads)
    return _RunConfig(
        images=images, shard=shard, device=device, loader=args.loader,
        decoder="pil" if torch_loader else decoder, decoder_backend="pil" if torch_loader else backend,
        transform=transform, batch_size=args.batch_size, decode_threads=threads,
        decode_concurrency=min(threads, NVDEC_CONCURRENCY) if decoder == "nvdec" else threads,
        loader_workers=threads, queue_size=args.queue_size, model=args.model,
        weights=str(args.checkpoint) if args.checkpoint else "pretrained" if args.pretrained else "random",
        checkpoint=args.checkpoint, dtype=dtype, dtype_reason=dtype_reason,
        compile=compile and (args.compile_mode or COMPILE_MODE), transform_overrides=_transform_overrides(args),
        warmup_batches=args.warmup_batches, skip_bad=args.skip_bad, max_bad=args.max_bad,
        max_image_bytes=args.max_image_mb << 20, timeout=args.timeout, breakdown=args.breakdown,
        parity=args.parity, check_decoder=0 if torch_loader else check_images,
        stats_interval=args.stats_interval or -1, results_file=args.results_file,
        predictions_file=args.predictions_file, trace=args.trace, plot=args.plot, cold_cache=args.cold_cache,
        sweep=_sweep_grid(args, shard, len(images)), command=tuple(command),
        decode_processes=args.decode_processes,
    )  # fmt: skip


def _transform_overrides(args: argparse.Namespace) -> dict:
    """The transform flags given, as timm's ``resolve_data_config`` takes them."""
    given = {"img_size": args.img_size, "crop_pct": args.crop_pct, "interpolation": args.interpolation,
             "mean": args.mean and tuple(args.mean), "std": args.std and tuple(args.std)}  # fmt: skip
    return {k: v for k, v in given.items() if v is not None}


def _sweep_grid(args: argparse.Namespace, shard: _Shard, listed: int) -> dict[str, list[int]] | None:
    if not args.sweep:
        return None
    if shard.world_size > 1:
        raise InputError("--sweep runs in a single process, not under torchrun")
    defaults = {"num-threads": args.num_threads, "batch-size": args.batch_size, "queue-size": args.queue_size,
                "decode-processes": args.decode_processes}  # fmt: skip
    try:
        grid = _parse_sweep(args.sweep, defaults, os.cpu_count() or 1)
    except ValueError as e:
        raise InputError(f"--sweep: {e}") from None
    if args.loader == "torch" and len(grid["queue-size"]) > 1:
        raise InputError("--sweep queue-size=...: --loader torch has no queue (its workers prefetch 2 batches each)")
    capped = _capped_sizes(grid, listed)
    if capped != grid:
        asked = ", ".join(f"{name}={','.join(map(str, grid[name]))}" for name in grid if capped[name] != grid[name])
        _LG.info("Sweep: %s capped at the %d images listed.", asked, listed)
    return capped


def _capped_sizes(grid: dict[str, list[int]], listed: int) -> dict[str, list[int]]:
    """The grid with batch sizes and thread counts above ``listed`` at ``listed``: a batch holds
    no more images than the list (as the run's own batches do), and a thread or worker without an
    image does nothing but cost memory."""
    capped = {name: sorted({min(v, listed) for v in grid[name]}) for name in ("num-threads", "batch-size")}
    return {**grid, **capped}  # the queue is a bound that allocates nothing: as given


def _check_run_decoder(config: _RunConfig) -> _DecoderCheck | None:
    """The run's decoder against FFmpeg on the CPU, on the first images (before the model is built)."""
    if not config.check_decoder or config.device.type == "cpu" and config.decoder == "ffmpeg":
        return None  # FFmpeg on the CPU is the reference itself
    decode = get_decode_func(config.device, config.transform, config.decoder,
                             max_image_bytes=config.max_image_bytes)  # fmt: skip
    check = _check_decoder(decode, list(config.images.head(config.check_decoder)), config.transform, config.decoder)
    _LG.info("Decoder check: %s against FFmpeg on the CPU, %d images, mean absolute difference %.2f (worst %.2f).",
             config.decoder, check.images, check.mad_mean, check.mad_max)  # fmt: skip
    return check


_ABANDONED: list = []  # DataLoader iterators not shut down: their workers end with the process


@dataclass
class _Loader:
    """A running loader: its batches, its SPDL stage statistics (None for ``--loader torch``),
    whether to stop it at once (an interrupt: the process ends right after the report) and
    whether it stopped cleanly (False when a worker thread was stuck, e.g. in a hung read)."""

    batches: Iterator[_Batch]
    stats: _PipelineStats | None = None
    stop_at_once: bool = False
    stopped_cleanly: bool = True


def _stop_pipeline(pipeline: Pipeline, timeout: float, workers_ended: bool = False) -> bool:
    """Stop the pipeline; return False if a worker thread did not end within ``timeout`` seconds
    (stuck in a hung read, or still decoding when the run must end at once). With
    ``workers_ended`` (an interrupt ended the decode processes), the failure SPDL's stop may
    raise for the stage whose queue they left unread is that ending, not a failure of the run."""
    try:
        pipeline.stop(timeout=timeout)
    except TimeoutError:
        return False
    except PipelineFailure:
        if not workers_ended:
            raise
        return False
    return True


@contextlib.contextmanager
def _open_loader(config: _RunConfig, images: ImageList, policy: BadImagePolicy) -> Iterator[_Loader]:
    """Start the loader the config names over ``images``; stop it on the way out."""
    if config.loader == "torch":
        dataset = _PILDataset(images, config.transform, config.max_image_bytes)
        workers = iter(_get_torch_loader(dataset, config.batch_size, config.loader_workers, config.device,
                                        config.timeout))  # fmt: skip
        handle = _Loader(_torch_loader_batches(workers, config.device, policy))
        try:
            yield handle
        finally:
            if handle.stop_at_once:  # the process ends right after the report: no joining busy workers
                _ABANDONED.append(workers)
            elif hasattr(workers, "_shutdown_workers"):
                # Now, not once nothing refers to the iterator (a stopped run's traceback keeps this
                # frame): until then torch's SIGCHLD handler raises, anywhere, for a dead worker.
                workers._shutdown_workers()
        return
    if config.decode_processes:  # batches decoded on the CPU in worker processes, copied to the device here
        decode_func: Callable = _ProcessDecode(config.transform, config.max_image_bytes)
    else:
        decode_func = get_decode_func(config.device, config.transform, config.decoder, policy,
                                      max_image_bytes=config.max_image_bytes)  # fmt: skip
    stats = _PipelineStats(config.stats_interval)
    pipeline = get_pipeline(images, config.batch_size, decode_func, config.decode_concurrency, config.queue_size,
                            config.decode_threads, stats=stats, decode_processes=config.decode_processes)  # fmt: skip
    pipeline.start()
    batches = pipeline.get_iterator(timeout=config.timeout)
    if config.decode_processes:
        batches = _received(batches, config.device)
    handle = _Loader(batches, stats)
    try:
        yield handle
    finally:
        workers_ended = handle.stop_at_once and config.decode_processes > 0
        if workers_ended:  # an interrupt: the workers end now, not after SPDL's seconds of joining each;
            logging.getLogger("spdl.pipeline").setLevel(logging.CRITICAL)  # its traceback for their queue: no news
            _end_children()
        handle.stopped_cleanly = _stop_pipeline(pipeline, 0.1 if handle.stop_at_once else 1.5, workers_ended)
        if config.decode_processes:  # free the pool's queues now: the process ends with os._exit, and
            handle.batches = batches = pipeline = iter(())  # multiprocessing's resource tracker would
            gc.collect()  # then warn of their semaphores as leaked


def _clock_start_hook(shard: _Shard, stats: _PipelineStats | None) -> Callable[[], None]:
    """What runs at each clock start: a barrier across ranks, and the stage statistics' window."""

    def at_clock_start() -> None:
        if shard.world_size > 1:
            _barrier()
        if stats is not None:
            stats.start_window()

    return at_clock_start


@contextlib.contextmanager
def _tracing(path: Path | None, device: torch.device) -> Iterator[torch.profiler.profile | None]:
    """With a path, record SPDL's trace (into PATH.pftrace as it goes) and torch's: yields torch's
    profiler, whose trace (PATH.json) the caller exports once the run has ended or stopped
    (:py:func:`_export_trace`)."""
    if path is None:
        yield None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    else:  # Kineto's 'gpuGetDeviceCount failed' on a CPU run is an error line about nothing
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with torch.profiler.profile(activities=activities) as profiler, spdl.io.utils.tracing(f"{path}.pftrace"):
        yield profiler


def _export_trace(profiler: torch.profiler.profile, path: Path) -> None:
    """Write torch's trace beside SPDL's, and say where both are."""
    profiler.export_chrome_trace(f"{path}.json")
    _say(f"trace: {path}.json (torch's profiler) and {path}.pftrace (SPDL's); open either in https://ui.perfetto.dev")


@dataclass
class _Outcome:
    """What a rank's run came to: its result, the error it stopped with, and what else it measured."""

    result: RunResult
    error: BaseException | None = None
    pipeline_stats: dict | None = None
    stopped_cleanly: bool = True
    profiler: torch.profiler.profile | None = None  # --trace: torch's trace, exported after the summary
    job_stop_reason: str | None = None  # under torchrun: what stopped the job, if a peer's failure did


def _run_loop(config: _RunConfig, model: ModelBundle) -> _Outcome:
    """Run the timed loop over this rank's images; a run that stops early is an outcome too, and
    so is one interrupted while its loader starts or stops."""
    images, policy = config.my_images, config.policy()
    progress = _Progress(len(images)) if config.shard.rank == 0 else None
    warmup = _warmup_for_all_ranks(config.shard, len(config.images), config.batch_size, config.warmup_batches)
    outcome, loader = _Outcome(RunResult(len(images), partial=True)), None
    try:
        with _open_loader(config, images, policy) as loader:
            try:
                with _tracing(config.trace if config.shard.rank == 0 else None, config.device) as outcome.profiler:
                    outcome.result = benchmark(
                        loader.batches, model, listed=len(images), warmup_batches=warmup, policy=policy,
                        sync_clocks=_clock_start_hook(config.shard, loader.stats), progress=progress,
                        predictions=config.predictions_file is not None, loader_lead=config.loader_lead,
                    )  # fmt: skip
            except (RunStopped, RunInterrupted) as e:
                outcome.result, outcome.error = e.result or outcome.result, e
                loader.stop_at_once = isinstance(e, RunInterrupted)
            finally:
                if progress is not None:
                    progress.close()
    except RunInterrupted as e:  # while the loader started or stopped: what was measured stands
        outcome.error, outcome.stopped_cleanly = outcome.error or e, False
    if loader is not None:
        _add_loader_stats(outcome, loader, config.decode_concurrency if config.shard.world_size == 1 else None)
    return outcome


def _add_loader_stats(outcome: _Outcome, loader: _Loader, concurrency: int | None) -> None:
    """SPDL's stage statistics, what the loader had done when the FPS window opened (for the
    bound on FPS; not with ``concurrency`` None: under torchrun, where the job's bound is every
    rank's capacity), and the sink queue's occupancy per second in the timeline."""
    outcome.stopped_cleanly = outcome.stopped_cleanly and loader.stopped_cleanly
    if loader.stats is None:
        return
    outcome.pipeline_stats = loader.stats.summary()
    if concurrency is not None:
        _add_window_lead(outcome.result, loader.stats, concurrency)
    if t := outcome.result.timeline:
        start, end = t["started_at"], t["started_at"] + t["end_s"]
        t["sink_occupancy"] = loader.stats.waiting_per_interval(start, end, t["interval_s"], len(t["images"]))


def _add_window_lead(result: RunResult, stats: _PipelineStats, concurrency: int) -> None:
    """The loader's lead and known rate when the FPS window opened, as measured, in ``result``
    (the lead never above the loader's capacity already there)."""
    window = stats.window_lead(concurrency)
    if window is None or result.warmup_included or result.loader_lead is None:
        return
    lead, batches_per_s = window
    result.loader_lead = min(result.loader_lead, lead)
    if batches_per_s is not None and result.batches_timed:
        result.loader_min_fps = batches_per_s * result.frames_timed / result.batches_timed


def _measure_breakdown(config: _RunConfig, model: ModelBundle, result: RunResult) -> _Breakdown:
    """After the end-to-end run: the same loader alone, reading its files alone, then the model
    alone on as many batches of the run's size (never more work than the run had). With
    ``--cold-cache`` the files are evicted again before each pass that reads them."""
    _LG.info("Breakdown: timing the loader alone, then reading alone, then the model alone.")
    if config.cold_cache:
        _examine_page_cache(config.my_images.paths, evict=True)
    with _open_loader(config, config.my_images, config.policy()) as loader:
        loader_fps = measure_loader(loader.batches, config.device, config.warmup_batches)
    read = _read_alone(config)
    batch_size = min(config.batch_size, len(config.my_images))
    model_fps = _measure_model(model, batch_size, result.batches, config.warmup_batches)
    return _Breakdown.from_rates(loader_fps, model_fps, result.fps, config.device, read)


def _read_alone(config: _RunConfig) -> tuple[float, float, float | None, bool]:
    """The read ceiling: this rank's files read as the loader reads them, as many batches at once
    as it decodes, no decode. Returns images/s, MB/s, the share of their bytes in the page cache
    as the pass began (after eviction with ``--cold-cache``), and whether they were evicted."""
    cache = _examine_page_cache(config.my_images.paths, evict=config.cold_cache)
    batches = _read_batches(config.my_images, config.batch_size, config.decode_concurrency, config.max_image_bytes,
                            config.timeout)  # fmt: skip
    fps, mb_s = _measure_reads(batches, config.warmup_batches)
    return fps, mb_s, cache.resident_after if config.cold_cache else cache.resident, config.cold_cache


def _look_at_cache(config: _RunConfig) -> _PageCache:
    """This rank's images in the page cache; evicted first with ``--cold-cache``."""
    what = "evicting them from" if config.cold_cache else "how much is in"
    _LG.info("Page cache: %s files listed, %s the page cache.", len(config.my_images), what)
    return _examine_page_cache(config.my_images.paths, evict=config.cold_cache)


def _combine_ranks(outcome: _Outcome, config: _RunConfig) -> list[dict]:
    """The job's totals into ``outcome.result``; the per-rank list (see ``_job_after_stop`` for a
    job that stopped)."""
    mine = _rank_entry(outcome.result, config.shard, config.device)
    if config.shard.world_size == 1:
        return [mine]
    if outcome.error is None:
        try:
            outcome.result, ranks = _reduce_results(outcome.result, config.shard, config.device)
            return ranks
        except RuntimeError as e:  # a peer stopped before the final reduction
            outcome.error = RunStopped(_peer_gone(e), "peer")
        except RunInterrupted as e:  # torchrun ends the other ranks once one has stopped
            outcome.error = e
        outcome.result.partial = True
    return _job_after_stop(outcome, config, mine)


_COUNTS = ("classified", "failed", "top1_correct", "top5_correct", "frames_timed", "batches", "batches_timed",
           "decoder_fallbacks")  # fmt: skip
PEER_WORD_S = 2.0  # how long rank 0, stopped by a peer or a signal, waits for the stopped ranks' shares


def _job_after_stop(outcome: _Outcome, config: _RunConfig, mine: dict) -> list[dict]:
    """A stopped job as this rank can know it: its own share, left for rank 0 in the job's store;
    on rank 0, the job's totals over the whole list from the shares of every rank that stopped
    (a rank with no word: its images not reached), and in ``outcome.job_stop_reason`` the failure
    that stopped the job, rather than the signal or lost peer it reached rank 0 as."""
    result, shard = outcome.result, config.shard
    own = _explain(outcome.error, config)[0] if outcome.error is not None else "stopped"
    share = {**mine, **{k: getattr(result, k) for k in _COUNTS}, "failures": result.failures, "stop_reason": own,
             "stopped_by": getattr(outcome.error, "kind", "interrupted")}  # fmt: skip
    _publish_stop(share, shard.rank)
    if shard.rank != 0:
        return [mine]
    followed = isinstance(outcome.error, RunInterrupted) or getattr(outcome.error, "kind", None) == "peer"  # then the cause may be a peer's
    shares = [share, *_stopped_peers(shard, PEER_WORD_S if followed else 0.0)]
    job = RunResult(len(config.images), partial=True, elapsed_s=max(e["elapsed_s"] for e in shares),
                    warmup_included=result.warmup_included, timeline=result.timeline, predictions=result.predictions,
                    failures=[f for e in shares for f in e["failures"]])  # fmt: skip
    for k in _COUNTS:
        setattr(job, k, sum(e[k] for e in shares))
    if result.loader_lead is not None:
        job.loader_lead = result.loader_lead * shard.world_size
    causes = [e for e in shares if e["stopped_by"] not in ("peer", "interrupted")]
    cause = (causes or [e for e in shares if e["stopped_by"] == "interrupted"] or [share])[0]
    outcome.job_stop_reason = own if cause is share else f"rank {cause['rank']}: {cause['stop_reason']}"
    outcome.result = job
    return [{k: e[k] for k in (*mine, "stop_reason")} for e in sorted(shares, key=lambda e: e["rank"])]


def _parity_decode(config: _RunConfig) -> Callable[[Sequence[tuple[str, int]]], _Batch]:
    """The run's own decode for :py:func:`measure_parity`, skipping bad images: the decode
    function of the SPDL loader, or the DataLoader's (PIL, in this process) for ``--loader torch``."""
    policy = BadImagePolicy(skip=True)
    if config.loader != "torch":
        return get_decode_func(config.device, config.transform, config.decoder, policy,
                               max_image_bytes=config.max_image_bytes)  # fmt: skip

    def decode_like_the_dataloader(items: Sequence[tuple[str, int]]) -> _Batch:
        images = ImageList(tuple(path for path, _ in items), tuple(label for _, label in items))
        batches = _PILDataset(images, config.transform, config.max_image_bytes, batch_size=len(items))
        return next(_torch_loader_batches(iter(batches), config.device, policy))

    return decode_like_the_dataloader


def _run(config: _RunConfig, decoder_check: _DecoderCheck | None) -> tuple[_RunReport, _Outcome]:
    """Build the model, run, then the breakdown; everything measured, in a report."""
    model = get_model(config.model, config.device, pretrained=config.weights == "pretrained",
                      checkpoint=config.checkpoint, compile=config.compile, dtype=config.dtype,
                      batch_size=min(config.batch_size, len(config.my_images)),
                      transform=config.transform_overrides)  # fmt: skip
    _LG.info("Model %s on %s in %s (%s), %s loader, decoder %s, %d images listed.", config.model, config.device,
             str(config.dtype).removeprefix("torch."), config.dtype_reason, config.loader, config.decoder,
             len(config.my_images))  # fmt: skip
    if config.compile and config.device.type == "cuda":
        _LG.info("torch.compile (mode %s) compiles during the warm-up%s.", config.compile,
                 ": minutes on a GPU the first time (then cached); --compile-mode default takes seconds"
                 if config.compile == "max-autotune" else "")  # fmt: skip
    parity = None
    if config.parity and config.shard.rank == 0:
        parity = _measure_parity(list(config.images.head(config.parity)), _parity_decode(config), model,
                                min(config.batch_size, config.parity))  # fmt: skip
    page_cache = _look_at_cache(config)  # last before the loop: the decoder check and parity read images too
    outcome = _run_loop(config, model)
    outcome.result.page_cache = page_cache
    report = _RunReport(outcome.result, config.to_dict(), _environment(config.device), [],
                       pipeline_stats=outcome.pipeline_stats, decoder_check=decoder_check, parity=parity,
                       world_size=config.shard.world_size)  # fmt: skip
    if config.breakdown and outcome.error is None and outcome.stopped_cleanly:
        try:
            report.breakdown = _measure_breakdown(config, model, outcome.result)
        except RunInterrupted as e:
            report.breakdown_cut, outcome.error = e.reason, e
        except (RunStopped, RuntimeError, MemoryError) as e:  # the run's result stands; say why this did not
            if not isinstance(e, RunStopped) and _is_out_of_memory(e):  # the model alone's batch: the run's advice
                e = _out_of_memory(config.device, min(config.batch_size, len(config.my_images)))
            reason = _explain(e, config)[0] if isinstance(e, RunStopped) else str(e).splitlines()[0] if str(e) else ""
            report.breakdown_cut = f"it failed: {type(e).__name__}: {reason}"
    report.ranks = _combine_ranks(outcome, config)
    report.result = outcome.result
    return report, outcome


def _explain(error: BaseException, config: _RunConfig | None) -> tuple[str, int]:
    """The one line the command line prints for an error, with advice about its flags, and the
    exit status: the only place where library errors meet flags and exit statuses."""
    if isinstance(error, RunInterrupted):
        return error.reason, EXIT_SIGINT if error.signum == signal.SIGINT else EXIT_SIGTERM
    if isinstance(error, InputError):
        line = str(error) if error.flag is None or str(error).startswith(error.flag) else f"{error.flag}: {error}"
        return f"{line}; {error.advice}" if error.advice else line, EXIT_USAGE
    assert isinstance(error, RunStopped), error
    if error.kind == "stalled" and config is not None:
        head = f"no batch for {config.timeout:g} s (--timeout)"
        where = f"{head} from the DataLoader's workers" if config.loader == "torch" else f"{head}: {error.where}"
        return where, EXIT_STALLED
    return f"{error} ({error.advice})" if error.advice else str(error), EXIT_FAILED


def _write_outputs(outputs: Sequence[tuple[Path | None, Callable[[Path], bool | None]]]) -> list[str]:
    """Write each ``(path, writer)`` that has a path, each on its own: one that fails (the disk,
    or a plot that cannot be drawn) costs no other; one line per file not written. A writer that
    returns False could not draw (no matplotlib): a note, not an error."""
    errors = []
    for path, write in outputs:
        if path is None:
            continue
        try:
            if write(path) is False:
                _say(f"note: {path} not drawn: {PLOT_HINT}")
        except OSError as e:
            errors.append(f"{path}: cannot write the results there ({e.strerror or e}); they are only above")
        except Exception as e:  # e.g. matplotlib on data it cannot draw: this file alone is lost, not the run's
            _LG.debug("writing %s failed", path, exc_info=True)
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            errors.append(f"{path}: not written ({reason}; --debug shows where)")
    return errors


def _sweep_command(config: _RunConfig, signals: _Signals) -> int:
    """The sweep instead of a run: the table, then the results file and the plot, with the
    settings measured so far if the sweep stopped (marked partial)."""
    decoder_check = None
    try:
        decoder_check = _check_run_decoder(config)  # a GPU decoder is checked as for a run
        model = get_model(config.model, config.device, pretrained=config.weights == "pretrained",
                          checkpoint=config.checkpoint, compile=config.compile, dtype=config.dtype,
                          transform=config.transform_overrides)  # fmt: skip
        sweep = _run_sweep(config, model, config.sweep or {})
    except (RunStopped, RunInterrupted) as e:  # before the first setting: an empty sweep, written all the same
        sweep = _Sweep([], 0, error=e)
    with signals.deferred_while():
        status = 0
        if sweep.error is not None:
            sweep.stop_reason, status = _explain(sweep.error, config)
            _say(f"error: {sweep.stop_reason}; the settings measured before it are below (PARTIAL SWEEP)")
        payload = {"sweep": sweep.to_dict(), "config": config.to_dict(), "env": _environment(config.device)}
        if decoder_check is not None:
            payload["decoder_check"] = asdict(decoder_check)
        _print_out(_print_sweep, sweep, config.command)
        not_written = _write_outputs([
            (config.results_file, lambda path: _write_atomically(path, _csv_text([
                {**asdict(p), "bound_fps": p.bound_fps, "recommended": p is sweep.recommended} for p in sweep.points
            ], [*(f.name for f in dataclass_fields(_SweepPoint)), "bound_fps", "recommended"])
                if str(path).lower().endswith(".csv") else json.dumps(payload, indent=2) + "\n")),
            (config.plot if sweep.points else None, lambda path: _plot_sweep(
                sweep, path, f"Sweep of {config.model} on {config.device}, {sweep.images} images per setting")),
        ])  # fmt: skip
        if config.plot is None:
            _say(f"note: --plot PATH draws the sweep ({PLOT_HINT if _pyplot() is None else 'matplotlib is here'})")
        for line in not_written:
            _say(f"error: {line}")
    if signals.deferred is not None:
        status = status or (EXIT_SIGINT if signals.deferred == signal.SIGINT else EXIT_SIGTERM)
    return status or (EXIT_FAILED if not_written else 0)


def _finish(report: _RunReport, outcome: _Outcome, config: _RunConfig) -> int:
    """Say why the run stopped (if it did), print the report (rank 0, or a rank that stopped
    alone), write the files; return the exit status."""
    shard, status = config.shard, 0
    alone = shard.world_size > 1 and outcome.error is not None
    label = f"rank {shard.rank}: " if alone else ""
    if outcome.error is not None:
        message, status = _explain(outcome.error, config)
        job = outcome.job_stop_reason
        report.result.stop_reason = job or message
        _say(f"error: {label}{message}{f'; the job stopped on {job}' if job and job != message else ''}")
    rows, timeline = _in_list_order(outcome.result.predictions, config.images), outcome.result.timeline
    profiler = outcome.profiler
    outputs = [
        (config.results_file, lambda path: _write_results(path, report)),
        (config.predictions_file, lambda path: _write_predictions(path, rows or [])),  # a stopped run's rows too
        (config.plot if timeline else None, lambda path: _plot_timeline(timeline or {}, path, _run_title(report))),
        (config.trace if profiler is not None else None, lambda path: _export_trace(profiler, path)),
    ]
    try:
        if shard.rank == 0 or alone:  # the summary first: no file, however it fails, can cost it
            _print_out(_print_report, report)
    finally:  # nor can the summary cost the files
        not_written = _write_outputs(outputs) if shard.rank == 0 else []
    if config.plot is not None and not timeline and shard.rank == 0:
        _say(f"note: {config.plot} not drawn: the run stopped before its first batch")
    for line in not_written:
        _say(f"error: {line}")
    return status or (EXIT_FAILED if not_written else 0)


def _run_title(report: _RunReport) -> str:
    """The run in a plot's title: the model and its settings, and the FPS."""
    c, r = report.config, report.result
    compiled = f"compiled ({c['compile']})" if c["compile"] else "not compiled"
    return (f"{c['model']} on {c['device']} ({c['dtype']}, {compiled}), batch {c['batch_size']}, {c['loader']} "
            f"{c['decoder']} x {c['num_threads']} threads\nFPS {r.fps:,.1f}, top-1 {r.top1:.1%} of "
            f"{r.classified}")  # fmt: skip


def _in_list_order(rows: list[dict] | None, images: ImageList) -> list[dict] | None:
    """Prediction rows in the list's order (batches arrive as their decodes finish, and ranks
    each hold their shard): two runs of one list give the same rows in the same order."""
    if rows is None:
        return None
    position: dict[str, int] = {}
    for i, path in enumerate(images.paths):
        position.setdefault(path, i)
    return sorted(rows, key=lambda row: position.get(row["path"], len(position)))


def _say(line: str) -> None:
    """One line on stderr; a closed stderr does not stop the run from ending well."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def _print_out(printer: Callable[..., None], *args: Any) -> None:
    """Print to stdout; if the reader is gone (``| head``), stop printing, not the run."""
    try:
        printer(*args)
        sys.stdout.flush()
    except (OSError, ValueError):  # the pipe's reader left, a full disk; ValueError: stdout was closed
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _Signals:
    """SIGINT and SIGTERM during a run become RunInterrupted, so that the partial result is still
    reported; while the report is written they wait until it is done. A second signal ends the
    process at once."""

    def __init__(self) -> None:
        self.deferred: int | None = None
        self._defer = False

    def _handler(self, signum: int, _frame: object) -> None:
        for s in self._previous:  # a second signal ends the process at once
            signal.signal(s, signal.SIG_DFL)
        if self._defer:
            self.deferred = signum
            return
        raise RunInterrupted(signum)

    def __enter__(self) -> _Signals:
        # SPDL's native library installs glog's crash handler, SIGTERM included, when it first
        # loads; load it now so that this handler, installed after, is the one that runs.
        spdl.io.utils.get_ffmpeg_versions()
        self._previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    @contextlib.contextmanager
    def deferred_while(self) -> Iterator[None]:
        """Hold signals back while the block runs (the report is being written)."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False


def _init_logging(debug: bool = False, spdl_stats: bool = False) -> None:
    """Log INFO and up (DEBUG with ``debug``). SPDL's own per-stage statistics lines, which it
    logs at INFO when each stage ends, only with ``spdl_stats`` or ``debug``: by default the
    end-of-run summary (:py:func:`print_pipeline_stats`) says it, over the FPS window."""
    fmt = "%(asctime)s [%(levelname)s] %(message)s"
    logging.basicConfig(format=fmt, level=logging.DEBUG if debug else logging.INFO, force=True)
    if not (debug or spdl_stats):
        logging.getLogger("spdl.pipeline").setLevel(logging.WARNING)
    # Logged only where torch finds no CUDA runtime, i.e. on a CPU run, when compiling: noise there.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def _shard_from_env() -> _Shard:
    try:
        shard = _Shard.from_env()
    except ValueError:
        raise InputError("RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (torchrun sets them)") from None
    if not (0 <= shard.rank < shard.world_size and shard.local_rank >= 0):
        raise InputError(f"RANK={shard.rank} WORLD_SIZE={shard.world_size} LOCAL_RANK={shard.local_rank}: no such rank")
    if shard.world_size > 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        raise InputError(f"WORLD_SIZE={shard.world_size} without MASTER_ADDR and MASTER_PORT: run under torchrun, "
                         "or unset WORLD_SIZE")  # fmt: skip
    return shard


def _run_job(config: _RunConfig, signals: _Signals) -> int:
    """The run, alone or as one rank of a torchrun job. Returns the exit status."""
    try:
        report, outcome = _run_or_stop(config)
        with signals.deferred_while():
            status = _finish(report, outcome, config)
    finally:
        if config.shard.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():  # left to interpreter shutdown, Gloo's threads free tensors without the GIL
                dist.destroy_process_group()
    if signals.deferred is not None:
        status = status or (EXIT_SIGINT if signals.deferred == signal.SIGINT else EXIT_SIGTERM)
    return status


def _run_or_stop(config: _RunConfig) -> tuple[_RunReport, _Outcome]:
    """The decoder check, joining the torchrun job, the run; what stops it before its loop (a
    signal while the model compiles, out of memory in the parity pass) is an outcome too, with
    nothing measured, reported and written like any stopped run."""
    decoder_check = None
    try:
        if config.shard.rank == 0 or config.shard.world_size == 1:
            decoder_check = _check_run_decoder(config)
        if config.shard.world_size > 1:
            # Compilation happens on the first batches, before the warm-up barrier: allow for it.
            _init_distributed(config.device, config.timeout + (1800 if config.compile else 0))
            _agree_on_job(config)
        return _run(config, decoder_check)
    except (RunStopped, RunInterrupted) as e:
        outcome = _Outcome(RunResult(len(config.my_images), partial=True), e)
        report = _RunReport(outcome.result, config.to_dict(), _environment(config.device), [],
                           decoder_check=decoder_check, world_size=config.shard.world_size)  # fmt: skip
        report.ranks = _combine_ranks(outcome, config)
        report.result = outcome.result
        return report, outcome


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's work: check the inputs, build the model and loader, run, report.
    Returns the exit status (argparse exits with 2 itself on a malformed command line)."""
    import datetime

    start_time = datetime.datetime.now().astimezone().isoformat(timespec="seconds")  # ISO 8601, local offset
    args = _parse_args(argv)
    _escape_unprintable()
    command = (*_program(), *(sys.argv[1:] if argv is None else argv))
    _init_logging(args.debug, spdl_stats=args.stats_interval is not None)
    warnings.filterwarnings("ignore", category=WarmupIncluded)  # the summary's first line says it
    config = None
    with _Signals() as signals:
        try:
            shard = _shard_from_env()
            if shard.rank != 0:
                logging.getLogger().setLevel(logging.WARNING)  # one rank speaks for the job
            config = replace(_preflight(args, shard, command), start_time=start_time)
            return _sweep_command(config, signals) if config.sweep else _run_job(config, signals)
        except (InputError, RunStopped, RunInterrupted) as e:  # before the loop started
            message, status = _explain(e, config)
            _say(f"error: {message}")
            return status


def _program() -> list[str]:
    """How this process was started, as a user would type it again: ``python -m
    imagenet_classification``, ``python PATH.py``, or the installed command (by name when that
    name on PATH is this one)."""
    import shutil

    main_module = sys.modules.get("__main__")
    if getattr(getattr(main_module, "__spec__", None), "name", None) == __name__ or not sys.argv or not sys.argv[0]:
        return ["python", "-m", __name__]
    argv0 = sys.argv[0]
    if argv0.endswith(".py"):
        return ["python", argv0]
    name = os.path.basename(argv0)
    found = shutil.which(name)
    return [name if found and os.path.realpath(found) == os.path.realpath(argv0) else argv0]


def entrypoint(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: :py:func:`main`, then the process ends at once with its status.

    Everything is reported by then. The interpreter's shutdown is skipped: it would wait for
    decode threads still busy (forever for one stuck in a read on a hung file system), abort
    when Gloo's threads free their last tensors, and print nanobind's warnings about SPDL
    buffers still alive.
    """
    _escape_unprintable()
    try:
        status = main(argv)
    except SystemExit as e:  # argparse: a malformed command line (2), or --help (0)
        status = e.code if isinstance(e.code, int) else EXIT_USAGE
    except Exception as e:  # a bug: its traceback for the report, then one line
        _LG.exception("unexpected error")
        _say(f"error: unexpected {type(e).__name__}: {e} (a bug; the traceback above says where)")
        status = EXIT_FAILED
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    _end_children()
    os._exit(status)


def _escape_unprintable() -> None:
    """Escape on screen what stdout and stderr cannot encode (a name that is not UTF-8, read with
    surrogateescape): a strict stream (a notebook's) would otherwise cut the summary there."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def _end_children() -> None:
    """End the DataLoader's worker processes left running (after an interrupt): orphaned, they
    would notice only seconds later, holding the terminal's or a pipe's output open meanwhile."""
    import multiprocessing

    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            child.kill()


if __name__ == "__main__":
    entrypoint()
