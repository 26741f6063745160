"""The nvjpeg path through nvImageCodec, on its CPU decoder (libjpeg-turbo), with real JPEGs.

On a GPU the same batch function runs nvImageCodec's hardware, CUDA and hybrid decoders, each
made by the one function that makes the CPU decoder here; what a CPU cannot run is the decoders
themselves (bench/gpu_check.py measures them). Also: the grouped resize against the per-image
one, pixel for pixel, and the per-backend counts in the results.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import imagenet_classification as ic
from imagenet_classification import BadImagePolicy, EvalTransform, benchmark, get_decode_func, source
from tests.conftest import ROOT

# Not imported here: the module imports it, once, and keeps what the import printed.
if importlib.util.find_spec("nvidia.nvimgcodec") is None:
    pytest.skip("nvImageCodec is not installed (it is in the test extras)", allow_module_level=True)

SIZES = [(500, 375), (375, 500), (500, 375), (333, 500), (640, 427), (500, 375), (375, 500), (261, 199)]


def _photos(demo_photos: Path, root: Path, sizes: list[tuple[int, int]], **save) -> list[tuple[str, int]]:
    """Real photos cut to the given sizes, saved as JPEGs; ``(path, label)`` items, label = position."""
    photos = [path for path, _ in source(demo_photos, f"{demo_photos.parent}/")]
    items = []
    for i, size in enumerate(sizes):
        out = root / f"photo{i}-{size[0]}x{size[1]}.JPEG"
        image = Image.open(photos[i % len(photos)]).convert("RGB").resize(size, Image.Resampling.LANCZOS)
        image.save(out, **{"quality": 90, **save})
        items.append((str(out), i))
    return items


def _mad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image mean absolute difference (0-255) of two uint8 N x 3 x S x S batches."""
    return (a.float() - b.float()).abs().mean(dim=(1, 2, 3))


@pytest.mark.parametrize(
    "transform",
    [EvalTransform(), EvalTransform(size=160, crop_pct=0.95, interpolation="bilinear", crop_mode="squash"),
     EvalTransform(size=96, crop_pct=1.0, interpolation="nearest")],
    ids=["bicubic", "bilinear-squash", "nearest"],
)  # fmt: skip
def test_the_grouped_resize_gives_the_per_image_resize_pixel_for_pixel(demo_photos, tmp_path, transform):
    # Decoded as nvImageCodec delivers them (HWC, seen as CHW), the images of one size go
    # through one resize: the same pixels as one by one, in the order given, one call per size.
    items = _photos(demo_photos, tmp_path, SIZES)
    ((_, decoder),) = ic._nvimgcodec_decoders(torch.device("cpu"))
    decoded = decoder.decode([Path(p).read_bytes() for p, _ in items], params=ic._nvimgcodec_params())
    images = [ic._nvimgcodec_tensor(image) for image in decoded]
    assert [tuple(image.shape) for image in images] == [(3, h, w) for w, h in SIZES]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        grouped = ic._resize_crop_groups(images, transform)
    resizes = [e for e in prof.events() if e.name.startswith("aten::upsample") or e.name.startswith("aten::_upsample")]
    assert len(resizes) == len(set(SIZES)) == 5
    for image, crop in zip(images, grouped, strict=True):
        assert crop.shape == (3, transform.size, transform.size) and crop.dtype == torch.uint8
        assert torch.equal(crop, ic._resize_crop_on_device(image[None], transform)[0])


def test_the_nvimgcodec_path_agrees_with_ffmpeg_on_real_photos(demo_photos):
    # The demo photos as they are (several sizes, 4:2:0 and 4:4:4): nvImageCodec's decode,
    # batched, then the grouped resize, against FFmpeg's decode and swscale on the CPU.
    transform = EvalTransform()
    items = list(source(demo_photos, f"{demo_photos.parent}/"))
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", transform, "nvjpeg", policy)(items)
    images, labels = batch
    reference, reference_labels = get_decode_func("cpu", transform)(items)
    assert images.shape == (len(items), 3, 224, 224) and images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(labels, reference_labels) and list(batch.paths) == [p for p, _ in items]
    mads = _mad(images, reference)
    assert mads.mean().item() < 2 and mads.max().item() < 3, mads
    assert batch.decoded_by == {"cpu": len(items)} and batch.fallbacks == 0 and not batch.failures


def _awkward_batch(demo_photos: Path, root: Path) -> list[tuple[str, int]]:
    """Baseline, CMYK, PNG data, progressive, greyscale, a JPEG with no scan, a missing file."""
    photo = Image.open(next(iter(source(demo_photos, f"{demo_photos.parent}/")))[0]).convert("RGB")
    saves = {
        "baseline.JPEG": (photo, {}),
        "cmyk.JPEG": (photo.convert("CMYK"), {}),  # nvJPEG decodes CMYK to wrong colours: FFmpeg's
        "png-data.JPEG": (photo, {"format": "PNG"}),
        "progressive.JPEG": (photo.resize((400, 300)), {"progressive": True}),
        "grey.JPEG": (photo.convert("L"), {}),
    }
    items = []
    for label, (name, (image, options)) in enumerate(saves.items()):
        image.save(root / name, **{"format": "JPEG", **options})
        items.append((str(root / name), label))
    # Headers and no scan: nvImageCodec cannot even read it, FFmpeg cannot decode it.
    data = (root / "baseline.JPEG").read_bytes()
    (root / "no-scan.JPEG").write_bytes(data[: data.index(b"\xff\xda")] + b"\xff\xd9")
    items.insert(1, (str(root / "no-scan.JPEG"), 10))
    items.insert(4, (str(root / "missing.JPEG"), 11))
    return items


def test_the_decoder_check_leaves_out_the_images_the_decoder_left_to_the_cpu(demo_photos, tmp_path):
    # A CMYK JPEG and PNG data go to FFmpeg on the CPU, the reference itself: compared, each would
    # count as a perfect match, and dilute the mean (an all-fallback list checked nothing at all).
    items = _awkward_batch(demo_photos, tmp_path)
    transform = EvalTransform()
    decode = ic._gpu_decode_func("nvjpeg", transform, torch.device("cpu"), BadImagePolicy(skip=True), 64 << 20)
    check = ic._check_decoder(decode, items, transform, "nvjpeg")
    assert (check.images, check.fallbacks) == (3, 2) and check.worst is not None
    assert check.worst.rsplit("/", 1)[-1] in ("baseline.JPEG", "progressive.JPEG", "grey.JPEG")
    alone = ic._check_decoder(decode, [item for item in items if "cmyk" in item[0] or "png" in item[0]], transform,
                              "nvjpeg")  # fmt: skip
    assert (alone.images, alone.fallbacks, alone.worst, alone.mad_max) == (0, 2, None, None)
    assert (check.only_decoder, check.only_reference, check.neither) == (0, 0, 2)  # no-scan.JPEG, missing.JPEG


@pytest.mark.parametrize("library", ["nvimgcodec", "torchvision"])
def test_images_nvjpeg_cannot_take_go_to_ffmpeg_counted_and_labels_stay_aligned(demo_photos, tmp_path, library):
    items = _awkward_batch(demo_photos, tmp_path)
    transform, policy = EvalTransform(), BadImagePolicy(skip=True)
    batch = ic._gpu_decode_func("nvjpeg", transform, torch.device("cpu"), policy, 64 << 20, library=library)(items)
    images, labels = batch
    assert labels[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert [Path(p).name for p in batch.paths] == ["baseline.JPEG", "cmyk.JPEG", "png-data.JPEG", "progressive.JPEG",
                                                   "grey.JPEG"]  # fmt: skip
    assert sorted(Path(f.path).name for f in batch.failures) == ["missing.JPEG", "no-scan.JPEG"]
    assert batch.fallbacks == 2  # CMYK and PNG data, decoded by FFmpeg
    assert batch.decoded_by == {"cpu" if library == "nvimgcodec" else "torchvision": 3}
    assert images.shape == (5, 3, 224, 224) and images.is_contiguous(memory_format=torch.channels_last)
    reference, _ = get_decode_func("cpu", transform)([item for item in items if item[1] < 10])
    assert _mad(images, reference).max().item() < 2


def test_exif_orientation_is_not_applied_as_pil_and_timm_do_not(demo_photos, tmp_path):
    # A 500 x 375 photo whose EXIF says "rotate 90": decoded as stored, like FFmpeg (and PIL
    # without exif_transpose); rotated, the crop would differ by tens.
    exif = Image.Exif()
    exif[0x0112] = 6
    items = _photos(demo_photos, tmp_path, [(500, 375)], exif=exif.tobytes())
    transform = EvalTransform()
    ours, _ = get_decode_func("cpu", transform, "nvjpeg")(items)
    reference, _ = get_decode_func("cpu", transform)(items)
    assert _mad(ours, reference).item() < 2
    stored = torch.from_numpy(ic._decode_pil(items[0][0], transform).copy()).permute(2, 0, 1)[None]
    rotated = Image.open(items[0][0]).transpose(Image.Transpose.ROTATE_270).convert("RGB")
    rotated.save(tmp_path / "rotated.JPEG", quality=95)
    turned, _ = get_decode_func("cpu", transform)([(str(tmp_path / "rotated.JPEG"), 0)])
    assert _mad(stored, reference).item() < 2 and _mad(turned, reference).item() > 10


def test_the_results_say_which_backend_decoded_how_many(demo_photos, tmp_path):
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype="float32")
    items = [*list(source(demo_photos, f"{demo_photos.parent}/"))[:9], *_awkward_batch(demo_photos, tmp_path)[1:3]]
    policy = BadImagePolicy(skip=True)
    decode = get_decode_func("cpu", model.transform, "nvjpeg", policy)
    batches = [decode(items[i : i + 4]) for i in range(0, len(items), 4)]
    result = benchmark(batches, model, listed=len(items), warmup_batches=0, policy=policy)
    assert (result.classified, result.failed, result.decoder_fallbacks) == (10, 1, 1)  # no-scan; CMYK
    assert result.decoder_backends == {"cpu": 9} and result.to_dict()["decoder_backends"] == {"cpu": 9}
    out = io.StringIO()
    ic._print_summary(result, out)
    assert "decoded on the GPU, per backend: cpu 9" in out.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here may have nvJPEG")
def test_a_gpu_without_nvjpeg_says_what_to_install():
    # This machine has neither a GPU nor nvJPEG's library: nvImageCodec makes no GPU decoder, and
    # the check names the library its import could not load. In a fresh interpreter: once
    # torchvision's image extension is loaded (other tests load it), its bundled libnvjpeg is in the
    # process and nvImageCodec's import finds it.
    code = (
        "import torch, imagenet_classification as ic\n"
        "assert ic._nvimgcodec_decoders(torch.device('cuda', 0)) == []\n"
        "try:\n    ic._nvimgcodec_check(torch.device('cuda', 0))\n"
        "except ic.InputError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"nvImageCodec has no JPEG decoder on cuda:0 \(pip install nvidia-nvjpeg", proc.stdout), proc.stdout


@pytest.mark.parametrize("library", ["nvimgcodec", "torchvision"])
def test_an_image_whose_resize_would_be_huge_is_refused_before_nvjpeg_decodes_it(tmp_path, library):
    # 30000 x 8 pixels would be resized to 960000 x 256, over the pixel limit: the CPU path's
    # refusal, with its reason, not a 1 GB resize on the device.
    Image.new("RGB", (30000, 8), (90, 120, 30)).save(tmp_path / "strip.JPEG", quality=90)
    Image.new("RGB", (300, 200), (90, 120, 30)).save(tmp_path / "plain.JPEG", quality=90)
    items = [(str(tmp_path / "strip.JPEG"), 0), (str(tmp_path / "plain.JPEG"), 1)]
    policy = BadImagePolicy(skip=True)
    decode = ic._gpu_decode_func("nvjpeg", EvalTransform(), torch.device("cpu"), policy, 64 << 20, library=library)
    batch = decode(items)
    assert batch[1][:, 0].tolist() == [1] and batch.fallbacks == 0
    assert [f.reason for f in batch.failures] == ["a 30000 x 8 image would be resized to 960000 x 256"]
    assert sum(batch.decoded_by.values()) == 1


def test_an_image_listed_twice_that_the_gpu_leaves_is_decoded_on_the_cpu_both_times(tmp_path):
    # CMYK: nvJPEG leaves it to the CPU. A list may name one file twice (a set gone over twice).
    Image.new("CMYK", (64, 48), (10, 20, 30, 0)).save(tmp_path / "cmyk.JPEG")
    path = str(tmp_path / "cmyk.JPEG")
    decode = ic._gpu_decode_func("nvjpeg", EvalTransform(), torch.device("cpu"), BadImagePolicy(skip=True), 64 << 20,
                                 library="nvimgcodec")  # fmt: skip
    batch = decode([(path, 0), (path, 1)])
    assert batch[1].view(-1).tolist() == [0, 1] and batch.fallbacks == 2 and not batch.failures
    assert torch.equal(batch[0][0], batch[0][1])
