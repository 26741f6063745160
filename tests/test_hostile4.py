"""Hostile input, round four: what a fresh sweep found (2026-12-05). Each test fails on the code before it."""

from __future__ import annotations

import io
import os
import struct
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from PIL import Image

import imagenet_classification as ic
from tests.conftest import CLASSES, TINY, label_colour, make_jpeg_set, read_json, run_cli, run_main, write_jpeg


@pytest.fixture
def dataset(tmp_path) -> Path:
    return make_jpeg_set(tmp_path / "data", 8)


def _run(capfd, flist: Path, *args):
    return run_main(capfd, "--input-flist", flist, "--prefix", f"{flist.parent}/", *TINY, "--no-compile", *args)


# --- A transform the model cannot take ------------------------------------------------------------


def test_an_img_size_a_fixed_size_model_refuses_is_a_flag_error_before_the_run(dataset, capfd):
    # test_maxvit's windows are built for 160 x 160: timm asserts on any other size, mid-run.
    proc = _run(capfd, dataset, "--model", "test_maxvit", "--img-size", "96")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "error: --img-size: its input size is fixed at 160 x 160: the model refuses a 96 x 96 image" in proc.stderr


def test_a_model_that_asserts_on_its_input_stops_the_run_with_the_partial_result(dataset):
    # A transform given whole skips the config's check: timm's assertion (torch._assert) mid-run is the
    # model's failure, with what was classified, not an unexpected error's traceback.
    model = ic.get_model("test_maxvit", "cpu", pretrained=False, compile=False, transform=ic.EvalTransform(size=96))
    batches = ic.get_decode_func("cpu", model.transform)(list(ic.source(dataset, f"{dataset.parent}/"))[:4])
    with pytest.raises(ic.RunStopped) as stopped:
        ic.benchmark([batches], model, listed=4, warmup_batches=0)
    assert stopped.value.kind == "model" and "the model failed on a batch of 4 images" in str(stopped.value)
    assert stopped.value.result.partial and stopped.value.result.not_reached == 4


def test_a_crop_that_resizes_to_nothing_is_a_flag_error(dataset, capfd):
    proc = _run(capfd, dataset, "--img-size", "1", "--crop-pct", "1.5", "--skip-bad")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr  # it failed every image, as bad images
    assert "error: --crop-pct: 1 / 1.5 resizes each image's shorter side to 0 pixels" in proc.stderr
    with pytest.raises(ValueError, match="resizes each shorter side to 0 pixels"):
        ic.EvalTransform(size=1, crop_pct=1.5)


@pytest.mark.parametrize("overrides", [{"mean": (1, 2)}, {"input_size": 5}])
def test_overrides_timm_cannot_take_are_named(overrides):
    with pytest.raises(ValueError, match=r"transform overrides .*: not values timm takes"):
        ic.EvalTransform.from_model("test_efficientnet", overrides)


# --- Files the run reads are no outputs -----------------------------------------------------------


def test_an_output_among_the_cached_weights_or_the_code_is_refused(dataset, tmp_path, capfd):
    hub = tmp_path / "hub"
    (hub / "checkpoints").mkdir(parents=True)
    previous = torch.hub.get_dir()
    torch.hub.set_dir(str(hub))  # where timm's older weights are downloaded and read from
    try:
        proc = _run(capfd, dataset, "--results-file", hub / "checkpoints" / "weights.pth")
    finally:
        torch.hub.set_dir(previous)
    assert proc.returncode == 2 and "where the model's weights are cached" in proc.stderr, proc.stderr
    assert not (hub / "checkpoints" / "weights.pth").exists()
    code = tmp_path / "code" / "module_of_the_run.py"  # a module this process imported
    code.parent.mkdir()
    code.write_text("VALUE = 1\n")
    sys.path.insert(0, str(code.parent))
    try:
        __import__("module_of_the_run")
        proc = _run(capfd, dataset, "--predictions-file", code.with_suffix(".csv"), "--results-file", code)
    finally:
        sys.path.remove(str(code.parent))
        sys.modules.pop("module_of_the_run", None)
    assert proc.returncode == 2 and "is one of the run's inputs or outputs" in proc.stderr, proc.stderr
    assert code.read_text() == "VALUE = 1\n"


def test_an_output_over_installed_code_the_run_imports_later_is_refused(dataset):
    # timm is imported after the outputs are checked: --results-file .../timm/__init__.py was taken,
    # and the next run's "import timm" met the results' JSON (NameError: name 'false' is not defined);
    # .venv/bin/python (a link to the interpreter) was taken too. Each folder is refused as a whole, so
    # that a name not there yet tells (a test naming a real module would replace it, were it taken).
    paths = sysconfig.get_paths()
    interpreter = os.path.dirname(os.path.realpath(sys.executable))
    for folder, what in ((paths["purelib"], "Python's code is installed"), (paths["scripts"], "Python's code"),
                         (interpreter, "where Python")):  # fmt: skip
        target = Path(folder) / "zz_imagenet_classification_test.py"
        try:
            proc = run_cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *TINY, "--results-file", target)
            assert proc.returncode == 2 and proc.stdout == "", proc.stderr
            assert f"--results-file {target}: that is inside " in proc.stderr and what in proc.stderr
            assert not target.exists()
        finally:
            target.unlink(missing_ok=True)


# --- Notebook calls with values that cannot work ------------------------------------------------------


@pytest.mark.parametrize("warmup", [2.5, -1, True])
def test_a_warmup_that_is_no_whole_number_of_batches_is_refused(dataset, warmup):
    # 2.5 never ended the warm-up (the whole run timed at half its rate); -1 timed more batches than ran.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    batch = ic.get_decode_func("cpu", model.transform)(list(ic.source(dataset, f"{dataset.parent}/"))[:4])
    with pytest.raises(ValueError, match=r"warmup_batches=.*: expected a whole number of batches, 0 or more"):
        ic.benchmark([batch] * 4, model, listed=16, warmup_batches=warmup)
    with pytest.raises(ValueError, match=r"warmup_batches=.*: expected a whole number"):
        ic.measure_loader([batch] * 4, torch.device("cpu"), warmup)
    with pytest.raises(ValueError, match=r"listed=-1: expected a whole number of images"):
        ic.benchmark([batch], model, listed=-1)


def test_values_that_cannot_work_in_the_notebook_api_are_named(dataset):
    with pytest.raises(ValueError, match=r"skip='no': expected True or False"):
        ic.BadImagePolicy(skip="no")
    with pytest.raises(ValueError, match=r"max_image_bytes=-1: expected a whole number of bytes"):
        ic.get_decode_func("cpu", max_image_bytes=-1)
    for max_samples in (-float("inf"), 2.7, 0, float("nan")):
        with pytest.raises(ValueError, match=r"max_samples=.*: expected a whole number of images, 1 or more"):
            list(ic.source(dataset, f"{dataset.parent}/", max_samples))
    assert len(list(ic.source(dataset, f"{dataset.parent}/", float("inf")))) == 8  # the design's default: all
    assert len(list(ic.source(dataset, f"{dataset.parent}/", 3.0))) == 3


def test_labels_by_name_may_be_a_plain_dict(tmp_path):
    flist = tmp_path / "list.txt"
    flist.write_text("a.JPEG\nb.JPEG\n")
    images = ic.read_file_list(flist, labels={"a": 3, "b": 5})
    assert images.labels == (3, 5)
    with pytest.raises(ic.InputError, match="list.txt:2: the labels given has no label for 'b'"):
        ic.read_file_list(flist, labels={"a": 3})


# --- Lists, labels and folders ----------------------------------------------------------------------


def test_a_backslash_is_part_of_a_name(tmp_path):
    # On Linux a backslash is a character of a file name: no folder, no class, as --data-dir reads it.
    root = tmp_path / "data"
    odd = write_jpeg(root / "n01440764" / "x\\n01443537\\y.JPEG", (64, 48), label_colour(0))
    assert ic.parse_wnid("n01440764/x\\n01443537\\y.JPEG") == "n01440764"
    flist = tmp_path / "list.txt"
    flist.write_text("n01440764/x\\n01443537\\y.JPEG\n")
    assert ic.read_file_list(flist, f"{root}/").labels == ic.scan_folder(root).labels == (0,)
    assert ic.read_file_list(flist, f"{root}/").paths == (str(odd),)


def test_one_file_spelled_two_ways_in_a_label_column_gets_one_class(tmp_path):
    flist = tmp_path / "list.txt"
    flist.write_text("val/a.JPEG 5\n./val/a.JPEG 7\n")
    with pytest.raises(ic.InputError, match=r"list.txt:2: gives 'val/a.JPEG' class 7, but .*list.txt:1 gives it"):
        ic.read_file_list(flist)


def test_a_link_in_a_loop_among_the_images_is_a_counted_bad_image(tmp_path, capfd):
    root = tmp_path / "data"
    folder = root / "n01440764"
    write_jpeg(folder / "a.JPEG", (64, 48), label_colour(0))
    (folder / "loop.JPEG").symlink_to("loop.JPEG")  # is_dir() raised ELOOP: the whole folder was refused
    assert [Path(p).name for p in ic.scan_folder(root).paths] == ["a.JPEG", "loop.JPEG"]
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--data-dir", root, *TINY, "--no-compile", "--skip-bad", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["listed"], result["classified"], result["failed"]) == (2, 1, 1)
    assert result["failures"][0]["path"].endswith("loop.JPEG")


def test_a_data_dir_with_an_equals_sign_after_sweep_settings_is_the_data_dir(tmp_path, capsys):
    (tmp_path / "a=b").mkdir()
    args = ic._parse_args(["--sweep", "num-threads=1,2", str(tmp_path / "a=b")])
    assert args.data_dir == tmp_path / "a=b" and args.sweep == ["num-threads=1,2"]
    args = ic._parse_args(["--data-dir", str(tmp_path), "--sweep", "auto", "batch-size=4"])  # settings stay settings
    assert args.sweep == ["auto", "batch-size=4"] and args.data_dir == tmp_path
    with pytest.raises(SystemExit):  # no folder of that name: a (misspelt) setting, so no DATA_DIR was given
        ic._parse_args(["--sweep", "auto", "batch-sise=4"])
    assert "one of the arguments DATA_DIR --input-flist --data-dir is required" in capsys.readouterr().err


# --- The pixel limit, whatever the header looks like -------------------------------------------


def test_the_pixel_limit_holds_for_a_jpeg_with_bytes_between_its_segments(tmp_path):
    # A small JPEG whose frame header declares 20000 x 10000, one stray byte before it: FFmpeg skips
    # the byte to the next marker; the header parse gave up there, and the limit was not checked.
    encoded = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 30, 200)).save(encoded, format="JPEG")
    data = bytearray(encoded.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 10000, 20000)  # height, width
    app0_end = 4 + struct.unpack(">H", data[4:6])[0]
    path = tmp_path / "n01440764" / "bomb.JPEG"
    path.parent.mkdir()
    path.write_bytes(bytes(data[:app0_end]) + b"\x00" + bytes(data[app0_end:]))
    header = ic._parse_jpeg_header(path.read_bytes())
    assert header is not None and (header.width, header.height) == (20000, 10000)
    decode = ic.get_decode_func("cpu", policy=ic.BadImagePolicy(skip=True))
    batch = decode([(str(path), CLASSES["n01440764"])])
    assert len(batch[0]) == 0 and len(batch.failures) == 1
    assert "20000 x 10000 pixels, over the limit of 178,956,970" in batch.failures[0].reason
    assert os.path.getsize(path) < 10_000
