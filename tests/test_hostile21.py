"""Hostile input, round twenty-one (2026-12-07): numbers checked against each other across the
outputs. Each test fails on the code before it."""

from __future__ import annotations

import json
import os
import signal
import warnings

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import TINY, run_cli, run_main

FAST = [*TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "1", "--img-size", "32"]


def _run_signalled(capfd, jpeg_set, tmp_path, monkeypatch, images_left: int) -> tuple:
    """The CLI's run, SIGINT sent once ``images_left`` of the list are still to come (0: as the
    loader's end is awaited, every image counted); its exit, stdout, stderr and results."""
    ending = ic._ending_once_complete

    def signalled(batches, listed, *rest):
        delivered = 0
        for batch in ending(batches, listed, *rest):
            yield batch
            delivered += len(batch[1]) + len(getattr(batch, "failures", ()))
            if delivered >= listed - images_left:
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ic, "_ending_once_complete", signalled)
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--results-file", out)
    return proc, json.loads(out.read_text())


def test_a_signal_as_the_loaders_end_is_awaited_keeps_the_whole_result(capfd, jpeg_set, tmp_path, monkeypatch):
    # Every image classified, the loop waiting for SPDL's end of stream (0.05-0.1 s): a signal then
    # marked the whole run "(PARTIAL RUN)", stop_reason set, as if images had been left unread.
    proc, result = _run_signalled(capfd, jpeg_set, tmp_path, monkeypatch, 0)
    assert proc.returncode == 128 + signal.SIGINT and "error: interrupted by SIGINT" in proc.stderr, proc.stderr
    whole = (result["classified"], result["not_reached"], result["partial"], result["stop_reason"])
    assert whole == (30, 0, False, None)
    assert "(PARTIAL RUN)" not in proc.stdout and "listed=30 classified=30" in proc.stdout


def test_a_run_interrupted_before_its_last_image_stays_partial(capfd, jpeg_set, tmp_path, monkeypatch):
    # The other side of the rule: a batch short of the list, the same signal leaves a partial run.
    proc, result = _run_signalled(capfd, jpeg_set, tmp_path, monkeypatch, 4)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert result["partial"] is True and result["stop_reason"] == "interrupted by SIGINT"
    assert result["classified"] + result["not_reached"] == 30 and result["not_reached"] > 0


def test_the_loaders_lead_in_the_results_is_never_more_than_the_window(jpeg_set, tmp_path):
    # With --decode-processes the lead is not measured: the results file gave the loader's whole
    # capacity (21 batches) beside a window of 7, though README says never more than the window has.
    out = tmp_path / "r.json"
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--decode-processes", "1",
                   "--num-threads", "1", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["batches_timed"] == 7 and 0 <= result["loader_lead"] <= 7, result
    assert result["fps_window_may_be_buffered"] is (result["loader_lead"] == 7)


class _Ranked(torch.nn.Module):
    """Logits that rank classes 10, 20, 30, 40, 50 first, in that order, for every image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros((x.shape[0], ic.NUM_CLASSES))
        logits[:, [10, 20, 30, 40, 50]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
        return logits


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32])
def test_labels_of_any_whole_number_type_count_as_int64_labels(dtype):
    # A notebook's compact labels: uint8 ones were all said to name no class (uint8 has no -1: the
    # check `labels < -1` wrapped), uint16 and uint32 ones failed the run mid-way in torch's
    # comparison with topk's indices ("Promotion for uint16, uint32, uint64 types is not supported").
    transform = ic.EvalTransform(size=8)
    model = ic.ModelBundle(ic.Preprocessing(transform.mean, transform.std), _Ranked(), ic.Classification(),
                           torch.float32, transform)  # fmt: skip
    labels = torch.tensor([10, 50, 60, 200], dtype=dtype).view(-1, 1)  # top-1, top-5, two misses
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "named no class" warning (nor WarmupIncluded: no warm-up)
        result = ic.benchmark([(torch.zeros((4, 3, 8, 8), dtype=torch.uint8), labels)], model, warmup_batches=0)
    assert (result.classified, result.top1_correct, result.top5_correct) == (4, 1, 2)
