"""ImageNet as people have it: class folders, a flat val folder with its labels, lists with a
label column. Each layout of the same real photos gives the same counts and accuracy; each bad
input names its file and line before the model is built."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from imagenet_classification import InputError, get_mappings, main, read_file_list, read_labels, scan_folder
from tests.conftest import read_json, run_cli

WNIDS = {index: wnid for wnid, index in get_mappings().items()}


@pytest.fixture(scope="module")
def layouts(demo_photos, tmp_path_factory) -> dict:
    """The demo photos in every layout: class folders, a flat folder, labels and lists."""
    root = tmp_path_factory.mktemp("layouts")
    shutil.copytree(demo_photos.parent / "val", root / "val")
    photos = [(root / line, line.split("/")[1]) for line in demo_photos.read_text().split()]
    flat = root / "flat"
    flat.mkdir()
    kaggle = ["ImageId,PredictionString"]
    two_column, caffe, spaced = [], [], []
    (root / "with space").mkdir()
    for i, (path, wnid) in enumerate(photos, start=1):
        name = f"ILSVRC2012_val_{i:08d}"
        shutil.copy(path, flat / f"{name}.JPEG")
        kaggle.append(f"{name},{wnid} 10 20 200 300 {wnid} 5 5 50 50")
        two_column.append(f"{name}.JPEG {wnid}")
        caffe.append(f"flat/{name}.JPEG {get_mappings()[wnid]}")
        shutil.copy(path, root / "with space" / f"photo {i}.JPEG")
        spaced.append(f"with space/photo {i}.JPEG {wnid}")
    (root / "LOC_val_solution.csv").write_text("\n".join(kaggle[:1] + kaggle[:0:-1]) + "\n")  # any order
    (root / "labels.txt").write_text("\n".join(two_column) + "\n")
    (root / "val.txt").write_text("\n".join(caffe) + "\n")
    (root / "spaced.txt").write_text("\n".join(spaced) + "\n")
    (root / "flat.flist").write_text("".join(f"flat/ILSVRC2012_val_{i:08d}.JPEG\n" for i in range(1, 21)))
    return {"root": root, "count": len(photos)}


@pytest.mark.slow
def test_every_layout_gives_the_same_result(layouts, lite0_checkpoint, tmp_path, capfd):
    root = layouts["root"]
    runs = {
        "class folders": ["--data-dir", root / "val"],
        "flat folder, Kaggle's solution file": ["--data-dir", root / "flat", "--labels", root / "LOC_val_solution.csv"],
        "flat folder, name and WordNet ID": ["--data-dir", root / "flat", "--labels", root / "labels.txt"],
        "list with class indices (val.txt)": ["--input-flist", root / "val.txt", "--prefix", f"{root}/"],
        "list with WordNet IDs, paths with spaces": ["--input-flist", root / "spaced.txt", "--prefix", f"{root}/"],
        "list of a flat folder with labels": ["--input-flist", root / "flat.flist", "--prefix", f"{root}/",
                                              "--labels", root / "labels.txt"],
    }  # fmt: skip
    common = ["--model", "efficientnet_lite0", "--checkpoint", lite0_checkpoint, "--device", "cpu", "--no-compile",
              "--dtype", "float32", "--batch-size", "8", "--num-threads", "2", "--warmup-batches", "1"]  # fmt: skip
    results = {}
    for name, flags in runs.items():  # in this process: the results files are compared, not the process
        out = tmp_path / f"{len(results)}.json"
        status = main([str(a) for a in (*flags, *common, "--results-file", out)])
        assert status == 0, (name, capfd.readouterr().err)
        r = read_json(out)
        results[name] = (r["listed"], r["classified"], r["failed"], r["top1_correct"], r["top5_correct"])
    reference = results["class folders"]
    assert reference[:3] == (layouts["count"], layouts["count"], 0) and reference[3] >= 18
    assert all(result == reference for result in results.values()), results


def test_folders_are_listed_as_imagefolder_lists_them(tmp_path):
    root = tmp_path / "train"
    for rel in ["n01440764/b.JPEG", "n01440764/a.jpeg", "n01440764/sub/c.PNG", "n01440764/.hidden.JPEG",
                "n01440764/notes.txt", "n02123045/z.JpG", ".cache/n01440764.JPEG"]:  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    images = scan_folder(root)
    assert [str(Path(p).relative_to(root)) for p in images.paths] == [
        "n01440764/a.jpeg", "n01440764/b.JPEG", "n01440764/sub/c.PNG", "n02123045/z.JpG"]  # fmt: skip
    assert images.labels == (0, 0, 0, 281)
    assert len(scan_folder(root, max_samples=2)) == 2


@pytest.mark.parametrize(
    "lines, message",
    [
        (["a/n01440764/x.JPEG", "b.JPEG n01440764"], r"l\.txt:2: has a label column, unlike the list's first line"),
        (["a.JPEG n01440764", "", "b.JPEG"], r"l\.txt:3: has no label column, unlike the list's first line"),
        (["a.JPEG n01440764", "b.JPEG n99999999"], r"l\.txt:2: n99999999 is not one of the 1000 ImageNet classes"),
        (["a.JPEG 999", "b.JPEG 1000"], r"l\.txt:2: class index 1000 is out of range \(0-999\)"),
        (["a.JPEG 3", "b.JPEG -1"], r"l\.txt:2: class index -1 is out of range"),
        (["a/cat.JPEG"], r"l\.txt:1: no WordNet ID \(nXXXXXXXX\) in 'a/cat.JPEG', and no label column"),
    ],
    ids=["mixed", "mixed-other-way", "unknown-wnid", "index-too-large", "negative-index", "no-label"],
)
def test_bad_lists_name_the_line(tmp_path, lines, message):
    (tmp_path / "l.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=message):
        read_file_list(tmp_path / "l.txt")


def test_label_column_path_is_everything_before_the_last_field(tmp_path):
    (tmp_path / "l.txt").write_text("my photos/a b.JPEG  n02123045 \r\nc.JPEG\t7\n")
    images = read_file_list(tmp_path / "l.txt", prefix="/data/")
    assert list(images) == [("/data/my photos/a b.JPEG", 281), ("/data/c.JPEG", 7)]


def test_labels_by_file_name(tmp_path):
    (tmp_path / "sol.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000002,n02123045 1 2 3 4\n")
    (tmp_path / "names.txt").write_text("ILSVRC2012_val_00000001.JPEG 5\n")
    assert dict(read_labels(tmp_path / "sol.csv")) == {"ILSVRC2012_val_00000002": 281}
    labels = read_labels(tmp_path / "names.txt")
    (tmp_path / "l.txt").write_text("val/ILSVRC2012_val_00000001.JPEG\nval/ILSVRC2012_val_00000003.JPEG\n")
    with pytest.raises(InputError, match=r"l\.txt:2: .*names\.txt has no label for 'ILSVRC2012_val_00000003'"):
        read_file_list(tmp_path / "l.txt", labels=labels)
    (tmp_path / "bad.txt").write_text("a.JPEG 5\nb.JPEG\n")
    with pytest.raises(InputError, match=r"bad\.txt:2: expected 'name label'"):
        read_labels(tmp_path / "bad.txt")


def test_bad_folders_are_named(tmp_path):
    (tmp_path / "val" / "cats").mkdir(parents=True)
    with pytest.raises(InputError, match=r"val/cats: the folder name is not one of the 1000 ImageNet WordNet IDs"):
        scan_folder(tmp_path / "val")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"")
    with pytest.raises(InputError, match="holds image files beside class folders .* a flat folder needs labels"):
        scan_folder(tmp_path / "flat")
    with pytest.raises(InputError, match="no such folder"):
        scan_folder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no images"):
        scan_folder(tmp_path / "empty")


def test_layout_errors_stop_before_the_model_is_built(tmp_path):
    (tmp_path / "l.txt").write_text("a.JPEG n01440764\nb.JPEG\n")
    proc = run_cli("--input-flist", tmp_path / "l.txt", "--model", "no_such_model", "--device", "cpu")
    assert proc.returncode == 2 and f"error: {tmp_path / 'l.txt'}:2: has no label column" in proc.stderr
    proc = run_cli("--data-dir", tmp_path / "nowhere", "--device", "cpu")
    assert proc.returncode == 2 and "nowhere: no such folder" in proc.stderr
