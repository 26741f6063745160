"""Finding the best settings: the sweep over loader settings, the run's timeline and its plot."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from imagenet_classification import _parse_args, _parse_sweep, _SweepPoint, _with_settings
from tests.conftest import ROOT, TINY, read_json, run_cli, run_main

FAST = [*TINY, "--no-compile", "--dtype", "float32"]


def test_sweep_specs():
    defaults = {"num-threads": 16, "batch-size": 32, "queue-size": 16}
    assert _parse_sweep(["auto"], defaults, 12)["num-threads"] == [1, 2, 4, 8, 12]
    assert _parse_sweep(["auto"], defaults, 16)["num-threads"] == [1, 2, 4, 8, 16]
    grid = _parse_sweep(["num-threads=4,1,2", "batch-size=64"], defaults, 2)
    assert grid == {"num-threads": [1, 2, 4], "batch-size": [64], "queue-size": [16]}
    for bad in ("threads=1", "num-threads=", "num-threads=0,1", "batch-size=x", "auto=1"):
        with pytest.raises(ValueError):
            _parse_sweep([bad], defaults, 2)
    for twice in (["num-threads=1", "num-threads=2"], ["auto", "num-threads=2"], ["batch-size=1", "batch-size=1"]):
        with pytest.raises(ValueError, match="is set twice"):  # not one of them silently dropped
            _parse_sweep(twice, defaults, 2)
    with pytest.raises(ValueError, match=r"num-threads is set twice; give"):  # auto named only where given
        _parse_sweep(["num-threads=1", "num-threads=2"], defaults, 2)
    with pytest.raises(ValueError, match=r"set twice \(auto sets num-threads\)"):
        _parse_sweep(["auto", "num-threads=2"], defaults, 2)


def test_the_recommended_command_keeps_the_data_and_drops_the_sweeps_own_flags(capsys, tmp_path):
    point = _SweepPoint(num_threads=1, batch_size=2, queue_size=16, loader_fps=1.0, model_fps=1.0)
    settings = ["--num-threads", "1", "--batch-size", "2", "--queue-size", "16"]
    for typed, kept in (
        ("-b 2 --sweep num-threads=1 /d", "/d"),  # DATA_DIR after a dropped flag's value, or its settings
        ("-b 2 /d --sweep num-threads=1", "/d"),
        ("/d --sweep auto batch-size=1,2 --plot p.png --results-file=r.json --skip-bad", "/d --skip-bad"),
        ("--input-flist l -j8 -b4 --sweep=auto --model m --batch-size 8", "--input-flist l --model m"),
        ("--sweep auto /d --num-threads 4 --mean -0.5 0.2 0.3", "/d --mean -0.5 0.2 0.3"),
    ):
        assert _with_settings(["python", "x.py", *typed.split()], point) == ["python", "x.py", *kept.split(), *settings]
    # A DATA_DIR whose name holds an = is the folder there, as the parser takes it: not a setting dropped.
    folder = tmp_path / "d=ata"
    folder.mkdir()
    typed = ["python", "x.py", "--sweep", "num-threads=1", str(folder)]
    assert _with_settings(typed, point) == ["python", "x.py", str(folder), *settings]
    assert _parse_args(typed[2:]).data_dir == folder
    # A flag's prefix is refused, not taken: --swee would slip past the filter into the command.
    with pytest.raises(SystemExit) as stop:
        _parse_args(["/d", "--swee", "auto"])
    assert stop.value.code == 2 and "unrecognized arguments: --swee" in capsys.readouterr().err


def test_a_data_dir_after_the_sweep_is_the_data_dir(capsys):
    # --sweep takes one or more settings: the path after them is DATA_DIR, not a setting.
    for argv in (["--sweep", "auto", "/data/val"], ["/data/val", "--sweep", "auto"]):
        args = _parse_args(argv)
        assert (args.data_dir, args.sweep) == (Path("/data/val"), ["auto"])
    args = _parse_args(["--input-flist", "val.flist", "--sweep", "auto", "/data/val"])
    assert args.sweep == ["auto", "/data/val"]  # a list was given: the path is a setting, which the sweep refuses
    for argv, words in (
        (["--sweep", "/data/val"], "--sweep needs a setting before DATA_DIR"),
        (["--sweep", "auto"], "one of the arguments DATA_DIR --input-flist --data-dir is required"),
    ):
        with pytest.raises(SystemExit) as stop:
            _parse_args(argv)
        assert stop.value.code == 2 and words in capsys.readouterr().err


def test_sweep_on_real_photos_writes_table_json_and_plot(demo_photos, tmp_path):
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    proc = run_cli("--input-flist", demo_photos, "--prefix", f"{demo_photos.parent}/", *FAST, "--sweep",
                   "num-threads=1,2", "batch-size=4,8", "--results-file", out, "--plot", plot)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = read_json(out)["sweep"]
    points = sweep["points"]
    assert [(p["num_threads"], p["batch_size"]) for p in points] == [(1, 4), (1, 8), (2, 4), (2, 8)]
    assert sweep["images_per_setting"] == 20  # every setting timed on the same images
    assert all(p["loader_fps"] > 0 and p["model_fps"] > 0 for p in points)
    bound = max(min(p["loader_fps"], p["model_fps"]) for p in points)
    key = ("num_threads", "batch_size", "queue_size")
    candidates = sorted((p for p in points if min(p["loader_fps"], p["model_fps"]) >= 0.95 * bound),
                        key=lambda p: [p[k] for k in key])  # fmt: skip
    measured = [p for p in points if p["e2e_fps"] is not None]
    assert 1 <= len(measured) <= 3 and all(p["e2e_fps"] > 0 for p in measured)
    assert all(p in candidates for p in measured)  # only candidates are run end to end
    best = sweep["recommended"]
    top = max(p["e2e_fps"] for p in measured)
    assert best in measured and best["e2e_fps"] >= 0.95 * top
    assert all(p["e2e_fps"] < 0.95 * top for p in measured if [p[k] for k in key] < [best[k] for k in key])
    assert "threads  batch  queue    loader     model  end-to-end" in proc.stdout
    flags = f"--num-threads {best['num_threads']} --batch-size {best['batch_size']} --queue-size 16"
    assert f"The smallest setting within 5% of the best: {flags}" in proc.stdout
    command = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert command[:2] == ["python", str(ROOT / "imagenet_classification.py")]  # as it was started
    assert not {"--sweep", "--plot", "--results-file"} & set(command) and " ".join(command).endswith(flags)
    for p in points:  # an end-to-end rate above the bound is flagged as noise
        row = f"{p['num_threads']:>8} {p['batch_size']:>6} {p['queue_size']:>6}"
        line = next(line for line in proc.stdout.splitlines() if line.startswith(row))
        noisy = p["e2e_fps"] is not None and p["e2e_fps"] > min(p["loader_fps"], p["model_fps"])
        assert line.endswith(" ~") and line.removesuffix(" ~").endswith(" *") == noisy  # 20 images: short windows
    assert all(p["short_window"] for p in points) and "  ~ too few batches in the list" in proc.stdout
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size[0] > 400
    # The printed command runs as printed (python being this interpreter here).
    again = subprocess.run([sys.executable, *command[1:], "--max-samples", "8"], capture_output=True, text=True,
                           timeout=300, cwd=ROOT)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "Images: listed=8 classified=8" in again.stdout


def test_a_sweep_setting_with_too_few_batches_is_marked(jpeg_set, tmp_path, capfd):
    # 60 images: 30 batches of 2 (the 10 batches one thread keeps busy and the warm-up's 2 fit, and
    # end to end 4 times the 5 its loader may hold ahead of the model: 22), 4 of 15 (its rates are
    # mostly start-up). The second is marked, in the table and in the results file.
    flist, out = tmp_path / "twice.flist", tmp_path / "s.json"
    flist.write_text(jpeg_set.read_text() * 2)
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{jpeg_set.parent}/", *FAST, "--queue-size", "1",
                    "--sweep", "num-threads=1", "batch-size=2,15", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    points = read_json(out)["sweep"]["points"]
    assert [(p["batch_size"], p["short_window"]) for p in points] == [(2, False), (15, True)]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(f"{1:>8} ")]
    assert [row.endswith(" ~") for row in rows] == [False, True]
    assert "  ~ too few batches in the list at this batch size for a steady window" in proc.stdout
    # With the default --queue-size 16 its loader may hold 20 batches ahead of the model: end to end
    # takes 82 batches (164 images), which the list has not. Timed on the loader passes' 30 batches,
    # every one could be decoded before the window opened: the model timed alone, unmarked.
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{jpeg_set.parent}/", *FAST, "--sweep",
                    "num-threads=1", "batch-size=2", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (point,) = read_json(out)["sweep"]["points"]
    assert point["e2e_fps"] is not None and point["short_window"]


def test_a_bad_image_only_the_end_to_end_pass_reads_is_counted(jpeg_set, tmp_path, capfd):
    # The loader passes read the first 24 images (12 batches of 2); end to end reads 44 (2 + 4 x 5
    # batches, --queue-size 1). Line 30 is missing: only the end-to-end pass meets it, and it was
    # skipped unsaid, the recommended command without --skip-bad, which then stopped at it.
    good = (jpeg_set.read_text().splitlines() * 2)[:59]
    flist, out = tmp_path / "late.flist", tmp_path / "s.json"
    flist.write_text("\n".join([*good[:30], "val/n01440764/missing.JPEG", *good[30:]]) + "\n")
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{jpeg_set.parent}/", *FAST, "--queue-size", "1",
                    "--sweep", "num-threads=1", "batch-size=2", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = read_json(out)["sweep"]
    assert sweep["images_per_setting"] == 24 and sweep["points"][0]["e2e_fps"] is not None
    assert [Path(f["path"]).name for f in sweep["failures"]] == ["missing.JPEG"] and sweep["failed"] == 1
    assert "--skip-bad" in shlex.split(proc.stdout.strip().splitlines()[-1])


def test_sweep_without_matplotlib_still_prints_the_table(jpeg_set, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['imagenet_classification.py', *sys.argv[1:]];"
            " import runpy; runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    args = ["--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--sweep", "num-threads=1",
            "--batch-size", "8", "--plot", tmp_path / "s.png"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "The smallest setting within 5% of the best" in proc.stdout
    assert "pip install matplotlib (or, in the checkout, pip install '.[plot]')" in proc.stderr
    assert not (tmp_path / "s.png").exists()


def test_timeline_sums_to_the_images_and_is_drawn(jpeg_set, tmp_path, capfd):
    out, plot = tmp_path / "r.json", tmp_path / "t.png"  # in this process: the run's report is checked
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--batch-size", "4",
                    "--warmup-batches", "2", "--results-file", out, "--plot", plot)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    t = result["timeline"]
    assert sum(t["images"]) == sum(t["batch_images"]) == result["classified"] == 30
    assert len(t["batch_end_s"]) == result["batches"] == 8
    assert sorted(t["batch_end_s"]) == t["batch_end_s"] and t["batch_end_s"][-1] <= t["end_s"]
    timed = sum(n for end, n in zip(t["batch_end_s"], t["batch_images"], strict=True) if end > t["warmup_end_s"])
    assert timed == result["frames_timed"] == 22
    assert t["images_per_s"] == [n / t["interval_s"] for n in t["images"]]
    assert len(t["sink_occupancy"]) == len(t["images"]) and all(0 <= v <= 1 for v in t["sink_occupancy"])
    # The window ends with the last batch; the run, when SPDL sees its end of stream (up to 0.1 s on).
    assert t["window_end_s"] == pytest.approx(t["batch_end_s"][-1], abs=1e-5) and t["window_end_s"] <= t["end_s"]
    assert result["elapsed_s"] == pytest.approx(t["window_end_s"] - t["warmup_end_s"])
    with Image.open(plot) as image:
        assert image.format == "PNG"


def test_sliding_rate_by_hand():
    from imagenet_classification import _sliding_rate

    # Batches of 4 images ending at 1, 2, 4 and 5 s: over the last 2 batches (from 0 s at first).
    assert _sliding_rate([1.0, 2.0, 4.0, 5.0], [4, 4, 4, 4], 2) == [4.0, 4.0, 8 / 3, 8 / 3]
    assert _sliding_rate([0.0, 0.5], [2, 2], 1) == [0.0, 4.0]  # no time passed: 0, not a division by zero


def test_timeline_bins_cover_the_run_like_the_queues_and_the_plot_draws(tmp_path):
    import time

    import torch

    from imagenet_classification import _bin_count, _plot_timeline, _TimingWindow

    # The last batch just before 1 s, the run ending after it: two bins, as the sink queue's
    # occupancy over the same span has (one bin fewer made plot_timeline raise).
    window = _TimingWindow(torch.device("cpu"), warmup_batches=1)
    for seconds in (0.3, 0.6):
        time.sleep(seconds)
        window.add(4)
    time.sleep(0.3)
    window.close()
    t = window.timeline()
    assert len(t["images"]) == _bin_count(t["end_s"], 1.0) == 2 and sum(t["images"]) == 8
    t["sink_occupancy"] = [1.0, 0.5]
    assert _plot_timeline(t, tmp_path / "t.png", "a title") and (tmp_path / "t.png").stat().st_size > 0
    assert (_bin_count(0.0, 1.0), _bin_count(2.0, 1.0), _bin_count(2.01, 0.5)) == (1, 2, 5)


def test_sweep_plot_reads_in_plain_numbers(tmp_path, monkeypatch):
    import imagenet_classification as ic
    from imagenet_classification import _plot_sweep, _Sweep, _SweepPoint

    points = [_SweepPoint(t, 128, 16, 190.0 * t, 47000.0) for t in (1, 2, 4, 8, 16)]
    points[-1].e2e_fps = 2950.0
    kept = []
    save = ic._save
    monkeypatch.setattr(ic, "_save", lambda fig, ax, path: (kept.append(fig), save(fig, ax, path)))  # to read it
    assert _plot_sweep(_Sweep(points, 4000), tmp_path / "s.png", "a title")
    ax = kept[0].axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["1", "2", "4", "8", "16"]
    assert ax.get_yscale() == "log" and all("^" not in label.get_text() for label in ax.get_yticklabels())
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "end to end, batch 128, queue 16" in legend and any(t.startswith("recommended") for t in legend)
    assert any("model alone, batch 128: 47,000/s" == text.get_text() for text in ax.texts)


def test_sweep_counts_the_images_it_skipped_and_recommends_skip_bad(jpeg_set, tmp_path, capfd):
    # The sweep skips bad images (each setting meets the same ones): they are counted and named,
    # and the command it recommends skips them too, or it would stop at the first.
    good = jpeg_set.read_text().splitlines()
    missing = [f"val/n01440764/missing{i}.JPEG" for i in range(3)]
    flist, out = tmp_path / "bad.flist", tmp_path / "sweep.json"
    flist.write_text("\n".join([*good[:8], *missing, *good[8:16]]) + "\n")  # 19 lines, 3 missing
    prefix = f"{jpeg_set.parent}/"
    proc = run_main(capfd, "--input-flist", flist, "--prefix", prefix, *FAST, "--sweep", "num-threads=1,2",
                    "--batch-size", "4", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = read_json(out)["sweep"]
    assert sweep["images_per_setting"] == 19 and sweep["failed"] == 3
    assert [f["path"] for f in sweep["failures"]] == [prefix + m for m in missing]
    assert all("No such file" in f["reason"] for f in sweep["failures"])
    lines = proc.stdout.splitlines()
    said = "3 listed images failed to decode and were skipped in every setting that read them (the first: "
    assert lines[-3].startswith(said + prefix + missing[0])  # under the table, above the recommendation
    command = shlex.split(lines[-1])
    assert "--skip-bad" in command and " ".join(command).endswith("--queue-size 16")  # the settings last
    again = run_main(capfd, *command[command.index("--input-flist") :])  # as printed, less the program
    assert again.returncode == 0, again.stderr
    assert "Images: listed=19 classified=16 failed=3" in again.stdout
