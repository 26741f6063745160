"""The helper programs in bench/ and scripts/, run as a user runs them: a bad path gets one
``error:`` line (exit 2) before any work, never a traceback; gpu_prepare.sh empties only a
folder it made. No model runs: every case here stops at its arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _run(*args: str | Path, cwd: Path = ROOT, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **(env or {})}, **kw)  # fmt: skip


def _one_error_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The run stopped with argparse's exit 2 and one ``error:`` line holding ``words``; that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and all(w in errors[0] for w in words), proc.stderr
    return errors[0]


def test_gpu_prepare_never_empties_a_folder_it_did_not_make(tmp_path):
    precious = tmp_path / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "notes.txt").write_text("keep me\n")
    (precious / "sub" / "more.txt").write_text("me too\n")
    # PY=/bin/false: were the folder taken, nothing after the emptying would work either.
    proc = _run("bash", ROOT / "bench" / "gpu_prepare.sh", env={"BUNDLE": str(precious), "PY": "/bin/false"})
    _one_error_line(proc, f"BUNDLE {precious}:", ".gpu_bundle")
    assert (precious / "notes.txt").read_text() == "keep me\n" and (precious / "sub" / "more.txt").exists()
    assert sorted(p.name for p in precious.iterdir()) == ["notes.txt", "sub"]
    # A file is no bundle either.
    (tmp_path / "a-file").write_text("x")
    proc = _run("bash", ROOT / "bench" / "gpu_prepare.sh", env={"BUNDLE": str(tmp_path / "a-file"), "PY": "/bin/false"})
    _one_error_line(proc, "not a folder")
    assert (tmp_path / "a-file").read_text() == "x"


def test_gpu_prepare_marks_its_bundle_and_refills_it(tmp_path):
    # BUNDLE relative to where the script is started, not to the repository it moves to.
    env = {"BUNDLE": "bundle", "PY": "/bin/false"}
    first = _run("bash", ROOT / "bench" / "gpu_prepare.sh", cwd=tmp_path, env=env)
    assert first.returncode != 0  # /bin/false downloads nothing
    assert (tmp_path / "bundle" / ".gpu_bundle").is_file()
    (tmp_path / "bundle" / "stale.whl").write_text("from an earlier run")
    again = _run("bash", ROOT / "bench" / "gpu_prepare.sh", cwd=tmp_path, env=env)
    assert again.returncode != 0 and "error: BUNDLE" not in again.stderr
    assert not (tmp_path / "bundle" / "stale.whl").exists() and (tmp_path / "bundle" / ".gpu_bundle").is_file()


def test_gpu_check_sh_help_and_a_missing_bundle(tmp_path):
    env = {"OUT": "out", "SITE": str(tmp_path / "site"), "PYTHON": sys.executable}
    for flag in ("--help", "-h"):
        proc = _run("bash", ROOT / "bench" / "gpu_check.sh", flag, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "BUNDLE" in proc.stdout and "usage: gpu_check.py" in proc.stdout and "--scratch" in proc.stdout
    # The bundle named as the user gave it, from where they are; nothing made before the check.
    proc = _run("bash", ROOT / "bench" / "gpu_check.sh", cwd=tmp_path, env={**env, "BUNDLE": "nothing-here"})
    _one_error_line(proc, f"BUNDLE {tmp_path / 'nothing-here'}:", "gpu_prepare.sh")
    assert not (tmp_path / "out").exists() and not (tmp_path / "site").exists()


@pytest.mark.parametrize(
    "script, args, words",
    [
        ("bench/parity_set.py", ["{file}"], ["argument root: {file}: not a folder"]),
        ("scripts/make_unusual_images.py", ["{file}"], ["argument folder: {file}: not a folder"]),
        ("scripts/make_demo_data.py", ["{file}"], ["argument root: {file}: not a folder"]),
        ("bench/read_ceiling.py", ["--out", "{file}/sub"], ["argument --out: {file}/sub: cannot make the folder"]),
        ("bench/gpu_check.py", ["--bundle", "{tmp}/none", "--out", "{tmp}/out"], ["argument --bundle: {tmp}/none:"]),
        ("scripts/convert_efficientnet_lite0.py", ["{tmp}"], ["argument out: {tmp}: a folder, not a file"]),
    ],
)
def test_a_bad_path_is_one_error_line(tmp_path, script, args, words):
    file = tmp_path / "a-file"
    file.write_text("not a folder\n")
    fill = {"file": file, "tmp": tmp_path}
    proc = _run(sys.executable, ROOT / script, *(a.format(**fill) for a in args))
    _one_error_line(proc, *(w.format(**fill) for w in words))
    assert file.read_text() == "not a folder\n" and not (tmp_path / "out").exists()


def test_make_class_tsv_takes_help_and_a_closed_pipe(tmp_path):
    script = ROOT / "scripts" / "make_class_tsv.py"
    proc = _run(sys.executable, script, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage:") and "n01440764" not in proc.stdout
    proc = _run(sys.executable, script, "--out", "x")
    _one_error_line(proc, "unrecognized arguments: --out x")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line, as after `| head -0`
    try:
        proc = subprocess.run([sys.executable, str(script)], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120)  # fmt: skip
    finally:
        os.close(write)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("script", ["bench/parity_set.py", "bench/gpu_check.py", "scripts/make_unusual_images.py"])
def test_help_without_docstrings(script):
    # python -OO drops docstrings; the description came from __doc__.
    proc = _run(sys.executable, "-OO", ROOT / script, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr
