"""FFmpeg decode through SPDL: shapes, alignment, parity with a PIL reference."""

import io
import platform
from pathlib import Path

import numpy as np
import pytest
import spdl.io
import torch
import torchvision.transforms.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from imagenet_classification import (
    BadImagePolicy,
    EvalTransform,
    ImageDecodeError,
    InputError,
    _check_gpu_decoder,
    _cpu_fallback,
    _decode_frames,
    _FilterGraphCache,
    _nvdec_can_take,
    _parse_jpeg_header,
    _read_image_bytes,
    _resize_region,
    get_decode_func,
    source,
)
from tests.conftest import label_colour, write_jpeg

# Mean absolute difference (0-255 scale) between this decoder and PIL's decode + bicubic
# resize + crop of the same JPEGs, measured on the 20 demo photos: at most 0.99, mean 0.46
# (1.22 and 0.58 with a bicubic kernel for chroma too; bench/parity.py).
PIL_PARITY_MAD = 1.2
PIL_PARITY_MEAN_MAD = 0.5


def _items(flist: Path) -> list[tuple[str, int]]:
    return list(source(flist, prefix=f"{flist.parent}/"))


def test_batch_shape_dtype_device_and_layout(jpeg_set):
    items = _items(jpeg_set)[:6]
    images, labels = get_decode_func("cpu")(items)
    assert images.shape == (6, 3, 224, 224) and images.dtype == torch.uint8 and images.device.type == "cpu"
    assert labels.shape == (6, 1) and labels.dtype == torch.int64
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_labels_stay_aligned_with_images(jpeg_set):
    # Each generated image's colour encodes its class: check every decoded image against its label.
    images, labels = get_decode_func("cpu")(_items(jpeg_set))
    means = images.float().mean(dim=(2, 3))
    for mean, label in zip(means, labels[:, 0].tolist(), strict=True):
        assert torch.allclose(mean, torch.tensor(label_colour(label), dtype=torch.float32), atol=6), (label, mean)


def test_transform_follows_model_config(jpeg_set):
    transform = EvalTransform(size=160, crop_pct=0.95, interpolation="bilinear")
    images, _ = get_decode_func("cpu", transform)(_items(jpeg_set)[:2])
    assert images.shape == (2, 3, 160, 160)
    assert transform.resize_short == 168


@pytest.mark.parametrize("width, height", [(500, 375), (375, 500), (333, 500), (341, 256), (8, 8), (8000, 60)])
def test_geometry_matches_torchvision(width, height):
    transform = EvalTransform()
    new_w, new_h, left, top = transform.geometry(width, height)
    resized = TF.resize(torch.zeros(1, height, width), transform.resize_short, antialias=False)
    assert (new_h, new_w) == tuple(resized.shape[-2:])
    grid = torch.arange(new_h * new_w).view(1, new_h, new_w)
    crop = TF.center_crop(grid, [224, 224])
    assert int(crop[0, 0, 0]) == top * new_w + left


def _pil_reference(path: str, transform: EvalTransform) -> np.ndarray:
    image = Image.open(path).convert("RGB")
    new_w, new_h, left, top = transform.geometry(*image.size)
    image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
    return np.asarray(image.crop((left, top, left + transform.size, top + transform.size)))


def test_cached_filter_graphs_equal_a_fresh_graph_per_image(jpeg_set):
    transform = EvalTransform()
    graphs = _FilterGraphCache(transform, capacity=2)  # 4 sizes in the set: graphs are dropped and rebuilt
    for path, _ in _items(jpeg_set) * 2:
        packets = spdl.io.demux_image(path)
        filter_desc = transform.ffmpeg_filter(packets.width, packets.height)
        fresh = spdl.io.decode_packets(packets, filter_desc=filter_desc)
        cached = graphs.apply(spdl.io.decode_packets(spdl.io.demux_image(path), filter_desc=None))
        expected = spdl.io.to_numpy(spdl.io.convert_frames([fresh]))
        assert np.array_equal(spdl.io.to_numpy(spdl.io.convert_frames([cached])).reshape(expected.shape), expected)
    assert len(graphs._local.graphs) == 2


def test_image_files_are_read_whole_in_one_read_of_their_size(tmp_path):
    # One read of the size fstat gives, and a byte more: a file that grew is still read whole (or
    # refused over the limit), and so is one whose size says 0 although it has data, as /proc's.
    path = write_jpeg(tmp_path / "a.JPEG", (64, 48), (10, 20, 30))
    assert _read_image_bytes(str(path)) == path.read_bytes()
    with pytest.raises(ImageDecodeError, match="over the"):
        _read_image_bytes(str(path), max_bytes=100)
    if Path("/proc/self/status").is_file():
        assert _read_image_bytes("/proc/self/status").startswith(b"Name:")


def test_a_sizes_graph_is_kept_from_its_second_image_on(tmp_path):
    # Sizes met once (most of ImageNet's long tail) must not push the common sizes' graphs out.
    common = write_jpeg(tmp_path / "common.JPEG", (500, 375), (90, 120, 150))
    once = [write_jpeg(tmp_path / f"once{i}.JPEG", (400 + i, 300), (90, 120, 150)) for i in range(4)]
    graphs = _FilterGraphCache(EvalTransform(), capacity=2)
    for path in [common, *once, common, *once[:1]]:
        graphs.apply(_decode_frames(path.read_bytes()))
    assert set(graphs._local.graphs) == {(500, 375, "yuvj420p"), (400, 300, "yuvj420p")}
    assert set(graphs._local.seen) == {(400 + i, 300, "yuvj420p") for i in range(1, 4)}


@pytest.mark.parametrize("mode", ["RGB", "RGB 4:4:4", "L", "CMYK", "PNG L", "PNG RGB"])
def test_telling_swscale_the_input_is_full_range_changes_no_pixel(tmp_path, mode):
    # The filter chain says in_range=full, so that swscale is set up once per graph: the same
    # pixels as when it learns the range from the frame.
    from make_demo_data import PHOTOS, photo_path

    photo = Image.open(photo_path(next(iter(PHOTOS)))).resize((500, 333))
    path = tmp_path / "photo.JPEG"
    fmt, pil_mode = ("PNG", mode[4:]) if mode.startswith("PNG") else ("JPEG", mode.split()[0])
    photo.convert(pil_mode).save(path, format=fmt, **({"subsampling": 0} if "4:4:4" in mode else {}))
    told = EvalTransform().ffmpeg_filter(500, 333)
    assert ":in_range=full" in told
    outputs = []
    for chain in (told, told.replace(":in_range=full", "")):
        frames = _decode_frames(path.read_bytes())
        source = f"buffer=video_size=500x333:pix_fmt={frames.pix_fmt}:time_base=1/25:pixel_aspect=1/1"
        graph = spdl.io.FilterGraph(f"{source},{chain},buffersink")
        graph.add_frames(frames)
        outputs.append(spdl.io.to_numpy(spdl.io.convert_frames([graph.get_frames()])))
    assert np.array_equal(*outputs)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the Xvid IDCT is used on x86-64")
def test_jpeg_is_decoded_with_the_xvid_idct_within_rounding_of_ffmpegs_default(demo_photos):
    # The loader's decode differs from FFmpeg's default IDCT (so the option reaches the decoder),
    # by no more than IDCT rounding, seen through the same resize and crop.
    graphs = _FilterGraphCache(EvalTransform())

    def pixels(frames: spdl.io.ImageFrames) -> np.ndarray:
        return spdl.io.to_numpy(spdl.io.convert_frames([graphs.apply(frames)])).astype(np.int16)

    for path, _ in _items(demo_photos)[:5]:
        data = Path(path).read_bytes()
        default = spdl.io.decode_packets(spdl.io.demux_image(data), filter_desc=None)
        diff = np.abs(pixels(_decode_frames(data)) - pixels(default))
        assert 0 < diff.mean() < 0.5 and diff.max() <= 8, (path, diff.mean(), diff.max())


def test_pixels_agree_with_pil_on_real_photos(demo_photos):
    transform = EvalTransform()
    items = _items(demo_photos)
    images, _ = get_decode_func("cpu", transform)(items)
    mads = []
    for (path, _), image in zip(items, images, strict=True):
        reference = _pil_reference(path, transform).astype(np.int16)
        mads.append(np.abs(image.permute(1, 2, 0).numpy().astype(np.int16) - reference).mean())
    assert max(mads) < PIL_PARITY_MAD, mads
    assert np.mean(mads) < PIL_PARITY_MEAN_MAD, mads
    assert min(mads) > 0  # a real comparison: the two decoders are not bit-identical


@settings(max_examples=400, deadline=None)
@given(st.integers(32, 4000), st.integers(32, 4000))
def test_resize_region_samples_where_the_whole_frame_would(width, height):
    transform = EvalTransform()
    new_w, new_h, left, top = transform.geometry(width, height)
    for length, resized, offset in ((width, new_w, left), (height, new_h, top)):
        start, src_len, out, pad = _resize_region(length, resized, offset, transform.size)
        if (start, src_len, out, pad) == (0, length, resized, offset):
            continue  # the whole side
        assert length >= resized and out < resized
        assert start % 2 == 0 and src_len % 2 == 0 and 0 <= start and start + src_len <= length
        assert pad >= 4 and out - pad - transform.size >= 4
        for k in (0, transform.size - 1):  # the error is linear in k: its ends bound it
            ours = start + (pad + k + 0.5) * src_len / out
            whole = (offset + k + 0.5) * length / resized
            assert abs(ours - whole) <= 0.06  # REGION_TOLERANCE, as documented


def _resize_region_by_loop(length, resized, offset, crop):
    """resize_region's search as a plain loop over the candidates (as it was written before
    issue #22 vectorised it): the smallest qualifying resized length, the first pad on a tie."""
    whole = (0, length, resized, offset)
    ratio = length / resized
    if ratio < 1:
        return whole
    best, best_out = whole, resized
    for pad in range(4, 17):
        for out in range(crop + pad + 4, min(crop + pad + 40, best_out)):
            src_len = 2 * round(out * ratio / 2)
            step = src_len / out
            ideal_start = (offset + 0.5) * ratio - (pad + 0.5) * step
            start = 2 * round(ideal_start / 2)
            if start < 0 or start + src_len > length:
                continue
            first = start - ideal_start
            if max(abs(first), abs(first + (crop - 1) * (step - ratio))) <= 0.06:
                best, best_out = (start, src_len, out, pad), out
                break
    return best


@pytest.mark.parametrize("size, crop_pct", [(224, 0.875), (288, 1.0), (160, 0.95)])
def test_resize_region_finds_what_a_plain_search_finds(size, crop_pct):
    # The same regions, so the same pixels, for every side length the sets meet and beyond.
    transform = EvalTransform(size=size, crop_pct=crop_pct)
    for length in range(size // 2, 1400):
        for other in (length, 333, 375, 500, 301):
            new_w, new_h, left, top = transform.geometry(length, other)
            for args in ((length, new_w, left, size), (other, new_h, top, size)):
                found = _resize_region(*args)
                assert found == _resize_region_by_loop(*args) and all(type(v) is int for v in found), args


def test_resize_region_is_used_for_imagenets_common_sizes():
    transform = EvalTransform()
    for width, height in ((500, 375), (375, 500), (500, 333), (640, 480)):
        new_w, new_h, left, top = transform.geometry(width, height)
        long_side = (width, new_w, left) if width > height else (height, new_h, top)
        assert _resize_region(*long_side, transform.size)[1] < long_side[0]
    assert _resize_region(200, 256, 16, 224) == (0, 200, 256, 16)  # enlarged: the whole side


@pytest.mark.parametrize("size", [(300, 273), (273, 300), (500, 375), (640, 427), (224, 224)])
def test_region_resize_agrees_with_pil_at_awkward_sizes(tmp_path, size):
    # 300 x 273: the odd side is resized whole while the other side is cut to a region.
    from make_demo_data import PHOTOS, photo_path

    photo = Image.open(photo_path(next(iter(PHOTOS)))).convert("RGB").resize(size, Image.Resampling.LANCZOS)
    path = tmp_path / "n01440764" / "photo.JPEG"
    path.parent.mkdir()
    photo.save(path, quality=95)
    transform = EvalTransform()
    images, _ = get_decode_func("cpu", transform)([(str(path), 0)])
    reference = _pil_reference(str(path), transform).astype(np.int16)
    mad = np.abs(images[0].permute(1, 2, 0).numpy().astype(np.int16) - reference).mean()
    assert 0 < mad < PIL_PARITY_MAD


def test_strict_decode_names_the_bad_file(tmp_path, jpeg_set):
    bad = tmp_path / "val" / "n01440764" / "broken.JPEG"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"this is not an image" * 50)
    items = _items(jpeg_set)[:2] + [(str(bad), 0)]
    with pytest.raises(ImageDecodeError, match="broken.JPEG: not an image") as info:
        get_decode_func("cpu")(items)
    assert info.value.path == str(bad)


def test_skipping_keeps_batch_mates_and_alignment(tmp_path, jpeg_set):
    good = _items(jpeg_set)[:5]
    missing = (str(tmp_path / "n01440764_missing.JPEG"), 0)
    items = [good[0], missing, good[1], good[2], (str(tmp_path), 0), good[3], good[4]]
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", policy=policy)(items)
    images, labels = batch
    assert labels[:, 0].tolist() == [label for _, label in good]
    assert images.shape[0] == 5
    assert [f.path for f in batch.failures] == [missing[0], str(tmp_path)]
    assert "No such file" in batch.failures[0].reason and "directory" in batch.failures[1].reason


def test_zero_size_in_jpeg_header_is_reported(tmp_path, jpeg_set):
    # Found by fuzzing: a corrupt frame header can declare a width of 0.
    data = bytearray((jpeg_set.parent / jpeg_set.read_text().splitlines()[0]).read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 7 : sof + 9] = b"\x00\x00"  # SOF0: length(2) precision(1) height(2) width(2)
    path = tmp_path / "zero-width.JPEG"
    path.write_bytes(bytes(data))
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", policy=policy)([(str(path), 0)])
    assert batch[0].shape[0] == 0 and len(batch.failures) == 1
    assert "FFmpeg cannot decode it" in batch.failures[0].reason


def test_all_failed_batch_is_empty_not_an_error(tmp_path):
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", policy=policy)([(str(tmp_path / "a.JPEG"), 0)])
    images, labels = batch
    assert images.shape == (0, 3, 224, 224) and labels.shape == (0, 1) and len(batch.failures) == 1


def test_jpeg_with_a_second_image_appended_decodes_to_its_primary_image(tmp_path, demo_photos):
    # As in an MPO file or a phone photo carrying its HDR gain map after the primary image:
    # FFmpeg's JPEG parser would split the file in two, which SPDL refuses ("multiple frames").
    primary_path, _ = _items(demo_photos)[0]
    primary = Path(primary_path).read_bytes()
    appended = io.BytesIO()
    Image.new("RGB", (160, 120), (10, 200, 30)).save(appended, format="JPEG")
    both = tmp_path / "with-gain-map.JPEG"
    both.write_bytes(primary + appended.getvalue())
    decode = get_decode_func("cpu")
    images, labels = decode([(str(both), 3)])
    alone, _ = decode([(primary_path, 3)])
    assert labels.tolist() == [[3]] and torch.equal(images, alone)


@pytest.mark.parametrize("fmt", ["GIF", "PNG"])
def test_animated_image_decodes_to_its_first_frame_as_pil_does(tmp_path, fmt):
    frames = [Image.new("RGB", (320, 240), (60 + 60 * i, 90, 30)) for i in range(3)]
    path = tmp_path / f"animated-{fmt}.JPEG"
    frames[0].save(path, format=fmt, save_all=True, append_images=frames[1:])
    images, _ = get_decode_func("cpu")([(str(path), 0)])
    with Image.open(path) as reference:
        first = np.asarray(reference.convert("RGB"), dtype=np.float32).mean(axis=(0, 1))
    assert images.shape == (1, 3, 224, 224)
    assert np.abs(images.float().mean(dim=(2, 3))[0].numpy() - first).max() < 3


@pytest.mark.parametrize(
    "name, save",
    [
        ("tiff-jpeg-rgb", dict(format="TIFF", compression="jpeg")),  # FFmpeg decodes these to a black frame
        ("tiff-jpeg-ycbcr", dict(format="TIFF", compression="jpeg", mode="YCbCr")),  # ... or a green one
        ("animated-webp", dict(format="WEBP", save_all=True)),  # FFmpeg decodes no frame of it
        ("bmp", dict(format="BMP")),
        ("tiff-lzw", dict(format="TIFF", compression="tiff_lzw")),
    ],
)
def test_containers_other_than_jpeg_and_png_decode_as_pil_does(tmp_path, demo_photos, name, save):
    # Whatever the name says, the data decides: FFmpeg for JPEG and PNG data, PIL for the rest.
    photo_path, _ = _items(demo_photos)[0]
    photo = Image.open(photo_path).convert("RGB")
    path = tmp_path / f"{name}.JPEG"
    options = dict(save)
    image = photo.convert(options.pop("mode")) if "mode" in options else photo
    if options.get("save_all"):
        options["append_images"] = [photo.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    image.save(path, **options)
    transform = EvalTransform()
    images, _ = get_decode_func("cpu", transform)([(str(path), 0)])
    reference = _pil_reference(str(path), transform).astype(np.int16)
    decoded = images[0].permute(1, 2, 0).numpy().astype(np.int16)
    assert np.abs(decoded - reference).mean() < 1.0, name  # the image, not a black or green frame
    assert decoded.std() > 20  # a photo, with its detail


def _jpeg_with_thumbnail(image: Image.Image) -> bytes:
    """A JPEG whose APP1 segment holds a smaller JPEG, markers and all, as an EXIF thumbnail does."""
    main, thumb = io.BytesIO(), io.BytesIO()
    image.save(main, format="JPEG")
    image.resize((80, 60)).save(thumb, format="JPEG")
    payload = b"Exif\x00\x00" + thumb.getvalue()
    app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    return main.getvalue()[:2] + app1 + main.getvalue()[2:]


def test_data_after_the_end_of_a_jpeg_is_not_truncation(tmp_path, demo_photos):
    # Cameras append trailers (Samsung's runs to kilobytes) after the end-of-image marker.
    path, _ = _items(demo_photos)[0]
    trailer = tmp_path / "trailer.JPEG"
    trailer.write_bytes(Path(path).read_bytes() + b"SEFH" + bytes(4000))
    decode = get_decode_func("cpu")
    images, _ = decode([(str(trailer), 0)])
    assert torch.equal(images, decode([(path, 0)])[0])


def test_truncated_jpeg_is_reported_even_with_a_thumbnails_end_marker_inside(tmp_path):
    data = _jpeg_with_thumbnail(Image.new("RGB", (400, 300), (200, 30, 30)))
    whole, cut = tmp_path / "whole.JPEG", tmp_path / "cut.JPEG"
    whole.write_bytes(data)
    cut.write_bytes(data[: len(data) - 100])  # ends inside the main image's scan
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", policy=policy)([(str(whole), 0), (str(cut), 1)])
    assert batch[1].tolist() == [[0]] and len(batch.failures) == 1
    assert "truncated JPEG" in batch.failures[0].reason


def test_grayscale_jpeg_decodes_to_rgb(tmp_path):
    path = tmp_path / "gray.JPEG"
    Image.fromarray(np.full((300, 400), 77, dtype=np.uint8), mode="L").save(path)
    images, _ = get_decode_func("cpu")([(str(path), 0)])
    assert images.shape == (1, 3, 224, 224)
    assert (images.float().mean(dim=(2, 3)) - 77).abs().max() < 2


def test_which_images_nvdec_can_take(tmp_path):
    # Sequential 8-bit 4:2:0 JPEGs within NVDEC's 64 x 64 .. 32768 x 16384 (A100 / H100), nothing else.
    rgb = np.clip(np.random.default_rng(3).normal(128, 40, (96, 128, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    cases = {
        "baseline-420.JPEG": (image, dict(subsampling=2), 0xC0, True),
        "baseline-444.JPEG": (image, dict(subsampling=0), 0xC0, False),
        "progressive-420.JPEG": (image, dict(subsampling=2, progressive=True), 0xC2, False),
        "gray.JPEG": (image.convert("L"), dict(), 0xC0, False),
        "cmyk.JPEG": (image.convert("CMYK"), dict(), 0xC0, False),
        "png-data.JPEG": (image, dict(format="PNG"), None, False),
        "8x8.JPEG": (image.resize((8, 8)), dict(subsampling=2), 0xC0, False),
        "64x64.JPEG": (image.resize((64, 64)), dict(subsampling=2), 0xC0, True),
        "64x63.JPEG": (image.resize((64, 63)), dict(subsampling=2), 0xC0, False),
    }
    for name, (picture, options, frame_type, expected) in cases.items():
        path = tmp_path / name
        picture.save(path, **{"format": "JPEG", **options})
        header = _parse_jpeg_header(path.read_bytes())
        assert (header.frame_type if header else None) == frame_type, name
        assert _nvdec_can_take(header, EvalTransform()) is expected, name
    header = _parse_jpeg_header((tmp_path / "cmyk.JPEG").read_bytes())
    assert (header.components, header.width, header.height) == (4, 128, 96)


def test_gpu_fallback_image_equals_the_ffmpeg_batch(jpeg_set):
    transform = EvalTransform()
    path, label = _items(jpeg_set)[0]
    data = Path(path).read_bytes()
    graphs = _FilterGraphCache(transform)
    image = _cpu_fallback(path, data, _parse_jpeg_header(data), graphs, torch.device("cpu"))
    batch, _ = get_decode_func("cpu", transform)([(path, label)])
    assert image.shape == (3, 224, 224) and torch.equal(image, batch[0])


def test_gpu_decoders_refuse_cpu_at_start():
    for decoder in ("nvjpeg", "nvdec"):
        with pytest.raises(InputError, match=f"{decoder} decodes on a CUDA GPU"):
            _check_gpu_decoder(decoder, torch.device("cpu"))
    assert _check_gpu_decoder("ffmpeg", torch.device("cpu")) == "ffmpeg"
    with pytest.raises(ValueError, match="unknown decoder"):
        get_decode_func("cpu", decoder="pil")
