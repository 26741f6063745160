"""How much of the decode loop holds the GIL, and what that caps a thread pool at.

A pool of threads in one process cannot decode faster than 1 / (GIL-held time per image),
however many cores it has. In one thread, on the realistic mix (``compare_loaders.py --mix
imagenet``) and on the common-size set (its default), the module's decode function (as the CLI
builds it, files read from disk) runs over the set again and again, and:

- py-spy samples it twice at once, ``--gil`` (only samples holding the GIL) and ``--idle`` (every
  sample): the share of the decode function's samples that hold the GIL is the share of its
  time; times the time per image, the GIL-held time per image, and its inverse the ceiling;
  the GIL-holding samples' innermost frames, each with its share of them, say where it is held;
- perf counts ``PyEval_SaveThread`` calls (a uprobe on libpython: every release of the GIL, each
  a point where another thread may take it) over the same window: the GIL hand-offs per image;
  two threads decoding at once show it agrees: their voluntary context switches (``/proc``),
  each a thread that found the GIL taken, per image, are at most that many.

Then the ceiling checked with no big machine: the loader (SPDL pipeline, batches of 32) with 16
threads on 16 x 16 JPEGs cropped to 16 x 16 (native work near zero), on this machine's cores:
its images/s is what one process can hand over. And the targets of issue #22 as ratios measured
side by side, repeated: the loader on the realistic mix at 2 threads over FFmpeg decode alone at
2 threads, and the loader at 16 threads over itself at 2.

Usage::

    python bench/gil.py --out bench/out            # make bench runs this
    python bench/gil.py --out bench/out --seconds 20 --repeats 5
    python bench/gil.py --out bench/out --before 417ca25   # also sample the module as of a commit
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]
if os.environ.get("GIL_BENCH_MODULE"):  # a child sampling another version of the module (--before)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "imagenet_classification", Path(os.environ["GIL_BENCH_MODULE"]) / "imagenet_classification.py"
    )
    sys.modules["imagenet_classification"] = importlib.util.module_from_spec(_spec)  # what every import gets
    _spec.loader.exec_module(sys.modules["imagenet_classification"])

import torch  # noqa: E402
from cli_checks import out_file, out_folder, sub_folder  # noqa: E402
from cli_checks import run as run_script  # noqa: E402 (run: the py-spy runs below)
from compare_loaders import (  # noqa: E402
    check_image_count,
    decodable,
    decodable_set,
    decode_only_rate,
    make_image_set,
    min_images,
    window_overstates,
)
from PIL import Image  # noqa: E402

import imagenet_classification as ic  # noqa: E402

DECODE_FUNCTION = "decode_batch_ffmpeg"  # the frame every sample of the decode loop has
LIBPYTHON_PROBE = "PyEval_SaveThread"
IDLE_LOOP = Path("idle-loop")  # --child idle-loop: time.sleep(0) in a loop (the uprobes' own cost)


def _paths(flist: Path) -> list[str]:
    return [f"{flist.parent}/{line}" for line in flist.read_text().splitlines()]


def child_loop(flist: Path, seconds: float, threads: int) -> None:
    """The decode loop, for the parent to sample: the module's decode function over the list's
    batches of 32, again and again, in ``threads`` threads, for ``seconds``. Prints ``ready`` after
    an untimed pass over the first 256 images, then every 0.2 s ``monotonic-time images-done``."""
    if flist == IDLE_LOOP:  # the GIL released once per item, next to nothing held between
        paths = ["-"] * 256

        def decode(batch: list) -> tuple:
            return None, [time.sleep(0) for _ in batch]

    else:
        paths = _paths(flist)
        decode = ic.get_decode_func("cpu", ic.EvalTransform(), policy=ic.BadImagePolicy(skip=True))
    batches = [[(p, 0) for p in paths[i : i + 32]] for i in range(0, len(paths), 32)]
    for batch in batches[:8]:
        decode(batch)
    done = [0] * threads
    stop = threading.Event()

    def work(k: int) -> None:
        while not stop.is_set():
            for batch in batches[k::threads]:
                done[k] += len(decode(batch)[1])
                if stop.is_set():
                    return

    print("ready", flush=True)
    pool = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for thread in pool:
        thread.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
        print(f"{time.monotonic():.6f} {sum(done)}", flush=True)
    stop.set()
    for thread in pool:
        thread.join()


class PySpyFailed(Exception):
    """py-spy could not sample the child: how it ended and the last lines it wrote to stderr."""


def _stop_child(child: subprocess.Popen, reader: threading.Thread) -> None:
    child.kill()
    child.wait()
    reader.join()


def _images_between(ticks: list[tuple[float, int]], start: float, end: float) -> float:
    """Images done between two monotonic times, interpolated between the child's ticks."""

    def at(t: float) -> float:
        for (t0, n0), (t1, n1) in zip(ticks, ticks[1:], strict=False):
            if t0 <= t <= t1:
                return n0 + (n1 - n0) * (t - t0) / (t1 - t0)
        raise ValueError("the sampling window is outside the child's ticks")

    return at(end) - at(start)


def _samples(path: Path) -> collections.Counter:
    """A py-spy raw file's samples in the decode function, by innermost frame (``function (file:line)``)."""
    frames: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if DECODE_FUNCTION in stack:
            frames[stack.rpartition(";")[2]] += int(count)
    return frames


def _voluntary_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


def _libpython() -> str | None:
    """The libpython the interpreter runs (where the uprobe goes), or None for a static one."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libpython3" in line and line.split()[-1].startswith("/"):
            return line.split()[-1]
    return None


def _perf_probe(function: str = LIBPYTHON_PROBE, at: str = "") -> str | None:
    """A perf uprobe on a libpython function (``at="%return"``: on its return), added if need be;
    None without perf or uprobes."""
    library = _libpython()
    if library is None or shutil.which("perf") is None:
        return None
    probe = f"{function}_gilbench"
    event = f"{probe}__return" if at == "%return" else probe  # perf's name for a return probe
    listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    if f":{event} " not in listed:
        added = subprocess.run(["perf", "probe", "-x", library, f"{probe}={function}{at}"], capture_output=True,
                               text=True)  # fmt: skip
        if added.returncode:
            return None
        # Removed as this run ends: a probe left on the system's libpython traps every later release.
        atexit.register(subprocess.run, ["perf", "probe", "-q", "-d", f"*:{event}"], capture_output=True)
    events = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout.split()
    return next((e for e in events if e.endswith(f":{event}")), None)


def _start_child(flist: Path, seconds: float, threads: int = 1, module: Path | None = None) -> tuple:
    """``(child, ticks, reader)``: a child decode loop (:py:func:`child_loop`) for ``seconds`` and
    a bit, ready; its ticks filled in by the reader thread until it ends."""
    env = {**os.environ, "GIL_BENCH_MODULE": str(module)} if module else None
    child = subprocess.Popen([sys.executable, __file__, "--child", str(flist), "--seconds", str(seconds + 4),
                              "--threads", str(threads)], stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    ticks: list[tuple[float, int]] = []
    reader = threading.Thread(target=lambda: ticks.extend(
        (float(t), int(n)) for t, n in (line.split() for line in child.stdout if line.strip() != "ready")))  # fmt: skip
    assert child.stdout.readline().strip() == "ready"
    reader.start()
    time.sleep(0.5)
    return child, ticks, reader


def held_stretches(flist: Path, seconds: float) -> dict | None:
    """The cross-check by another method: each stretch for which the child's decode thread holds
    the GIL, timed by perf between uprobes, from ``PyEval_RestoreThread``'s return to the next
    ``PyEval_SaveThread`` (the clock the child's ticks use); None without perf or uprobes."""
    events = [_perf_probe(), _perf_probe("PyEval_RestoreThread", "%return")]
    if None in events:
        return None
    child, ticks, reader = _start_child(flist, seconds)
    data = Path(os.environ.get("TMPDIR", "/tmp")) / f"gil_{child.pid}.perf"
    record = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-o", str(data), "-p", str(child.pid)]
    recorded = subprocess.run([*record, "-e", events[0], "-e", events[1], "--", "sleep", str(int(seconds))])
    child.wait()
    reader.join()
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,time,event", "--ns"], capture_output=True,
                            text=True) if recorded.returncode == 0 else None  # fmt: skip
    data.unlink(missing_ok=True)
    if script is None or script.returncode:  # perf said why
        return None
    by_thread: dict[str, list[tuple[float, bool]]] = collections.defaultdict(list)
    for tid, stamp, event in (line.split()[:3] for line in script.stdout.splitlines() if line.strip()):
        by_thread[tid].append((float(stamp.rstrip(":")), event.endswith("__return:")))
    marks = max(by_thread.values(), key=len)  # the decode thread's
    held, taken = [], None
    for stamp, is_taken in marks:
        if is_taken:
            taken = stamp
        elif taken is not None:
            held.append(stamp - taken)
            taken = None
    images = _images_between(ticks, marks[0][0], marks[-1][0])
    return {"held_us_per_image": 1e6 * sum(held) / images, "stretches_per_image": len(held) / images}


@functools.cache
def _probe_cost_us(seconds: float) -> float:
    """The uprobes' own cost per stretch, read once on a loop that holds the GIL next to nothing."""
    idle = held_stretches(IDLE_LOOP, seconds)
    return idle["held_us_per_image"] / idle["stretches_per_image"]


def _uprobe_check(flist: Path, seconds: float) -> dict | None:
    """:py:func:`held_stretches` on the set, less the probes' own cost, printed; None without perf."""
    exact = held_stretches(flist, seconds)
    if exact is None:
        print(f"{'':9s} uprobes: n/a (no perf, or no uprobes on this kernel)")
        return None
    held, n, cost = exact["held_us_per_image"], exact["stretches_per_image"], _probe_cost_us(seconds)
    print(f"{'':9s} uprobes: {held:.1f} us held per image over {n:.1f} stretches; a loop holding next to nothing "
          f"reads {cost:.2f} us a stretch (the probes' own cost): about {held - n * cost:.0f} us")  # fmt: skip
    return {**exact, "probe_cost_us_per_stretch": cost}


def sample(flist: Path, seconds: float, rate: int, threads: int = 1, module: Path | None = None) -> dict:
    """One child decode loop (:py:func:`child_loop`), sampled by py-spy (``--gil`` and ``--idle``
    at once, non-blocking) over ``seconds`` (whole seconds, py-spy's unit), then its GIL releases
    counted by perf over a window of its own: the uprobe's trap on each release would otherwise
    be in py-spy's samples, GIL held (+39 % per image, measured); the module imported from
    ``module`` (a folder) if given."""
    seconds = int(seconds)
    event = _perf_probe() if threads == 1 else None
    count_s = min(seconds, 4) if event else 0
    child, ticks, reader = _start_child(flist, seconds + count_s, threads, module)
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"gil_{child.pid}"
    spy = [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking",
           "--format", "raw", "-r", str(rate), "-d", str(seconds), "-p", str(child.pid)]  # fmt: skip
    switches0 = _voluntary_switches(child.pid)
    start = time.monotonic()
    flags, errors = ("--gil", "--idle"), [tempfile.TemporaryFile("w+") for _ in range(2)]
    try:
        runs = [subprocess.Popen([*spy, flag, "-o", f"{out}.{flag[2:]}"], stdout=subprocess.DEVNULL, stderr=error)
                for flag, error in zip(flags, errors, strict=True)]  # fmt: skip
    except OSError as e:
        _stop_child(child, reader)
        raise PySpyFailed(f"py-spy ({spy[0]}) cannot be run: {e.strerror or e}") from None
    for run in runs:
        run.wait()
    end = time.monotonic()
    for flag, run, error in zip(flags, runs, errors, strict=True):
        if run.returncode:
            _stop_child(child, reader)
            for suffix in ("gil", "idle"):
                Path(f"{out}.{suffix}").unlink(missing_ok=True)
            error.seek(0)
            said = " | ".join([line.strip() for line in error.read().splitlines() if line.strip()][-3:])
            raise PySpyFailed(f"py-spy record {flag} failed (exit status {run.returncode}): {said or 'no message'}")
    for error in errors:
        error.close()
    switches = _voluntary_switches(child.pid) - switches0
    releases = None
    if event:  # perf counts while its `sleep` runs: the images of the count_s seconds before it ends
        perf = subprocess.run(["perf", "stat", "-x,", "-e", event, "-p", str(child.pid), "--", "sleep", str(count_s)],
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        counted_until = time.monotonic()
    child.wait()
    reader.join()  # the child's ticks, past both windows
    if event:
        releases = int(perf.stderr.split(",")[0]) / _images_between(ticks, counted_until - count_s, counted_until)
    images = _images_between(ticks, start, end)
    held = _samples(Path(f"{out}.gil"))
    gil, idle = held.total(), _samples(Path(f"{out}.idle")).total()
    for suffix in ("gil", "idle"):
        Path(f"{out}.{suffix}").unlink()
    share = gil / idle
    per_image_s = threads * (end - start) / images
    return {"images": images, "seconds": end - start, "per_image_ms": 1e3 * per_image_s, "gil_samples": gil,
            "idle_samples": idle, "gil_share": share, "gil_per_image_us": 1e6 * share * per_image_s,
            "ceiling_fps": 1 / (share * per_image_s), "gil_releases_per_image": releases,
            "voluntary_switches_per_image": switches / images,
            "gil_held_at": {frame: n / gil for frame, n in held.most_common(12)}}  # fmt: skip


def _print_where(runs: list[dict], top: int = 8) -> None:
    """Where the decode loop holds the GIL: the innermost frames of the GIL-holding samples, each
    with its share of them (the mean over the runs) and, in this module, its line of source."""
    shares: collections.Counter = collections.Counter()
    for run in runs:
        shares.update({frame: share / len(runs) for frame, share in run["gil_held_at"].items()})
    source = (ROOT / "imagenet_classification.py").read_text().splitlines()
    print(f"{'':9s} where the GIL is held (share of the samples holding it):")
    for frame, share in shares.most_common(top):
        name, _, place = frame.rpartition(" (")
        file, _, line = place.rstrip(")").rpartition(":")
        text = source[int(line) - 1].strip() if file == "imagenet_classification.py" and line.isdigit() else ""
        print(f"{'':11s}{100 * share:5.1f} %  {name}, {file}:{line}  {text[:70]}")


def _module_at(commit: str, out: Path) -> Path:
    """A folder holding ``imagenet_classification.py`` as of ``commit``."""
    folder = out / f"module-{commit}"
    folder.mkdir(parents=True, exist_ok=True)
    text = subprocess.run(["git", "show", f"{commit}:imagenet_classification.py"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    (folder / "imagenet_classification.py").write_text(text)
    return folder


def tiny_set(root: Path, count: int = 512) -> Path:
    """``count`` 16 x 16 JPEGs (two colours, so that they are not all alike) and their list."""
    flist = root / f"tiny{count}.flist"
    if flist.exists():
        return flist
    folder = root / "tiny" / "n01440764"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (16, 16), (i % 256, 80, 255 - i % 256)).save(folder / f"tiny_{i:05d}.JPEG", quality=90)
    flist.write_text("".join(f"tiny/n01440764/tiny_{i:05d}.JPEG\n" for i in range(count)))
    return flist


def loader_fps(flist: Path, threads: int, transform: ic.EvalTransform, passes: int = 1, processes: int = 0) -> float:
    """Images/s of the SPDL loader as the CLI builds it (batches of 32, ``threads`` threads and
    batches at once, in each of ``processes`` worker processes if any), over the list ``passes``
    times, after 5 warm-up batches (the workers start before the clock: they deliver them)."""
    images = ic.read_file_list(flist, f"{flist.parent}/")
    items = ic.ImageList(images.paths * passes, images.labels * passes) if passes > 1 else images
    if processes:
        decode = functools.partial(ic._decode_in_worker, transform, ic.MAX_IMAGE_MB << 20)
    else:
        decode = ic.get_decode_func("cpu", transform, policy=ic.BadImagePolicy(skip=True))
    pipeline = ic.get_pipeline(items, 32, decode, threads, 16, threads, decode_processes=processes)
    with pipeline.auto_stop():
        return ic.measure_loader(pipeline.get_iterator(timeout=120), torch.device("cpu"), 5)


def targets(mix: Path, tiny: Path, repeats: int) -> dict:
    """Side by side, ``repeats`` times: decode-only at 2 threads, the loader at 2 and 16 threads
    on the mix, in 1 worker process of 2 threads and 2 of 1 (``--decode-processes``), and the
    loader at 2 and 16 threads on tiny images (the per-process ceiling)."""
    paths, tiny_transform = _paths(mix), ic.EvalTransform(size=16, crop_pct=1.0)
    names = ("decode_only_2", "loader_2", "loader_16", "processes_1x2", "processes_2x1", "tiny_2", "tiny_16")
    runs: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(repeats):
        runs["decode_only_2"].append(decode_only_rate(paths[:2000], 2))
        runs["loader_2"].append(loader_fps(mix, 2, ic.EvalTransform()))
        runs["loader_16"].append(loader_fps(mix, 16, ic.EvalTransform()))
        runs["processes_1x2"].append(loader_fps(mix, 2, ic.EvalTransform(), processes=1))
        runs["processes_2x1"].append(loader_fps(mix, 1, ic.EvalTransform(), processes=2))
        runs["tiny_2"].append(loader_fps(tiny, 2, tiny_transform, passes=8))
        runs["tiny_16"].append(loader_fps(tiny, 16, tiny_transform, passes=8))
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(runs[a], runs[b], strict=True))  # noqa: E731
    return {"runs": runs, "medians": {k: statistics.median(v) for k, v in runs.items()},
            "loader_2_over_decode_only_2": ratio("loader_2", "decode_only_2"),
            "loader_16_over_loader_2": ratio("loader_16", "loader_2"),
            "processes_1x2_over_loader_2": ratio("processes_1x2", "loader_2"),
            "processes_2x1_over_loader_2": ratio("processes_2x1", "loader_2"),
            "tiny_16_over_tiny_2": ratio("tiny_16", "tiny_2")}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--images", type=ic._count, default=2000)
    parser.add_argument("--seconds", type=ic._seconds, default=15, help="each sampling window")
    parser.add_argument("--rate", type=ic._count, default=400, help="py-spy samples per second")
    parser.add_argument("--repeats", type=ic._count, default=3)
    parser.add_argument("--before", metavar="COMMIT", help="also sample the module as of this commit, side by side")
    parser.add_argument("--no-targets", action="store_false", dest="targets", help="only the GIL figures")
    parser.add_argument("--no-sampling", action="store_false", dest="sampling", help="only the loader's ratios")
    parser.add_argument("--uprobes", action="store_true", help="also time each GIL-held stretch with perf uprobes")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=ic._count, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_loop(args.child, args.seconds, args.threads)
    if not args.targets and not args.sampling:  # a gil.json of nothing would replace the last one
        parser.error("arguments --no-targets, --no-sampling: both given: nothing to measure")
    if args.before and subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.before}^{{commit}}"],
                                      cwd=ROOT, capture_output=True).returncode:  # fmt: skip
        parser.error(f"argument --before: {args.before}: not a commit of this repository")
    if args.seconds < 1:  # py-spy samples whole seconds: int(seconds) would be 0
        parser.error(f"argument --seconds: {args.seconds:g}: at least 1 (py-spy samples whole seconds)")
    if args.targets:
        check_image_count(parser, args.images, threads=16)  # the loader's 5 warm-up batches of 32, at 16 threads
    out_folder(parser, "--out", args.out)
    out_file(parser, "--out", args.out / "gil.json")  # now, not after the run's minutes
    sub_folder(parser, "--out", args.out / "images")
    # The images that decode, the others a counted skip (as left_out in gil.json); with the targets,
    # enough for the loader's timing.
    tiny = _decodable_tiny(parser, args.out / "images") if args.targets else None
    made = {name: make_image_set(args.out / "images", args.images, mix=name) for name in ("imagenet", "default")}
    sets, left_out = {}, {}
    for name, flist in made.items():
        sets[name], failed = decodable_set(parser, flist, args.images) if args.targets else decodable(flist)
        left_out[name] = [str(e) for e in failed]
        if not sets[name].read_text().strip():  # nothing to sample: the GIL's share would be 0 / 0
            parser.error(f"argument --images: {args.images}: none of the set's images decode ({flist})")
    if tiny:
        left_out["tiny"] = [str(e) for e in tiny[1]]
    try:
        measure(args, sets, tiny[0] if tiny else None, left_out)
    except PySpyFailed as e:  # one line, no usage: the arguments were fine
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def _decodable_tiny(parser: argparse.ArgumentParser, root: Path) -> tuple[Path, list[ic.ImageDecodeError]]:
    """The tiny set (:py:func:`tiny_set`, reused if made before) less its images that do not decode, a
    counted skip; ``parser.error`` where too few are left for the loader's warm-up and a batch to time
    over its 8 passes."""
    flist, failed = decodable(tiny_set(root))
    if (count := len(flist.read_text().splitlines())) * 8 < (need := min_images()):
        parser.error(f"argument --out: {root / 'tiny'}: only {count} of its tiny images decode, the loader needs "
                     f"{-(-need // 8)}: delete it and tiny512.flist beside it to make them anew")  # fmt: skip
    return flist, failed


def measure(args: argparse.Namespace, sets: dict[str, Path], tiny: Path | None, left_out: dict[str, list]) -> None:
    """Everything after the arguments' checks and the image sets: the sampling, the targets, ``gil.json``."""
    results: dict = {"sampled": {}, "left_out": left_out, "env": ic._environment(torch.device("cpu"))}
    before = _module_at(args.before, args.out) if args.before else None
    for name, flist in sets.items() if args.sampling else ():
        runs, old = [], []
        for _ in range(args.repeats):  # before and now alternating, so that the machine's load hits both
            if before:
                old.append(sample(flist, args.seconds, args.rate, module=before))
            runs.append(sample(flist, args.seconds, args.rate))
        two = sample(flist, args.seconds, args.rate, threads=2)
        results["sampled"][name] = {"one_thread": runs, "two_threads": two, "before": old}
        if old:
            shares = ", ".join(f"{100 * r['gil_share']:.2f}" for r in old)
            print(f"{name:9s} before ({args.before}): GIL held "
                  f"{100 * statistics.median(r['gil_share'] for r in old):.2f} % (runs: {shares}), "
                  f"{statistics.median(r['per_image_ms'] for r in old):.3f} ms an image")  # fmt: skip
        med = {k: statistics.median(r[k] for r in runs) for k in ("gil_share", "per_image_ms", "gil_per_image_us",
                                                                 "ceiling_fps")}  # fmt: skip
        shares = ", ".join(f"{100 * r['gil_share']:.2f}" for r in runs)
        releases = [r["gil_releases_per_image"] for r in runs if r["gil_releases_per_image"] is not None]
        print(f"{name:9s} one thread: GIL held {100 * med['gil_share']:.2f} % of the decode loop "
              f"(runs: {shares}), {med['per_image_ms']:.3f} ms "
              f"an image, {med['gil_per_image_us']:.1f} us of it with the GIL: ceiling {med['ceiling_fps']:.0f} "
              f"images/s")  # fmt: skip
        print(f"{'':9s} GIL releases per image (perf, {LIBPYTHON_PROBE}): "
              f"{statistics.median(releases) if releases else 'n/a (no perf uprobe)'}; two threads: voluntary "
              f"switches per image {two['voluntary_switches_per_image']:.2f}, GIL held "
              f"{100 * two['gil_share']:.2f} % of each thread's loop")  # fmt: skip
        _print_where(runs)
        if args.uprobes:
            results["sampled"][name]["uprobes"] = _uprobe_check(flist, args.seconds)
    if not args.targets:
        ic._write_atomically(args.out / "gil.json", json.dumps(results, indent=2) + "\n")
        return None
    results["targets"] = t = targets(sets["imagenet"], tiny, args.repeats)
    m = t["medians"]
    # The loader's windows on the mix, as check_image_count warned: too short, a verdict would mean nothing.
    images = len(sets["imagenet"].read_text().splitlines())
    short = [n for n in (2, 16) if window_overstates(images, threads=n) > ic.FPS_WINDOW_SLACK]
    t["not_judged"] = [f"loader_{n}" for n in short]

    def verdict(target: str, threads: int) -> str:
        return f"(not judged: the window at {threads} threads is too short)" if threads in short else target

    print(f"realistic mix: decode-only at 2 threads {m['decode_only_2']:.0f}, the loader at 2 threads "
          f"{m['loader_2']:.0f}, at 16 threads {m['loader_16']:.0f} images/s")  # fmt: skip
    print(f"  loader at 2 threads / decode-only at 2 threads   {t['loader_2_over_decode_only_2']:.2f} "
          f"{verdict('(target >= 0.75)', 2)}")  # fmt: skip
    print(f"  loader at 16 threads / loader at 2 threads       {t['loader_16_over_loader_2']:.2f} "
          f"{verdict('(target >= 0.95)', 16)}")  # fmt: skip
    one, two = t["processes_1x2_over_loader_2"], t["processes_2x1_over_loader_2"]
    print(f"  worker processes x threads: 1 x 2 {m['processes_1x2']:.0f} ({one:.2f} of 2 threads in one process), "
          f"2 x 1 {m['processes_2x1']:.0f} ({two:.2f})")  # fmt: skip
    print(f"tiny images (the per-process ceiling): the loader at 2 threads {m['tiny_2']:.0f}, at 16 threads "
          f"{m['tiny_16']:.0f} images/s ({t['tiny_16_over_tiny_2']:.2f})")  # fmt: skip
    ic._write_atomically(args.out / "gil.json", json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out / 'gil.json'}")


if __name__ == "__main__":
    run_script(main)
