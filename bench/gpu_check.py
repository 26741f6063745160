"""Prove the GPU paths on real hardware: every decoder, loader-only and end-to-end, and agreement.

Run by ``bench/gpu_check.sh`` on a machine with an NVIDIA GPU and no network, from the bundle
that ``bench/gpu_prepare.sh`` filled. First it measures decode-only images/s at batch 128 for
each of nvImageCodec's backends (hardware JPEG engines, CUDA, hybrid) against torchvision's
nvJPEG, the GPU resize grouped by size against one image at a time, and reads the number of
hardware JPEG engines. For each decoder (FFmpeg + copy, nvJPEG, NVDEC) it runs
the benchmark in a subprocess on a generated ImageNet-like JPEG set with ``torch.compile`` and
bf16 on and ``--breakdown`` (which times the loader alone, the model alone and end-to-end),
then decodes unusual but valid images (greyscale, CMYK, progressive, 4:4:4, PNG data, huge and
tiny, data after the end, animated) with each decoder against FFmpeg on the CPU, and
classifies the real photos through each decoder with real weights and measures how often each
decoder's top-1 agrees with FFmpeg's. One leg's failure is recorded and the others go on.
FFmpeg's leg runs again with the decode stage in worker processes (``--layouts``, default 4 x 4
and 2 x 8 against 16 threads in one process: issue #22), and every leg records its CPU time
over its wall time.

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
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "scripts")]

from cli_checks import out_folder, run, seconds, sub_folder, whole  # noqa: E402

DECODER_FLAGS = {"ffmpeg": [], "nvjpeg": ["--use-nvjpeg"], "nvdec": ["--use-nvdec"]}
AGREEMENT_RESERVE_S = 60  # kept for the unusual images and the photos through every decoder, uncompiled


def write_report(report: dict, out: Path) -> None:
    """(Re)write ``gpu_check.json`` with what has been measured so far."""
    import imagenet_classification as ic

    ic._write_atomically(out / "gpu_check.json", json.dumps(report, indent=2) + "\n")  # a kill leaves the last one


def _first_report(path: Path) -> dict:
    """The report gpu_check.sh began (what the machine has), or a new one; one that does not read
    (cut short by a full disk) is kept aside as ``.broken``, said in one line."""
    if not path.exists():
        return {}
    try:
        report = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        report = e
    if isinstance(report, dict):
        return report
    broken = path.with_name(f"{path.name}.broken")
    path.replace(broken)
    why = report if isinstance(report, Exception) else "not a JSON object"
    print(f"{Path(sys.argv[0]).name}: warning: {path}: not a report ({why}): kept as {broken}; starting a new one",
          file=sys.stderr)  # fmt: skip
    return {}


def run_leg(name: str, args: list[str], out: Path, timeout: float, log) -> dict:
    """Run the benchmark's CLI once; return its results file, or the error it stopped with."""
    results = out / f"{name}.json"
    results.unlink(missing_ok=True)  # a run's before this one, into the same --out: not this leg's result
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), *args, "--results-file", str(results)]
    started, cpu = time.monotonic(), _children_cpu_s()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # what it printed so far says where it was
        partial = [(x.decode(errors="replace") if isinstance(x, bytes) else x) or "" for x in (e.stdout, e.stderr)]
        log.write(f"### {name} (timed out after {timeout:g} s): {' '.join(cmd)}\n{''.join(partial)}\n")
        log.flush()
        tail = "".join(partial).strip().splitlines()[-3:]
        return {"ok": False, "error": f"timed out after {timeout:g} s", "output_tail": tail}
    log.write(f"### {name}: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    log.flush()
    wall_s, cpu_s = time.monotonic() - started, _children_cpu_s() - cpu
    # CPU time of the leg's processes (its decode workers included: it joins them) over its wall
    # time: how many cores it kept busy, whether in threads or in --decode-processes workers.
    entry = {"ok": proc.returncode == 0, "exit": proc.returncode, "wall_s": wall_s, "cpu_s": cpu_s,
             "cpu_over_wall": cpu_s / wall_s}  # fmt: skip
    if results.exists():
        entry["result"] = json.loads(results.read_text())
    if proc.returncode:
        entry["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return entry


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def top1_per_image(flist: Path, checkpoint: Path, device: str, decoder: str) -> dict[str, int]:
    """Top-1 class of each listed photo, decoded by ``decoder`` and classified with real weights."""
    import torch

    import imagenet_classification as ic

    ic._check_gpu_decoder(decoder, torch.device(device))  # a clear reason if it cannot run here
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
            ic._check_gpu_decoder(decoder, torch.device(device))
            decode = ic.get_decode_func(device, decoder=decoder, policy=policy)
            mads, failures, fallbacks = {}, [], 0
            for item, expected in zip(items, reference, strict=True):  # one by one: a failure names its image
                batch = decode([item])
                images, _ = batch
                failures += batch.failures
                fallbacks += batch.fallbacks
                name = Path(item[0]).name
                mads[name] = (images[0].cpu().float() - expected).abs().mean().item() if len(images) else None
        except Exception as e:  # a decoder that cannot run here is reported, not fatal to the check
            log.write(f"### unusual images {decoder}: {type(e).__name__}: {e}\n")
            out[decoder] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            continue
        failed = {Path(f.path).name: f.reason for f in failures}
        worst = max((m for m in mads.values() if m is not None), default=0.0)
        out[decoder] = {"ok": not failed and worst < 10, "mad": mads, "failed": failed,
                        "fallbacks": fallbacks, "max_mad": worst}  # fmt: skip
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


def decode_rates(flist: Path) -> dict:
    """FFmpeg decode-only images/s in one thread and in every core's thread, as the loader
    decodes (the yardstick of the target: the loader at 0.75 x cores x the one-core rate)."""
    import os

    from compare_loaders import decode_only_rate

    paths = [str(flist.parent / line) for line in flist.read_text().split()][:1600]
    cores = os.cpu_count() or 1
    one = decode_only_rate(paths[:400], 1, as_loader=True)
    return {"cores": cores, "one_core_fps": one, "all_cores_fps": decode_only_rate(paths, cores, as_loader=True),
            "target_loader_fps": 0.75 * cores * one}  # fmt: skip


NVJPEG_BATCH = 128  # images per decode call in nvjpeg_rates, as the loader's default batch
RATE_S = 2.0  # each rate in nvjpeg_rates: batches for about this long, after one untimed


def _rate(step, images: int, seconds: float) -> float:
    """Images/s of ``step`` (which decodes or resizes ``images`` and waits for the device), run
    for about ``seconds`` after one untimed run (allocations, a decoder's first use)."""
    step()
    runs, start = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - start < seconds:
        step()
        runs += 1
    return runs * images / (time.perf_counter() - start)


def jpeg_engines() -> dict:
    """The GPU's hardware JPEG decoders, as nvJPEG reports them (``nvjpegGetHardwareDecoderInfo``,
    nvJPEG 11.9 and later, on a handle of its hardware backend): engines and cores per engine.
    nvImageCodec reads the same figures, but only logs them."""
    import ctypes

    bundled = [Path(p) / "nvidia/cu13/lib/libnvjpeg.so.13" for p in sys.path if p]
    for name in ["libnvjpeg.so.13", *(str(p) for p in bundled if p.exists())]:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            error = str(e)
    else:
        return {"error": error}
    handle, engines, cores = ctypes.c_void_p(), ctypes.c_uint(), ctypes.c_uint()
    lib.nvjpegCreateEx.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p]
    status = lib.nvjpegCreateEx(3, None, None, 0, ctypes.byref(handle))  # 3: NVJPEG_BACKEND_HARDWARE
    if status:
        return {"library": name, "engines": 0, "error": f"nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE) returned {status}"}
    try:
        lib.nvjpegGetHardwareDecoderInfo.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        status = lib.nvjpegGetHardwareDecoderInfo(handle, ctypes.byref(engines), ctypes.byref(cores))
    finally:
        lib.nvjpegDestroy.argtypes = [ctypes.c_void_p]
        lib.nvjpegDestroy(handle)
    if status:
        return {"library": name, "error": f"nvjpegGetHardwareDecoderInfo returned {status}"}
    return {"library": name, "engines": engines.value, "cores_per_engine": cores.value}


def nvjpeg_rates(flist: Path, device: str, batch_size: int = NVJPEG_BATCH, seconds: float = RATE_S) -> dict:
    """Decode-only images/s of one batch of the set's JPEGs: nvImageCodec with each backend alone
    (hardware, cuda, hybrid on a GPU; its CPU decoder elsewhere), torchvision's batched
    ``decode_jpeg``; then the GPU resize and crop of the decoded batch, grouped by size (one call
    per size, as the loader does) against one image at a time. Each side by side in one run."""
    import torch
    import torchvision.io

    import imagenet_classification as ic

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    datas = [(flist.parent / line).read_bytes() for line in flist.read_text().split()[:batch_size]]
    datas = [data for data in datas if ic._nvjpeg_takes(ic._parse_jpeg_header(data), ic.EvalTransform())]
    out: dict = {"device": device, "batch": len(datas), "jpeg_engines": jpeg_engines() if dev.type == "cuda" else None}
    nvimgcodec, said = ic._nvimgcodec()
    if nvimgcodec is None:
        out["nvimgcodec"] = {"error": said}
    decoded = None
    errors: list[str] = []
    for backend, decoder in ic._nvimgcodec_decoders(dev, errors) if nvimgcodec is not None else ():
        try:
            stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0

            def decode(decoder=decoder, stream=stream):
                images = decoder.decode(datas, params=ic._nvimgcodec_params(), cuda_stream=stream)
                sync()
                return images

            images = decode()
            taken = sum(image is not None for image in images)
            out[f"nvimgcodec_{backend}"] = {"decoded": taken, "fps": _rate(decode, taken, seconds) if taken else 0.0}
            if decoded is None and taken == len(datas):
                decoded = [ic._nvimgcodec_tensor(image) for image in images]
        except Exception as e:  # a backend that fails is reported, not fatal to the check
            out[f"nvimgcodec_{backend}"] = {"error": f"{type(e).__name__}: {e}"}
    for error in errors:  # "backend: why": a backend this machine lacks
        backend, _, why = error.partition(": ")
        out[f"nvimgcodec_{backend}"] = {"error": f"RuntimeError: {why}"}
    try:
        encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in datas]

        def decode_torchvision():
            images = torchvision.io.decode_jpeg(encoded, mode=torchvision.io.ImageReadMode.RGB, device=dev)
            sync()
            return images

        out["torchvision"] = {"decoded": len(datas), "fps": _rate(decode_torchvision, len(datas), seconds)}
        decoded = decoded or list(decode_torchvision())
    except Exception as e:  # e.g. torchvision without nvJPEG
        out["torchvision"] = {"error": f"{type(e).__name__}: {e}"}
    if decoded:
        out["resize"] = resize_rates(decoded, sync, seconds)
    return out


def resize_rates(images: list, sync, seconds: float) -> dict:
    """Images/s of the loader's resize and crop of decoded images: grouped by size, and one by one."""
    import imagenet_classification as ic

    transform = ic.EvalTransform()
    grouped = _rate(lambda: (ic._resize_crop_groups(images, transform), sync()), len(images), seconds)
    single = _rate(
        lambda: ([ic._resize_crop_on_device(im[None], transform) for im in images], sync()), len(images), seconds
    )
    sizes = len({tuple(image.shape) for image in images})
    return {"sizes": sizes, "grouped_fps": grouped, "per_image_fps": single, "grouped_over_per_image": grouped / single}


def _first_jpeg_image(data: bytes) -> bytes:
    """The data up to its first image's end, as the loader gives NVDEC (no MPO's second image, no trailer)."""
    import imagenet_classification as ic

    header = ic._parse_jpeg_header(data)
    end = data.find(b"\xff\xd9", header.scan if header else 2)
    return data if end == -1 else data[: end + 2]


def _ffmpeg_plane(data: bytes, plane: str):
    """One plane (y, u or v) of FFmpeg's decode of a JPEG, as a numpy array."""
    import spdl.io

    frames = spdl.io.decode_packets(spdl.io.demux_image(_first_jpeg_image(data)), filter_desc=f"extractplanes={plane}")
    height, width = frames.height, frames.width
    return spdl.io.to_numpy(spdl.io.convert_frames([frames])).reshape(height, width)


def _fit(ours, reference) -> list[float]:
    """Slope and intercept of ``ours`` against ``reference`` (least squares): 219/255 and 16
    would be a limited-range output, 1 and 0 the same range."""
    x, y = reference.flatten().double(), ours.flatten().double()
    slope = ((x - x.mean()) * (y - y.mean())).mean() / x.var(unbiased=False).clamp_min(1e-9)
    return [round(slope.item(), 4), round((y.mean() - slope * x.mean()).item(), 3)]


def nvdec_planes(paths: list[Path], device: str) -> dict:
    """Per image, NVDEC's NV12 planes against FFmpeg's Y, U and V planes (mean absolute
    difference): tells a wrong decode from a wrong conversion."""
    import spdl.io
    import torch

    import imagenet_classification as ic

    config = ic._spdl_cuda_config(torch.device(device))
    out = {}
    for path in paths:
        data = path.read_bytes()
        try:
            packets = spdl.io.demux_video(_first_jpeg_image(data))
            width, height = packets.width, packets.height
            decoder = spdl.io.nvdec_decoder(config, packets.codec)
            nv12 = spdl.io.to_torch(decoder.decode_packets(packets))[0].cpu()
            y, u, v = (torch.from_numpy(_ffmpeg_plane(data, p).copy()).float() for p in "yuv")
            h, w = y.shape
            entry = {"size": [width, height], "nv12_shape": list(nv12.shape), "nv12_stride": list(nv12.stride())}
            if nv12.shape[0] >= h + h // 2 and nv12.shape[1] >= w:
                uv = nv12[h : h + (h + 1) // 2, : w + w % 2].reshape((h + 1) // 2, -1, 2).float()
                entry["mad_y"] = (nv12[:h, :w].float() - y).abs().mean().item()
                entry["mad_u"] = (uv[: u.shape[0], : u.shape[1], 0] - u).abs().mean().item()
                entry["mad_v"] = (uv[: v.shape[0], : v.shape[1], 1] - v).abs().mean().item()
                entry["y_fit"] = _fit(nv12[:h, :w].float(), y)  # NVDEC's Y as a linear function of FFmpeg's
                entry["u_fit"] = _fit(uv[: u.shape[0], : u.shape[1], 0], u)
                entry["y_range"] = [
                    nv12[:h, :w].min().item(),
                    nv12[:h, :w].max().item(),
                    y.min().item(),
                    y.max().item(),
                ]
            out[path.name] = entry
        except Exception as e:  # recorded per image
            out[path.name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def nccl_one_rank(device: str) -> dict:
    """The torchrun code path on one rank: NCCL's process group on this GPU, the exact sums and
    the gathered per-rank rows (reduce_results), then the group's teardown."""
    import os

    import torch
    import torch.distributed as dist

    import imagenet_classification as ic

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dev = torch.device(device)  # "cuda" too: init_distributed picks the current GPU
    ic._init_distributed(dev, 60)
    try:
        result = ic.RunResult(listed=10, classified=9, failed=1, top1_correct=7, top5_correct=8,
                              frames_timed=8, elapsed_s=0.5, batches=3)  # fmt: skip
        result.predictions = [{"path": "a", "top1": 1}]
        result.decoder_backends = {"hardware": 8, "hybrid": 1}
        total, ranks = ic._reduce_results(result, ic._Shard(0, 1, 0), dev)
        ok = (total.classified, total.top5_correct, total.elapsed_s, len(ranks)) == (9, 8, 0.5, 1)
        ok = ok and total.decoder_backends == result.decoder_backends
        return {"ok": ok, "backend": dist.get_backend(), "total": total.to_dict(), "ranks": ranks}
    finally:
        dist.destroy_process_group()


def _layout(text: str) -> bool:
    """``PROCESSESxTHREADS``, each a whole number from 1."""
    parts = text.split("x")
    return len(parts) == 2 and all(part.isdigit() and int(part) >= 1 for part in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "bench" / "gpu_bundle")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path("/tmp/gpu_check_scratch"),
        help="where the generated images go (not --out: only the reports come back)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=whole(1), default=4000)
    parser.add_argument("--unchecked", default="", help="decoders timed without their colour self-check")
    parser.add_argument("--repeat", type=whole(1), default=10, help="times each leg lists the image set")
    parser.add_argument("--batch-size", type=whole(1), default=128)
    parser.add_argument("--threads", type=whole(1), default=16)
    parser.add_argument("--decoders", default="ffmpeg,nvjpeg,nvdec")
    parser.add_argument("--layouts", default="4x4,2x8",
                        help="FFmpeg legs run again as PROCESSESxTHREADS (--decode-processes), against --threads "
                             "threads in one process; empty for none")  # fmt: skip
    parser.add_argument("--leg-timeout", type=seconds, default=120, help="seconds per leg; the first gets twice")
    parser.add_argument("--time-budget", type=seconds, default=450, help="seconds for the whole check")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--compile-mode", default="default", help="default: max-autotune took over 200 s to compile on an H200 (seen)"
    )
    args = parser.parse_args()
    photos = args.bundle / "photos" / "val.flist"
    for needed in (photos, args.bundle / "efficientnet_lite0.pth"):
        if not needed.is_file():
            parser.error(f"argument --bundle: {args.bundle}: no {needed.relative_to(args.bundle)} in it: "
                         "not a bundle from bench/gpu_prepare.sh")  # fmt: skip
    out_folder(parser, "--out", args.out)
    out_folder(parser, "--scratch", args.scratch)
    for folder in ("images", "unusual"):
        sub_folder(parser, "--scratch", args.scratch / folder)
    decoders = args.decoders.split(",")
    if unknown := [d for d in decoders if d not in DECODER_FLAGS]:
        parser.error(f"argument --decoders: {args.decoders}: {unknown[0]!r} is none of {', '.join(DECODER_FLAGS)}")
    layouts = [tuple(map(int, text.split("x"))) for text in args.layouts.split(",") if _layout(text)]
    if len(layouts) != len([text for text in args.layouts.split(",") if text]):  # 0x4 would be the --threads leg
        parser.error(f"argument --layouts: {args.layouts}: expected PROCESSESxTHREADS, each a whole number from 1")
    # gpu_check.sh wrote what the machine has first, in case nothing after it runs.
    report = _first_report(args.out / "gpu_check.json")

    from compare_loaders import decodable, make_image_set

    sources = [(photos.parent / line, line.split("/")[1]) for line in photos.read_text().split() if "/" in line]
    if not sources:  # else make_image_set's default photos, not the bundle's
        parser.error(f"argument --bundle: {args.bundle}: {photos} lists no photo as val/WNID/NAME")
    # A reused set's images that no longer decode: left out, counted (left_out in the report).
    flist, left_out = decodable(make_image_set(args.scratch / "images", args.images, photos=sources))
    # Each leg lists the set ``--repeat`` times (the page cache holds it, as for a warm ImageNet):
    # a FPS window of seconds, not a tenth of one, at GPU rates.
    listed = flist.with_name(f"{flist.stem}x{args.repeat}.flist")
    listed.write_text(flist.read_text() * args.repeat)
    checkpoint = args.bundle / "efficientnet_lite0.pth"
    import torch

    import imagenet_classification as ic

    report.update({"device": args.device, "images": args.images, "left_out": [str(e) for e in left_out], "legs": {}})
    for key in ("decode_rates", "nvjpeg_rates", "unusual_images", "nvdec_planes", "nccl_one_rank", "agreement"):
        report.pop(key, None)  # a run's before this one, into the same --out
    report["env"] = ic._environment(torch.device(args.device))
    deadline = time.monotonic() + args.time_budget - AGREEMENT_RESERVE_S
    report["decode_rates"] = decode_rates(flist)
    print(f"FFmpeg decode-only: {report['decode_rates']}", flush=True)
    write_report(report, args.out)
    try:
        report["nvjpeg_rates"] = nvjpeg_rates(flist, args.device, min(args.batch_size, NVJPEG_BATCH))
    except Exception as e:  # recorded; the legs still run
        report["nvjpeg_rates"] = {"error": f"{type(e).__name__}: {e}"}
    print(f"nvJPEG decode-only and resize, images/s: {report['nvjpeg_rates']}", flush=True)
    write_report(report, args.out)
    legs = [(decoder, args.threads, 0) for decoder in decoders]
    legs += [("ffmpeg", threads, processes) for processes, threads in layouts if "ffmpeg" in decoders]
    with open(args.out / "gpu_check.log", "w") as log:
        for i, (decoder, threads, processes) in enumerate(legs):
            name = f"{decoder}-{processes}x{threads}" if processes else decoder
            common = ["--input-flist", str(listed), "--prefix", f"{flist.parent}/", "--device", args.device,
                      "--batch-size", str(args.batch_size), "--num-threads", str(threads),
                      *(["--decode-processes", str(processes)] if processes else []),
                      "--model", "mobilenetv3_large_100", "--no-pretrained", "--breakdown",
                      *(["--compile-mode", args.compile_mode] if args.compile else ["--no-compile"]),
                      *DECODER_FLAGS[decoder], *(["--check-decoder", "0"] if decoder in args.unchecked.split(",") else [])]  # fmt: skip  # noqa: E501
            timeout = min(args.leg_timeout * (2 if i == 0 else 1), deadline - time.monotonic())
            if timeout < 10:
                report["legs"][name] = {"ok": False, "error": "not run: the time budget was spent"}
            else:
                report["legs"][name] = run_leg(name, common, args.out, timeout, log)
            print(f"{name}: {summary(report['legs'][name])}", flush=True)
            write_report(report, args.out)
        try:
            report["unusual_images"] = unusual_images(args.scratch / "unusual", args.device, decoders, log)
            verdicts = {k: v["ok"] for k, v in report["unusual_images"].items() if k != "images"}
        except Exception as e:  # e.g. FFmpeg on the CPU failing one: recorded, the agreement still runs
            report["unusual_images"] = verdicts = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"unusual images, each decoder against FFmpeg on the CPU: {verdicts}", flush=True)
        write_report(report, args.out)
        if args.device.startswith("cuda") and "nvdec" in decoders:
            some = [args.scratch / "unusual" / n for n in ("huge.JPEG", "two-images.JPEG", "trailer.JPEG")]
            some += [photos.parent / line for line in photos.read_text().split()[:3]]
            try:
                report["nvdec_planes"] = nvdec_planes(some, args.device)
            except Exception as e:  # recorded; the rest still runs
                report["nvdec_planes"] = {"error": f"{type(e).__name__}: {e}"}
            print(f"NVDEC planes against FFmpeg's: {report['nvdec_planes']}", flush=True)
            write_report(report, args.out)
        if args.device.startswith("cuda"):
            try:
                report["nccl_one_rank"] = nccl_one_rank(args.device)
            except Exception as e:  # recorded; the agreement still runs
                report["nccl_one_rank"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(f"NCCL on one rank: {report['nccl_one_rank'].get('ok')}", flush=True)
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
    return (f"{rates} ({b['efficiency']:.0%} of the bound, {b['bottleneck']} bound); decoder {decoder}; "
            f"CPU time / wall time {leg['cpu_over_wall']:.1f}")  # fmt: skip


if __name__ == "__main__":
    run(main)
