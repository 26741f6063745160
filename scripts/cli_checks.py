"""Checks of the paths and counts that the programs in scripts/ and bench/ take, done right after
parsing: a bad one ends the program with argparse's one-line ``error: argument NAME: VALUE: why``
(exit 2), not with a traceback, and before any slow work."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path


def _why_no_folder(path: Path) -> str | None:
    """Make ``path`` a folder (with its parents) if it is none yet; why it cannot take outputs, or None."""
    if path.exists() and not path.is_dir():
        return "not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a parent that is a file, /proc, no permission, a read-only file system
        return f"cannot make the folder: {e.strerror or e}"
    if not os.access(path, os.W_OK | os.X_OK):
        return "a folder this user cannot write in"
    return None


def out_folder(parser: argparse.ArgumentParser, name: str, path: Path) -> Path:
    """``path``, made a folder if need be; or ``parser.error`` naming the argument ``name`` and ``path``."""
    if why := _why_no_folder(path):
        parser.error(f"argument {name}: {path}: {why}")
    return path


def out_file(parser: argparse.ArgumentParser, name: str, path: Path) -> Path:
    """``path``, a file to write, its folder made if need be; or ``parser.error`` naming ``name`` and ``path``."""
    if path.is_dir():
        parser.error(f"argument {name}: {path}: a folder, not a file")
    if path.exists() and not path.is_file():  # /dev/full, a FIFO: written at the end, or never
        parser.error(f"argument {name}: {path}: not a regular file")
    if why := _why_no_folder(path.parent):
        parser.error(f"argument {name}: {path}: its folder {path.parent}: {why}")
    return path


def sub_folder(parser: argparse.ArgumentParser, name: str, path: Path) -> Path:
    """``path``, a folder the program makes inside its output folder once the arguments are checked; or
    ``parser.error`` naming ``name`` and ``path`` now, where something that is no folder holds its name."""
    if path.exists() and not path.is_dir():
        parser.error(f"argument {name}: {path}: not a folder")
    return path


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; moved onto ``path`` once the block ends without
    error (``os.replace``, in one step), removed otherwise: a full disk or a kill leaves the old
    file or none, never a truncated one that a later run would read."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number, ``low`` or more (and ``high`` or less); otherwise
    argparse's one-line ``error: argument NAME: VALUE: expected ...`` (exit 2)."""
    expected = f" from {low} to {high}" if high is not None else f", {low} or more"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text}: expected a whole number{expected}")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds above 0; otherwise argparse's one-line error (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:  # nan too
        raise argparse.ArgumentTypeError(f"{text}: expected a number of seconds above 0")
    return value


def of_the_set(
    parser: argparse.ArgumentParser, name: str, value: int | None, default: int, images: int, size: str = ""
) -> int:
    """A count of the set's ``images`` to use: ``value``, or if not given ``default`` (``images`` if fewer);
    ``parser.error`` naming ``name`` above ``images``, which would be cut to the set silently. ``size``
    says what the set's size is (default ``the set's --images N``)."""
    if value is None:
        return min(default, images)
    if value > images:
        size = size or f"the set's --images {images}"
        parser.error(f"argument {name}: {value}: more than {size}")
    return value


# --max-threads of the bench scripts, which run every count from 1 up: 2**31 ran out of memory building them.
max_threads = whole(1, 1024)


def run(main: Callable[[], int | None]) -> None:
    """A script's entry: Ctrl-C, or SIGTERM (``timeout``, a closed job), runs its clean-up (``finally``,
    ``atexit``: gil.py's uprobes) and ends it with one line and the shell's status, not a traceback;
    so does an error of the system's (a full disk, a closed pipe), with status 1."""

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signum)

    signal.signal(signal.SIGTERM, stop)
    program = Path(sys.argv[0]).name
    try:
        status = main()
        try:
            sys.stdout.flush()  # now, for its error here: at exit it would be a traceback
        except OSError as e:
            e.filename = e.filename or "standard output"
            raise
    except KeyboardInterrupt as e:
        signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
        print(f"{program}: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        sys.exit(128 + signum)
    except OSError as e:
        with contextlib.suppress(OSError):  # what stdout still holds goes nowhere, not into a second error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        where = f": {e.filename}" if e.filename is not None else ""
        print(f"{program}: error: {e.strerror or e}{where}", file=sys.stderr)
        sys.exit(1)
    sys.exit(status)
