"""Hostile input, round seventeen (2026-12-07). Each test fails on the code before it."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import imagenet_classification as ic


def test_a_stop_raised_after_a_held_signal_is_the_signals():
    # killpg's SIGTERM (torchrun, systemd, `timeout`) ends the DataLoader's workers too. It came as the
    # batch was counted, and was held there; torch's SIGCHLD handler then raised the workers' death in
    # the same block: exit 1, "the DataLoader failed", and the signal lost (CI, once).
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = model.transform.size
    batch = (torch.zeros(2, 3, size, size, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.int64))
    calls = []

    def signal_then_workers_gone() -> None:  # the run's start clock passes; the warm-up's end is hit
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # its handler runs: the signal is held
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated. ")

    with pytest.raises(ic.RunInterrupted) as stopped:
        ic.benchmark([batch, batch], model, warmup_batches=1, sync_clocks=signal_then_workers_gone)
    assert stopped.value.signum == signal.SIGINT and len(calls) == 2
    assert stopped.value.result.partial and stopped.value.result.classified == 2
    assert stopped.value.result.stop_reason == "interrupted by SIGINT"


def test_images_and_labels_of_the_wrong_kind_are_refused_by_hand():
    # make mutate's classification group: an `and` for an `or` in either check went unseen there.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype="float32")
    size = model.transform.size
    for shape in ((3, size, size), (2, size, size, 3), (2, 1, size, size)):  # one image; channels last; grey
        with pytest.raises(ValueError, match=rf"images of shape \({', '.join(map(str, shape))}\): expected N x 3"):
            model.logits(torch.zeros(shape, dtype=torch.uint8))
    logits = torch.eye(4)
    assert [int(hits) for hits in model.classification(logits, torch.arange(4))] == [4, 4]
    for labels in (torch.arange(4).float(), torch.arange(4).to(torch.complex64), torch.ones(4, dtype=torch.bool)):
        with pytest.raises(ValueError, match=rf"labels of type {labels.dtype}: expected whole numbers"):
            model.classification(logits, labels)
