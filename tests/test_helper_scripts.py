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


# --- Arguments refused before any work: counts, orders, windows ---------------------------------


@pytest.mark.parametrize(
    "script, args, words",
    [
        ("bench/compare_loaders.py", ["--scaling-sizes", "8000", "1000"], ["--scaling-sizes: 8000 1000: SMALL must"]),
        ("bench/compare_loaders.py", ["--scaling-sizes", "1000", "1000"], ["--scaling-sizes: 1000 1000: SMALL must"]),
        ("bench/compare_loaders.py", ["--images", "191"], ["argument --images: 191: at least 192 images"]),
        ("bench/compare_loaders.py", ["--images", "40", "--batch-size", "8"], ["--images: 40: at least 48 images"]),
        ("bench/decode_paths.py", ["--images", "100"], ["argument --images: 100: at least 192 images"]),
        ("bench/decode_paths.py", ["--images", "200", "--per-image", "300"],
         ["argument --per-image: 300: more than the set's --images 200"]),
        ("bench/compare_loaders.py", ["--images", "200", "--model-images", "300"],
         ["argument --model-images: 300: more than the set's --images 200"]),
        ("bench/mix_variants.py", ["--images", "200", "--agreement-images", "300"],
         ["argument --agreement-images: 300: more than the set's --images 200"]),
        ("bench/gil.py", ["--images", "100"], ["argument --images: 100: at least 192 images"]),
        ("bench/gil.py", ["--seconds", "0.5"], ["argument --seconds: 0.5: at least 1"]),
        ("bench/mix_variants.py", ["--images", "100", "--pipeline-repeats", "1"], ["--images: 100: at least 192"]),
        ("scripts/mutate.py", ["--jobs", "0"], ["argument --jobs: 0: expected a whole number, 1 or more"]),
        ("scripts/mutate.py", ["--sample", "0"], ["argument --sample: 0: expected a whole number, 1 or more"]),
        ("scripts/semantic_mutants.py", ["--jobs", "0"], ["argument --jobs: 0: expected a whole number"]),
        ("bench/parity_set.py", ["--colour-crops", "-1"], ["argument --colour-crops: -1: expected a whole number"]),
        ("bench/parity_set.py", ["--colour-crops", "0", "--grey-crops", "0"], ["both 0: no JPEG to write"]),
        ("scripts/make_demo_data.py", ["--variants", "0"], ["argument --variants: 0: expected a whole number, 1"]),
        *[(f"bench/{name}.py", ["--max-threads", "2147483647"],  # each count from 1 up: out of memory
           ["argument --max-threads: 2147483647: expected a whole number from 1 to 1024"])
          for name in ("compare_loaders", "decode_paths", "mix_variants", "read_ceiling")],
    ],
)  # fmt: skip
def test_a_count_that_cannot_work_is_one_error_line(tmp_path, script, args, words):
    # Each also given where it would write: nothing is made there.
    where = {"bench/parity_set.py": ["{out}"], "scripts/make_demo_data.py": ["{out}"],
             "scripts/mutate.py": ["--report", "{out}/r.json"],
             "scripts/semantic_mutants.py": ["--report", "{out}/r.json"]}.get(script, ["--out", "{out}"])  # fmt: skip
    proc = _run(sys.executable, ROOT / script, *args, *(w.format(out=tmp_path / "out") for w in where))
    _one_error_line(proc, *words)
    assert not (tmp_path / "out").exists()


def test_parity_set_and_demo_data_say_how_many_they_wrote(tmp_path):
    proc = _run(sys.executable, ROOT / "bench" / "parity_set.py", tmp_path / "parity", "--colour-crops", "0",
                "--grey-crops", "1")  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("wrote 10 JPEGs"), proc.stderr
    assert len(list((tmp_path / "parity").glob("*.jpg"))) == 10
    proc = _run(sys.executable, ROOT / "scripts" / "make_demo_data.py", tmp_path / "demo", "--variants", "1")
    assert proc.returncode == 0 and proc.stdout.startswith("wrote 5 images"), proc.stderr
    assert len(list((tmp_path / "demo" / "val").glob("*/*.JPEG"))) == 5


# --- bench/: what each measures --------------------------------------------------------------


def test_compare_loaders_leaves_out_the_images_that_do_not_decode(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from compare_loaders import decodable, make_image_set

    flist = make_image_set(tmp_path / "images", 10)
    assert decodable(flist, 4) == (flist, [])
    lines = flist.read_text().splitlines()
    (tmp_path / "images" / lines[3]).write_bytes(b"not a JPEG" * 50)
    (tmp_path / "images" / lines[7]).write_bytes((tmp_path / "images" / lines[0]).read_bytes()[:600])  # cut short
    kept, left_out = decodable(flist, 4)
    assert kept != flist and kept.read_text().splitlines() == [line for i, line in enumerate(lines) if i not in (3, 7)]
    assert sorted(e.path for e in left_out) == sorted(f"{flist.parent}/{lines[i]}" for i in (3, 7))
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "left out 2 of the set's 10 images" in said[0] and "timing the other 8" in said[0]


def test_decode_paths_prints_one_ratio_and_the_yardstick_beside_each_row(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from decode_paths import YARDSTICK, part1_lines

    # Two rounds: the row's ratios are 0.5 and 1.0 (median 0.75); its median over the yardstick's
    # median beside it would be 125 / 150 = 0.83, and over the yardstick's overall median 125 / 200.
    rates = {YARDSTICK: [100.0, 200.0, 300.0, 300.0], "row": [50.0, 200.0]}
    lines = part1_lines(rates, {"row": [100.0, 200.0]}, {"row": 1.5}, 300)
    assert "300 images" in lines[0] and "median over the rounds" in lines[0] and "yardstick beside it" in lines[1]
    assert lines[2].split()[-4:] == ["250", "250", "1.00", "-"]
    assert lines[3].split() == ["row", "125", "150", "0.75", "1.50"]


def test_mix_variants_all_prebuilt_runs_in_the_loader_with_graphs_per_thread(tmp_path, monkeypatch):
    import threading

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from compare_loaders import make_image_set
    from mix_variants import _PrebuiltCache, pipeline_rates

    import imagenet_classification as ic

    flist = make_image_set(tmp_path / "images", 192)
    rates = pipeline_rates(flist, ["all prebuilt"], [2], 1)  # was a KeyError: nothing prebuilt
    assert rates["all prebuilt"]["2"]["loader_fps"] > 0
    here, there = _PrebuiltCache._graphs(ic.EvalTransform()), []
    thread = threading.Thread(target=lambda: there.append(_PrebuiltCache._graphs(ic.EvalTransform())))
    thread.start()
    thread.join()
    assert here.keys() == there[0].keys() and len(here) > 1
    assert not any(here[key] is there[0][key] for key in here)  # a graph takes one thread's frames at a time


def test_gil_says_why_py_spy_failed(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    said = "echo 'sampling...' >&2\necho 'Error: Permission denied (os error 1)' >&2\n"
    (tools / "py-spy").write_text(f"#!/bin/sh\n{said}exit 1\n")
    (tools / "perf").write_text("#!/bin/sh\nexit 1\n")  # no uprobes: nothing added to the system's libpython
    for tool in tools.iterdir():
        tool.chmod(0o755)
    proc = _run(sys.executable, ROOT / "bench" / "gil.py", "--out", tmp_path / "out", "--images", "40", "--seconds",
                "1", "--repeats", "1", "--no-targets", env={"PATH": f"{tools}:{os.environ['PATH']}"})  # fmt: skip
    _one_error_line(proc, "py-spy record --gil failed (exit status 1): sampling... | Error: Permission denied")


def test_list_folder_refuses_another_count_on_a_tree_it_made(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from list_folder import make_tree, tree_files

    make_tree(tmp_path / "tree", 1000)
    assert tree_files(tmp_path / "tree") == 1000
    (tmp_path / "tree" / ".complete").write_text("")  # a tree made before the count was written down
    assert tree_files(tmp_path / "tree") == 1000
    proc = _run(sys.executable, ROOT / "bench" / "list_folder.py", "--root", tmp_path / "tree", "--files", "2000")
    _one_error_line(proc, "argument --files: 2000:", "holds a tree of 1000 files made before; give --files 1000")
    (tmp_path / "file").write_text("")  # a new tree where no folder can be made: a traceback before
    proc = _run(sys.executable, ROOT / "bench" / "list_folder.py", "--root", tmp_path / "file" / "tree", "--files", "9")
    _one_error_line(proc, f"argument --root: {tmp_path}/file/tree: cannot make the folder: Not a directory")


# --- scripts/mutate.py and its semantic mutants -------------------------------------------------


def test_mutate_lists_its_hand_edits():
    proc = _run(sys.executable, ROOT / "scripts" / "mutate.py", "--only", "bad-image policy", "--list")
    edits = [line for line in proc.stdout.splitlines() if line.startswith("hand edit bad-image policy line ")]
    assert [line.split(": ", 1)[1] for line in edits] == ["--max-bad N compared with >=", "--max-bad P% rounded up"]
    assert proc.stdout.splitlines()[-1].endswith(", 2 hand edits, 0 semantic mutants"), proc.stderr


def test_semantic_mutants_run_alone_and_list_themselves():
    from semantic_mutants import MUTANTS

    proc = _run(sys.executable, ROOT / "scripts" / "semantic_mutants.py", "--list")
    listed = [line for line in proc.stdout.splitlines() if line.startswith("semantic line ")]
    assert (
        len(listed) == len(MUTANTS)
        and proc.stdout.splitlines()[-1] == f"0 mutants, 0 hand edits, {len(MUTANTS)} semantic mutants"
    )
    # Exit 1 only for a snippet no longer in the module (ANCHOR LOST), as mutate.py --list.
    assert proc.returncode == (1 if any(line.endswith("(error)") for line in listed) else 0), proc.stderr
