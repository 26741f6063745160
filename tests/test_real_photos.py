"""Real ImageNet weights on real photographs, through the whole pipeline."""

import json

import torch

from imagenet_classification import benchmark, get_decode_func, get_model, get_pipeline, source
from tests.conftest import read_json, run_main


def test_photos_get_their_class_in_top5(demo_photos, lite0_checkpoint):
    bundle = get_model("efficientnet_lite0", "cpu", checkpoint=lite0_checkpoint, compile=False, dtype="float32")
    decode = get_decode_func("cpu", bundle.transform)
    pipeline = get_pipeline(source(demo_photos, f"{demo_photos.parent}/"), 4, decode, 2, 4, 2)
    misses = []
    with torch.inference_mode(), pipeline.auto_stop():
        for images, labels in pipeline.get_iterator(timeout=60):
            top5 = bundle.model(bundle.preprocessing(images)).topk(5).indices
            pairs = zip(labels[:, 0].tolist(), top5.tolist(), strict=True)
            misses += [label for label, top in pairs if label not in top]
    assert misses == []


def test_benchmark_accuracy_on_photos(demo_photos, lite0_checkpoint):
    bundle = get_model("efficientnet_lite0", "cpu", checkpoint=lite0_checkpoint, compile=False, dtype="float32")
    pipeline = get_pipeline(source(demo_photos, f"{demo_photos.parent}/"), 8, get_decode_func("cpu", bundle.transform),
                            2, 4, 2)  # fmt: skip
    with pipeline.auto_stop():
        result = benchmark(pipeline.get_iterator(timeout=60), bundle, listed=20, warmup_batches=1)
    assert (result.classified, result.not_reached, result.top5_correct) == (20, 0, 20)
    assert result.top1_correct >= 19  # measured: 20/20 (planar RGB path; 19/20 with the earlier 4:4:4 YUV one)


def test_cli_with_checkpoint_reports_real_accuracy(demo_photos, lite0_checkpoint, tmp_path, capfd):
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", demo_photos, "--prefix", f"{demo_photos.parent}/", "--model",
                    "efficientnet_lite0", "--checkpoint", lite0_checkpoint, "--device", "cpu", "--no-compile",
                    "--batch-size", "8", "--num-threads", "2", "--warmup-batches", "1",
                    "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert result["config"]["weights"] == str(lite0_checkpoint)
    assert result["top5_correct"] == 20 and result["top1"] >= 0.9


def test_parity_and_predictions_on_real_photos(demo_photos, lite0_checkpoint, tmp_path, capfd):
    # The loader against timm's own validation transform, and one row per image in both formats
    # (in this process: what the run reports, not the process, is checked).
    common = ["--input-flist", demo_photos, "--prefix", f"{demo_photos.parent}/", "--model", "efficientnet_lite0",
              "--checkpoint", lite0_checkpoint, "--device", "cpu", "--no-compile", "--dtype", "float32",
              "--batch-size", "8", "--num-threads", "2", "--warmup-batches", "1"]  # fmt: skip
    out = tmp_path / "r.json"
    proc = run_main(capfd, *common, "--parity", "20", "--predictions-file", tmp_path / "p.csv", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    parity = result["parity"]
    assert parity["images"] == 20 and 0 < parity["mad_mean"] < 1.0 and parity["mad_max"] < 1.5
    assert parity["top1_agree"] >= 0.9 and parity["top1_loader"] >= 0.9 and parity["top1_reference"] >= 0.9
    assert "Parity with timm's reference transform on 20 images" in proc.stdout
    import csv

    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    listed = dict(source(demo_photos, f"{demo_photos.parent}/"))
    assert sorted(row["path"] for row in rows) == sorted(listed)
    for row in rows:
        top5 = [int(c) for c in row["top5"].split()]
        probs = [float(p) for p in row["probs"].split()]
        assert int(row["label"]) == listed[row["path"]] and len(top5) == 5 and probs == sorted(probs, reverse=True)
        assert row["correct1"] == str(int(top5[0] == int(row["label"])))
        assert row["correct5"] == str(int(int(row["label"]) in top5))
    assert sum(int(r["correct1"]) for r in rows) == result["top1_correct"]
    assert sum(int(r["correct5"]) for r in rows) == result["top5_correct"]
    proc = run_main(capfd, *common, "--predictions-file", tmp_path / "p.jsonl")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    by_path = {row["path"]: row for row in rows}
    assert len(lines) == 20 and all(by_path[r["path"]]["top5"] == " ".join(map(str, r["top5"])) for r in lines)
