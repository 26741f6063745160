"""A newcomer's first hour: timm's flag names, the transform's overrides, the results as CSV,
what a run records about itself, and the defaults."""

from __future__ import annotations

import csv
import datetime
import json
import math

import pytest
import torch

from imagenet_classification import (
    COMPILE_MODE,
    EvalTransform,
    InputError,
    WarmupIncluded,
    _parse_args,
    benchmark,
    get_model,
)
from tests.conftest import TINY, read_json, run_cli, run_main


def test_timms_flag_names_mean_what_they_mean_there(tmp_path):
    args = _parse_args(["-m", "resnet50", "-b", "64", "-j", "4", str(tmp_path), "--num-samples", "100",
                        "--pretrained", "--amp", "--torchcompile"])  # fmt: skip
    assert (args.model, args.batch_size, args.num_threads, args.data_dir, args.max_samples) == (
        "resnet50", 64, 4, tmp_path, 100)  # fmt: skip
    assert (args.pretrained, args.dtype, args.compile) == (True, "auto", True)
    assert _parse_args(["--data-dir", str(tmp_path), "--workers", "3", "--amp-dtype", "float16"]).num_threads == 3
    # Compilation: unset (the device decides) unless asked for, by a flag, timm's name or a mode.
    assert _parse_args([str(tmp_path)]).compile is None
    assert _parse_args([str(tmp_path), "--compile-mode", "max-autotune"]).compile is True
    assert _parse_args([str(tmp_path), "--no-compile"]).compile is False
    assert COMPILE_MODE == "default"


@pytest.mark.parametrize(
    "argv",
    [["DIR", "--data-dir", "DIR"], ["DIR", "--input-flist", "x"], ["DIR", "--torchcompile", "eager"],
     ["DIR", "--crop-pct", "2.5"], ["DIR", "--mean", "0.5", "0.5"], ["DIR", "--compile", "--no-compile"],
     ["DIR", "--img-size", "4097"], ["DIR", "--interpolation", "box"], ["DIR", "--pretrained", "--no-pretrained"]],
)  # fmt: skip
def test_flags_that_cannot_go_together_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as refused:
        _parse_args(argv)
    assert refused.value.code == 2 and "error:" in capsys.readouterr().err


def test_transform_overrides_reach_the_loader_and_the_model():
    overrides = {"img_size": 96, "crop_pct": 1.0, "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.25,) * 3}
    t = EvalTransform.from_model("test_efficientnet", overrides)
    assert (t.size, t.crop_pct, t.interpolation, t.mean, t.std) == (96, 1.0, "bilinear", (0.5,) * 3, (0.25,) * 3)
    bundle = get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype="float32",
                       transform=overrides)  # fmt: skip
    assert bundle.transform == t
    # The CLI builds the transform once and hands the object on: the bundle's is that one.
    built = get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype="float32", transform=t)
    assert built.transform is t
    assert bundle.preprocessing.mean.flatten().tolist() == [0.5] * 3
    assert bundle.preprocessing.std.flatten().tolist() == [0.25] * 3
    assert EvalTransform.from_model("test_efficientnet").size != 96  # the config's own otherwise


def test_a_crop_mode_given_reaches_the_transform():
    assert EvalTransform.from_model("test_efficientnet").crop_mode == "center"
    assert EvalTransform.from_model("test_efficientnet", {"crop_mode": "squash"}).crop_mode == "squash"
    with pytest.raises(InputError, match="its crop mode 'border' is neither center nor squash"):
        EvalTransform.from_model("test_efficientnet", {"crop_mode": "border"})


def test_results_as_csv_one_row_with_timms_columns_and_the_run_recorded(jpeg_set, tmp_path):
    csv_path, json_path = tmp_path / "r.csv", tmp_path / "r.json"
    # The two runs' accuracies are compared: the same weights in both, not each process's random ones.
    import timm

    checkpoint = tmp_path / "tiny.pth"
    torch.save(timm.create_model("test_efficientnet").state_dict(), checkpoint)
    model = ["--model", "test_efficientnet", "--checkpoint", checkpoint, "--device", "cpu", "--num-threads", "2"]
    common = ["--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *model, "-b", "4", "--warmup-batches",
              "1", "--img-size", "64", "--crop-pct", "1.0", "--interpolation", "bilinear"]  # fmt: skip
    proc = run_cli(*common, "--results-file", csv_path)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 1 and not csv_path.read_text().lstrip().startswith("{")
    row = rows[0]
    assert (row["model"], row["img_size"], row["crop_pct"], row["interpolation"]) == (
        "test_efficientnet", "64", "1.0", "bilinear")  # fmt: skip
    assert float(row["top1"]) + float(row["top1_err"]) == pytest.approx(100)
    assert float(row["infer_samples_per_sec"]) == pytest.approx(float(row["fps"]), abs=0.01)
    assert row["command"].startswith("python ") and "--img-size 64" in row["command"]
    proc = run_cli(*common, "--results-file", json_path)
    assert proc.returncode == 0, proc.stderr
    r = read_json(json_path)
    assert float(row["top1"]) == pytest.approx(100 * r["top1"], abs=1e-3)
    assert r["config"]["input_size"] == [3, 64, 64] and r["config"]["interpolation"] == "bilinear"
    started = datetime.datetime.fromisoformat(r["config"]["start_time"])
    assert started.tzinfo is not None and abs(datetime.datetime.now(datetime.UTC) - started).total_seconds() < 3600
    assert r["env"]["imagenet_classification"] == "0.1.0"
    assert r["config"]["command"].split()[2:4] == ["--input-flist", str(jpeg_set)]
    # Every field a number where a number stands in other runs: the bound is a number or null.
    assert r["fps_max_overstatement"] is None or isinstance(r["fps_max_overstatement"], float)
    assert isinstance(r["fps_window_may_be_buffered"], bool)
    json.dumps(r, allow_nan=False)  # valid JSON: no inf, no NaN


def test_the_csv_rows_batch_size_is_the_batches_run(jpeg_set, tmp_path, capfd):
    # Three images at --batch-size 8: one batch of 3 ran, which is what timm's column means.
    out = tmp_path / "r.csv"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--max-samples", "3",
                    "-b", "8", "--warmup-batches", "0", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = csv.DictReader(out.open())
    assert (row["infer_batch_size"], row["classified"], row["frames_timed"]) == ("3", "3", "3")
    assert row["drained_batches"] in ("0", "1") and float(row["fps_while_loading"] or row["fps"]) > 0


def test_the_cpu_run_does_not_compile_by_default(jpeg_set, tmp_path, capfd):
    out = tmp_path / "r.json"  # in this process: what the run reports is checked, not the process
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--max-samples", "8",
                    "-b", "4", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_json(out)["config"]["compile"] is False


def test_benchmark_says_when_its_warmup_is_in_the_fps():
    from tests.test_numbers import _batch, _bundle

    with pytest.warns(WarmupIncluded, match="only 3 batch") as warned:
        result = benchmark((_batch([1]) for _ in range(3)), _bundle(), listed=3)
    assert result.warmup_included and not math.isnan(result.fps)
    assert warned[0].filename == __file__  # the warning points at the notebook's call, not the module
    with torch.inference_mode(False):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error", WarmupIncluded)
            benchmark((_batch([1]) for _ in range(3)), _bundle(), listed=3, warmup_batches=2)  # 1 timed: no warning


def test_predictions_in_list_order_with_class_names(jpeg_set, tmp_path, capfd):
    from imagenet_classification import ImageList, _in_list_order

    # Rows as batches finished out of order, one path listed twice: back in the list's order,
    # line by line (a repeat in its own place, not beside the first); a path not listed, last.
    images = ImageList(("a", "b", "c", "a"), (0, 1, 2, 0))
    rows = [{"path": p} for p in ("c", "x", "a", "b", "a")]
    assert [r["path"] for r in _in_list_order(rows, images)] == ["a", "b", "c", "a", "x"]
    # A real run (in this process: its predictions file is checked): 4 decode threads on batches
    # of 2, so batches finish in any order.
    out = tmp_path / "p.csv"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY[:-2], "-j", "4", "-b",
                    "2", "--no-compile", "--predictions-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    listed = [f"{jpeg_set.parent}/{line}" for line in jpeg_set.read_text().split()]
    assert [r["path"] for r in rows] == listed
    names = {"0": "tench", "281": "tabby", "636": "mailbag", "967": "espresso"}
    assert all(r["label_name"] == names[r["label"]] for r in rows)
    assert all(len(r["top5_names"].split(" | ")) == 5 for r in rows)
