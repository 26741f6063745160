"""The accounting invariant under SPDL's real failure modes, and a fuzz test of the decoder."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spdl.pipeline import PipelineBuilder

from imagenet_classification import (
    BadImagePolicy,
    RunStopped,
    benchmark,
    get_decode_func,
    get_model,
    get_pipeline,
    read_file_list,
    read_labels,
    scan_folder,
    source,
)
from tests.conftest import TINY, read_json, run_cli, run_main

FAST = [*TINY, "--no-compile", "--batch-size", "4"]


@pytest.fixture(scope="module")
def tiny_model():
    return get_model("test_efficientnet", "cpu", pretrained=False, compile=False, use_bf16=False)


def _failing_on_image_5(decode):
    """A decode function whose whole batch raises when it holds image 5, as a failing disk would."""

    def flaky_decode(items):
        if any("00000005" in path for path, _ in items):
            raise OSError("simulated read error")
        return decode(items)

    return flaky_decode


def test_silently_dropped_batch_is_caught(jpeg_set, tiny_model):
    # A pipeline built the naive way (SPDL's default failure policy) drops a batch whose stage
    # raises and goes on. The loop must not report that run as complete.
    items = source(jpeg_set, f"{jpeg_set.parent}/")
    flaky_decode = _failing_on_image_5(get_decode_func("cpu", tiny_model.transform))
    naive = PipelineBuilder().add_source(items).aggregate(4).pipe(flaky_decode).add_sink(4).build(num_threads=1)
    with naive.auto_stop(), pytest.raises(RunStopped, match="before delivering every listed image") as info:
        benchmark(naive.get_iterator(timeout=30), tiny_model, listed=30, warmup_batches=0)
    result = info.value.result
    assert (result.classified, result.not_reached, result.partial) == (26, 4, True)


def test_get_pipeline_stops_instead_of_dropping(jpeg_set, tiny_model):
    flaky_decode = _failing_on_image_5(get_decode_func("cpu", tiny_model.transform))
    pipeline = get_pipeline(source(jpeg_set, f"{jpeg_set.parent}/"), 4, flaky_decode, 2, 4, 2)
    with pipeline.auto_stop(), pytest.raises(Exception) as info:
        benchmark(pipeline.get_iterator(timeout=30), tiny_model, listed=30, warmup_batches=0)
    assert info.value.result.partial is True and info.value.result.classified < 30


def _real_jpeg(jpeg_set: Path) -> bytes:
    return (jpeg_set.parent / jpeg_set.read_text().splitlines()[0]).read_bytes()


@settings(max_examples=60, deadline=10_000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_decoder_never_crashes_and_accounts(jpeg_set, tmp_path, data):
    jpeg = _real_jpeg(jpeg_set)
    kind = data.draw(st.sampled_from(["random", "truncated", "bitflips"]))
    if kind == "random":
        blob = data.draw(st.binary(min_size=0, max_size=4096))
    elif kind == "truncated":
        blob = jpeg[: data.draw(st.integers(0, len(jpeg) - 3))]
    else:
        rng = random.Random(data.draw(st.integers(0, 2**32)))
        blob = bytearray(jpeg)
        for _ in range(data.draw(st.integers(1, 20))):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        blob = bytes(blob)
    path = tmp_path / "n01440764_fuzz.JPEG"
    path.write_bytes(blob)
    policy = BadImagePolicy(skip=True)
    batch = get_decode_func("cpu", policy=policy)([(str(path), 0)] * 2)
    images, labels = batch
    assert images.shape[0] == labels.shape[0] and images.shape[0] + len(batch.failures) == 2
    assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.uint8
    if kind == "truncated":
        assert len(batch.failures) == 2  # a cut JPEG is always reported, never half-classified


def test_fuzzed_set_through_the_cli(jpeg_set, tmp_path, capfd):
    jpeg = _real_jpeg(jpeg_set)
    rng = random.Random(7)
    root = tmp_path / "fuzz"
    (root / "val" / "n01440764").mkdir(parents=True)
    lines = []
    for i in range(24):
        blob = bytearray(jpeg)
        if i % 3 == 0:
            blob = blob[: rng.randrange(len(blob))]
        elif i % 3 == 1:
            for _ in range(rng.randint(1, 30)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        else:
            blob = bytearray(rng.randbytes(rng.randrange(1, 3000)))
        rel = f"val/n01440764/{i}.JPEG"
        (root / rel).write_bytes(bytes(blob))
        lines.append(rel)
    flist = root / "val.flist"
    flist.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"  # in this process: what the run reports is checked, not the process
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{root}/", *FAST, "--skip-bad", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert result["listed"] == 24 and result["not_reached"] == 0
    assert result["classified"] + result["failed"] == 24 and result["failed"] >= 16


@pytest.mark.parametrize(
    "policy_args, flags, stopped_by",
    [({}, [], "bad_image"), ({"skip": True}, ["--skip-bad"], None),
     ({"skip": True, "max_bad": 0}, ["--skip-bad", "--max-bad", "0"], "too_many_bad")],
    ids=["strict", "skip", "max-bad"],
)  # fmt: skip
def test_one_bad_image_policy_in_a_notebook_and_on_the_command_line(jpeg_set, tmp_path, tiny_model, policy_args,
                                                                    flags, stopped_by):  # fmt: skip
    # 12 images, the 6th unreadable; batches of 4 in one decode thread: the second batch holds it.
    flist = tmp_path / "l.flist"
    lines = [f"{jpeg_set.parent}/{line}" for line in jpeg_set.read_text().splitlines()[:12]]
    lines[5] = str(tmp_path / "val" / "n01440764" / "unreadable.JPEG")
    flist.write_text("\n".join(lines) + "\n")
    images = read_file_list(flist)
    policy = BadImagePolicy(**policy_args)
    pipeline = get_pipeline(images, 4, get_decode_func("cpu", tiny_model.transform, policy=policy), 1, 4, 1)
    error = None
    with pipeline.auto_stop():
        try:
            result = benchmark(pipeline.get_iterator(timeout=60), tiny_model, listed=12, policy=policy,
                               warmup_batches=0)  # fmt: skip
        except RunStopped as e:
            result, error = e.result, e
    out = tmp_path / "r.json"
    proc = run_cli("--input-flist", flist, *FAST, "--num-threads", "1", "--no-bf16", *flags, "--results-file", out)
    cli = read_json(out)
    assert error.kind == stopped_by if stopped_by else error is None
    assert proc.returncode == (1 if stopped_by else 0), proc.stderr
    expected = (4, 1, 7) if stopped_by else (11, 1, 0)
    assert (result.classified, result.failed, result.not_reached) == expected
    assert (cli["classified"], cli["failed"], cli["not_reached"]) == expected
    assert result.failures == cli["failures"] and cli["failures"][0]["path"] == lines[5]
    if stopped_by == "bad_image":
        assert f"error: {error} (--skip-bad skips such images)" in proc.stderr


def test_a_percentage_of_bad_images_needs_the_number_listed(jpeg_set, tmp_path, tiny_model):
    # 3 of 5 images unreadable, a limit of 10 %: with listed, the run stops; without, 10 % of an
    # unknown total limited nothing and the run finished.
    images = [(str(tmp_path / "missing.JPEG"), 0)] * 3 + list(read_file_list(jpeg_set, f"{jpeg_set.parent}/"))[:2]
    batch = get_decode_func("cpu", tiny_model.transform, policy=BadImagePolicy(skip=True))(images)
    policy = BadImagePolicy(skip=True, max_bad_percent=10)
    with pytest.raises(RunStopped, match="3 images failed to decode, more than --max-bad allows"):
        benchmark([batch], tiny_model, listed=5, policy=policy, warmup_batches=0)
    with pytest.raises(ValueError, match=r"max_bad_percent=...\) is a share of the images listed: pass listed="):
        benchmark([batch], tiny_model, policy=policy, warmup_batches=0)
    assert benchmark([batch], tiny_model, policy=BadImagePolicy(skip=True, max_bad=3), warmup_batches=0).failed == 3


def test_a_dataloader_worker_death_raised_anywhere_in_the_loop_stops_the_run(jpeg_set, tiny_model):
    # torch's SIGCHLD handler raises a dead worker's RuntimeError wherever the main thread is: here
    # in the progress callback, between the loader and the model. It stops the run as the loader's
    # failure, with the batches done so far, not as an unexpected RuntimeError.
    batch = get_decode_func("cpu", tiny_model.transform)(list(read_file_list(jpeg_set, f"{jpeg_set.parent}/"))[:4])

    def progress(classified, top1):
        if classified > 4:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")

    with pytest.raises(RunStopped, match=r"^the DataLoader failed: DataLoader worker \(pid 4242\) is killed") as info:
        benchmark([batch, batch, batch], tiny_model, listed=12, warmup_batches=0, progress=progress)
    result = info.value.result
    assert (info.value.kind, result.classified, result.partial) == ("loader", 8, True)

    def other_failure(classified, top1):
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="^something else$"):  # any other RuntimeError is not the loader's
        benchmark([batch], tiny_model, warmup_batches=0, progress=other_failure)


def test_a_rank_outside_the_job_is_refused_not_sliced(jpeg_set):
    prefix = f"{jpeg_set.parent}/"
    images = read_file_list(jpeg_set, prefix)
    for rank, world_size in [(-1, 2), (5, 2), (2, 2), (0, 0), (0, -1)]:
        with pytest.raises(ValueError, match=rf"rank={rank} of world_size={world_size}: expected a rank from 0 to"):
            images.shard(rank, world_size)
        with pytest.raises(ValueError, match=rf"rank={rank} of world_size={world_size}"):
            list(source(jpeg_set, prefix, rank=rank, world_size=world_size))
    shards = [list(source(jpeg_set, prefix, rank=r, world_size=3)) for r in range(3)]
    assert sorted(sum(shards, [])) == sorted(images) and [len(s) for s in shards] == [10, 10, 10]


def test_a_number_is_not_taken_for_a_path_nor_its_descriptor_closed(tmp_path):
    # open(3) reads descriptor 3 and closes it: read_file_list(1) closed the caller's stdout.
    read_end, write_end = os.pipe()
    os.write(write_end, b"a/n01440764/x.JPEG\n")
    os.close(write_end)
    try:
        for read in (read_file_list, read_labels, scan_folder):
            with pytest.raises(TypeError, match=rf"expected a (folder's )?path.*, got {read_end}"):
                read(read_end)
            os.fstat(read_end)  # still open
    finally:
        os.close(read_end)


def test_a_batch_size_below_one_is_refused_not_an_empty_run(jpeg_set, tiny_model):
    images = read_file_list(jpeg_set, f"{jpeg_set.parent}/")
    decode = get_decode_func("cpu", tiny_model.transform)
    for size in (0, -1):
        with pytest.raises(ValueError, match=rf"batch_size={size}: expected at least 1"):
            get_pipeline(images, size, decode, 1, 1, 1)
