"""`pip install .` gives a program that runs: the wheel built from this checkout, installed into a
fresh virtual environment, run from another folder as a user would (the console script and
``python -m``), on real JPEGs, with a tiny real timm model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, make_jpeg_set, read_json

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; its dependencies come from this one's site-packages
    through a .pth line (a plain path: the editable install's own .pth there is not run)."""
    work = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(work / "dist"), str(ROOT)], check=True, capture_output=True, cwd=work)  # fmt: skip
    (wheel,) = (work / "dist").glob("imagenet_classification-*.whl")
    assert {"imagenet_classification.py", "imagenet_class.tsv"} <= set(zipfile.ZipFile(wheel).namelist())
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    Path(purelib, "shared_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    "--ignore-installed", str(wheel)], check=True, capture_output=True)  # fmt: skip
    return env_dir


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_the_installed_module_is_the_wheels(installed, tmp_path):
    done = _run([str(installed / "bin" / "python"), "-c", "import imagenet_classification as m; print(m.__file__); "
                 "print(m.read_file_list.__name__, m.get_mappings()['n03709823'])"], tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    where, mapping = done.stdout.splitlines()
    assert Path(where).is_relative_to(installed) and mapping == "read_file_list 636"


@pytest.mark.parametrize("how", ["script", "module"])
def test_installed_command_runs_from_another_folder(installed, tmp_path, how):
    flist = make_jpeg_set(tmp_path / "data", 12)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    program = ([str(installed / "bin" / "imagenet-classification")] if how == "script"
               else [str(installed / "bin" / "python"), "-m", "imagenet_classification"])  # fmt: skip
    results = elsewhere / "r.json"
    done = _run([*program, "--input-flist", str(flist), "--prefix", f"{flist.parent}/", "--model", "test_efficientnet",
                 "--no-pretrained", "--device", "cpu", "--no-compile", "--batch-size", "4", "--warmup-batches", "1",
                 "--results-file", str(results)], elsewhere)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Images: listed=12 classified=12 failed=0 not_reached=0" in done.stdout
    assert "Traceback" not in done.stderr
    # --data-dir too: the class folders are read against the class table, found in the install.
    done = _run([*program, "--data-dir", str(flist.parent / "val"), "--model", "test_efficientnet",
                 "--no-pretrained", "--device", "cpu", "--no-compile", "--batch-size", "4", "--warmup-batches", "1"],
                elsewhere)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "classified=12" in done.stdout
    assert read_json(results)["classified"] == 12


def test_the_installed_command_says_a_signal_while_starting_in_one_line(installed, tmp_path):
    # The console script's __main__ is the script, not this module: Ctrl-C while torch loaded was a
    # KeyboardInterrupt traceback, SIGTERM nothing at all.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        proc = subprocess.Popen([str(installed / "bin" / "imagenet-classification"), "--help"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(0.5)  # importing torch and SPDL takes seconds
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
        name = signal.Signals(signum).name
        assert proc.returncode == status and stderr == f"error: interrupted by {name} while starting\n", stderr


def test_python_m_names_itself_so_in_its_usage(installed, tmp_path):
    done = _run([str(installed / "bin" / "python"), "-m", "imagenet_classification", "--bogus"], tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("usage: python -m imagenet_classification (")
    assert "python -m imagenet_classification: error: unrecognized arguments: --bogus" in done.stderr
