"""Measurement features: --breakdown, the DataLoader baseline, progress display."""

import io
import json
import logging
import subprocess
import sys
import time

import pytest
import torch

from imagenet_classification import _Breakdown, _PipelineStats, _Progress, get_pipeline
from tests.conftest import ROOT, TINY, read_json, run_cli, run_main

FAST = [*TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "1"]


def test_breakdown_verdict_on_cpu_and_gpu():
    # The bound is the slower side alone on either device; on the CPU, where the two share the
    # cores, the rate of taking turns with no overlap is reported beside it: 1 / (1/600 + 1/40).
    cpu = _Breakdown.from_rates(600.0, 40.0, 36.0, torch.device("cpu"))
    assert (cpu.bound_fps, cpu.bottleneck, cpu.efficiency) == (40.0, "model", 0.9)
    assert cpu.shared_fps == pytest.approx(37.5)
    gpu = _Breakdown.from_rates(5000.0, 20000.0, 4500.0, torch.device("cuda", 0))
    assert (gpu.bound_fps, gpu.bottleneck, gpu.efficiency, gpu.shared_fps) == (5000.0, "loader", 0.9, None)


def test_breakdown_run_reports_three_rates(jpeg_set, tmp_path, capfd):
    out = tmp_path / "r.json"  # in this process: what the run reports is checked, not the process
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--breakdown",
                    "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Breakdown (images/s): loader alone" in proc.stdout and "end-to-end reaches" in proc.stdout
    result = read_json(out)
    b = result["breakdown"]
    assert b.keys() == {"loader_fps", "model_fps", "e2e_fps", "bound_fps", "bottleneck", "efficiency", "shared_fps",
                        "read_fps", "read_mb_s", "read_resident", "read_cold"}  # fmt: skip
    assert b["e2e_fps"] == pytest.approx(result["fps"])
    assert b["loader_fps"] > 0 and b["model_fps"] > 0
    assert b["bound_fps"] == min(b["loader_fps"], b["model_fps"])
    assert b["shared_fps"] == pytest.approx(1 / (1 / b["loader_fps"] + 1 / b["model_fps"]))
    assert b["efficiency"] == pytest.approx(b["e2e_fps"] / b["bound_fps"])
    assert b["bottleneck"] == ("loader" if b["loader_fps"] < b["model_fps"] else "model")
    assert result["classified"] == 30  # the extra timings do not change the accounting


def test_breakdown_of_a_run_shorter_than_the_warmup(jpeg_set, capfd):
    # In this process: what the run reports is checked, not the process.
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                    "--batch-size", "4", "--max-samples", "8", "--breakdown")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not more than the warm-up" in proc.stdout and "Breakdown (images/s): loader alone" in proc.stdout


def test_torch_loader_does_the_same_work(demo_photos, lite0_checkpoint, tmp_path, capfd):
    common = ["--input-flist", demo_photos, "--prefix", f"{demo_photos.parent}/", "--model", "efficientnet_lite0",
              "--checkpoint", lite0_checkpoint, "--device", "cpu", "--no-compile", "--batch-size", "4",
              "--num-threads", "2", "--warmup-batches", "1"]  # fmt: skip
    # In this process (the DataLoader's workers forked from it): the two runs' results are compared.
    spdl_run = run_main(capfd, *common, "--results-file", tmp_path / "spdl.json")
    torch_run = run_main(capfd, *common, "--loader", "torch", "--results-file", tmp_path / "torch.json")
    assert spdl_run.returncode == 0 and torch_run.returncode == 0, torch_run.stderr
    a, b = read_json(tmp_path / "spdl.json"), read_json(tmp_path / "torch.json")
    assert (b["config"]["loader"], a["config"]["loader"]) == ("torch", "spdl")
    assert a["classified"] == b["classified"] == 20 and a["top5_correct"] == b["top5_correct"] == 20
    assert abs(a["top1_correct"] - b["top1_correct"]) <= 1
    # The same batches: 20 images in 5 batches of 4 (each of 2 workers batching its own half of
    # the images made 6, two of them short).
    assert a["batches"] == b["batches"] == 5
    assert a["timeline"]["batch_images"] == b["timeline"]["batch_images"] == [4] * 5


def test_torch_loader_skips_and_counts_bad_images(tmp_path, jpeg_set, capfd):
    lines = jpeg_set.read_text().splitlines()[:9]
    flist = tmp_path / "l.flist"
    (tmp_path / "val" / "n01440764").mkdir(parents=True)
    (tmp_path / "val" / "n01440764" / "bad.JPEG").write_bytes(b"junk" * 100)
    flist.write_text(
        "\n".join([f"{jpeg_set.parent}/{line}" for line in lines] + [f"{tmp_path}/val/n01440764/bad.JPEG"])
    )
    out = tmp_path / "r.json"  # in this process: its results; the strict run below keeps its own, for the status
    proc = run_main(capfd, "--input-flist", flist, *FAST, "--loader", "torch", "--skip-bad", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["classified"], result["failed"], result["not_reached"]) == (9, 1, 0)
    assert "not an image" in result["failures"][0]["reason"]
    strict = run_cli("--input-flist", flist, *FAST, "--loader", "torch")
    assert strict.returncode == 1 and "bad.JPEG: not an image" in strict.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal():
    stream = _Terminal()
    progress = _Progress(100, stream)
    progress.last -= 1  # as if the last line were a second old
    progress(40, torch.tensor(30))
    progress(41, torch.tensor(31))  # too soon after: not shown
    shown = stream.getvalue()
    assert shown.startswith("\r40/100 images classified, ") and "top-1 so far 75.00%" in shown and "41/100" not in shown
    assert " images/s since the start, " in shown  # start-up and warm-up in it, unlike FPS
    progress.close()  # the line as the run ended
    assert stream.getvalue()[len(shown) :].startswith("\r41/100 images classified, ") and "75.61%" in stream.getvalue()


def test_bench_script_runs_and_writes_its_outputs(tmp_path):
    # A small run of bench/compare_loaders.py, so that the harness keeps working; no figures checked.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare_loaders.py"), "--out", str(tmp_path), "--images", "80",
         "--repeats", "1", "--max-threads", "2", "--batch-size", "8", "--model", "test_efficientnet",
         "--model-images", "32", "--scaling-sizes", "400", "800", "--no-plot"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["ratios"]) == {
        "spdl_1thread_over_decode_only", "spdl_over_decode_only_at_max_threads",
        "spdl_over_decode_only_1thread_x_threads", "spdl_1thread_over_decode_as_loader",
        "spdl_over_decode_as_loader_at_max_threads", "spdl_over_torch_at_max_threads",
        "scaling_fps_8k_over_1k", "scaling_rss_8k_over_1k",
    }  # fmt: skip
    assert all(v > 0 for v in results["ratios"].values())
    assert all(len(results[name][t]) == 1 for name in ("decode_only", "decode_only_as_loader") for t in ("1", "2"))
    assert "spdl_over_torch_at_max_threads" in proc.stdout


def test_decode_paths_script_compares_every_variant(tmp_path):
    # A small run of bench/decode_paths.py; its PIL agreement figures are real, so check them.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decode_paths.py"), "--out", str(tmp_path), "--images", "192",
         "--per-image", "32", "--repeats", "1", "--max-threads", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "decode_paths.json").read_text())
    rows = results["decode_paths"]
    assert len(rows) == 12 and all(len(rates) == (11 if "yardstick" in name else 1) for name, rates in rows.items())
    assert set(results["vs_yardstick"]) == set(rows) - {next(name for name in rows if "yardstick" in name)}
    assert all(ratio > 0 for ratio in results["vs_yardstick"].values())
    assert set(results["loader"]) == {"aggregate stage, 1 thread(s)", "in source, 1 thread(s)"}
    current = results["pil_mad"]["the same, decoded as the loader decodes (current)"]
    assert 0 < current < 1.5 and current <= min(results["pil_mad"].values()) + 0.01
    assert "batched in source" in proc.stdout


def _pipeline_occupancy(decode_s: float, consume_s: float) -> dict:
    """Run a real SPDL pipeline whose decode stage and consumer take the given times per batch."""
    stats = _PipelineStats()

    def decode(items):
        time.sleep(decode_s)
        return items

    pipeline = get_pipeline(iter(range(48)), 4, decode, 1, 2, 1, stats=stats)
    with pipeline.auto_stop():
        for _ in pipeline:
            time.sleep(consume_s)
    return stats.summary()


def test_sink_queue_tells_a_starved_model_from_a_slow_one():
    slow_model = _pipeline_occupancy(decode_s=0.001, consume_s=0.03)
    slow_loader = _pipeline_occupancy(decode_s=0.03, consume_s=0.0)
    for summary in (slow_model, slow_loader):
        assert summary["sink_queue"]["items"] == 12
        assert [(s["name"], s["tasks"], s["failures"]) for s in summary["stages"]] == [("decode", 12, 0)]
    assert slow_model["sink_queue"]["occupancy"] > 0.8
    assert slow_loader["sink_queue"]["occupancy"] < 0.2
    assert slow_loader["sink_queue"]["ave_get_wait_s"] > 0.02 > slow_model["sink_queue"]["ave_get_wait_s"]
    decode_ms = dict((s["name"], s["ave_task_s"]) for s in slow_loader["stages"])["decode"] * 1e3
    assert 28 < decode_ms < 60


def test_sink_queue_window_leaves_out_the_warmup():
    # A warm-up where the model is slow (as while it compiles), then a model faster than the loader.
    def run(window: bool) -> dict:
        stats = _PipelineStats()
        pipeline = get_pipeline(iter(range(64)), 4, lambda items: (time.sleep(0.02), items)[1], 1, 4, 1, stats=stats)
        with pipeline.auto_stop():
            for i, _ in enumerate(pipeline):
                if i < 4:
                    time.sleep(0.15)
                if i == 3 and window:
                    stats.start_window()
        return stats.summary()

    whole, windowed = run(window=False), run(window=True)
    assert (whole["sink_queue"]["items"], windowed["sink_queue"]["items"]) == (16, 12)
    assert whole["sink_queue"]["occupancy"] > 0.5 > 0.25 > windowed["sink_queue"]["occupancy"]
    assert windowed["stages"][0]["tasks"] == 16  # task times cover the whole run


def test_run_reports_spdl_stage_stats(jpeg_set, tmp_path, capfd):
    out = tmp_path / "r.json"
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    assert "SPDL stages (average task time x tasks): decode " in proc.stdout
    assert "SPDL sink queue: a batch was waiting" in proc.stdout
    stats = read_json(out)["pipeline_stats"]
    decode = [s for s in stats["stages"] if s["name"] == "decode"]
    assert decode and decode[0]["tasks"] == 8 and decode[0]["ave_task_s"] > 0  # 30 images in batches of 4
    # The sink queue is measured over the FPS window: the 7 batches after the 1-batch warm-up.
    assert stats["sink_queue"]["items"] == 7 and 0.0 <= stats["sink_queue"]["occupancy"] <= 1.0
    # SPDL's own stage lines (whole run, sink line cut at the last put) only when asked for.
    assert "Occupancy rate" not in proc.stderr and "Ave task time" not in proc.stderr
    asked = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--stats-interval", "60")
    assert asked.returncode == 0, asked.stderr
    assert "Occupancy rate" in asked.stderr and "Ave task time" in asked.stderr
    # The baseline's run in this process: its summary and results file are checked. (The two above
    # keep their processes: SPDL's log lines depend on the logging the process set up.)
    torch_run = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--loader",
                         "torch", "--results-file", out)  # fmt: skip
    assert torch_run.returncode == 0, torch_run.stderr
    assert "pipeline_stats" not in read_json(out) and "SPDL stages" not in torch_run.stdout


def test_report_stats_interval_makes_spdl_log_during_the_run(caplog):
    # The design's notebook knob: SPDL's per-stage lines every S seconds, not only at each stage's end.
    def decode_lines(interval: float) -> int:
        caplog.clear()
        pipeline = get_pipeline(iter(range(40)), 2, lambda items: (time.sleep(0.03), items)[1], 1, 2, 1, interval)
        with pipeline.auto_stop():
            assert sum(1 for _ in pipeline.get_iterator(timeout=30)) == 20
        return sum("[decode]" in r.getMessage() or ":decode]" in r.getMessage() for r in caplog.records)

    caplog.set_level(logging.INFO, logger="spdl.pipeline")  # the CLI quiets it
    assert decode_lines(-1) == 1  # at the stage's end
    assert decode_lines(0.1) >= 3  # a 0.6 s stage: every 0.1 s, and at its end
