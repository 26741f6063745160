"""Hostile input, round fifteen (2026-12-07): what the notebook's result and policy take, and what the
sweeps of this round found. Real files, real subprocesses of the command line, real SPDL, torch and timm."""

from __future__ import annotations

import pytest

import imagenet_classification as ic


def test_failures_that_are_no_decode_errors_are_type_errors_naming_them():
    with pytest.raises(TypeError, match=r"failures\[0\]='x': expected an ImageDecodeError"):
        ic.BadImagePolicy().check(["x"])
    with pytest.raises(TypeError, match=r"failures\[1\]=3: expected an ImageDecodeError"):
        ic.RunResult(listed=3).record_failures([ic.ImageDecodeError("a.jpg", "cut short"), 3])
    result = ic.RunResult(listed=3)
    result.record_failures([ic.ImageDecodeError("a.jpg", "cut short")])  # the right kind still passes
    assert (result.failed, result.failures) == (1, [{"path": "a.jpg", "reason": "cut short"}])
    with pytest.raises(ic.RunStopped, match="cannot decode a.jpg: cut short"):
        ic.BadImagePolicy().check([ic.ImageDecodeError("a.jpg", "cut short")])
