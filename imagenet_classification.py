"""Benchmark loading ImageNet-style JPEGs from local disk and classifying them.

An SPDL pipeline reads a list of images, decodes, resizes and centre-crops them in a pool of
threads (FFmpeg on the CPU, or nvJPEG / NVDEC on the GPU) and moves each batch to the device,
while the main thread runs a timm model on the batches. The run reports steady-state throughput
(images per second, after a warm-up) and top-1 / top-5 accuracy, and accounts for every listed
image: classified, failed, or not reached.

The images come from a file list (one path per line; the class from the WordNet ID
``nXXXXXXXX`` in the path, or from a label column), or from a folder (class folders as
torchvision's ``ImageFolder`` reads them, or a flat folder with ``--labels``)::

    cd /data/imagenet && find val -name '*.JPEG' > ~/imagenet.val.flist
    python imagenet_classification.py --input-flist ~/imagenet.val.flist --prefix /data/imagenet/
    python imagenet_classification.py --data-dir /data/imagenet/val

Without a GPU or the model hub::

    python imagenet_classification.py --data-dir val --device cpu -m efficientnet_lite0 --checkpoint lite0.pth

From a notebook, each stage can be used alone::

    from imagenet_classification import source, get_decode_func, get_pipeline, get_model, benchmark

Exit status: 0 success; 1 the run stopped on a failure (bad image in strict mode, too many
bad images, loader error, out of memory, results not written); 2 bad arguments or input found
before the run; 3 the loader stalled; 130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import gc
import importlib.util
import io
import itertools
import json
import logging
import math
import multiprocessing
import numbers
import os
import pickle
import platform
import re
import shlex
import shutil
import signal
import stat
import struct
import sys
import tempfile
import textwrap
import threading
import time
import warnings
import zipfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TextIO

# Run as the command (this file, python -m, or the installed imagenet-classification script, whose
# __main__ imports this), a signal while the libraries below load: one line, not a traceback.
_COMMAND = os.path.basename(getattr(sys.modules.get("__main__"), "__file__", None) or "") == "imagenet-classification"
if __name__ in ("__main__", "__mp_main__") or _COMMAND:

    def _interrupted_while_starting(signum: int, _frame: object) -> None:
        # None in a --decode-processes worker: spawned, it runs this as __mp_main__, or the script's own
        if __name__ == "__main__" or (_COMMAND and multiprocessing.parent_process() is None):
            os.write(2, f"error: interrupted by {signal.Signals(signum).name} while starting\n".encode())
        os._exit(128 + signum)

    for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_signum, _interrupted_while_starting)
    # A --decode-processes worker is spawned with SIGINT blocked (get_pipeline): a Ctrl-C held ends it here.
    if multiprocessing.current_process().name != "MainProcess":
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # What would stop the imports below with a traceback (or torch's "oneMKL FATAL ERROR"): one line.
    try:
        os.getcwd()
        _missing = [name for name in ("spdl", "torch", "torchvision", "timm") if not importlib.util.find_spec(name)]
        _problem = f"not installed for {sys.executable}: {', '.join(_missing)}" if _missing else ""
    except FileNotFoundError:
        _problem = "the current folder no longer exists (deleted?): cd to one that does"
    if _problem:
        os.write(2, f"error: {_problem}\n".encode())
        os._exit(2)

try:
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
        is_eof,
    )
    from spdl.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig  # noqa: E402
    from torch import Tensor  # noqa: E402
except ImportError as _error:  # a library that cannot load (a memory limit: ulimit -v; a broken install)
    if __name__ not in ("__main__", "__mp_main__") and not _COMMAND:
        raise
    _hint = " (a memory limit: ulimit -v?)" if "failed to map segment" in str(_error) else ""
    os.write(2, f"error: cannot load {_error.name or 'a library'}: {_error}{_hint}\n".encode())
    os._exit(2)

# Each ``spdl.io.X`` costs that module's ``__getattr__`` (6-24 us): the decode path, run for every
# image, uses names bound here once. ``_libspdl``, SPDL's native module, loads on its first use.

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
QUEUE_SIZE = 16  # decoded batches the SPDL loader holds ready for the model (--queue-size)
MAX_IMAGE_MB = 64  # the default cap on one image file's size (--max-image-mb)
MAX_IMAGE_PIXELS = 178_956_970  # larger images are refused before decoding, as PIL refuses them
EXIT_FAILED, EXIT_USAGE, EXIT_STALLED = 1, 2, 3


# --- Errors ---
# What a library call raises on purpose. The entry point alone turns them into exit statuses (_explain).


class InputError(Exception):
    """Input found unusable before the run: a file list, label file or folder (the message names
    the file and line), an argument, a model, checkpoint, device or decoder. ``flag`` is the flag
    that takes the input, if one does; ``advice`` what to do, in the command line's words."""

    def __init__(self, message: str, flag: str | None = None, advice: str = "") -> None:
        super().__init__(message)
        self.flag, self.advice = flag, advice


_FFMPEG_ADVICE = "drop the flag to decode with FFmpeg"
_WEIGHTS_ADVICE = "pass --checkpoint PATH for local weights, or --no-pretrained for random ones"


class ImageDecodeError(Exception):
    """An image that could not be read or decoded: its ``path`` as listed and the ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason

    def __reduce__(self) -> tuple:  # a batch's failures travel from a --decode-processes worker
        return type(self), (self.path, self.reason)


class RunStopped(Exception):
    """A run that ended before every listed image was classified or failed. ``kind`` says why:
    ``bad_image`` (the policy is strict), ``too_many_bad``, ``stalled`` (no batch within the
    time-out; ``where`` says what the decode stage was doing), ``incomplete`` (the loader ended
    early), ``loader`` (it failed), ``out_of_memory``, ``model`` (it failed on a batch) or
    ``peer`` (another rank of a torchrun job stopped; ``where``: ``a collective`` that failed).
    ``result`` is the partial :py:class:`RunResult`, set by :py:func:`benchmark`."""

    def __init__(self, message: str, kind: str, advice: str = "", where: str = "") -> None:
        super().__init__(message)
        self.kind, self.advice, self.where = kind, advice, where
        self.result: RunResult | None = None

    def __reduce__(self) -> tuple:  # pickled (a run in a process pool) and copied with its result
        return type(self), (str(self), self.kind), self.__dict__


# What reading from a worker process raises once the worker died (the OOM killer?): its pipe was
# refused or reset, or it ended. Both loaders' workers: the DataLoader's and --decode-processes'.
_WORKER_GONE = (ConnectionError, EOFError)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP (a closed terminal, a dropped ssh) during a run (a KeyboardInterrupt,
    so that no library swallows it), with the partial :py:class:`RunResult` once
    :py:func:`benchmark` has attached it."""

    def __init__(self, signum: int = signal.SIGINT, result: RunResult | None = None) -> None:
        self.signum, self.result = signum, result
        self.reason = f"interrupted by {signal.Signals(signum).name}"
        super().__init__(self.reason)

    def __reduce__(self) -> tuple:
        return type(self), (self.signum,), self.__dict__


# --- Arguments ---


def _number(kind: type, low: float, what: str, high: float = math.inf) -> Callable[[str], Any]:
    """An argparse type: a finite ``kind`` (int or float) from ``low`` to ``high``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not _within(value, low, high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def _within(value: object, low: float, high: float = math.inf) -> bool:
    """A finite real number (not a bool) from ``low`` to ``high``: the range check of the command
    line's numbers and of :py:class:`EvalTransform`'s fields, however the value arrived."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    # A whole number needs no isfinite: 10**400 is too large for a float, and no NaN.
    return real and (isinstance(value, numbers.Integral) or math.isfinite(value)) and low <= value <= high


def _whole(value: object, low: int, high: float = math.inf) -> bool:
    """A whole number (not a bool) from ``low`` to ``high``: the check of each count a caller gives."""
    return isinstance(value, numbers.Integral) and _within(value, low, high)


def _images(n: int, noun: str = "image") -> str:
    """``1 image``, ``2 images`` (``2 batches``, ``2 processes``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith(('ch', 's')) else 's'}"


def _percent(share: float, places: int = 1) -> str:
    """``share`` as a percentage, never rounded onto 0 % or 100 % that it is not: 28,434,095 of
    28,438,191 bytes is ">99.9%", 1.004 ">100%", not "100.0%" and "100%"."""
    text, least = f"{share:.{places}%}", 10.0**-places / 100  # the smallest step shown
    if text == f"{0:.{places}%}" and share > 0:
        return f"<{least:.{places}%}"
    if text == f"{1:.{places}%}" and share != 1:
        return f">{1 - least if share < 1 else 1:.{places}%}"
    return text


def _in_seconds(seconds: float) -> str:
    """Seconds with two decimals, and below 1 s three significant digits (0.145, 0.00531): enough
    that a rate shown beside them is their quotient."""
    if seconds >= 1 or seconds <= 0:
        return f"{seconds:.2f}"
    return f"{seconds:.{min(9, 2 - math.floor(math.log10(seconds)))}f}"


def _first_line(error: BaseException) -> str:
    """An error's message to its first line break (huggingface_hub's, Gloo's and torch's run to many)."""
    return (str(error).splitlines() or [""])[0]


def _check_type(name: str, value: object, kind: Any, expected: str) -> None:
    """TypeError naming the argument: a notebook's dict or string refused where it is given, not
    met later as an AttributeError mid-run."""
    if not isinstance(value, kind):
        given = repr(value)
        if len(given) > 200:  # a model's repr: 127 lines
            given = f"<{type(value).__name__}>"
        raise TypeError(f"{name}={given}: expected {expected}")


# Counts are held by C ints on their way (itertools.islice, SPDL's and torch's sizes): 2**31 - 1 at most.
_COUNT_MAX = 2**31 - 1
_count = _number(int, 1, f"a whole number from 1 to {_COUNT_MAX}", _COUNT_MAX)
_count0 = _number(int, 0, f"a whole number from 0 to {_COUNT_MAX}", _COUNT_MAX)
_seconds = _number(float, 1e-3, "a number of seconds, at least 0.001")
_timeout = _number(float, 1e-3, "at most 1e6 seconds, at least 0.001", 1e6)  # longer overflow the DataLoader's clock
_image_mb = _number(int, 1, "a whole number of MiB from 1 to 4096", 4096)  # a file is read whole, up to this
_IMG_SIZE_MAX = 4096  # pixels: a larger crop is a typo, not a model's input
_MEAN_RANGE, _STD_RANGE = (0.0, 1.0), (1e-3, 1.0)  # on the 0-1 scale: 123.7 (the 0-255 one) classifies noise
_img_size = _number(int, 1, f"at most {_IMG_SIZE_MAX} pixels, at least 1", _IMG_SIZE_MAX)


def _path(text: str) -> Path:
    """A file or folder to read, as typed: Path("") is ".", the current folder (``--data-dir "$UNSET"``)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path (a variable not set?)")
    return Path(text)


def _file_name(text: str) -> Path:
    """A file to write, as typed: Path drops a trailing / (``r.json/``), which names a folder, and makes
    an empty name "." (a variable not set)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty file name (a variable not set?)")
    if text.endswith("/"):
        raise argparse.ArgumentTypeError(f"{text}: not a file name (a trailing / names a folder)")
    return Path(text)


def _max_bad(text: str) -> tuple[float, bool]:
    is_percent = text.endswith("%")
    what = "N or P% (0-100)"
    parse = _number(float, 0, what, 100) if is_percent else _number(int, 0, what)
    try:
        return parse(text[:-1] if is_percent else text), is_percent
    except argparse.ArgumentTypeError:  # its message quotes the number without the %
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every default in ``--help``, except the off state of switches and an absent value."""

    def _get_help_string(self, action: argparse.Action) -> str:  # the hook argparse's own formatter overrides
        if action.default in (None, "") or isinstance(action.default, bool) or "default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action) or ""


class _Parser(argparse.ArgumentParser):
    """The command line's flags, by group."""

    def __init__(self) -> None:
        program = _program()
        super().__init__(
            prog=" ".join(program) if program[:2] == ["python", "-m"] else None,  # not the module file's name
            description=(__doc__ or "").split("\n\n")[0],  # python -OO drops it
            epilog="README.md describes every flag, the output, the results file and the exit statuses.",
            usage="%(prog)s (--input-flist LIST | --data-dir DIR | DATA_DIR) [OPTIONS]",  # one line above an error
            formatter_class=_HelpFormatter,
            allow_abbrev=False,  # a prefix such as --swee would slip past the sweep's command filter
        )
        for add_flags in (_data_flags, _loader_flags, _model_flags, _run_flags):
            add_flags(self)

    def _print_message(self, message: str, file: TextIO | None = None) -> None:
        """argparse's own drops an OSError: ``--help`` or ``--version`` into a full disk read as a success."""
        try:
            if message and (file := file or sys.stderr) is not None:
                file.write(message)
                file.flush()
        except BrokenPipeError:  # ``| head``: the reader chose to stop
            pass
        except OSError as e:
            _say(f"error: the text could not be written ({e.strerror or e})")
            raise SystemExit(EXIT_USAGE if file is sys.stderr else EXIT_FAILED) from None  # stderr: a usage error


def _data_flags(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    where = data.add_mutually_exclusive_group()  # one of them required: _parse_args, after --sweep's DATA_DIR
    where.add_argument("data", nargs="?", type=_path, metavar="DATA_DIR", help="--data-dir, as timm's scripts take it")
    where.add_argument("--input-flist", type=_path, help="one image path a line, optionally a label; - reads stdin")
    where.add_argument("--data-dir", type=_path, help="class folders (nXXXXXXXX/...), or a flat folder with --labels")
    data.add_argument("--prefix", default="", help="prepended to every path in the file list")
    data.add_argument("--labels", type=_path, help="labels by file name: LOC_val_solution.csv, or 'name label' lines")
    data.add_argument("--max-samples", "--num-samples", type=_count, help="use only the first N images (default: all)")
    big = "an image file over N MiB is a bad image"
    data.add_argument("--max-image-mb", type=_image_mb, default=MAX_IMAGE_MB, metavar="N", help=big)


def _loader_flags(parser: argparse.ArgumentParser) -> None:
    loader = parser.add_argument_group("loader")
    loader.add_argument("-b", "--batch-size", type=_count, default=32, help="images per batch")
    loader.add_argument("-j", "--num-threads", "--workers", type=_count, default=16, help="decode threads (or workers)")
    queue = f"decoded batches held ready for the model, SPDL's loader only (default: {QUEUE_SIZE})"
    loader.add_argument("--queue-size", type=_count, help=queue)
    processes = "decode in N processes of --num-threads threads each (FFmpeg; 0: in this one)"
    loader.add_argument("--decode-processes", type=_count0, default=0, metavar="N", help=processes)
    loader.add_argument("--loader", choices=("spdl", "torch"), default="spdl", help="torch: a DataLoader with PIL")
    decoder = loader.add_mutually_exclusive_group()
    decoder.add_argument("--use-nvjpeg", action="store_true", help="decode on the GPU with nvJPEG")
    decoder.add_argument("--use-nvdec", action="store_true", help="decode on the GPU with NVDEC")
    check = f"compare a GPU decoder with FFmpeg on N images, 0: off (default: {CHECK_DECODER_IMAGES})"
    loader.add_argument("--check-decoder", type=_count0, metavar="N", help=check)


def _model_flags(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("-m", "--model", default=DEFAULT_MODEL, help="any timm model name")
    model.add_argument("--checkpoint", type=_path, help="local checkpoint to load (no model hub access)")
    weights = model.add_mutually_exclusive_group()
    weights.add_argument("--pretrained", action="store_true", default=True, help="timm's pretrained weights (default)")
    weights.add_argument("--no-pretrained", action="store_false", dest="pretrained", help="random weights")
    model.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    compile = model.add_mutually_exclusive_group()
    compile.add_argument("--compile", action="store_const", const=True, help="torch.compile (default: on a GPU)")
    compile.add_argument(
        "--torchcompile",
        nargs="?",
        const="inductor",
        choices=("inductor",),
        metavar="inductor",
        help="timm's name for --compile",
    )
    compile.add_argument("--no-compile", action="store_const", const=False, dest="compile", help="skip torch.compile")
    mode = f"torch.compile's mode, and compile (default: {COMPILE_MODE}; max-autotune: minutes)"
    model.add_argument("--compile-mode", choices=COMPILE_MODES, help=mode)
    dtypes = ("auto", "bfloat16", "float16", "float32")
    precision = "the model's precision; auto: bfloat16 where the hardware has it"
    model.add_argument("--dtype", "--amp-dtype", choices=dtypes, default="auto", help=precision)
    model.add_argument("--amp", action="store_true", help="timm's flag: reduced precision (--dtype auto unless given)")
    model.add_argument("--no-bf16", action="store_true", help="--dtype float32")
    transform = parser.add_argument_group("evaluation transform (default: the model's pretrained config)")
    transform.add_argument("--img-size", type=_img_size, metavar="N", help="side of the square crop fed to the model")
    crop_pct = _number(float, 1e-6, f"a number above 0, at most {_CROP_PCT_MAX:g}", _CROP_PCT_MAX)  # above 1: padded
    transform.add_argument("--crop-pct", type=crop_pct, metavar="F", help="resize the shorter side to img-size / F")
    transform.add_argument("--interpolation", choices=sorted(_FFMPEG_SCALE_FLAGS), help="the resize's filter")
    # On the 0-1 scale: 123.7 or 58.4 (the 0-255 one) would classify noise; a std near 0 overflows.
    scale = "on the 0-1 scale (values on the 0-255 one / 255)"
    ranges = {"mean": _MEAN_RANGE, "std": _STD_RANGE}
    for name, (low, high) in ranges.items():
        number = _number(float, low, f"a number from {low:g} to {high:g} {scale}", high)
        transform.add_argument(
            f"--{name}", type=number, nargs=3, metavar=("R", "G", "B"), help=f"per-channel {name} on the 0-1 scale"
        )


def _run_flags(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--warmup-batches", type=_count0, default=20, help="batches left out of the FPS window")
    run.add_argument("--skip-bad", action="store_true", help="skip and count undecodable images instead of stopping")
    run.add_argument("--max-bad", type=_max_bad, help="with --skip-bad: stop once more than N or P%% failed")
    run.add_argument("--timeout", type=_timeout, default=120.0, help="seconds without a batch before giving up")
    run.add_argument("--breakdown", action="store_true", help="also time reading, the loader and the model alone")
    run.add_argument("--cold-cache", action="store_true", help="evict the files from the page cache before each read")
    run.add_argument("--parity", type=_count0, default=0, metavar="N", help="compare with timm's transform on N images")
    run.add_argument("--stats-interval", type=_seconds, help="also log SPDL's own stage statistics every S seconds")
    run.add_argument("--results-file", type=_file_name, help="write the result here: JSON, or a CSV row for .csv")
    run.add_argument("--predictions-file", type=_file_name, help="write one row per image here (.csv or .jsonl)")
    run.add_argument("--trace", type=_file_name, help=f"write PATH.json and PATH.pftrace ({TRACE_BATCHES} batches)")
    run.add_argument("--plot", type=_file_name, help="draw the run's timeline (or the sweep) into this PNG")
    sweep = "time the loader at each setting: auto, or e.g. num-threads=1,2,4 batch-size=64,128"
    run.add_argument("--sweep", nargs="+", action="extend", metavar="SPEC", help=sweep)  # a second adds its specs
    run.add_argument("--debug", action="store_true", help="debug logging")
    run.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def _reads_stdin(path: Path | None) -> bool:
    """Whether a list's path is stdin's stream: ``-``, or /dev/stdin and its like when stdin is no file."""
    if path is None or str(path) == "-":
        return path is not None
    with contextlib.suppress(OSError, ValueError):
        piped = os.fstat(0)
        return not stat.S_ISREG(piped.st_mode) and os.path.samestat(os.stat(path), piped)
    return False


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser()
    words = sys.argv[1:] if argv is None else list(argv)
    if stray := _stray_sweep_setting(parser, words):  # else "DATA_DIR: not allowed"
        parser.error(stray)
    if unknown := _unknown_flag(parser, words):  # else its value is DATA_DIR: "not allowed with --data-dir"
        parser.error(unknown)
    args = parser.parse_args(argv)
    no_data = args.data is None and args.input_flist is None and args.data_dir is None
    if no_data and args.sweep and not _is_sweep_setting(args.sweep[-1]):  # nargs took DATA_DIR: `--sweep auto val`
        args.data = Path(args.sweep.pop())
        if not args.sweep:
            parser.error("--sweep needs a setting before DATA_DIR: auto, or e.g. num-threads=1,2,4")
    elif no_data:
        parser.error("one of the arguments DATA_DIR --input-flist --data-dir is required")
    args.data_dir = args.data if args.data is not None else args.data_dir
    torch_loader = args.loader == "torch"
    sweep_takes_no = ""  # the first flag given that --sweep cannot take
    if args.sweep:
        given = {"--breakdown": args.breakdown, "--trace": args.trace, "--parity": args.parity}
        given.update({"--predictions-file": args.predictions_file, "--max-bad": args.max_bad})
        sweep_takes_no = next((flag for flag, value in given.items() if value), "")
    refusals = [  # (refused, why): the first that holds ends the parse
        (args.compile is False and args.compile_mode, "--compile-mode compiles the model; --no-compile says not to"),
        (args.compile is False and args.torchcompile, "--torchcompile compiles the model; --no-compile says not to"),
        (args.max_bad is not None and not args.skip_bad, "--max-bad only applies with --skip-bad"),
        (torch_loader and args.use_nvjpeg, "--loader torch decodes with PIL on the CPU; it takes no --use-nvjpeg"),
        (torch_loader and args.use_nvdec, "--loader torch decodes with PIL on the CPU; it takes no --use-nvdec"),
        (torch_loader and args.check_decoder, "--check-decoder checks a GPU decoder; not --loader torch"),
        (torch_loader and args.queue_size, "--queue-size sizes SPDL's queue; --loader torch's workers prefetch 2 each"),
        (args.amp and args.no_bf16, "--amp asks for reduced precision; --no-bf16 for float32"),
        (args.amp and args.dtype == "float32", "--amp asks for reduced precision; --dtype float32 says not to"),
        (args.no_bf16 and args.dtype not in ("auto", "float32"), f"--no-bf16 is --dtype float32; not {args.dtype}"),
        (torch_loader and args.stats_interval is not None, "--stats-interval logs SPDL's stages; --loader torch: none"),
        (args.data_dir is not None and args.prefix, "--prefix applies to --input-flist, not to --data-dir"),
        (
            _reads_stdin(args.input_flist) and _reads_stdin(args.labels),
            f"--input-flist {args.input_flist} and --labels {args.labels} cannot both read stdin",
        ),
        (args.trace is not None and args.breakdown, "--trace profiles the run, which --breakdown times unprofiled"),
        (sweep_takes_no, f"--sweep times many settings, skipping bad images; it takes no {sweep_takes_no}"),
        (args.sweep and args.cold_cache, "--sweep reads the same files, warm after one pass; it takes no --cold-cache"),
    ]
    for refused, why in refusals:
        if refused:
            parser.error(why)
    if args.torchcompile or args.compile is None and args.compile_mode:
        args.compile = True  # asked for by timm's name, or by naming a mode
    if args.no_bf16:  # a flag of its own, as --amp: with --dtype's dest, the last of them would have won
        args.dtype = "float32"
    if args.queue_size is None:
        args.queue_size = 0 if torch_loader else QUEUE_SIZE  # 0: no queue, in the results and the sweep's table
    return args


# --- Source: the list of images, read once -> (path, class index) ---

# What torchvision's ImageFolder takes as images, matched case-insensitively.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_MAX_LINE_BYTES = 8192  # a longer line is no path: the file is not a file list (e.g. /dev/zero)
_WNID = re.compile(r"n\d{8}")
CLASS_TSV = Path(__file__).with_name("imagenet_class.tsv")  # scripts/make_class_tsv.py writes it; the wheel has it


@functools.cache
def _class_table() -> tuple[tuple[str, str], ...]:
    """ImageNet-1k's ``(WordNet ID, name)`` pairs in class-index order."""
    try:  # a FIFO or a device in its place: no wait for a writer, no endless read
        with open(os.open(CLASS_TSV, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            text = f.read(1 << 20).decode("utf-8")  # 1 MiB: the table is 31 KB
        rows = [line.split("\t") for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{CLASS_TSV}: cannot read the class table ({e})") from None
    if [row[0] for row in rows] != [str(i) for i in range(NUM_CLASSES)] or any(len(row) != 3 for row in rows):
        raise InputError(f"{CLASS_TSV}: not the {NUM_CLASSES} classes as 'index<TAB>wnid<TAB>name' lines")
    wnids = [wnid for _, wnid, _ in rows]
    if not all(re.fullmatch(r"n\d{8}", wnid) for wnid in wnids) or any(a >= b for a, b in itertools.pairwise(wnids)):
        # A class's index is its WordNet ID's place in sorted order: two swapped rows mislabel both classes.
        raise InputError(f"{CLASS_TSV}: its WordNet IDs are not {NUM_CLASSES} distinct IDs (n and 8 digits) in order")
    return tuple((wnid, name.strip()) for _, wnid, name in rows)


@functools.cache
def _class_index() -> dict[str, int]:
    """WordNet ID -> class index, never handed out (get_mappings copies it)."""
    return {wnid: index for index, (wnid, _) in enumerate(_class_table())}


def _class_name(index: int) -> str:
    """A class's first WordNet lemma, e.g. 636 -> 'mailbag'."""
    return _class_table()[index][1].split(",")[0]


def get_mappings() -> dict[str, int]:
    """Map each ILSVRC2012 WordNet ID to its class index: its place in sorted order, as public
    ImageNet models have it (``get_mappings()["n03709823"] == 636``)."""
    return dict(_class_index())


def parse_wnid(s: str) -> str:
    """The class's WordNet ID (``n`` and 8 digits) in a POSIX path (a backslash is part of a name, as on
    Linux): the last folder named by one (``train/n01440764/n01440764_10026.JPEG``), else the first one
    standing alone in any name of it (``ILSVRC2012_val_00000001_n01751748.JPEG``, ``n01440764_tench/1.JPEG``).
    ValueError if there is none."""
    s = os.fspath(s) if isinstance(s, os.PathLike) else s
    if not isinstance(s, str):
        raise TypeError(f"expected a path, got {s!r}")
    if folders := [part for part in s.split("/")[:-1] if _WNID.fullmatch(part)]:
        return folders[-1]
    if match := re.search(r"(?<![A-Za-z0-9])n\d{8}(?![A-Za-z0-9])", s):
        return match.group(0)
    raise ValueError(f"no WordNet ID (nXXXXXXXX) in {s!r}")


@dataclass(frozen=True)
class ImageList:
    """The images of a run, read once: ``paths`` (prefix included) and their class indices
    ``labels`` (0-999), in order; ``origin`` names what they were read from. Every stage works from
    this one snapshot, so a list that changes on disk during the run changes nothing."""

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    origin: str = "<list>"

    def __post_init__(self) -> None:
        """ValueError unless each path has one label, a class index: another would be a miss, or fail mid-run.
        TypeError for paths that are no sequence of paths (a string: each letter a path)."""
        if isinstance(self.paths, str | bytes):
            raise TypeError(f"paths={self.paths!r}: expected a sequence of paths")
        for name in ("paths", "labels"):  # tuples, whatever sequence was given (a list, a numpy array, a Series)
            try:
                object.__setattr__(self, name, tuple(getattr(self, name)))
            except TypeError:
                raise TypeError(f"{name}={getattr(self, name)!r}: expected a sequence") from None
        if odd := [t.__name__ for t in set(map(type, self.paths)) if not issubclass(t, str | bytes | os.PathLike)]:
            raise TypeError(f"{self.origin}: paths of type {', '.join(sorted(odd))}: expected paths (str)")
        object.__setattr__(self, "paths", tuple(map(os.fsdecode, self.paths)))  # a Path: str, as JSON takes it
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{self.origin}: {len(self.paths)} paths, {len(self.labels)} labels: expected one a path")
        try:  # each distinct label once (by type too: 5.0 == 5, True == 1): a million images have a thousand
            distinct = {(type(label), label) for label in self.labels}
            if all(_whole(label, 0, NUM_CLASSES - 1) for _, label in distinct):
                return
        except TypeError:  # unhashable: each checked below
            pass
        for path, label in zip(self.paths, self.labels, strict=True):  # the first bad one, named
            if not _whole(label, 0, NUM_CLASSES - 1):
                raise ValueError(f"{self.origin}: {path}: label {label!r} is no class index (0-{NUM_CLASSES - 1})")

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return zip(self.paths, self.labels, strict=True)

    def head(self, count: int) -> ImageList:
        if isinstance(count, bool) or not hasattr(count, "__index__") or count.__index__() < 0:  # -1: all but the last
            raise ValueError(f"count={count!r}: expected a whole number of images, 0 or more")
        return replace(self, paths=self.paths[:count], labels=self.labels[:count])

    def shard(self, rank: int, world_size: int) -> ImageList:
        """Images ``rank, rank + world_size, …``: each to one rank, shards within one of each other.
        ValueError: no such rank (a slice would take rank -1 as the last image, rank 5 of 2 as rank 1)."""
        if not (_whole(world_size, 1) and _whole(rank, 0) and rank < world_size):
            raise ValueError(f"rank={rank!r} of world_size={world_size!r}: expected a rank from 0 to world_size - 1")
        return replace(self, paths=self.paths[rank::world_size], labels=self.labels[rank::world_size])


class _Labels(dict):
    """Class index by image name (its file name without the extension), and the file read."""

    def __init__(self, origin: str, by_name: dict[str, int]) -> None:
        super().__init__(by_name)
        self.origin = origin


_LABELS_EXPECTED = "labels by image name (read_labels, or a dict of class indices), or None"


def _image_name(path: str) -> str:
    """A file's name without an image extension: ``cat.v1.JPEG`` and ``cat.v1`` are ``cat.v1``."""
    name = os.path.basename(path)
    stem, extension = os.path.splitext(name)
    return stem if extension.lower() in IMAGE_EXTENSIONS else name


def _rows(path: Path | str, flag: str) -> Iterator[tuple[str, str]]:
    """``("file:line", stripped text)`` of each non-blank line of a text file (``-``: standard
    input), the one ``flag`` gives. InputError if it is missing, a folder, unreadable, not UTF-8
    or binary (``/dev/zero``), or standard input is closed."""
    if not isinstance(path, (str, os.PathLike)):  # open() takes an int for a descriptor, and closes it
        raise TypeError(f"expected a path, or '-' for standard input, got {path!r}")
    name = "<stdin>" if str(path) == "-" else str(path)
    if name == "<stdin>" and sys.stdin is None:  # started with it closed (<&-): Python's sys.stdin is None
        raise InputError(f"{name}: not open ({flag} -)")
    f = None  # a closed stdin is no trouble for a file
    if name == "<stdin>":  # a notebook's own (io.StringIO) has text alone
        f = getattr(sys.stdin, "buffer", None) or io.BytesIO(os.fsencode(sys.stdin.read()))
    try:
        if f is None:
            f = _open_fifo(path) if stat.S_ISFIFO(os.stat(path).st_mode) else open(path, "rb")  # noqa: SIM115
        if f.isatty():  # it would wait for typing: -, /dev/stdin, /dev/tty
            raise InputError(f"{name}: is a terminal; pipe the list in ({flag} - < FILE, or find ... | ...)")
        _note_a_silent_pipe(f, name)
        for lineno in itertools.count(1):
            raw = f.readline(_MAX_LINE_BYTES)
            if not raw:
                return
            if b"\r" in raw.strip() and b"\0" not in raw:  # read by LF, a list of CR-ended lines is one line
                cr_only = "the lines end in CR alone (classic Mac); end them in LF: tr '\\r' '\\n'"
                raise InputError(f"{name}:{lineno}: {cr_only}")
            if len(raw) == _MAX_LINE_BYTES and not raw.endswith(b"\n") or b"\0" in raw:
                binary = f"binary data or a line over {_MAX_LINE_BYTES} bytes: not a text list"
                raise InputError(f"{name}:{lineno}: {binary}")
            # utf-8-sig drops a byte-order mark (Windows editors write one) at the start of any
            # line: lists joined with cat have one on a later line, invisible in a path
            try:
                text = raw.decode("utf-8-sig").strip()
            except UnicodeDecodeError:
                raise InputError(f"{name}:{lineno}: not UTF-8 text") from None
            if text and not _UTF8_NAMES:  # each path as open() and os.listdir take the bytes it has
                text = os.fsdecode(text.encode("utf-8"))
            if text:
                yield f"{name}:{lineno}", text
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        images = " (a folder of images: --data-dir, or scan_folder)" if flag == "--input-flist" else ""
        raise InputError(f"{name}: is a folder, not a file{images}") from None
    except OSError as e:
        raise InputError(f"{name}: cannot read it ({e.strerror or e})") from None
    finally:
        if f is not None and name != "<stdin>":
            f.close()


_FIFO_WAIT_S = 30.0  # how long a FIFO may wait for the program that writes to it to open it
_SILENT_PIPE_S = 10.0  # how long a pipe may give nothing before a note says the run waits on it


def _note_a_silent_pipe(f: BinaryIO, name: str) -> None:
    """A note if ``f`` (a pipe, or a file: ready at once) gives nothing for ``_SILENT_PIPE_S``: a slow
    ``find``, or a writer that never ends, is waited for, but not in silence."""
    import select

    with contextlib.suppress(OSError, ValueError):  # no select for it (a notebook's stdin): no note
        if not select.select([f], [], [], _SILENT_PIPE_S)[0]:
            _say(
                f"note: waiting for {name}: nothing read in {_SILENT_PIPE_S:g} s (the program writing it; Ctrl-C stops)"
            )


# Whether the file system's encoding is UTF-8 (as almost everywhere): a list's UTF-8 names are then the
# names open() takes; in another locale (ISO-8859-1) they are turned into its, and back in the outputs.
_UTF8_NAMES = sys.getfilesystemencoding() == "utf-8"


def _utf8_paths(rows: list[dict]) -> list[dict]:
    """Rows whose ``path`` is as the file system's encoding reads its bytes, with the ``path`` as UTF-8
    text holds those bytes (undecodable ones escaped): the names as on disk, whatever the locale."""
    if _UTF8_NAMES:
        return rows
    return [{**row, "path": os.fsencode(row["path"]).decode("utf-8", "surrogateescape")} for row in rows]


def _open_fifo(path: Path | str) -> BinaryIO:
    """A FIFO opened for reading, once a program opens it to write; InputError if none does within
    ``_FIFO_WAIT_S`` (an open waits for one forever)."""
    opened: list[BinaryIO] = []
    waiting = threading.Thread(target=lambda: opened.append(open(path, "rb")), daemon=True)  # noqa: SIM115
    waiting.start()
    waiting.join(_FIFO_WAIT_S)
    if opened:
        return opened[0]
    with contextlib.suppress(OSError):  # a writer for a moment: the waiting open returns
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    waiting.join(1.0)
    for f in opened:
        f.close()
    raise InputError(f"{path}: a FIFO that no program opened to write to within {_FIFO_WAIT_S:g} s")


def _parse_label(text: str, where: str) -> int | None:
    """A label field: a WordNet ID or a class index (0-999); None if ``text`` is neither."""
    if _WNID.fullmatch(text):
        if (index := _class_index().get(text)) is None:
            raise InputError(f"{where}: {text} is not one of the {NUM_CLASSES} ImageNet classes")
        return index
    if match := re.fullmatch(r"([+-]?)0*(\d+)", text):
        sign, digits = match.groups()
        # Too many digits (leading zeros aside) is out of range; int() would refuse over 4,300.
        if len(digits) > len(str(NUM_CLASSES)) or not 0 <= (index := int(sign + digits)) < NUM_CLASSES:
            shown = text if len(text) <= 20 else f"{text[:10]}… ({len(text) - len(sign)} digits)"
            raise InputError(f"{where}: class index {shown} is out of range (0-{NUM_CLASSES - 1})")
        return index
    return None


def _label_from_path(path: str, where: str, labels: _Labels | None) -> int:
    """The class of an image listed without a label: by its name in ``labels``, else by the
    WordNet ID in its path."""
    if labels is not None:
        if (label := labels.get(_image_name(path))) is None:
            origin = getattr(labels, "origin", "the labels given")  # read_labels's, or a plain dict
            raise InputError(f"{where}: {origin} has no label for {_image_name(path)!r}")
        return label
    try:
        wnid = parse_wnid(path)
    except ValueError:
        raise InputError(f"{where}: no WordNet ID (nXXXXXXXX) in {path!r}, and no label column") from None
    return _parse_label(wnid, where)  # a WordNet ID is a label or an error


def _image_list(pairs: Iterator[tuple[str, int]], max_samples: int | None, origin: str, empty: str) -> ImageList:
    """The first ``max_samples`` pairs, read no further; InputError ``"{origin}: {empty}"`` if none.
    ValueError for a ``max_samples`` that is no whole number from 1 (None or inf, the design's default: all)."""
    if max_samples == math.inf:
        max_samples = None
    if max_samples is not None and not (_within(max_samples, 1) and float(max_samples).is_integer()):
        raise ValueError(f"max_samples={max_samples!r}: expected a whole number of images, 1 or more (None: all)")
    taken = list(itertools.islice(pairs, None if max_samples is None else min(int(max_samples), sys.maxsize)))
    if not taken:
        raise InputError(f"{origin}: {empty}")
    return ImageList(tuple(path for path, _ in taken), tuple(label for _, label in taken), origin)


def read_labels(path: Path | str) -> _Labels:
    """Read labels for a flat folder of images, by image name (matched without an image extension):
    Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString``, whose first WordNet ID is
    the class) or ``name label`` lines, the label a WordNet ID or a class index. InputError names
    a bad line with its number, and both lines that give one name two classes."""
    first: dict[str, tuple[int, str]] = {}  # each name's class, and the line that gave it first
    for where, text in _rows(path, "--labels"):
        if "," in text:  # Kaggle: ImageId,PredictionString ("n01751748 0 0 100 100 …")
            name, _, rest = text.partition(",")
            if not first and name.strip().lower() == "imageid":
                continue  # the header
            fields = rest.split()
        else:
            name, *fields = text.rsplit(None, 1)
        label = _parse_label(fields[0], where) if fields else None
        if label is None:
            raise InputError(f"{where}: expected 'name label' or 'ImageId,WNID …', got {text!r}")
        # The last label must not silently win: a.JPEG and a.png are one name (the extension is dropped).
        _one_class(first, _image_name(name.strip()), label, where, " (names are matched without an image extension)")
    if not first:
        raise InputError(f"{'<stdin>' if str(path) == '-' else path}: no labels in it")
    return _Labels(str(path), {name: label for name, (label, _) in first.items()})


def _one_class(first: dict[str, tuple[int, str]], name: str, label: int, where: str, note: str = "") -> None:
    """Record ``name``'s ``label`` from line ``where`` in ``first`` (name -> (class, line)); InputError
    naming both lines if an earlier one gave it another class."""
    known, line = first.setdefault(name, (label, where))
    if known != label:
        raise InputError(f"{where}: gives {name!r} class {label}, but {line} gives it class {known}{note}")


def read_file_list(
    path: Path | str, prefix: str = "", max_samples: int | None = None, *, labels: _Labels | None = None
) -> ImageList:
    """Read a file list (``-``: standard input) once, checking every line up to ``max_samples``
    images. Each non-blank line is an image path, ``prefix`` prepended, and every line of a list
    in the same one of three forms: ``path`` (the class the last WordNet ID folder in it);
    ``path label`` (a WordNet ID or a class index 0-999 in sorted-WordNet-ID order, as Caffe's
    ``val.txt`` has; the path, all before the last field, may hold spaces); or ``path`` with
    ``labels`` (:py:func:`read_labels`) by file name. InputError names a bad line's number."""
    _check_type("prefix", prefix, str, "a str put before each path, e.g. '/data/imagenet/'")
    _check_type("labels", labels, dict | None, _LABELS_EXPECTED)
    name = "<stdin>" if str(path) == "-" else str(path)
    return _image_list(_list_rows(path, prefix, labels), max_samples, name, "the file list has no image paths")


def _list_rows(path: Path | str, prefix: str, labels: _Labels | None) -> Iterator[tuple[str, int]]:
    """Each line's ``(prefix + path, label)``; InputError for a bad line, and for a path whose label
    column gives it two classes (naming both lines)."""
    with_column: bool | None = None  # as the first line has it
    first: dict[str, tuple[int, str]] = {}  # a labelled path's class, and the line that gave it first
    for where, text in _rows(path, "--input-flist"):
        parts = text.rsplit(None, 1)
        label = _parse_label(parts[1], where) if len(parts) == 2 else None
        if with_column is None:
            with_column = label is not None
        if (label is not None) != with_column:
            has = "has no label column" if label is None else "has a label column"
            raise InputError(f"{where}: {has}, unlike the list's first line (a list mixes nothing)")
        if label is None:
            label = _label_from_path(text, where, labels)
        elif labels is not None:
            raise InputError(f"{where}: has a label column; labels by file name are for lists without one")
        else:  # a path listed again (passes for a steady FPS window) must keep its class: else one is a miss
            _one_class(first, os.path.normpath(parts[0]), label, where)  # ./a.JPEG is a.JPEG
        yield prefix + (parts[0] if with_column else text), label


def _image_files(folder: str) -> Iterator[str]:
    """Image files under ``folder``, hidden ones left out, in ImageFolder's ``sorted(os.walk())``
    order; each entry's type from the directory listing, without a stat where it can. As in
    ImageFolder, an entry named like an image that is no folder is listed, whatever it is: a
    dangling link or a FIFO is then a bad image, counted, never silently left out of the total."""
    folders, pending = [], [folder]
    while pending:
        with os.scandir(path := pending.pop()) as it:
            entries = [e for e in it if e.name[0] != "."]
        images = {e.name for e in entries if e.name.lower().endswith(IMAGE_EXTENSIONS) and not _is_folder(e)}
        folders.append((path, sorted(images)))
        pending += [e.path for e in entries if e.name not in images and e.is_dir()]  # a loop: an error, named
    for path, names in sorted(folders):
        yield from (os.path.join(path, name) for name in names)


def _is_folder(entry: os.DirEntry) -> bool:
    """Whether the entry is a folder, or a link to one; a link in a loop is not: named like an image,
    it is listed as ImageFolder lists it, and fails as a bad image."""
    try:
        return entry.is_dir()
    except OSError:  # ELOOP: is_dir follows the link
        return False


def scan_folder(root: Path | str, max_samples: int | None = None, *, labels: _Labels | None = None) -> ImageList:
    """List a folder's images as torchvision's ``ImageFolder`` does: one folder per class named by
    its WordNet ID (``train/``, a sorted ``val/``), or with ``labels`` a flat folder (``val/`` as
    the archive has it). InputError for no such folder, a class folder that is no ImageNet
    WordNet ID, an image without a label, or no images; TypeError for a ``root`` that is no path."""
    if not isinstance(root, (str, os.PathLike)):  # str(1) would list a folder named 1
        raise TypeError(f"expected a folder's path, got {root!r}")
    _check_type("labels", labels, dict | None, _LABELS_EXPECTED)
    root = str(root)
    if not os.path.isdir(root):
        raise InputError(f"{root}: {'not a folder' if os.path.exists(root) else 'no such folder'}")
    _class_index()  # read before the listing, whose OSErrors name the folder
    empty = f"no images ({', '.join(IMAGE_EXTENSIONS)}) in it"
    try:
        return _image_list(_folder_rows(root, labels), max_samples, root, empty)
    except OSError as e:  # the entry that failed, if not the folder itself (a link in a loop)
        where = f": {e.filename}" if e.filename and str(e.filename) != root else ""
        raise InputError(f"{root}: cannot list it ({e.strerror or e}{where})") from None


def _folder_rows(root: str, labels: _Labels | None) -> Iterator[tuple[str, int]]:
    if labels is not None:
        yield from ((path, _label_from_path(path, path, labels)) for path in _image_files(root))
        return
    with os.scandir(root) as it:
        top = sorted((e for e in it if e.name[0] != "."), key=lambda e: e.name)
    if loose := next((e.name for e in top if e.name.lower().endswith(IMAGE_EXTENSIONS) and not _is_folder(e)), None):
        none = "" if any(e.name in _class_index() and _is_folder(e) for e in top) else "of which it has none; "
        loose = f"beside class folders ({none}e.g. {loose})"
        raise InputError(f"{root}: holds image files {loose}; a flat folder needs labels")
    folders = []
    for entry in top:
        if not entry.is_dir():  # a class's name on no folder: its images would be left out without a word
            if entry.name in _class_index():
                what = "a link to nothing (an unmounted volume?)" if entry.is_symlink() else "not a folder"
                raise InputError(f"{entry.path}: named as a class, but {what}")
            continue
        if (label := _class_index().get(entry.name)) is None:
            raise InputError(f"{entry.path}: the folder name is not one of the {NUM_CLASSES} ImageNet WordNet IDs")
        folders.append((entry.path, label))
    empty = []
    for folder, label in folders:  # every class folder checked before the first image
        files = list(_image_files(folder))
        if not files:
            empty.append(os.path.basename(folder))
        yield from ((path, label) for path in files)
    if empty:  # ImageFolder refuses these; a benchmark of the classes there is no error, and is said
        _LG.warning("%s: %s with no image: %s", root, _images(len(empty), "class folder"), " ".join(empty[:5]))


def source(
    path: Path | str, prefix: str = "", max_samples: float | None = None, *, rank: int = 0, world_size: int = 1
) -> Iterator[tuple[str, int]]:
    """``(prefix + path, class index)`` of each image of this rank's shard (images ``rank, rank +
    world_size, …`` of the first ``max_samples``) of a file list, read and checked whole at the call
    (:py:func:`read_file_list`): InputError names a bad line's file and number here, not mid-run."""
    return iter(read_file_list(path, prefix, max_samples).shard(rank, world_size))


@dataclass(frozen=True)
class _Shard:
    """This process's place in a torchrun job (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> _Shard:
        env = os.environ  # torchrun sets these for each process
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))

    def size_of(self, listed: int, rank: int | None = None) -> int:
        """How many of ``listed`` images fall to ``rank`` (default: this one)."""
        return len(range(self.rank if rank is None else rank, listed, self.world_size))


# --- Page cache: how much of the listed files' data is in memory; --cold-cache evicts it ---

_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore's vector: bit 0 of each byte says resident


@functools.cache
def _libc() -> Any | None:
    """libc's mmap, munmap and mincore (Python's mmap has no mincore); None where it lacks them."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        mmap_, munmap, mincore = libc.mmap, libc.munmap, libc.mincore
    except (OSError, AttributeError, TypeError):
        return None
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def _resident_bytes(fd: int, size: int) -> int | None:
    """Bytes of the regular file ``fd`` (``size`` long) in the page cache, by mincore over a
    mapping of it (which reads nothing); None if unknown."""
    import ctypes
    import mmap

    if (libc := _libc()) is None:
        return None
    if size == 0:
        return 0
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr == ctypes.c_void_p(-1).value:  # MAP_FAILED: a file system without mmap
        return None
    try:
        pages = -(-size // mmap.PAGESIZE)
        vector = ctypes.create_string_buffer(pages)
        if libc.mincore(addr, size, vector) != 0:
            return None
    finally:
        libc.munmap(addr, size)
    flags = vector.raw.translate(_LOW_BIT)
    resident = flags.count(1) * mmap.PAGESIZE
    if flags[-1]:  # the file ends inside its last page
        resident -= pages * mmap.PAGESIZE - size
    return resident


def _sum_known(values: Iterable[int | None]) -> int | None:
    values = list(values)
    return None if None in values else sum(values)


def _share(part: int | None, whole: int) -> float | None:
    if part is None:
        return None
    return part / whole if whole else 0.0


@dataclass
class _PageCache:
    """How much of the listed files' data was in the page cache before a run, and after
    ``--cold-cache`` evicted it (POSIX_FADV_DONTNEED drops clean file pages only: not dirty
    pages, directory entries or inodes). ``skipped``: paths not examined (missing, unreadable,
    no regular file). Resident bytes are None if unknown (no mincore, or no mmap). ``repeats``:
    listed lines naming a file listed before (read from memory, in a cold run too)."""

    cold: bool
    files: int = 0
    skipped: int = 0
    bytes: int = 0
    resident_bytes: int | None = 0
    resident_after_bytes: int | None = None
    repeats: int = 0

    @property
    def resident(self) -> float | None:
        return _share(self.resident_bytes, self.bytes)

    @property
    def resident_after(self) -> float | None:
        return _share(self.resident_after_bytes, self.bytes)

    def to_dict(self) -> dict:
        return {**asdict(self), "resident": self.resident, "resident_after": self.resident_after}

    @classmethod
    def total(cls, parts: Sequence[_PageCache]) -> _PageCache:
        """The sum of every rank's: a count unknown on one rank is unknown."""
        counts = [f.name for f in dataclass_fields(cls)][1:]
        return cls(parts[0].cold, *(_sum_known(getattr(p, name) for p in parts) for name in counts))


def _listed_first_elsewhere(images: ImageList, shard: _Shard) -> frozenset[str]:
    """The paths of this rank's shard that an earlier line of the list gives to another rank: that
    rank examines (and evicts) them, so that the job counts each file once, looked at before any
    rank evicts it (ranks on one machine share its page cache). One file by two names (a link) is one."""
    file_of = {path: _file_id(path) or path for path in set(images.paths)}  # a missing one: by its name
    first: dict[Any, int] = {}
    for i, path in enumerate(images.paths):
        first.setdefault(file_of[path], i)
    rank, world = shard.rank, shard.world_size
    return frozenset(path for path in images.paths[rank::world] if first[file_of[path]] % world != rank)


def _examine_file(
    path: str, evict: bool, max_bytes: int | None = None
) -> tuple[tuple[int, int], int, int | None, int | None] | None:
    """``((device, inode), size, resident bytes, resident bytes after eviction or None)``; None if the
    file cannot be opened, is no regular file (opened with O_NONBLOCK: a FIFO cannot hang here) or
    is over ``max_bytes`` (the run refuses it unread). Resident bytes are None for a file neither
    this user's nor writable: Linux (5.2 on) says all of it is in memory (mincore(2))."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):  # ValueError: a name no file can have (an embedded NUL)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (max_bytes is not None and info.st_size > max_bytes):
            return None
        knowable = os.geteuid() in (0, info.st_uid) or os.access(path, os.W_OK, effective_ids=True)
        before = _resident_bytes(fd, info.st_size) if knowable else None
        if evict:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        after = _resident_bytes(fd, info.st_size) if knowable and evict else None
        return (info.st_dev, info.st_ino), info.st_size, before, after
    except OSError:  # fstat or fadvise refused: not examined
        return None
    finally:
        os.close(fd)


def _examine_page_cache(
    paths: Iterable[str], evict: bool = False, elsewhere: Set[str] = frozenset(), max_bytes: int | None = None
) -> _PageCache:
    """How much of each file's data is in the page cache; with ``evict``, drop it (no root
    needed) and measure again. A file listed twice (a repeated list, a link) counts once, as first
    met: the second look would find it evicted. ``elsewhere``: paths another rank examines (its
    shard lists them first), counted here as repeats. A path that cannot be examined (or is over
    ``max_bytes``) is counted in ``skipped``."""
    lines = list(paths)
    examined = {p: _examine_file(p, evict, max_bytes) for p in dict.fromkeys(lines) if p not in elsewhere}
    first: dict[tuple[int, int], tuple[int, int | None, int | None]] = {}
    for key, *sizes in filter(None, examined.values()):
        first.setdefault(key, tuple(sizes))
    files = list(first.values())
    skipped = sum(path in examined and examined[path] is None for path in lines)  # the run fails each line
    return _PageCache(
        cold=evict,
        files=len(files),
        skipped=skipped,
        bytes=sum(size for size, _, _ in files),
        resident_bytes=_sum_known(before for _, before, _ in files),
        resident_after_bytes=_sum_known(after for _, _, after in files) if evict else None,
        repeats=len(lines) - len(files) - skipped,
    )


# --- Decode: paths -> uint8 N x 3 x H x W on the device ---

# bicubic: bilinear for the chroma planes (swscale's bicublin), as PIL upsamples 4:2:0 chroma before
# its bicubic resize: closer to PIL than bicubic chroma, and no slower (bench/parity.py).
_FFMPEG_SCALE_FLAGS = {"bilinear": "bilinear", "bicubic": "bicublin", "nearest": "neighbor", "lanczos": "lanczos"}
_PIL_RESAMPLE = {"bilinear": 2, "bicubic": 3, "nearest": 0, "lanczos": 1}  # PIL.Image.Resampling values


def _pretrained_config(model_name: str) -> dict:
    """timm's pretrained config of ``name``, ``name.tag``, ``hf-hub:…`` or ``local-dir:…``, read
    without building the model. Raises InputError: not a timm model, or its config is unreadable."""
    import timm
    from timm.models import _hub, get_pretrained_cfg  # _hub: timm's public API builds the model to read it

    source, _, model_id = model_name.partition(":") if ":" in model_name else ("", "", model_name)
    try:
        if source == "hf-hub":  # with the hub out of reach, from its cache alone, in seconds, not after retries
            with _offline_if_unreachable(model_id) as unreachable:
                try:
                    config = _hub.load_model_config_from_hf(model_id)[0]
                except OSError:
                    if not unreachable:
                        raise
                    message = f"{model_name}: cannot read its config (the model hub is out of reach ({unreachable}), "
                    raise InputError(message + "and it is not in its cache)", "--model") from None
        elif source == "local-dir":
            config = _hub.load_model_config_from_path(model_id)[0]
        elif source or not model_name or not timm.is_model(model_name):
            raise InputError(f"{model_name!r} is not a timm model", "--model")
        else:
            config = get_pretrained_cfg(model_name)
    except RuntimeError as e:  # "Invalid pretrained tag": timm.is_model looks past the tag
        if source:  # the hub's or a folder's: e.g. huggingface_hub not installed
            raise InputError(f"{model_name}: cannot read its config (RuntimeError: {e})", "--model") from None
        arch = model_name.split(".")[0]
        tags = timm.list_pretrained(f"{arch}.*")
        known = f"its tags: {', '.join(tags[:6])}{', …' if len(tags) > 6 else ''}" if tags else "it has none"
        raise InputError(f"{model_name}: timm has no such pretrained tag of {arch} ({known})", "--model") from None
    except (OSError, ValueError, KeyError, TypeError) as e:  # unreachable hub, bad config.json
        raise InputError(f"{model_name}: cannot read its config ({type(e).__name__}: {e})", "--model") from None
    return config.to_dict() if hasattr(config, "to_dict") else dict(config or {})


HUB_CHECK_S = 3.0  # seconds to wait for the model hub's server before calling it out of reach


def _hub_unreachable(hub_id: str | None) -> str | None:
    """Why the Hugging Face hub does not answer one connection attempt; None when it does, the weights
    come from elsewhere (no ``hub_id``), ``HF_HUB_OFFLINE`` is set, or a proxy stands between."""
    import socket
    import urllib.parse

    from huggingface_hub import constants

    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if not hub_id or constants.HF_HUB_OFFLINE or proxied:
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        host, port = url.hostname, url.port or (80 if url.scheme == "http" else 443)  # ValueError: a port 'abc'
    except ValueError:
        host = None
    if host is None:
        return f"HF_ENDPOINT={constants.ENDPOINT!r} is no URL"
    try:
        socket.create_connection((host, port), timeout=HUB_CHECK_S).close()
    except OSError as e:
        return f"{host}: {e.strerror or e}"
    return None


@contextlib.contextmanager
def _offline_if_unreachable(hub_id: str | None) -> Iterator[str | None]:
    """Yield why the model hub is out of reach (see :py:func:`_hub_unreachable`); while it is, the
    hub's cache alone is read, as with HF_HUB_OFFLINE=1, without half a minute of retries."""
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    unreachable = _hub_unreachable(hub_id)
    constants.HF_HUB_OFFLINE = offline or unreachable is not None
    try:
        yield unreachable
    finally:
        constants.HF_HUB_OFFLINE = offline


def _check_imagenet_head(model_name: str, num_classes: int | None) -> None:
    if num_classes is not None and num_classes != NUM_CLASSES:
        raise InputError(
            f"{model_name} has {num_classes} output classes, not ImageNet-1k's {NUM_CLASSES}: the accuracy "
            "would be meaningless; pick a model or tag trained or fine-tuned on ImageNet-1k (…in1k)",
            "--model",
        )


_CROP_PCT_MAX = 2.0  # above 1 pads the crop with black (volo_d4_448's 1.15); 87.5 is a percentage
# timm's resolve_data_config ignores any other key: a misspelt override would change nothing.
_TRANSFORM_OVERRIDES = frozenset({"img_size", "input_size", "crop_pct", "interpolation", "mean", "std", "crop_mode"})


def _checked_overrides(overrides: Mapping | None) -> dict:
    """``overrides`` for timm's ``resolve_data_config``, sizes as Python ints (it refuses numpy's);
    ValueError for a value it would coerce or ignore (a size of 200.7, a crop_pct of "0.9", one
    channel). Values of another shape are left to timm's own checks."""
    _check_type("overrides", overrides, Mapping | None, "a dict of timm's data config keys, or None")
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}  # None: the config's own
    if unknown := sorted(overrides.keys() - _TRANSFORM_OVERRIDES):  # timm would ignore them
        raise ValueError(f"unknown transform overrides {unknown}: expected some of {sorted(_TRANSFORM_OVERRIDES)}")
    if flags := sorted(k for k, v in overrides.items() if isinstance(v, bool)):  # True would be taken for 1
        raise ValueError(f"transform overrides {flags}: True and False are no sizes, filters or numbers")
    size, shape, crop_pct = (overrides.get(k) for k in ("img_size", "input_size", "crop_pct"))
    if size is not None:
        if not _whole(size, 1):
            raise ValueError(f"transform overrides {{'img_size': {size!r}}}: expected a whole number of pixels")
        overrides["img_size"] = int(size)
    if isinstance(shape, tuple | list):  # another kind: timm's check
        if not (len(shape) == 3 and shape[0] == 3 and all(_whole(v, 1) for v in shape)):
            raise ValueError(f"transform overrides {{'input_size': {shape!r}}}: expected (3, height, width) in pixels")
        overrides["input_size"] = tuple(map(int, shape))
    if crop_pct is not None and not _within(crop_pct, -math.inf):  # the transform's check says the range
        raise ValueError(f"transform overrides {{'crop_pct': {crop_pct!r}}}: expected a number")
    return overrides


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

    def __post_init__(self) -> None:
        """ValueError naming each field out of range, however the transform was made: else every
        image would fail (``size=0``) or another transform be decoded (``crop_pct=87.5``)."""
        reasons = []
        if not _whole(self.size, 1, _IMG_SIZE_MAX):
            reasons.append(f"its size {self.size!r} is not a whole number of pixels from 1 to {_IMG_SIZE_MAX}")
        elif not _within(self.crop_pct, 1e-6, _CROP_PCT_MAX):
            reasons.append(f"its crop_pct {self.crop_pct!r} is not a number above 0, at most {_CROP_PCT_MAX}")
        elif self.resize_short**2 > MAX_IMAGE_PIXELS:
            over = f"every image would be over the limit of {MAX_IMAGE_PIXELS:,} pixels"
            reasons.append(f"its crop_pct {self.crop_pct!r} resizes each shorter side to {self.resize_short}: {over}")
        elif self.resize_short < 1:
            reasons.append(f"its size {self.size} / crop_pct {self.crop_pct!r} resizes each shorter side to 0 pixels")
        if not isinstance(self.interpolation, str) or self.interpolation not in _FFMPEG_SCALE_FLAGS:
            reasons.append(f"its interpolation {self.interpolation!r} is not one of {sorted(_FFMPEG_SCALE_FLAGS)}")
        if self.crop_mode not in ("center", "squash"):
            reasons.append(f"its crop mode {self.crop_mode!r} is neither center nor squash")
        reasons += _channel_reasons(self.mean, self.std)
        if reasons:
            raise ValueError("; ".join(reasons))

    @classmethod
    def from_model(cls, model: torch.nn.Module | str, overrides: dict | None = None) -> EvalTransform:
        """From a timm model's pretrained config, a model name's (not built) or a ModelBundle's
        transform; ``overrides`` as timm's ``resolve_data_config`` takes them. Raises InputError (no
        timm model, or a transform not reproduced here) or ValueError (an override timm ignores)."""
        import timm.data

        overrides = _checked_overrides(overrides)
        if isinstance(model, str):
            config = _pretrained_config(model)
        elif isinstance(model, ModelBundle):  # get_model's transform, which may not be its config's
            t = model.transform
            config = {"input_size": (3, t.size, t.size)} | asdict(t)
        elif getattr(model, "pretrained_cfg", None):
            config = model.pretrained_cfg
        else:  # timm would give its defaults, not this model's transform
            raise InputError(f"a {type(model).__name__} is not a timm model: it has no pretrained config", "--model")
        try:  # the test-time size and crop where the config has them, as timm's validate.py evaluates
            cfg = timm.data.resolve_data_config(overrides, pretrained_cfg=config, use_test_size=True)
        except (AssertionError, TypeError):  # timm's checks, without a message: a mean of 2 values, or 0.5
            raise ValueError(f"transform overrides {overrides}: not values timm takes") from None
        # timm takes the config's value over a falsy one (crop_pct=0): the transform's checks refuse it.
        cfg |= {k: overrides[k] for k in ("crop_pct", "interpolation", "crop_mode") if overrides.get(k) is not None}
        height, width = cfg["input_size"][-2:]
        if height != width:
            message = f"its evaluation transform cannot be reproduced here: its input is {width} x {height}, not square"
            raise InputError(message, "--model")
        if test := [k for k in ("test_input_size", "test_crop_pct") if config.get(k) and cfg[k[5:]] == config[k]]:
            _LG.info("Transform: the config's %s, as timm's validate.py evaluates.", " and ".join(test))
        fixed_h, fixed_w = (config.get("test_input_size") or config.get("input_size") or cfg["input_size"])[-2:]
        if config.get("fixed_input_size") and (fixed_h, fixed_w) != (height, width):  # e.g. ViT's patch grid
            message = f"its input size is fixed at {fixed_w} x {fixed_h}: the model refuses a {width} x {height} image"
            raise InputError(message, "--img-size")
        if _within(crop_pct := cfg["crop_pct"], 1e-6):  # else the transform's own check refuses it
            short = math.floor(width / crop_pct)  # checked here too, to name the flag that sets it
            if short * short > MAX_IMAGE_PIXELS:
                message = f"{width} / {crop_pct} resizes each image's shorter side to {short} pixels: every image"
                raise InputError(f"{message} would be over the limit of {MAX_IMAGE_PIXELS:,}", "--crop-pct")
            if short < 1:
                raise InputError(f"{width} / {crop_pct} resizes each image's shorter side to 0 pixels", "--crop-pct")
        try:
            mean, std = tuple(map(float, cfg["mean"])), tuple(map(float, cfg["std"]))
            return cls(int(width), float(cfg["crop_pct"]), str(cfg["interpolation"]), mean, std, cfg["crop_mode"])
        except (TypeError, ValueError) as error:  # the checks of a transform made in a notebook
            raise InputError(f"its evaluation transform cannot be reproduced here: {error}", "--model") from None

    @property
    def resize_short(self) -> int:
        return math.floor(self.size / self.crop_pct)

    def geometry(self, width: int, height: int) -> tuple[int, int, int, int]:
        """``(resized width, resized height, crop left, crop top)``, rounded as torchvision's
        ``Resize(int)`` and ``CenterCrop`` (timm's) round. ValueError: a size is not positive."""
        if not (_within(width, 1) and _within(height, 1)):
            raise ValueError(f"invalid image size {width!r}x{height!r}")
        short = self.resize_short
        if self.crop_mode == "squash":
            new_w = new_h = short
        elif width <= height:
            new_w, new_h = short, int(short * height / width)
        else:
            new_w, new_h = int(short * width / height), short
        return new_w, new_h, _crop_start(new_w, self.size), _crop_start(new_h, self.size)

    def ffmpeg_filter(self, width: int, height: int) -> str:
        """FFmpeg's filter chain from a decoded frame of any pixel format to the RGB24 crop, in one
        swscale pass that resizes only the region the crop needs (:py:func:`_resize_region`)."""
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
        # in_range=full (JPEG and PNG are): else swscale sets up again on the first frame (2x the cost).
        scale = f"scale={out_w}:{out_h}:flags={flags}:in_range=full"
        return f"{region}{scale},format=gbrp,{crop},format=rgb24"


def _channel_reasons(mean: object, std: object) -> list[str]:
    """Why ``mean`` or ``std`` is no 3 numbers on the 0-1 scale (123.7, the 0-255 one's, classifies noise)."""
    reasons = []
    for name, values, (low, high) in (("mean", mean, _MEAN_RANGE), ("std", std, _STD_RANGE)):
        if not (isinstance(values, Sequence) and len(values) == 3 and all(_within(v, low, high) for v in values)):
            kind = "" if isinstance(values, Sequence) else f" (a tuple or list of them, not a {type(values).__name__})"
            reasons.append(f"its {name} {values!r} is not 3 numbers from {low:g} to {high:g}, on the 0-1 scale{kind}")
    return reasons


def _crop_start(length: int, crop: int) -> int:
    """Where torchvision's ``CenterCrop`` starts along a side; a crop longer than the side first
    pads it with ``(crop - length) // 2`` black pixels before it (``crop_pct`` > 1, volo_d4_448's)."""
    return round((length - crop) / 2) if length >= crop else -((crop - length) // 2)


REGION_TOLERANCE = 0.06  # source pixels


@functools.lru_cache(maxsize=8192)  # images share sides
def _resize_region(length: int, resized: int, offset: int, crop: int) -> tuple[int, int, int, int]:
    """Along one side, the part of a frame to resize for the crop: ``(start, source length, resized
    length, pad)``. The smallest region of even start and length (4:2:0 chroma stays aligned), 4-16
    resized pixels before the crop and 4-39 after, whose crop samples within REGION_TOLERANCE of the
    whole frame's resize; else (or on an enlarged side) the whole side, ``(0, length, resized, offset)``."""
    import numpy as np

    ratio = length / resized
    if ratio < 1:
        return (0, length, resized, offset)
    pads = np.arange(4, 17)[:, None]  # every candidate at once: a row per pad, a column per length
    out = crop + pads + 4 + np.arange(36)
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
        return (0, length, resized, offset)
    return int(start[row, k[row]]), int(src_len[row, k[row]]), int(smallest[row]), row + 4


@dataclass(frozen=True)
class BadImagePolicy:
    """What a run does with images that cannot be decoded. Strict (the default): it stops at the
    first (RunStopped ``bad_image``). ``skip=True``: each is left out of its batch and counted, and
    ``max_bad`` (a count) or ``max_bad_percent`` (of the images listed, rounded down) stop the run
    (``too_many_bad``) once more failed."""

    skip: bool = False
    max_bad: int | None = None
    max_bad_percent: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.skip, bool):  # skip="no" would skip
            raise ValueError(f"skip={self.skip!r}: expected True or False")
        if not self.skip and (self.max_bad is not None or self.max_bad_percent is not None):
            raise ValueError("a limit on bad images applies only when they are skipped (skip=True)")
        if self.max_bad is not None and self.max_bad_percent is not None:
            raise ValueError("give max_bad or max_bad_percent, not both")
        # Checked here: at the first bad image a run would stop with a TypeError, at once, or never.
        if self.max_bad is not None and not _whole(self.max_bad, 0):
            raise ValueError(f"max_bad={self.max_bad!r}: expected a whole number of images, 0 or more")
        if self.max_bad_percent is not None and not _within(self.max_bad_percent, 0, 100):
            raise ValueError(f"max_bad_percent={self.max_bad_percent!r}: expected a number from 0 to 100")

    def limit(self, listed: int | None) -> int | None:
        """The most bad images a run of ``listed`` may skip; None: no limit (or a percentage of None)."""
        if listed is not None and not _within(listed, 0):
            raise ValueError(f"listed={listed!r}: expected a number of images, 0 or more (or None)")
        if self.max_bad_percent is None or listed is None:
            return self.max_bad
        from fractions import Fraction  # exact: 10% of 30 is 3, never 2.9999

        return math.floor(Fraction(str(self.max_bad_percent)) * listed / 100)

    def check(self, failures: Sequence[ImageDecodeError], listed: int | None = None) -> None:
        """RunStopped if ``failures`` (the bad images so far, in order) stop a run of ``listed`` images."""
        if not failures:
            return
        if not self.skip:  # only the first is read (a skipping run reads only the count)
            _check_type("failures[0]", failures[0], ImageDecodeError, "an ImageDecodeError")
            raise RunStopped(
                f"cannot decode {failures[0].path}: {failures[0].reason}", "bad_image", "--skip-bad skips such images"
            )
        limit = self.limit(listed)
        if limit is not None and len(failures) > limit:
            raise RunStopped(
                f"{_images(len(failures))} failed to decode, more than --max-bad allows ({limit})", "too_many_bad"
            )


# What decoders raise for data they cannot take: SPDL (FFmpeg's errors; its InternalError, an
# AssertionError, for data it did not expect), torchvision's nvJPEG, PIL (for corrupt files).
_DECODER_ERRORS = (RuntimeError, ValueError, IndexError, AssertionError, OSError, EOFError, SyntaxError)


def _spdl_reason(error: BaseException) -> str:
    return str(error).split(" (/", 1)[0].strip() or type(error).__name__  # drop SPDL's C++ source location


@contextlib.contextmanager
def _pil_errors(path: str) -> Iterator[None]:
    """Turn what PIL raises for one image's data (a decompression bomb too) into its ImageDecodeError."""
    from PIL import Image

    try:
        yield
    except (*_DECODER_ERRORS, Image.DecompressionBombError) as e:
        raise _undecodable(path, "PIL", e) from None


def _undecodable(path: str, decoder: str, error: Exception) -> Exception:
    """What a decoder's error says: the image's data is bad (ImageDecodeError), or the machine is out of
    memory (FFmpeg's ENOMEM, "Cannot allocate memory"): a MemoryError, which stops the run, as no fault
    of the image's (a good image is never counted as failed)."""
    if _is_out_of_memory(error):
        return MemoryError(f"{decoder}: {_spdl_reason(error)}")
    return ImageDecodeError(path, f"{decoder} cannot decode it: {_spdl_reason(error)}")


_NOT_A_FILE = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO"}  # else a device (/dev/zero) or a socket


def _read_image_bytes(path: str, max_bytes: int = MAX_IMAGE_MB << 20) -> bytes:
    """One image file, whole. Raises ImageDecodeError: not a regular file (refused before any read),
    over ``max_bytes``, empty, or a JPEG cut short (FFmpeg would fill it with grey; PIL refuses it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a folder opens too: fstat tells
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = _NOT_A_FILE.get(stat.S_IFMT(info.st_mode), "a device")
                raise ImageDecodeError(path, f"is {kind}, not an image file")
            if info.st_size > max_bytes:
                mib, limit = info.st_size / 2**20, f"{max_bytes / 2**20:g} MiB"
                if round(mib, 1) > max_bytes / 2**20:
                    raise ImageDecodeError(path, f"file of {mib:.1f} MiB, over the {limit} limit")
                limit += f" limit ({max_bytes} bytes)"  # not "1.0 MiB, over the 1 MiB limit": the bytes of both
                raise ImageDecodeError(path, f"file of {info.st_size} bytes, over the {limit}")
            # A byte more than its size, to see if it grew (or is bigger than it says, as in /proc):
            # asking for max_bytes would allocate that much per image.
            data = os.read(fd, info.st_size + 1)
            if len(data) > info.st_size:
                data += os.read(fd, max_bytes + 1 - len(data))
        finally:
            os.close(fd)
    except OSError as e:
        raise ImageDecodeError(path, e.strerror or str(e)) from None
    except ValueError as e:  # a name no file can have: an embedded NUL, a surrogate no byte gives
        raise ImageDecodeError(path, f"no file can have this name ({e})") from None
    if len(data) > max_bytes:  # it grew while being read
        raise ImageDecodeError(path, f"file over the {max_bytes / 2**20:g} MiB limit")
    if not data:
        raise ImageDecodeError(path, "empty file (0 bytes)")
    # The end-of-image marker follows the first scan; data after it (a camera's trailer) is fine, as in PIL.
    if data[:2] == b"\xff\xd8" and not data.endswith(b"\xff\xd9"):
        header = _parse_jpeg_header(data)
        if data.find(b"\xff\xd9", header.scan if header else 2) == -1:
            raise ImageDecodeError(path, "truncated JPEG (no end-of-image marker)")
    return data


# --- JPEG headers: what each decoder needs to know before it decodes ---

_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start of frame; not DHT, JPG, DAC
_ARITHMETIC_SOF = frozenset({0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})  # arithmetic coding, which FFmpeg lacks
_SOS = 0xDA  # start of scan
_SEGMENT = struct.Struct(">BBH")  # a segment's 0xFF, marker and length
_SOF_FIELDS = struct.Struct(">BHHB")  # after a start-of-frame segment's length: precision, height, width, components


class _JpegHeader(NamedTuple):
    """A JPEG's frame header: its marker (0xC0 baseline, 0xC2 progressive, …), components (1 grey,
    3 YCbCr, 4 CMYK), their sampling factors (``h << 4 | v``), where its first scan starts (2: not found)."""

    frame_type: int
    width: int
    height: int
    components: int
    sampling: bytes
    scan: int

    @property
    def chroma_420(self) -> bool:  # YCbCr, chroma at half the resolution both ways
        return self.sampling == b"\x22\x11\x11"


def _parse_jpeg_header(data: bytes) -> _JpegHeader | None:
    """The frame header of JPEG data, or None: not JPEG, or no frame header before the first scan.
    The segments are walked by their lengths: an EXIF thumbnail's markers inside APP1 are skipped."""
    if data[:2] != b"\xff\xd8":
        return None
    i, end, header = 2, len(data) - 4, None
    while i <= end:
        fill, marker, length = _SEGMENT.unpack_from(data, i)
        if fill != 0xFF:  # bytes between segments: FFmpeg skips them to the next marker, and so does this
            if (i := data.find(b"\xff", i)) == -1:
                break
            continue
        if marker == _SOS:
            return header and header._replace(scan=i)
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF_MARKERS and header is None:
            if i + 10 > len(data):
                return None
            _, height, width, components = _SOF_FIELDS.unpack_from(data, i + 4)
            sampling = data[i + 11 : i + 10 + 3 * components : 3]  # each component: id, sampling, table
            header = _JpegHeader(marker, width, height, components, sampling, 2)
        i += 2 + length
    return header


# --- Decode on the CPU: FFmpeg for JPEG and PNG data, PIL for any other container ---

_JPEG_START = b"\xff\xd8\xff"  # start-of-image marker, then the next marker
_PNG_START = b"\x89PNG\r\n\x1a\n"
# swscale's resize of a side under 8 pixels is 3 to 12 levels from PIL's on average (a photo's 2 x 2 to
# 4 x 4, against under 2 from 8 x 8 on): such an image goes to PIL, the reference.
_FFMPEG_MIN_SIDE = 8
# FFmpeg's chroma at an odd edge of a JPEG with subsampled chroma, enlarged, is 1.2 to 2.1 levels from
# libjpeg's up to 77 pixels (0.6 at even sides, 1.1 at 95): a side under this goes to PIL.
_ODD_EDGE_MAX = 96


class _FilterGraphCache:
    """Per-thread FFmpeg filter graphs (a set-up costs about a decode) by input size and pixel
    format, kept from a size's second image on (sizes met once never push out the common ones):
    ``capacity`` per thread (LRU), and 4096 sizes met once remembered."""

    def __init__(self, transform: EvalTransform, capacity: int = 32) -> None:
        self.transform, self.capacity = transform, capacity
        self._local = threading.local()

    def apply(self, frames: spdl.io.ImageFrames) -> spdl.io.VideoFrames:
        """One decoded frame resized and cropped into a ``size x size`` RGB frame."""
        state = self._local.__dict__
        graphs: dict = state.setdefault("graphs", {})  # the dict's order is the LRU order
        seen: dict = state.setdefault("seen", {})  # sizes met once, oldest first
        key = (frames.width, frames.height, frames.pix_fmt)
        graph = graphs.pop(key, None)
        keep = graph is not None or key in seen  # a cached size, or a size's second image
        if graph is None:
            graph = _filter_graph(*key, self.transform.ffmpeg_filter(key[0], key[1]))
        graph.add_frames(frames)
        output = graph.get_frames()
        if output is None:
            raise RuntimeError("the filter graph produced no frame")
        if keep:  # only a graph that worked goes (back) into the cache, at its newest end
            seen.pop(key, None)
            graphs[key] = graph
            if len(graphs) > self.capacity:
                del graphs[next(iter(graphs))]
        else:
            seen[key] = None
            if len(seen) > 4096:
                del seen[next(iter(seen))]
        return output


def _filter_graph(width: int, height: int, pix_fmt: str, chain: str) -> spdl.io.FilterGraph:
    # SPDL's make_filter_graph releases the GIL while FFmpeg configures the graph (about 1 ms);
    # spdl.io.FilterGraph(desc) holds it all that time (SPDL 0.8; bench/gil.py).
    source = f"buffer=video_size={width}x{height}:pix_fmt={pix_fmt}:time_base=1/25:pixel_aspect=1/1"
    return _libspdl.make_filter_graph(f"{source},{chain},buffersink")


@functools.cache
def _ffmpeg_jpeg_configs() -> tuple[spdl.io.DemuxConfig, spdl.io.DecodeConfig]:
    """How JPEG data is demuxed and decoded: ``fflags=noparse``: the file is one packet, as PIL reads
    it (a second image, an MPO's, is no frame SPDL refuses); on x86-64 the Xvid IDCT (faster, closer
    to libjpeg); ``err_detect=explode``: damaged scan data fails. Made on first use (it loads SPDL)."""
    demux_config = spdl.io.demux_config(format="jpeg_pipe", format_options={"fflags": "noparse"})
    options = {"err_detect": "explode"}
    if platform.machine().lower() in ("x86_64", "amd64"):
        options["idct"] = "xvid"
    return demux_config, spdl.io.decode_config(decoder_options=options)


def _decode_frames(data: bytes) -> spdl.io.ImageFrames:
    """JPEG or PNG data decoded by FFmpeg in its own pixel format (an animated PNG's first frame), by
    SPDL's native calls without demux_image's and decode_packets' wrappers. Raises _DECODER_ERRORS."""
    demux_config, decode_config = _ffmpeg_jpeg_configs() if data.startswith(_JPEG_START) else (None, None)
    demuxer = _libspdl.make_demuxer(memoryview(data), demux_config=demux_config)
    try:
        packets = demuxer.demux_image(bsf=None)
    finally:  # as SPDL's own Demuxer.__exit__ does: it frees the data's view, and has no public name
        demuxer._drop()
    return _libspdl.decode_packets(packets, decode_config=decode_config, filter_desc=None, num_frames=1)


def _decode_pil(path: str, transform: EvalTransform, data: bytes | None = None) -> Any:
    """One image decoded by PIL, resized and cropped as timm's validation does: a uint8
    ``size x size x 3`` numpy array. Raises ImageDecodeError."""
    import numpy as np
    from PIL import Image

    data = _read_image_bytes(path) if data is None else data
    with _pil_errors(path):
        try:
            opened = Image.open(io.BytesIO(data))
        except Image.UnidentifiedImageError:
            raise ImageDecodeError(path, "not an image: its data is no format PIL or FFmpeg is used for") from None
        with opened as image:
            _check_size(path, image.size, transform)
            if _is_16_bit_grey(image):  # scaled to 8 bits: PIL's conversion would clip it (white)
                pixels = np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8
                rgb = Image.fromarray(pixels.astype(np.uint8)).convert("RGB")
            else:
                rgb = image.convert("RGB")
        new_w, new_h, left, top = transform.geometry(*rgb.size)
        resized = rgb.resize((new_w, new_h), _PIL_RESAMPLE[transform.interpolation])
    return np.asarray(resized.crop((left, top, left + transform.size, top + transform.size)))


def _is_16_bit_grey(image: Any) -> bool:
    """A PIL image of 16-bit grey: I;16, or I for a PNG (older PIL) or a PGM whose maxval is over 255.
    32-bit grey (a TIFF's I, F) has no known range: converted as timm's reference converts it."""
    return image.mode.startswith("I;16") or (image.mode == "I" and image.format in ("PNG", "PPM"))


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


def _ffmpeg_decodes(header: _JpegHeader) -> bool:
    """Whether FFmpeg decodes a JPEG as PIL does: not arithmetic-coded (FFmpeg lacks it), not of 4
    components (Adobe's YCCK, what Photoshop saves for CMYK, comes out in wrong colours: a mean
    difference of 42 to 90 levels, top-1 on the demo's photos 27 % against 97 %), not small with an
    odd side and subsampled chroma (``_ODD_EDGE_MAX``)."""
    if header.frame_type in _ARITHMETIC_SOF or header.components == 4:
        return False
    subsampled = header.components == 3 and header.sampling[:1] != b"\x11"  # luma sampled more than chroma
    odd = header.width % 2 or header.height % 2
    return not (subsampled and odd and 0 < min(header.width, header.height) < _ODD_EDGE_MAX)  # 0: DNL's, or corrupt


def _crop_on_cpu(
    path: str, data: bytes, header: _JpegHeader | None, graphs: _FilterGraphCache
) -> spdl.io.VideoFrames | Any:
    """One image decoded, resized and cropped: an RGB frame from FFmpeg for JPEG and still PNG, a
    numpy array from PIL, the reference, for the rest: arithmetic-coded and CMYK JPEG, animated PNG
    (FFmpeg picks another frame), a side under ``_FFMPEG_MIN_SIDE`` pixels (or ``_ODD_EDGE_MAX``, odd,
    for a JPEG with subsampled chroma), other containers (a JPEG-compressed TIFF is black)."""
    if data.startswith(_JPEG_START) and (header is None or _ffmpeg_decodes(header)):
        size = (header.width, header.height) if header else None
    elif data.startswith(_PNG_START) and data.find(b"acTL", 8, max(data.find(b"IDAT"), 8)) == -1:
        size = (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) if len(data) >= 24 else None
    else:
        return _decode_pil(path, graphs.transform, data)
    if size is not None and 0 < min(size) < _FFMPEG_MIN_SIDE:
        return _decode_pil(path, graphs.transform, data)
    _check_size(path, size, graphs.transform)
    try:  # as _pil_errors does for PIL, without a context manager's objects for every image
        frames = _decode_frames(data)
        if frames.width <= 0:  # corrupt data: no frame, which would fail the whole batch's conversion
            raise ValueError("no frame decoded (corrupt data)")
        if size is None or min(size) <= 0:  # a header not read here (or a DNL's height 0): what FFmpeg found
            _check_size(path, (frames.width, frames.height), graphs.transform)
        return graphs.apply(frames)
    except _DECODER_ERRORS as e:
        raise _undecodable(path, "FFmpeg", e) from None


def _image_tensor(image: spdl.io.VideoFrames | Any) -> Tensor:
    if isinstance(image, _libspdl.VideoFrames):
        return to_torch(convert_frames([image]))[0, 0]
    return torch.from_numpy(image.copy())


# --- Batches: items -> (images, labels) on the device, bad images listed with their batch ---


class _Batch(tuple):
    """``images, labels = batch``: uint8 ``N x 3 x S x S`` (RGB, channels-last in memory) and int64
    ``N x 1``, on the device; the rows' ``paths``, the bad images left out (``failures``), and a GPU
    decoder's ``fallbacks`` (images it left to the CPU) and ``decoded_by`` (images per backend)."""

    def __new__(cls, images, labels, paths=(), failures=(), fallbacks=0, decoded_by=None) -> _Batch:
        batch = super().__new__(cls, (images, labels))
        batch.paths, batch.failures = tuple(paths), tuple(failures)
        batch.fallbacks, batch.decoded_by = fallbacks, decoded_by or {}
        return batch

    def __reduce__(self) -> tuple:  # from a --decode-processes worker (its tensors through shared memory)
        return type(self), (*self, self.paths, self.failures, self.fallbacks, self.decoded_by)


_DecodeFunc = Callable[[Sequence[tuple[str, int]]], _Batch]  # see get_decode_func


def _check_images_shape(images: Tensor) -> None:
    if images.dim() != 4 or images.shape[1] != 3:  # one image, or N x H x W x 3: its first size no count
        raise ValueError(f"images of shape {tuple(images.shape)}: expected N x 3 x H x W")


def _check_labels_shape(labels: Tensor, n: int) -> None:
    if tuple(labels.shape) not in ((n,), (n, 1)):  # a row of N against N x 5: N hits per image
        raise ValueError(f"labels of shape {tuple(labels.shape)} for {_images(n)}: expected {n} x 1 (or {n})")


def _record_batch(batch: tuple, failures: list[ImageDecodeError], classified: int, listed: int | None) -> None:
    """The bad images of a batch added to ``failures`` (a user's loader may yield plain tuples, which list
    none), once the batch is known to hold no image past the ``listed`` (RunStopped: none of it counted).
    TypeError for a batch that is no ``(images, labels)`` pair (a dict, a DataLoader's triple);
    ValueError for images not ``N x 3 x H x W`` (one image of a loader that does not batch) or labels
    not one per image, before they are counted."""
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        what = f"{type(batch).__name__} of {len(batch)}" if isinstance(batch, tuple | list) else type(batch).__name__
        raise TypeError(f"a batch that is a {what}: expected a pair (images, labels), as get_decode_func's are")
    for name, value in zip(("images", "labels"), batch, strict=True):  # not an AttributeError mid-loop
        _check_type(f"a batch's {name}", value, Tensor, "a tensor")
    images, labels = batch
    if images.numel():  # an empty batch (every image failed) of any shape holds none; a 0-d tensor holds one
        _check_images_shape(images)
    _check_labels_shape(labels, images.shape[0])
    delivered = classified + len(failures) + len(getattr(batch, "failures", ())) + len(labels)
    _check_delivered(delivered, listed, ended=False)  # before the loop classifies it
    failures += getattr(batch, "failures", ())


def _label_tensor(labels: list[int], device: torch.device) -> Tensor:
    """A batch's labels, int64 N x 1 on ``device``. ValueError for one that is no class index or -1
    (1.7 would be cut to 1, True taken for 1, 5000 a silent miss, a WordNet ID fail in torch)."""
    if any(not _whole(label, -1, NUM_CLASSES - 1) for label in labels):
        raise ValueError(f"labels {labels!r}: expected whole numbers, class indices (0-{NUM_CLASSES - 1}, -1: unknown)")
    tensor = torch.tensor(labels, dtype=torch.int64) if labels else torch.zeros(0, dtype=torch.int64)
    return tensor.view(-1, 1).to(device, non_blocking=True)


def _empty_batch(transform: EvalTransform, device: torch.device, failures: Sequence[ImageDecodeError]) -> _Batch:
    images = torch.empty((0, transform.size, transform.size, 3), dtype=torch.uint8, device=device)
    return _Batch(images.permute(0, 3, 1, 2), _label_tensor([], device), (), failures)


# The stall registry: thread ident -> (path, time.monotonic() at its start) of the image the thread
# decodes, or None. Each thread stores only its own entry (atomic under the GIL): no lock per image.
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
    """``(path, seconds)`` of the image decoded the longest so far, or None."""
    marks = [mark for mark in list(_DECODING.values()) if mark is not None]  # list(): one step
    oldest = min(marks, key=lambda mark: mark[1], default=None)
    return None if oldest is None else (oldest[0], time.monotonic() - oldest[1])


def _decode_items(
    items: Sequence[tuple[str, int]],
    decode_one: Callable[[str], Any],
    policy: BadImagePolicy | None,
    failures: list[ImageDecodeError],
) -> tuple[list[Any], list[int], list[str]]:
    """``(decoded images, labels, paths)``, each image marked in _DECODING meanwhile; a bad one added to
    ``failures`` (raised without a policy), another error raised with its path in ``_while_decoding``."""
    decoded, labels, paths = [], [], []
    marks, key = _DECODING, threading.get_ident()
    try:
        for item in items:
            try:
                path, label = item
            except (TypeError, ValueError):  # bare paths: a ValueError naming no image, in each decode thread
                raise TypeError(f"{item!r}: expected a (path, label) pair, as source() yields") from None
            marks[key] = (path, time.monotonic())
            try:
                if not isinstance(path, str | bytes | os.PathLike):  # os.open's errors name no item ("embedded null")
                    raise TypeError(
                        f"{item!r}: expected a (path, label) pair, its path a str, not {type(path).__name__}"
                    )
                path = os.fsdecode(path)  # a str, as ImageList's: the results and predictions write it
                decoded.append(decode_one(path))
            except ImageDecodeError as e:
                if policy is None:
                    raise
                # A copy, never raised: the traceback of e (and of its context) holds the frames, and
                # so the images, of this batch: all kept till the run's end, the bad ones' batches' too.
                failures.append(ImageDecodeError(e.path, e.reason))
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
) -> _DecodeFunc:
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
        by_ffmpeg = sum(isinstance(crop, _libspdl.VideoFrames) for crop in crops)
        if by_ffmpeg == len(crops):  # one conversion for the batch
            buffer = convert_frames(crops)
            if cuda_config is not None:
                buffer = transfer_buffer(buffer, device_config=cuda_config)
            images = to_torch(buffer).squeeze(1).to(device)
        else:  # PIL decoded some of them
            images = torch.stack([_image_tensor(crop) for crop in crops]).to(device)
        decoded_by = {"ffmpeg": by_ffmpeg, "pil": len(crops) - by_ffmpeg}
        # NHWC memory seen as NCHW: the channels-last layout convolutions prefer.
        return _Batch(images.permute(0, 3, 1, 2), _label_tensor(labels, device), paths, failures, 0, decoded_by)

    return decode_batch_ffmpeg


# --- Decode on the GPU: nvJPEG through nvImageCodec (or torchvision), and NVDEC (SPDL) ---

NVIMGCODEC_BACKENDS = ("hardware", "cuda", "hybrid")  # nvImageCodec's on a GPU, each its own decoder, in this order
NVIMGCODEC_CPU_THREADS = 1  # per decoder: each pipeline thread has decoders of its own
NVDEC_CONCURRENCY = 4  # batches decoded at once with NVDEC: one hardware decoder per thread
NVDEC_MIN_SIDE, NVDEC_MAX_SIZE = 64, (32768, 16384)  # JPEG on A100 / H100 (SPDL's capability table)
CHECK_DECODER_IMAGES = 8  # images a GPU decoder is compared with FFmpeg on before a run (--check-decoder)
DECODER_TOLERANCE = 3.0  # mean absolute difference (0-255) a GPU decoder may show against FFmpeg, per image

# The CUDA config of this thread's NVDEC decoder: SPDL caches one decoder per thread, and it keeps
# the config (stream, allocator) of its first use (``NvDecDecoderCore::init_decoder``).
_NVDEC_CONFIG = threading.local()


def _spdl_cuda_error() -> str | None:
    """Why SPDL's CUDA extension cannot load here (e.g. a missing ``libnvcuvid.so``), or None."""
    import spdl.io.lib

    try:
        spdl.io.lib._import_libspdl_cuda()  # private: the public built_with_* say only False, not why
    except (RuntimeError, ImportError, OSError) as e:
        # One "module: reason" per build SPDL tried (one per FFmpeg version): the distinct reasons.
        text = "; ".join(dict.fromkeys(re.findall(r'"[\w.]+: ([^"]+)"', str(e)))) or str(e)
        if "libnvcuvid" in text:
            text += " (link libnvcuvid.so to the driver's libnvcuvid.so.1; in a container, "
            text += "NVIDIA_DRIVER_CAPABILITIES must include video)"
        return text
    return None


def _spdl_cuda_config(device: torch.device, stream: torch.cuda.Stream | None = None) -> spdl.io.CUDAConfig:
    kwargs = {} if stream is None else {"stream": stream.cuda_stream}
    allocator = (torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete)
    return spdl.io.cuda_config(device_index=device.index or 0, allocator=allocator, **kwargs)


def _resize_crop_on_device(images: Tensor, transform: EvalTransform, size: tuple[int, int] | None = None) -> Tensor:
    """``N x 3 x H x W`` (uint8, or float 0-255) to uint8 ``N x 3 x S x S`` on their device, cropped as
    on the CPU with the geometry of ``size`` (width, height; default: theirs). Antialiased: torch's
    bicubic is PIL's; torch has no lanczos, so bicubic stands in for it."""
    new_w, new_h, left, top = transform.geometry(*(size or (images.shape[-1], images.shape[-2])))
    mode = "bicubic" if transform.interpolation == "lanczos" else transform.interpolation
    resized = torch.nn.functional.interpolate(
        images.float(), size=(new_h, new_w), mode=mode, antialias=mode != "nearest"
    )
    # Negative padding crops: one call crops, and pads with black where crop_pct > 1 (as on the CPU).
    s = transform.size
    crop = torch.nn.functional.pad(resized, (-left, left + s - new_w, -top, top + s - new_h))
    return crop.round_().clamp_(0, 255).to(torch.uint8)


def _resize_crop_groups(images: Sequence[Tensor | None], transform: EvalTransform) -> list[Tensor | None]:
    """Each ``3 x H x W`` image resized and cropped (None stays None), one call per size (ImageNet's
    500 x 375 and 375 x 500 are most of a batch)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        if image is not None:
            groups.setdefault(tuple(image.shape), []).append(i)
    out: list[Tensor | None] = [None] * len(images)
    for members in groups.values():
        crops = _resize_crop_on_device(torch.stack([images[i] for i in members]), transform)
        for i, crop in zip(members, crops, strict=True):
            out[i] = crop
    return out


def _nv12_to_rgb(nv12: Tensor) -> Tensor:
    """NVDEC's uint8 ``1.5H x W`` NV12 (luma, then U and V interleaved) to float32 ``3 x H x W``,
    0-255, not rounded: full-range BT.601 as libjpeg and FFmpeg decode JPEG, chroma upsampled
    bilinearly, sited between the luma samples as JPEG places it."""
    height, width = nv12.shape[0] * 2 // 3, nv12.shape[1]
    y = nv12[:height].float()
    uv = nv12[height:].view(height // 2, width // 2, 2).permute(2, 0, 1).float() - 128.0
    u, v = torch.nn.functional.interpolate(uv[None], size=(height, width), mode="bilinear", align_corners=False)[0]
    return torch.stack([y + 1.402 * v, y - 0.344136 * u - 0.714136 * v, y + 1.772 * u]).clamp_(0, 255)


def _nvdec_can_take(header: _JpegHeader | None, transform: EvalTransform) -> bool:
    """NVDEC decodes sequential (baseline or extended) 8-bit 4:2:0 JPEGs within its size range."""
    if header is None or header.frame_type not in (0xC0, 0xC1) or not header.chroma_420:
        return False
    (width, height), (max_width, max_height) = (header.width, header.height), NVDEC_MAX_SIZE
    within = NVDEC_MIN_SIDE <= width <= max_width and NVDEC_MIN_SIDE <= height <= max_height
    return within and _device_can_shrink(header, transform)


# torch's antialiased resize on CUDA holds each output block's filter weights in the block's shared
# memory (48 KiB): it refuses a shrink of over about 47 times in bicubic (94 in bilinear), failing
# the run. A JPEG whose short side is over 40 times the resize's (10,240 pixels for 256) goes to the CPU.
DEVICE_MAX_SHRINK = 40


def _device_can_shrink(header: _JpegHeader, transform: EvalTransform) -> bool:
    new_w, new_h, _, _ = transform.geometry(header.width, header.height)
    return max(header.width / new_w, header.height / new_h) <= DEVICE_MAX_SHRINK


def _nvjpeg_takes(header: _JpegHeader | None, transform: EvalTransform) -> bool:
    """Baseline, extended or progressive JPEG of 1 or 3 components (CMYK decodes to wrong colours),
    within the pixel limits (the CPU path refuses the rest, naming the limit)."""
    if header is None or header.frame_type not in (0xC0, 0xC1, 0xC2) or header.components not in (1, 3):
        return False
    if min(header.width, header.height) <= 0:
        return False
    new_w, new_h, _, _ = transform.geometry(header.width, header.height)
    pixels_ok = max(header.width * header.height, new_w * new_h) <= MAX_IMAGE_PIXELS
    return pixels_ok and _device_can_shrink(header, transform)


@functools.cache
def _nvimgcodec() -> tuple[Any | None, str]:
    """nvImageCodec's module (None if not installed), and why not or what its import printed on stderr
    (a line per library it cannot load: nvJPEG, nvJPEG2000, nvTIFF), kept out of the run's output."""
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")  # what it cannot decode is counted instead
    if sys.stderr is not None:  # None: closed at start (2>&-), fd 2 is /dev/null (entrypoint)
        sys.stderr.flush()
    saved = os.dup(2)
    error = ""
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)  # meanwhile, what another thread writes to stderr lands there too
        try:
            from nvidia import nvimgcodec
        except ImportError as e:
            nvimgcodec, error = None, f"nvImageCodec is not installed ({e})"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        lines = said.read().decode(errors="replace").splitlines()
    text = "\n".join(line.strip() for line in lines if line.strip())
    if text:
        _LG.debug("nvImageCodec's import printed: %s", text)
    return nvimgcodec, error or text


def _nvimgcodec_decoders(device: torch.device, errors: list[str] | None = None) -> list[tuple[str, Any]]:
    """``(backend, decoder)`` in the order a batch goes through them: on a GPU, those of
    :py:data:`NVIMGCODEC_BACKENDS` it has (``hardware``: the JPEG engines; ``hybrid``: Huffman on the
    CPU below a megapixel), why one is missing in ``errors``; on the CPU (tests), libjpeg-turbo."""
    nvimgcodec = _nvimgcodec()[0]
    kinds = {"hardware": nvimgcodec.HW_GPU_ONLY, "cuda": nvimgcodec.GPU_ONLY, "hybrid": nvimgcodec.HYBRID_CPU_GPU}
    backends, device_id = NVIMGCODEC_BACKENDS, device.index or 0
    if device.type != "cuda":
        kinds, backends, device_id = {"cpu": nvimgcodec.CPU_ONLY}, ("cpu",), nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
    # fancy_upsampling: chroma upsampled as libjpeg and FFmpeg do.
    options = {"device_id": device_id, "max_num_cpu_threads": NVIMGCODEC_CPU_THREADS, "options": ":fancy_upsampling=1"}
    decoders = []
    for backend in backends:
        try:
            decoder = nvimgcodec.Decoder(backends=[nvimgcodec.Backend(kinds[backend])], **options)
        except RuntimeError as e:  # "Could not create decoder": none of that kind on this GPU
            _LG.debug("nvImageCodec has no %s decoder on %s: %s", backend, device, e)
            if errors is not None:
                errors.append(f"{backend}: {e}")
            continue
        decoders.append((backend, decoder))
    return decoders


@functools.cache
def _nvimgcodec_params() -> Any:
    """8-bit interleaved RGB, EXIF orientation not applied (PIL and timm's reference do not apply it)."""
    nvimgcodec = _nvimgcodec()[0]
    return nvimgcodec.DecodeParams(
        apply_exif_orientation=False, color_spec=nvimgcodec.SRGB, allow_any_depth=False, sample_format=nvimgcodec.I_RGB
    )


def _nvimgcodec_tensor(image: Any) -> Tensor:
    """An nvImageCodec image as uint8 ``3 x H x W``, no copy: DLPack from the device (which orders
    the consumer's stream after the decode), numpy from the host (DLPack calls CUDA even there)."""
    if image.device_id is not None:
        return torch.from_dlpack(image).permute(2, 0, 1)
    import numpy as np

    return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)


def _decode_nvimgcodec(
    datas: list[bytes], headers: list[_JpegHeader | None], transform: EvalTransform, device: torch.device, local: Any
) -> tuple[list[Tensor | None], dict[str, int]]:
    """The JPEGs nvJPEG takes, one batched call per backend (each given what those before it left)."""
    nvimgcodec = _nvimgcodec()[0]
    if not hasattr(local, "decoders"):
        local.decoders = _nvimgcodec_decoders(device)
    code_streams = {}
    for i, (data, header) in enumerate(zip(datas, headers, strict=True)):
        if _nvjpeg_takes(header, transform):
            with contextlib.suppress(RuntimeError):  # "Failed to get image info": left to the CPU
                code_streams[i] = nvimgcodec.CodeStream(data)  # a reference to the bytes, not a copy
    decoded: list[Tensor | None] = [None] * len(datas)
    counts: dict[str, int] = {}
    left = list(code_streams)
    stream = local.stream.cuda_stream if device.type == "cuda" else 0
    for backend, decoder in local.decoders:
        if not left:
            break
        images = decoder.decode([code_streams[i] for i in left], params=_nvimgcodec_params(), cuda_stream=stream)
        for i, image in zip(left, images, strict=True):
            if image is not None:
                decoded[i] = _nvimgcodec_tensor(image)
        counts[backend] = sum(image is not None for image in images)
        left = [i for i in left if decoded[i] is None]
    return _resize_crop_groups(decoded, transform), counts


def _decode_torchvision(
    datas: list[bytes], headers: list[_JpegHeader | None], transform: EvalTransform, device: torch.device, local: Any
) -> tuple[list[Tensor | None], dict[str, int]]:
    """The JPEGs nvJPEG takes, through torchvision's decoder: one batched call (behind its lock)."""
    import torchvision.io

    decoded: list[Tensor | None] = [None] * len(datas)
    takes = [i for i, header in enumerate(headers) if _nvjpeg_takes(header, transform)]
    if not takes:
        return decoded, {}
    encoded = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in takes]
    mode = torchvision.io.ImageReadMode.RGB
    try:
        images: list[Tensor | None] = list(torchvision.io.decode_jpeg(encoded, mode=mode, device=device))
    except RuntimeError as e:  # image by image, so that one bad image does not send the others to the CPU
        if _is_out_of_memory(e):  # the device's fault, not the images': the run stops, as on the CPU
            raise
        images = [None] * len(encoded)
        for k, tensor in enumerate(encoded):
            try:
                images[k] = torchvision.io.decode_jpeg(tensor, mode=mode, device=device)
            except RuntimeError as e:
                if _is_out_of_memory(e):
                    raise
    for i, image in zip(takes, images, strict=True):
        decoded[i] = image
    return _resize_crop_groups(decoded, transform), {"torchvision": sum(image is not None for image in images)}


def _decode_nvdec(
    datas: list[bytes], headers: list[_JpegHeader | None], transform: EvalTransform, device: torch.device, local: Any
) -> tuple[list[Tensor | None], dict[str, int]]:
    """Image by image, the JPEGs NVDEC takes: the first image only (no MPO's second, no trailer), as
    FFmpeg; NV12 at the size made even (SPDL refuses odd sizes), resized with the original size's
    geometry, antialiased (NVDEC's own scaler is not)."""
    decoded: list[Tensor | None] = [None] * len(datas)
    for i, (data, header) in enumerate(zip(datas, headers, strict=True)):
        if not _nvdec_can_take(header, transform):
            continue
        end = data.find(b"\xff\xd9", header.scan)
        try:
            packets = spdl.io.demux_video(data if end == -1 else data[: end + 2])
            width, height = packets.width, packets.height
            even_w, even_h = width + width % 2, height + height % 2
            decoder = spdl.io.nvdec_decoder(
                local.config,
                packets.codec,
                use_cache=getattr(_NVDEC_CONFIG, "config", None) is local.config,  # else made afresh
                scale_width=even_w if even_w != width else -1,
                scale_height=even_h if even_h != height else -1,
            )
            _NVDEC_CONFIG.config = local.config
            nv12 = spdl.io.to_torch(decoder.decode_packets(packets))
        except _DECODER_ERRORS as e:
            if _is_out_of_memory(e):  # the device's fault, not the image's: the run stops, as on the CPU
                raise
            _LG.debug("NVDEC left an image to the CPU: %s", _spdl_reason(e))
            continue
        decoded[i] = _resize_crop_on_device(_nv12_to_rgb(nv12[0])[None], transform, (width, height))[0]
    return decoded, {"nvdec": sum(image is not None for image in decoded)}


# Each: (datas, headers, transform, device, the thread's state) -> uint8 3 x S x S per image (None:
# left to the CPU), and the images each backend decoded. The thread's ``local`` holds its CUDA stream
# and SPDL config (on a GPU) and its nvImageCodec decoders (not for concurrent calls).
_GPU_DECODERS = {"nvimgcodec": _decode_nvimgcodec, "torchvision": _decode_torchvision, "nvdec": _decode_nvdec}


def _cpu_fallback(
    path: str, data: bytes, header: _JpegHeader | None, graphs: _FilterGraphCache, device: torch.device
) -> Tensor:
    """An image a GPU decoder left, decoded as the FFmpeg loader decodes it: uint8 ``3 x S x S`` on ``device``."""
    return _image_tensor(_crop_on_cpu(path, data, header, graphs)).permute(2, 0, 1).to(device)


def _gpu_decode_func(
    decoder: str,
    transform: EvalTransform,
    device: torch.device,
    policy: BadImagePolicy | None,
    max_bytes: int,
    library: str | None = None,
) -> _DecodeFunc:
    """The batch function of ``nvdec`` or ``nvjpeg`` (``library``: default nvImageCodec if installed,
    else torchvision); the CPU decodes what the GPU leaves, each a fallback."""
    if decoder == "nvdec" and device.type != "cuda":
        raise ValueError(f"nvdec decodes on a CUDA GPU, not on {device}")
    if decoder == "nvjpeg" and library is None:
        library = "torchvision" if _nvimgcodec()[0] is None else "nvimgcodec"
    decode_on_gpu = _GPU_DECODERS[library or decoder]
    graphs = _FilterGraphCache(transform)
    local = threading.local()

    def decode_batch(items: Sequence[tuple[str, int]]) -> _Batch:
        failures: list[ImageDecodeError] = []
        datas, labels, paths = _decode_items(items, lambda path: _read_image_bytes(path, max_bytes), policy, failures)
        headers = [_parse_jpeg_header(data) for data in datas]
        with _working_on(paths[0]) if paths else contextlib.nullcontext():
            images, counts = decode_on_gpu(datas, headers, transform, device, local)
        left = [(paths[i], i) for i, image in enumerate(images) if image is None]
        index_of = {path: i for path, i in left}  # a path listed twice: the same bytes and header

        def on_cpu(path: str) -> Tensor:
            return _cpu_fallback(path, datas[index_of[path]], headers[index_of[path]], graphs, device)

        decoded, at, _ = _decode_items(left, on_cpu, policy, failures)
        for i, image in zip(at, decoded, strict=True):
            images[i] = image
        kept = [i for i, image in enumerate(images) if image is not None]
        if not kept:
            return _empty_batch(transform, device, failures)
        # The FFmpeg path's memory layout for every batch: a compiled model would recompile for another.
        batch = torch.stack([images[i] for i in kept]).contiguous(memory_format=torch.channels_last)
        labels_kept, paths_kept = _label_tensor([labels[i] for i in kept], device), [paths[i] for i in kept]
        decoded_by = {backend: count for backend, count in counts.items() if count}
        return _Batch(batch, labels_kept, paths_kept, failures, len(decoded), decoded_by)

    def decode_batch_gpu(items: Sequence[tuple[str, int]]) -> _Batch:
        if device.type != "cuda":  # the nvJPEG path's CPU decoders, for tests
            return decode_batch(items)
        if not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream(device)
            local.config = _spdl_cuda_config(device, local.stream)
        # SPDL's copies and allocations and torch's work in order on the thread's stream, waited
        # for once, before the model takes the batch on its own stream.
        with torch.cuda.device(device), torch.cuda.stream(local.stream):
            batch = decode_batch(items)
        local.stream.synchronize()
        # Freed by the main thread, a batch's memory would go back to this stream's pool at once, the model's
        # kernels on the default stream still reading it: the allocator now waits for that stream's work.
        for tensor in batch:
            tensor.record_stream(torch.cuda.default_stream(device))
        return batch

    return decode_batch_gpu


def get_decode_func(
    device: torch.device | str = "cpu",
    transform: EvalTransform | None = None,
    decoder: str = "ffmpeg",
    policy: BadImagePolicy | None = None,
    *,
    max_image_bytes: int = MAX_IMAGE_MB << 20,
) -> _DecodeFunc:
    """A function that decodes a batch of ``(path, label)`` items: ``images, labels = decode(items)``,
    images uint8 ``N x 3 x size x size`` (RGB, channels-last in memory), labels int64 ``N x 1``,
    both on ``device``; ``.paths`` names each row's image.

    Args:
        device: Where the batch is delivered.
        transform: Resize and crop (default: 224 crop of 256, bicubic).
        decoder: ``ffmpeg`` (CPU), ``nvjpeg`` (nvImageCodec, else torchvision; on the CPU, their CPU
            decoders, for tests) or ``nvdec``. A GPU decoder leaves what it cannot take to the CPU.
        policy: Bad images are left out (labels stay aligned) and listed in the batch; without a
            policy, one raises ImageDecodeError. Give :py:func:`benchmark` the same one.
        max_image_bytes: A larger image file is a bad image.
    """
    device, transform = _resolve_device(str(device)), EvalTransform() if transform is None else transform
    _check_type("transform", transform, EvalTransform, "an EvalTransform (e.g. EvalTransform.from_model(name))")
    _check_type("policy", policy, BadImagePolicy | None, "a BadImagePolicy, or None")
    if not _whole(max_image_bytes, 1):
        raise ValueError(f"max_image_bytes={max_image_bytes!r}: expected a whole number of bytes, 1 or more")
    if decoder == "ffmpeg":
        return _ffmpeg_decode_func(transform, device, policy, max_image_bytes)
    if decoder in ("nvjpeg", "nvdec"):
        return _gpu_decode_func(decoder, transform, device, policy, max_image_bytes)
    raise ValueError(f"unknown decoder {decoder!r}; expected one of ['ffmpeg', 'nvdec', 'nvjpeg']")


def _check_gpu_decoder(decoder: str, device: torch.device) -> str:
    """The backend's name if ``decoder`` runs on ``device`` (SPDL's CUDA extension loads, a small JPEG
    decodes to the right colour); else InputError, saying why."""
    cuda_error = _spdl_cuda_error() if device.type == "cuda" else None
    if decoder == "ffmpeg":
        if cuda_error is not None:
            message = f"SPDL's CUDA extension, which copies batches to {device}, cannot load: {cuda_error}"
            raise InputError(message, "--device")
        return "ffmpeg"
    flag = f"--use-{decoder}"
    if device.type != "cuda" or not torch.cuda.is_available():
        raise InputError(f"{flag} decodes on a CUDA GPU, but this run uses {device}", flag, _FFMPEG_ADVICE)
    if cuda_error is not None:
        raise InputError(f"SPDL's CUDA extension cannot load: {cuda_error}", flag, _FFMPEG_ADVICE)
    if decoder == "nvdec" and not spdl.io.utils.built_with_nvcodec():
        raise InputError(f"the installed SPDL ({spdl.__version__}) is built without NVDEC", flag, _FFMPEG_ADVICE)
    backend = "torchvision" if decoder == "nvjpeg" else "spdl"
    if decoder == "nvjpeg" and _nvimgcodec()[0] is not None:
        backend = _nvimgcodec_check(device)
    from PIL import Image

    transform, policy = EvalTransform(size=128, crop_pct=1.0), BadImagePolicy(skip=True)
    try:
        with tempfile.NamedTemporaryFile(suffix=".JPEG") as f:
            # 256 x 192, baseline 4:2:0, one colour: inside every GPU decoder's range.
            Image.new("RGB", (256, 192), (200, 80, 40)).save(f, format="JPEG", subsampling=2, quality=95)
            f.flush()
            batch = get_decode_func(device, transform, decoder, policy)([(f.name, 0)])
    except _DECODER_ERRORS as e:
        message = f"{flag} cannot decode a JPEG on {_device_name(device)}: {_spdl_reason(e)}"
        raise InputError(message, flag, _FFMPEG_ADVICE) from None
    images = batch[0]
    if batch.failures or batch.fallbacks or not len(images):
        raise InputError(f"{flag} cannot decode a plain JPEG on {_device_name(device)}", flag, _FFMPEG_ADVICE)
    colour = images.float().mean(dim=(0, 2, 3)).tolist()
    if max(abs(c - e) for c, e in zip(colour, (200, 80, 40), strict=True)) > 4:
        message = f"{flag} decodes a JPEG of RGB (200, 80, 40) to {[round(c) for c in colour]}"
        raise InputError(message, flag, _FFMPEG_ADVICE)
    return backend


def _nvimgcodec_check(device: torch.device) -> str:
    """``nvimgcodec (hardware, hybrid)``: the backends nvImageCodec has on ``device``; InputError
    if none (nvJPEG's library missing, a driver too old for CUDA 13)."""
    errors: list[str] = []
    backends = [backend for backend, _ in _nvimgcodec_decoders(device, errors)]
    if backends:
        return f"nvimgcodec ({', '.join(backends)})"
    # What its first import here printed about nvJPEG, not about the libraries JPEGs do not need.
    said = [line for line in _nvimgcodec()[1].splitlines() if "nvjpeg library" in line.lower()]
    hint = " (pip install nvidia-nvjpeg, CUDA 13's nvJPEG)" if said else ""
    message = f"nvImageCodec has no JPEG decoder on {device}{hint}: {'; '.join([*said, *errors])}"
    raise InputError(message, "--use-nvjpeg", _FFMPEG_ADVICE)


@dataclass
class _DecoderCheck:
    """A decoder against FFmpeg on the CPU: its images' mean absolute differences (0-255; None: none
    compared). ``fallbacks``: images it left to FFmpeg on the CPU, the reference itself: not compared;
    ``only_decoder``, ``only_reference``, ``neither``: images one side, or neither, could decode."""

    decoder: str
    images: int
    mad_mean: float | None
    mad_max: float | None
    worst: str | None
    tolerance: float = DECODER_TOLERANCE
    fallbacks: int = 0
    only_decoder: int = 0
    only_reference: int = 0
    neither: int = 0


def _check_decoder(
    decode: _DecodeFunc,
    items: Sequence[tuple[str, int]],
    transform: EvalTransform,
    decoder: str,
    max_image_bytes: int = MAX_IMAGE_MB << 20,
) -> _DecoderCheck:
    """``decode``'s pixels against FFmpeg's on the CPU (under the same file size limit), image by
    image, each path once; those only one side, or neither, can decode counted, not compared.
    InputError if one differs by more than the tolerance."""
    reference = get_decode_func("cpu", transform, max_image_bytes=max_image_bytes)
    mads: dict[str, float] = {}
    counts = {"fallbacks": 0, "only_decoder": 0, "only_reference": 0, "neither": 0}
    for item in dict(items).items():  # a path listed twice is one image
        decoded = []
        for decode_one in (decode, reference):
            try:
                batch = decode_one([item])
            except ImageDecodeError:
                batch = None
            decoded.append(batch if batch is not None and len(batch[0]) else None)
        theirs, ours = decoded
        if theirs is None or ours is None:
            counts["neither" if theirs is ours else "only_reference" if theirs is None else "only_decoder"] += 1
        elif getattr(theirs, "fallbacks", 0):  # decoded by the reference itself: a difference of 0
            counts["fallbacks"] += 1
        else:
            mads[item[0]] = (theirs[0][0].cpu().float() - ours[0][0].float()).abs().mean().item()
    worst = max(mads, key=mads.__getitem__, default=None)
    mad_mean = sum(mads.values()) / len(mads) if mads else None
    check = _DecoderCheck(decoder, len(mads), mad_mean, max(mads.values(), default=None), worst, **counts)
    if worst is None or mads[worst] <= check.tolerance:
        return check
    message = f"{decoder} decodes {worst} with a mean absolute difference of {mads[worst]:.1f} (0-255) "
    message += f"from FFmpeg on the CPU, more than {check.tolerance:g}"
    if decoder == "ffmpeg":
        raise InputError(message, "--device")
    raise InputError(message, f"--use-{decoder}", _FFMPEG_ADVICE)


# --- Pipeline ---


_SPDL_STAGE_BUFFER = 2  # batches SPDL's queue between the decode stage and the sink holds (its _BUFFER_SIZE)


class _TimedQueue(StatsQueue):
    """SPDL's ``StatsQueue`` that also records when batches came and went: SPDL's own figures stop
    when its stage ends, before the model has taken every sink batch."""

    def __init__(self, info: StageInfo, *, buffer_size: int = 1, interval: float = -1) -> None:
        super().__init__(info, buffer_size=buffer_size, interval=interval)
        self.started = 0.0  # time.monotonic() when its stage started
        self.changes: list[tuple[float, bool]] = []  # (time, whether a batch is now waiting)
        self.gets: list[tuple[float, float]] = []  # (time get was called, time it returned)
        self.last_put: float | None = None  # when its last item (not the end of stream) came to it

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        self.started = time.monotonic()
        async with super().stage_hook():
            yield

    async def put(self, item: object) -> None:
        now = time.monotonic()
        self.changes.append((now, True))
        if not is_eof(item):
            self.last_put = now
        await super().put(item)

    async def get(self) -> object:
        called = time.monotonic()
        item = await super().get()
        returned = time.monotonic()
        self.gets.append((called, returned))
        if self.qsize() == 0:
            self.changes.append((returned, False))
        return item


class _TaskStats(TaskStatsHook):
    def __init__(self, info: StageInfo, interval: float = -1) -> None:
        super().__init__(info, interval=interval)
        self.ends: list[float] = []

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        async with super().task_hook(input_item):
            yield
        self.ends.append(time.monotonic())  # a task that raised is no batch: not reached


class _PipelineStats:
    """SPDL's per-stage statistics through the builder's public hooks (its own logs kept). Task
    times cover the whole run; the sink queue's figures start at the last :py:meth:`start_window`."""

    def __init__(self, interval: float = -1) -> None:
        self.interval = interval
        self.stages: list[_TaskStats] = []
        self.queues: list[_TimedQueue] = []  # the last one is the sink's
        self.window: float | None = None  # time.monotonic() at the last start_window

    def task_hooks(self, info: StageInfo) -> list[TaskHook]:
        """``task_hook_factory`` for :py:meth:`PipelineBuilder.build`."""
        self.stages.append(_TaskStats(info, interval=self.interval))
        return [self.stages[-1]]

    def queue(self, info: StageInfo, *, buffer_size: int = 1) -> AsyncQueue:
        """``queue_class`` for :py:meth:`PipelineBuilder.build`."""
        self.queues.append(_TimedQueue(info, buffer_size=buffer_size, interval=self.interval))
        return self.queues[-1]

    def start_window(self) -> None:
        """Measure the sink queue from now on (``benchmark``'s ``sync_clocks``: after the warm-up)."""
        self.window = time.monotonic()

    def waiting_per_interval(self, start: float, end: float, interval: float, bins: int) -> list[float]:
        """The share of each of ``bins`` intervals of ``interval`` seconds from ``start`` (the last one up
        to ``end``) in which a batch waited in the sink queue."""
        totals = [0.0] * bins
        changes = [*self.queues[-1].changes, (end, False)]
        for (t0, waiting), (t1, _) in itertools.pairwise(changes):
            t0, t1 = max(t0, start) - start, min(t1, end) - start  # from here on, seconds from start
            if not waiting or t1 <= t0:
                continue
            for i in range(min(int(t0 // interval), bins - 1), min(int(t1 // interval), bins - 1) + 1):
                bin_end = math.inf if i == bins - 1 else (i + 1) * interval
                totals[i] += max(0.0, min(t1, bin_end) - max(t0, i * interval))
        lengths = [min(interval, end - start - i * interval) for i in range(bins)]  # the last: up to the end
        return [round(s / length, 4) if length > 0 else 0.0 for s, length in zip(totals, lengths, strict=True)]

    def window_lead(self, concurrency: int) -> tuple[int, float | None] | None:
        """At the FPS window's opening: the batches decoded and not taken, plus those perhaps under way
        (at most ``concurrency``); and a lower bound of the loader's rate in batches/s. None before it."""
        if not self.stages or self.window is None:  # no stages here: --decode-processes
            return None
        t0, sink, ends = self.window, self.queues[-1], sorted(self.stages[-1].ends)
        taken0 = sum(1 for _, returned in sink.gets if returned <= t0)
        done0 = sum(1 for t in ends if t <= t0)
        under_way = min(concurrency, len(ends) - done0)
        rates = [0.0]
        if ends and ends[-1] > sink.started:  # the stages all start at once
            rates.append(len(ends) / (ends[-1] - sink.started))
        new_work = len(ends) - done0 - under_way
        if new_work > 0 and ends[-1] > t0:
            rates.append(new_work / (ends[-1] - t0))
        return max(0, done0 - taken0) + under_way, max(rates) or None

    def loader_end(self) -> float | None:
        """When the decode stage handed on its last batch (``time.monotonic``), or None. With
        ``--decode-processes``, when it reached this process."""
        return self.queues[-2].last_put if self.queues else None  # source, decode, sink: the decode's

    def summary(self) -> dict:
        """Each stage's name, concurrency, tasks, failures and average task seconds; the sink queue's
        batches, occupancy and average wait per ``get``."""
        sink = self.queues[-1]
        opened = self.window or sink.started
        waits = [returned - max(called, opened) for called, returned in sink.gets if returned > opened]
        span = sink.gets[-1][1] - opened if sink.gets else 0.0  # up to the last get
        occupancy = self.waiting_per_interval(opened, opened + span, span, 1)[0] if span > 0 else 0.0
        stages = [
            {
                "name": s.info.stage_name,
                "concurrency": s.info.concurrency,
                "tasks": s.num_tasks,
                "failures": s.num_tasks - s.num_success,
                "ave_task_s": s.ave_time,
            }
            for s in self.stages
        ]
        wait = sum(waits) / len(waits) if waits else 0.0
        return {
            "stages": stages,
            "sink_queue": {"items": len(waits), "occupancy": occupancy, "ave_get_wait_s": wait},
        }


def _batched(items: Iterable[tuple[str, int]], batch_size: int) -> Iterator[list[tuple[str, int]]]:
    """Lists of ``batch_size`` items in order, the last one shorter if need be."""
    items = iter(items)
    while batch := list(itertools.islice(items, batch_size)):
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
    """The loading pipeline: source -> pipe(decode) -> sink, the source yielding whole batches
    (cheaper than an ``aggregate`` stage: ``bench/decode_paths.py``). An exception out of
    ``decode_func`` stops the pipeline (``max_failures=0``) instead of dropping that batch.

    Args:
        src: ``(path, label)`` items, e.g. from :py:func:`source`.
        decode_func: From :py:func:`get_decode_func`.
        concurrency: Batches decoded at once (per process with ``decode_processes``).
        buffer_size: Decoded batches held ready for the consumer.
        report_stats_interval: Seconds between SPDL's statistics logs (-1: at each stage's end).
        stats: Collects the stage statistics; its ``interval`` then sets SPDL's.
        decode_processes: Decode in this many worker processes; ``decode_func`` must be picklable.
    """
    if not callable(decode_func):
        raise TypeError(f"decode_func={decode_func!r}: expected a function of a batch's items (get_decode_func)")
    if isinstance(src, str | bytes | os.PathLike) or not isinstance(src, Iterable):  # a list's name: its letters
        raise TypeError(f"src={src!r}: expected (path, label) items, e.g. read_file_list(path) or source(path)")
    if not _within(report_stats_interval, -math.inf):  # else a TypeError in SPDL's stage, mid-run
        raise ValueError(f"report_stats_interval={report_stats_interval!r}: expected seconds (0 or less: at the end)")
    sizes = {"batch_size": batch_size, "concurrency": concurrency, "buffer_size": buffer_size}
    for name, value in {**sizes, "num_threads": num_threads, "decode_processes": decode_processes}.items():
        if not _whole(value, 0 if name == "decode_processes" else 1, _COUNT_MAX):  # 2.5 failed in SPDL, traceback
            least = f"at least {name != 'decode_processes':d}"
            raise ValueError(f"{name}={value!r}: expected {least}, a whole number (at most {_COUNT_MAX}: a C int)")
    # Python ints for SPDL (it refuses numpy's for buffer_size).
    batch_size, concurrency, buffer_size = int(batch_size), int(concurrency), int(buffer_size)
    num_threads, decode_processes = int(num_threads), int(decode_processes)
    hooks: dict[str, Any] = {}
    _check_type("stats", stats, _PipelineStats | None, "a _PipelineStats, or None")
    if stats is not None:
        hooks = {"queue_class": stats.queue, "task_hook_factory": stats.task_hooks}
        report_stats_interval = stats.interval
    builder = PipelineBuilder().add_source(_batched(src, batch_size))
    if decode_processes:
        _check_sendable(decode_func)
        _start_resource_tracker()
        # spawn, not fork: the main process has threads (torch's, SPDL's) by the time the pool starts.
        pool = ProcessPoolExecutorConfig(
            max_workers=decode_processes, mp_context="spawn", initializer=_decode_worker_init
        )
        builder = builder.to(pool).pipe(decode_func, concurrency=concurrency, name="decode").to(MAIN_PROCESS)
    else:
        builder = builder.pipe(decode_func, concurrency=concurrency, name="decode")
    pipeline = builder.add_sink(buffer_size)
    build = functools.partial(
        pipeline.build, num_threads=num_threads, max_failures=0, report_stats_interval=report_stats_interval, **hooks
    )
    return _spawning_workers(build) if decode_processes else build()


def _spawning_workers(build: Callable[[], Pipeline]) -> Pipeline:
    """``build()``, which spawns the decode workers in this thread, each with SIGINT blocked (a thread's
    mask is inherited, as for multiprocessing's resource tracker): a Ctrl-C to the process group as one
    starts ends it at the top of this module, quietly, not with a KeyboardInterrupt traceback. Here a
    signal waits for the workers to be started: raised in Process.start, it left one reading its
    start-up data (EOFError)."""
    with _uninterrupted() as held:
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pipeline = build()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)  # a Ctrl-C it held: in held now
    if held:  # the pipeline's finalizer ends its workers
        raise RunInterrupted(held[0])
    return pipeline


def _no_main_file() -> str | None:
    """Why no spawned worker can start here, or None: it runs ``__main__`` again from its file."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)  # stdin's: "<stdin>"
    if main_file and not os.path.isfile(main_file):
        return f"a worker process runs __main__ again from its file, and there is none at {main_file!r} (stdin?)"
    return None


def _not_as_a_worker_starts(what: str) -> None:
    """RuntimeError in a spawned process still starting: it runs the main script again, and one without
    an ``if __name__ == "__main__":`` guard calls ``what`` again in each --decode-processes worker,
    which would then run the benchmark itself while the run waits for its batches until --timeout."""
    # multiprocessing's own check (_check_not_importing_main) reads this flag: no public API tells.
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        message = f"{what}() was called as a worker process started: each runs the main script again, whose "
        raise RuntimeError(message + f'top level calls {what}(); call it under `if __name__ == "__main__":`')


def _check_sendable(decode_func: Callable) -> None:
    """TypeError unless a spawned worker can run ``decode_func``: it runs ``__main__`` again from its
    file, and imports the function's module (it is pickled by name): one typed into a notebook or
    ``python -c`` is in a ``__main__`` no worker has. Else the worker fails, and SPDL waits for its
    batches: for ever without a time-out."""
    _not_as_a_worker_starts("get_pipeline")
    if why := _no_main_file():
        raise TypeError(f"decode_processes: {why}: run the script from its file, or decode_processes=0")
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    func = getattr(decode_func, "func", decode_func)  # functools.partial: its function
    source = getattr(getattr(func, "__code__", None), "co_filename", main_file)  # a class's instance: main's
    in_a_file = main_file and os.path.realpath(source) == os.path.realpath(main_file)  # a script's: run again
    if getattr(func, "__module__", None) == "__main__" and not in_a_file:
        message = f"decode_func={func!r} is defined in __main__ (a notebook, python -c), which a worker process "
        raise TypeError(message + "cannot import: define it in a module file and import it, or decode_processes=0")
    try:  # else a bare pickling error, or a pipeline failure in each worker
        pickle.dumps(decode_func)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        message = f"decode_func cannot be sent to the decode processes ({e}): get_decode_func's cannot (it holds "
        message += "its decoder); give a function of a module file that makes one in the worker, or decode_processes=0"
        raise TypeError(message) from None


def _decode_worker_died(why: str, killed: bool = True) -> RunStopped:
    """``killed``: by SIGKILL, or, at the time-out, by what is not known."""
    oom = ": killed, by the out-of-memory killer? (dmesg says)" if killed else ""
    return RunStopped(f"the loading pipeline failed: a --decode-processes worker died ({why}){oom}", "loader")


WORKER_POLL_S = 1.0  # how soon a --decode-processes worker that ended with an error stops the run


def _worker_ended(pool: Sequence[multiprocessing.Process]) -> RunStopped | None:
    """A RunStopped if a worker of ``pool`` exited with an error or was killed: SPDL would wait for
    its batches until the time-out, and one ended as it starts (a script without a main guard, the
    out-of-memory killer) sends none. One that exits cleanly is left to :py:func:`_received`."""
    if not (codes := [p.exitcode for p in pool if p.exitcode]):  # each call reaps the process if it ended
        return None
    how = f"exit status {codes[0]}; its error is above"
    if codes[0] < 0:
        how = f"killed by signal {-codes[0]} ({signal.strsignal(-codes[0])})"
    return _decode_worker_died(f"{len(codes)} of {len(pool)} gone, {how}", codes[0] == -signal.SIGKILL)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (keeper of the pool's semaphores) ignoring a hang-up,
    as it ignores SIGINT and SIGTERM: a closed terminal's SIGHUP reaches the process group, and a
    relaunched tracker prints a traceback for each semaphore it never saw. Nor does it warn of the
    semaphores it removes after an interrupt, which ends this process at once (os._exit): its job."""
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():  # only the main thread sets signal handlers:
        resource_tracker.ensure_running()  # started as it is, and before get_pipeline blocks SIGINT (it unblocks it)
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a disposition a child keeps through exec
    quiet = "ignore:resource_tracker:UserWarning"  # the tracker's -W (multiprocessing passes sys.warnoptions on)
    sys.warnoptions.append(quiet)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)
        sys.warnoptions.remove(quiet)


def _decode_worker_init() -> None:
    """In each ``--decode-processes`` worker: Ctrl-C and a hang-up are the main process's; SIGTERM
    ends it quietly (SPDL's native library, loaded first, installs glog's handler, which prints a
    stack trace); no interpreter teardown (nanobind would list SPDL's objects still alive). A worker
    whose main process died (SIGKILL, the OOM killer) ends within a second: else it lives on, holding
    its memory and the pipes of ``| tee log``, which never ends."""
    import atexit

    spdl.io.utils.get_ffmpeg_versions()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # started blocked (get_pipeline), if not unblocked yet
    atexit.register(os._exit, 0)  # runs after multiprocessing's own exit handling, before the teardown
    parent = os.getppid()

    def end_when_orphaned() -> None:  # not PR_SET_PDEATHSIG: it fires when the spawning thread ends
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=end_when_orphaned, name="orphan_watch", daemon=True).start()


@functools.cache  # one per worker process: made there, as a closure cannot be pickled to a spawned worker
def _worker_decode_func(transform: EvalTransform, max_image_bytes: int) -> _DecodeFunc:
    """The FFmpeg CPU decode function of a ``--decode-processes`` worker: bad images are left out and
    listed in ``Batch.failures`` (a skipping policy: the main process's applies)."""
    return get_decode_func("cpu", transform, "ffmpeg", BadImagePolicy(skip=True), max_image_bytes=max_image_bytes)


def _decode_in_worker(transform: EvalTransform, max_image_bytes: int, items: Sequence[tuple[str, int]]) -> _Batch:
    try:
        return _worker_decode_func(transform, max_image_bytes)(items)
    except Exception as e:  # the main process gets the text alone, whose root cause _one_line gives: this one
        if (path := getattr(e, "_while_decoding", None)) is None:
            raise
        # Not `from e`: _one_line would then give e, which names no image (its traceback shows all the same).
        raise RuntimeError(f"{type(e).__name__} while decoding {path}: {e}")  # noqa: B904


def _received(
    batches: Iterator[_Batch], device: torch.device, workers: int, others: Set[Any] = frozenset()
) -> Iterator[_Batch]:
    """Batches from the ``workers`` ``--decode-processes`` workers, copied to ``device``; the stall
    registry says while this process waits for one (a worker's images are not known here). SPDL
    waits for the batches of a worker killed as it started: at the time-out, its death is named.
    ``others``: this process's children that are not the pool's (a notebook's own)."""
    while True:
        _DECODING[-1] = ("a batch in a --decode-processes worker", time.monotonic())  # -1: no thread's ident
        try:
            batch = next(batches, None)
        except TimeoutError:
            gone = workers - len(set(multiprocessing.active_children()) - others)  # the pool's: its children
            if gone > 0:
                raise _decode_worker_died(f"{gone} of {workers} gone; SPDL waited for its batches") from None
            raise
        _DECODING[-1] = None
        if batch is None:
            return
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        yield _Batch(images, labels, batch.paths, batch.failures, batch.fallbacks, batch.decoded_by)


# --- Baseline loader: PyTorch DataLoader with PIL, for comparison on identical work ---


class _PILDataset(torch.utils.data.IterableDataset):
    """The DataLoader's batches, decoded by PIL in its workers, cut in order as the SPDL loader cuts
    them, each worker taking every n-th. A batch is ``(images, labels, paths, failures)``: uint8
    N x 3 x H x W (channels-last), int64 N x 1, and the bad images' ImageDecodeErrors."""

    def __init__(
        self, images: ImageList, transform: EvalTransform, max_bytes: int = MAX_IMAGE_MB << 20, batch_size: int = 1
    ) -> None:
        super().__init__()
        self.images, self.transform, self.max_bytes, self.batch_size = images, transform, max_bytes, batch_size

    def decode_one(self, path: str) -> Any:
        return _decode_pil(path, self.transform, _read_image_bytes(path, self.max_bytes))

    def __iter__(self) -> Iterator[tuple]:
        import numpy as np

        worker = torch.utils.data.get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker else (0, 1)
        for items in itertools.islice(_batched(self.images, self.batch_size), worker_id, None, workers):
            failures: list[ImageDecodeError] = []
            # Any policy but None lists bad images: the main process applies its own.
            images, labels, paths = _decode_items(items, self.decode_one, BadImagePolicy(skip=True), failures)
            if images:
                batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)
            else:
                batch = torch.empty((0, 3, 0, 0), dtype=torch.uint8)
            yield batch, torch.tensor(labels, dtype=torch.int64).view(-1, 1), paths, failures


_DATALOADER_DIED = "DataLoader worker"  # the start of torch's message when a worker died


def _worker_died(e: RuntimeError) -> RunStopped:
    return RunStopped(f"the DataLoader failed: {str(e).splitlines()[0].strip()}", "loader")


def _torch_loader_batches(loader: torch.utils.data.DataLoader | Iterator, device: torch.device) -> Iterator[_Batch]:
    """The DataLoader's batches on the device. TimeoutError: no batch within the DataLoader's
    ``timeout``; RunStopped (``loader``): a worker died."""
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
                _forget_workers(batches)
                raise _worker_died(e) from None
            raise
        except _WORKER_GONE as e:  # a worker died while its batch was handed over
            _forget_workers(batches)
            message = f"the DataLoader failed: a worker's connection broke ({type(e).__name__}: {e})"
            raise RunStopped(message, "loader") from None
        decoded_by = {"pil": len(paths)} if paths else {}
        yield _Batch(
            images.to(device, non_blocking=True), labels.to(device, non_blocking=True), paths, failures, 0, decoded_by
        )


def _forget_workers(batches: Iterator) -> None:
    """After a worker's death is reported: torch's SIGCHLD handler raises it again, anywhere in this
    process (in the run's clean-up too), until the workers' pids are forgotten. torch forgets them
    in ``_shutdown_workers`` only: its private calls, as no public one exists."""
    if getattr(batches, "_worker_pids_set", False):
        torch.utils.data._utils.signal_handling._remove_worker_pids(id(batches))
        batches._worker_pids_set = False


def _get_torch_loader(
    dataset: _PILDataset, num_workers: int, device: torch.device, timeout: float
) -> torch.utils.data.DataLoader:
    """A DataLoader over ``dataset``'s whole batches (no ``batch_size`` of its own), pinned on CUDA."""
    timeout = timeout if num_workers else 0  # torch refuses a timeout for an in-process loader
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        timeout=timeout,
        worker_init_fn=_quiet_worker,
    )


def _quiet_worker(worker_id: int) -> None:
    """In a DataLoader worker: a hang-up is the main process's to handle (as torch leaves it Ctrl-C);
    a hand-over broken by the main process stopping, which multiprocessing's resource sharer sends
    to ``sys.excepthook``, prints no traceback."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Batches go by file descriptor (a worker frozen by SIGSTOP after it sent one hangs the hand-over), not
    # torch's file_system sharing: its shm manager, one per worker, holds the terminal's pipe 2.4 s after a stop.
    # Ended with the main process, even one killed at once (a second signal): torch's own watch of
    # it takes 5 s, the terminal's pipe (| tee) held open meanwhile. Linux's prctl(PR_SET_PDEATHSIG).
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    default = sys.excepthook

    def hook(kind, value, traceback):
        if not issubclass(kind, ConnectionError):
            default(kind, value, traceback)

    sys.excepthook = hook


_ABANDONED: list = []  # DataLoader iterators not shut down (an interrupt, a stall): their workers killed, not joined
_RUNNING: list = []  # DataLoader iterators open: a signal forgets their workers (_interrupt)


def _end_abandoned() -> None:
    """Shut down the DataLoader iterators an earlier run in this process abandoned (a notebook's main(),
    interrupted): else each such run leaves its workers' pipes and shared memory until the process ends."""
    while _ABANDONED:
        workers = _ABANDONED.pop()
        _kill_workers(workers)
        with contextlib.suppress(Exception):  # joins the dead workers, closes the queues
            workers._shutdown_workers()


def _kill_workers(workers: Iterator) -> None:
    """SIGKILL a DataLoader iterator's workers, and reap those that end within 0.1 s (one stuck in a
    read ends when it returns): no worker is waited for, nor left running."""
    for process in getattr(workers, "_workers", ()):  # torch's private list: no public way to end them
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            process.kill()
            process.join(0.1)


@contextlib.contextmanager
def _open_torch_loader(config: _RunConfig, images: ImageList) -> Iterator[_Loader]:
    dataset = _PILDataset(images, config.transform, config.max_image_bytes, config.batch_size)
    workers = iter(_get_torch_loader(dataset, config.num_threads, config.device, config.timeout))
    loader = _Loader(_torch_loader_batches(workers, config.device))
    _RUNNING.append(workers)
    try:
        yield loader
    finally:
        _RUNNING.remove(workers)
        if loader.stop_at_once:  # no joining busy workers: killed, their queues closed by the next run
            _ABANDONED.append(workers)
            _forget_workers(workers)  # nor torch's SIGCHLD error, mid-report, for a worker the signal ended too
            _kill_workers(workers)
        elif hasattr(workers, "_shutdown_workers"):  # torch's private one: no public way to do it now
            # Not when the iterator is collected (a traceback keeps this frame): until then torch's
            # SIGCHLD handler raises anywhere for a dead worker, in here too, for a reported death.
            with contextlib.suppress(RuntimeError):
                workers._shutdown_workers()


# --- Model: normalise -> timm model -> top-1 / top-5 counts ---


class Preprocessing(torch.nn.Module):
    """uint8 ``N x 3 x H x W`` (0-255) -> normalised float32 of the same shape."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        if reasons := _channel_reasons(mean, std):  # else noise, or a broadcasting error mid-run
            raise ValueError("; ".join(reasons))
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return (x.float() / 255.0 - self.mean) / self.std


class Classification(torch.nn.Module):
    """Top-1 and top-5 hits (two 0-d int64 tensors) of logits ``N x C`` against int64 labels ``N x 1``
    or ``N`` (-1 never matches). A row with a NaN or infinite logit is no hit (topk would still rank
    it). ValueError for labels of another shape, which would broadcast."""

    def forward(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        _check_type("logits", logits, Tensor, "a tensor N x C")
        if logits.dim() != 2:  # one row of C: topk would rank the classes as if each were an image
            raise ValueError(f"logits of shape {tuple(logits.shape)}: expected N x C")
        n = logits.shape[0]
        _check_type("labels", labels, Tensor, "a tensor of class indices")  # a loader's list of them
        _check_labels_shape(labels, n)
        if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:  # 1.5: a miss
            raise ValueError(f"labels of type {labels.dtype}: expected whole numbers, class indices (int64)")
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        # int64: torch compares no uint16 or uint32 with int64 indices, and uint8's -1 would wrap.
        hits = (top == labels.view(n, 1).long()) & logits.isfinite().all(dim=-1, keepdim=True)
        return hits[:, :1].sum(), hits.sum()


class ModelBundle(torch.nn.Module):
    """Preprocessing, the timm model (in ``dtype``) and Classification, with the model's evaluation
    ``transform``. With ``batch_size``, smaller batches are padded to it (a compiled graph reused)."""

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
        for name, part in (("preprocessing", preprocessing), ("model", model), ("classification", classification)):
            _check_type(name, part, torch.nn.Module, "a torch.nn.Module")
        if batch_size is not None and not _whole(batch_size, 1):  # padded to it: -1, 1.5 or True would not pad
            raise ValueError(f"batch_size={batch_size!r}: expected a whole number from 1, or None")
        _check_type("dtype", dtype, torch.dtype, "a torch dtype, e.g. torch.float32")
        _check_type("transform", transform, EvalTransform, "an EvalTransform")
        self.preprocessing, self.model, self.classification = preprocessing, model, classification
        self.dtype, self.transform, self.batch_size = dtype, transform, batch_size

    def logits(self, images: Tensor) -> Tensor:
        """uint8 images ``N x 3 x H x W`` -> float32 logits ``N x C``, with no autograd graph. ValueError for
        another type (floats on the 0-1 scale would be divided by 255 again), images on another device than
        the model's, or a model in training mode."""
        if self.model.training:  # model.train(): benchmark checks each module once, before its first batch
            _check_eval_mode(self)
        _check_type("images", images, Tensor, "a uint8 tensor N x 3 x H x W")
        if images.dtype != torch.uint8:
            raise ValueError(f"images of type {images.dtype}: expected torch.uint8 (0-255), as the decoders give")
        if images.device != (device := _model_device(self)):  # else torch's error, said as the model's failure
            raise ValueError(f"images on {images.device}, the model on {device}: decode to the model's device")
        _check_images_shape(images)
        n = images.shape[0]
        # Padded and laid out channels-last outside inference mode, as the loader's batches are:
        # a compiled model would recompile for another layout or for an inference tensor.
        with torch.inference_mode(False):
            if self.batch_size is not None and 0 < n < self.batch_size:
                images = torch.cat([images, images.new_zeros((self.batch_size - n, *images.shape[1:]))])
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():  # called by hand: no graph (benchmark's inference mode holds already)
            return self.model(self.preprocessing(images).to(self.dtype))[:n].float()

    def forward(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """uint8 images ``N x 3 x H x W``, int64 labels ``N x 1`` -> top-1, top-5 counts."""
        return self.classification(self.logits(images), labels)


def _check_eval_mode(bundle: ModelBundle) -> None:
    # Private classes, the public ones' bases: batch norm and dropout are what training mode changes.
    changing = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.dropout._DropoutNd)
    if any(m.training for m in bundle.model.modules() if isinstance(m, changing)):
        raise ValueError("the model is in training mode: batch norm would use each batch's statistics (and change "
                         "its own), dropout drop; call model.eval() first")  # fmt: skip


def _resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """``auto`` and ``cuda`` are ``cuda:LOCAL_RANK`` (``auto``: ``cpu`` without CUDA); InputError
    for a device this machine lacks."""
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
    """The precision that suits the hardware, and why (a CPU emulates bfloat16 many times slower)."""
    if cuda_capability is not None:
        major, minor = cuda_capability
        if cuda_capability >= (8, 0):
            return torch.bfloat16, f"CUDA capability {major}.{minor} has native bfloat16"
        return torch.float16, f"CUDA capability {major}.{minor} lacks native bfloat16 (8.0 and up)"
    if cpu_bf16:
        return torch.bfloat16, "torch reports native bfloat16 on this CPU"
    return torch.float32, "this CPU lacks native bfloat16 (it would be emulated)"


def _choose_dtype(device: torch.device, requested: str = "auto") -> tuple[torch.dtype, str]:
    """The model's precision on ``device`` (a name of :py:data:`_DTYPES`, or ``auto``), and why."""
    if requested != "auto":
        if requested not in _DTYPES:  # a notebook's dtype="fp16"; the command line's choices are these
            raise ValueError(f"dtype={requested!r}: expected auto, {', '.join(_DTYPES)} or a torch dtype")
        # Private, as torch's own tests use them: no public call says whether this CPU has either natively.
        native = {
            "bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported,
            "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported,
        }
        if device.type == "cpu" and requested in native and not native[requested]():
            _LG.warning(
                "This CPU lacks native %s: it is emulated, many times slower than float32 (the FPS is).", requested
            )
        return _DTYPES[requested], "asked for"
    if device.type == "cuda":
        return _auto_dtype(torch.cuda.get_device_capability(device), False)
    return _auto_dtype(None, torch.ops.mkldnn._is_mkldnn_bf16_supported())


# What reading a file that is no checkpoint raises (text, empty, a cut zip, a refused pickle).
_TORCH_SAVE_HEADS = (b"PK\x03\x04", b"\x80")  # torch.save's first bytes: a zip archive, or a pickle
_CHECKPOINT_ERRORS = (OSError, RuntimeError, ValueError, EOFError, LookupError, AttributeError, zipfile.BadZipFile)


def _unreadable(path: Path | None, error: Exception) -> str:
    """Why a file is no checkpoint, in one line (not timm's advice of weights_only=False: it runs code).
    ``path`` None: a file timm found (pretrained weights), not looked into."""
    if isinstance(error.__cause__, pickle.UnpicklingError):
        with contextlib.suppress(*_CHECKPOINT_ERRORS):
            if path is not None and (unsafe := torch.serialization.get_unsafe_globals_in_checkpoint(path)):
                return (
                    f"it holds Python objects ({', '.join(unsafe)}), not only tensors, and is not loaded; "
                    "save the model's weights with torch.save(model.state_dict(), PATH)"
                )
        return "not a PyTorch checkpoint (neither torch.save's archive nor a pickle of tensors)"
    if isinstance(error, AttributeError):  # timm's clean_state_dict found no dict: a list, a tensor, ...
        return f"not a state dict ({error})"
    first = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines()[0] if str(error) else ""
    unpickled = isinstance(error, (LookupError, EOFError))  # from the unpickler: text gives any ('abc': IndexError)
    if len(first) <= 8 or (unpickled and path is not None and not _head(path, 4).startswith(_TORCH_SAVE_HEADS)):
        return "not a PyTorch checkpoint (neither torch.save's archive nor a pickle)"
    if "weights_only" in first:  # torch's next sentences advise weights_only=False: running the file's code
        first = first.split(". ")[0].replace("`", "")
    return f"not a PyTorch checkpoint ({type(error).__name__}: {first})"


def _head(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def _misnamed(path: Path) -> str | None:
    """Whether a checkpoint's first bytes are of the other format than its name says (timm goes by the name)."""
    head = _head(path, 9)
    torch_save = head.startswith(_TORCH_SAVE_HEADS)
    safetensors = len(head) == 9 and head[8:] == b"{"  # the header's length, then its JSON
    if path.suffix == ".safetensors" and torch_save:
        return "it is torch.save's format, named .safetensors: rename it, e.g. to .pth"
    if path.suffix != ".safetensors" and safetensors:
        return "it is a safetensors file: name it .safetensors"
    return None


def _load_checkpoint(model: torch.nn.Module, path: Path) -> None:
    """Load into ``model`` the weights timm's ``load_state_dict`` finds (a state dict, timm's training
    checkpoint, torchvision's ``{'model': ...}``, safetensors). InputError naming what does not fit."""
    import timm.models
    from safetensors import SafetensorError

    def fail(reason: str) -> InputError:
        return InputError(f"{path}: cannot load checkpoint ({reason})", "--checkpoint")

    if not path.is_file():
        raise fail("no such file" if not path.exists() else "not a regular file")
    if path.stat().st_size == 0:
        raise fail("empty file")
    try:
        with warnings.catch_warnings(action="ignore"):  # torch's on a refused pickle: the error says it
            state = timm.models.load_state_dict(str(path), use_ema=False, weights_only=True)
    except (*_CHECKPOINT_ERRORS, SafetensorError) as e:
        raise fail(_misnamed(path) or _unreadable(path, e)) from None
    ema = [k for k in ("state_dict_ema", "model_ema") if isinstance(state.get(k), dict)]
    if ema and not any(isinstance(v, Tensor) for v in state.values()):  # a training run's EMA weights alone
        _LG.info("Checkpoint %s holds only EMA weights (%r): loading them.", path, ema[0])
        state = timm.models.clean_state_dict(state[ema[0]])
    for key, value in state.items():
        if not isinstance(value, Tensor):
            raise fail(f"{key!r} is a {type(value).__name__}, not a dense tensor")
        if value.layout != torch.strided:
            raise fail(f"{key!r} is a {value.layout} tensor, not a dense tensor")
    expected = model.state_dict()
    for key, value in expected.items():
        if key not in state and not key.endswith(".num_batches_tracked"):  # BatchNorm fills that in (0)
            raise InputError(f"{path}: checkpoint lacks {key!r}, which {type(model).__name__} needs", "--checkpoint")
        if key not in state:
            continue
        if state[key].shape != value.shape:
            shapes = f"{tuple(state[key].shape)} in the checkpoint, the model expects {tuple(value.shape)}"
            raise InputError(f"{path}: {key!r} has shape {shapes}", "--checkpoint")
        if value.is_floating_point() and not state[key].is_floating_point():  # an int8 export, or complex
            kind = f"{state[key].dtype}, not floating point".removeprefix("torch.")
            raise InputError(f"{path}: {key!r} is {kind}", "--checkpoint")
    if extra := [k for k in state if k not in expected]:
        message = f"{path}: checkpoint has {len(extra)} key(s) the model lacks, first {extra[0]!r}"
        raise InputError(message, "--checkpoint")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise fail(str(e).splitlines()[-1].strip()) from None


def _create_timm_model(model_name: str, pretrained: bool) -> torch.nn.Module:
    import timm
    from huggingface_hub import constants

    config = _pretrained_config(model_name)
    _check_imagenet_head(model_name, config.get("num_classes"))
    with _offline_if_unreachable(config.get("hf_hub_id") if pretrained else None) as unreachable:
        try:
            model = timm.create_model(model_name, pretrained=pretrained)
        except OSError as e:  # the hub is out of reach and the weights are not in its cache
            if unreachable:  # (then HF_HUB_OFFLINE was not set: it is now, for this call)
                where = f"the model hub is out of reach ({unreachable})"
            elif constants.HF_HUB_OFFLINE:
                where = "HF_HUB_OFFLINE is set"
            else:  # huggingface_hub's messages run to many lines
                where = f"{type(e).__name__}: {_first_line(e)}"
            message = f"{model_name}: cannot get its pretrained weights ({where}, and they are not in its cache)"
            raise InputError(message, "--model", _WEIGHTS_ADVICE) from None
        except Exception as e:  # e.g. no pretrained weights, a corrupt cached file (SafetensorError), a bad config
            first = _first_line(e)
            if not pretrained:  # the model itself: a local-dir config naming no architecture timm has
                raise InputError(f"{model_name}: cannot build it ({type(e).__name__}: {first})", "--model") from None
            reason = f"{type(e).__name__}: {first}"
            if isinstance(e.__cause__, pickle.UnpicklingError):  # not torch's advice, weights_only=False: it runs code
                reason = _unreadable(None, e)
            message = f"{model_name}: cannot load its pretrained weights ({reason})"
            raise InputError(message, "--model", _WEIGHTS_ADVICE) from None
    _check_imagenet_head(model_name, getattr(model, "num_classes", None))
    stem = next((m for m in model.modules() if isinstance(m, torch.nn.Conv2d)), None)  # timm's stems come first
    if stem is not None and stem.in_channels != 3:  # e.g. in_chans=1 in a local-dir config's model_args
        raise InputError(f"{model_name} takes {stem.in_channels}-channel images, not RGB (3 channels)", "--model")
    return model


def _model_dtype(device: torch.device, dtype: torch.dtype | str, use_bf16: bool | None) -> torch.dtype:
    """:py:func:`get_model`'s dtype from ``dtype`` (``auto``: :py:func:`_choose_dtype`) or the design's
    ``use_bf16``; ValueError where they disagree, or for a dtype that is no floating-point one."""
    if use_bf16 is not None:
        switch = torch.bfloat16 if use_bf16 else torch.float32
        if dtype != "auto" and _DTYPES.get(dtype, dtype) != switch:  # neither silently wins
            raise ValueError(f"use_bf16={use_bf16} and dtype={dtype!r} disagree: give one of them")
        dtype = switch
    if not isinstance(dtype, torch.dtype):
        dtype = _choose_dtype(device, dtype)[0]
    if not dtype.is_floating_point:  # torch.int64: torch's own error, far from the argument
        raise ValueError(f"dtype={dtype}: expected a floating-point dtype, e.g. torch.bfloat16")
    return dtype


def get_model(
    model_name: str = DEFAULT_MODEL,
    device: torch.device | str = "cpu",
    *,
    pretrained: bool = True,
    checkpoint: Path | str | None = None,
    compile: bool | str | None = None,
    dtype: torch.dtype | str = "auto",
    use_bf16: bool | None = None,
    batch_size: int | None = None,
    transform: EvalTransform | dict | None = None,
) -> ModelBundle:
    """Build the model bundle: normalisation, a timm model in eval mode, top-k counting.

    Args:
        model_name: Any name ``timm.create_model`` accepts.
        pretrained: Load timm's pretrained weights (from the model hub or its cache).
        checkpoint: A local checkpoint to load instead; no hub access.
        compile: ``torch.compile`` the model and normalisation: True (:py:data:`COMPILE_MODE`) or a mode;
            None (the default) on a GPU, not on the CPU, as the command line.
        dtype: A torch dtype, its name, or ``auto`` (what suits the hardware).
        use_bf16: The design's switch, kept for notebooks: True is bfloat16, False float32.
        batch_size: With ``compile``, pad smaller batches to this size.
        transform: The evaluation transform, or overrides of the model's (``img_size``, ``crop_pct``,
            ``interpolation``, ``mean``, ``std``).

    Raises:
        InputError: an unknown model, weights out of reach, a checkpoint that does not fit, or a
            transform this loader does not reproduce.
        ValueError: an unknown dtype, compile mode or transform override.
    """
    _check_type("model_name", model_name, str, "a timm model's name")
    _check_type("checkpoint", checkpoint, str | os.PathLike | None, "a checkpoint file's path, or None")
    if checkpoint is not None and not os.fspath(checkpoint):  # Path("") is ".": "not a regular file"
        raise ValueError("checkpoint='': expected a checkpoint file's path, or None")
    _check_type("pretrained", pretrained, bool, "True or False")  # "no" is true
    _check_type("use_bf16", use_bf16, bool | None, "True, False or None")
    _check_type("dtype", dtype, torch.dtype | str, "a torch dtype, its name, or 'auto'")
    _check_type("transform", transform, EvalTransform | dict | None, "an EvalTransform, a dict of overrides, or None")
    device = _resolve_device(str(device))
    compile = device.type == "cuda" if compile is None else compile  # the CPU's: minutes, and a C++ compiler
    mode = COMPILE_MODE if compile is True else compile
    if compile is not False and mode not in COMPILE_MODES:  # "" too: no mode, not "not compiled"
        raise ValueError(f"compile={compile!r}: True, False or one of {', '.join(COMPILE_MODES)}")
    if batch_size is not None and not _whole(batch_size, 1, _COUNT_MAX):
        raise ValueError(f"batch_size={batch_size!r}: expected at least 1, or None (no padding); at most {_COUNT_MAX}")
    dtype = _model_dtype(device, dtype, use_bf16)
    model = _create_timm_model(model_name, pretrained and checkpoint is None)
    if checkpoint is not None:
        _load_checkpoint(model, Path(checkpoint))
    if not isinstance(transform, EvalTransform):
        transform = EvalTransform.from_model(model, transform)
    model = model.eval().to(device=device, dtype=dtype)
    preprocessing = Preprocessing(transform.mean, transform.std).to(device)
    if compile:
        model = torch.compile(model, mode=mode)
        preprocessing = torch.compile(preprocessing, mode=mode)
    else:
        batch_size = None  # padding serves a compiled graph only
    return ModelBundle(preprocessing, model, Classification(), dtype, transform, batch_size)


# --- Timed loop and its result ---


@dataclass
class RunResult:
    """What a run measured: ``classified + failed + not_reached == listed`` (``listed`` is None for
    a loader of unknown length). FPS is ``frames_timed / elapsed_s`` over the ``batches_timed``
    batches after the warm-up, or over all of them (``warmup_included``) when there were no more.

    ``decoder_fallbacks``: images a GPU decoder left to the CPU. ``not_finite``: images whose logits
    held a NaN or an infinity (never a hit). ``loader_lead``: batches the loader can hold ahead of
    the model; ``loader_min_fps``: a rate it reached in the window. ``drained_batches`` and
    ``fps_while_loading``: see :py:func:`_add_drain`. ``predictions``: one row per image classified,
    when asked for (not in :py:meth:`to_dict`), in the order the batches came (the loader's threads
    finish them out of list order: sort by ``path`` to compare two runs row by row).
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
    not_finite: int = 0
    warmup_included: bool = False
    batches_timed: int = 0
    loader_lead: int | None = None
    loader_min_fps: float | None = None
    drained_batches: int | None = None
    fps_while_loading: float | None = None
    partial: bool = False
    stop_reason: str | None = None
    failures: list[dict[str, str]] = field(default_factory=list)
    timeline: dict | None = None
    page_cache: _PageCache | None = None
    predictions: list[dict] | None = field(default=None, repr=False)

    def record_failures(self, failures: Sequence[ImageDecodeError]) -> None:
        for i, failure in enumerate(failures):  # each is read: not an AttributeError in the result's making
            _check_type(f"failures[{i}]", failure, ImageDecodeError, "an ImageDecodeError")
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
        """How much FPS can overstate a loader-bound rate, as a share (inf: the window was all
        buffered): a window of T batches that opens with ``lead`` buffered needs only T - lead from
        the loader. None when the lead is unknown, the window includes the start or timed no image."""
        if self.loader_lead is None or self.warmup_included or not self.frames_timed:
            return None
        lead = self.loader_lead  # a lead of the whole window or more: all of it buffered
        bound = math.inf if self.batches_timed <= lead else lead / (self.batches_timed - lead)
        if self.loader_min_fps:
            bound = min(bound, max(0.0, self.fps / self.loader_min_fps - 1))
        return bound

    @property
    def top1(self) -> float | None:  # None: no image classified, no accuracy (not 0 %, a 100 % error)
        return self.top1_correct / self.classified if self.classified else None

    @property
    def top5(self) -> float | None:
        return self.top5_correct / self.classified if self.classified else None

    def to_dict(self) -> dict:
        over = self.fps_max_overstatement
        return {
            **{k: v for k, v in asdict(replace(self, predictions=None)).items() if k != "predictions"},  # not copied
            "page_cache": self.page_cache.to_dict() if self.page_cache is not None else None,  # with its shares
            "not_reached": self.not_reached,
            "fps": self.fps,
            "fps_max_overstatement": None if over == math.inf else over,  # a number or null: valid JSON
            "fps_window_may_be_buffered": over == math.inf,
            "top1": self.top1,
            "top5": self.top5,
        }


class _TimingWindow:
    """The FPS window, from the end of the warm-up (or the start) to the last batch, read after the
    device's queue drains. The warm-up is the first ``warmup_batches`` batches that held images (one
    whose images all failed ran no model); with ``sync``, run before each clock start (a barrier across
    ranks), every batch counts, so that each rank's call comes at the same batch."""

    def __init__(self, device: torch.device, warmup_batches: int, sync: Callable[[], None] | None = None) -> None:
        if not _whole(warmup_batches, 0):
            raise ValueError(f"warmup_batches={warmup_batches!r}: expected a whole number of batches, 0 or more")
        self.device, self.warmup_batches = device, warmup_batches
        self.lockstep, self.sync = sync is not None, sync or (lambda: None)
        self.cuda = device.type == "cuda"
        self.batches = self.frames = self.frames_all = self.warmed = 0
        self.timed_from = 0 if warmup_batches == 0 else None  # the batches before the window, once it opened
        self.marks: list[tuple[Any, int]] = []  # (CUDA event or time.monotonic(), images) per batch
        self.sync()
        self.t_start = self.t_warm = self.clock()
        self.started_at = time.monotonic()
        self._start_mark = self._mark()

    def clock(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _mark(self) -> Any:
        """A batch's end, marked without waiting for the device (for the timeline)."""
        if not self.cuda:
            return time.monotonic()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))  # record() alone: the current device's, maybe another
        return event

    def add(self, frames: int) -> None:
        self.batches += 1
        self.frames_all += frames
        self.marks.append((self._mark(), frames))
        if self.timed_from is not None:
            self.frames += frames
            return
        self.warmed += 1 if frames or self.lockstep else 0
        if self.warmed == self.warmup_batches:
            self.sync()
            self.t_warm = self.clock()
            self.timed_from = self.batches

    @property
    def timed(self) -> bool:
        return self.timed_from is not None and self.batches > self.timed_from

    def _since_start(self, mark: Any) -> float:
        if self.cuda:
            return self._start_mark.elapsed_time(mark) / 1e3
        return mark - self._start_mark

    def close(self) -> tuple[int, float, bool]:
        """``(images timed, seconds, whether the warm-up is included)``. The window ends with its
        last batch, not when the loader ends (SPDL sees its end up to 0.1 s later) or a stop comes."""
        self.t_end = self.clock()
        # No batch: no time timed (not the whole time-out of a stall before the first).
        last = self.t_start + self._since_start(self.marks[-1][0]) if self.marks else self.t_start
        self.t_last = min(last, self.t_end)
        if self.timed:
            return self.frames, self.t_last - self.t_warm, False
        return self.frames_all, self.t_last - self.t_start, True

    def timeline(self, interval: float = 1.0) -> dict:
        """Images finished in each ``interval`` since the start, and where the FPS window lies
        (seconds from the start); after :py:meth:`close`."""
        times = [self._since_start(mark) for mark, _ in self.marks]
        counts = [frames for _, frames in self.marks]
        # As many bins as the run's span has, and one more only for a batch marked past the end
        # (a GPU's events and the host clock differ).
        last = int(max(times, default=0.0) // interval) + 1
        images = [0] * max(_bin_count(self.t_end - self.t_start, interval), last)
        for t, frames in zip(times, counts, strict=True):
            images[int(t // interval)] += frames
        return {
            "interval_s": interval,
            "images": images,
            "images_per_s": [n / interval for n in images],
            "batch_end_s": [round(t, 6) for t in times],
            "batch_images": counts,
            "warmup_end_s": (self.t_warm - self.t_start) if self.timed else 0.0,
            "window_end_s": self.t_last - self.t_start,  # the last batch's end
            "end_s": self.t_end - self.t_start,
            "started_at": self.started_at,  # time.monotonic() at the start, to align other traces
        }


def _bin_count(span_s: float, interval: float) -> int:
    return max(1, math.ceil(span_s / interval))


def _model_device(model: ModelBundle) -> torch.device:
    """Where the model runs: its first tensor's device (CPU for a model of none, as nn.Identity)."""
    return next(itertools.chain(model.buffers(), model.parameters()), torch.empty(0)).device


def _is_out_of_memory(error: BaseException | None) -> bool:
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    # torch's CPU allocator ("can't allocate memory"), FFmpeg's and the C library's ENOMEM ("Cannot ...").
    return error is not None and any(words in str(error).lower() for words in ("allocate memory", "out of memory"))


def _out_of_memory(device: torch.device, batch_size: int) -> RunStopped:
    advice = f"try --batch-size {max(1, batch_size // 2)}"
    return RunStopped(f"out of memory on {device} with a batch of {_images(batch_size)}; {advice}", "out_of_memory")


@contextlib.contextmanager
def _out_of_memory_stops(device: torch.device, batch_size: int) -> Iterator[None]:
    """Memory running out in the block stops with out_of_memory and its advice, as in the run (a
    loader's, said as the loader's failure by :py:func:`_loader_batches`, too)."""
    try:
        yield
    except (RuntimeError, MemoryError, RunStopped) as e:
        if not _is_out_of_memory(e.__cause__ if isinstance(e, RunStopped) else e):
            raise
        raise _out_of_memory(device, batch_size) from None


def _logits(model: ModelBundle, images: Tensor) -> Tensor:
    """The bundle's logits for one batch; RunStopped (out_of_memory, loader, model) if that fails."""
    try:
        with _out_of_memory_stops(images.device, images.shape[0]):
            return model.logits(images)
    except (RuntimeError, AssertionError) as e:  # AssertionError: timm's checks of the input (torch._assert)
        if _DATALOADER_DIED in str(e):  # from torch's SIGCHLD handler: _stopped_runs reports it
            raise
        first = _first_line(e)
        message = f"the model failed on a batch of {_images(images.shape[0])}: {first}"
        raise RunStopped(message, "model", "--debug shows where; --no-compile if torch.compile failed") from e


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

    The first ``warmup_batches`` batches that hold images count towards accuracy but not FPS; a run with
    no more batches than that times all of them (``warmup_included``, and a WarmupIncluded warning).

    Args:
        loader: Yields ``(images, labels)`` batches, e.g. a pipeline's iterator; ``model``: from :py:func:`get_model`.
        listed: How many images the loader was given, for the accounting.
        warmup_batches: Batches left out of the FPS window.
        policy: The bad-image policy, applied as each batch comes (a ``max_bad_percent`` needs ``listed``).
        sync_clocks: Called just before each clock start, e.g. a barrier across a torchrun job's ranks;
            then every batch counts towards the warm-up, so that each rank's call comes at the same batch.
        progress: Called after each batch with the images classified and the top-1 count (a device tensor, a copy).
        predictions: Keep each image's top-5 classes and probabilities (``result.predictions``).
        loader_lead: Batches the loader can hold ahead of the model, for ``result.fps_max_overstatement``.

    Raises:
        RunStopped: the run ended early (``kind`` says why; RunInterrupted: a signal), the partial result: ``.result``.
        ValueError: a policy's ``max_bad_percent`` without ``listed``, a count no whole number from 0, a model
            in training mode or whose weights are not of its ``dtype``, batches or labels of another shape or type.
        TypeError: an argument of the wrong kind (a model no ModelBundle), a batch no ``(images, labels)``.
    """
    listed, loader_lead = _check_run_arguments(model, policy, listed, loader_lead, predictions, [sync_clocks, progress])
    policy = policy or BadImagePolicy()
    loop = _Loop(model, RunResult(listed=listed, loader_lead=loader_lead), warmup_batches, sync_clocks, predictions)
    failures: list[ImageDecodeError] = []  # the one record of the bad images, in the order received
    with _stopped_runs(loop.result), torch.inference_mode():
        try:
            batches = iter(loader) if listed is None else _ending_once_complete(iter(loader), listed)
            for batch in _loader_batches(batches, failures):
                _record_batch(batch, failures, loop.result.classified, listed)
                policy.check(failures, listed)
                loop.classify(batch)
                if progress is not None:
                    progress(loop.result.classified, loop.top1.clone())  # a copy: no sync, and not the tally
            _check_delivered(loop.result.classified + len(failures), listed)
        finally:  # a kept stop's traceback (sys.last_value) holds this frame: not the batch and the loader
            batch = batches = loader = None
            with _uninterrupted() as held:  # a signal now (the predictions' rows take seconds) waits for it
                loop.close(failures)
            if held and sys.exc_info()[1] is not None:  # the run was stopping: the signal stops it, as ever
                raise RunInterrupted(held[0])
    if held:  # the run had ended: its result is whole, and the signal stops what would follow
        raise RunInterrupted(held[0], loop.result)
    if loop.result.warmup_included or not loop.result.frames_timed:  # the CLI's summary says it
        _warn_window(loop.window.warmed, warmup_batches, loop.result.warmup_included)
    return loop.result


class WarmupIncluded(UserWarning):
    """:py:func:`benchmark`'s FPS is no steady-state rate: its run had no more batches than its warm-up
    (FPS includes the warm-up), or no image of its window was classified (FPS measures nothing)."""


def _warn_window(batches: int, warmup_batches: int, warmup_included: bool) -> None:
    if not batches:  # a notebook's loader used up by an earlier run: not a matter of the warm-up
        message = "no batch held images: the loader yielded none (an iterator used up already?), or every image failed"
        warnings.warn(message + "; FPS and accuracy measure nothing", WarmupIncluded, stacklevel=3)
        return
    if not warmup_included:  # a 0.0 that looks like a rate, as the CLI's summary says
        message = "every image of the FPS window (the batches after the warm-up) failed: FPS measures nothing"
        warnings.warn(message, WarmupIncluded, stacklevel=3)
        return
    message = f"only {batches} batch(es) held images, not more than warmup_batches={warmup_batches}: the FPS "
    message += "window includes the warm-up (compilation, caches, thread start-up); pass more images or a smaller "
    message += "warmup_batches"
    warnings.warn(message, WarmupIncluded, stacklevel=3)


def _check_run_arguments(
    model: object, policy: BadImagePolicy | None, listed: object, lead: object, predictions: object, calls: list
) -> tuple[int | None, int | None]:
    """:py:func:`benchmark`'s arguments, each refused where it is given, not met mid-run; returns ``listed``
    and ``lead`` as ints (JSON takes no numpy int)."""
    for name, count, what in (("listed", listed, "images"), ("loader_lead", lead, "batches")):
        if count is not None and not _whole(count, 0):
            raise ValueError(f"{name}={count!r}: expected a whole number of {what}, 0 or more (or None)")
    _check_type("policy", policy, BadImagePolicy | None, "a BadImagePolicy, or None")
    if policy is not None and policy.max_bad_percent is not None and listed is None:  # else no limit at all
        raise ValueError("BadImagePolicy(max_bad_percent=...) is a share of the images listed: pass listed= too")
    _check_type("model", model, ModelBundle, "a ModelBundle (get_model makes one)")
    _check_eval_mode(model)
    weights = next((p.dtype for p in model.model.parameters() if p.is_floating_point()), model.dtype)
    if weights != model.dtype:  # torch would say only that the input's type and the weights' differ
        message = f"the model's weights are {weights}, but the bundle feeds it {model.dtype}: "
        raise ValueError(message + "build it with get_model(dtype=...) rather than converting it afterwards")
    _check_type("predictions", predictions, bool, "True or False")  # "no" is true
    for name, call in zip(("sync_clocks", "progress"), calls, strict=True):
        if call is not None and not callable(call):  # else a TypeError naming neither, after the first batch
            raise TypeError(f"{name}={call!r}: expected a function, or None")
    return tuple(None if count is None else int(count) for count in (listed, lead))


_HELD = threading.local()  # .lists, each thread's: while the main thread's is not empty, _interrupt (which
# runs there) holds a signal in its last list instead of raising; another thread's run keeps its own


@contextlib.contextmanager
def _uninterrupted() -> Iterator[list[int]]:
    """Counts updated together: a signal (the command line's, or a notebook's Ctrl-C) waits, in the list
    yielded, to the end of the block, for the caller to raise; a second ends the command line's process.
    A stop raised in the block after a signal is the signal's (RunInterrupted)."""
    held: list[int] = []
    stack = _HELD.__dict__.setdefault("lists", [])
    default = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    default = default and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if default:  # a notebook's: KeyboardInterrupt wherever the code is
        signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        stack.append(held)  # inside the try: a KeyboardInterrupt before it leaves no stale list on the stack
        yield held
    except BaseException as e:
        # A signal to the whole group (torchrun's, systemd's) ends the DataLoader's workers too: torch's
        # SIGCHLD handler raises their death in the block, after the signal it caused was held.
        if held and not isinstance(e, RunInterrupted) and _as_stop(e) is not None:
            raise RunInterrupted(held[0]) from e
        raise
    finally:
        if stack and stack[-1] is held:
            stack.pop()
        if default:
            signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _stopped_runs(result: RunResult | None) -> Iterator[None]:
    """Whatever ends the loop early leaves as a RunStopped (or RunInterrupted) carrying the partial
    result, if any; the loader's failure and time-out become RunStopped (``loader``, ``stalled``)."""
    try:
        yield
    except BaseException as e:
        error = _as_stop(e)
        if error is None:  # a bug: its own traceback
            raise
        if result is not None:  # the command line: one line
            error.result = result
            # A signal once every listed image is counted (as the loader's end is awaited): a whole run.
            if not (isinstance(error, RunInterrupted) and result.listed is not None and not result.not_reached):
                result.partial, result.stop_reason = True, str(error)
        if error is e:
            raise
        raise error from None


def _as_stop(error: BaseException) -> RunStopped | RunInterrupted | None:
    """What an error that ended the timed loop means for the run; None: none of the run's stops."""
    if isinstance(error, RunStopped | RunInterrupted):
        return error
    if isinstance(error, KeyboardInterrupt):
        return RunInterrupted(getattr(error, "signum", signal.SIGINT))
    if isinstance(error, PipelineFailure):
        return _loader_failed(error)
    if isinstance(error, RuntimeError) and _DATALOADER_DIED in str(error):
        return _worker_died(error)  # torch's SIGCHLD handler raises it wherever the loop is when a worker dies
    if not isinstance(error, TimeoutError) or not _a_loaders_time_out(error):
        return None
    stuck_on = _oldest_in_progress()
    if stuck_on is None:
        where = "the decode stage is decoding no image (waiting for the list source, or in a decode function's code)"
    else:
        where = f"the decode stage has been on {stuck_on[0]} for {stuck_on[1]:.1f} s"
    return RunStopped(f"no batch within the loader's time-out: {where}", "stalled", where=where)


def _a_loaders_time_out(error: TimeoutError) -> bool:
    """SPDL's iterator's time-out, or the DataLoader's (as _torch_loader_batches raises it), or one out of
    the loader that says nothing more: no batch in time. Another, in its own words (a notebook's own
    loader's socket), or not out of the loader (a progress callback's), is that code's error."""
    codes = []
    tb = error.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    if not str(error):
        return _loader_batches.__code__ in codes
    raised_in = codes[-1].co_filename if codes else ""
    return raised_in == __file__ or raised_in.startswith(os.path.dirname(spdl.__file__) + os.sep)


class _Loop:
    """The timed loop's state: hit counts kept on the device (reading them each batch would stall
    the GPU's queue), the timing window, and each batch's top 5 when predictions are kept."""

    def __init__(
        self,
        model: ModelBundle,
        result: RunResult,
        warmup_batches: int,
        sync_clocks: Callable[[], None] | None,
        predictions: bool,
    ) -> None:
        device = _model_device(model)
        self.model, self.result = model, result
        self.top1 = torch.zeros((), dtype=torch.int64, device=device)
        self.top5 = torch.zeros((), dtype=torch.int64, device=device)
        self.not_finite = torch.zeros((), dtype=torch.int64, device=device)
        self.unknown_labels = torch.zeros((), dtype=torch.int64, device=device)  # no class of the model's, -1 too
        self.classes = NUM_CLASSES  # the model's, from its logits
        self.window = _TimingWindow(device, warmup_batches, sync_clocks)
        self.kept: list[tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...]]] | None = [] if predictions else None

    def classify(self, batch: tuple[Tensor, Tensor]) -> None:
        images, labels = batch
        n, kept, size = int(images.shape[0]), None, self.model.transform.size
        first = n and not self.result.classified  # the first batch with an image: checked once
        if first and tuple(images.shape[-2:]) != (size, size):
            message = f"images of {images.shape[-1]} x {images.shape[-2]} for a model whose transform crops {size} x "
            warnings.warn(f"{message}{size}: decode with get_decode_func(..., model.transform)", stacklevel=3)
        if n:
            i = self.window.batches
            with spdl.io.utils.trace_event(f"iter_{i}"), torch.profiler.record_function(f"iter_{i}"):
                logits = _logits(self.model, images)
                labels = labels.to(logits.device, non_blocking=labels.device.type == "cpu")  # a DataLoader's
                b1, b5 = self.model.classification(logits, labels)
                labels = labels.long()  # a whole number's type (Classification refused another): uint8's -1 wraps
                finite = logits.isfinite().all(dim=-1)
                self.classes = logits.shape[-1]
                unknown = ((labels < 0) | (labels >= self.classes)).sum()  # read at the end: no sync
            if first and logits.shape[-1] != NUM_CLASSES:  # a notebook's own model: get_model refuses one
                message = f"the model gives {logits.shape[-1]} classes, not ImageNet-1k's {NUM_CLASSES} of the labels:"
                warnings.warn(f"{message} its top-1 and top-5 compare indices of two different sets", stacklevel=3)
            if self.kept is not None:  # on the device until the run ends
                # Ranked by the logits, as Classification counts: probabilities that underflow to 0 tie.
                classes = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
                probs = logits.softmax(dim=-1).gather(-1, classes)
                kept = (classes, probs, labels.view(-1), finite, tuple(getattr(batch, "paths", ())))
        with _uninterrupted() as held:  # the batch counted whole: never hits without their images
            if n:
                self.top1 += b1
                self.top5 += b5
                self.not_finite += finite.logical_not().sum()
                self.unknown_labels += unknown
            if kept is not None:
                self.kept.append(kept)
            self.result.classified += n
            self.result.decoder_fallbacks += getattr(batch, "fallbacks", 0)  # of the images classified, as theirs
            for backend, count in getattr(batch, "decoded_by", {}).items():
                self.result.decoder_backends[backend] = self.result.decoder_backends.get(backend, 0) + count
            self.window.add(n)  # last: the warm-up's end waits on the peers under torchrun, and raises if one stopped
        if held:
            raise RunInterrupted(held[0])

    def close(self, failures: Sequence[ImageDecodeError]) -> None:
        """Fill the result from the loop's state, whether the loop ended or stopped."""
        result, window = self.result, self.window
        result.frames_timed, result.elapsed_s, result.warmup_included = window.close()
        result.batches = window.batches
        result.batches_timed = window.batches - window.timed_from if window.timed else window.batches
        result.top1_correct, result.top5_correct = int(self.top1), int(self.top5)
        result.not_finite = int(self.not_finite)
        if unknown := int(self.unknown_labels):  # a loader's own labels (get_decode_func's are checked)
            message = f"{_images(unknown, 'label')} of the batches named no class of the model's (0-"
            warnings.warn(f"{message}{self.classes - 1}; -1: unknown): counted as misses", stacklevel=3)
        result.record_failures(failures)
        result.timeline = window.timeline()
        if self.kept is not None:
            result.predictions = [row for batch in self.kept for row in _prediction_rows(*batch)]


def _prediction_rows(
    classes: Tensor, probs: Tensor, labels: Tensor, finite: Tensor, paths: tuple[str, ...]
) -> Iterator[dict]:
    """One row per image. Logits not finite: no top 5, no probabilities (null) and correct at no
    rank, as :py:class:`Classification` counts it. A label outside the classes has no name."""
    labels = labels.tolist()
    names = paths if len(paths) == len(labels) else [None] * len(labels)
    rows = zip(names, labels, classes.tolist(), probs.tolist(), finite.tolist(), strict=True)
    for path, label, top, p, ok in rows:
        yield {
            "path": path,
            "label": label,
            "label_name": _class_name(label) if 0 <= label < NUM_CLASSES else None,
            "top5": top if ok else None,
            "top5_names": [_class_name(c) if c < NUM_CLASSES else None for c in top] if ok else None,
            "probs": [round(x, 6) for x in p] if ok else None,
            "correct1": ok and top[0] == label,
            "correct5": ok and label in top,
        }


def _loader_failed(error: BaseException) -> RunStopped:
    """What a pipeline failure was: out of memory while decoding an image, another error there
    (named), a --decode-processes worker's death, or something else (SPDL's log says what)."""
    # SPDL's "failed N times" is raised from the stage's first error, whose image _decode_items named.
    causes = [e.__cause__ or e for e in getattr(error, "exceptions", ())]
    if bad := next((e for e in causes if isinstance(e, ImageDecodeError)), None):  # a decode function with no policy
        advice = "give get_decode_func the policy given to benchmark: BadImagePolicy(skip=True) skips such images"
        return RunStopped(f"cannot decode {bad.path}: {bad.reason}", "bad_image", advice)
    cause = next((e for e in causes if hasattr(e, "_while_decoding")), None)
    if cause is None:
        if (lost := _worker_death(error)) is not None:
            return _decode_worker_died(f"{type(lost).__name__}: {lost}")
        why = _one_line(causes[0] if causes else error)
        return RunStopped(f"the loading pipeline failed: {why} (the log above says where)", "loader")
    path = cause._while_decoding
    if isinstance(cause, MemoryError):
        return RunStopped(f"out of memory while decoding {path}; fewer --num-threads need less", "loader")
    return RunStopped(f"the loading pipeline failed on {path}: {type(cause).__name__}: {cause}", "loader")


def _one_line(error: BaseException) -> str:
    """``Type: message`` on one line. A worker process's failure comes as the text of its traceback:
    its first line, and the root cause (the first exception raised ``from``) that the text holds."""
    head, *lines = f"{type(error).__name__}: {error}".splitlines()  # never empty: the type's name leads
    lines = [line.strip(" |") for line in lines]
    mark = next((i for i, line in enumerate(lines) if line.startswith("The above exception was the direct cause")), 0)
    cause = next((line for line in reversed(lines[:mark]) if line), None)
    return f"{head}, from {cause}" if cause else head


def _worker_death(error: BaseException) -> BaseException | None:
    """What says a ``--decode-processes`` worker died, in ``error``'s chain or its group's: SPDL can no
    longer read its queue (a connection refused or reset, an EOF), or its pool's monitor saw it exit
    (BrokenExecutor: "A worker process exited unexpectedly."); None if nothing does."""
    from concurrent.futures import BrokenExecutor

    died = (*_WORKER_GONE, BrokenExecutor)
    return next((e for c in (error, *getattr(error, "exceptions", ())) for e in _chain(c) if isinstance(e, died)), None)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from or during, and so on."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:  # a cycle of contexts ends
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _loader_batches(batches: Iterator, failures: list[ImageDecodeError] | None = None) -> Iterator:
    """The loader's batches (None too: the loop refuses it, naming it). An error of a notebook's own loader
    (an OSError of its dataset) as RunStopped, the partial result kept: ``bad_image`` for an
    ImageDecodeError (its image added to ``failures``), ``stalled`` for a TimeoutError, else ``loader``."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except ImageDecodeError as e:  # a decode function with no policy, called by the notebook's own loader
            if failures is not None:  # a copy: e's traceback holds the loader's frames
                failures.append(ImageDecodeError(e.path, e.reason))
            advice = "give get_decode_func a policy: BadImagePolicy(skip=True) skips such images"
            raise RunStopped(f"cannot decode {e.path}: {e.reason}", "bad_image", advice) from e
        except Exception as e:
            if _as_stop(e) is not None:  # the pipeline's failure, a stall, a dead DataLoader worker: said as such
                raise
            why = f"{type(e).__name__}: {_first_line(e)}".removesuffix(": ")
            if "\nOriginal Traceback" in str(e):  # a DataLoader worker's error: its own is the text's last line
                why = f"{[line for line in str(e).splitlines() if line.strip()][-1].strip()} ({why.rstrip('.')})"
            if isinstance(e, TimeoutError):  # its own time-out (a socket's): a stall, in its own words
                raise RunStopped(f"the loader timed out: {why}", "stalled", where=why) from e
            raise RunStopped(f"the loader failed: {why}", "loader") from e
        yield batch


def _check_delivered(delivered: int, listed: int | None, ended: bool = True) -> None:
    """The loader delivered every listed image, once (before its end: no more than listed, checked as each
    batch comes, before it is classified): else the counts would not add up."""
    if listed is None or delivered == listed or (delivered < listed and not ended):
        return
    if delivered < listed:
        message = f"the loader ended before delivering every listed image ({delivered} of {listed})"
        raise RunStopped(message, "incomplete")
    raise RunStopped(f"the loader delivered {delivered} images, more than the {listed} listed", "loader")


def _add_window_lead(result: RunResult, stats: _PipelineStats, concurrency: int) -> None:
    """The loader's measured lead (at most its capacity) and rate when the FPS window opened, in ``result``."""
    if result.loader_lead is None:
        return
    result.loader_lead = min(result.loader_lead, result.batches_timed)  # never more than the window has
    window = stats.window_lead(concurrency)
    if window is None or result.warmup_included:  # None: not measured (--decode-processes)
        return
    lead, batches_per_s = window
    result.loader_lead = min(result.loader_lead, lead)
    if batches_per_s is not None and result.batches_timed:
        result.loader_min_fps = batches_per_s * result.frames_timed / result.batches_timed


def _add_drain(result: RunResult, loader_end: float | None) -> None:
    """On the CPU: the timed batches the model began after the loader's last (``loader_end``,
    ``time.monotonic``) ran with the cores to itself, so a short list's FPS is too high.
    ``fps_while_loading`` leaves them out; None if they are over half the window or no image ran before."""
    t = result.timeline
    if loader_end is None or not result.frames_timed or result.partial:
        return
    t["loader_end_s"] = done = loader_end - t["started_at"]
    ends, images = t["batch_end_s"], t["batch_images"]
    first = len(ends) - result.batches_timed
    began = [t["warmup_end_s"], *ends[first:-1]]  # each timed batch begins as the one before it ends
    kept = sum(1 for t0 in began if t0 < done)
    result.drained_batches = result.batches_timed - kept
    timed = sum(images[first : first + kept])
    if not result.drained_batches:  # the window itself: FPS, not a rate of the timeline's rounded times
        result.fps_while_loading = result.fps
    elif kept >= result.drained_batches and timed:  # so kept >= 1; each batch ends after the window opens
        result.fps_while_loading = timed / (ends[first + kept - 1] - t["warmup_end_s"])


class _Progress:
    """Images done, images/s and running top-1: a live line on a terminal, a log line otherwise.
    The running top-1 waits for the device, so it is read only when a line is shown."""

    def __init__(self, total: int | None, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stderr
        self.live = False
        with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: no stderr at all (2>&-)
            self.live = self.stream.isatty()
        self.interval = 0.5 if self.live else 30.0
        self.started = self.last = time.perf_counter()
        self.done, self.top1_correct = 0, torch.zeros(())

    def __call__(self, done: int, top1_correct: Tensor) -> None:
        self.done, self.top1_correct = done, top1_correct
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            self._show(now)

    def _show(self, now: float) -> None:
        # The rate since the start, start-up and warm-up in it: FPS, in the summary, leaves them out.
        rate = self.done / (now - self.started)
        top1 = int(self.top1_correct) / self.done if self.done else 0.0
        text = f"{self.done}/{self.total or '?'} images classified, {rate:.0f} images/s since the start, "
        text += f"top-1 so far {_percent(top1, 2)}"
        if not self.live:
            _LG.info(text)
            return
        with contextlib.suppress(OSError, ValueError):  # a closed terminal does not stop the run
            print(f"\r{text[: self._width() - 1]}\x1b[K", end="", file=self.stream, flush=True)  # K: clear the rest

    def _width(self) -> int:
        """The terminal's columns (COLUMNS first, as shutil takes them): a wrapped line leaves a row each time."""
        with contextlib.suppress(KeyError, ValueError):
            return max(int(os.environ["COLUMNS"]), 20)
        with contextlib.suppress(OSError, ValueError, AttributeError):  # the stream's own terminal, not stdout's
            return max(os.get_terminal_size(self.stream.fileno()).columns, 20)
        return 80

    def close(self) -> None:
        """On a terminal, the line as the run ended (not as it was up to half a second before)."""
        if self.live:
            if self.done:
                with contextlib.suppress(RuntimeError):  # the device's count, after a CUDA error: the error stands
                    self._show(time.perf_counter())
            with contextlib.suppress(OSError, ValueError):
                print(file=self.stream, flush=True)


READ_BOUND_SLACK = 0.1  # a loader within 10 % of reading alone spends its time waiting for reads
IN_MEMORY = 0.95  # a read pass that began with this share of the bytes in the page cache read from memory


@dataclass
class _Breakdown:
    """The loader alone, the model alone and both together, in images/s. ``efficiency`` is end to
    end over ``min(loader, model)``. On the CPU, ``shared_fps`` = ``1 / (1/loader + 1/model)``: the
    two taking turns on the cores. ``read_*``: the listed files read alone as the loader reads them
    (MB: 10^6 bytes), a ceiling; ``read_resident``: their share in the page cache as that began."""

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
    def from_rates(
        cls,
        loader_fps: float,
        model_fps: float,
        e2e_fps: float,
        device: torch.device,
        read: tuple[float, float, float | None, bool] | None = None,
    ) -> _Breakdown:
        """``read``: ``(read_fps, read_mb_s, read_resident, read_cold)``. The ``disk`` is the bottleneck
        when the loader is slower and reading alone from the disk (resident unknown counts as the disk)
        is at most READ_BOUND_SLACK faster than the loader."""
        bound = min(loader_fps, model_fps)
        shared = 1 / (1 / loader_fps + 1 / model_fps) if loader_fps > 0 and model_fps > 0 else 0.0
        bottleneck = "loader" if loader_fps < model_fps else "model"
        if read is not None and bottleneck == "loader":
            read_fps, _, resident, _ = read
            from_disk = resident is None or resident < IN_MEMORY
            if from_disk and 0 < read_fps <= loader_fps * (1 + READ_BOUND_SLACK):  # a pass that read nothing: no
                bottleneck = "disk"
        efficiency = e2e_fps / bound if bound else 0.0
        shared_fps = shared if device.type == "cpu" else None
        return cls(loader_fps, model_fps, e2e_fps, bound, bottleneck, efficiency, shared_fps, *(read or ()))


def measure_loader(
    batches: Iterable[tuple[Tensor, Tensor]],
    device: torch.device | str,
    warmup_batches: int,
    failures: list[ImageDecodeError] | None = None,
) -> float:
    """Images/s of a loader iterated alone, in :py:func:`benchmark`'s window (a WarmupIncluded warning
    if it holds the warm-up); the bad images its batches left out added to the list ``failures``.
    A stalled or failed loader raises RunStopped, as in :py:func:`benchmark`."""
    if failures is not None and not isinstance(failures, list):  # += on a tuple would keep none of them
        raise TypeError(f"failures={failures!r}: expected a list to add the bad images to, or None")
    window = _TimingWindow(_resolve_device(str(device)), warmup_batches)  # InputError: "meta", no CUDA
    batches = iter(batches)
    with _stopped_runs(None):  # a stall, the pipeline's failure, the loader's error: RunStopped, as the run says them
        for batch in _loader_batches(batches, failures):  # (images, ...): labels, or what else it gives, unread
            if not (isinstance(batch, tuple | list) and batch and isinstance(batch[0], Tensor)):
                raise TypeError(f"a batch that is a {type(batch).__name__}: expected (images, labels), images a tensor")
            if batch[0].numel():  # 3 x H x W, one image unbatched, would count 3
                _check_images_shape(batch[0])
            window.add(batch[0].shape[0])
            if failures is not None:
                failures += getattr(batch, "failures", ())
    frames, seconds, warmup_included = window.close()
    if warmup_included or not frames:  # as benchmark
        _warn_window(window.warmed, warmup_batches, warmup_included)
    return frames / seconds if seconds > 0 else 0.0


def _read_batches(
    images: Iterable[tuple[str, int]], batch_size: int, threads: int, max_bytes: int, timeout: float
) -> Iterator[tuple[int, int, float]]:
    """Each batch's ``(images read, bytes read, time.perf_counter() when read)`` as it completes (as
    the loader's come), ``threads`` batches at once (SPDL's hand-off of each batch would cost more
    than reads from memory). A refused file counts as neither. RunStopped (``loader``) for no batch
    within ``timeout`` seconds."""
    import concurrent.futures
    import queue

    def read_batch(items: Sequence[tuple[str, int]]) -> tuple[int, int, float]:
        images = size = 0
        for path, _ in items:
            with contextlib.suppress(ImageDecodeError):
                size += len(_read_image_bytes(path, max_bytes))
                images += 1
        return images, size, time.perf_counter()

    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="read_alone")
    done: queue.SimpleQueue = queue.SimpleQueue()
    try:
        # Not in list order: waiting on a slow batch, the others' reads would be done before the
        # window opened, and timed in it at no cost (a rate 100 times too high). Each batch's
        # callback is added as it is submitted: added after the last, the batches done by then
        # would be handed on in list order.
        futures = []
        for batch in _batched(images, batch_size):
            futures.append(pool.submit(read_batch, batch))
            futures[-1].add_done_callback(done.put)
        for _ in futures:
            yield done.get(timeout=timeout).result()
    except queue.Empty:
        raise RunStopped(f"reading alone: no batch read within {timeout:g} s (--timeout)", "loader") from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung read must not hang the run


def _measure_reads(batches: Iterable[tuple[int, int, float]], warmup_batches: int) -> tuple[float, float]:
    """Images/s and MB/s (10^6 bytes) over batches of ``(images, bytes, time read)``, in
    :py:func:`benchmark`'s window (opened as the warm-up's last batch with images was read) timed by
    when the reads ended: reads go on while this thread waits for the GIL, and timed as they are
    handed on, batches read before the window opened were counted in it at no cost (1.4 M images/s)."""
    start = time.perf_counter()
    done = sorted(batches, key=lambda batch: batch[2])
    warm = [i for i, (images, _, _) in enumerate(done) if images][:warmup_batches]
    opened, t0 = 0, start  # no batch after the warm-up: it is timed too, from the start
    if warmup_batches and len(warm) == warmup_batches and warm[-1] + 1 < len(done):
        opened, t0 = warm[-1] + 1, done[warm[-1]][2]
    window = done[opened:]
    seconds = window[-1][2] - t0 if window else 0.0
    images, size = sum(b[0] for b in window), sum(b[1] for b in window)
    return (images / seconds, size / 1e6 / seconds) if seconds > 0 else (0.0, 0.0)


def _measure_model(model: ModelBundle, batch_size: int, num_batches: int, warmup_batches: int) -> float:
    device = _model_device(model)
    size = model.transform.size
    images = torch.randint(0, 256, (batch_size, size, size, 3), dtype=torch.uint8, device=device)
    images = images.permute(0, 3, 1, 2)  # the loaders' channels-last layout
    labels = torch.zeros((batch_size, 1), dtype=torch.int64, device=device)

    def batches() -> Iterator[tuple[Tensor, Tensor]]:
        for _ in range(num_batches):
            model(images, labels)
            yield images, labels

    with torch.inference_mode():  # timed as a loader's batches, each one the model's call
        return measure_loader(batches(), device, warmup_batches)


# --- Scale out with torchrun: shards, synchronised clocks, exact totals ---


def _init_distributed(device: torch.device, timeout_s: float) -> None:
    """Join the torchrun job: NCCL on CUDA, Gloo on the CPU; collectives give up after ``timeout_s``.
    RunStopped (``peer``) if the other ranks do not join within it."""
    import datetime

    import torch.distributed as dist

    kwargs = {}
    if device.type == "cuda":
        if device.index is None:  # NCCL's device_id needs an index
            device = torch.device("cuda", torch.cuda.current_device())
        # all_gather_object uses the current device, which device_id does not set: else every rank uses cuda:0
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    except RuntimeError as e:  # DistStoreError: the other ranks did not all come (or the store is gone)
        message = f"the job's other ranks did not join within {timeout_s:g} s ({str(e).splitlines()[0]})"
        raise RunStopped(message, "peer") from None
    _start_heartbeat(dist.get_rank())


def _warmup_for_all_ranks(shard: _Shard, listed: int, batch_size: int, warmup_batches: int) -> int:
    """A warm-up every rank reaches, so that the barrier at its end never waits on a finished rank; if
    the shortest shard is no longer than the warm-up, one no rank reaches (each times all its batches)."""
    fewest = math.ceil(shard.size_of(listed, shard.world_size - 1) / batch_size)
    most = math.ceil(shard.size_of(listed, 0) / batch_size)
    return warmup_batches if fewest > warmup_batches else most + 1


@contextlib.contextmanager
def _peer_stops() -> Iterator[None]:
    """A collective that fails (DistBackendError, a time-out) as RunStopped (``peer``): a peer stopped or died.
    Gloo's first sentence, less its source file: "[.../pair.cc:545] Read error ...: Connection reset by peer"."""
    try:
        yield
    except RuntimeError as e:
        first = re.sub(r"^\[[^\]]*\]\s*", "", _first_line(e)).split(". ")[0]
        raise RunStopped(f"another rank stopped ({first})", "peer", where="a collective") from None


def _barrier() -> None:
    import torch.distributed as dist

    with _peer_stops():
        dist.barrier()


_RANK_KEYS = ("rank", "classified", "fps", "elapsed_s", "device")  # a rank's entry in the results file's ranks
_COUNTS = "classified failed top1_correct top5_correct not_finite frames_timed batches batches_timed decoder_fallbacks"
_COUNTS = _COUNTS.split()


def _rank_share(result: RunResult, rank: int, device: torch.device) -> dict:
    """A rank's part of the job's totals, as JSON; of its keys, ``_RANK_KEYS`` make its entry in ``ranks``."""
    kept = (*_COUNTS, "fps", "elapsed_s", "listed", "partial", "warmup_included", "failures", "decoder_backends")
    return {"rank": rank, "device": str(device), **{k: getattr(result, k) for k in kept}}


def _job_total(shares: list[dict], listed: int | None, mine: RunResult) -> RunResult:
    """The job's result from the ranks' shares: each count summed exactly; FPS the timed images over the
    longest rank's window, of the ranks past the warm-up if any is (a stopped job's may not all be)."""
    timed = [s for s in shares if not s["warmup_included"]] or shares  # windows of one kind, never mixed
    job = RunResult(listed, elapsed_s=max(s["elapsed_s"] for s in timed), timeline=mine.timeline)  # rank 0's
    for k in _COUNTS:
        setattr(job, k, sum(s[k] for s in shares))
    job.frames_timed = sum(s["frames_timed"] for s in timed)
    job.batches_timed = sum(s["batches_timed"] for s in timed)
    job.warmup_included = timed[0]["warmup_included"]
    job.failures = [f for s in shares for f in s["failures"]]
    for s in shares:
        for backend, count in s["decoder_backends"].items():
            job.decoder_backends[backend] = job.decoder_backends.get(backend, 0) + count
    if mine.loader_lead is not None:  # every timed rank's loader holds as many batches ahead
        job.loader_lead = min(mine.loader_lead * len(timed), job.batches_timed)  # never more than the window has
    return job


def _reduce_results(result: RunResult, shard: _Shard, device: torch.device) -> tuple[RunResult, list[dict]]:
    """The job's totals on every rank, predictions and page cache too; each rank's entry in ``ranks``."""
    import torch.distributed as dist

    shares: list = [None] * shard.world_size
    extra = {"predictions": result.predictions, "page_cache": result.page_cache}  # gathered, never in the store
    dist.all_gather_object(shares, {**_rank_share(result, shard.rank, device), **extra})
    total = _job_total(shares, sum(s["listed"] for s in shares), result)
    total.partial = any(s["partial"] for s in shares)
    rows = [s["predictions"] for s in shares]
    total.predictions = None if None in rows else [row for r in rows for row in r]
    caches = [s["page_cache"] for s in shares]  # each rank examined its own shard
    total.page_cache = None if None in caches else _PageCache.total(caches)
    return total, [{k: s[k] for k in _RANK_KEYS} for s in shares]


def _agree_on_job(config: _RunConfig) -> None:
    """InputError on every rank unless all read the same list (one still being written gives each
    its own) with the same settings; RunStopped (``peer``) if a rank stopped."""
    import hashlib

    import torch.distributed as dist

    images = config.images
    digest = hashlib.sha256("\n".join(images.paths).encode("utf-8", "surrogateescape"))
    digest.update(repr(images.labels).encode())
    # May differ from node to node, or from rank to rank (each its own output files, its own clock).
    local = ("device", "decoder_backend", "dtype_reason", "images_from", "command", "cwd", "start_time")
    settings = {k: v for k, v in config.to_dict().items() if k not in local}
    seen: list = [None] * config.shard.world_size
    with _peer_stops():
        dist.all_gather_object(seen, (len(images), digest.hexdigest(), settings))
    if len({(n, h) for n, h, _ in seen}) > 1:
        counts = ", ".join(f"rank {rank}: {n}" for rank, (n, _, _) in enumerate(seen))
        raise InputError(
            f"{images.origin}: the ranks read different lists (images {counts}): was it still "
            "being written? Write the list first, then start torchrun"
        )
    differ = [k for k in settings if len({json.dumps(other[k]) for _, _, other in seen}) > 1]
    if differ:
        given = "; ".join(f"{k}: " + ", ".join(f"rank {r}: {s[k]}" for r, (_, _, s) in enumerate(seen)) for k in differ)
        raise InputError(f"the ranks were given different settings ({given}): start them with the same flags")


_STOPPED_KEY = "imagenet_classification/stopped/"  # + rank: a stopped rank's share, in the job's store
_PEER_WORD_S = 2.0  # how long a stopped rank 0 waits for the other ranks' shares
# How a rank stopped after another, or finished its shard; 0 (not here): on its own failure.
_FOLLOWED = {"interrupted": 1, "peer": 2, "finished": 3}


def _stopped_peers(shard: _Shard, wait_s: float, held: list[int]) -> list[dict]:
    """The shares the other ranks left in the job's store (finished or stopped), waiting up to ``wait_s``;
    signals held by the caller (``held``: torchrun's, as a peer died) end the wait after a whole look."""
    import torch.distributed.distributed_c10d as c10d  # the default store has no public getter

    found: dict[int, dict] = {}
    deadline = time.monotonic() + wait_s
    # RunStopped: the store froze, or is gone; what was found stands
    with contextlib.suppress(RuntimeError, ValueError, RunStopped):
        store = c10d._get_default_store()
        while len(found) < shard.world_size - 1:
            missing = set(range(shard.world_size)) - {shard.rank} - set(found)
            shares = _ask_store(lambda missing=missing: {r: _share_left(store, r) for r in missing}, wait_s)
            found.update((rank, share) for rank, share in shares.items() if share is not None)
            if held or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    return [found[rank] for rank in sorted(found)]


_ALIVE_KEY = "imagenet_classification/alive/"  # + rank: a count its heartbeat raises each second, in the job's store
_STORE_ANSWERED: list[float] = []  # time.monotonic() when the job's store last answered this rank's heartbeat


def _start_heartbeat(rank: int) -> None:
    """Raise this rank's count in the job's store each second, in a thread, while the process group
    lives: a rank that has ended waits for the others while their processes do (a rank whose loop
    stalls stops itself at --timeout, and says so in its share)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d  # the default store has no public getter

    store = c10d._get_default_store()
    _STORE_ANSWERED[:] = [time.monotonic()]  # it has just answered the process group's set-up

    def beat() -> None:
        while dist.is_initialized():
            with contextlib.suppress(Exception):  # the store gone with rank 0: the others see no word
                store.add(f"{_ALIVE_KEY}{rank}", 1)  # answered, unlike a set: a store that froze never answers
                _STORE_ANSWERED[:] = [time.monotonic()]
            time.sleep(1.0)

    threading.Thread(target=beat, name="imagenet_classification-heartbeat", daemon=True).start()


def _wait_for_peers(shard: _Shard, silent_s: float) -> None:
    """Wait for every other rank to leave its share in the job's store, as long as each still running
    is alive (its heartbeat): a healthy rank may end minutes after this one (its images larger, its
    disk slower), past any collective's time-out. RunStopped (``peer``) for a rank that stopped, or
    whose heartbeat stood still for ``silent_s`` (its process ended, or froze)."""
    import torch.distributed.distributed_c10d as c10d

    store, peers = c10d._get_default_store(), set(range(shard.world_size)) - {shard.rank}
    beats: dict[int, tuple[bytes | None, float]] = {}  # each peer's last count, and when it changed

    def look() -> dict[int, tuple[dict | None, bytes | None]]:  # each peer's share, else its heartbeat
        return {rank: (_share_left(store, rank), _left(store, f"{_ALIVE_KEY}{rank}")) for rank in peers}

    while peers:
        heard = _ask_store(look, silent_s)
        now = time.monotonic()
        for rank, (share, count) in sorted(heard.items()):
            if share is not None:
                if share["stopped_by"] != "finished" or share.get("then_by") not in (None, "peer"):  # or ended after
                    reason = share.get("then") or share["stop_reason"]
                    raise RunStopped(f"another rank stopped (rank {rank}: {reason})", "peer")
                peers.discard(rank)
                continue
            if (last := beats.get(rank)) is None or last[0] != count:
                beats[rank] = (count, now)
            elif now - last[1] > silent_s:
                raise RunStopped(f"another rank stopped (rank {rank}: no word from it for {silent_s:g} s)", "peer")
        time.sleep(0.25)


def _share_left(store: Any, rank: int) -> dict | None:
    """The share ``rank`` left in the job's store (:py:func:`_post_share`), or None: none yet."""
    share = _left(store, f"{_STOPPED_KEY}{rank}")
    return None if share is None else json.loads(share)


def _left(store: Any, key: str) -> bytes | None:
    """The value of ``key`` in the job's store, or None: none yet (a get would wait for one)."""
    return store.get(key) if store.check([key]) else None


def _post_share(share: dict, wait_s: float) -> None:
    """This rank's share, left in the job's store for a rank 0 that stops; RunStopped (see :py:func:`_ask_store`)."""
    import torch.distributed.distributed_c10d as c10d  # the default store has no public getter

    try:
        store = c10d._get_default_store()
    except (RuntimeError, ValueError):  # no process group: the ranks did not all join
        return
    _ask_store(lambda: store.set(f"{_STOPPED_KEY}{share['rank']}", json.dumps(share)), wait_s)


def _ask_store(call: Callable[[], Any], wait_s: float) -> Any:
    """``call()``, a call to the job's store, in a thread: RunStopped (``peer``, where: ``the job's store``)
    if the store has answered nothing for ``wait_s`` (counted from its last answer to the heartbeat, and at
    least 1 s of this call), or it is gone. Where torchrun's agent does not hold the store, rank 0's
    process does, and a call to it waits forever once that process froze, whatever the store's own time-out."""
    import concurrent.futures

    answer: concurrent.futures.Future = concurrent.futures.Future()

    def ask() -> None:
        try:
            answer.set_result(call())
        except BaseException as e:  # noqa: BLE001 (handed to the caller)
            answer.set_exception(e)

    threading.Thread(target=ask, name="imagenet_classification-store", daemon=True).start()
    # The store's silence is counted from its last answer to the heartbeat, not from this call: a rank that
    # froze holding it is given up on ``wait_s`` after it froze, however long this rank ran on before asking.
    silent_s = time.monotonic() - _STORE_ANSWERED[-1] if _STORE_ANSWERED else 0.0
    try:
        return answer.result(timeout=max(1.0, wait_s - silent_s))
    except concurrent.futures.TimeoutError:
        why = f"gave no answer for {wait_s:g} s"
    except RuntimeError as e:  # DistNetworkError: the process that held the store ended (rank 0, or torchrun's agent)
        why = f"is gone: {_first_line(e)}"
    raise RunStopped(f"another rank stopped (the job's store {why})", "peer", where="the job's store")


def _combine_ranks(outcome: _RunReport, config: _RunConfig) -> list[dict]:
    """The job's totals into ``outcome.result``; returns the results file's ``ranks``. Each rank leaves
    its share in the job's store as its loop ends; a stopped rank 0 totals those (a rank with no word:
    its images not reached) and names in ``outcome.job_stop_reason`` the failure that stopped the job,
    not the signal or lost peer it reached rank 0 as."""
    result, shard = outcome.result, config.shard
    share = _rank_share(result, shard.rank, config.device)
    if shard.world_size == 1:
        return [{k: share[k] for k in _RANK_KEYS}]
    share["page_cache"] = asdict(result.page_cache) if result.page_cache is not None else None  # for a stopped job
    finished = outcome.error is None  # its shard: the share it leaves says so, whatever stops the job after
    silent_s = config.timeout + _PEER_WORD_S  # a rank's (or the store's) silence that ends the wait for it
    if finished:
        try:
            with _peer_stops():  # a peer stopped before the final reduction
                finished_share = {**share, "stop_reason": None, "stopped_by": "finished"}
                _post_share(finished_share, silent_s)  # for a rank 0 that stops
                _wait_for_peers(shard, silent_s)
                outcome.result, ranks = _reduce_results(result, shard, config.device)
            return ranks
        except (RunStopped, RunInterrupted) as e:  # RunInterrupted: torchrun ends the others once one stopped
            outcome.error = e
        result.partial = True
    with _uninterrupted() as held:  # torchrun's SIGTERM as this rank stops (a peer died): the report first
        ranks = _stopped_job(outcome, config, share, finished, silent_s, held)
    if held:  # as for a signal while any run stops: the signal's status, the job's stop still named
        outcome.error = RunInterrupted(held[0])
    return ranks


def _stopped_job(
    outcome: _RunReport, config: _RunConfig, share: dict, finished: bool, silent_s: float, held: list[int]
) -> list[dict]:
    """:py:func:`_combine_ranks` for a stopped rank (or one stopped after its shard): its share left in
    the store; on rank 0, the job's totals from the shares found. ``held``: a signal, which ends the look."""
    shard, where = config.shard, getattr(outcome.error, "where", "")
    own, kind = _explain(outcome.error, config)[0], getattr(outcome.error, "kind", "interrupted")
    if finished:  # its entry stays that of a shard classified whole; what stopped it after, for rank 0 to name
        share.update(stop_reason=None, stopped_by="finished", then=own, then_by=kind)
    else:
        share.update(stop_reason=own, stopped_by=kind)
    if where != "the job's store":  # one that gave no answer: not waited for again
        with contextlib.suppress(RunStopped):
            _post_share(share, silent_s)
    if shard.rank != 0:
        return [{k: share[k] for k in _RANK_KEYS}]
    shares = [share, *_stopped_peers(shard, _PEER_WORD_S, held)]  # a rank still running: its images not reached
    result = outcome.result
    outcome.result = _job_total(shares, len(config.images), result)
    outcome.result.partial = True
    caches = [s.get("page_cache") for s in shares]  # examined before the loop: known if every rank gave word
    if len(caches) == shard.world_size and None not in caches:
        outcome.result.page_cache = _PageCache.total([_PageCache(**cache) for cache in caches])
    outcome.result.predictions = result.predictions  # rank 0's: the others' stay with them
    cause = min(shares, key=lambda s: _FOLLOWED.get(s.get("then_by") or s["stopped_by"], 0))  # a tie: this rank
    reason = cause.get("then") or cause["stop_reason"]
    outcome.job_stop_reason = own if cause is share else f"rank {cause['rank']}: {reason}"
    heard = {s["rank"] for s in shares}
    lost = [r for r in range(shard.world_size) if r not in heard]
    if cause is share and where == "a collective" and lost:  # Gloo names no rank
        ranks = f"rank {lost[0]}" if len(lost) == 1 else f"ranks {', '.join(map(str, lost))}"
        outcome.job_stop_reason = f"{ranks}: no word (died, or froze)"
    silent = "no word from it (it died, or was still running): its images counted as not reached"
    shares += [{**dict.fromkeys(_RANK_KEYS), "rank": r, "stop_reason": silent} for r in lost]
    return [{k: s[k] for k in (*_RANK_KEYS, "stop_reason")} for s in sorted(shares, key=lambda s: s["rank"])]


# --- Parity: does the loader change what the model sees and predicts? ---


@dataclass
class _Parity:
    """The loader's images against timm's validation transform through the same model, on the ``images``
    both decoded: mean absolute pixel differences (0-255), the shares whose top-1 and top-5 agree."""

    images: int
    mad_mean: float | None  # None: no image compared
    mad_max: float | None
    worst: str | None
    top1_agree: float | None
    top5_agree: float | None
    top1_loader: float | None
    top1_reference: float | None
    loader_only: int = 0  # images only one side decoded, or neither (bad images): not compared
    reference_only: int = 0
    neither: int = 0
    not_finite: int = 0  # images compared whose logits, on either side, hold a NaN or infinity: no agreement, no hit
    deep: list[str] = field(default_factory=list)  # 16-bit images compared: PIL's RGB conversion clips them
    requested: int | None = None  # --parity N: more than the list's distinct images gives fewer

    def summary(self) -> str:
        """Counts, not rounded shares: 4998 of 5000 agreeing is not "100.0 %"."""
        n, line = self.images, "Parity with timm's reference transform"
        if not n:
            line += ": no image that both decoded, nothing compared"
        else:
            shares = (self.top1_agree, self.top5_agree, self.top1_loader, self.top1_reference)
            agree1, agree5, here, there = (round((share or 0.0) * n) for share in shares)
            line += (
                f" on {_images(n)}: pixels differ by {self.mad_mean:.2f} on average (worst {self.mad_max:.2f}, 0-255); "
                f"top-1 agrees on {agree1} of {n}, top-5 on {agree5}; top-1 correct: {here} here vs {there} there"
            )
        sides = ((self.loader_only, "only the loader"), (self.reference_only, "only timm's transform"))
        for count, who in (*sides, (self.neither, "neither side")):
            line += f"; {_images(count)} {who} decoded, not compared" if count else ""
        if self.not_finite:
            line += f"; {self.not_finite} of the {n} got NaN or infinite logits, counted as disagreeing and wrong"
        if self.deep:
            line += f"; {_images(len(self.deep))} of 16 bits per sample, which timm's reference clips in its RGB "
            line += f"conversion (PIL), so that they differ there, not here (the first: {self.deep[0]})"
        if self.requested is not None and self.requested > n + self.loader_only + self.reference_only + self.neither:
            line += f"; {self.requested} asked for, the list has no more distinct images"
        return _printable(line)


def _top5(model: ModelBundle, images: list[Tensor]) -> Tensor:
    """The model's five top classes of each uint8 ``3 x S x S`` image, one batch: int64 ``N x 5`` on the
    CPU; a row of -1 where a logit is NaN or infinite (topk ranks NaN first: all-NaN rows would agree)."""
    if not images:
        return torch.empty(0, 5, dtype=torch.int64)
    with torch.inference_mode():
        logits = _logits(model, torch.stack(images).to(_model_device(model)))
        top = logits.topk(5, dim=-1).indices
        return top.masked_fill(~logits.isfinite().all(dim=-1, keepdim=True), -1).cpu()


def _measure_parity(
    items: Sequence[tuple[str, int]],
    decode: Callable[[Sequence[tuple[str, int]]], _Batch],
    model: ModelBundle,
    batch_size: int = 32,
    max_bytes: int = MAX_IMAGE_MB << 20,
) -> _Parity:
    """Decode ``items`` with the loader's ``decode`` (made with a skipping policy) and as timm's validation
    does (``Image.open(...).convert("RGB")``, its eval transform), and compare the pixels (uint8
    ``3 x S x S``) and the model's predictions on the images both decoded, a batch at a time."""
    import timm.data
    from PIL import Image

    t = model.transform
    # use_prefetcher: timm's eval transform up to the crop, then a uint8 tensor (no float, no normalisation)
    size = (3, t.size, t.size)
    timm_transform = timm.data.create_transform(
        input_size=size, crop_pct=t.crop_pct, crop_mode=t.crop_mode, interpolation=t.interpolation, use_prefetcher=True
    )
    mads: dict[str, float] = {}
    no_image = torch.empty(0, 5, dtype=torch.int64)
    tops = [(no_image, no_image, torch.empty(0, dtype=torch.int64))]  # each batch's top 5 here, there; its labels
    sides = {(True, False): "loader_only", (False, True): "reference_only", (False, False): "neither"}
    counts = dict.fromkeys(sides.values(), 0)
    deep: list[str] = []  # 16-bit grey images: PIL's RGB conversion clips them, the loader scales them
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        batch = decode(chunk)
        ours = dict(zip(batch.paths, batch[0].cpu(), strict=True))
        reference: dict[str, Tensor] = {}
        for path, _ in chunk:
            with contextlib.suppress(ImageDecodeError), _pil_errors(path):
                with Image.open(io.BytesIO(_read_image_bytes(path, max_bytes))) as image:  # the run's limits
                    _check_size(path, image.size, t)  # a 20000 x 1 strip: gigabytes resized
                    if _is_16_bit_grey(image):
                        deep.append(path)
                    reference[path] = timm_transform(image.convert("RGB"))
        for path, _ in chunk:
            if (key := (path in ours, path in reference)) in sides:
                counts[sides[key]] += 1
        paths, label_of = [path for path, _ in chunk if path in ours and path in reference], dict(chunk)
        mads.update((p, (ours[p].float() - reference[p].float()).abs().mean().item()) for p in paths)
        labels = torch.tensor([label_of[p] for p in paths], dtype=torch.int64)
        tops.append((_top5(model, [ours[p] for p in paths]), _top5(model, [reference[p] for p in paths]), labels))
    a, b, truth = (torch.cat(column) for column in zip(*tops, strict=True))
    n = len(truth)
    worst = max(mads, key=mads.__getitem__, default=None)
    finite = (a[:, 0] >= 0) & (b[:, 0] >= 0)  # -1: a NaN or infinite logit, no agreement
    agree1 = int(((a[:, 0] == b[:, 0]) & finite).sum())
    agree5 = sum(ok and set(x.tolist()) == set(y.tolist()) for x, y, ok in zip(a, b, finite.tolist(), strict=True))
    hits_ours, hits_ref = (int((top[:, 0] == truth).sum()) for top in (a, b))
    shares = [count / n if n else None for count in (agree1, agree5, hits_ours, hits_ref)]
    mad_mean = sum(mads.values()) / n if n else None
    mad_max = mads[worst] if worst is not None else None
    deep = [path for path in deep if path in mads]
    return _Parity(n, mad_mean, mad_max, worst, *shares, **counts, not_finite=n - int(finite.sum()), deep=deep)


def _run_parity(config: _RunConfig, model: ModelBundle) -> _Parity:
    """``--parity``: the run's own decode (the SPDL loader's, or for ``--loader torch`` the
    DataLoader's PIL decode, in this process), skipping bad images, against timm's."""

    def decode_like_the_dataloader(items: Sequence[tuple[str, int]]) -> _Batch:
        images = ImageList(tuple(path for path, _ in items), tuple(label for _, label in items))
        dataset = _PILDataset(images, config.transform, config.max_image_bytes, batch_size=len(items))
        return _Batch(*next(iter(dataset)))  # one batch of (images, labels, paths, failures), on the CPU

    decode = decode_like_the_dataloader
    if config.loader != "torch":
        policy = BadImagePolicy(skip=True)
        decode = get_decode_func(
            config.device, config.transform, config.decoder, policy, max_image_bytes=config.max_image_bytes
        )
    distinct = list(dict.fromkeys(config.images))  # N images: a repeat is not one more
    n = min(config.parity, len(distinct))
    if n < config.parity:
        _LG.info("--parity %d: the list has %d distinct images, all compared.", config.parity, n)
    # Spread over the list, not its first N (in a sorted list, one class): the i-th of N evenly spaced.
    items = [distinct[i * len(distinct) // n] for i in range(n)]
    parity = _measure_parity(items, decode, model, min(config.batch_size, n), config.max_image_bytes)
    parity.requested = config.parity
    return parity


# --- Tuning: the loader's settings swept, the end-to-end rate of the best ones ---

_SWEPT = ("num-threads", "batch-size", "queue-size", "decode-processes")  # the flags a sweep sets, in its order
SWEEP_TOLERANCE = 0.05  # the recommended setting is the smallest within this of the best
_SWEEP_WARMUP = 2  # batches before each timed pass
_SWEEP_LEADS = 4  # an end-to-end window holds this many times the batches its loader may hold ahead of the model


def _parse_sweep(specs: Sequence[str], defaults: dict[str, int], cpu_count: int) -> dict[str, list[int]]:
    """The values to sweep of each of ``_SWEPT`` from ``auto`` or ``NAME=V1,V2,...`` specs, the others
    kept at ``defaults``. ValueError for any other spec, a setting named twice (which values?), or a
    value not a whole number from 1 (0 for ``decode-processes``) to :py:data:`_COUNT_MAX`."""
    doubling = [2**i for i in range(cpu_count.bit_length()) if 2**i < cpu_count] + [cpu_count]
    grid = {name: [value] for name, value in defaults.items()}
    named: set[str] = set()
    for spec in specs:
        name, _, values = spec.partition("=")
        if spec == "auto":
            name, numbers = "num-threads", doubling
        elif name not in _SWEPT or not values:
            raise ValueError(f"{spec!r}: expected auto or NAME=V1,V2,... with NAME one of {', '.join(_SWEPT)}")
        else:
            try:
                numbers = sorted({int(v) for v in values.split(",")})
            except ValueError:
                raise ValueError(f"{spec!r}: the values must be whole numbers") from None
        if name in named:
            why = " (auto sets num-threads)" if "auto" in specs and name == "num-threads" else ""
            raise ValueError(f"{spec!r}: {name} is set twice{why}; give its values once")
        named.add(name)
        least = 0 if name == "decode-processes" else 1
        if numbers[0] < least or numbers[-1] > _COUNT_MAX:
            raise ValueError(f"{spec!r}: the values must be at least {least} and at most {_COUNT_MAX}")
        grid[name] = numbers
    return grid


def _stray_sweep_setting(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """Why a ``NAME=V,...`` setting of ``_SWEPT`` is not among the words right after ``--sweep``: argparse
    would take it for DATA_DIR. None if each is, or if there is no --sweep (a flag's value, as in
    ``--results-file batch-size=4.json``, or a word after ``--`` is no setting)."""
    if not any(word.partition("=")[0] == "--sweep" for word in argv):
        return None
    known = parser._option_string_actions  # private, as in _unknown_flag
    after_sweep, flag, value_next = False, "", False
    for word in itertools.takewhile(lambda w: w != "--", argv):
        if word.startswith("-"):
            after_sweep, flag = word == "--sweep", word
            value_next = "=" not in word and getattr(known.get(word), "nargs", 0) != 0 and not after_sweep
        elif value_next:  # the value of the flag before it
            value_next = False
        elif not after_sweep and word.partition("=")[0] in _SWEPT and not os.path.isdir(word):
            joined = f" ({flag} takes its one setting alone)" if flag.startswith("--sweep=") else ""
            return f"{word}: a --sweep setting after another flag{joined}; give --sweep's settings together after it"
    return None


def _unknown_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """Why the first word that looks like a flag is none of the parser's (timm's ``--batch``), with the
    nearest ones; None if every one is known. argparse would take the value after it for DATA_DIR."""
    import difflib

    known = parser._option_string_actions  # private, as argparse has no public list of its flags
    for word in itertools.takewhile(lambda w: w != "--", argv):  # after --: DATA_DIR, whatever it is
        name = word.partition("=")[0]
        if len(word) < 2 or word[0] != "-" or re.fullmatch(r"-\d.*", word) or name in known or word[:2] in known:
            continue
        near = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], n=3, cutoff=0.6)
        return f"unrecognized arguments: {name}" + (f" (did you mean {' or '.join(near)}?)" if near else "")
    return None


def _is_sweep_setting(word: str) -> bool:
    """Whether a word after ``--sweep`` is one of its settings, not DATA_DIR (whose name may hold an =)."""
    return word == "auto" or ("=" in word and not os.path.isdir(word))


def _sweep_grid(args: argparse.Namespace, listed: int) -> dict[str, list[int]]:
    """The settings ``--sweep`` asks for, thread counts and batch sizes capped at the ``listed``
    images (a thread or a batch's row without an image costs memory; a queue allocates nothing),
    worker processes at the most batches a setting has (an idle one costs an interpreter)."""
    defaults = {name: getattr(args, name.replace("-", "_")) for name in _SWEPT}
    try:
        grid = _parse_sweep(args.sweep, defaults, _usable_cpus())
    except ValueError as e:
        raise InputError(f"--sweep: {e}") from None
    if args.loader == "torch" and grid["queue-size"] != [0]:
        raise InputError("--sweep queue-size=...: --loader torch has no queue (its workers prefetch 2 batches each)")

    def cap(grid: dict[str, list[int]], names: Sequence[str], most: int, what: str) -> dict[str, list[int]]:
        capped = {**grid, **{name: sorted({min(v, most) for v in grid[name]}) for name in names}}
        if asked := ", ".join(f"{n}={','.join(map(str, grid[n]))}" for n in names if capped[n] != grid[n]):
            _LG.info("Sweep: %s capped at %s.", asked, what)
        return capped

    # A worker process (a DataLoader worker too) makes whole batches: one past the batches would idle.
    procs = ("decode-processes", "num-threads") if args.loader == "torch" else ("decode-processes",)
    per_image = [name for name in ("num-threads", "batch-size") if name not in procs]
    grid = cap(grid, per_image, listed, f"the {_images(listed)} listed")
    batches = math.ceil(listed / min(grid["batch-size"]))  # listed >= 1: _read_images refuses an empty list
    return cap(grid, procs, batches, f"the {_images(batches, 'batch')} of the smallest batch size, one a process")


@dataclass
class _SweepPoint:
    num_threads: int
    batch_size: int
    queue_size: int
    loader_fps: float
    model_fps: float
    e2e_fps: float | None = None
    decode_processes: int = 0  # worker processes of num_threads threads each; 0: threads in the main process
    short_window: bool = False  # fewer batches than the sweep times (a short list): start-up or buffered ones weigh

    @property
    def bound_fps(self) -> float:  # what end to end can reach: the slower side
        return min(self.loader_fps, self.model_fps)

    @property
    def threads(self) -> int:  # decode threads in all processes
        return self.num_threads * max(1, self.decode_processes)

    def flags(self) -> str:
        flags = f"--num-threads {self.num_threads} --batch-size {self.batch_size}"
        flags += f" --queue-size {self.queue_size}" if self.queue_size else ""  # 0: --loader torch, which has none
        return flags + (f" --decode-processes {self.decode_processes}" if self.decode_processes else "")


@dataclass
class _Sweep:
    """A sweep's points, in the order run, each timed on the same ``images``; what stopped it early;
    the images that failed to decode (the same in every setting: those of the first one)."""

    points: list[_SweepPoint]
    images: int
    stop_reason: str | None = None
    error: BaseException | None = field(default=None, repr=False)
    failures: list[ImageDecodeError] = field(default_factory=list)

    @property
    def candidates(self) -> list[_SweepPoint]:
        """The points whose bound is within ``SWEEP_TOLERANCE`` of the best, smallest first: to run end to
        end. Empty when no setting decoded an image (every bound 0)."""
        best = max((p.bound_fps for p in self.points), default=0.0)
        if not best:
            return []
        near = [p for p in self.points if p.bound_fps >= (1 - SWEEP_TOLERANCE) * best]
        return sorted(near, key=lambda p: (p.threads, p.decode_processes, p.batch_size, p.queue_size))

    @property
    def recommended(self) -> _SweepPoint | None:
        """The smallest candidate run end to end within ``SWEEP_TOLERANCE`` of the best such run (the
        bound says too little where loader and model share the cores), a short window's only where no
        window was steady; else the smallest candidate.
        None when there is no candidate, or the sweep stopped: a ranking of some settings is no answer."""
        if self.error is not None:
            return None
        measured = [p for p in self.candidates if p.e2e_fps is not None]
        if not measured:
            return self.candidates[0] if self.candidates else None
        # A short window's rate holds start-up, or the model's alone: no match for a steady one's.
        measured = [p for p in measured if not p.short_window] or measured
        best = max(p.e2e_fps for p in measured)
        return next(p for p in measured if p.e2e_fps >= (1 - SWEEP_TOLERANCE) * best)

    def to_dict(self) -> dict:
        best = self.recommended
        return {
            "images_per_setting": self.images,
            "failed": len(self.failures),
            "failures": [{"path": f.path, "reason": f.reason} for f in self.failures],
            "points": [asdict(p) for p in self.points],
            "recommended": None if best is None else asdict(best),
            "tolerance": SWEEP_TOLERANCE,
            "partial": self.error is not None,
            "stop_reason": self.stop_reason,
        }


def _run_sweep(config: _RunConfig, model: ModelBundle, grid: dict[str, list[int]]) -> _Sweep:
    """Time the loader alone at every setting of ``grid`` (:py:func:`_sweep_grid`) on the same first
    images, the model alone per batch size, then end to end the point with the best bound and the two
    smallest other candidates. What stops the sweep keeps the points measured, in ``sweep.error``."""
    busy = 2 * max(grid["num-threads"]) * max(1, *grid["decode-processes"]) + 8
    images = config.my_images.head(max(grid["batch-size"]) * (busy + _SWEEP_WARMUP))
    sweep, model_fps = _Sweep([], len(images)), {}
    try:
        for threads, batch_size, queue_size, processes in itertools.product(*(grid[name] for name in _SWEPT)):
            if batch_size not in model_fps:  # measured when first needed: a stop keeps whole points only
                with _out_of_memory_stops(config.device, batch_size):
                    model_fps[batch_size] = _measure_model(model, batch_size, 10, _SWEEP_WARMUP)
            short = math.ceil(len(images) / batch_size) < busy + _SWEEP_WARMUP
            point = _SweepPoint(threads, batch_size, queue_size, 0.0, model_fps[batch_size], None, processes, short)
            # Bad images are skipped in every setting alike: counted once, in the first.
            point.loader_fps = _sweep_timed(config, point, images, failures=None if sweep.points else sweep.failures)
            sweep.points.append(point)
            _LG.info("Sweep: %s: the loader alone %.1f images/s", point.flags(), point.loader_fps)
        ends = []
        if sweep.candidates:
            best = max(sweep.points, key=lambda p: p.bound_fps)
            ends = [best, *[p for p in sweep.candidates if p is not best][:2]]
        for point in ends:
            point.e2e_fps = _sweep_timed(config, point, images, model, sweep.failures)
            _LG.info("Sweep: %s: end to end %.1f images/s", point.flags(), point.e2e_fps)
    except (RunStopped, RunInterrupted) as e:
        sweep.error = e
    return sweep


def _sweep_timed(
    config: _RunConfig,
    point: _SweepPoint,
    images: ImageList,
    model: ModelBundle | None = None,
    failures: list[ImageDecodeError] | None = None,
) -> float:
    """Images/s of a loader of ``point``'s settings, skipping bad images (added to ``failures``, each
    once): alone over ``images``, or end to end through ``model`` over a window of ``_SWEEP_LEADS``
    times the loader's lead (``point.short_window`` if the list is shorter; on the CPU up to the
    loader's end: :py:func:`_add_drain`)."""
    sizes = {"batch_size": point.batch_size, "queue_size": point.queue_size, "decode_processes": point.decode_processes}
    settings = replace(config, num_threads=point.num_threads, **sizes)
    policy = BadImagePolicy(skip=True)
    if model is not None:  # a window of many times what the loader holds when it opens, or it times the model alone
        if config.compile:  # a short last batch padded, as in a run: else a recompilation is timed
            model.batch_size = point.batch_size
        batches = _SWEEP_WARMUP + _SWEEP_LEADS * settings.loader_lead
        images = config.my_images.head(max(len(images), point.batch_size * batches))
        short = math.ceil(len(images) / point.batch_size) < batches  # said once the pass has run
    with _open_loader(settings, images, policy) as loader:
        try:
            with _out_of_memory_stops(settings.device, settings.batch_size):
                if model is None:
                    return measure_loader(loader.batches, config.device, _SWEEP_WARMUP, failures)
                run = benchmark(loader.batches, model, listed=len(images), warmup_batches=_SWEEP_WARMUP, policy=policy)
                # It reads further down the same list than the passes before: its failures hold theirs, a
                # line each (a path listed twice fails twice, as in a run).
                if len(run.failures) > len(failures):
                    failures[:] = [ImageDecodeError(f["path"], f["reason"]) for f in run.failures]
                if config.device.type == "cpu" and loader.stats is not None:  # else a larger lead, a faster setting
                    _add_drain(run, loader.stats.loader_end())
                    short = short or (run.fps_while_loading is None and run.drained_batches)  # the model's, mostly
                point.short_window = point.short_window or bool(short)
                return run.fps if run.fps_while_loading is None else run.fps_while_loading
        except RunInterrupted:
            loader.stop_at_once = True  # not waiting for the queued batches
            raise


def _sweep_command(config: _RunConfig) -> int:
    """The sweep instead of a run: the table, then the results file and the plot, with the
    settings measured so far if the sweep stopped (marked partial). Returns the exit status."""
    decoder_check = None
    try:
        decoder_check = _check_run_decoder(config)  # a GPU decoder is checked as for a run
        sweep = _run_sweep(config, _build_model(config), config.sweep)
    except (RunStopped, RunInterrupted) as e:  # before the first setting: an empty sweep, written all the same
        sweep = _Sweep([], 0, error=e)
    sweep.failures = _in_list_order(sweep.failures, config.images, lambda failure: failure.path)
    with _uninterrupted() as held:
        status = 0
        if sweep.error is not None:
            sweep.stop_reason, status = _explain(sweep.error, config)
            _say(f"error: {sweep.stop_reason}; the settings measured before it are below (PARTIAL SWEEP)")
        payload = {"sweep": sweep.to_dict(), "config": config.to_dict(), "env": _environment(config.device)}
        if decoder_check is not None:
            payload["decoder_check"] = asdict(decoder_check)
        printed = _print_out(_print_sweep, sweep, config.command)
        title = f"Sweep of {config.model} on {config.device}, {sweep.images} images per setting"
        title += " (PARTIAL SWEEP)" if sweep.error is not None else ""
        outputs = [
            ("the results", config.results_file, lambda path: _write_sweep(path, sweep, payload)),
            ("the plot", config.plot if sweep.points else None, lambda path: _plot_sweep(sweep, path, title)),
        ]
        not_written = _write_outputs(outputs)
        if config.plot is None:
            here = "matplotlib is here" if importlib.util.find_spec("matplotlib") else PLOT_HINT
            _say(f"note: --plot PATH draws the sweep ({here})")
        elif not sweep.points:
            _say(f"note: {config.plot} not drawn: the sweep stopped before its first setting")
    lost = not_written or not printed
    return _held_status(held) or status or (EXIT_FAILED if lost else 0)  # a signal's status, as ever


def _write_sweep(path: Path, sweep: _Sweep, payload: dict) -> None:
    if not str(path).lower().endswith(".csv"):
        _write_atomically(path, json.dumps(payload, indent=2) + "\n")
        return
    best, partial = sweep.recommended, sweep.error is not None  # partial: the sweep stopped before its end
    rows = [{**asdict(p), "bound_fps": p.bound_fps, "recommended": p is best, "partial": partial} for p in sweep.points]
    columns = [*(f.name for f in dataclass_fields(_SweepPoint)), "bound_fps", "recommended", "partial"]
    _write_atomically(path, _csv_text(rows, columns))


def _print_sweep(sweep: _Sweep, command: Sequence[str], file: TextIO | None = None) -> None:
    """The sweep as a table, then the recommended setting as a command line to copy (with
    ``--skip-bad`` if images failed: the sweep skipped them, a run would stop at the first)."""
    print(f"Sweep ({sweep.images} images per setting; images/s):", file=file)
    processes = any(p.decode_processes for p in sweep.points)  # a column only when processes were swept or set
    heads = f"{'threads':>8} {'batch':>6} {'queue':>6} {'loader':>9} {'model':>9} {'end-to-end':>11}"
    print(f"{'processes':>9} " * processes + heads, file=file)
    above = [p.e2e_fps is not None and p.e2e_fps > p.bound_fps for p in sweep.points]  # marked *
    for p, mark in zip(sweep.points, above, strict=True):
        e2e = f"{p.e2e_fps:11.1f}" if p.e2e_fps is not None else f"{'-':>11}"
        row = f"{p.num_threads:>8} {p.batch_size:>6} {p.queue_size:>6} {p.loader_fps:9.1f} {p.model_fps:9.1f} {e2e}"
        print(f"{p.decode_processes:>9} " * processes + row + (" *" if mark else "") + " ~" * p.short_window, file=file)
    if any(above):
        line = "  * end to end above min(loader, model), which neither side can beat beside the other: "
        print(line + "measurement noise (a short, buffered window); the ranking near it is uncertain", file=file)
    if any(p.short_window for p in sweep.points):
        line = "  ~ too few batches in the list at this batch size for a steady window: its rates include start-up "
        line += "or batches buffered in the warm-up, or the model's alone after the loader's last batch; list more "
        print(line + "images (repeating the list is fine)", file=file)
    if failed := sweep.failures:
        first = f"the first: {failed[0].path}: {failed[0].reason}"
        were, them = ("was", "it") if len(failed) == 1 else ("were", "them")
        line = f"{_images(len(failed), 'listed image')} failed to decode and {were} skipped in every setting that read "
        line += them
        print(_printable(f"{line} ({first}; a JSON --results-file lists them all)"), file=file)
    best = sweep.recommended
    if best is not None:
        short = " (~: its rate is not firm; list more images)" if best.short_window else ""
        print(f"The smallest setting within {SWEEP_TOLERANCE:.0%} of the best: {best.flags()}{short}", file=file)
        skip = ["--skip-bad"] if sweep.failures and "--skip-bad" not in command else []
        print(f"  {shlex.join(_with_settings(command, best, skip))}", file=file)
    elif sweep.error is not None:
        print("No setting to recommend: the sweep stopped before it measured them all", file=file)
    elif sweep.points:
        print("No setting to recommend: no setting decoded an image", file=file)


def _with_settings(command: Sequence[str], point: _SweepPoint, extra: Sequence[str] = ()) -> list[str]:
    """The command line as typed, less the sweep's own flags, then ``extra`` and ``point``'s settings. A dropped flag
    takes its value with it (none if attached: ``-j8``, ``--plot=p.png``), ``--sweep`` its settings: a
    DATA_DIR after them stays, as do ``--`` and the words after it, last. The parser takes no prefixes of
    flags: none slips past by abbreviation."""
    own = {"--sweep", "--plot", "--results-file", "--workers", *(f"--{name}" for name in _SWEPT)}  # -j, -b: below
    out, value_follows, settings = [], False, False
    end = command.index("--") if "--" in command else len(command)
    for word in command[:end]:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):  # a flag, not a negative number
            name = word.split("=")[0]
            short = name[:2] in ("-j", "-b")
            dropped = name in own or short
            settings = name == "--sweep"
            attached = "=" in word or (short and len(word) > 2)
            value_follows = dropped and not settings and not attached
            if not dropped:
                out.append(word)
        elif settings and _is_sweep_setting(word):
            continue
        elif value_follows:
            value_follows = False
        else:
            settings = False
            out.append(word)
    return [*out, *extra, *point.flags().split(), *command[end:]]


def _plot_sweep(sweep: _Sweep, path: Path | str, title: str) -> bool:
    """Images/s against decode threads: the loader alone (lines), end to end (crosses), the model
    alone (dashed), the recommended setting circled, in plain numbers. False without matplotlib."""
    if (fig := _figure(11, 5)) is None:
        return False
    ax = fig.subplots()
    groups: dict[tuple, list[_SweepPoint]] = {}
    for p in sorted(sweep.points, key=lambda p: p.threads):
        groups.setdefault((p.batch_size, p.queue_size, p.decode_processes), []).append(p)
    for (batch_size, queue_size, procs), mine in sorted(groups.items()):
        where = f", batch {batch_size}, queue {queue_size}" + (f", {procs} processes" if procs else "")
        (line,) = ax.plot([p.threads for p in mine], [p.loader_fps for p in mine], "o-", label=f"loader alone{where}")
        ran = [p for p in mine if p.e2e_fps is not None]
        if ran:
            crosses = {"markersize": 10, "color": line.get_color(), "label": f"end to end{where}"}
            ax.plot([p.threads for p in ran], [p.e2e_fps for p in ran], "X", **crosses)
    threads = sorted({p.threads for p in sweep.points})
    for batch_size, model in sorted({p.batch_size: p.model_fps for p in sweep.points}.items()):
        ax.axhline(model, linestyle="--", color="grey", linewidth=1)
        rate = f"{model:,.0f}" if model >= 100 else f"{model:.3g}"
        place = {"xytext": (-4, 3), "textcoords": "offset points", "ha": "right", "va": "bottom"}
        ax.annotate(f"model alone, batch {batch_size}: {rate}/s", (threads[-1], model), **place, fontsize=8)
    if (best := sweep.recommended) is not None:
        circle = {"markersize": 18, "fillstyle": "none", "color": "black", "label": f"recommended: {best.flags()}"}
        ax.plot([best.threads], [best.e2e_fps or best.loader_fps], "o", **circle)
    ax.set_xscale("log", base=2)
    ax.set_xticks(threads, [str(t) for t in threads])
    rates = [r for p in sweep.points for r in (p.loader_fps, p.model_fps, p.e2e_fps) if r]
    if rates and max(rates) > 20 * min(rates):  # a log scale, its ticks in plain numbers (1, 2, 5 per decade)
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_yscale("log")
        ax.yaxis.set(major_locator=LogLocator(subs=(1, 2, 5)), major_formatter=ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom=0 if ax.get_yscale() == "linear" else None, top=max(rates, default=1) * 1.3)
    ax.set(xlabel="decode threads (in all processes)", ylabel="images/s")
    ax.set_title(title, parse_math=False)  # a model's folder may hold a $
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    _save(fig, ax, path)
    return True


# --- Reporting ---


@dataclass
class _RunReport:
    """A run as the results file holds it (the result summed over ranks), and what stopped it."""

    result: RunResult
    config: dict
    env: dict
    ranks: list[dict]
    breakdown: _Breakdown | None = None
    breakdown_cut: str | None = None  # why the breakdown did not finish (an interrupt)
    pipeline_stats: dict | None = None  # PipelineStats.summary()
    decoder_check: _DecoderCheck | None = None
    parity: _Parity | None = None
    world_size: int | None = None  # the job's processes (default: one per entry of ``ranks``)
    error: BaseException | None = None  # what stopped the run
    job_stop_reason: str | None = None  # under torchrun: what stopped the job, if a peer's failure did
    trace: tuple[torch.profiler.profile, BinaryIO] | None = None  # --trace: written after the summary

    @property
    def world(self) -> int:
        return self.world_size or len(self.ranks)

    def to_dict(self) -> dict:
        payload = {**self.result.to_dict(), "world_size": self.world, "ranks": self.ranks}
        payload.update(config=self.config, env=self.env)
        checks = {"breakdown": self.breakdown, "decoder_check": self.decoder_check, "parity": self.parity}
        payload.update({name: asdict(check) for name, check in checks.items() if check is not None})
        notes = {"breakdown_cut": self.breakdown_cut, "pipeline_stats": self.pipeline_stats}
        payload.update({name: note for name, note in notes.items() if note is not None})
        return payload


FPS_WINDOW_SLACK = 0.1  # the most FPS may overstate a loader-bound rate without a warning
DRAIN_SLACK = 0.03  # the most FPS may exceed its rate while the loader ran (on the CPU) without a warning
FALLBACK_WARNING = 0.05  # a share of images decoded on the CPU that makes a GPU decoder's figures mostly the CPU's
COLD_RESIDUE = 0.05  # a share of the listed bytes still in memory after eviction that makes a cold run not cold


def _print_drain(result: RunResult, file: TextIO | None) -> None:
    """The warning for a window whose last batches ran after the loader had finished (:py:func:`_add_drain`)."""
    drained, while_loading = result.drained_batches, result.fps_while_loading
    if not drained or (while_loading and result.fps <= while_loading * (1 + DRAIN_SLACK)):
        return
    line = f"WARNING: the model ran the last {drained} of the {result.batches_timed} timed batches after the loader "
    line += "had decoded its last, with the CPU's cores to itself: "
    if while_loading is None:
        line += f"FPS is {'mostly ' if drained < result.batches_timed else ''}the model's rate alone"
    else:
        line += f"FPS is {result.fps / while_loading - 1:.0%} above the {while_loading:.2f} images/s before it"
    print(line + "; list more images (repeating the list is fine)", file=file)


def _print_summary(result: RunResult, file: TextIO | None = None, pil_loader: bool = False) -> None:
    if result.warmup_included and result.frames_timed:  # none: no FPS to include it in (the lines below say why)
        print("WARNING: the batches that ran the model were not more than the warm-up: FPS includes it", file=file)
    over = result.fps_max_overstatement
    if over is not None and over > FPS_WINDOW_SLACK:
        lead = min(result.loader_lead, result.batches_timed)
        had = "all of them" if lead == result.batches_timed else f"{lead}"
        bound = "FPS may be the model's rate alone" if over == math.inf else f"FPS may be up to {over:.0%} high"
        line = f"WARNING: the FPS window holds {_images(result.batches_timed, 'batch')} and the loader may have "
        line += f"had {had} ready or under way when it opened: if the loader is the bottleneck, {bound}; "
        print(line + "list more images (repeating the list is fine)", file=file)
    _print_drain(result, file)
    ends = (result.timeline or {}).get("batch_end_s") or []  # this process's (under torchrun, rank 0's)
    opened_at_start = result.batches_timed == result.batches and len(ends) > 1 and not result.warmup_included
    if opened_at_start and ends[0] > 3 * (ends[-1] - ends[0]) / (len(ends) - 1):  # 3 times the others' mean
        first, whole = _in_seconds(ends[0]), _in_seconds(result.elapsed_s)
        line = f"WARNING: the FPS window opens at the start (no warm-up): its first batch took {first} s of its "
        print(line + f"{whole} (start-up, compilation): give --warmup-batches 1 or more", file=file)
    if result.failed and not result.classified:
        line = f"WARNING: no image was classified, {result.failed} failed to decode: FPS and accuracy measure nothing"
        print(line, file=file)
    elif result.batches_timed and not result.frames_timed:
        print("WARNING: every image of the FPS window failed to decode: FPS measures nothing", file=file)
    print(f"FPS={result.fps:.2f} ({result.frames_timed}/{_in_seconds(result.elapsed_s)})", file=file)
    skipped = f", {result.failed} failed to decode" if result.failed else ""
    for k, correct, acc in (("1", result.top1_correct, result.top1), ("5", result.top5_correct, result.top5)):
        shown = "n/a" if acc is None else _percent(acc, 2)
        print(f"Accuracy (top{k})={shown} ({correct}/{result.classified}{skipped})", file=file)
    line = f"Images: listed={result.listed} classified={result.classified} failed={result.failed} "
    print(line + f"not_reached={result.not_reached}{' (PARTIAL RUN)' if result.partial else ''}", file=file)
    if result.not_finite:
        line = f"WARNING: {result.not_finite} of the {result.classified} images classified got NaN or infinite "
        line += "logits: no prediction, counted as misses. A diverged checkpoint, --mean/--std, or an overflow "
        print(line + "in --dtype float16 or bfloat16 (try --dtype float32)?", file=file)
    if result.decoder_fallbacks:
        share = result.decoder_fallbacks / result.classified if result.classified else 1.0
        note = "; the figures are mostly the CPU's" if share > FALLBACK_WARNING else ""
        line = f"  {_images(result.decoder_fallbacks)} ({_percent(share)}) decoded on the CPU: the GPU decoder cannot "
        print(f"{line}take them{note}", file=file)
    on_gpu = {backend: n for backend, n in result.decoder_backends.items() if backend not in ("ffmpeg", "pil") and n}
    if on_gpu:
        counts = ", ".join(f"{backend} {count}" for backend, count in sorted(on_gpu.items()))
        print(f"  decoded on the GPU, per backend: {counts}", file=file)
    if (by_pil := result.decoder_backends.get("pil", 0)) and not pil_loader:  # --loader torch: PIL's by design
        share = by_pil / sum(result.decoder_backends.values())
        line = f"  {_images(by_pil)} ({_percent(share)}) decoded by PIL, not FFmpeg: not JPEG or PNG, an animated PNG, "
        print(f"{line}a CMYK or arithmetic-coded JPEG, or a small one", file=file)
    if result.page_cache is not None:
        print("\n".join(_page_cache_lines(result.page_cache)), file=file)
    for failure in result.failures[:10]:
        print(_printable(f"  failed: {failure['path']}: {failure['reason']}"), file=file)
    if len(result.failures) > 10:
        print(f"  ... and {len(result.failures) - 10} more (a JSON --results-file lists them all)", file=file)


def _page_cache_lines(cache: _PageCache) -> list[str]:
    size = f"{cache.bytes / 1e9:.2f} GB" if cache.bytes >= 1e9 else f"{cache.bytes / 1e6:.1f} MB"
    line = "Page cache: cold run (--cold-cache)" if cache.cold else "Page cache: warm run (no --cold-cache)"
    after = cache.resident_after
    if cache.resident is None or (cache.cold and after is None):
        line += f"; how much of the listed {size} was in memory is unknown (mincore could not tell)"  # README: why
    else:
        line += f"; before it, {_percent(cache.resident)} of the listed {size} was in memory"
        line += f", {_percent(after)} after eviction" if after is not None else ""
    if cache.skipped:
        line += f"; {_images(cache.skipped, 'listed path')} not examined (not opened as regular files, or over "
        line += "--max-image-mb)"
    lines = [line]
    if cache.cold and cache.repeats:
        share = cache.repeats / (cache.files + cache.skipped + cache.repeats)
        warning = f"  WARNING: {cache.repeats} listed lines ({share:.0%}) name a file listed before: those reads come "
        lines.append(warning + "from memory, not the disk (a cold run reads each file cold once)")
    if cache.cold and after is not None and after > COLD_RESIDUE:
        left = f"left {_percent(after)} of the bytes in memory"
        effect = "had no effect" if after >= (cache.resident or 0.0) else left
        warning = f"  WARNING: eviction {effect}: the file system ignores it (tmpfs, some network file systems) or "
        lines.append(warning + "those pages are not yet written to disk (run sync first); they were read from memory")
    return lines


def _print_breakdown(breakdown: _Breakdown, file: TextIO | None = None) -> None:
    b = breakdown
    rates = f"loader alone {b.loader_fps:.1f} | model alone {b.model_fps:.1f} | end-to-end {b.e2e_fps:.1f}"
    print(f"Breakdown (images/s): {rates}", file=file)
    if b.read_fps is not None:
        share = "unknown" if b.read_resident is None else _percent(b.read_resident)
        cache = f"{'cold' if b.read_cold else 'warm'}: {share} of the bytes in memory"
        line = f"Reading alone (the loader's reads, as many batches at once, no decode; {cache}): "
        print(f"{line}{b.read_fps:.1f} images/s, {b.read_mb_s:.1f} MB/s", file=file)
    noise = " (above 100 %: measurement noise, or a window too short for the loader's buffer or its drain)"
    reaches = f"end-to-end reaches {_percent(b.efficiency, 0)} of it"
    line = f"Bound {b.bound_fps:.1f} images/s, set by the {b.bottleneck}; {reaches}"
    print(line + (noise if b.efficiency > 1 else ""), file=file)
    if b.bottleneck == "disk" and b.read_fps and b.loader_fps <= b.read_fps:
        line = f"The loader runs at {_percent(b.loader_fps / b.read_fps, 0)} of reading alone: the disk sets its pace, "
        print(line + "not the decode (more threads help only while the disk has bandwidth to spare)", file=file)
    elif b.bottleneck == "disk":
        line = "Reading alone was slower than the loader, which reads the same files: the disk's rate changed "
        print(line + "between the passes (other readers, pages cached in between)", file=file)
    if b.shared_fps is not None:
        line = "On the CPU the two share the cores: taking turns, with no overlap, they would reach "
        print(f"{line}{b.shared_fps:.1f} images/s", file=file)


def _print_pipeline_stats(stats: dict, file: TextIO | None = None, timed: bool = True, start_up: bool = False) -> None:
    """SPDL's stages, and the sink queue's verdict: none without an image ``timed`` in the FPS window
    (its one get may be the stream's end, waited for: no pace of the loader's), nor over a window that
    holds the ``start_up`` (the first batch waited for the pipeline to start, not for its pace)."""
    stages = []
    for stage in stats["stages"]:
        failed = f" ({stage['failures']} failed)" if stage["failures"] else ""
        stages.append(f"{stage['name']} {stage['ave_task_s'] * 1e3:.2f} ms x {stage['tasks']}{failed}")
    if stages:
        print(f"SPDL stages (average task time x tasks): {', '.join(stages)}", file=file)
    else:  # --decode-processes: the decode stage's tasks run, and are timed, in the worker processes
        print("SPDL stages: none timed in this process (the decode stage runs in worker processes)", file=file)
    sink = stats["sink_queue"]
    if not sink["items"] or not timed:
        print("SPDL sink queue: no batch was taken in the FPS window", file=file)
        return
    verdict = "loader and model ran at about the same pace"
    if start_up:
        verdict = "no verdict, the window holds the start-up (not more batches than the warm-up)"
    elif sink["occupancy"] >= 0.8:
        verdict = "the loader ran ahead of the model"
    elif sink["occupancy"] <= 0.2:
        verdict = "the model waited for batches: loading is the bottleneck"
    line = f"SPDL sink queue: a batch was waiting {_percent(sink['occupancy'], 0)} of the time, the model waited "
    print(f"{line}{sink['ave_get_wait_s'] * 1e3:.2f} ms per batch: {verdict}", file=file)


def _print_report(report: _RunReport, file: TextIO | None = None) -> None:
    result = report.result
    _print_summary(result, file, report.config.get("loader") == "torch")
    if report.pipeline_stats is not None:
        _print_pipeline_stats(report.pipeline_stats, file, result.frames_timed > 0, result.warmup_included)
    if report.parity is not None:
        print(report.parity.summary(), file=file)
    if report.breakdown is not None:
        if result.warmup_included:  # each pass ran the run's batches: as many as the warm-up, or fewer
            print("WARNING: as FPS, each rate below includes its warm-up and start-up: list more images", file=file)
        _print_breakdown(report.breakdown, file)
        _print_loader_alone_window(report, file)
    if report.breakdown_cut is not None and not result.partial:
        cut = _printable(report.breakdown_cut)
        print(f"Breakdown cut short ({cut}): the end-to-end result above is complete", file=file)
    elif report.breakdown_cut is not None:  # the run's own stop: not_reached above says what it left
        print(f"Breakdown {_printable(report.breakdown_cut)}", file=file)


def _print_loader_alone_window(report: _RunReport, file: TextIO | None) -> None:
    """The breakdown's loader alone times as many batches as the run, its window opening with as many
    under way as it decodes at once (none waits on a model): a short window's rate counts their head start."""
    config, timed = report.config, report.result.batches_timed
    at_once = config["decode_concurrency"] * max(1, config["decode_processes"])
    if report.result.warmup_included or not timed or not config["warmup_batches"]:  # else said above, or
        return  # no warm-up: nothing under way as the window opens (it holds the start-up instead)
    over = math.inf if timed <= at_once else at_once / (timed - at_once)
    if over > FPS_WINDOW_SLACK:
        bound = "be that of batches already decoded" if over == math.inf else f"be up to {over:.0%} high"
        line = f"WARNING: the loader alone's window holds {_images(timed, 'batch')} and opened with up to {at_once} "
        print(f"{line}under way: its rate may {bound}; list more images (repeating the list is fine)", file=file)


PLOT_HINT = "pip install matplotlib (or, in the checkout, pip install '.[plot]') to draw it"


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure outside pyplot, which keeps its backend (a notebook's) and no figure of ours;
    None without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure(figsize=(width, height))


def _sliding_rate(ends: Sequence[float], images: Sequence[int], batches: int) -> list[float]:
    """Images/s at each batch's end over the last ``batches`` batches (from 0 s at first); 0 where no time passed."""
    rates = []
    for i, end in enumerate(ends):
        first = max(0, i - batches + 1)
        since = ends[first - 1] if first else 0.0
        rates.append(sum(images[first : i + 1]) / (end - since) if end > since else 0.0)
    return rates


def _plot_timeline(timeline: dict, path: Path | str, title: str = "", window_name: str = "FPS window") -> bool:
    """The run, batch by batch, as a PNG; False where matplotlib is missing. ``window_name`` names the
    dashed line's rate: under torchrun, rank 0's window (the title gives the job's FPS)."""
    if (fig := _figure(9, 4.5)) is None:
        return False
    ends, images = timeline["batch_end_s"], timeline["batch_images"]
    warm, end = timeline["warmup_end_s"], timeline["window_end_s"]
    window = min(20, max(2, len(ends) // 10))
    ax = fig.subplots()
    rates = _sliding_rate(ends, images, window)
    ax.plot(ends, rates, marker="." if len(ends) < 60 else None, label=f"images/s over the last {window} batches")
    first = next((end for end, n in zip(ends, images, strict=True) if n), 0.0)  # the first that ran the model
    if first:
        ax.axvspan(0, first, color="tab:red", alpha=0.15, label="first batch: start-up (and compilation)")
    if warm > first:
        ax.axvspan(first, warm, color="grey", alpha=0.2, label="warm-up: not in FPS")
    timed = sum(n for e, n in zip(ends, images, strict=True) if e > warm)
    if timed and end > warm:
        fps = timed / (end - warm)
        ax.hlines(fps, warm, end, color="black", linestyle="--", label=f"{window_name}: {fps:,.1f} images/s")
    ax.set(xlabel="seconds since the start", ylabel="images/s")
    ax.set_title(title or "The run, batch by batch", parse_math=False)  # a model's folder may hold a $
    ax.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0]
    if occupancy := timeline.get("sink_occupancy"):
        interval = timeline["interval_s"]
        twin = ax.twinx()
        starts = [i * interval for i in range(len(occupancy))]
        starts.append(max(timeline["end_s"], starts[-1]))  # the last bin drawn to the run's end, not left a point
        label = f"a batch waiting (share of each {interval:g} s)"
        steps = twin.step(starts, [*occupancy, occupancy[-1]], where="post", alpha=0.6, color="tab:orange", label=label)
        handles += steps
        twin.set(ylim=(0, 1.05), ylabel="share of the time a batch was waiting")
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    _save(fig, ax, path)
    return True


def _save(fig: Any, ax: Any, path: Path | str) -> None:
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    _write_atomically(path, buffer.getvalue())


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _usable_cpus() -> int:
    """The CPUs this process may run on (taskset, a container's cpuset), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _environment(device: torch.device) -> dict:
    import timm

    env = {"imagenet_classification": __version__, "python": platform.python_version(), "torch": torch.__version__}
    env.update(timm=timm.__version__, spdl=spdl.__version__)
    env["ffmpeg"] = {lib: ".".join(map(str, v)) for lib, v in spdl.io.utils.get_ffmpeg_versions().items()}
    env.update(device_name=_device_name(device), cpu_count=os.cpu_count(), cpus_usable=_usable_cpus())
    env.update(torch_threads=torch.get_num_threads(), torch_interop_threads=torch.get_num_interop_threads())
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return env


def _write_atomically(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` beside ``path`` (or its link's target), then rename it over: a reader sees the old
    file or the new one. Raises OSError, the old file left whole."""
    if (problem := _not_a_file(path)) is not None:  # the start-up check's own test (_check_output_path)
        raise OSError(errno.EINVAL, problem, str(path))
    if isinstance(data, str):  # surrogateescape: a name that is not UTF-8 is written as its bytes on disk
        data = data.encode("utf-8", "surrogateescape")
    target = Path(os.path.realpath(path))
    kept = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    # Not the target's own name and more: a name of 255 bytes, which the start-up check passed, would be too long.
    tmp = target.with_name(f".imagenet_classification.{os.urandom(6).hex()}.tmp")
    # 0o666 less the umask, as open() gives a new file; a file written over keeps its mode.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if kept is not None:
                os.fchmod(f.fileno(), kept)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # the original error, not the clean-up's
            os.unlink(tmp)
        raise


def _not_a_file(path: Path | str) -> str | None:
    """Why ``path`` cannot take an output, or None: it leads to no regular file, to /proc, or to the file
    stdin, stdout or stderr is (``--results-file /dev/stdout > run.log`` would replace run.log)."""
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


# The results row's columns after timm's: from the result, then from the config.
_ROW_RESULTS = "fps elapsed_s frames_timed listed classified failed not_reached partial warmup_included".split()
_ROW_RESULTS += ["fps_max_overstatement", "fps_window_may_be_buffered", "fps_while_loading", "drained_batches"]
_ROW_RESULTS += ["world_size", "stop_reason"]
_ROW_CONFIG = "device dtype compile weights loader decoder num_threads queue_size decode_processes".split()


def _write_results(path: Path | str, report: _RunReport) -> None:
    """Write the report as one JSON object or, for a ``.csv`` path, one row: timm's columns first,
    in its units (percent; ``infer_*`` as its benchmark.py), then ours. Atomically; raises OSError."""
    if not str(path).lower().endswith(".csv"):
        _write_atomically(path, json.dumps(report.to_dict(), indent=2) + "\n")
        return
    payload = report.to_dict()
    c = payload["config"]
    row = {"model": c["model"]}
    for k in ("top1", "top5"):  # no image classified: empty fields, not an error of 100 %
        percent = None if payload[k] is None else 100 * payload[k]
        row[k] = None if percent is None else round(percent, 4)
        row[f"{k}_err"] = None if percent is None else round(100 - percent, 4)
    row |= {"img_size": c["input_size"][-1], "crop_pct": c["crop_pct"], "interpolation": c["interpolation"]}
    shard = _Shard(0, payload["world_size"]).size_of(payload["listed"] or c["batch_size"])  # rank 0's images
    batch_size = min(c["batch_size"], shard)  # the batches run, not the flag
    row |= {"infer_samples_per_sec": round(payload["fps"], 2), "infer_batch_size": batch_size}
    row |= {key: payload[key] for key in _ROW_RESULTS}
    row |= {key: c[key] for key in _ROW_CONFIG}
    row |= {"version": payload["env"]["imagenet_classification"], "start_time": c["start_time"]}
    row["command"] = c["command"]
    _write_atomically(path, _csv_text([row], row))


def _csv_text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Rows as CSV under a header of ``columns`` (the header alone without rows); None as empty."""
    import csv

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    # csv quotes a field holding the line terminator, not one holding a carriage return, which a
    # reader takes for a line's end: a row with one (a file name's) is quoted whole.
    quoted = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    for row in rows:
        if any("\r" in value for value in row.values() if isinstance(value, str)):
            quoted.writerow(row)
        else:
            writer.writerow(row)
    return text.getvalue()


_PREDICTION_COLUMNS = ("path", "label", "label_name", "top5", "top5_names", "probs", "correct1", "correct5")


def _write_predictions(path: Path | str, rows: Sequence[dict]) -> None:
    """Write one row per classified image as JSON Lines or, for a ``.csv`` path, CSV (lists joined by
    spaces, top5_names by `` | ``, correct1/correct5 as 0 or 1). Raises OSError."""
    if not str(path).lower().endswith(".csv"):
        _write_atomically(path, "".join(json.dumps(r) + "\n" for r in rows))
        return
    flat = []
    for r in rows:
        top5, names, probs = r["top5"] or (), r["top5_names"] or (), r["probs"] or ()  # None: logits not finite
        row = {**r, "top5": " ".join(map(str, top5)), "top5_names": " | ".join(names)}
        row.update(probs=" ".join(map(str, probs)), correct1=int(r["correct1"]), correct5=int(r["correct5"]))
        flat.append(row)
    _write_atomically(path, _csv_text(flat, _PREDICTION_COLUMNS))


def _run_title(report: _RunReport) -> str:
    c, r = report.config, report.result
    compiled = f"compiled ({c['compile']})" if c["compile"] else "not compiled"
    workers = _images(c["num_threads"], "worker" if c["loader"] == "torch" else "thread")
    if c["decode_processes"]:
        workers = f"{_images(c['decode_processes'], 'process')} x {workers}"
    settings = f"batch {c['batch_size']}, {c['loader']} {c['decoder']} x {workers}"
    head = f"{c['model']} on {c['device']} ({c['dtype']}, {compiled}), {settings}"
    tail = f"FPS {r.fps:,.1f}, top-1 {'n/a' if r.top1 is None else _percent(r.top1)} of {r.classified}"
    if report.world > 1:  # the timeline is rank 0's alone
        tail += f", {report.world} ranks: the job's figures; the curve is rank 0's"
    return f"{head}\n{tail}" + (" (PARTIAL RUN)" if r.partial else "")


def _in_list_order(rows: list, images: ImageList, path: Callable[[Any], str] = lambda row: row["path"]) -> list:
    """Prediction (or failure) rows in the list's order, not the decode order: a path listed k times
    takes its k positions in turn (its rows are alike); a row whose path is not listed goes last."""
    positions: dict[str, list[int]] = {}  # each path's positions, the first last (popped first)
    for i in range(len(images) - 1, -1, -1):
        positions.setdefault(images.paths[i], []).append(i)

    def position(row: dict) -> int:
        free = positions.get(path(row))
        return free.pop() if free else len(images)

    return sorted(rows, key=position)


# --- Pre-flight: a frozen config, and every check made before the model loads ---


@dataclass(frozen=True)
class _RunConfig:
    """The run's settings, built once by :py:func:`_preflight`; each named as its flag is."""

    images: ImageList  # every rank's, read once (my_images: this rank's)
    shard: _Shard
    device: torch.device
    loader: str
    decoder: str  # ffmpeg, nvjpeg or nvdec; pil with --loader torch
    decoder_backend: str  # what implements the decoder
    transform: EvalTransform  # built once: the loader's and the model's
    batch_size: int
    num_threads: int  # decode threads (in each decode process), or DataLoader workers; at most one per image
    decode_processes: int
    queue_size: int
    model: str
    pretrained: bool
    checkpoint: Path | None
    dtype: torch.dtype
    dtype_reason: str
    compile: str | None  # torch.compile's mode; None: not compiled
    warmup_batches: int
    skip_bad: bool
    max_bad: tuple[float, bool] | None  # (value, is a percentage)
    max_image_mb: int
    timeout: float
    breakdown: bool
    parity: int
    check_decoder: int
    stats_interval: float  # -1: none
    cold_cache: bool
    results_file: Path | None
    predictions_file: Path | None
    trace: Path | None
    plot: Path | None
    sweep: dict[str, list[int]] | None  # the settings --sweep asks for; None: one run
    command: tuple[str, ...]
    cwd: str | None  # where the command ran, for its relative paths; None: the folder was gone
    start_time: str

    @functools.cached_property  # made once: each ImageList checks its labels
    def my_images(self) -> ImageList:
        return self.images.shard(self.shard.rank, self.shard.world_size)

    @property
    def max_image_bytes(self) -> int:
        return self.max_image_mb << 20

    @property
    def decode_concurrency(self) -> int:
        """Batches decoded at once: one a thread, at most NVDEC_CONCURRENCY with NVDEC."""
        return min(self.num_threads, NVDEC_CONCURRENCY) if self.decoder == "nvdec" else self.num_threads

    @property
    def at_once(self) -> int:
        """Batches the decode stage decodes at once: its concurrency in every worker process."""
        return self.decode_concurrency * max(1, self.decode_processes)

    @property
    def loader_lead(self) -> int:
        """Batches the loader can hold ahead of the model: SPDL's sink buffer, the one its sink stage
        holds, its queue and the batches decoded at once; the DataLoader's prefetch (2 per worker)."""
        if self.loader == "torch":
            return 2 * self.num_threads
        return self.queue_size + 1 + _SPDL_STAGE_BUFFER + self.at_once

    def policy(self) -> BadImagePolicy:
        if self.max_bad is None:
            return BadImagePolicy(skip=self.skip_bad)
        value, is_percent = self.max_bad
        if not is_percent:
            return BadImagePolicy(skip=True, max_bad=int(value))
        policy = BadImagePolicy(skip=True, max_bad_percent=value)
        if self.shard.world_size > 1:  # a share of the job's list, not of each rank's shard
            return BadImagePolicy(skip=True, max_bad=policy.limit(len(self.images)))
        return policy

    def to_dict(self) -> dict:
        """The settings as the results file's ``config`` holds them."""
        t, max_bad = self.transform, self.max_bad
        weights = "pretrained" if self.pretrained else "random"
        return {
            **{name: getattr(self, name) for name in _CONFIG_IN_RESULTS},
            "weights": str(self.checkpoint) if self.checkpoint else weights,
            "loader_workers": self.num_threads,  # the DataLoader's name for it
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "compile": self.compile or False,
            "input_size": [3, t.size, t.size],
            **{name: getattr(t, name) for name in ("crop_pct", "crop_mode", "interpolation")},
            "mean": list(t.mean),
            "std": list(t.std),
            # As given: :g kept 6 digits (1281167 written as 1.28117e+06, a limit rebuilt from it another).
            "max_bad": None if max_bad is None else f"{str(max_bad[0]).removesuffix('.0')}{'%' if max_bad[1] else ''}",
            "images_from": self.images.origin,
            "command": shlex.join(self.command),
        }


_CONFIG_IN_RESULTS = "model loader batch_size num_threads decode_concurrency decode_processes".split()
_CONFIG_IN_RESULTS += "queue_size decoder decoder_backend dtype_reason warmup_batches skip_bad".split()
_CONFIG_IN_RESULTS += "max_image_mb cold_cache cwd start_time".split()


def _read_images(args: argparse.Namespace) -> ImageList:
    limit = args.max_samples
    if args.trace is not None:  # --trace keeps traces small
        limit = min(limit or math.inf, args.batch_size * TRACE_BATCHES)
    labels = read_labels(args.labels) if args.labels is not None else None
    if args.data_dir is not None:
        images = scan_folder(args.data_dir, limit, labels=labels)
    else:
        images = read_file_list(args.input_flist, args.prefix, limit, labels=labels)
        if args.prefix.endswith(os.sep) and not os.path.isdir(args.prefix):
            raise InputError(f"--prefix {args.prefix}: no such folder")
        try:
            os.lstat(images.paths[0])
        except OSError as e:  # ENAMETOOLONG, EACCES: the reason, not "does not exist"
            why = "does not exist: is --prefix right?" if e.errno == errno.ENOENT else f"cannot be read ({e.strerror})"
            raise InputError(f"the first listed image, {images.paths[0]}, {why}") from None
    if args.trace is not None and limit != args.max_samples and len(images) == limit:  # 'listed' does not say why
        _LG.info("--trace: the first %d images only (%d batches), the list read no further.", limit, TRACE_BATCHES)
    return images


def _check_files(args: argparse.Namespace, images: ImageList) -> None:
    """The checkpoint, and every file the run will write: none may be a file the run reads (a listed
    image too) or another output, by real path, or (a bind mount, a hard link) by device and inode."""
    if args.checkpoint is not None and not args.checkpoint.is_file():  # before the model is built
        what = "no such file" if not args.checkpoint.exists() else "not a regular file"
        raise InputError(f"--checkpoint {args.checkpoint}: {what}")
    outputs = [("--results-file", args.results_file), ("--predictions-file", args.predictions_file)]
    outputs.append(("--plot", args.plot))
    if args.trace is not None:
        if args.trace.name in ("", ".", "..") or str(args.trace) == "-":  # PATH itself may be a folder: unwritten
            _check_output_path("--trace", args.trace)  # its refusal of these
        outputs += [("--trace", Path(f"{args.trace}{suffix}")) for suffix in (".json", ".pftrace")]
    if all(path is None for _, path in outputs):  # nothing written: no input to look up (/proc/self/maps)
        return
    read = [args.input_flist, args.labels, args.checkpoint, CLASS_TSV, __file__, Path(sys.prefix, "pyvenv.cfg")]
    read += _mapped_files()
    source, _, folder = args.model.partition(":")
    if source == "local-dir" and os.path.isdir(folder):  # its config, and any file timm may take for weights
        weights = (".safetensors", ".pth", ".pth.tar", ".bin")  # timm's checkpoint suffixes (_hub._EXT_PRIORITY)
        read += [e.path for e in os.scandir(folder) if e.name == "config.json" or e.name.endswith(weights)]
    input_ids = {_file_id(p) for p in read if p and str(p) != "-"} - {None}  # those there: one not there is none
    protected = _protected_folders()
    seen: set[str] = set()
    links: list[str] | None = None
    every: Sequence[str] = ()
    for flag, path in outputs:
        if path is None:
            continue
        target = _check_output_path(flag, path)
        named = (target, os.path.abspath(path))  # by the name given too: .venv/bin/python leads out of the venv
        for folder, what in protected:
            if any(os.path.commonpath([folder, p]) == folder for p in named):
                raise InputError(f"{flag} {path}: that is inside {folder}, {what}")
        listed, target_id = False, _file_id(target)  # None: not there yet, so no input nor listed image
        if target_id is not None and target_id not in input_ids:
            if links is None:  # a link's target may have any name: an lstat per listed image, once
                every = _every_listed_path(args, images)
                links = [p for p in every if os.path.islink(p)]
            # Otherwise a path's real one ends in its own name: only those of the target's name can lead there.
            name = os.path.basename(target)
            named = (p for p in every if os.path.basename(p) == name)
            code = (m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None))  # what runs here
            listed = any(_file_id(p) == target_id for p in itertools.chain(named, links, code))
        if target in seen or target_id in input_ids or listed:
            why = "that file is one of the run's inputs or outputs; writing would replace it"
            raise InputError(f"{flag} {path}: {why}")
        _check_not_scanned(flag, path, target, args.data_dir)
        seen.add(target)
        if target_id is not None:  # nor may another output of this run be it
            input_ids.add(target_id)
    if args.predictions_file is not None and not str(args.predictions_file).lower().endswith((".csv", ".jsonl")):
        raise InputError(f"--predictions-file {args.predictions_file}: the name must end in .csv or .jsonl")
    if args.plot is not None and not str(args.plot).lower().endswith(".png"):
        raise InputError(f"--plot {args.plot}: the name must end in .png")
    csv_row = args.results_file is not None and str(args.results_file).lower().endswith(".csv")
    if csv_row and (lost := [f"--{flag}" for flag in ("breakdown", "parity") if getattr(args, flag)]):
        note = "--results-file %s: a CSV row holds no %s figures (a .json name writes them)."
        _LG.warning(note, args.results_file, " and ".join(lost))


def _check_not_scanned(flag: str, path: Path, target: str, data_dir: str | None) -> None:
    """No image file written inside --data-dir: its next scan would count it (a PNG plot classified as
    a tabby cat, the next run's denominator one more)."""
    scanned = os.path.realpath(data_dir) if data_dir is not None else None
    if scanned and path.name.lower().endswith(IMAGE_EXTENSIONS) and os.path.commonpath([scanned, target]) == scanned:
        raise InputError(f"{flag} {path}: that is inside --data-dir {data_dir}, whose next scan would count it")


def _file_id(path: str | os.PathLike) -> tuple[int, int] | None:
    """A file's (device, inode): one file however it is reached; None if there is none there."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _every_listed_path(args: argparse.Namespace, images: ImageList) -> Sequence[str]:
    """Every path the list or folder names, past the cut too (--max-samples, --trace): the run reads
    only the first ones, but no output may replace an image the user listed. The list is read again
    to its end or its first bad line; standard input, read once, gives those read."""
    if args.max_samples is None and args.trace is None:
        return images.paths
    every = list(images.paths)
    try:
        if args.data_dir is not None:
            every += _image_files(str(args.data_dir))
        elif str(args.input_flist) != "-" and not stat.S_ISFIFO(os.stat(args.input_flist).st_mode):  # read once
            column = None  # as the first line has it: the path is all of a line, or all before its label
            for where, text in _rows(args.input_flist, "--input-flist"):
                parts = text.rsplit(None, 1)
                if column is None:
                    column = len(parts) == 2 and _parse_label(parts[1], where) is not None
                every.append(args.prefix + (parts[0] if column else text))
    except (InputError, OSError):  # a line or folder the run never reaches: no error of this run's
        pass
    return every


def _mapped_files() -> list[str]:
    """The files this process has mapped: the interpreter, its shared libraries (FFmpeg's, torch's);
    none without Linux's /proc."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            fields = [line.split(maxsplit=5) for line in maps]  # address perms offset dev inode [path]
    except OSError:
        return []
    return sorted({f[5].rstrip("\n") for f in fields if len(f) == 6 and f[5].startswith("/")})


def _protected_folders() -> list[tuple[str, str]]:
    """The folders (real paths) whose files the run may read after its outputs are checked, each with
    what it holds: the Hugging Face hub's cache and torch's hub folder, where timm loads pretrained
    weights and configs from, and Python's installed code (modules imported later, such as timm's, are
    not in ``sys.modules`` yet), and the interpreter's own folders. No output goes there."""
    import site
    import sysconfig

    from huggingface_hub import constants

    weights, code = "where the model's weights are cached", "where Python's code is installed"
    folders = [(constants.HF_HUB_CACHE, weights), (torch.hub.get_dir(), weights), (site.getusersitepackages(), code)]
    folders += [(folder, code) for key, folder in sysconfig.get_paths().items() if key != "data"]  # data: the venv
    interpreter = [os.path.dirname(os.path.realpath(sys.executable)), sysconfig.get_config_var("LIBDIR")]
    folders += [(folder, "where Python itself is installed") for folder in interpreter if folder]
    return [(os.path.realpath(folder), what) for folder, what in folders]


def _check_output_path(flag: str, path: Path) -> str:
    """One file the run will write: a file name in a writable folder, not a device; its real path."""
    if str(path) == "-":  # stdout carries the summary; a file beside it is what was meant, or a mistake
        raise InputError(f"{flag} -: the summary goes to stdout; give a file name (- is none)")
    if path.name in ("", ".", ".."):
        raise InputError(f"{flag} {path}: not a file name")
    try:
        problem = _not_a_file(path)
    except OSError as e:  # a file where a folder should be, a name too long, a loop of links
        raise InputError(f"{flag} {path}: {e.strerror or e}") from None
    if problem is not None:
        raise InputError(f"{flag} {path}: {problem}")
    target = Path(os.path.realpath(path))
    if not target.parent.is_dir():
        raise InputError(f"{flag} {path}: folder {target.parent} does not exist")
    try:  # as the write at the end will (root passes os.access where it cannot write: sysfs, NFS)
        tempfile.TemporaryFile(dir=target.parent).close()
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(f"{flag} {path}: cannot write there")
    return str(target)


def _check_caches(device: torch.device, compile: bool) -> None:
    """An unwritable cache folder of torch's (which importing timm creates) or Triton's, found now."""
    import getpass

    try:  # where torch puts it: not by importing torch._inductor, which fails on an unwritable folder
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
            reason = f"{folder} ({e.strerror or e}); set {variable} to a writable folder"
            raise InputError(f"torch cannot write its cache in {reason}") from None


def _refuse_under_torchrun(args: argparse.Namespace, shard: _Shard) -> None:
    """What runs in a single process only (rank 0 alone would do it while the others wait)."""
    if shard.world_size == 1:
        return
    for flag, path in (("--input-flist", args.input_flist), ("--labels", args.labels)):
        fifo = False
        with contextlib.suppress(OSError, ValueError, TypeError):  # unreadable: the list's own check says why
            fifo = stat.S_ISFIFO(os.stat(path).st_mode)
        if path is not None and (str(path) == "-" or fifo):  # read once, by one rank
            raise InputError(f"{flag} {path}: under torchrun every rank would read this stream; give a file")
    for flag, given in (("--breakdown", args.breakdown), ("--parity", args.parity), ("--sweep", args.sweep)):
        if given:
            raise InputError(f"{flag} runs in a single process, not under torchrun")


_OPEN_FILES_SPARE = 32  # descriptors a run holds beside its images (8 to 20 measured: libraries, pipes)


def _check_open_files(threads: int, processes: int) -> None:
    """InputError when the open-file limit (``ulimit -n``) cannot hold an image per decode thread beside
    the run's own files, after the soft limit is raised as far as the hard one allows: each image
    would fail with "Too many open files", good images counted bad."""
    import resource

    need = _OPEN_FILES_SPARE + threads + 4 * processes  # a worker process: its own limit, and pipes here
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # finite: raised to the target, or left as it was
    if soft < need:
        why = f"the open-file limit (ulimit -n) is {soft}: {threads} decode threads need about {need}"
        raise InputError(f"{why}; raise it, or give fewer", "--num-threads")


def _choose_decoder(args: argparse.Namespace, sweep: dict[str, list[int]] | None) -> str:
    """``ffmpeg``, ``nvjpeg`` or ``nvdec``; InputError for worker processes (a sweep's too: it would
    time the same loader under another name) with a GPU decoder or the DataLoader."""
    decoder = "nvjpeg" if args.use_nvjpeg else "nvdec" if args.use_nvdec else "ffmpeg"
    in_processes = max(sweep["decode-processes"]) if sweep else args.decode_processes
    if in_processes and (decoder != "ffmpeg" or args.loader == "torch"):
        given = "--loader torch" if args.loader == "torch" else f"--use-{decoder}"
        flag = "--sweep decode-processes=..." if sweep and not args.decode_processes else "--decode-processes"
        raise InputError(f"{flag} runs FFmpeg's decode in worker processes; not with {given}")
    if in_processes and (why := _no_main_file()):  # else a TypeError from get_pipeline, as a bug's
        raise InputError(f"--decode-processes: {why}: run the script from its file, or give no worker processes")
    return decoder


def _preflight(
    args: argparse.Namespace, shard: _Shard, command: Sequence[str] = (), start_time: str = ""
) -> _RunConfig:
    _refuse_under_torchrun(args, shard)
    images = _read_images(args)
    try:
        _check_files(args, images)
    except OSError as e:  # e.g. a name too long for the file system
        raise InputError(f"{e.filename}: {e.strerror or e}") from None
    if args.cold_cache and not hasattr(os, "posix_fadvise"):
        raise InputError(f"--cold-cache: {platform.system()} has no posix_fadvise to evict files from the page cache")
    device = _resolve_device(args.device, shard.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # so that no library makes a context on cuda:0 for this rank
    sweep = _sweep_grid(args, len(images)) if args.sweep else None
    decoder = _choose_decoder(args, sweep)
    backend = _check_gpu_decoder(decoder, device)
    dtype, dtype_reason = _choose_dtype(device, args.dtype)
    compiled = args.compile if args.compile is not None else device.type == "cuda"
    _check_caches(device, compiled)
    overrides = {"img_size": args.img_size, "crop_pct": args.crop_pct, "interpolation": args.interpolation}
    overrides |= {"mean": args.mean and tuple(args.mean), "std": args.std and tuple(args.std)}
    transform = EvalTransform.from_model(args.model, {k: v for k, v in overrides.items() if v is not None})
    # Capped at rank 0's shard, the largest: every rank the same settings (_agree_on_job compares them).
    threads, processes = _capped_workers(args, shard.size_of(len(images), rank=0))
    _check_open_files(max(sweep["num-threads"]) if sweep else threads, processes)
    batch_size = min(args.batch_size, shard.size_of(len(images), rank=0))  # the results say the size that ran
    if batch_size < args.batch_size:
        whose = "the images listed" if shard.world_size == 1 else "the images of rank 0's share, the largest"
        _LG.info("--batch-size %d capped at %d, %s.", args.batch_size, batch_size, whose)
    torch_loader = args.loader == "torch"
    check_decoder = CHECK_DECODER_IMAGES if args.check_decoder is None else args.check_decoder
    if device.type == "cpu" and decoder == "ffmpeg":
        if args.check_decoder:
            _LG.info("--check-decoder: nothing to compare: FFmpeg on the CPU is the reference itself.")
        check_decoder = 0
    derived = {
        "images": images,
        "shard": shard,
        "device": device,
        "decoder": "pil" if torch_loader else decoder,
        "decoder_backend": "pil" if torch_loader else backend,
        "transform": transform,
        "batch_size": batch_size,
        "num_threads": threads,
        "decode_processes": processes,
        "dtype": dtype,
        "dtype_reason": dtype_reason,
        "compile": (args.compile_mode or COMPILE_MODE) if compiled else None,
        "check_decoder": 0 if torch_loader else check_decoder,
        "stats_interval": args.stats_interval or -1,
        "sweep": sweep,
        "command": tuple(command),
        "cwd": _cwd(),
        "start_time": start_time,
    }
    given = {f.name: getattr(args, f.name) for f in dataclass_fields(_RunConfig) if f.name not in derived}
    return _RunConfig(**given, **derived)  # the other settings as the flags give them


def _cwd() -> str | None:
    """The working folder, where the command's relative paths start; None if it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _capped_workers(args: argparse.Namespace, images: int) -> tuple[int, int]:
    """``--num-threads`` and ``--decode-processes`` capped at the ``images`` of the largest shard: an idle
    worker costs memory (a decode process, an interpreter with torch and SPDL: some 350 MB). A DataLoader
    worker (``--loader torch``) is a process that makes whole batches."""
    batches = max(1, math.ceil(images / args.batch_size))
    threads = min(args.num_threads, batches if args.loader == "torch" else max(1, images))
    processes = min(args.decode_processes, batches)
    if threads < args.num_threads:
        what = "batches" if args.loader == "torch" else "images"
        _LG.info("--num-threads %d capped at %d, the %s this process has.", args.num_threads, threads, what)
    if processes < args.decode_processes:
        _LG.info("--decode-processes %d capped at %d, the batches this process has.", args.decode_processes, processes)
    return threads, processes


def _shard_from_env() -> _Shard:
    try:
        shard = _Shard.from_env()
    except ValueError:
        given = ", ".join(f"{k}={os.environ[k]!r}" for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ)
        message = f"RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (torchrun sets them): {given}"
        raise InputError(message) from None
    if not (0 <= shard.rank < shard.world_size and shard.local_rank >= 0):
        raise InputError(f"RANK={shard.rank} WORLD_SIZE={shard.world_size} LOCAL_RANK={shard.local_rank}: no such rank")
    if shard.world_size > 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        advice = "run under torchrun, or unset WORLD_SIZE"
        raise InputError(f"WORLD_SIZE={shard.world_size} without MASTER_ADDR and MASTER_PORT: {advice}")
    return shard


# --- The run: the loader opened, the timed loop, the breakdown, the report and files ---


@dataclass
class _Loader:
    batches: Iterator[_Batch]
    stats: _PipelineStats | None = None  # SPDL's stage statistics; None for --loader torch
    stop_at_once: bool = False  # an interrupt (or stuck workers): the process ends right after the report
    stopped_cleanly: bool = True  # False when a worker thread was stuck (a hung read)


@contextlib.contextmanager
def _open_loader(config: _RunConfig, images: ImageList, policy: BadImagePolicy) -> Iterator[_Loader]:
    if config.loader == "torch":
        with _open_torch_loader(config, images) as loader:
            yield loader
        return
    in_processes, limit = config.decode_processes, config.max_image_bytes
    if in_processes:  # batches decoded on the CPU in worker processes, copied to the device here
        decode: Callable = functools.partial(_decode_in_worker, config.transform, limit)
    else:
        decode = get_decode_func(config.device, config.transform, config.decoder, policy, max_image_bytes=limit)
    stats = _PipelineStats(config.stats_interval)
    sizes = (config.decode_concurrency, config.queue_size, config.num_threads)  # concurrency, buffer, threads
    others = frozenset(multiprocessing.active_children())  # not the pool's: a notebook's own children
    pipeline = get_pipeline(images, config.batch_size, decode, *sizes, stats=stats, decode_processes=in_processes)
    # Not SPDL's auto_stop: its one timeout is set as it starts, and an interrupt's stop cannot wait.
    pipeline.start()
    pool = [p for p in multiprocessing.active_children() if p not in others] if in_processes else []  # just spawned
    batches = pipeline.get_iterator(timeout=min(WORKER_POLL_S, config.timeout) if pool else config.timeout)
    delivered = _ending_once_complete(batches, len(images), pool, config.timeout)
    loader = _Loader(_received(delivered, config.device, in_processes, others) if in_processes else delivered, stats)
    try:
        yield loader
    finally:
        _DECODING.pop(-1, None)  # a stall's wait, said by now: no entry for a later run's stall to name
        loader.stopped_cleanly = _stop_pipeline(pipeline, loader.stop_at_once, in_processes > 0, others)
        if in_processes:  # free the pool's queues now: the process ends with os._exit, and
            loader.batches = batches = pipeline = iter(())  # multiprocessing's resource tracker would
            gc.collect()  # then warn of their semaphores as leaked


def _ending_once_complete(
    batches: Iterator, listed: int, pool: Sequence[multiprocessing.Process] = (), timeout: float = 0.0
) -> Iterator:
    """The loader's batches, ended by a time-out once they hold every listed image (classified or
    failed): SPDL's iterator time-out covers the wait for the stream's end too, which a --timeout
    of 0.05 s is shorter than. The run (a notebook's loader too), the sweep's passes and the
    breakdown's loader alone alike. With --decode-processes' ``pool``, SPDL's time-out is
    WORKER_POLL_S, ``timeout`` the run's: a worker that ends with an error stops the run at a poll."""
    delivered, waited = 0, time.monotonic()
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except TimeoutError:
            if delivered >= listed:
                return
            if (ended := _worker_ended(pool)) is not None:
                raise ended from None
            if pool and time.monotonic() - waited < timeout:
                continue
            raise
        yield batch
        delivered += len(batch[1]) + len(getattr(batch, "failures", ()))  # once taken: the loop checks it first
        waited = time.monotonic()


def _stop_pipeline(pipeline: Pipeline, at_once: bool, in_processes: bool, others: Set[Any] = frozenset()) -> bool:
    """Stop the pipeline; False if a worker thread did not end in time (stuck in a hung read, or
    still decoding when an interrupt ends the run at once)."""
    workers_ended = at_once and in_processes
    if workers_ended:  # an interrupt: the workers end now, not after SPDL's seconds of joining each;
        logging.getLogger("spdl.pipeline").setLevel(logging.CRITICAL)  # its traceback for their queue: no news
        _end_children(others)
    try:
        pipeline.stop(timeout=0.1 if at_once else 1.5)
    except TimeoutError:
        return False
    except PipelineFailure as e:  # with the workers ended: the stage whose queue they left unread, no failure
        if workers_ended:
            return False
        # A stage's failure the loop never met: the run had stopped already (on another thread's bad
        # image, say). That stop is the run's outcome, said with its partial result; this one is told.
        _LG.warning("the loading pipeline also failed as it stopped: %s", _loader_failed(e))
    return True


@contextlib.contextmanager
def _tracing(path: Path | None, device: torch.device) -> Iterator[tuple[torch.profiler.profile, BinaryIO] | None]:
    """With a path, record torch's trace and SPDL's: yields torch's profiler and SPDL's trace file, in
    memory (Perfetto's writes fail without a word on a full disk); :py:func:`_export_trace` writes both."""
    if path is None:
        yield None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    else:  # Kineto's 'gpuGetDeviceCount failed' on a CPU run is an error line about nothing
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    memfd = getattr(os, "memfd_create", None)  # Linux; elsewhere a temporary file
    spdl_trace = os.fdopen(memfd("pftrace"), "w+b") if memfd else tempfile.TemporaryFile()
    with contextlib.ExitStack() as started:
        profiler = started.enter_context(torch.profiler.profile(activities=activities))
        started.enter_context(spdl.io.utils.tracing(os.dup(spdl_trace.fileno())))  # SPDL closes the one given
        stopping = started.pop_all()
    try:
        yield profiler, spdl_trace
    finally:
        with _uninterrupted() as held:  # a signal as torch collects its results (cut: no trace) waits for it
            stopping.close()
        if held:
            raise RunInterrupted(held[0])


def _export_trace(trace: tuple[torch.profiler.profile, BinaryIO], path: Path, note: str = "") -> None:
    """Write torch's trace (PATH.json) and SPDL's (PATH.pftrace), each whole or not at all. Raises OSError."""
    profiler, spdl_trace = trace
    # Kineto's save() fails without a word on a full disk, and rewrites a path that is not plain (a
    # backslash becomes a folder): it writes into a plain scratch folder, and must write JSON.
    beside = os.path.dirname(os.path.realpath(f"{path}.json"))
    folder = beside if beside.isprintable() and "\\" not in beside else tempfile.gettempdir()
    # Not a TemporaryDirectory: in a folder whose files cannot be removed (chattr +a), its clean-up
    # recursed to a RecursionError, where the write below says why it fails.
    scratch = tempfile.mkdtemp(dir=folder, prefix=".imagenet_classification-trace-")
    try:
        profiler.export_chrome_trace(os.path.join(scratch, "trace.json"))
        try:
            exported = Path(scratch, "trace.json").read_bytes()
            json.loads(exported)
        except (OSError, ValueError):
            why = f"torch's profiler left no whole file in {folder}, and says not why: is it full?"
            raise OSError(errno.EIO, why) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with spdl_trace:
        spdl_trace.seek(0)
        recorded = spdl_trace.read()
    _write_atomically(f"{path}.json", exported)
    _write_atomically(f"{path}.pftrace", recorded)
    where = f"trace: {path}.json (torch's profiler) and {path}.pftrace (SPDL's)"
    _say(f"{where}; open either in https://ui.perfetto.dev{note}")


def _run_loop(config: _RunConfig, model: ModelBundle, report: _RunReport) -> bool:
    """The timed loop over this rank's images, into ``report`` however it stops. Returns whether the
    loader stopped cleanly (no worker thread left stuck)."""
    images, policy, shard = config.my_images, config.policy(), config.shard
    progress = _Progress(len(images)) if shard.rank == 0 else None
    warmup = _warmup_for_all_ranks(shard, len(config.images), config.batch_size, config.warmup_batches)
    options = {"listed": len(images), "warmup_batches": warmup, "policy": policy, "progress": progress}
    # No warm-up: the window opens as the loader starts, nothing yet made or under way (as the breakdown's).
    options |= {"predictions": config.predictions_file is not None, "loader_lead": config.loader_lead if warmup else 0}
    options["sync_clocks"] = _barrier if shard.world_size > 1 else None  # the FPS window opens on every rank at once
    loader = None
    try:
        with _open_loader(config, images, policy) as loader:
            try:
                with _tracing(config.trace if shard.rank == 0 else None, config.device) as report.trace:
                    report.result = benchmark(loader.batches, model, **options)
            except (RunStopped, RunInterrupted) as e:  # benchmark's partial result comes with it
                report.result, report.error = e.result or report.result, e
                # Nor after a stall of the DataLoader's workers: torch would join each, stuck, for 5 s.
                stalled_workers = config.loader == "torch" and getattr(e, "kind", None) == "stalled"
                loader.stop_at_once = isinstance(e, RunInterrupted) or stalled_workers
            finally:
                if progress is not None:
                    progress.close()
    except RunInterrupted as e:  # while the loader started or stopped: what was measured stands
        report.error = report.error or e
    if loader is None or loader.stats is None:
        return loader is not None and loader.stopped_cleanly
    if t := report.result.timeline:  # SPDL's statistics in the FPS window
        loader.stats.window = t["started_at"] + t["warmup_end_s"]
    report.pipeline_stats = loader.stats.summary()
    if shard.world_size == 1:  # under torchrun the bound on FPS is every rank's capacity: not known here
        _add_window_lead(report.result, loader.stats, config.decode_concurrency)
        if config.device.type == "cpu":
            _add_drain(report.result, loader.stats.loader_end())
    if t:
        start, end = t["started_at"], t["started_at"] + t["end_s"]
        t["sink_occupancy"] = loader.stats.waiting_per_interval(start, end, t["interval_s"], len(t["images"]))
    return loader.stopped_cleanly


def _add_breakdown(report: _RunReport, config: _RunConfig, model: ModelBundle) -> None:
    """After the run, into the report: the loader alone, reading alone (evicted again with
    --cold-cache), the model alone. What cuts it short is said in the report; the run's result stands."""
    images, result, cold = config.my_images, report.result, config.cold_cache
    batch_size = min(config.batch_size, len(images))
    if not result.frames_timed:  # every image of the window failed: rates of no image compare nothing
        report.breakdown_cut = "the run timed no image: nothing to compare"
        return
    try:  # from the first line: a signal as soon as it is logged cuts the breakdown, not the run
        _LG.info("Breakdown: timing the loader alone, then reading alone, then the model alone.")
        if cold:
            _examine_page_cache(images.paths, evict=True, max_bytes=config.max_image_bytes)
        with _open_loader(config, images, config.policy()) as loader:
            try:
                loader_fps = measure_loader(loader.batches, config.device, config.warmup_batches)
            except RunInterrupted:
                loader.stop_at_once = True  # as in the run: not waiting for the workers' queued batches
                raise
        # The read ceiling: the files read as the loader reads them, as many batches at once as it decodes.
        cache = _examine_page_cache(images.paths, evict=cold, max_bytes=config.max_image_bytes)
        limits = (config.max_image_bytes, config.timeout)
        reads = _read_batches(images, config.batch_size, config.at_once, *limits)
        fps, mb_s = _measure_reads(reads, config.warmup_batches)
        read = fps, mb_s, cache.resident_after if cold else cache.resident, cold
        ran = sum(1 for images in result.timeline["batch_images"] if images)  # as many batches as ran the model
        model_fps = _measure_model(model, batch_size, ran, config.warmup_batches)
        report.breakdown = _Breakdown.from_rates(loader_fps, model_fps, result.fps, config.device, read)
    except RunInterrupted as e:
        report.breakdown_cut, report.error = e.reason, e
    except (RunStopped, RuntimeError, MemoryError) as e:  # said in the report, not the run's failure
        if not isinstance(e, RunStopped) and _is_out_of_memory(e):  # the model alone's batch: the run's advice
            e = _out_of_memory(config.device, batch_size)
        reason = _explain(e, config)[0] if isinstance(e, RunStopped) else _first_line(e)
        report.breakdown_cut = f"it failed: {type(e).__name__}: {reason}"


def _check_run_decoder(config: _RunConfig) -> _DecoderCheck | None:
    if not config.check_decoder:  # off, or FFmpeg on the CPU: the reference itself (_preflight)
        return None
    limit = config.max_image_bytes
    decode = get_decode_func(config.device, config.transform, config.decoder, max_image_bytes=limit)
    distinct = dict(zip(config.images.paths, config.images.labels, strict=True))  # N images: a repeat is not one more
    items = list(itertools.islice(distinct.items(), config.check_decoder))
    check = _check_decoder(decode, items, config.transform, config.decoder, limit)
    uncompared = [
        (check.fallbacks, "it left to the CPU"),
        (check.only_decoder, f"only {config.decoder} decoded (FFmpeg refuses them: a run with it classifies them)"),
        (check.only_reference, "only FFmpeg decoded"),
        (check.neither, "neither decoded"),
    ]
    left_out = "; ".join(f"{_images(n)} {why}" for n, why in uncompared if n)
    if not check.images:
        _LG.warning("Decoder check: %s against FFmpeg on the CPU compared no image: %s.", config.decoder, left_out)
        return check
    line = "Decoder check: %s against FFmpeg on the CPU, %s, mean absolute difference %.2f (worst %.2f)%s."
    more = f"; not compared: {left_out}" if left_out else ""
    log = _LG.warning if check.only_decoder else _LG.info
    log(line, config.decoder, _images(check.images), check.mad_mean, check.mad_max, more)
    return check


def _build_model(config: _RunConfig) -> ModelBundle:
    """The model bundle with the config's transform (compiled, it pads short batches: the sweep's to each setting)."""
    pad_to = None if config.sweep else max(1, min(config.batch_size, len(config.my_images)))  # 0: a rank with none
    settings = {"pretrained": config.pretrained, "checkpoint": config.checkpoint, "transform": config.transform}
    settings |= {"compile": config.compile or False, "dtype": config.dtype, "batch_size": pad_to}
    seeded = not config.pretrained and config.checkpoint is None  # random weights: the same on every rank, and run
    with torch.random.fork_rng(devices=[], enabled=seeded):  # timm builds it on the CPU; the caller's seed stays
        if seeded:
            torch.random.default_generator.manual_seed(0)
        model = get_model(config.model, config.device, **settings)
    dtype = f"{str(config.dtype).removeprefix('torch.')} ({config.dtype_reason})"
    run = f"{config.loader} loader, decoder {config.decoder}, {len(config.my_images)} images listed"
    _LG.info("Model %s on %s in %s, %s.", config.model, config.device, dtype, run)
    if config.compile and config.device.type == "cuda":
        slow = ": minutes on a GPU the first time (then cached); --compile-mode default takes seconds"
        slow = slow if config.compile == "max-autotune" else ""
        _LG.info("torch.compile (mode %s) compiles during the warm-up%s.", config.compile, slow)
    return model


def _run(config: _RunConfig) -> _RunReport:
    """The decoder check, the torchrun job, the model, parity, the timed loop and the breakdown, in a
    report; one that stopped before its loop too (nothing measured)."""
    shard = config.shard
    result = RunResult(len(config.my_images), partial=True)
    report = _RunReport(result, config.to_dict(), _environment(config.device), [], world_size=shard.world_size)
    try:
        if shard.rank == 0:
            report.decoder_check = _check_run_decoder(config)
        if shard.world_size > 1:  # compilation, on the first batches, comes before the warm-up's barrier
            _init_distributed(config.device, config.timeout + (1800 if config.compile else 0))
            _agree_on_job(config)
        model = _build_model(config)
        if config.parity:  # refused under torchrun (_refuse_under_torchrun)
            report.parity = _run_parity(config, model)
        what = "evicting" if config.cold_cache else "measuring how much is in memory of"  # after the reads above
        _LG.info("Page cache: %s the %s listed files.", what, len(config.my_images))
        elsewhere = _listed_first_elsewhere(config.images, shard) if shard.world_size > 1 else frozenset()
        page_cache = _examine_page_cache(config.my_images.paths, config.cold_cache, elsewhere, config.max_image_bytes)
        stopped_cleanly = _run_loop(config, model, report)
        report.result.page_cache = page_cache
        if config.breakdown and report.error is None and stopped_cleanly:
            _add_breakdown(report, config, model)
    except (RunStopped, RunInterrupted) as e:
        report.error = e
    if config.breakdown and report.breakdown is None and report.breakdown_cut is None:  # said, never left out
        why = "the run stopped before it" if report.result.partial else "a loader thread was left stuck"
        if report.error is not None and not report.result.partial:  # a signal once the run had ended
            why = _explain(report.error, config)[0]
        report.breakdown_cut = f"not run: {why}"
    report.ranks = _combine_ranks(report, config)
    return report


def _explain(error: BaseException, config: _RunConfig | None) -> tuple[str, int]:
    """The one line printed for an error, with advice about its flags, and the exit status."""
    if isinstance(error, RunInterrupted):
        return error.reason, 128 + error.signum  # as a shell reports a process a signal ended
    if isinstance(error, InputError):
        line = str(error) if error.flag is None or str(error).startswith(error.flag) else f"{error.flag}: {error}"
        return f"{line}; {error.advice}" if error.advice else line, EXIT_USAGE
    assert isinstance(error, RunStopped), error
    if error.kind == "stalled" and config is not None:
        head = f"no batch for {config.timeout:g} s (--timeout)"
        where = f"{head} from the DataLoader's workers" if config.loader == "torch" else f"{head}: {error.where}"
        return where, EXIT_STALLED
    return f"{error} ({error.advice})" if error.advice else str(error), EXIT_FAILED


def _write_outputs(outputs: Sequence[tuple[str, Path | None, Callable[[Path], bool | None]]]) -> list[str]:
    """Write each ``(what, path, writer)`` that has a path, one failure costing no other; returns (and
    says) a line per file not written. A writer returning False could not draw (no matplotlib)."""
    errors = []
    for what, path, write in outputs:
        if path is None:
            continue
        try:
            if write(path) is False:
                _say(f"note: {path} not drawn: {PLOT_HINT}")
        except OSError as e:
            above = "; they are only above" if what == "the results" else ""
            errors.append(f"{path}: cannot write {what} there ({e.strerror or e}){above}")
        except Exception as e:  # e.g. matplotlib on data it cannot draw: this file alone is lost, not the run's
            _LG.debug("writing %s failed", path, exc_info=True)
            reason = f"{type(e).__name__}: {next((line for line in str(e).splitlines() if line.strip()), '')}"
            errors.append(f"{path}: not written ({reason}; --debug shows where)")
    for line in errors:
        _say(f"error: {line}")
    return errors


def _finish(report: _RunReport, config: _RunConfig) -> int:
    """Say why the run stopped, print the report (rank 0, or a rank that stopped alone), write the
    files; return the exit status."""
    shard, status, result, label = config.shard, 0, report.result, _rank_label(config.shard)
    limit = config.policy().limit(len(config.images))
    if report.error is None and limit is not None and result.failed > limit:  # torchrun: each rank kept to it
        status = EXIT_FAILED
        result.stop_reason = f"the job's ranks skipped {_images(result.failed)} that failed to decode, more than "
        result.stop_reason += f"--max-bad allows ({limit}) in the whole job"
        if shard.rank == 0:
            _say(f"error: {result.stop_reason}")
    if report.error is not None:
        message, status = _explain(report.error, config)
        job = report.job_stop_reason
        if result.partial:  # else the run was whole: a signal came after it (breakdown_cut says it, if asked for)
            result.stop_reason = job or message
        _say(f"error: {label}{message}{f'; the job stopped on {job}' if job and job != message else ''}")
    # A stopped job's rows are rank 0's alone (the others' stay with them): in its shard's order.
    listed = config.images if report.error is None else config.my_images
    rows = _utf8_paths(_in_list_order(result.predictions or [], listed))
    result.failures = _utf8_paths(_in_list_order(result.failures, listed))  # in the list's order, not SPDL's
    timeline, trace = result.timeline, report.trace
    elsewhere = config.loader == "torch" or config.decode_processes  # neither profiler sees the decode there
    note = "; this process only: the decode ran in worker processes, and is not in it" if elsewhere else ""
    ran = bool(timeline and timeline["batch_end_s"])  # a timeline with no batch: a run stopped before its first
    plot = config.plot if ran else None
    window_name = "rank 0's window" if report.world > 1 else "FPS window"
    outputs = [  # a stopped run's too
        ("the results", config.results_file, lambda path: _write_results(path, report)),
        ("the per-image rows", config.predictions_file, lambda path: _write_predictions(path, rows)),
        ("the plot", plot, lambda path: _plot_timeline(timeline, path, _run_title(report), window_name)),
        ("the trace", config.trace if trace is not None else None, lambda path: _export_trace(trace, path, note)),
    ]
    printed = True
    try:
        if shard.rank == 0:  # the summary first: no file, however it fails, can cost it
            printed = _print_out(_print_report, report, label=label)
        elif report.error is not None:  # under torchrun, a rank's own partial result: each line says whose it is
            text = io.StringIO()
            _print_report(report, text)
            printed = _print_out(lambda: print(textwrap.indent(text.getvalue(), label), end=""), label=label)
    finally:  # nor can the summary cost the files
        not_written = _write_outputs(outputs) if shard.rank == 0 else []
    if config.plot is not None and not ran and shard.rank == 0:
        _say(f"note: {config.plot} not drawn: the run stopped before its first batch")
    if config.trace is not None and trace is None and shard.rank == 0:
        _say(f"note: {config.trace}.json and .pftrace not written: the run stopped before its loop began")
    return status or (EXIT_FAILED if not_written or not printed else 0)


def _rank_label(shard: _Shard) -> str:
    """``rank N: `` under torchrun, where the ranks share one stderr; else nothing."""
    return f"rank {shard.rank}: " if shard.world_size > 1 else ""


# --- Entry point: the terminal, signals, logging, main, exit statuses ---


def _say(line: str) -> None:
    """One line on stderr; a closed stderr does not stop the run from ending well."""
    if sys.stderr is None:  # fd 2 closed at start (2>&-): print(file=None) would write it to stdout
        return
    with contextlib.suppress(OSError, ValueError):  # one write: a native thread's log not amid the line
        print(_printable(line) + "\n", end="", file=sys.stderr, flush=True)


def _printable(text: str) -> str:
    """``text`` as one line, each character that is not printable escaped as repr writes it (``\\n``,
    ``\\x1b``, ``\\udce9``): a file name's newline could print a fake ``FPS=`` line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _printable_record(record: logging.LogRecord) -> bool:
    """A filter of this module's log: its message as one printable line (the traceback stays as it is)."""
    record.msg, record.args = _printable(record.getMessage()), None
    return True


def _print_out(printer: Callable[..., None], *args: Any, label: str = "") -> bool:
    """Print to stdout; if the reader is gone (``| head``), stop printing, not the run. False (and
    said on stderr, after ``label``: whose summary) if what was printed is lost otherwise: a full disk, say."""
    if sys.stdout is None:  # fd 1 closed at start (>&-, cron): Python has no stdout, nothing to print
        return True
    try:
        printer(*args)
        sys.stdout.flush()
    except (OSError, ValueError) as e:  # the pipe's reader left, a full disk; ValueError: stdout was closed
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if isinstance(e, BrokenPipeError):  # the reader chose to stop reading: nothing is lost on it
            return True
        _say(f"error: {label}the summary could not be written to stdout ({getattr(e, 'strerror', None) or e})")
        return False
    return True


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a hang-up: the terminal or ssh went, the files stay


# A signal this soon after the first is that one sent twice: GNU timeout sends it to the process, then to
# its process group; torchrun forwards to its workers a Ctrl-C the terminal sent them too.
REPEAT_S = 1.0


def _interrupt(signum: int, _frame: object) -> None:
    """A signal of ``_SIGNALS``: RunInterrupted where the run is, its partial result reported; a second ends it."""
    for s in _SIGNALS:
        signal.signal(s, functools.partial(_interrupt_again, time.monotonic()))
    for workers in _RUNNING:  # a signal to the whole group (torchrun's, systemd's) ends them too: torch's
        _forget_workers(workers)  # SIGCHLD handler would raise their death anywhere, in the report too
    if held := getattr(_HELD, "lists", None):
        held[-1].append(signum)
        return
    raise RunInterrupted(signum)


def _interrupt_again(first: float, signum: int, _frame: object) -> None:
    """A second signal ends the process at once, as its default does; one within ``REPEAT_S`` of the
    first is the first, delivered twice: it would have cut the report short and lost every file."""
    if time.monotonic() - first < REPEAT_S:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # the signal blocked in this thread (while worker processes spawn)


def _held_status(held: list[int], shard: _Shard = _Shard()) -> int:
    """The exit status of a signal held back while the report was written (0: none was), said."""
    if not held:
        return 0
    reason, status = _explain(RunInterrupted(held[0]), None)
    whole = "the run had ended, and the report and files are whole"
    _say(f"error: {_rank_label(shard)}{reason} while the report was written; {whole}")
    return status


def _no_worker_death_traceback(record: logging.LogRecord) -> bool:
    """False for SPDL's tracebacks of a ``--decode-processes`` worker's death (150 lines, a task's
    each): the run's one error line says it, and ``--debug`` shows them."""
    error = record.exc_info[1] if record.name.startswith("spdl") and record.exc_info else None
    return error is None or _worker_death(error) is None


def _init_logging(debug: bool = False, spdl_stats: bool = False) -> None:
    fmt = "%(asctime)s [%(levelname)s] %(message)s"
    logging.basicConfig(format=fmt, level=logging.DEBUG if debug else logging.INFO, force=True)
    _LG.addFilter(_printable_record)  # added once, however often this runs
    if not (debug or spdl_stats):
        logging.getLogger("spdl.pipeline").setLevel(logging.WARNING)
    if not debug:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_no_worker_death_traceback)
    # Logged only where torch finds no CUDA runtime, i.e. on a CPU run, when compiling: noise there.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def _run_job(config: _RunConfig) -> int:
    try:
        report = _run(config)
        with _uninterrupted() as held:
            status = _finish(report, config)
            if config.shard.world_size > 1 and report.error is None:  # every rank is here: none leaves (and
                _barrier()  # has torchrun end the others) before rank 0 has written the job's files
    finally:
        if config.shard.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():  # left to interpreter shutdown, Gloo's threads free tensors without the GIL
                dist.destroy_process_group()
    return _held_status(held, config.shard) or status  # a signal's status, as ever


def _start_time() -> str:
    """Now in ISO 8601 with the local offset; in UTC where ISO 8601 cannot write that (TZ=UTC+25, whose
    offset no datetime holds; TZ=XXX-0:0:30, an offset of seconds)."""
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc)
    with contextlib.suppress(ValueError):
        if (local := now.astimezone()).utcoffset().total_seconds() % 60 == 0:
            now = local
    return now.isoformat(timespec="seconds")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's work; returns the exit status (argparse exits with 2 itself on a bad command line)."""
    _not_as_a_worker_starts("main")
    start_time = _start_time()
    _end_abandoned()  # a notebook's earlier run's (the command line's process ends with its run)
    if argv is not None:  # the words as subprocess takes them: str, or a path; not one string of the whole line
        words = not isinstance(argv, str | bytes) and isinstance(argv, Sequence)
        if not (words and all(isinstance(word, str | os.PathLike) for word in argv)):
            raise TypeError(f"argv={argv!r}: expected a list of the command line's words, e.g. shlex.split(line)")
        argv = [os.fsdecode(word) for word in argv]
    with _own_logging_and_warnings():  # its streams escape a name that is not UTF-8 in a usage error too
        args = _parse_args(argv)
        try:
            return _main(args, (*_program(), *(sys.argv[1:] if argv is None else argv)), start_time)
        finally:  # nothing of the run's kept (nanobind would list SPDL's objects as leaked at a script's exit)
            _ffmpeg_jpeg_configs.cache_clear()
            with warnings.catch_warnings():  # a pipeline stopped before it started: "coroutine ... never awaited"
                warnings.simplefilter("ignore", RuntimeWarning)
                if not _ENDING_AFTER_MAIN:  # the command line's process ends at once: a collection would
                    gc.collect()  # only wait, seconds, for the pool of workers still starting to shut down


@contextlib.contextmanager
def _own_logging_and_warnings() -> Iterator[None]:
    """The run's logging, warnings filters and standard streams' errors, and a notebook's own put back
    after it (its log file not closed, as ``basicConfig(force=True)`` would close it)."""
    root, names = logging.getLogger(), ("spdl.pipeline", "torch.utils.cpp_extension")
    handlers, level, levels = root.handlers[:], root.level, {name: logging.getLogger(name).level for name in names}
    hub_log, streams = logging.getLogger("huggingface_hub"), [s for s in (sys.stdout, sys.stderr) if s is not None]
    propagates, errors = hub_log.propagate, [getattr(stream, "errors", None) for stream in streams]
    hub_log.propagate = not hub_log.handlers  # its own handlers (a verbosity set): not each line twice
    for handler in handlers:
        root.removeHandler(handler)
    for stream in streams:  # escape what a strict stream (a notebook's) cannot encode, a name that is
        with contextlib.suppress(AttributeError, ValueError):  # not UTF-8, rather than stop there
            stream.reconfigure(errors="backslashreplace")
    try:
        with warnings.catch_warnings():
            yield
    finally:
        hub_log.propagate = propagates
        for stream, was in zip(streams, errors, strict=True):
            with contextlib.suppress(AttributeError, ValueError, TypeError):
                stream.reconfigure(errors=was)
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, was in levels.items():
            logging.getLogger(name).setLevel(was)


def _main(args: argparse.Namespace, command: tuple[str, ...], start_time: str) -> int:
    _init_logging(args.debug, spdl_stats=args.stats_interval is not None)
    warnings.filterwarnings("ignore", category=WarmupIncluded)  # the summary's first line says it
    # SPDL's native library installs glog's crash handler, SIGTERM included, when it first loads:
    # load it now, so that the handler installed after it is the one that runs.
    spdl.io.utils.get_ffmpeg_versions()
    in_main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    previous = {s: signal.signal(s, _interrupt) for s in _SIGNALS} if in_main_thread else {}
    config, shard = None, _Shard()
    try:
        shard = _shard_from_env()
        if shard.rank != 0:
            logging.getLogger().setLevel(logging.WARNING)  # one rank speaks for the job
        config = _preflight(args, shard, command, start_time)
        return _sweep_command(config) if config.sweep else _run_job(config)
    except (InputError, RunStopped, RunInterrupted) as e:  # before the loop started, or at the barrier after it
        message, status = _explain(e, config)
        label = "" if isinstance(e, InputError) else _rank_label(shard)  # the input's error: every rank's the same
        _say(f"error: {label}{message}")
        return status
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _program() -> list[str]:
    """How this process was started, as a user would type it again (``python -m ...``, ``python PATH.py``,
    or the installed command)."""
    module = Path(__file__).stem  # run with -m, this module is __main__: its __name__ says nothing
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main_spec, "name", None) == module or not sys.argv or not sys.argv[0]:
        return ["python", "-m", module]
    argv0 = sys.argv[0]
    if argv0.endswith(".py"):
        return ["python", argv0]
    name = os.path.basename(argv0)
    found = shutil.which(name)
    return [name if found and os.path.realpath(found) == os.path.realpath(argv0) else argv0]


_ENDING_AFTER_MAIN = False  # entrypoint's: the process ends with os._exit once main returns


def entrypoint(argv: Sequence[str] | None = None) -> None:
    """:py:func:`main`, then the process ends at once with its status (the interpreter's shutdown would
    wait forever for a decode thread stuck in a hung read, or abort as Gloo's threads free tensors)."""
    global _ENDING_AFTER_MAIN
    _not_as_a_worker_starts("entrypoint")
    _fill_closed_streams()
    _ENDING_AFTER_MAIN = True
    try:
        status = main(argv)
    except SystemExit as e:  # argparse: a malformed command line (2), or --help (0)
        status = e.code if isinstance(e.code, int) else EXIT_USAGE
    except Exception as e:  # a bug: its traceback for the report, then one line
        _LG.exception("unexpected error")
        _say(f"error: unexpected {type(e).__name__}: {e} (a bug; the traceback above says where)")
        status = EXIT_FAILED
    logging.shutdown()
    for stream in filter(None, (sys.stdout, sys.stderr)):  # None: closed when the process started
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _end_children()
    os._exit(status)


def _fill_closed_streams() -> None:
    """Open /dev/null as each of fds 0-2 closed at start (``>&-``): else the next file opened (a results
    file) takes its number and gets what a native library prints."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one


def _end_children(others: Set[Any] = frozenset()) -> None:
    """End the worker processes left running (after an interrupt), but ``others`` (a notebook's own,
    started before the run): orphaned, the workers hold a pipe open for seconds."""
    for child in set(multiprocessing.active_children()) - others:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            child.kill()


if __name__ == "__main__":
    entrypoint()
