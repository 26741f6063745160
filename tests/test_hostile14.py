"""Hostile input, round fourteen: the error branches a coverage run found no test reaching (2026-12-06).
Each is a message a user may meet: reached here with real files, real subprocesses of the command line
(where it reaches the branch) and real SPDL, torch and timm; each asserts one line that names the file
or the flag, no traceback, and the documented exit status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set

FAST = [*TINY, "--no-compile"]
# What a clone of a Hugging Face repository without git-lfs holds in place of each weights file.
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 5566176\n"


def _cli(*args, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The command line in a subprocess, outside torchrun (whatever the environment running the tests)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, str(ROOT / "imagenet_classification.py"), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**environ, **(env or {})},
    )  # fmt: skip


def _error_line(proc: subprocess.CompletedProcess, status: int) -> str:
    """The run's one ``error:`` line, after checking the exit status and that no traceback was printed."""
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A file list of 8 JPEGs (prefix: its folder), photo-sized: a batch takes milliseconds to decode."""
    return make_jpeg_set(tmp_path_factory.mktemp("h14"), 8)


def _inputs(flist: Path) -> list[str]:
    return ["--input-flist", str(flist), "--prefix", f"{flist.parent}/"]


# --- Lists and labels (_rows, _list_rows) -----------------------------------------------------------


@pytest.mark.parametrize("flag", ["--input-flist", "--labels"])
def test_a_list_or_labels_file_that_is_a_folder_is_named(dataset, flag):
    folder = dataset.parent / "val"
    args = ["--input-flist", folder] if flag == "--input-flist" else [*_inputs(dataset), "--labels", folder]
    proc = _cli(*args, *FAST)
    images = " (a folder of images: --data-dir, or scan_folder)" if flag == "--input-flist" else ""
    assert _error_line(proc, ic.EXIT_USAGE) == f"error: {folder}: is a folder, not a file{images}"


def test_the_notebooks_readers_name_a_folder_given_for_a_file(dataset):
    folder = dataset.parent / "val"
    hint = " (a folder of images: --data-dir, or scan_folder)"
    for read, images in ((ic.read_file_list, hint), (ic.read_labels, "")):
        with pytest.raises(ic.InputError) as refused:
            read(folder)
        assert str(refused.value) == f"{folder}: is a folder, not a file{images}"


def test_labels_by_name_with_a_list_that_has_a_label_column_are_refused_naming_the_line(dataset):
    labelled = dataset.parent / "labelled.flist"  # Caffe's val.txt: a label column after each path
    labelled.write_text("".join(f"{line} 0\n" for line in dataset.read_text().splitlines()))
    labels = dataset.parent / "labels.txt"
    labels.write_text("".join(f"{Path(line).stem} 0\n" for line in dataset.read_text().splitlines()))
    proc = _cli(*_inputs(labelled), "--labels", labels, *FAST)
    line = _error_line(proc, ic.EXIT_USAGE)
    assert line == f"error: {labelled}:1: has a label column; labels by file name are for lists without one"


# --- Outputs and the sweep (_check_files, _sweep_command) -------------------------------------------


def test_a_plot_not_named_png_is_refused_before_the_run(dataset):
    plot = dataset.parent / "timeline.jpg"
    proc = _cli(*_inputs(dataset), *FAST, "--plot", plot)
    assert _error_line(proc, ic.EXIT_USAGE) == f"error: --plot {plot}: the name must end in .png"
    assert not plot.exists() and proc.stdout == ""  # refused before any run


def test_a_sweep_stopped_before_its_first_setting_says_why_its_plot_is_not_drawn(dataset):
    pytest.importorskip("matplotlib")
    plot, results = dataset.parent / "sweep.png", dataset.parent / "sweep.json"
    # No batch of 4 photo-sized JPEGs is decoded within 1 ms: the first setting stalls.
    sweep = ["--sweep", "num-threads=1", "batch-size=4", "--timeout", "0.001"]
    proc = _cli(*_inputs(dataset), *FAST, *sweep, "--plot", plot, "--results-file", results)
    line = _error_line(proc, ic.EXIT_STALLED)
    assert line.startswith("error: no batch for 0.001 s (--timeout)") and line.endswith("(PARTIAL SWEEP)")
    assert f"note: {plot} not drawn: the sweep stopped before its first setting" in proc.stderr.splitlines()
    assert not plot.exists()
    written = json.loads(results.read_text())["sweep"]
    assert (written["points"], written["partial"], written["recommended"]) == ([], True, None)


# --- Checkpoints (_unreadable, _load_checkpoint) -----------------------------------------------------


def _odd_checkpoint(folder: Path, kind: str) -> Path:
    path = folder / f"{kind}.pth"
    if kind == "url":  # the weights' address saved in their place: unpickling fails with a bare KeyError
        path.write_text("https://huggingface.co/timm/test_efficientnet.r160_in1k/resolve/main/model.pth\n")
    elif kind == "three-letters":  # unpickled, text fails with any error: here an IndexError (pop from empty list)
        path.write_bytes(b"abc")
    elif kind == "lfs-pointer":  # git-lfs's text in place of the file: unpickling refuses it
        path.write_bytes(LFS_POINTER)
    else:  # a tensor saved alone, not a state dict
        torch.save(torch.zeros(3), path)
    return path


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("url", "not a PyTorch checkpoint (neither torch.save's archive nor a pickle)"),
        ("three-letters", "not a PyTorch checkpoint (neither torch.save's archive nor a pickle)"),
        ("lfs-pointer", "not a PyTorch checkpoint (neither torch.save's archive nor a pickle of tensors)"),
        ("tensor", "not a state dict ('Tensor' object has no attribute 'items')"),
    ],
)
def test_a_checkpoint_that_is_no_state_dict_is_named_with_what_it_is(tmp_path, kind, reason):
    checkpoint = _odd_checkpoint(tmp_path, kind)
    with pytest.raises(ic.InputError) as refused:
        ic.get_model("test_efficientnet", "cpu", pretrained=False, checkpoint=checkpoint)
    assert str(refused.value) == f"{checkpoint}: cannot load checkpoint ({reason})"
    assert refused.value.flag == "--checkpoint"


def test_a_checkpoint_that_is_no_pytorch_file_is_one_line_on_the_command_line(dataset, tmp_path):
    checkpoint = _odd_checkpoint(tmp_path, "url")
    proc = _cli(*_inputs(dataset), *FAST, "--checkpoint", checkpoint)
    reason = "not a PyTorch checkpoint (neither torch.save's archive nor a pickle)"
    assert _error_line(proc, ic.EXIT_USAGE) == f"error: --checkpoint: {checkpoint}: cannot load checkpoint ({reason})"


def test_a_checkpoint_with_keys_the_model_lacks_counts_them_and_names_the_first(dataset, tmp_path):
    import timm

    state = timm.create_model("test_efficientnet").state_dict()
    state["head.extra.weight"], state["head.extra.bias"] = torch.zeros(2, 2), torch.zeros(2)
    checkpoint = tmp_path / "extra.pth"
    torch.save(state, checkpoint)
    proc = _cli(*_inputs(dataset), *FAST, "--checkpoint", checkpoint)
    line = _error_line(proc, ic.EXIT_USAGE)
    assert (
        line == f"error: --checkpoint: {checkpoint}: checkpoint has 2 key(s) the model lacks, first 'head.extra.weight'"
    )


# --- Loaders that stall or fail (_read_batches, _torch_loader_batches, _loader_failed) --------------


def test_reading_alone_with_no_batch_read_in_time_stops_naming_the_time_out(tmp_path):
    # --breakdown's reading-alone pass reads the files the run and the loader-alone pass read first,
    # under the same --timeout, and reading is part of decoding: from the command line it cannot
    # stall alone. A real file too large to read in 1 ms (sparse: it takes no disk).
    big = tmp_path / "big.JPEG"
    with open(big, "wb") as f:
        f.truncate(256 << 20)
    reads = ic._read_batches([(str(big), 0)], 1, 1, 512 << 20, 0.001)
    with pytest.raises(ic.RunStopped) as stopped:
        list(reads)
    assert stopped.value.kind == "loader"
    assert str(stopped.value) == "reading alone: no batch read within 0.001 s (--timeout)"


def test_a_dataloader_with_no_batch_in_time_is_a_stall_not_a_traceback(dataset, tmp_path):
    # No worker's first batch (an interpreter started, torch imported) comes within 1 ms.
    results = tmp_path / "r.json"
    proc = _cli(*_inputs(dataset), *FAST, "--loader", "torch", "--timeout", "0.001", "--results-file", results)
    assert _error_line(proc, ic.EXIT_STALLED) == "error: no batch for 0.001 s (--timeout) from the DataLoader's workers"
    result = json.loads(results.read_text())
    assert (result["partial"], result["classified"], result["not_reached"]) == (True, 0, 8)


def test_an_error_decoding_an_item_names_the_item(dataset):
    # A notebook's list read with pandas has NaN where a path is blank: no ImageDecodeError (no file
    # was read), so the policy does not skip it; the pipeline stops, naming the item and the error.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False)
    policy = ic.BadImagePolicy(skip=True)
    decode = ic.get_decode_func("cpu", model.transform, policy=policy)
    good = str(dataset.parent / dataset.read_text().splitlines()[0])
    pipeline = ic.get_pipeline([(good, 0), (float("nan"), 0)], 1, decode, concurrency=1, buffer_size=2, num_threads=1)
    with pytest.raises(ic.RunStopped) as stopped, pipeline.auto_stop():
        ic.benchmark(pipeline.get_iterator(timeout=60), model, listed=2, policy=policy, warmup_batches=0)
    assert stopped.value.kind == "loader" and stopped.value.result is not None
    message = str(stopped.value)
    assert message.startswith("the loading pipeline failed on nan: TypeError: ") and "float" in message
    assert "\n" not in message


# --- Device and model (_resolve_device, _create_timm_model) ------------------------------------------


def test_a_device_that_is_no_device_is_named_on_the_command_line_and_in_a_notebook(dataset):
    proc = _cli(*_inputs(dataset), *FAST, "--device", "foo")
    assert _error_line(proc, ic.EXIT_USAGE) == "error: --device: 'foo' is not a device (use auto, cpu, cuda or cuda:N)"
    with pytest.raises(ic.InputError, match=r"^'foo' is not a device \(use auto, cpu, cuda or cuda:N\)$") as refused:
        ic.get_model("test_efficientnet", "foo", pretrained=False)
    assert refused.value.flag == "--device"


def _local_dir(root: Path, weights: str) -> Path:
    """A timm local-dir: model (test_efficientnet) whose weights file ``weights`` holds a git-lfs pointer."""
    root.mkdir()
    cfg = {"input_size": [3, 160, 160], "crop_pct": 0.95, "num_classes": 1000}
    config = {"architecture": "test_efficientnet", "num_classes": 1000, "pretrained_cfg": cfg}
    (root / "config.json").write_text(json.dumps(config))
    (root / weights).write_bytes(LFS_POINTER)
    return root


def test_pretrained_weights_that_cannot_be_loaded_are_named_with_the_way_out(dataset, tmp_path):
    folder = _local_dir(tmp_path / "model", "model.safetensors")
    proc = _cli(*_inputs(dataset), *FAST[3:], "--model", f"local-dir:{folder}", env={"HF_HUB_OFFLINE": "1"})
    line = _error_line(proc, ic.EXIT_USAGE)
    assert line.startswith(f"error: --model: local-dir:{folder}: cannot load its pretrained weights (SafetensorError: ")
    assert line.endswith("); pass --checkpoint PATH for local weights, or --no-pretrained for random ones")


def test_pretrained_weights_that_are_no_pickle_are_not_said_to_need_weights_only_false(tmp_path):
    # The same file given as --checkpoint is "not a PyTorch checkpoint (…)"; as a local-dir model's
    # pytorch_model.bin the message claimed it held pickled globals (it is text) and advised
    # weights_only=False, which runs a file's code, the advice _unreadable keeps from --checkpoint.
    folder = _local_dir(tmp_path / "model", "pytorch_model.bin")
    with pytest.raises(ic.InputError) as refused:
        ic.get_model(f"local-dir:{folder}", "cpu")
    message = str(refused.value)
    assert message.startswith(f"local-dir:{folder}: cannot load its pretrained weights (")
    assert "weights_only=False" not in message and "pickle globals" not in message
    assert "not a PyTorch checkpoint" in message


# --- torchrun's environment (_shard_from_env) ---------------------------------------------------------


@pytest.mark.parametrize("env", [{"RANK": "abc"}, {"RANK": "0", "WORLD_SIZE": "2.0", "LOCAL_RANK": "0"}])
def test_a_rank_or_world_size_that_is_no_whole_number_is_refused(dataset, env):
    proc = _cli(*_inputs(dataset), *FAST, env=env)
    line = _error_line(proc, ic.EXIT_USAGE)
    given = ", ".join(f"{k}={v!r}" for k, v in env.items())  # the values given, so that the wrong one shows
    assert line == f"error: RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (torchrun sets them): {given}"


# --- The entry point's last resort (entrypoint) -------------------------------------------------------


def test_an_unexpected_error_is_one_line_after_its_traceback_with_status_1():
    # A notebook's entrypoint(argv) with a number in argv: main's TypeError, on entrypoint's bug path.
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import imagenet_classification as ic; "
    code += "ic.entrypoint(['--batch-size', 8])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == ic.EXIT_FAILED, proc.stderr
    assert "Traceback" in proc.stderr  # the bug's report keeps where it happened
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: unexpected ") and last.endswith(" (a bug; the traceback above says where)")


def test_main_takes_a_path_in_argv_or_refuses_it_by_name(dataset, capfd):
    # README: an argument of the wrong kind is a TypeError naming it. subprocess.run takes Paths in
    # its argv; main(["--input-flist", Path(...)]) was "'PosixPath' object has no attribute 'startswith'".
    argv = ["--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--max-samples", "2"]
    assert ic.main(argv) == 0, capfd.readouterr().err
    for wrong in ("--help", ["--batch-size", 8]):  # a whole line was split into its characters
        with pytest.raises(TypeError, match=r"^argv=.*expected a list of the command line's words"):
            ic.main(wrong)


# --- Arguments of the wrong kind in a notebook (a sweep of every public name) ------------------------


@pytest.fixture(scope="module")
def tiny():
    return ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)


def test_batches_of_no_tensors_are_type_errors_naming_them(tiny):
    # A list for the images met an AttributeError ('list' object has no attribute 'shape') mid-loop;
    # measure_loader took a string's letters for batches and a dict's keys for images.
    labels = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"^a batch's images=\[1, 2\]: expected a tensor"):
        ic.benchmark([([1, 2], labels)], tiny, warmup_batches=0)
    for batches in ("abc", [{"a": 1}], [([1, 2], labels)]):
        with pytest.raises(TypeError, match=r"^a batch"):
            ic.measure_loader(batches, "cpu", 0)
    with pytest.raises(TypeError, match=r"^images=\[1, 2\]: expected a uint8 tensor"):
        tiny.logits([1, 2])
    with pytest.raises(ValueError, match=r"^logits of shape \(1000,\): expected N x C"):
        ic.Classification()(torch.zeros(1000), torch.zeros(1, dtype=torch.int64))


def test_numpy_counts_are_taken_and_written_as_json(tiny):
    import numpy as np

    images, labels = torch.zeros(2, 3, 160, 160, dtype=torch.uint8), torch.tensor([[3], [4]])
    with pytest.warns(ic.WarmupIncluded):
        result = ic.benchmark([(images, labels)], tiny, listed=np.int64(2), loader_lead=np.int64(1), warmup_batches=1)
    assert json.loads(json.dumps(result.to_dict()))["listed"] == 2  # int64: not JSON serializable


def test_the_bundle_and_its_settings_refuse_the_wrong_kind_where_given(tiny):
    parts = (tiny.preprocessing, tiny.model, tiny.classification)
    with pytest.raises(TypeError, match=r"^model='resnet50': expected a torch.nn.Module"):
        ic.ModelBundle(parts[0], "resnet50", parts[2], torch.float32, tiny.transform)
    for size in (-1, 1.5, True):  # each would pad to nothing, or fail in new_zeros mid-run
        with pytest.raises(ValueError, match=r"^batch_size="):
            ic.ModelBundle(*parts, torch.float32, tiny.transform, batch_size=size)
    with pytest.raises(TypeError, match=r"^use_bf16='no': expected True, False or None"):  # "no" gave bfloat16
        ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, use_bf16="no")
    with pytest.raises(TypeError, match=r"^dtype=\[1, 2\]"):
        ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype=[1, 2])
    with pytest.raises(TypeError, match=r"^stats=True"):
        ic.get_pipeline([("a.JPEG", 0)], 1, lambda items: items, 1, 1, 1, stats=True)


def test_transform_values_of_the_wrong_kind_are_refused_not_coerced(tiny):
    # img_size=True was a 1-pixel transform, crop_pct=True 1.0; a mean of 0.5 timm's TypeError.
    for overrides in ({"img_size": True}, {"crop_pct": True}):
        with pytest.raises(ValueError, match=r"True and False are no sizes"):
            ic.EvalTransform.from_model(tiny, overrides)
    with pytest.raises(ValueError, match=r"^transform overrides \{'mean': 0.5\}: not values timm takes"):
        ic.EvalTransform.from_model(tiny, {"mean": 0.5})
    with pytest.raises(ValueError, match=r"its interpolation \[1, 2\] is not one of"):  # was: unhashable type
        ic.EvalTransform(interpolation=[1, 2])
    for width in (float("nan"), float("inf"), True, 0):  # nan and inf failed in int(), True was 1 pixel
        with pytest.raises(ValueError, match=r"^invalid image size"):
            tiny.transform.geometry(width, 100)


def test_counts_and_lists_of_the_notebook_readers_are_checked(dataset):
    images = ic.read_file_list(dataset, prefix=f"{dataset.parent}/", max_samples=10**30)  # was: islice's ValueError
    assert len(images) == 8
    for count in (-1, 1.5, True):  # -1 took all but the last
        with pytest.raises(ValueError, match=r"^count="):
            images.head(count)
    policy = ic.BadImagePolicy(skip=True, max_bad_percent=10)
    for listed in (-1, True, float("inf")):  # -1 allowed -1 bad images, inf overflowed
        with pytest.raises(ValueError, match=r"^listed="):
            policy.limit(listed)
    with pytest.raises(TypeError, match=r"^paths='ab': expected a sequence of paths"):  # was paths 'a' and 'b'
        ic.ImageList("ab", (1, 2))
    with pytest.raises(TypeError, match=r"paths of type NoneType, int: expected paths"):
        ic.ImageList((None, 3), (1, 2))
    for argv in (0, {"--help": 1}):  # a dict ran as its keys
        with pytest.raises(TypeError, match=r"^argv="):
            ic.main(argv)


# --- torchrun: what a fault sweep found (kills, freezes and SIGTERMs at each phase) --------------------

_LOOK_UNDER_SIGTERM = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
import imagenet_classification as ic

dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=0, world_size=1)
share = {"rank": 1, "classified": 64, "stopped_by": "finished", "stop_reason": None}
ic._post_share(share, 5.0)  # rank 1 finished its shard and left its share, then died
signal.signal(signal.SIGTERM, ic._interrupt)  # the command line's handler
ask = ic._ask_store

def torchrun_ends_this_rank(*args):  # its SIGTERM, as the first look at the store begins
    ic._ask_store = ask
    os.kill(os.getpid(), signal.SIGTERM)
    return ask(*args)

ic._ask_store = torchrun_ends_this_rank
with ic._uninterrupted() as held:  # as _combine_ranks holds it
    found = ic._stopped_peers(ic._Shard(0, 2, 0), 2.0, held)
print([(s["rank"], s["classified"]) for s in found], held)
"""


def test_a_signal_as_rank_0_looks_for_the_shares_costs_none_of_them(tmp_path):
    # torchrun SIGTERMs rank 0 once a peer died; arriving before the first look at the store, it
    # ended the look with nothing found: a finished rank's 64 images counted as not reached.
    proc = subprocess.run(
        [sys.executable, "-c", _LOOK_UNDER_SIGTERM, str(ROOT), str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"[(1, 64)] [{int(signal.SIGTERM)}]"  # and the signal kept


_RANK_DIES = """
import os, signal, sys
root, where, *args = sys.argv[1:]
sys.path.insert(0, root)
sys.argv = [os.path.join(root, "imagenet_classification.py"), *args]
import imagenet_classification as ic

name, _, how = where.partition(":")
call = getattr(ic, name, None)

def dies(*args, **kwargs):
    if how == "SIGTERM":  # as torchrun, or a user, ends it: its handler, then the call
        os.kill(os.getpid(), signal.SIGTERM)
        return call(*args, **kwargs)
    os._exit(9)  # killed (the OOM killer?) there

if call is not None:
    setattr(ic, name, dies)
ic.entrypoint()
"""


def _rank_1_dies_in(
    where: str, dataset: Path, out: Path, dying: int = 1, other: str = "-", status: int = ic.EXIT_FAILED
) -> tuple[subprocess.CompletedProcess, str]:
    """Two ranks started by hand, as torchrun would; rank ``dying`` dies on calling the module's ``where``
    (the other meets ``other``). The other's completed process, and its one error line (``status``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [*_inputs(dataset), *FAST, "--num-threads", "1", "--timeout", "5", "--results-file", str(out)]
    procs = []
    for rank, dies in enumerate((other, where) if dying == 1 else (where, other)):  # both alike: pickled classes match
        launch = ["-c", _RANK_DIES, str(ROOT), dies]
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, *launch, *args], env=env, stderr=subprocess.PIPE, text=True))
    stderr = procs[1 - dying].communicate(timeout=120)[1]
    assert procs[dying].communicate(timeout=60) and procs[dying].returncode in (9, 128 + signal.SIGTERM), stderr
    proc = subprocess.CompletedProcess(procs[1 - dying].args, procs[1 - dying].returncode, "", stderr)
    return proc, _error_line(proc, status)


def test_a_rank_that_dies_in_a_collective_is_named_as_the_jobs_stop_not_gloos_source_file(dataset, tmp_path):
    # Rank 0's line and stop reason were Gloo's raw text ("[/__w/pytorch/.../pair.cc:545] Read error ...
    # GLHF!"), and named no rank: rank 1, which left no word, is the one that stopped the job.
    out = tmp_path / "r.json"
    _, line = _rank_1_dies_in("_agree_on_job", dataset, out)
    assert line.startswith("error: rank 0: another rank stopped (") and "GLHF" not in line and ".cc:" not in line
    assert line.endswith("; the job stopped on rank 1: no word (died, or froze)")
    result = json.loads(out.read_text())
    assert result["stop_reason"] == "rank 1: no word (died, or froze)"
    assert (result["listed"], result["classified"], result["not_reached"]) == (8, 0, 8)


def test_a_rank_that_dies_at_the_last_barrier_is_said_by_a_rank_named(dataset, tmp_path):
    # The ranks share one stderr under torchrun: "error: another rank stopped (...)" named no rank.
    out = tmp_path / "r.json"
    _, line = _rank_1_dies_in("_finish", dataset, out)  # its files (none) written: at the barrier after them
    assert line.startswith("error: rank 0: another rank stopped ("), line
    result = json.loads(out.read_text())  # rank 0's files were written before the barrier: whole
    assert (result["classified"], result["not_reached"], result["partial"]) == (8, 0, False)


def test_a_rank_stopped_after_its_shard_is_named_as_the_jobs_stop(dataset, tmp_path):
    # A rank that had finished its shard, then was ended (SIGTERM) as it waited for rank 0, left its
    # share saying "finished" alone: rank 0 named Gloo's lost connection, or its own SIGTERM.
    out = tmp_path / "r.json"
    _, line = _rank_1_dies_in("_wait_for_peers:SIGTERM", dataset, out)
    assert line.endswith("; the job stopped on rank 1: interrupted by SIGTERM"), line
    result = json.loads(out.read_text())
    assert result["stop_reason"] == "rank 1: interrupted by SIGTERM"
    assert result["ranks"][1]["stop_reason"] is None and result["ranks"][1]["classified"] == 4  # its shard, whole
    assert result["classified"] + result["not_reached"] == 8 and result["partial"]


def test_a_rank_waiting_on_a_store_that_is_gone_says_so(dataset, tmp_path):
    # Rank 0's process held the job's store (no torchrun agent) and ended as it finished: rank 1's
    # line was "another rank stopped (Broken pipe)", c10d's words for the store's socket alone.
    _, line = _rank_1_dies_in("_wait_for_peers", dataset, tmp_path / "r.json", dying=0)
    assert line.startswith("error: rank 1: another rank stopped (the job's store is gone: "), line


def test_a_decode_items_path_of_no_path_is_a_type_error_naming_the_item():
    # An int path failed in os.open ("path should be string, ... not int"), naming no item; numpy's
    # int as "embedded null character in path".
    import numpy as np

    decode = ic.get_decode_func("cpu", ic.EvalTransform())
    for path in (3, np.int64(3), None):
        with pytest.raises(TypeError, match=r"expected a \(path, label\) pair, its path a str"):
            decode([(path, 0)])


def test_what_worked_before_the_kind_checks_still_works(dataset):
    # The checks above must not refuse what a notebook gave before them: measure_loader's batches of
    # three, or with labels in a list (it never reads labels); an ImageList of numpy arrays or bytes;
    # whole sizes and counts of another numeric type.
    import numpy as np

    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    for batch in ((images, torch.zeros(2, dtype=torch.int64), ["a", "b"]), (images, [1, 2]), [images, ["x", "y"]]):
        with pytest.warns(ic.WarmupIncluded):
            assert ic.measure_loader([batch] * 3, "cpu", 5) > 0
    listed = ic.read_file_list(dataset, prefix=f"{dataset.parent}/")
    arrays = ic.ImageList(np.array(listed.paths), np.array(listed.labels))
    assert list(arrays.head(np.int64(3))) == list(listed.head(3)) and len(arrays.head(torch.tensor(2))) == 2
    assert len(ic.ImageList([os.fsencode(p) for p in listed.paths], list(listed.labels))) == 8
    assert ic.EvalTransform().geometry(500.0, 375.0) == ic.EvalTransform().geometry(500, 375)
    assert ic.BadImagePolicy(skip=True, max_bad_percent=10).limit(30.0) == 3


_RELAYED = """
import sys
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
import imagenet_classification as ic

dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=0, world_size=1)
relayed = "another rank stopped (rank 2: no word from it for 5 s)"
share = {"rank": 1, "stopped_by": "finished", "stop_reason": None, "then": relayed, "then_by": "peer"}
ic._post_share(share, 5.0)  # rank 1 finished, then stopped as it saw another rank stop
ic._wait_for_peers(ic._Shard(0, 2, 0), 5.0)
print("waited")
"""


def test_a_finished_rank_that_relays_anothers_stop_is_not_blamed_for_it(tmp_path):
    # Rank 1 finished its shard, then stopped as it found rank 2 silent: the waiting rank raised
    # "another rank stopped (rank 1: another rank stopped (rank 2: ...))", blaming rank 1.
    cmd = [sys.executable, "-c", _RELAYED, str(ROOT), str(tmp_path / "store")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "waited", proc.stderr


def test_a_signal_as_a_stopped_rank_leaves_its_share_costs_not_its_report(dataset, tmp_path):
    # Rank 1 died; torchrun's SIGTERM reached rank 0 as it left its share: RunInterrupted left the
    # run there, with "error: rank 0: interrupted by SIGTERM" alone, and no results file.
    out = tmp_path / "r.json"
    status = 128 + signal.SIGTERM
    _, line = _rank_1_dies_in("_agree_on_job", dataset, out, other="_post_share:SIGTERM", status=status)
    assert line == "error: rank 0: interrupted by SIGTERM; the job stopped on rank 1: no word (died, or froze)"
    result = json.loads(out.read_text())
    assert result["stop_reason"] == "rank 1: no word (died, or froze)" and result["not_reached"] == 8
