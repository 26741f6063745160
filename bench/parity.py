"""Does the FFmpeg loader change accuracy? Each step of its decode chain against timm's own
validation transform (PIL), on real photos, side by side in one run.

For every variant of the FFmpeg chain (IDCT, chroma upsampling, resize kernel, rounding, region
resize), the real-photo set of ``bench/parity_set.py`` is decoded to 224 x 224 RGB crops and
compared with the reference, timm's ``create_transform(**resolve_data_config({}, model=model))``
(PIL decode, RGB, bicubic resize of the shorter side to 256, centre crop; the module's
``decode_pil`` is checked to equal it pixel for pixel first):

- per-image mean absolute difference (0-255) of the crops, mean and max over the set;
- EfficientNet-Lite0 with real ImageNet weights (float32, no compile) on both: top-1 agreement
  (same argmax), top-5 agreement (the same set of five classes, order aside), the share of
  images whose reference top-1 class is in the variant's top 5, and the mean absolute change of
  the reference top-1 class's probability (percentage points: smoother than counting flips of
  near ties);
- decode + resize + crop rate of the variant over the rate of the chain before issue #15's
  change (``BEFORE``) measured just before it, one thread, from bytes in memory, median over repeats (paired, so
  a drift of the machine's speed cancels out).

Rows marked "bound" are not loaders but show where the differences come from: the reference's
own decoded pixels resized in floating point (only PIL's 8-bit rounding differs) or by torch's
8-bit antialiased bicubic (PIL's resize, nearly bit for bit); and FFmpeg's decode resized by
torch's (only the decode differs).

Usage::

    python bench/parity.py --out bench/out          # writes bench/out/parity.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]

import numpy as np  # noqa: E402
import spdl.io  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cli_checks import of_the_set, out_file, out_folder, run, sub_folder  # noqa: E402
from parity_set import COLOUR_PHOTOS, GREY_PHOTOS, make_parity_set  # noqa: E402

import imagenet_classification as ic  # noqa: E402

__all__ = ["Variant", "BEFORE", "VARIANTS", "VariantResult", "check_reference", "pil_decode_bound", "decode_set",
           "model_logits", "agreement", "paired_rates", "main"]  # fmt: skip

MODEL = "efficientnet_lite0"
PARITY_SET_IMAGES = 40 * len(COLOUR_PHOTOS) + 10 * len(GREY_PHOTOS)  # make_parity_set's default crops
CHROMA_444 = "scale=flags=bilinear+accurate_rnd,format=yuvj444p,"  # 4:2:0 chroma upsampled first


@dataclass(frozen=True)
class Variant:
    """One way to decode a JPEG and resize and crop it.

    Attributes:
        name: What differs from the module's chain.
        idct: FFmpeg's ``idct`` decoder option; None for FFmpeg's default.
        flags: swscale flags of the resize.
        params: Further scale filter options (``:param0=2``). FFmpeg 5.1's scale filter passes
            ``param0``/``param1`` on as integers, so a fractional value is truncated.
        region: Resize only the region the crop needs (``resize_region``), else the whole frame.
        chroma_444: Upsample 4:2:0 chroma to 4:4:4 (bilinear) before the resize, as libjpeg does.
        torch_resize: Convert the whole frame to RGB in FFmpeg, then resize it with torch's 8-bit
            antialiased bicubic (PIL's algorithm) and crop.
        module: The module's own decode function and filter chain (the other fields unused).
    """

    name: str
    idct: str | None = "xvid"
    flags: str = "bicubic+full_chroma_int"
    params: str = ""
    region: bool = True
    chroma_444: bool = False
    torch_resize: bool = False
    module: bool = False

    def chain(self, transform: ic.EvalTransform, width: int, height: int, pix_fmt: str) -> str:
        """FFmpeg filter chain from a decoded frame to the crop (to the whole RGB frame with
        ``torch_resize``)."""
        if self.module:
            return transform.ffmpeg_filter(width, height)
        pre = CHROMA_444 if self.chroma_444 and pix_fmt == "yuvj420p" else ""
        if self.torch_resize:
            return f"{pre}format=rgb24"
        new_w, new_h, left, top = transform.geometry(width, height)
        x0, src_w, out_w, pad_x = (ic._resize_region if self.region else _whole)(width, new_w, left, transform.size)
        y0, src_h, out_h, pad_y = (ic._resize_region if self.region else _whole)(height, new_h, top, transform.size)
        region = "" if (src_w, src_h) == (width, height) else f"crop={src_w}:{src_h}:{x0}:{y0}:exact=1,"
        scale = f"scale={out_w}:{out_h}:flags={self.flags}{self.params}"
        return f"{region}{pre}{scale},format=gbrp,crop={transform.size}:{transform.size}:{pad_x}:{pad_y},format=rgb24"


def _whole(length: int, resized: int, offset: int, crop: int) -> tuple[int, int, int, int]:
    return 0, length, resized, offset


# The chain before issue #15's change, which every other row changes in one or two ways.
BEFORE = Variant("before: Xvid IDCT, bicubic (B=0, C=0.6), region resize (2026-11-30)")
VARIANTS = [
    BEFORE,
    Variant("the same again (its rate shows the timing noise)"),
    Variant("the module's chain (current)", module=True),
    Variant("IDCT: FFmpeg's default (simple, SSE2)", idct=None),
    Variant("IDCT: accurate integer (int, libjpeg's islow)", idct="int"),
    Variant("IDCT: floating-point AAN (faani)", idct="faani"),
    Variant("resize: + accurate_rnd", flags="bicubic+full_chroma_int+accurate_rnd"),
    Variant("resize: + bitexact + accurate_rnd", flags="bicubic+full_chroma_int+bitexact+accurate_rnd"),
    Variant("resize: the whole frame, not the region", region=False),
    Variant("kernel: bicubic param1=0.5 (truncated to C=0 by FFmpeg 5.1)", params=":param0=0:param1=0.5"),
    Variant("kernel: Lanczos-2", flags="lanczos+full_chroma_int", params=":param0=2"),
    Variant("chroma: bilinear kernel for chroma (bicublin)", flags="bicublin+full_chroma_int"),
    Variant("chroma: upsampled to 4:4:4 first (bilinear)", chroma_444=True),
    Variant("chroma 4:4:4 first + Lanczos-2", chroma_444=True, flags="lanczos+full_chroma_int", params=":param0=2"),
    Variant("bicublin + IDCT int", idct="int", flags="bicublin+full_chroma_int"),
    Variant("bound: FFmpeg decode, chroma 4:4:4 first, torch's PIL-style resize", chroma_444=True, torch_resize=True),
]


@dataclass
class VariantResult:
    """A variant's figures over the set. Agreements are fractions of the set."""

    name: str
    mad_mean: float
    mad_max: float
    top1_agree: float
    top5_agree: float
    top1_in_top5: float
    prob_shift: float  # mean |change| of the reference top-1 class's probability, 0-1
    top1_differ: list[str]
    rate_ratio: float | None = None  # against BEFORE's; None: not a loader


class _Decoder:
    """Decode JPEG bytes the way a variant does: one packet per file, its IDCT, filter graphs
    cached per (size, pixel format)."""

    def __init__(self, variant: Variant, transform: ic.EvalTransform) -> None:
        self.variant, self.transform, self.graphs = variant, transform, {}
        options = {"idct": variant.idct} if variant.idct else None
        self.decode_config = spdl.io.decode_config(decoder_options=options) if options else None

    def __call__(self, data: bytes) -> np.ndarray:
        """One image: uint8 ``size x size x 3``."""
        if self.variant.module:
            frames = ic._decode_frames(data)
        else:
            packets = spdl.io.demux_image(data, demux_config=ic._ffmpeg_jpeg_configs()[0])
            frames = spdl.io.decode_packets(packets, filter_desc=None, decode_config=self.decode_config, num_frames=1)
        key = (frames.width, frames.height, frames.pix_fmt)
        graph = self.graphs.get(key)
        if graph is None:
            source = f"buffer=video_size={key[0]}x{key[1]}:pix_fmt={key[2]}:time_base=1/25:pixel_aspect=1/1"
            graph = spdl.io.FilterGraph(f"{source},{self.variant.chain(self.transform, *key)},buffersink")
            self.graphs[key] = graph
        graph.add_frames(frames)
        pixels = spdl.io.to_numpy(spdl.io.convert_frames([graph.get_frames()]))
        if not self.variant.torch_resize:
            return pixels.reshape(self.transform.size, self.transform.size, 3)
        return _torch_resize_crop(pixels.reshape(key[1], key[0], 3), self.transform)


def _torch_resize_crop(rgb: np.ndarray, transform: ic.EvalTransform) -> np.ndarray:
    """PIL's resize of an ``H x W x 3`` uint8 image (torch's 8-bit antialiased bicubic), then the crop."""
    height, width = rgb.shape[:2]
    new_w, new_h, left, top = transform.geometry(width, height)
    image = torch.from_numpy(rgb).permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
    resized = F.interpolate(image, size=(new_h, new_w), mode="bicubic", antialias=True)
    return resized[0, :, top : top + transform.size, left : left + transform.size].permute(1, 2, 0).numpy()


def check_reference(paths: list[str], model: torch.nn.Module, transform: ic.EvalTransform) -> np.ndarray:
    """The reference crops, ``N x size x size x 3`` uint8, after checking that the module's
    ``decode_pil`` gives exactly what timm's own validation transform gives.

    Raises:
        AssertionError: an image where the two differ.
    """
    import timm.data
    from PIL import Image

    timm_transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    to_pixels = torch.nn.Sequential(*timm_transform.transforms[:-2])  # without ToTensor, Normalize
    crops = []
    for path in paths:
        with Image.open(path) as image:
            expected = np.asarray(to_pixels(image.convert("RGB")))
        crops.append(ic._decode_pil(path, transform))
        assert np.array_equal(crops[-1], expected), f"{path}: decode_pil differs from timm's transform"
    return np.stack(crops)


def pil_decode_bound(paths: list[str], transform: ic.EvalTransform, in_float: bool) -> np.ndarray:
    """The reference's own decoded pixels resized with PIL's kernel and support by torch's
    antialiased bicubic: in floating point, rounded once (only PIL's 8-bit rounding between
    its passes differs), or in 8 bits (PIL's algorithm)."""
    from PIL import Image

    crops = []
    for path in paths:
        with Image.open(path) as image:
            rgb = np.array(image.convert("RGB"))
        if not in_float:
            crops.append(_torch_resize_crop(rgb, transform))
            continue
        new_w, new_h, left, top = transform.geometry(rgb.shape[1], rgb.shape[0])
        image = torch.from_numpy(rgb).permute(2, 0, 1)[None].float()
        resized = F.interpolate(image, size=(new_h, new_w), mode="bicubic", antialias=True).round().clamp(0, 255)
        crop = resized[0, :, top : top + transform.size, left : left + transform.size]
        crops.append(crop.permute(1, 2, 0).to(torch.uint8).numpy())
    return np.stack(crops)


def decode_set(datas: list[bytes], variant: Variant, transform: ic.EvalTransform) -> np.ndarray:
    """Every image through one variant: ``N x size x size x 3`` uint8."""
    decoder = _Decoder(variant, transform)
    return np.stack([decoder(data) for data in datas])


def model_logits(bundle: ic.ModelBundle, crops: np.ndarray, batch_size: int = 32) -> torch.Tensor:
    """The model's float32 logits for uint8 ``N x H x W x 3`` crops, ``N x 1000``."""
    logits = []
    with torch.inference_mode():
        for start in range(0, len(crops), batch_size):
            batch = torch.from_numpy(crops[start : start + batch_size]).permute(0, 3, 1, 2)
            batch = batch.contiguous(memory_format=torch.channels_last)
            logits.append(bundle.model(bundle.preprocessing(batch)).float())
    return torch.cat(logits)


def agreement(name: str, crops: np.ndarray, reference: np.ndarray, logits: torch.Tensor,
              reference_logits: torch.Tensor, names: list[str]) -> VariantResult:  # fmt: skip
    """MAD of the crops and agreement of the predictions with the reference's."""
    mad = np.abs(crops.astype(np.int16) - reference.astype(np.int16)).mean(axis=(1, 2, 3))
    same_top1 = (logits.argmax(1) == reference_logits.argmax(1)).numpy()
    top5, reference_top5 = (x.topk(5).indices.sort(1).values for x in (logits, reference_logits))
    same_top5 = (top5 == reference_top5).all(1).numpy()
    reference_top1 = reference_logits.argmax(1, keepdim=True)
    in_top5 = (logits.topk(5).indices == reference_top1).any(1).float().mean()
    shift = (logits.softmax(1) - reference_logits.softmax(1)).gather(1, reference_top1).abs().mean()
    differ = [n for n, same in zip(names, same_top1, strict=True) if not same]
    return VariantResult(name, float(mad.mean()), float(mad.max()), float(same_top1.mean()), float(same_top5.mean()),
                         float(in_top5), float(shift), differ)  # fmt: skip


def paired_rates(datas: list[bytes], variants: list[Variant], transform: ic.EvalTransform,
                 repeats: int) -> dict[str, float]:  # fmt: skip
    """Each variant's decode + resize + crop rate (one thread) over ``BEFORE``'s, timed just
    before it on the same images; the median over ``repeats`` rounds."""
    baseline = _Decoder(BEFORE, transform)
    decoders = {v.name: _Decoder(v, transform) for v in variants}

    def rate(decoder: Callable[[bytes], np.ndarray]) -> float:
        started = time.perf_counter()
        for data in datas:
            decoder(data)
        return len(datas) / (time.perf_counter() - started)

    for decoder in [baseline, *decoders.values()]:  # graphs built, caches warm
        for data in datas[:50]:
            decoder(data)
    ratios: dict[str, list[float]] = {name: [] for name in decoders}
    for repeat in range(repeats):
        for name, decoder in decoders.items():
            before = rate(baseline)
            ratios[name].append(rate(decoder) / before)
        print(f"timing round {repeat + 1}/{repeats} done", file=sys.stderr)
    return {name: statistics.median(r) for name, r in ratios.items()}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--timed-images", type=ic._count, default=300, help="images per timed pass")
    parser.add_argument("--repeats", type=ic._count, default=5, help="timed rounds")
    args = parser.parse_args()
    args.timed_images = of_the_set(parser, "--timed-images", args.timed_images, 300, PARITY_SET_IMAGES,
                                   f"the parity set's {PARITY_SET_IMAGES} images")  # fmt: skip
    out_folder(parser, "--out", args.out)
    for name in ("parity.json", "efficientnet_lite0.pth"):  # now, not after the run's minutes
        out_file(parser, "--out", args.out / name)
    sub_folder(parser, "--out", args.out / "parity_set")
    return args


def _print_table(results: list[VariantResult], size: int) -> None:
    print(f"{size} real photos; MAD 0-255 (mean/max over images); agreement with the reference's predictions;")
    print("p shift: mean |change| of the reference top-1 class's probability, percentage points")
    print(f"  {'variant':70s} {'MAD':>11s}  top-1   top-5  in top-5  p shift  rate vs before")
    for r in results:
        ratio = "-" if r.rate_ratio is None else f"{r.rate_ratio:.2f}"
        print(f"  {r.name:70s} {r.mad_mean:5.3f}/{r.mad_max:5.3f}  {r.top1_agree:6.1%}  {r.top5_agree:6.1%}  "
              f"{r.top1_in_top5:6.1%}  {r.prob_shift * 100:6.2f}  {ratio}")  # fmt: skip


def _model(checkpoint: Path) -> ic.ModelBundle:
    """The model with the real weights, converted into ``checkpoint`` first if it is not there yet;
    one line and exit status 1 where a checkpoint kept from before does not load."""
    if not checkpoint.exists():
        from convert_efficientnet_lite0 import convert

        convert(checkpoint)
    try:
        return ic.get_model(MODEL, "cpu", checkpoint=checkpoint, compile=False, dtype="float32")
    except ic.InputError as e:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {e}; delete {checkpoint} and run again to convert it anew")


def main() -> None:
    """Build the set, check the reference, decode with every variant, compare, time, report."""
    args = _parse_args()
    bundle = _model(args.out / "efficientnet_lite0.pth")
    flist = make_parity_set(args.out / "parity_set")
    names = flist.read_text().split()
    paths = [str(flist.parent / name) for name in names]
    datas = [Path(path).read_bytes() for path in paths]
    transform = bundle.transform
    reference = check_reference(paths, bundle.model, transform)
    reference_logits = model_logits(bundle, reference)
    results = [agreement("PIL reference against itself (the model is deterministic)", reference, reference,
                         model_logits(bundle, reference), reference_logits, names)]  # fmt: skip
    for in_float, name in ((True, "bound: PIL's decode, resized in floating point (rounding only)"),
                           (False, "bound: PIL's decode, torch's 8-bit PIL-style resize")):  # fmt: skip
        crops = pil_decode_bound(paths, transform, in_float)
        results.append(agreement(name, crops, reference, model_logits(bundle, crops), reference_logits, names))
    for variant in VARIANTS:
        crops = decode_set(datas, variant, transform)
        results.append(agreement(variant.name, crops, reference, model_logits(bundle, crops), reference_logits, names))
        print(f"{variant.name}: {results[-1].top1_agree:.1%}", file=sys.stderr)
    torch.set_num_threads(1)
    rates = paired_rates(datas[: args.timed_images], VARIANTS[1:], transform, args.repeats)
    for result in results:
        result.rate_ratio = 1.0 if result.name == BEFORE.name else rates.get(result.name)
    _print_table(results, len(names))
    out = {"images": len(names), "results": [asdict(r) for r in results], "env": ic._environment(torch.device("cpu"))}
    ic._write_atomically(args.out / "parity.json", json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out / 'parity.json'}")


if __name__ == "__main__":
    run(main)
