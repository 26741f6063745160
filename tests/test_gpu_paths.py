"""The GPU decode paths, every part of them a CPU can run.

NVDEC's colour conversion and geometry on NV12 built from FFmpeg's planes of real JPEGs; the
nvJPEG path's routing, batching, fallbacks and layout with torchvision's CPU decoder standing in
for the GPU; the decoder self-check against a deliberately wrong decoder; SPDL's CUDA extension
error; and a compiled model that does not recompile for a padded or differently laid-out batch.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import spdl.io
import torch
from PIL import Image

from imagenet_classification import (
    BadImagePolicy,
    EvalTransform,
    InputError,
    _Batch,
    _check_decoder,
    _check_gpu_decoder,
    _nv12_to_rgb,
    _resize_crop_on_device,
    benchmark,
    get_decode_func,
    get_model,
    source,
)


def _photo_jpegs(demo_photos: Path, root: Path, sizes: list[tuple[int, int]]) -> list[Path]:
    """Real photos cut to the given sizes, saved as baseline 4:2:0 JPEGs."""
    paths = []
    for i, (size, (path, _)) in enumerate(zip(sizes, source(demo_photos, f"{demo_photos.parent}/"), strict=False)):
        out = root / f"photo{i}-{size[0]}x{size[1]}.JPEG"
        Image.open(path).convert("RGB").resize(size, Image.Resampling.LANCZOS).save(out, quality=92, subsampling=2)
        paths.append(out)
    return paths


def _plane(path: Path, plane: str, scale: tuple[int, int] | None = None) -> np.ndarray:
    """One plane of FFmpeg's decode of a JPEG (y, u or v), optionally after a bilinear scale."""
    chain = (f"scale={scale[0]}:{scale[1]}:flags=bilinear,format=yuvj420p," if scale else "") + f"extractplanes={plane}"
    frames = spdl.io.decode_packets(spdl.io.demux_image(str(path)), filter_desc=chain)
    height, width = frames.height, frames.width  # convert_frames takes the frames over
    return spdl.io.to_numpy(spdl.io.convert_frames([frames])).reshape(height, width)


def _nv12(path: Path, scale: tuple[int, int] | None = None) -> torch.Tensor:
    """NV12 as NVDEC returns it (luma plane, then U and V interleaved), from FFmpeg's planes."""
    y, u, v = (_plane(path, plane, scale) for plane in "yuv")
    uv = np.stack([u, v], axis=-1).reshape(u.shape[0], 2 * u.shape[1])
    return torch.from_numpy(np.concatenate([y, uv]))


def _limited_bt709(nv12: torch.Tensor) -> torch.Tensor:
    """What SPDL's nv12_to_rgb computes (limited-range BT.709, nearest chroma): wrong for JPEG."""
    h = nv12.shape[0] * 2 // 3
    y = nv12[:h].float() - 16
    uv = nv12[h:].view(h // 2, -1, 2).float().repeat_interleave(2, 0).repeat_interleave(2, 1) - 128
    u, v = uv[..., 0], uv[..., 1]
    rgb = [1.1644 * y + 1.8337 * v, 1.1644 * y - 0.2181 * u - 0.5451 * v, 1.1644 * y + 2.1606 * u]
    return torch.stack(rgb).clamp(0, 255)


def test_nv12_conversion_gives_a_jpegs_colours(demo_photos, tmp_path):
    # JPEG is full-range BT.601: the conversion must give what libjpeg (PIL) gives.
    for path in _photo_jpegs(demo_photos, tmp_path, [(500, 374), (374, 500), (640, 426), (320, 240)]):
        nv12 = _nv12(path)
        pil = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"))).permute(2, 0, 1).float()
        ours = (_nv12_to_rgb(nv12).round() - pil).abs().mean().item()
        wrong = (_limited_bt709(nv12).round() - pil).abs().mean().item()
        assert ours < 1.2, (path.name, ours)
        assert wrong > 5, (path.name, wrong)  # the comparison can tell the two apart


@pytest.mark.parametrize("size", [(500, 374), (500, 375), (333, 500), (641, 427)])
def test_nvdec_output_through_the_device_resize_matches_the_ffmpeg_path(demo_photos, tmp_path, size):
    # NVDEC returns NV12 at the size made even (a 1-pixel bilinear stretch for an odd side); the
    # device path converts it and resizes with the geometry of the original size.
    (path,) = _photo_jpegs(demo_photos, tmp_path, [size])
    even = (size[0] + size[0] % 2, size[1] + size[1] % 2)
    transform = EvalTransform()
    ours = _resize_crop_on_device(_nv12_to_rgb(_nv12(path, even if even != size else None))[None], transform, size)[0]
    reference, _ = get_decode_func("cpu", transform)([(str(path), 0)])
    assert ours.shape == (3, 224, 224) and ours.dtype == torch.uint8
    assert (ours.float() - reference[0].float()).abs().mean().item() < 1.5


def _mixed_batch(demo_photos: Path, root: Path) -> list[tuple[str, int]]:
    """Baseline, progressive, greyscale, CMYK, PNG data, a corrupt header, a missing file."""
    photo = Image.open(next(iter(source(demo_photos, f"{demo_photos.parent}/")))[0]).convert("RGB")
    saves = {
        "baseline.JPEG": (photo, dict(quality=90)),
        "progressive.JPEG": (photo.resize((400, 300)), dict(progressive=True)),
        "grey.JPEG": (photo.convert("L"), {}),
        "cmyk.JPEG": (photo.convert("CMYK"), {}),  # nvJPEG decodes CMYK to wrong colours: FFmpeg's
        "png-data.JPEG": (photo, dict(format="PNG")),
    }
    items = []
    for label, (name, (image, options)) in enumerate(saves.items()):
        image.save(root / name, **{"format": "JPEG", **options})
        items.append((str(root / name), label))
    zero_width = bytearray((root / "baseline.JPEG").read_bytes())  # a corrupt header: no decoder takes it
    sof = zero_width.index(b"\xff\xc0")
    zero_width[sof + 7 : sof + 9] = b"\x00\x00"
    (root / "junk.JPEG").write_bytes(bytes(zero_width))
    items.insert(2, (str(root / "junk.JPEG"), 10))
    items.insert(4, (str(root / "missing.JPEG"), 11))
    return items


def test_nvjpeg_path_routes_batches_and_falls_back_per_image(demo_photos, tmp_path):
    items = _mixed_batch(demo_photos, tmp_path)
    transform = EvalTransform()
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", transform, "nvjpeg", policy)(items)
    images, labels = batch
    assert labels[:, 0].tolist() == [0, 1, 2, 3, 4]  # junk and missing left out, the rest aligned
    assert [Path(p).name for p in batch.paths] == ["baseline.JPEG", "progressive.JPEG", "grey.JPEG", "cmyk.JPEG",
                                                   "png-data.JPEG"]  # fmt: skip
    assert batch.fallbacks == 2  # CMYK and PNG data, decoded on the CPU
    assert sorted(Path(f.path).name for f in batch.failures) == ["junk.JPEG", "missing.JPEG"]
    assert images.shape == (5, 3, 224, 224) and images.is_contiguous(memory_format=torch.channels_last)
    reference, _ = get_decode_func("cpu", transform)([item for item in items if item[1] < 10])
    mads = (images.float() - reference.float()).abs().mean(dim=(1, 2, 3))
    assert mads.max().item() < 1.5, mads


def test_decoder_check_stops_a_decoder_that_gets_the_colours_wrong(jpeg_set):
    transform = EvalTransform()
    items = list(source(jpeg_set, f"{jpeg_set.parent}/"))[:8]
    real = get_decode_func("cpu", transform)

    def swapped(batch_items):  # a decoder that delivers BGR: the kind of fault a driver could bring
        batch = real(batch_items)
        return _Batch(batch[0].flip(1), batch[1], batch.paths)

    pattern = r"swapped decodes .*\.JPEG with a mean absolute difference of \d+\.\d"
    with pytest.raises(InputError, match=pattern) as info:
        _check_decoder(swapped, items, transform, "swapped")
    assert info.value.flag == "--use-swapped"
    check = _check_decoder(get_decode_func("cpu", transform, "nvjpeg"), items, transform, "nvjpeg")
    assert check.mad_max <= check.tolerance and check.images == 8 and 0 < check.mad_max < 1.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="SPDL's CUDA extension loads where there is a GPU")
def test_a_cuda_run_without_spdls_cuda_extension_names_the_real_import_error():
    pattern = r"SPDL's CUDA extension.* cannot load: libcuda\.so\.1: cannot open shared object file"
    with pytest.raises(InputError, match=pattern):
        _check_gpu_decoder("ffmpeg", torch.device("cuda", 0))


def test_a_compiled_model_does_not_recompile_for_a_padded_or_planar_batch(jpeg_set):
    # 21 images in batches of 8: the last is padded; then a contiguous (planar) batch, as
    # torch.stack gives. Neither may recompile inside the timed window.
    import torch._dynamo

    model = get_model("test_efficientnet", "cpu", pretrained=False, compile=True, dtype="float32", batch_size=8)
    items = list(source(jpeg_set, f"{jpeg_set.parent}/"))[:21]
    batches = [get_decode_func("cpu", model.transform)(items[i : i + 8]) for i in range(0, 21, 8)]
    planar = (batches[0][0].contiguous(), batches[0][1])
    torch._dynamo.reset()
    benchmark(batches[:1], model, warmup_batches=0)  # compiles
    compiled = dict(torch._dynamo.utils.counters["stats"])
    result = benchmark([*batches, planar], model, warmup_batches=0)
    assert result.classified == 29
    assert dict(torch._dynamo.utils.counters["stats"]) == compiled


def test_a_jpeg_of_one_colour_is_decoded_to_that_colour_by_the_nvjpeg_path(tmp_path):
    # The start-up probe's image, through the batched path (torchvision's CPU decoder here).
    encoded = io.BytesIO()
    Image.new("RGB", (256, 192), (200, 80, 40)).save(encoded, format="JPEG", subsampling=2, quality=95)
    (tmp_path / "probe.JPEG").write_bytes(encoded.getvalue())
    decode = get_decode_func("cpu", EvalTransform(size=128, crop_pct=1.0), "nvjpeg")
    images, _ = decode([(str(tmp_path / "probe.JPEG"), 0)])
    colour = images.float().mean(dim=(0, 2, 3)).tolist()
    assert max(abs(c - e) for c, e in zip(colour, (200, 80, 40), strict=True)) <= 4
