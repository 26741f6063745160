"""Prove the GPU paths on real hardware: every decoder, loader-only and end-to-end, and agreement.

Run by ``bench/gpu_check.sh`` on a machine with an NVIDIA GPU and no network, from the bundle
that ``bench/gpu_prepare.sh`` filled. For each decoder (FFmpeg + copy, nvJPEG, NVDEC) it runs
the benchmark in a subprocess on a generated ImageNet-like JPEG set with ``torch.compile`` and
bf16 on and ``--breakdown`` (which times the loader alone, the model alone and end-to-end),
then decodes unusual but valid images (greyscale, CMYK, progressive, 4:4:4, PNG data, huge and
tiny, data after the end, animated) with each decoder against FFmpeg on the CPU, and
classifies the real photos through each decoder with real weights and measures how often each
decoder's top-1 agrees with FFmpeg's. One leg's failure is recorded and the others go on.

Everything fits in ``--time-budget``: the first leg gets twice ``--leg-timeout`` because it
also fills torch.compile's on-disk caches, which the later legs (other processes) reuse; no
leg may eat the time the photo agreement needs; and ``gpu_check.json`` is rewritten after each
step, so a check cut short still leaves what it measured.

Usage (``--device cpu --decoders ffmpeg`` runs the CPU legs anywhere)::

    python bench/gpu_check.py --bundle bench/gpu_bundle --out OUT [--device cuda] [--images 4000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "scripts")]

DECODER_FLAGS = {"ffmpeg": [], "nvjpeg": ["--use-nvjpeg"], "nvdec": ["--use-nvdec"]}
AGREEMENT_RESERVE_S = 60  # kept for the unusual images and the photos through every decoder, uncompiled


def write_report(report: dict, out: Path) -> None:
    """(Re)write ``gpu_check.json`` with what has been measured so far."""
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")


def run_leg(name: str, args: list[str], out: Path, timeout: float, log) -> dict:
    """Run the benchmark's CLI once; return its results file, or the error it stopped with."""
    results = out / f"{name}.json"
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), *args, "--results-file", str(results)]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:g} s"}
    log.write(f"### {name}: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    entry = {"ok": proc.returncode == 0, "exit": proc.returncode, "wall_s": time.monotonic() - started}
    if results.exists():
        entry["result"] = json.loads(results.read_text())
    if proc.returncode:
        entry["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return entry


def top1_per_image(flist: Path, checkpoint: Path, device: str, decoder: str) -> dict[str, int]:
    """Top-1 class of each listed photo, decoded by ``decoder`` and classified with real weights."""
    import torch

    import imagenet_classification as ic

    ic.check_gpu_decoder(decoder, torch.device(device))  # a clear reason if it cannot run here
    model = ic.get_model("efficientnet_lite0", device, checkpoint=checkpoint, compile=False, dtype="float32")
    decode = ic.get_decode_func(device, model.transform, decoder)
    items = list(ic.source(flist, f"{flist.parent}/"))
    predictions = {}
    with torch.inference_mode():
        for start in range(0, len(items), 16):
            batch = items[start : start + 16]
            images, _ = decode(batch)
            logits = model.model(model.preprocessing(images))
            predictions.update(zip((p for p, _ in batch), logits.argmax(dim=1).tolist(), strict=True))
    return predictions


def unusual_images(folder: Path, device: str, decoders: list[str], log) -> dict:
    """Each decoder on unusual but valid images (scripts/make_unusual_images.py) against FFmpeg
    on the CPU: per image the mean absolute difference (0-255) or why it failed, and how many
    images the decoder handed to FFmpeg. A wrong layout or a broken fallback shows as a failure
    or a difference in the tens."""
    import torch
    from make_unusual_images import make_unusual_images

    import imagenet_classification as ic

    items = [(str(path), 0) for path in make_unusual_images(folder)]
    reference = [image.float() for image in ic.get_decode_func("cpu")(items)[0]]
    out: dict = {"images": len(items)}
    for decoder in decoders:
        policy = ic.BadImagePolicy(skip=True)
        try:
            ic.check_gpu_decoder(decoder, torch.device(device))
            decode = ic.get_decode_func(device, decoder=decoder, policy=policy)
            mads = {}
            for item, expected in zip(items, reference, strict=True):  # one by one: a failure names its image
                images, _ = decode([item])
                name = Path(item[0]).name
                mads[name] = (images[0].cpu().float() - expected).abs().mean().item() if len(images) else None
        except Exception as e:  # a decoder that cannot run here is reported, not fatal to the check
            log.write(f"### unusual images {decoder}: {type(e).__name__}: {e}\n")
            out[decoder] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            continue
        failed = {Path(f.path).name: f.reason for f in policy.failures()}
        worst = max((m for m in mads.values() if m is not None), default=0.0)
        out[decoder] = {"ok": not failed and worst < 10, "mad": mads, "failed": failed,
                        "fallbacks": policy.fallbacks, "max_mad": worst}  # fmt: skip
    return out


def agreement(photos: Path, checkpoint: Path, device: str, decoders: list[str], log) -> dict:
    """Share of photos whose top-1 through each decoder equals FFmpeg's."""
    reference = top1_per_image(photos, checkpoint, device, "ffmpeg")
    out = {"photos": len(reference)}
    for decoder in decoders:
        if decoder == "ffmpeg":
            continue
        try:
            other = top1_per_image(photos, checkpoint, device, decoder)
        except Exception as e:  # a decoder that cannot run here is reported, not fatal to the check
            log.write(f"### agreement {decoder}: {type(e).__name__}: {e}\n")
            out[decoder] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            continue
        same = sum(reference[p] == other.get(p) for p in reference)
        out[decoder] = {"ok": True, "agree": same / len(reference)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "bench" / "gpu_bundle")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--decoders", default="ffmpeg,nvjpeg,nvdec")
    parser.add_argument("--leg-timeout", type=float, default=120, help="seconds per leg; the first gets twice")
    parser.add_argument("--time-budget", type=float, default=450, help="seconds for the whole check")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    decoders = args.decoders.split(",")

    from compare_loaders import make_image_set

    photos = args.bundle / "photos" / "val.flist"
    sources = [(photos.parent / line, line.split("/")[1]) for line in photos.read_text().split()]
    flist = make_image_set(args.out / "images", args.images, photos=sources)
    checkpoint = args.bundle / "efficientnet_lite0.pth"
    import torch

    import imagenet_classification as ic

    # gpu_check.sh wrote what the machine has first, in case nothing after it runs.
    first = args.out / "gpu_check.json"
    report: dict = json.loads(first.read_text()) if first.exists() else {}
    report.update({"device": args.device, "images": args.images, "legs": {}})
    report["env"] = ic.environment(torch.device(args.device))
    deadline = time.monotonic() + args.time_budget - AGREEMENT_RESERVE_S
    with open(args.out / "gpu_check.log", "w") as log:
        for i, decoder in enumerate(decoders):
            common = ["--input-flist", str(flist), "--prefix", f"{flist.parent}/", "--device", args.device,
                      "--batch-size", str(args.batch_size), "--num-threads", str(args.threads),
                      "--model", "mobilenetv3_large_100", "--no-pretrained", "--breakdown",
                      *([] if args.compile else ["--no-compile"]), *DECODER_FLAGS[decoder]]  # fmt: skip
            timeout = min(args.leg_timeout * (2 if i == 0 else 1), deadline - time.monotonic())
            if timeout < 10:
                report["legs"][decoder] = {"ok": False, "error": "not run: the time budget was spent"}
            else:
                report["legs"][decoder] = run_leg(decoder, common, args.out, timeout, log)
            print(f"{decoder}: {summary(report['legs'][decoder])}", flush=True)
            write_report(report, args.out)
        try:
            report["unusual_images"] = unusual_images(args.out / "unusual", args.device, decoders, log)
            verdicts = {k: v["ok"] for k, v in report["unusual_images"].items() if k != "images"}
        except Exception as e:  # e.g. FFmpeg on the CPU failing one: recorded, the agreement still runs
            report["unusual_images"] = verdicts = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"unusual images, each decoder against FFmpeg on the CPU: {verdicts}", flush=True)
        write_report(report, args.out)
        report["agreement"] = agreement(photos, checkpoint, args.device, decoders, log)
        print(f"top-1 agreement with FFmpeg on {report['agreement']['photos']} photos: "
              f"{ {k: v for k, v in report['agreement'].items() if k != 'photos'} }", flush=True)  # fmt: skip
    write_report(report, args.out)


def summary(leg: dict) -> str:
    """One line for a leg: its three rates and the verdict, or why it failed."""
    if not leg.get("ok"):
        return f"FAILED: {leg.get('error')}"
    b, decoder = leg["result"]["breakdown"], leg["result"]["config"]["decoder"]
    rates = f"loader {b['loader_fps']:.0f}, model {b['model_fps']:.0f}, end-to-end {b['e2e_fps']:.0f} images/s"
    return f"{rates} ({b['efficiency']:.0%} of the bound, {b['bottleneck']} bound); decoder {decoder}"


if __name__ == "__main__":
    main()
