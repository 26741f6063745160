"""Hostile input, rounds two and three: every argument, every file read or written, every phase of a run.

Each test is a case from the hostile sweeps: a traceback, a lost result or a wrong image that
the command line must turn into a one-line error, a counted failure, or the right image.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_cli, run_main

FAST = [*TINY, "--no-compile", "--batch-size", "4"]
DATA = Path(__file__).parent / "data"


@pytest.fixture
def dataset(tmp_path) -> Path:
    return make_jpeg_set(tmp_path / "data", 12)


def _run(flist: Path, *args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return run_cli("--input-flist", flist, "--prefix", f"{flist.parent}/", *FAST, *args, timeout=timeout, **kwargs)


def _one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if re.match(r"(imagenet_classification\.py: )?error:", line)]
    assert len(errors) == 1 and words in errors[0], proc.stderr


def _accounted(result: dict) -> bool:
    return result["classified"] + result["failed"] + result["not_reached"] == result["listed"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "imagenet_classification.py"), *map(str, args)]


# --- A signal at any moment ----------------------------------------------------------------------


def test_a_signal_during_the_breakdown_keeps_the_finished_run(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 40) + "\n")  # 480 images: the loader-alone pass takes a while
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--warmup-batches", "1",
               "--breakdown", "--results-file", out)  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while "Breakdown: timing the loader alone" not in proc.stderr.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "Images: listed=480 classified=480 failed=0 not_reached=0" in stdout
    assert "Breakdown cut short (interrupted by SIGTERM)" in stdout and "(PARTIAL RUN)" not in stdout
    result = read_json(out)
    assert result["classified"] == 480 and result["partial"] is False
    assert result["breakdown_cut"] == "interrupted by SIGTERM" and "breakdown" not in result
    assert result["stop_reason"] is None  # the run was whole: the reason is the breakdown's (breakdown_cut)


def test_a_signal_while_the_libraries_load_is_one_line(dataset):
    proc = subprocess.Popen(_cli("--input-flist", dataset, *FAST), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    time.sleep(1.0)  # importing torch and SPDL takes seconds; before 0.1 s (or 0.3 on a loaded machine) Python starts
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.strip().splitlines()[-1].startswith("error: interrupted by SIGINT") and "Traceback" not in stderr


# --- Files written ---------------------------------------------------------------------------------


def test_a_results_folder_removed_during_the_run_is_one_line_after_the_summary(dataset, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 20) + "\n")
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", folder / "r.json")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    folder.rmdir()
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Images: listed=240 classified=240" in stdout
    _one_line_error(subprocess.CompletedProcess(cmd, 1, stdout, stderr), "cannot write the results there")
    assert "No such file or directory" in stderr and "leaked" not in stderr


def test_a_failed_write_leaves_the_old_results_whole(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text('{"old": true}\n')
    report = ic._RunReport(ic.RunResult(listed=1, classified=1), {}, {}, [])

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ic._write_results(path, report)
    assert path.read_text() == '{"old": true}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    monkeypatch.undo()
    ic._write_results(path, report)
    assert json.loads(path.read_text())["classified"] == 1


def test_a_results_file_gets_the_mode_open_would_give_and_one_written_over_keeps_its_own(tmp_path):
    report = ic._RunReport(ic.RunResult(listed=1, classified=1), {}, {}, [])
    previous = os.umask(0o027)
    try:
        ic._write_results(tmp_path / "new.json", report)
        kept = tmp_path / "kept.json"
        kept.write_text("{}")
        kept.chmod(0o604)
        ic._write_results(kept, report)
    finally:
        os.umask(previous)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640  # 0o666 less the umask
    assert kept.stat().st_mode & 0o777 == 0o604 and json.loads(kept.read_text())["classified"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "new.json"]  # no temporary file left


@pytest.mark.parametrize(
    "flag, target, words",
    [
        ("--results-file", "/dev/full", "not a regular file"),
        ("--results-file", "list", "is one of the run's inputs or outputs"),
        ("--results-file", "image", "is one of the run's inputs or outputs"),
        ("--predictions-file", "list", "is one of the run's inputs or outputs"),
        ("--results-file", "dangling", "does not exist"),
        ("--results-file", "fifo", "not a regular file"),
        ("--results-file", "long", "File name too long"),
        ("--trace", "", "not a file name"),
        ("--results-file", "slash", "a trailing / names a folder"),  # Path would drop it: r.json written
        ("--plot", "slash", "a trailing / names a folder"),
        ("--trace", "pftrace-folder", "not a regular file"),
        ("--predictions-file", "p.txt", "must end in .csv or .jsonl"),
        ("--checkpoint", "long", "File name too long"),
        ("--input-flist", "long", "File name too long"),
    ],
)
def test_files_the_run_writes_or_reads_are_checked_first(dataset, tmp_path, flag, target, words):
    first_image = dataset.parent / dataset.read_text().splitlines()[0]
    targets = {"list": dataset, "image": first_image, "long": tmp_path / ("x" * 300), "": Path("")}
    targets["slash"] = f"{tmp_path}/r.json/"
    if target == "dangling":
        (tmp_path / "link.json").symlink_to(tmp_path / "no-such-folder" / "r.json")
        targets[target] = tmp_path / "link.json"
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo.json")
        targets[target] = tmp_path / "fifo.json"
    if target == "pftrace-folder":
        (tmp_path / "t.pftrace").mkdir()
        targets[target] = tmp_path / "t"
    path = targets.get(target, tmp_path / target if "/" not in target else Path(target))
    args = ["--input-flist", path, *FAST] if flag == "--input-flist" else [flag, path]
    proc = run_cli(*args) if flag == "--input-flist" else _run(dataset, *args)
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, words)
    assert first_image.read_bytes()[:2] == b"\xff\xd8" and dataset.read_text().startswith("val/")  # untouched


def test_a_broken_stdout_keeps_the_results_file(dataset, tmp_path):
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", out)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ,
                            "PYTHONUNBUFFERED": "1"})  # fmt: skip
    proc.stdout.close()  # the reader left, as `| head -0` does
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in stderr and read_json(out)["classified"] == 12
    out.unlink()
    with open("/dev/full", "w") as full_disk:  # and a full disk behind stdout
        full = subprocess.run(cmd, stdout=full_disk, stderr=subprocess.PIPE, text=True, timeout=300)
    assert full.returncode == 1 and "Traceback" not in full.stderr and read_json(out)["classified"] == 12
    assert "error: the summary could not be written to stdout (No space left on device)" in full.stderr


# --- Arguments and the environment ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--skip-bad", "--max-bad", "nan%"], "argument --max-bad"),
        (["--skip-bad", "--max-bad", "101%"], "got '101%'"),  # as typed, not the number without its %
        (["--timeout", "nan"], "argument --timeout"),
        (["--timeout", "1e10"], "expected at most 1e6 seconds"),
        # Counts past what a C int holds (itertools.islice, SPDL, torch) are refused, not a traceback.
        (["--batch-size", "10000000000000000000000"], "argument -b/--batch-size: expected a whole number from 1"),
        (["--max-samples", "2147483648"], "argument --max-samples/--num-samples: expected a whole number from 1"),
        (["--warmup-batches", "99999999999999999999"], "argument --warmup-batches: expected a whole number from 0"),
        (["--max-image-mb", "4097"], "argument --max-image-mb: expected a whole number of MiB from 1 to 4096"),
        (["--sweep", "decode-processes=0,10000000000000000000000"], "at least 0 and at most 2147483647"),
        # Normalisation on the 0-255 scale, or a std that overflows, would classify noise.
        (["--mean", "123.7", "116.3", "103.5"], "argument --mean: expected a number from 0 to 1 on the 0-1 scale"),
        (["--std", "0", "0.2", "0.2"], "argument --std: expected a number from 0.001 to 1"),
        (["--crop-pct", "0.01"], "error: --crop-pct: 160 / 0.01 resizes each image's shorter side to 16000 pixels"),
        (["--trace", "t", "--breakdown"], "--trace profiles the run"),
        (["--model", "mobilenetv3_large_100.miil_in21k"], "11221 output classes, not ImageNet-1k's 1000"),
        (["--model", "vit_base_patch16_sapiens2.fb"], "its input is 768 x 1024, not square"),
        (["--model", "local-dir:TMP/no-config"], "cannot read its config"),
        # timm.is_model looks past a tag; timm's config raises a RuntimeError for one it has not.
        (["--model", "resnet50.in1k"], "resnet50.in1k: timm has no such pretrained tag of resnet50 (its tags: "),
    ],
)
def test_argument_values_that_cannot_work_stop_at_the_start(dataset, tmp_path, args, words):
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    proc = _run(dataset, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, words)


def test_labels_from_an_empty_stdin_name_it(dataset):
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--labels", "-")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, input="")
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, "<stdin>: no labels in it")


def test_a_decoder_check_with_nothing_to_compare_says_so(dataset, capfd):
    proc = run_main(capfd, "--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--check-decoder", "3")
    assert proc.returncode == 0, proc.stderr
    assert "--check-decoder: nothing to compare: FFmpeg on the CPU is the reference itself" in proc.stderr
    assert "Decoder check:" not in proc.stderr


@pytest.mark.parametrize(
    "env, words",
    [
        ({"WORLD_SIZE": "abc"}, "must be whole numbers"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "without MASTER_ADDR and MASTER_PORT"),
        ({"RANK": "-1"}, "RANK=-1 WORLD_SIZE=1 LOCAL_RANK=0: no such rank"),
        ({"TORCHINDUCTOR_CACHE_DIR": "/dev/null/cache"}, "torch cannot write its cache in /dev/null/cache"),
    ],
)
def test_an_environment_that_cannot_work_stops_at_the_start(dataset, env, words):
    extra = [] if "TORCHINDUCTOR_CACHE_DIR" not in env else ["--model", "test_efficientnet"]
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *TINY, *extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, words)


def test_out_of_memory_on_the_cpu_keeps_the_partial_result(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 20) + "\n")  # 240 images in one batch

    def small_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (5_000_000_000, 5_000_000_000))

    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", "--model", "resnet50", "--no-pretrained",
               "--device", "cpu", "--no-compile", "--dtype", "float32", "--batch-size", "240", "--num-threads", "2",
               "--results-file", out)  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=small_address_space)
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc, "out of memory on cpu with a batch of 240 images; try --batch-size 120")
    result = read_json(out)
    assert result["partial"] is True and result["not_reached"] == 240 and _accounted(result)


def test_checkpoints_that_are_not_state_dicts_are_one_line(dataset, tmp_path, capfd):
    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    cases = {"text": None, "empty": None, "float-value": {"conv_stem.weight": 1.5}, "code": {"x": Runs()},
             "sparse": {"w": torch.eye(3).to_sparse()}}  # fmt: skip
    (tmp_path / "text.pth").write_text("not a checkpoint\n")
    (tmp_path / "empty.pth").write_bytes(b"")
    for name, state in cases.items():
        if state is not None:
            torch.save(state, tmp_path / f"{name}.pth")
        # In this process (the run's messages, not the interpreter's, are checked): a pickle that
        # ran its code would have touched the file here as well.
        proc = run_main(capfd, "--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--checkpoint",
                        tmp_path / f"{name}.pth")  # fmt: skip
        assert proc.returncode == 2, (name, proc.stderr)
        _one_line_error(proc, "cannot load checkpoint")
        assert "weights_only=False" not in proc.stderr and "\x1b[" not in proc.stderr
    assert not (tmp_path / "ran").exists()


# --- Images --------------------------------------------------------------------------------------


def _photo(demo_photos: Path) -> Image.Image:
    return Image.open(demo_photos.parent / demo_photos.read_text().split()[0]).convert("RGB")


def _pil_mad(path: Path, decoded: torch.Tensor, transform: ic.EvalTransform, reference: np.ndarray | None = None):
    if reference is None:
        image = Image.open(path).convert("RGB")
        w, h, left, top = transform.geometry(*image.size)
        image = image.resize((w, h), Image.Resampling.BICUBIC).crop((left, top, left + 224, top + 224))
        reference = np.asarray(image)
    return np.abs(decoded.permute(1, 2, 0).numpy().astype(np.int16) - reference.astype(np.int16)).mean()


def test_rare_containers_decode_to_the_image(demo_photos, tmp_path):
    photo, transform = _photo(demo_photos), ic.EvalTransform()
    # An animated PNG whose default image is not part of the animation: PIL gives the default one.
    apng = tmp_path / "apng.JPEG"
    frames = [Image.new("RGB", photo.size, colour) for colour in ((20, 200, 20), (0, 0, 255))]
    photo.save(apng, format="PNG", save_all=True, default_image=True, append_images=frames)
    # 16-bit greyscale: PIL's own RGB conversion clips it to white.
    grey16 = (np.asarray(photo.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    tiff16 = tmp_path / "grey16.JPEG"
    Image.fromarray(grey16).save(tiff16, format="TIFF")
    arithmetic = DATA / "arithmetic-coded.jpg"  # cjpeg -arithmetic: FFmpeg lacks arithmetic decoding
    decode = ic.get_decode_func("cpu", transform)
    images, _ = decode([(str(apng), 0), (str(tiff16), 1), (str(arithmetic), 2)])
    assert _pil_mad(apng, images[0], transform) < 1.0
    grey = Image.fromarray((grey16 >> 8).astype(np.uint8)).convert("RGB")
    w, h, left, top = transform.geometry(*grey.size)
    expected = np.asarray(grey.resize((w, h), Image.Resampling.BICUBIC).crop((left, top, left + 224, top + 224)))
    assert _pil_mad(tiff16, images[1], transform, expected) < 1.0 and images[1].float().mean() < 200
    assert _pil_mad(arithmetic, images[2], transform) < 1.5


def test_damaged_jpegs_and_bombs_are_counted_failures(demo_photos, tmp_path):
    data = (demo_photos.parent / demo_photos.read_text().split()[0]).read_bytes()
    sos = data.index(b"\xff\xda")
    rng = np.random.default_rng(0)
    flipped = bytearray(data)
    for i in rng.integers(sos + 200, len(data) - 200, 40):
        flipped[i] ^= 0x5A
    cut = data[: sos + (len(data) - sos) // 2] + b"\xff\xd9"  # a cut scan with an end marker put back
    bomb = io.BytesIO()
    Image.new("L", (16000, 16000)).save(bomb, format="PNG")  # small file, 256 Mpx
    strip = io.BytesIO()
    Image.new("RGB", (30000, 2)).save(strip, format="JPEG")  # would resize to 3840000 x 256
    files = {"flipped": bytes(flipped), "cut": cut, "bomb": bomb.getvalue(), "strip": strip.getvalue()}
    items = []
    for name, blob in files.items():
        (tmp_path / f"{name}.JPEG").write_bytes(blob)
        items.append((str(tmp_path / f"{name}.JPEG"), 0))
    policy = ic.BadImagePolicy(skip=True)
    batch = ic.get_decode_func("cpu", policy=policy)(items)
    images, _ = batch
    reasons = {Path(f.path).stem: f.reason for f in batch.failures}
    assert images.shape[0] == 0 and set(reasons) == set(files), reasons
    assert "over the limit of 178,956,970" in reasons["bomb"] and "would be resized to" in reasons["strip"]
    for path, _ in items[2:]:  # the DataLoader baseline's decoder refuses these too (PIL decodes the damaged two)
        with pytest.raises(ic.ImageDecodeError):
            ic._decode_pil(path, ic.EvalTransform())


@pytest.mark.parametrize("error", [ConnectionResetError(104, "Connection reset by peer"), EOFError()])
def test_a_worker_dying_while_its_batch_is_handed_over_is_a_loader_failure(error):
    # When a worker dies as the main process fetches its batch's shared memory, the DataLoader
    # raises what the broken connection raised, not its "DataLoader worker ... killed" message.
    def batches():
        raise error
        yield

    with pytest.raises(
        ic.RunStopped, match=f"the DataLoader failed: a worker's connection broke \\({type(error).__name__}"
    ) as info:
        next(ic._torch_loader_batches(batches(), torch.device("cpu")))
    assert info.value.kind == "loader"


def test_a_dead_dataloader_worker_stops_the_run_with_its_result(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 100) + "\n")
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--loader", "torch",
               "--num-threads", "2", "--results-file", out)  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    time.sleep(3)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "no DataLoader worker"
    os.kill(int(children[0]), signal.SIGKILL)  # as the out-of-memory killer would
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    _one_line_error(subprocess.CompletedProcess(cmd, 1, stdout, stderr), "the DataLoader failed")
    result = read_json(out)
    assert result["partial"] is True and _accounted(result)


# --- Any argument value ------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-3, 40).map(str),
    st.sampled_from(["0", "-0", "1e309", "nan", "inf", "-inf", "2.5", "1e-9", "10000000000000000000000", "", " ", "x"]),
)
TEXTS = st.one_of(
    st.sampled_from(["", " ", "-", "/", ".", "/dev/null", "/dev/zero", "\n", "é", "a" * 300, "cpu", "cuda:-1", "meta"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)
FLAGS = {
    "--batch-size": NUMBERS, "--num-threads": st.integers(1, 3).map(str) | NUMBERS, "--queue-size": NUMBERS,
    "--warmup-batches": NUMBERS, "--max-samples": NUMBERS, "--max-image-mb": NUMBERS, "--check-decoder": NUMBERS,
    "--parity": st.sampled_from(["0", "2", "-1", "x"]), "--stats-interval": NUMBERS,
    "--timeout": st.sampled_from(["30", "1e6", "1e7", "0", "-1", "nan", "inf", "x", ""]),
    "--device": TEXTS, "--dtype": TEXTS | st.sampled_from(["float32", "bfloat16"]), "--prefix": TEXTS,
    "--model": TEXTS | st.just("test_efficientnet"), "--max-bad": NUMBERS | NUMBERS.map(lambda v: v + "%"),
    "--results-file": TEXTS | st.just("r.csv"), "--predictions-file": TEXTS | st.just("p.csv"), "--trace": TEXTS,
    "--img-size": NUMBERS | st.sampled_from(["64", "4097"]), "--crop-pct": NUMBERS | st.sampled_from(["0.9", "1"]),
    "--interpolation": TEXTS | st.just("bilinear"), "-j": st.integers(1, 3).map(str) | NUMBERS,
}  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(sorted(FLAGS)), st.just(None), min_size=1, max_size=3).flatmap(
    lambda chosen: st.fixed_dictionaries({flag: FLAGS[flag] for flag in chosen})))  # fmt: skip
def test_any_argument_values_end_in_a_result_or_one_line(jpeg_set, tmp_path_factory, capfd, chosen):
    # Each run ends with exit 0 or 2 (3 only for a time-out too short for any batch), an error of
    # one line, and no traceback, whatever the values.
    workdir = tmp_path_factory.mktemp("any")
    argv = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
            "--batch-size", "4", "--max-samples", "6", "--warmup-batches", "0", "--skip-bad"]  # fmt: skip
    for flag, value in chosen.items():
        argv += [flag, value]
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        status = ic.main(argv)
    except SystemExit as e:  # argparse
        status = e.code
    finally:
        os.chdir(cwd)
    out, err = capfd.readouterr()
    assert status in (0, 2), (argv, status, err[-2000:])
    assert "Traceback" not in err, (argv, err[-3000:])
    assert len([line for line in err.splitlines() if "error:" in line]) == (status != 0), (argv, err[-2000:])


def test_a_signal_stops_the_dataloader_baseline_quickly(dataset):
    # The DataLoader's busy workers are not joined (which takes seconds): the process ends after the report.
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 500) + "\n")
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--loader", "torch",
               "--num-threads", "8")  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    time.sleep(3)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - sent < 2.0, stderr
    assert "(PARTIAL RUN)" in stdout and "Traceback" not in stderr


def test_a_dataloader_worker_drops_only_a_broken_hand_over(monkeypatch):
    # In a worker, multiprocessing's resource sharer sends a hand-over the stopped main process broke
    # to sys.excepthook: that one is dropped, and every other error still reaches the default hook.
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(kind))
    ic._quiet_worker(0)
    for kind in (ConnectionResetError, BrokenPipeError, ValueError, MemoryError):
        sys.excepthook(kind, kind(), None)
    assert seen == [ValueError, MemoryError]


# --- Round three: what the user asked for is written, whatever the run met --------------------------


def _main(argv: list, capfd) -> tuple[int, str, str]:
    """``main(argv)`` in this process: the exit status (argparse's too), stdout, stderr."""
    try:
        status = ic.main([str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    out, err = capfd.readouterr()
    return status, out, err


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if re.match(r"(\S+: )?error:", line)]  # argparse's too


def test_a_plot_that_fails_late_costs_neither_the_summary_nor_the_other_files(dataset, tmp_path, capfd, monkeypatch):
    out, rows, plot = tmp_path / "r.json", tmp_path / "p.csv", tmp_path / "t.png"
    args = ["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", out,
            "--predictions-file", rows, "--plot", plot]  # fmt: skip
    ic._init_logging()  # onto this test's stderr (an earlier in-process main() left it on its own)
    config = ic._preflight(ic._parse_args([str(a) for a in args]), ic._Shard())
    plot.mkdir()  # the plot's name taken by a folder after the start-up check
    report = ic._run(config)
    assert ic._finish(report, config) == 1
    stdout, stderr = capfd.readouterr()
    assert "Images: listed=12 classified=12" in stdout
    (line,) = _errors(stderr)  # (whether matplotlib could draw it, or not)
    assert line.startswith(f"error: {plot}: ") and "Traceback" not in stderr
    assert read_json(out)["classified"] == 12 and len(rows.read_text().splitlines()) == 13
    # matplotlib failing on what it is given (not an OSError) is one line too, and costs no other file
    plot.rmdir()
    out.unlink()

    def cannot_draw(timeline: dict, path: Path, *title: str) -> bool:
        raise ValueError("x and y must have same first dimension, but have shapes (4,) and (5,)")

    monkeypatch.setattr(ic, "_plot_timeline", cannot_draw)
    assert ic._finish(report, config) == 1
    stdout, stderr = capfd.readouterr()
    assert "Images: listed=12 classified=12" in stdout and "Traceback" not in stderr
    assert _errors(stderr) == [f"error: {plot}: not written (ValueError: x and y must have same first dimension, "
                               "but have shapes (4,) and (5,); --debug shows where)"]  # fmt: skip
    assert read_json(out)["classified"] == 12 and not plot.exists()


def test_names_that_are_not_utf8_are_written_as_their_bytes(tmp_path, capfd):
    root = tmp_path / "data"
    make_jpeg_set(root, 4)
    folder = root / "val" / "n01440764"
    good = os.fsencode(folder) + b"/caf\xe9-\xff.JPEG"  # Latin-1 bytes: not UTF-8
    bad = os.fsencode(folder) + b"/bad-\xfe.JPEG"
    os.rename(next(folder.iterdir()), good)
    Path(os.fsdecode(bad)).write_bytes(b"not a JPEG" * 30)
    rows, out = tmp_path / "p.csv", tmp_path / "r.json"
    base = ["--data-dir", root / "val", *FAST, "--skip-bad", "--results-file", out]
    status, stdout, stderr = _main([*base, "--predictions-file", rows], capfd)
    assert status == 0, stderr
    assert "failed: " in stdout and "bad-\\udcfe.JPEG" in stdout  # escaped on screen, the summary whole
    assert any(line.startswith(good + b",") for line in rows.read_bytes().splitlines())  # CSV: the name's own bytes
    result = read_json(out)  # JSON: Python's surrogate escapes, which os.fsencode turns back into the bytes
    assert [os.fsencode(f["path"]) for f in result["failures"]] == [bad]
    jsonl = tmp_path / "p.jsonl"
    status, _, stderr = _main([*base, "--predictions-file", jsonl], capfd)
    assert status == 0, stderr
    assert good in [os.fsencode(json.loads(line)["path"]) for line in jsonl.read_text().splitlines()]


def test_a_stopped_run_keeps_its_trace_and_predictions(dataset, tmp_path, capfd):
    lines = dataset.read_text().splitlines()
    (dataset.parent / "broken.JPEG").write_bytes(b"\xff\xd8 not the rest of a JPEG")
    dataset.write_text("\n".join([*lines[:9], "val/n01440764/../../broken.JPEG", *lines[9:]]) + "\n")
    trace, rows = tmp_path / "t", tmp_path / "p.jsonl"
    status, stdout, stderr = _main(["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--num-threads",
                                    "1", "--trace", trace, "--predictions-file", rows], capfd)  # fmt: skip
    assert status == 1 and "(PARTIAL RUN)" in stdout, stderr
    assert json.loads(Path(f"{trace}.json").read_text())["traceEvents"] and Path(f"{trace}.pftrace").stat().st_size
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(kept) == int(re.search(r"classified=(\d+)", stdout).group(1)) == 8  # the two batches before it


def test_a_trace_whose_path_kineto_would_rewrite_is_written_where_asked(dataset, tmp_path, capfd):
    # Kineto turns a backslash into a folder and drops a control character: its file went elsewhere,
    # and the run reported a full disk with exit 1 (found by the argument property test: --trace '\x1f').
    folder = tmp_path / "a\\b\x1f"
    folder.mkdir()
    trace = folder / "t\x1f"
    status, _, stderr = _main(["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--trace", trace],
                              capfd)  # fmt: skip
    assert status == 0, stderr
    assert json.loads(Path(f"{trace}.json").read_text())["traceEvents"] and Path(f"{trace}.pftrace").stat().st_size
    assert sorted(p.name for p in folder.iterdir()) == ["t\x1f.json", "t\x1f.pftrace"]


def test_a_signal_during_the_sweep_keeps_the_settings_measured(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 9) + "\n")
    out = tmp_path / "s.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--sweep", "num-threads=1,2",
               "batch-size=2,4,8", "--results-file", out)  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    measured = 0
    while measured < 2:
        line = proc.stderr.readline()
        assert line or proc.poll() is None
        measured += "the loader alone" in line
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "error: interrupted by SIGTERM; the settings measured before it are below (PARTIAL SWEEP)" in stderr
    sweep = read_json(out)["sweep"]
    assert sweep["partial"] is True and sweep["stop_reason"] == "interrupted by SIGTERM"
    assert sweep["recommended"] is None and "No setting to recommend: the sweep stopped" in stdout
    assert [(p["num_threads"], p["batch_size"]) for p in sweep["points"]][:2] == [(1, 2), (1, 4)]
    assert "threads  batch  queue" in stdout and re.search(r"\n +1 +4 +16 ", stdout)


# --- Round three: every rank sees the same job -----------------------------------------------------


def _ranks(flists: list[Path], out: Path, *extra: str, timeout: str = "20", world_size: int = 0,
           per_rank: tuple = ()) -> list:  # fmt: skip
    """Ranks started by hand (as torchrun would), rank r reading ``flists[r]`` with the flags
    ``per_rank[r]`` too, of a job of ``world_size`` (default: as many as lists); their completed
    processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, flist in enumerate(flists):
        env = {**os.environ, "WORLD_SIZE": str(world_size or len(flists)), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        cmd = _cli("--input-flist", flist, "--prefix", f"{flist.parent}/", *FAST, "--num-threads", "1", "--timeout",
                   timeout, "--results-file", f"{out}.{rank}", *extra, *(per_rank or [()] * 9)[rank])  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def test_ranks_that_read_different_lists_stop_before_the_run(dataset, tmp_path):
    grown = dataset.with_name("grown.flist")  # the list as a later rank read it: three more lines written
    grown.write_text(dataset.read_text() + "\n".join(dataset.read_text().splitlines()[:3]) + "\n")
    procs = _ranks([dataset, grown], tmp_path / "r.json")
    for rank, proc in enumerate(procs):
        assert proc.returncode == 2, proc.stderr
        _one_line_error(proc, "the ranks read different lists (images rank 0: 12, rank 1: 15): was it still being "
                        "written?")  # fmt: skip
        assert "Model test_efficientnet" not in proc.stderr and not Path(f"{tmp_path / 'r.json'}.{rank}").exists()
    procs = _ranks([dataset, dataset], tmp_path / "r.json", per_rank=([], ["--batch-size", "5"]))
    for proc in procs:  # the same list, other flags: the warm-ups and shards would not match
        assert proc.returncode == 2, proc.stderr
        _one_line_error(proc, "the ranks were given different settings (batch_size: rank 0: 4, rank 1: 5)")


def test_a_rank_that_never_joins_is_one_line_and_a_results_file(dataset, tmp_path):
    trace = tmp_path / "t"  # and the trace, not begun, is said to be missing (it was not written without a word)
    (proc,) = _ranks([dataset], tmp_path / "r.json", "--trace", trace, timeout="2", world_size=2)  # rank 1 never starts
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc, "the job's other ranks did not join within 2 s")
    assert f"note: {trace}.json and .pftrace not written: the run stopped before its loop began" in proc.stderr
    result = read_json(f"{tmp_path / 'r.json'}.0")
    assert result["world_size"] == 2 and result["listed"] == 12 and result["not_reached"] == 12 and result["partial"]
    silent = result["ranks"][1]  # a rank with no word has its entry too, saying so
    assert silent["rank"] == 1 and silent["classified"] is None and silent["stop_reason"].startswith("no word from it")


def test_rank_0s_results_file_gives_the_job_that_a_rank_stopped(dataset, tmp_path):
    lines = dataset.read_text().splitlines() * 4
    (dataset.parent / "broken.JPEG").write_bytes(b"not a JPEG at all" * 20)
    lines[5] = "val/n01440764/../../broken.JPEG"  # line index 5 falls to rank 1
    dataset.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*launcher, *_cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--batch-size", "2",
                            "--num-threads", "1", "--warmup-batches", "1", "--results-file", out)[1:]]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode != 0
    result = read_json(out)
    assert result["world_size"] == 2 and result["listed"] == 48 and _accounted(result) and result["partial"] is True
    assert [f["path"] for f in result["failures"]] == [f"{dataset.parent}/{lines[5]}"]
    assert result["stop_reason"].startswith(f"rank 1: cannot decode {dataset.parent}/{lines[5]}")
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert result["ranks"][1]["stop_reason"].startswith("cannot decode")
    assert result["classified"] == sum(r["classified"] for r in result["ranks"])


# --- Round three: flags that cannot work together stop before the model is built -------------------

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.mark.parametrize(
    "args, env, flags",
    [
        (["--loader", "torch", "--use-nvjpeg"], {}, ("--loader torch", "--use-nvjpeg")),
        (["--loader", "torch", "--use-nvdec"], {}, ("--loader torch", "--use-nvdec")),
        (["--loader", "torch", "--stats-interval", "1"], {}, ("--stats-interval", "--loader torch")),
        (["--loader", "torch", "--sweep", "queue-size=2,4"], {}, ("--sweep queue-size", "--loader torch")),
        (["--trace", "t", "--breakdown"], {}, ("--trace", "--breakdown")),
        (["--sweep", "auto", "--breakdown"], {}, ("--sweep", "--breakdown")),
        (["--sweep", "auto", "--trace", "t"], {}, ("--sweep", "--trace")),
        (["--sweep", "auto", "--parity", "2"], {}, ("--sweep", "--parity")),
        (["--sweep", "auto", "--predictions-file", "p.csv"], {}, ("--sweep", "--predictions-file")),
        (["--sweep", "auto", "--skip-bad", "--max-bad", "2"], {}, ("--sweep", "--max-bad")),
        (["--use-nvjpeg", "--use-nvdec"], {}, ("--use-nvjpeg", "--use-nvdec")),
        (["--loader", "torch", "--check-decoder", "4"], {}, ("--check-decoder", "--loader torch")),
        (["--compile-mode", "default"], {}, ("--compile-mode", "--no-compile")),  # FAST says --no-compile
        (["--torchcompile"], {}, ("--torchcompile", "--no-compile")),
        (["--use-nvdec"], {}, ("--use-nvdec", "cpu")),  # FAST runs on --device cpu
        (["--max-bad", "3"], {}, ("--max-bad", "--skip-bad")),
        (["--breakdown"], TORCHRUN, ("--breakdown", "torchrun")),
        (["--sweep", "auto"], TORCHRUN, ("--sweep", "torchrun")),
        (["--parity", "2"], TORCHRUN, ("--parity", "torchrun")),
        (["--input-flist", "-"], TORCHRUN, ("--input-flist -", "torchrun")),
        (["--labels", "-"], TORCHRUN, ("--labels -", "torchrun")),
    ],
)
def test_flags_that_cannot_work_together_stop_before_the_model(dataset, tmp_path, capfd, monkeypatch, args, env, flags):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    where = [] if "--input-flist" in args else ["--input-flist", dataset, "--prefix", f"{dataset.parent}/"]
    status, _, stderr = _main([*where, *FAST, *args], capfd)
    assert status == 2, stderr
    assert len(_errors(stderr)) == 1 and all(flag in _errors(stderr)[0] for flag in flags), stderr
    assert "Traceback" not in stderr and "Model test_efficientnet" not in stderr


def test_flag_pairs_that_work_together(dataset, tmp_path, capfd):
    # --parity with the DataLoader baseline compares PIL's decode (the baseline's) with timm's; its N
    # is capped at the distinct images listed (the list given twice: still 12); --trace with the
    # baseline writes both traces.
    dataset.write_text(dataset.read_text() * 2)
    out, trace = tmp_path / "r.json", tmp_path / "t"
    args = ["--loader", "torch", "--parity", "100000", "--trace", trace, "--results-file", out]
    status, stdout, stderr = _main(["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, *args], capfd)
    assert status == 0, stderr
    parity = read_json(out)["parity"]
    assert parity["images"] == 12 and parity["mad_max"] == 0.0
    assert "Parity with timm's reference transform on 12 images: pixels differ by 0.00" in stdout
    assert Path(f"{trace}.json").stat().st_size and Path(f"{trace}.pftrace").exists()


# --- Round three: sizes the user gives are capped by the run's own work -----------------------------


def test_sweep_and_worker_sizes_are_capped_at_the_images_listed(dataset, tmp_path, capfd):
    out = tmp_path / "s.json"
    status, stdout, stderr = _main(["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--sweep",
                                    "batch-size=100000", "num-threads=64", "--results-file", out], capfd)  # fmt: skip
    assert status == 0, stderr
    assert [(p["batch_size"], p["num_threads"]) for p in read_json(out)["sweep"]["points"]] == [(12, 12)]
    assert "Sweep: num-threads=64, batch-size=100000 capped at the 12 images listed." in stderr
    status, _, stderr = _main(["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--loader", "torch",
                               "--num-threads", "500", "--max-samples", "3", "--results-file", out], capfd)  # fmt: skip
    assert status == 0, stderr  # not 500 worker processes for 3 images: one, for their one batch
    assert read_json(out)["config"]["loader_workers"] == 1 and read_json(out)["classified"] == 3


def _out_of_memory_run(dataset: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """resnet50 in float32 on 240 images in a 5 GB address space, with ``flags``: a batch of 240
    cannot be had, a batch of 2 can."""
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 20) + "\n")  # 240 images

    def small_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (5_000_000_000, 5_000_000_000))

    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", "--model", "resnet50", "--no-pretrained",
               "--device", "cpu", "--no-compile", "--dtype", "float32", "--num-threads", "2", *flags,
               "--results-file", out)  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=small_address_space)


def test_out_of_memory_in_the_sweep_keeps_what_was_measured_with_the_runs_advice(dataset, tmp_path):
    out = tmp_path / "s.json"
    proc = _out_of_memory_run(dataset, out, "--sweep", "batch-size=2,240")
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc, "out of memory on cpu with a batch of 240 images; try --batch-size 120")
    sweep = read_json(out)["sweep"]
    assert sweep["partial"] is True and [p["batch_size"] for p in sweep["points"]] == [2]


def test_out_of_memory_in_the_parity_pass_is_the_runs_advice_and_a_results_file(dataset, tmp_path):
    out = tmp_path / "r.json"
    proc = _out_of_memory_run(dataset, out, "--batch-size", "240", "--parity", "240")
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc, "out of memory on cpu with a batch of 240 images; try --batch-size 120")
    result = read_json(out)  # stopped before the loop: nothing measured, and said so
    assert result["partial"] is True and result["not_reached"] == 240 and result["stop_reason"].startswith("out of")


# --- Round three: outputs that are devices or streams ---------------------------------------------


def test_stdout_and_dash_are_no_output_files(dataset, tmp_path, capfd):
    base = ["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST]
    for flag in ("--results-file", "--predictions-file", "--plot", "--trace"):
        status, _, stderr = _main([*base, flag, "-"], capfd)
        assert status == 2 and _errors(stderr) == [f"error: {flag} -: the summary goes to stdout; give a file name "
                                                   "(- is none)"], stderr  # fmt: skip
    # In this process stdout is a file (the test's capture): /dev/stdout leads to it, and would replace it.
    status, _, stderr = _main([*base, "--results-file", "/dev/stdout"], capfd)
    assert status == 2 and "that is the file the run's stdout goes to" in _errors(stderr)[0], stderr
    with pytest.raises(OSError, match="the file the run's stdout goes to"):  # the write's test is the same
        ic._write_results("/dev/stdout", ic._RunReport(ic.RunResult(listed=1), {}, {}, []))
    # A descriptor that is not open (/dev/stdout with stdout closed leads there): no file can be made in /proc.
    status, _, stderr = _main([*base, "--results-file", "/proc/self/fd/987"], capfd)
    assert status == 2 and "a process's file descriptor (/proc), not a regular file" in _errors(stderr)[0], stderr


def test_stdout_as_a_results_file_is_refused_before_the_run_wherever_it_goes(dataset, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("the log so far\n")
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", "/dev/stdout")
    with open(log, "a") as stdout:  # --results-file /dev/stdout >> run.log
        proc = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 2 and "that is the file the run's stdout goes to" in proc.stderr
    assert log.read_text() == "the log so far\n"  # not replaced through the link
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # ... | cat: a pipe
    assert piped.returncode == 2 and "Model test_efficientnet" not in piped.stderr
    _one_line_error(piped, "--results-file /dev/stdout: not a regular file (a folder, device, FIFO or pipe)")


# --- Round four: outputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("closed", [1, 2])
def test_a_closed_stdout_or_stderr_does_not_fail_the_run(dataset, tmp_path, closed):
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", out)
    # `>&-` or `2>&-` (cron, some daemons): Python starts with sys.stdout (or sys.stderr) None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.close(closed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "error:" not in proc.stdout + proc.stderr  # nor an error line on stdout
    assert read_json(out)["classified"] == 12


def test_a_closed_standard_stream_is_no_file_of_the_runs():
    # Closed at start, fd 1 would be the next file opened: a results file, a trace, into which a
    # native library's print would go. The entry point opens /dev/null there first.
    code = "import os; import imagenet_classification as ic; os.close(0); os.close(1); ic._fill_closed_streams(); "
    code += "import sys; print(*(os.readlink(f'/proc/self/fd/{fd}') for fd in (0, 1, 2)), file=sys.stderr)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    stdin, stdout, stderr = proc.stderr.split()[-3:]
    assert (stdin, stdout) == ("/dev/null", "/dev/null") and stderr.startswith("pipe:")  # an open one: as it is


def test_control_characters_in_names_are_escaped_on_screen(tmp_path, capfd):
    root = tmp_path / "data"
    make_jpeg_set(root, 4)
    folder = root / "val" / "n01440764"
    bad = folder / "x\nFPS=99999.00 (8 in 0.00 s)\x1b[2K.JPEG"  # a newline, and a terminal's escape sequence
    bad.write_bytes(b"not a JPEG" * 30)
    good = folder / "a\nb\tc.JPEG"
    os.rename(next(folder.glob("ILSVRC*")), good)
    cr = root / "val" / "n02123045" / "d\re.JPEG"  # csv quotes a newline, not a carriage return
    os.rename(next(cr.parent.glob("ILSVRC*")), cr)
    rows = tmp_path / "p.csv"
    status, stdout, stderr = _main(["--data-dir", root / "val", *FAST, "--skip-bad", "--predictions-file", rows], capfd)
    assert status == 0, stderr
    assert len(re.findall(r"^FPS=", stdout, re.MULTILINE)) == 1  # no line injected by a name
    (failed,) = [line for line in stdout.splitlines() if "failed: " in line]
    assert "x\\nFPS=99999.00 (8 in 0.00 s)\\x1b[2K.JPEG: " in failed and "\x1b" not in stdout
    import csv  # a data file keeps the name as it is (CSV quotes it), as the results file does

    with open(rows, newline="") as f:
        assert {str(good), str(cr)} <= {row["path"] for row in csv.DictReader(f)}
    # A strict run's error line: one line, on stderr only.
    status, stdout, stderr = _main(["--data-dir", root / "val", *FAST], capfd)
    assert status == 1 and len(re.findall(r"^FPS=", stdout + stderr, re.MULTILINE)) == 1, stderr
    (line,) = _errors(stderr)
    assert "x\\nFPS=99999.00 (8 in 0.00 s)\\x1b[2K.JPEG" in line and "\x1b" not in stderr


def _full_disk_run(flist: Path, limit: int, *args: str) -> subprocess.CompletedProcess:
    """The run as on a disk that takes no file over ``limit`` bytes (RLIMIT_FSIZE: a write past it fails
    with EFBIG, as one on a full disk fails with ENOSPC; neither needs root)."""

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails, rather than the process ending

    cmd = _cli("--input-flist", flist, "--prefix", f"{flist.parent}/", *FAST, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=small_files)


def test_each_file_that_cannot_be_written_says_what_is_lost(dataset, tmp_path):
    out, rows, plot = tmp_path / "r.json", tmp_path / "p.csv", tmp_path / "t.png"
    for path in (out, rows, plot):
        path.write_text("old\n")
    # A disk that takes no file over 1 kB: the results (3 kB), the rows (2 kB), the plot (40 kB) all fail.
    proc = _full_disk_run(dataset, 1024, "--results-file", out, "--predictions-file", rows, "--plot", plot)
    assert proc.returncode == 1 and "Images: listed=12 classified=12" in proc.stdout, proc.stderr
    assert _errors(proc.stderr) == [
        f"error: {out}: cannot write the results there (File too large); they are only above",
        f"error: {rows}: cannot write the per-image rows there (File too large)",
        f"error: {plot}: cannot write the plot there (File too large)",
    ], proc.stderr
    assert [p.read_text() for p in (out, rows, plot)] == ["old\n"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "p.csv", "r.json", "t.png"]


def test_a_trace_that_cannot_be_written_is_one_line_and_keeps_the_old_files(dataset, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    trace = out / "t"
    Path(f"{trace}.json").write_text('{"old": "trace"}\n')
    Path(f"{trace}.pftrace").write_bytes(b"old")
    # torch's trace (about 200 kB) does not fit, SPDL's (about 13 kB) would: Kineto's save() fails without a word
    proc = _full_disk_run(dataset, 64 * 1024, "--trace", trace)
    assert proc.returncode == 1 and "Images: listed=12 classified=12" in proc.stdout, proc.stderr
    _one_line_error(proc, f"{trace}: cannot write the trace there")
    assert "trace: " not in proc.stderr  # no success line for a file not written
    assert Path(f"{trace}.json").read_text() == '{"old": "trace"}\n' and Path(f"{trace}.pftrace").read_bytes() == b"old"
    assert sorted(p.name for p in out.iterdir()) == ["t.json", "t.pftrace"]  # no temporary file left


def test_outputs_that_are_files_the_run_reads_are_refused(dataset, tmp_path, capfd):
    # The class table beside the module (a checkout, an editable install): every later run would fail.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("imagenet_classification.py", "imagenet_class.tsv"):
        (copy / name).write_bytes((ROOT / name).read_bytes())
    cmd = [sys.executable, copy / "imagenet_classification.py", "--input-flist", dataset, "--prefix",
           f"{dataset.parent}/", *FAST, "--results-file", copy / "imagenet_class.tsv"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, "is one of the run's inputs or outputs")
    assert (copy / "imagenet_class.tsv").read_bytes() == (ROOT / "imagenet_class.tsv").read_bytes()
    # A local-dir: model's config and weights.
    ldir = tmp_path / "ldir"
    ldir.mkdir()
    config = {"architecture": "test_efficientnet", "num_classes": 1000, "pretrained_cfg": {"input_size": [3, 160, 160],
              "crop_pct": 0.875, "interpolation": "bicubic", "mean": [0.485, 0.456, 0.406],
              "std": [0.229, 0.224, 0.225], "num_classes": 1000}}  # fmt: skip
    (ldir / "config.json").write_text(json.dumps(config))
    (ldir / "model.safetensors").write_bytes(b"weights")
    base = ["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--model", f"local-dir:{ldir}"]
    for name in ("config.json", "model.safetensors"):
        status, _, stderr = _main([*base, "--results-file", ldir / name], capfd)
        assert status == 2 and "is one of the run's inputs or outputs" in _errors(stderr)[0], stderr
    assert json.loads((ldir / "config.json").read_text()) == config
    assert (ldir / "model.safetensors").read_bytes() == b"weights"
    # A listed image reached through a link of another name (class folders of links are a common layout).
    store, folder = tmp_path / "links" / "store", tmp_path / "links" / "val" / "n01440764"
    store.mkdir(parents=True)
    folder.mkdir(parents=True)
    image = store / "img0001.jpg"
    image.write_bytes((dataset.parent / dataset.read_text().splitlines()[0]).read_bytes())
    (folder / "ILSVRC2012_val_00000000_n01440764.JPEG").symlink_to("../../store/img0001.jpg")
    flist = tmp_path / "links" / "val.flist"
    flist.write_text("val/n01440764/ILSVRC2012_val_00000000_n01440764.JPEG\n")
    base = ["--input-flist", flist, "--prefix", f"{flist.parent}/", *FAST]
    for target in (image, folder / "ILSVRC2012_val_00000000_n01440764.JPEG"):  # the file, or the link's name
        status, _, stderr = _main([*base, "--results-file", target], capfd)
        assert status == 2 and "is one of the run's inputs or outputs" in _errors(stderr)[0], stderr
    assert image.read_bytes()[:2] == b"\xff\xd8"


def test_crop_pct_takes_above_1_what_a_model_config_may_hold(jpeg_set, tmp_path):
    # The transform pads a crop_pct over 1 (volo_d4_448's 1.15) as timm does: the flag takes it too.
    out = tmp_path / "r.json"
    run = ["--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile", "--max-samples", "4"]
    proc = run_cli(*run, "--batch-size", "4", "--crop-pct", "1.15", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    assert read_json(out)["config"]["crop_pct"] == 1.15
    proc = run_cli(*run, "--crop-pct", "2.5")
    assert proc.returncode == 2 and "--crop-pct: expected a number above 0, at most 2, got '2.5'" in proc.stderr


def test_an_output_folder_no_file_can_be_made_in_is_refused_before_the_run_for_root_too(jpeg_set):
    # root passes os.access's test in /sys (and on a root-squashed NFS mount), where no file can be made.
    run = ["--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile", "--max-samples", "4"]
    proc = run_cli(*run, "--results-file", "/sys/r.json")
    assert proc.returncode == 2 and "error: --results-file /sys/r.json: cannot write there (" in proc.stderr
    assert "Model test_efficientnet" not in proc.stderr, proc.stderr  # before the model is built


def test_a_decode_worker_interrupted_while_it_starts_ends_without_a_word():
    # A spawned --decode-processes worker imports the module as __mp_main__: Ctrl-C to the process
    # group while it loads torch must print no traceback under the run's own line.
    code = "import os, runpy, signal; runpy.run_path({!r}, run_name='__mp_main__'); os.kill(os.getpid(), signal.SIGINT)"
    code += "; import time; time.sleep(5); print('not ended')"
    command = [sys.executable, "-c", code.format(str(ROOT / "imagenet_classification.py"))]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "")
