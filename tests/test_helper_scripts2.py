"""The helper programs in bench/ and scripts/, run as a user runs them, after a hostile sweep: no
silent loss (a skip counted, a results file of nothing refused, a count not cut), one line for
every failure (a results path that cannot be written, a full disk, a broken file kept from
before), checked at the start rather than after the measuring."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_helper_scripts import _one_error_line, _run


def _script(name: str) -> Path:
    return ROOT / name


def _one_line(proc: subprocess.CompletedProcess, status: int, *words: str) -> str:
    """The run ended with ``status`` and a last stderr line holding ``words``, no traceback."""
    assert proc.returncode == status, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), proc.stderr[-2000:]
    return last


# --- Arguments that measure nothing, or more than there is: refused before any work ------------


@pytest.mark.parametrize(
    "script, args, words",
    [
        ("bench/gil.py", ["--no-targets", "--no-sampling"], ["--no-sampling: both given: nothing to measure"]),
        ("bench/mix_variants.py", ["--variants"], ["argument --variants: no names", "nothing to measure"]),
        ("bench/parity.py", ["--timed-images", "100000"], ["--timed-images: 100000: more than the parity set's 460"]),
        (
            "bench/compare_loaders.py",
            ["--images", "192", "--model-images", "1"],
            ["argument --model-images: 1: at least 64 images"],
        ),
        ("bench/compare_loaders.py", ["--images", "192", "--model-images", "63"], ["--model-images: 63: at least 64"]),
        ("bench/gpu_check.py", ["--time-budget", "0"], ["argument --time-budget: 0: expected a number of seconds"]),
        ("bench/gpu_check.py", ["--leg-timeout", "-5"], ["argument --leg-timeout: -5: expected a number of seconds"]),
        ("bench/gil.py", ["--before", "nosuchcommit"], ["argument --before: nosuchcommit: not a commit"]),
        ("bench/list_folder.py", ["--root", "{tmp}/tree", "--files", "999"], ["--files: 999: at least 1000"]),
    ],
)
def test_an_argument_that_measures_nothing_or_too_much_is_refused(tmp_path, script, args, words):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gil.json").write_text('{"earlier": 1}\n')
    (out / "mix_variants.json").write_text('{"earlier": 1}\n')
    fill = {"tmp": tmp_path}
    with_out = [] if "--root" in args else ["--out", str(out)]
    proc = _run(sys.executable, _script(script), *with_out, *(a.format(**fill) for a in args))
    _one_error_line(proc, *words)
    assert (out / "gil.json").read_text() == (out / "mix_variants.json").read_text() == '{"earlier": 1}\n'
    assert sorted(p.name for p in out.iterdir()) == ["gil.json", "mix_variants.json"]  # no set made


# --- Results paths and sub-folders, checked at the start -----------------------------------------


@pytest.mark.parametrize(
    "script, made, args",
    [
        ("bench/decode_paths.py", "decode_paths.json", ["--images", "192"]),
        ("bench/mix_variants.py", "mix_variants.json", ["--images", "16"]),
        ("bench/parity.py", "parity.json", []),
        ("bench/parity.py", "efficientnet_lite0.pth", []),
        ("bench/gil.py", "gil.json", ["--images", "16", "--no-targets"]),
        ("bench/decode_paths.py", "photos", ["--images", "192"]),
        ("bench/decode_paths.py", "images", ["--images", "192"]),
        ("bench/read_ceiling.py", "images", ["--images", "192"]),
        ("bench/compare_loaders.py", "images", ["--no-plot"]),
    ],
)
def test_a_results_path_that_cannot_be_written_is_refused_at_the_start(tmp_path, script, made, args):
    out = tmp_path / "out"
    out.mkdir()
    if made.endswith((".json", ".pth")):  # a folder where the results file goes: lost the run's minutes
        (out / made).mkdir()
        words = [f"argument --out: {out / made}: a folder, not a file"]
    else:  # a file where a sub-folder goes: NotADirectoryError
        (out / made).write_text("a file\n")
        words = [f"argument --out: {out / made}: not a folder"]
    proc = _run(sys.executable, _script(script), "--out", out, *args)
    _one_error_line(proc, *words)
    assert not list(out.rglob("*.JPEG")) and not list(out.rglob("*.flist"))  # before any set was made


def test_a_results_path_that_is_no_regular_file_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    os.symlink("/dev/full", tmp_path / "out" / "results.json")
    proc = _run(sys.executable, _script("bench/compare_loaders.py"), "--out", tmp_path / "out", "--no-plot")
    _one_error_line(proc, f"argument --out: {tmp_path / 'out' / 'results.json'}: not a regular file")
    os.mkfifo(tmp_path / "fifo")
    proc = _run(sys.executable, _script("scripts/convert_efficientnet_lite0.py"), tmp_path / "fifo")
    _one_error_line(proc, f"argument out: {tmp_path / 'fifo'}: not a regular file")


# --- Errors of the system, and broken files kept from before: one line --------------------------


def test_a_full_disk_on_stdout_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, str(_script("scripts/make_class_tsv.py"))], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == ["make_class_tsv.py: error: No space left on device: standard output"]


def test_mutate_stopped_by_ctrl_c_says_so_in_one_line():
    proc = subprocess.Popen([sys.executable, str(_script("scripts/mutate.py")), "--list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(3)  # generating its mutants (minutes)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT and err.strip().splitlines() == ["mutate.py: interrupted by SIGINT"]


def test_parity_with_a_truncated_checkpoint_says_to_delete_it(tmp_path):
    (tmp_path / "efficientnet_lite0.pth").write_bytes(b"PK\x03\x04" + b"\0" * 1000)  # a zip cut short
    proc = _run(sys.executable, _script("bench/parity.py"), "--out", tmp_path)
    _one_line(proc, 1, f"{tmp_path / 'efficientnet_lite0.pth'}: cannot load checkpoint", "delete")
    assert not list(tmp_path.rglob("*.JPEG"))  # the model first, before the set's work


def test_gpu_check_keeps_a_broken_report_aside(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "photos").mkdir(parents=True)
    (bundle / "photos" / "val.flist").write_text("no-photo-here\n")  # stops the run right after the report
    (bundle / "efficientnet_lite0.pth").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu_check.json").write_text('{"gpu": "H1')  # cut short by a full disk
    proc = _run(sys.executable, _script("bench/gpu_check.py"), "--bundle", bundle, "--out", out, "--scratch",
                tmp_path / "scratch", "--device", "cpu")  # fmt: skip
    _one_error_line(proc, "lists no photo as val/WNID/NAME")
    assert f"warning: {out / 'gpu_check.json'}: not a report" in proc.stderr
    assert (out / "gpu_check.json.broken").read_text() == '{"gpu": "H1'


def test_compare_loaders_with_a_reused_list_that_is_not_utf8(tmp_path):
    images = tmp_path / "out" / "images"
    (images / "val" / "n01440764").mkdir(parents=True)
    (images / "val192.flist").write_bytes(b"val/n01440764/caf\xe9.JPEG\n")
    proc = _run(sys.executable, _script("bench/compare_loaders.py"), "--out", tmp_path / "out", "--images", "192",
                "--no-plot")  # fmt: skip
    _one_line(proc, 1, f"{images / 'val192.flist'}: not UTF-8 text", "delete it")


def test_compare_loaders_without_matplotlib_says_so_at_the_start(tmp_path):
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")  # the extra not installed
    proc = _run(sys.executable, _script("bench/compare_loaders.py"), "--out", tmp_path / "out", "--images", "192",
                env={"PYTHONPATH": str(tmp_path / "site")})  # fmt: skip
    _one_error_line(proc, "pip install matplotlib", "--no-plot")
    assert not (tmp_path / "out" / "images").exists()


# --- Images that do not decode: counted, and nothing to measure refused ---------------------------


def test_gil_counts_the_tiny_images_that_do_not_decode(tmp_path):
    images = tmp_path / "out" / "images"
    (images / "tiny" / "n01440764").mkdir(parents=True)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from gil import tiny_set
    finally:
        sys.path.remove(str(ROOT / "bench"))
    tiny_set(images)
    (images / "tiny" / "n01440764" / "tiny_00007.JPEG").write_bytes(b"not a JPEG")
    # A mix set of one image that does not decode: the run stops there, after the tiny set's check.
    (images / "val-imagenet" / "n01440764").mkdir(parents=True)
    (images / "val-imagenet" / "n01440764" / "bad.JPEG").write_bytes(b"not a JPEG")
    (images / "imagenet-192.flist").write_text("val-imagenet/n01440764/bad.JPEG\n")
    proc = _run(sys.executable, _script("bench/gil.py"), "--out", tmp_path / "out", "--images", "192")
    assert "gil: left out 1 of the set's 512 images, which do not decode" in proc.stderr, proc.stderr
    _one_error_line(proc, "argument --images: 192: only 0 of them decode")


def test_gil_refuses_a_set_where_nothing_decodes(tmp_path):
    images = tmp_path / "out" / "images"
    for folder, flist in (("val-imagenet", "imagenet-16.flist"), ("val", "val16.flist")):
        (images / folder / "n01440764").mkdir(parents=True)
        (images / folder / "n01440764" / "bad.JPEG").write_bytes(b"not a JPEG")
        (images / flist).write_text(f"{folder}/n01440764/bad.JPEG\n")
    proc = _run(sys.executable, _script("bench/gil.py"), "--out", tmp_path / "out", "--images", "16", "--no-targets",
                "--seconds", "1", "--repeats", "1")  # fmt: skip
    _one_error_line(proc, "argument --images: 16: none of the set's images decode")


# --- Numbers that say what they are ---------------------------------------------------------------


def test_list_folder_prints_numbers_whose_ratio_can_be_checked(tmp_path):
    proc = _run(sys.executable, _script("bench/list_folder.py"), "--root", tmp_path / "tree", "--files", "1000")
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"scan_folder (\S+) s, torchvision's make_dataset (\S+) s \((\S+)x\)", proc.stdout)
    assert found, proc.stdout
    scan_s, torchvision_s, ratio = map(float, found.groups())  # 0.00 s each, at two decimals
    assert scan_s > 0 and abs(torchvision_s / scan_s / ratio - 1) < 0.02, proc.stdout


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no tmpfs at /dev/shm")
def test_read_ceiling_on_tmpfs_warns_that_its_cold_reads_are_warm(tmp_path):
    out = Path("/dev/shm") / f"read_ceiling_{os.getpid()}"
    try:
        proc = _run(sys.executable, _script("bench/read_ceiling.py"), "--out", out, "--images", "192", "--repeats",
                    "1", "--max-threads", "1")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "warning: eviction left 100% of the set's bytes in memory" in proc.stderr, proc.stderr
        assert json.loads((out / "read_ceiling.json").read_text())["cold_not_cold"] is True
        assert "median over the repeats of the ratio within a repeat" in proc.stdout
    finally:
        subprocess.run(["rm", "-rf", str(out)], check=False)


def test_gil_gives_no_verdict_on_a_window_it_warns_is_too_short(tmp_path):
    proc = _run(sys.executable, _script("bench/gil.py"), "--out", tmp_path, "--images", "192", "--repeats", "1",
                "--no-sampling")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "at 16 threads the loader's timed window of 1 batches" in proc.stderr
    assert "target >=" not in proc.stdout, proc.stdout
    assert "(not judged: the window at 16 threads is too short)" in proc.stdout, proc.stdout
    assert json.loads((tmp_path / "gil.json").read_text())["targets"]["not_judged"] == ["loader_2", "loader_16"]
