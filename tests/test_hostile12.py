"""Hostile input, round twelve: what a fresh sweep found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
import timm
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, run_main

# --- Arguments --------------------------------------------------------------------------------------


def test_a_second_sweep_flag_adds_its_settings_and_a_name_twice_is_refused(jpeg_set):
    # argparse kept the last --sweep alone: `--sweep num-threads=1,2 --sweep batch-size=2` swept the
    # batch size at the default 16 threads, and the thread counts asked for were dropped without a word.
    args = ic._parse_args(["--input-flist", str(jpeg_set), "--sweep", "num-threads=1,2", "--sweep", "batch-size=2"])
    assert ic._sweep_grid(args, 40)["num-threads"] == [1, 2] and ic._sweep_grid(args, 40)["batch-size"] == [2]
    args = ic._parse_args(["--input-flist", str(jpeg_set), "--sweep", "num-threads=1", "--sweep", "num-threads=2"])
    with pytest.raises(ic.InputError, match="num-threads is set twice"):
        ic._sweep_grid(args, 40)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--batch", "8"], "unrecognized arguments: --batch (did you mean --batch-size or --warmup-batches?)"),
        (["--swee", "auto"], "unrecognized arguments: --swee (did you mean --sweep?)"),
        (["--batch=8"], "unrecognized arguments: --batch (did you mean --batch-size"),
        (["-z", "3"], "unrecognized arguments: -z"),
    ],
)
def test_a_mistyped_flag_is_named_not_its_value_taken_for_a_data_folder(jpeg_set, capsys, words, said):
    # timm's --batch (or --warmup) with a value was "argument DATA_DIR: not allowed with argument
    # --data-dir": the value was taken for a data folder, and the mistyped flag named nowhere.
    with pytest.raises(SystemExit) as stopped:
        ic._parse_args(["--data-dir", str(jpeg_set.parent), *words])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"error: {said}" in err and "DATA_DIR" not in err.splitlines()[-1]
    ic._parse_args(["--input-flist", str(jpeg_set), "-b8", "--mean", "0.5", "0.5", "0.5", "--prefix=-x"])


# --- Checkpoints ------------------------------------------------------------------------------------


def _state() -> dict:
    return timm.create_model("test_efficientnet", pretrained=False).state_dict()


def _loads(path) -> dict:
    return ic.get_model("test_efficientnet", "cpu", checkpoint=path, compile=False, dtype="float32").model.state_dict()


def test_checkpoints_torch_and_timm_load_are_loaded(tmp_path):
    # Without BatchNorm's num_batches_tracked (torchvision's classic weights, TF ports, conversions) a
    # checkpoint was refused as lacking it; torch's own strict load fills it in. A training run's EMA
    # weights saved alone were refused as "'state_dict_ema' is a OrderedDict".
    from safetensors.torch import save_file

    state = _state()
    weights = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    torch.save(weights, tmp_path / "no_count.pth")
    save_file(weights, tmp_path / "no_count.safetensors")
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    torch.save({"state_dict_ema": ema, "epoch": 3}, tmp_path / "ema.pth")
    for name, expected in (("no_count.pth", weights), ("no_count.safetensors", weights), ("ema.pth", ema)):
        loaded = _loads(tmp_path / name)
        assert all(torch.equal(loaded[k], v) for k, v in expected.items()), name


def test_checkpoints_that_would_load_wrong_or_misadvise_are_refused_in_one_line(tmp_path):
    # int8 or complex weights were cast into the float model without a word (complex with torch's
    # warning): wrong accuracy. A tar or zero-filled file relayed torch's advice to set
    # weights_only=False, which runs the file's code. A file named as the other format said
    # "not a PyTorch checkpoint" of torch.save's own archive.
    from safetensors.torch import save_file

    state = _state()
    torch.save({k: v.to(torch.int8) if v.is_floating_point() else v for k, v in state.items()}, tmp_path / "q.pth")
    torch.save({k: v.to(torch.complex64) if v.is_floating_point() else v for k, v in state.items()}, tmp_path / "c.pth")
    (tmp_path / "zeros.pth").write_bytes(bytes(4096))
    torch.save(state, tmp_path / "torch.safetensors")
    save_file(state, tmp_path / "st.pth")
    expected = {
        "q.pth": r"'conv_stem.weight' is int8, not floating point",
        "c.pth": r"'conv_stem.weight' is complex64, not floating point",
        "zeros.pth": r"cannot load checkpoint \(not a PyTorch checkpoint \(RuntimeError: Cannot use weights_only=True",
        "torch.safetensors": r"it is torch.save's format, named .safetensors: rename it",
        "st.pth": r"it is a safetensors file: name it .safetensors",
    }
    for name, message in expected.items():
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with pytest.raises(ic.InputError, match=message) as refused:
                _loads(tmp_path / name)
        assert refused.value.flag == "--checkpoint" and "False" not in str(refused.value), name
        assert not [w for w in said if "complex" in str(w.message)], name


# --- The evaluation transform -----------------------------------------------------------------------


def test_the_transform_is_the_test_time_one_timm_validates_with(caplog):
    # A config's test_input_size and test_crop_pct were ignored: convnext_tiny.fb_in1k ran at 224
    # and 0.875 where timm's validate.py (whose column names the results use) evaluates at 288 and 1.0.
    import timm.data

    with caplog.at_level("INFO", logger="imagenet_classification"):
        t = ic.EvalTransform.from_model("convnext_tiny.fb_in1k")
    cfg = timm.data.resolve_data_config(
        {}, pretrained_cfg=ic._pretrained_config("convnext_tiny.fb_in1k"), use_test_size=True
    )
    assert (t.size, t.crop_pct) == (cfg["input_size"][-1], cfg["crop_pct"]) == (288, 1.0)
    assert "test_input_size and test_crop_pct, as timm's validate.py evaluates" in caplog.text
    assert ic.EvalTransform.from_model("convnext_tiny.fb_in1k", {"img_size": 224, "crop_pct": 0.875}).size == 224
    assert ic.EvalTransform.from_model("test_mambaout").size == 192
    caplog.clear()
    with caplog.at_level("INFO", logger="imagenet_classification"):
        assert ic.EvalTransform.from_model("test_efficientnet").size == 160  # it has no test size: nothing said
    assert "validate.py" not in caplog.text


# --- Models -----------------------------------------------------------------------------------------


def _local_dir(root, architecture: str, **model_args) -> str:
    root.mkdir()
    config = {"input_size": [3, 160, 160], "crop_pct": 0.95, "num_classes": 1000}
    config = {"architecture": architecture, "num_classes": 1000, "model_args": model_args, "pretrained_cfg": config}
    (root / "config.json").write_text(json.dumps(config))
    return f"local-dir:{root}"


def test_a_model_that_cannot_be_built_or_takes_no_rgb_image_is_refused_before_the_run(tmp_path):
    # With --no-pretrained, a config naming no architecture timm has was "cannot load its pretrained
    # weights …; pass --no-pretrained": the flag given. A 1-channel model ran, then failed on its first batch.
    with pytest.raises(ic.InputError, match=r"cannot build it \(RuntimeError: Unknown model \(bogus_net\)\)$"):
        ic.get_model(_local_dir(tmp_path / "bogus", "bogus_net"), "cpu", pretrained=False)
    with pytest.raises(ic.InputError, match=r"takes 1-channel images, not RGB \(3 channels\)") as refused:
        ic.get_model(_local_dir(tmp_path / "gray", "test_efficientnet", in_chans=1), "cpu", pretrained=False)
    assert refused.value.flag == "--model"
    ic.get_model(_local_dir(tmp_path / "rgb", "test_efficientnet"), "cpu", pretrained=False)


def test_get_model_compiles_on_a_gpu_only_unless_asked_as_the_command_line():
    # get_model(name, "cpu") compiled: minutes and a C++ compiler on the CPU, where README (and the
    # command line) say compile is off unless asked for.
    bundle = ic.get_model("test_efficientnet", "cpu", pretrained=False, batch_size=8)
    assert not isinstance(bundle.model, torch._dynamo.eval_frame.OptimizedModule) and bundle.batch_size is None
    asked = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=True, batch_size=8)
    assert isinstance(asked.model, torch._dynamo.eval_frame.OptimizedModule) and asked.batch_size == 8


def test_a_notebook_model_of_another_class_count_is_warned_of_and_its_predictions_kept():
    # A bundle whose model gives 2000 classes lost the whole result to an IndexError when the
    # predictions named a class above 999; a 10-class one was counted against ImageNet's labels silently.
    transform = ic.EvalTransform(size=8)

    class Linear(torch.nn.Module):
        def __init__(self, classes: int) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, classes)

        def forward(self, x):
            return self.linear(x.mean((2, 3)))

    images = torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.tensor([[0], [1], [2], [999]])
    for classes in (2000, 10):
        torch.manual_seed(0)
        preprocessing = ic.Preprocessing(transform.mean, transform.std)
        bundle = ic.ModelBundle(preprocessing, Linear(classes).eval(), ic.Classification(), torch.float32, transform)
        with pytest.warns(UserWarning, match=f"the model gives {classes} classes, not ImageNet-1k's 1000"):
            result = ic.benchmark([(images, labels)], bundle, warmup_batches=0, predictions=True)
        assert result.classified == 4 and len(result.predictions) == 4
        for row in result.predictions:
            assert [name is None for name in row["top5_names"]] == [top > 999 for top in row["top5"]]


# --- Page cache -------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="takes another user's identity: root")
def test_the_page_cache_share_of_files_neither_ours_nor_writable_is_unknown_not_all(tmp_path):
    # Linux's mincore says every page of such a file is in memory (a shared, read-only ImageNet):
    # the summary said 100% in memory before the run, and after eviction warned it had no effect.
    shared = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        shared.chmod(0o755)
        path = shared / "root.JPEG"
        path.write_bytes(os.urandom(1 << 16))
        path.chmod(0o644)
        os.seteuid(65534)  # nobody: may read the file, not write it
        try:
            cache = ic._examine_page_cache([str(path)], evict=True)
        finally:
            os.seteuid(0)
        assert (cache.files, cache.bytes, cache.resident_bytes, cache.resident_after_bytes) == (1, 1 << 16, None, None)
        assert "is unknown" in ic._page_cache_lines(cache)[0]
        assert ic._examine_page_cache([str(path)]).resident_bytes is not None  # the owner's is known
    finally:
        shutil.rmtree(shared)


def test_a_file_over_the_size_limit_is_not_examined_for_the_page_cache(tmp_path):
    # An 8 TB sparse file took 52 s and 7 GB of memory to examine, for an image the run refuses
    # unread, and the summary said "0.0% of the listed 8796.09 GB was in memory".
    huge = tmp_path / "huge.JPEG"
    with open(huge, "wb") as f:
        f.truncate(1 << 40)
    small = tmp_path / "small.JPEG"
    small.write_bytes(b"x" * 1000)
    cache = ic._examine_page_cache([str(huge), str(small)], max_bytes=64 << 20)
    assert (cache.files, cache.skipped, cache.bytes) == (1, 1, 1000)


# --- Reading alone ----------------------------------------------------------------------------------


def test_reading_alone_is_timed_by_when_the_reads_ended_not_when_they_were_handed_on():
    # The pool reads on while the measuring thread waits (for the GIL, on 2 busy cores): batches read
    # before the window opened were handed on in a burst inside it, 370,000 to 1.8 M images/s where
    # sequential reads of the same files top out at 58,000.
    read_at = [10.0, 10.1, 10.2, 10.3, 10.4]  # handed on all at once, long after
    fps, mb_s = ic._measure_reads([(4, 4_000, t) for t in read_at], warmup_batches=2)
    assert fps == pytest.approx(12 / 0.3) and mb_s == pytest.approx(0.012 / 0.3)  # 3 batches after 10.1


# --- Worker processes -------------------------------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)  # a zombie: ended
    except FileNotFoundError:
        return True


def test_a_decode_worker_ends_when_its_main_process_is_killed(tmp_path):
    # kill -9 of the main process (or the OOM killer) left both --decode-processes workers alive 11
    # minutes later with 790 MB each, and `… | cat` never ended: they held its pipe.
    script = tmp_path / "main.py"
    script.write_text(
        "import concurrent.futures, multiprocessing, os, time\n"
        "import imagenet_classification as ic\n"
        "if __name__ == '__main__':\n"
        "    spawn = multiprocessing.get_context('spawn')\n"
        "    pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn, initializer=ic._decode_worker_init)\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    main = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        worker = int(main.stdout.readline())
        assert not _gone(worker)
        main.kill()
        main.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(worker), "the worker outlived its main process"
    finally:
        main.kill()
        if "worker" in locals() and not _gone(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.parametrize("flag", ["--results-file", "--predictions-file", "--plot", "--trace"])
def test_an_output_under_a_file_or_a_loop_of_links_names_its_flag(tmp_path, flag):
    # "error: afile/x.png: Not a directory": the flag was lost to the generic handler.
    (tmp_path / "afile").touch()
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for path, reason in ((tmp_path / "afile" / "x.png", "Not a directory"), (tmp_path / "loop1" / "x.png", "links")):
        with pytest.raises(ic.InputError, match=f"^{flag} {path}: .*{reason}"):
            ic._check_output_path(flag, path)


@pytest.mark.parametrize("labels", ["/dev/stdin", "/proc/self/fd/0"])
def test_a_list_and_labels_both_from_stdin_are_refused_whatever_stdin_is_called(jpeg_set, labels):
    # Only "- -" was refused: --labels /dev/stdin read the list's own lines as labels, and the
    # error then blamed line 1 of the labels.
    stdin = subprocess.run(
        [sys.executable, "-m", "imagenet_classification", "--input-flist", "-", "--labels", labels, "--no-pretrained"],
        input=jpeg_set.read_text(), capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert stdin.returncode == 2, stdin.stderr
    assert f"error: --input-flist - and --labels {labels} cannot both read stdin" in stdin.stderr
    assert not ic._reads_stdin(jpeg_set) and ic._reads_stdin(Path("-")) and not ic._reads_stdin(None)


# --- What the results say ---------------------------------------------------------------------------


def test_the_dataloaders_images_are_counted_as_pils_without_the_fallback_line(jpeg_set, tmp_path, capfd):
    # --loader torch wrote decoder_backends {}: every image was decoded by PIL, and nothing said by what.
    results = tmp_path / "r.json"
    run = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "-b", "10",
                   "--loader", "torch", "-j", "1", "--max-samples", "20", "--results-file", results)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(results.read_text())["decoder_backends"] == {"pil": 20}
    assert "decoded by PIL" not in run.stdout  # the fallback line is the FFmpeg path's


def test_a_used_up_iterator_is_said_without_a_warm_up_too():
    # benchmark(iterator_used_up, model, warmup_batches=0) gave classified=0, fps=0.0 and no word.
    bundle = ic.get_model("test_efficientnet", "cpu", pretrained=False, transform=ic.EvalTransform(size=32))
    used = iter([(torch.zeros((2, 3, 32, 32), dtype=torch.uint8), torch.zeros((2, 1), dtype=torch.int64))])
    ic.benchmark(used, bundle, warmup_batches=0)
    with pytest.warns(ic.WarmupIncluded, match=r"the loader yielded none \(an iterator used up already\?\)"):
        result = ic.benchmark(used, bundle, warmup_batches=0)
    assert result.classified == 0


# --- The class table --------------------------------------------------------------------------------


@pytest.mark.parametrize("edit", ["swap", "duplicate", "not_an_id"])
def test_a_class_table_whose_ids_are_out_of_order_or_repeated_is_refused(tmp_path, edit):
    # Two swapped WordNet IDs (rows 281 and 282) were taken: both classes mislabelled, silently. A
    # repeated one remapped its class, and the error that followed blamed the file list.
    rows = (ROOT / "imagenet_class.tsv").read_text(encoding="utf-8").splitlines()
    fields = [row.split("\t") for row in rows]
    if edit == "swap":
        fields[281][1], fields[282][1] = fields[282][1], fields[281][1]
    elif edit == "duplicate":
        fields[282][1] = fields[281][1]
    else:
        fields[5][1] = "n0144076"
    shutil.copy(ROOT / "imagenet_classification.py", tmp_path)
    (tmp_path / "imagenet_class.tsv").write_text("\n".join("\t".join(f) for f in fields) + "\n", encoding="utf-8")
    code = "import imagenet_classification as ic\ntry:\n    ic.get_mappings()\nexcept ic.InputError as e:\n    print(e)"
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "its WordNet IDs are not 1000 distinct IDs (n and 8 digits) in order" in run.stdout, run.stderr


def test_an_hf_hub_model_with_the_hub_out_of_reach_is_one_line_at_once(jpeg_set, tmp_path):
    # hf-hub:… names went past the one-connection check: 30 s of huggingface_hub's retries, each
    # printed twice, then a LocalEntryNotFoundError paragraph.
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    cmd = [sys.executable, "-m", "imagenet_classification", "--input-flist", str(jpeg_set), "--prefix",
           f"{jpeg_set.parent}/", "--no-pretrained",
           "-m", "hf-hub:timm/test_efficientnet.r160_in1k"]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        "error: --model: hf-hub:timm/test_efficientnet.r160_in1k: cannot read its config (the model hub is out of "
        "reach (127.0.0.1: Connection refused), and it is not in its cache)"
    ]


# --- Signals ----------------------------------------------------------------------------------------


def test_runs_in_two_threads_leave_no_held_signal_behind_for_the_next_run():
    # Two benchmark calls at once left stale lists on one shared stack (each popped its list only if
    # it was the last): a later run's Ctrl-C was held in one of them, and the run went on to exit 0.
    def count_batches() -> None:
        for _ in range(200):
            with ic._uninterrupted():
                time.sleep(0.0005)

    threads = [threading.Thread(target=count_batches) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    handlers = {s: signal.getsignal(s) for s in ic._SIGNALS}
    try:
        with pytest.raises(ic.RunInterrupted):
            ic._interrupt(signal.SIGINT, None)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def test_the_predictions_rank_as_the_counts_do_when_probabilities_underflow():
    # The rows ranked the softmax, the counts the logits: with a gap of 300 every probability but one
    # is 0, and the rows' top 5 were arbitrary zeros: top5_correct 4, the rows' correct5 summing to 0.
    transform = ic.EvalTransform(size=8)

    class Peaked(torch.nn.Module):
        def forward(self, x):
            logits = torch.full((x.shape[0], 1000), -300.0)
            logits[:, 7], logits[:, 900] = 200.0, 0.0
            return logits + 0 * x.mean()

    bundle = ic.ModelBundle(ic.Preprocessing(transform.mean, transform.std), Peaked().eval(), ic.Classification(),
                            torch.float32, transform)  # fmt: skip
    images = torch.zeros((4, 3, 8, 8), dtype=torch.uint8)
    result = ic.benchmark([(images, torch.full((4, 1), 900))], bundle, warmup_batches=0, predictions=True)
    assert result.top5_correct == 4 == sum(row["correct5"] for row in result.predictions)
    assert all(row["top5"][:2] == [7, 900] for row in result.predictions)


# --- main() in a notebook ---------------------------------------------------------------------------


def test_main_in_a_notebook_puts_back_its_logging_and_warnings_and_runs_in_a_thread(jpeg_set, tmp_path):
    # main() closed the notebook's log file (basicConfig(force=True)), left the root logger at INFO with
    # its own handler, and kept its filter hiding benchmark's WarmupIncluded warnings for good. Called
    # from a thread, it raised "signal only works in main thread" without running.
    log = tmp_path / "mine.log"
    code = f"""
import logging, threading, warnings
import imagenet_classification as ic
logging.basicConfig(filename={str(log)!r}, level=logging.WARNING)
args = ["--input-flist", {str(jpeg_set)!r}, "--prefix", {f"{jpeg_set.parent}/"!r}, "--max-samples", "8",
        "--model", "test_efficientnet", "--no-pretrained", "--device", "cpu", "-j", "2", "--img-size", "32"]
filters = list(warnings.filters)
assert ic.main(args) == 0
assert warnings.filters == filters, "filters changed"
root = logging.getLogger()
assert root.level == logging.WARNING and [type(h).__name__ for h in root.handlers] == ["FileHandler"]
logging.getLogger("mine").warning("still written")
status = []
thread = threading.Thread(target=lambda: status.append(ic.main(args)))
thread.start()
thread.join()
print("statuses", status)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "statuses [0]" in run.stdout, run.stderr[-3000:]
    assert "still written" in log.read_text()
