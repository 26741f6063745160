"""Is the disk the bottleneck? Reading alone and the loader, cold and warm, side by side.

Generates compare_loaders' JPEG set (written through to disk, so that eviction can drop its
pages), then measures, interleaved and repeated, at each thread count:

- reading alone (the loader's reads, :py:func:`read_image_bytes`, as many batches at once in a
  thread pool, no decode; what ``--breakdown`` reports as the read ceiling), right after
  evicting the files from the page cache (cold) and again with them in it (warm);
- the SPDL loader alone (read, decode, resize, crop, batch), cold and warm likewise.

Prints the rates, the share of the set's bytes in memory as each pass began (a warning, and
``cold_not_cold`` in the results, where eviction left them in memory: tmpfs), and the ratios
cold / warm, each the median over the repeats of the ratio within a repeat. Writes ``OUT/read_ceiling.json``. Usage::

    python bench/read_ceiling.py --out bench/out --images 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]

import torch  # noqa: E402
from cli_checks import max_threads, out_file, out_folder, run, sub_folder  # noqa: E402
from compare_loaders import check_image_count, decodable_set, make_image_set  # noqa: E402

import imagenet_classification as ic  # noqa: E402

CPU = torch.device("cpu")


def _sync(paths: list[str]) -> None:
    """Write the set's pages to disk: eviction drops clean pages only."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _resident(images: ic.ImageList, cold: bool) -> float | None:
    """Evict the files first when ``cold``; the share of their bytes in memory now."""
    cache = ic._examine_page_cache(images.paths, evict=cold)
    return cache.resident_after if cold else cache.resident


def _warn_if_not_evicted(prog: str, out: Path, shares: list[float | None]) -> bool:
    """A warning where eviction left more than ``COLD_RESIDUE`` of the set in memory in any of
    ``shares`` (each as a cold pass began): those "cold" reads came from memory. Whether it did."""
    kept = max((s for s in shares if s is not None), default=0.0)
    if kept <= ic.COLD_RESIDUE:
        return False
    print(f"{prog}: warning: eviction left {kept:.0%} of the set's bytes in memory: the file system of --out {out} "
          "ignores it (tmpfs, some network file systems): the cold passes read from memory, not the disk",
          file=sys.stderr)  # fmt: skip
    return True


def read_rate(images: ic.ImageList, threads: int, batch_size: int, warmup: int) -> tuple[float, float]:
    """Images/s and MB/s of reading alone, as ``--breakdown`` times it."""
    return ic._measure_reads(ic._read_batches(images, batch_size, threads, ic.MAX_IMAGE_MB << 20, 120), warmup)


def loader_rate(images: ic.ImageList, threads: int, batch_size: int, warmup: int) -> float:
    """Images/s of the SPDL loader alone, as ``--breakdown`` times it."""
    transform = ic.EvalTransform.from_model("mobilenetv3_large_100")
    decode = ic.get_decode_func(CPU, transform, "ffmpeg", ic.BadImagePolicy(skip=True))
    pipeline = ic.get_pipeline(images, batch_size, decode, threads, 8, threads)
    pipeline.start()
    try:
        return ic.measure_loader(pipeline.get_iterator(timeout=120), CPU, warmup)
    finally:
        pipeline.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--images", type=ic._count, default=2000)
    parser.add_argument("--repeats", type=ic._count, default=3)
    parser.add_argument("--max-threads", type=max_threads, default=os.cpu_count())
    parser.add_argument("--batch-size", type=ic._count, default=32)
    args = parser.parse_args()
    warmup = 2
    check_image_count(parser, args.images, args.batch_size, args.max_threads, warmup)
    out_folder(parser, "--out", args.out)
    out_file(parser, "--out", args.out / "read_ceiling.json")
    sub_folder(parser, "--out", args.out / "images")
    flist, left_out = decodable_set(parser, make_image_set(args.out / "images", args.images), args.images,
                                    args.batch_size, warmup)  # fmt: skip
    images = ic.read_file_list(flist, f"{flist.parent}/")
    _sync(list(images.paths))
    size = ic._examine_page_cache(images.paths).bytes
    _warn_if_not_evicted(parser.prog, args.out, [_resident(images, cold=True)])  # now, not after the minutes
    threads = sorted({1, args.max_threads})
    runs: dict = {f"{what}_{state}": {str(t): [] for t in threads} for what in ("read", "loader")
                  for state in ("cold", "warm")}  # fmt: skip
    resident: dict = {key: [] for key in runs}
    for repeat in range(args.repeats):  # interleaved, so that a drift of the machine hits every pass alike
        for t in threads:
            for what, rate in (("read", read_rate), ("loader", loader_rate)):
                for state in ("cold", "warm"):  # the cold pass leaves the files in memory for the warm one
                    resident[f"{what}_{state}"].append(_resident(images, state == "cold"))
                    runs[f"{what}_{state}"][str(t)].append(rate(images, t, args.batch_size, warmup))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)

    def median(key: str, t: int, index: int = 0) -> float:
        values = runs[key][str(t)]
        return statistics.median(v[index] if isinstance(v, tuple) else v for v in values)

    def paired(t: int, what: str) -> float:
        """Median over the repeats of cold over warm, each pair measured one right after the other."""
        cold, warm = runs[f"{what}_cold"][str(t)], runs[f"{what}_warm"][str(t)]
        first = (lambda v: v[0]) if what == "read" else (lambda v: v)
        return statistics.median(first(c) / first(w) for c, w in zip(cold, warm, strict=True))

    cold = [share for key, shares in resident.items() if key.endswith("_cold") for share in shares]
    results = {"images": len(images), "left_out": [str(e) for e in left_out], "bytes": size, "threads": threads,
               "runs": runs, "resident": resident,
               "cold_not_cold": _warn_if_not_evicted(parser.prog, args.out, cold),
               "ratios": {f"{what}_cold_over_warm_{t}threads": paired(t, what) for what in ("read", "loader")
                          for t in threads},
               "env": ic._environment(CPU)}  # fmt: skip
    for t in threads:
        pairs = zip(runs["loader_cold"][str(t)], runs["read_cold"][str(t)], strict=True)  # in the same repeat
        results["ratios"][f"loader_over_read_cold_{t}threads"] = statistics.median(lo / r[0] for lo, r in pairs)
    ic._write_atomically(args.out / "read_ceiling.json", json.dumps(results, indent=2) + "\n")
    print(f"{len(images)} images, {size / 1e6:.1f} MB; in memory as each pass began (min-max): "
          + ", ".join(f"{k} {min(v):.0%}-{max(v):.0%}" for k, v in resident.items()))  # fmt: skip
    for t in threads:
        print(f"{t} thread(s): reading alone cold {median('read_cold', t):7.0f} images/s "
              f"({median('read_cold', t, 1):6.1f} MB/s), warm {median('read_warm', t):7.0f} "
              f"({median('read_warm', t, 1):6.1f} MB/s) | loader alone cold {median('loader_cold', t):5.0f}, "
              f"warm {median('loader_warm', t):5.0f} images/s")  # fmt: skip
    print("ratios, each the median over the repeats of the ratio within a repeat (not the quotient of the medians):")
    for name, value in results["ratios"].items():
        print(f"{name:36s} {value:.3f}")
    print(f"wrote {args.out / 'read_ceiling.json'}")


if __name__ == "__main__":
    run(main)
