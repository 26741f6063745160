"""The file-list source and the class table."""

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from imagenet_classification import (
    InputError,
    get_mappings,
    parse_wnid,
    read_file_list,
    read_labels,
    scan_folder,
    source,
)
from tests.conftest import ROOT, TINY, read_json, run_main, write_jpeg


def _timm_list(name: str) -> list[str]:
    return resources.files("timm.data").joinpath("_info", name).read_text().splitlines()


def test_class_table_matches_timm_lists():
    """imagenet_class.tsv is timm's ImageNet-1k synsets, sorted (the index public models use),
    each with its lemmas; the module's names are the first lemma."""
    from imagenet_classification import _class_name

    rows = [line.split("\t") for line in (ROOT / "imagenet_class.tsv").read_text(encoding="utf-8").splitlines()]
    wnids = sorted(w.strip() for w in _timm_list("imagenet_synsets.txt") if w.strip())
    assert len(rows) == 1000 and [r[1] for r in rows] == wnids and [int(r[0]) for r in rows] == list(range(1000))
    assert get_mappings() == {wnid: i for i, wnid in enumerate(wnids)}
    lemmas = dict(line.split("\t", 1) for line in _timm_list("imagenet_synset_to_lemma.txt") if "\t" in line)
    assert all(name == lemmas[wnid].strip() for _, wnid, name in rows)
    assert [_class_name(i) for i in range(1000)] == [lemmas[w].split(",")[0].strip() for w in wnids]
    assert (_class_name(0), _class_name(281), _class_name(636)) == ("tench", "tabby", "mailbag")


def test_mappings_known_indices():
    mapping = get_mappings()
    assert len(mapping) == 1000
    assert mapping["n01440764"] == 0
    assert mapping["n03709823"] == 636
    assert mapping["n15075141"] == 999


def test_parse_wnid_takes_first():
    assert parse_wnid("train/n01440764/n01443537_1.JPEG") == "n01440764"
    with pytest.raises(ValueError, match="no WordNet ID"):
        parse_wnid("val/cat.jpg")


def test_source_prefix_blank_lines_crlf(tmp_path):
    flist = tmp_path / "list.txt"
    flist.write_bytes(b"val/n01440764/a.JPEG\r\n\r\n   \n  val/n03709823/b.JPEG  \r\nval/n01440764/c.JPEG")
    assert list(source(flist, prefix="/data/")) == [
        ("/data/val/n01440764/a.JPEG", 0),
        ("/data/val/n03709823/b.JPEG", 636),
        ("/data/val/n01440764/c.JPEG", 0),
    ]
    assert [p for p, _ in source(flist, max_samples=2)] == ["val/n01440764/a.JPEG", "val/n03709823/b.JPEG"]
    assert len(read_file_list(flist)) == 3
    assert len(read_file_list(flist, max_samples=2)) == 2


@pytest.mark.parametrize(
    "bad_line, message",
    [("val/cat.jpg", "no WordNet ID"), ("val/n99999999/x.JPEG", "n99999999 is not one of the 1000")],
)
def test_bad_line_names_file_and_line(tmp_path, bad_line, message):
    flist = tmp_path / "list.txt"
    flist.write_text(f"val/n01440764/a.JPEG\n\n{bad_line}\n")
    with pytest.raises(InputError, match=rf"list\.txt:3: {message}"):
        list(source(flist))
    with pytest.raises(InputError, match=r"list\.txt:3:"):
        read_file_list(flist)


def test_file_list_rejects_missing_and_empty(tmp_path):
    with pytest.raises(InputError, match="nope.txt: no such file"):
        read_file_list(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(InputError, match="no image paths"):
        read_file_list(tmp_path / "empty.txt")


def test_public_names_exist():
    import imagenet_classification

    missing = [name for name in imagenet_classification.__all__ if not hasattr(imagenet_classification, name)]
    assert missing == []
    seed_names = {"entrypoint", "benchmark", "source", "get_decode_func", "get_pipeline", "get_model",
                  "ModelBundle", "Classification", "Preprocessing", "get_mappings", "parse_wnid"}  # fmt: skip
    assert seed_names <= set(imagenet_classification.__all__)


# --- Round four of the hostile sweep: labels, folder listings, stdin and odd text ------------------


def test_labels_that_give_one_name_two_classes_name_both_lines(tmp_path):
    # Names are matched without their extension: a.JPEG and a.png are one image's name.
    labels = tmp_path / "labels.txt"
    labels.write_text("a.JPEG n01440764\nb.JPEG 281\na.png n02123045\n")
    with pytest.raises(InputError, match=r"labels\.txt:3: .*'a'.* 281.*labels\.txt:1.* 0"):
        read_labels(labels)
    kaggle = tmp_path / "LOC_val_solution.csv"
    kaggle.write_text("ImageId,PredictionString\na,n01440764 1 2 3 4\nb,n02123045 1 2 3 4\na,n02123045 5 6 7 8\n")
    with pytest.raises(InputError, match=r"LOC_val_solution\.csv:4: .*LOC_val_solution\.csv:2"):
        read_labels(kaggle)
    labels.write_text("a.JPEG n01440764\nb.JPEG 281\na.png 0\n")  # the same class twice: no conflict
    assert dict(read_labels(labels)) == {"a": 0, "b": 281}


def _tree_with_a_dangling_link_and_a_fifo(root: Path) -> Path:
    """Class folders holding two JPEGs, a dangling link and a FIFO, each named like an image."""
    write_jpeg(root / "n01440764" / "a.JPEG", (64, 48), (200, 10, 10))
    write_jpeg(root / "n02123045" / "b.JPEG", (64, 48), (10, 200, 10))
    (root / "n01440764" / "gone.JPEG").symlink_to(root / "nowhere.JPEG")
    os.mkfifo(root / "n02123045" / "pipe.png")
    return root


def test_a_link_in_a_loop_is_named_in_the_listings_error(tmp_path):
    root = tmp_path / "val"
    write_jpeg(root / "n01440764" / "a.JPEG", (64, 48), (200, 10, 10))
    (root / "n01440764" / "loop").symlink_to("loop")
    with pytest.raises(InputError) as error:
        scan_folder(root)
    assert str(error.value) == f"{root}: cannot list it (Too many levels of symbolic links: {root}/n01440764/loop)"


def test_a_folder_lists_dangling_links_and_fifos_as_imagefolder_does(tmp_path):
    root = _tree_with_a_dangling_link_and_a_fifo(tmp_path / "val")
    names = [os.path.relpath(p, root) for p in scan_folder(root).paths]
    assert names == ["n01440764/a.JPEG", "n01440764/gone.JPEG", "n02123045/b.JPEG", "n02123045/pipe.png"]
    labels = tmp_path / "labels.txt"
    labels.write_text("a 0\ngone 0\nb 281\npipe 281\n")
    assert len(scan_folder(root, labels=read_labels(labels))) == 4  # the flat layout's listing too
    (tmp_path / "empty").mkdir()
    (root / "n01440764" / "c.JPEG").symlink_to(tmp_path / "empty")  # a link to a folder is a folder
    assert len(scan_folder(root)) == 4
    (root / "loose.JPEG").symlink_to(root / "nowhere.JPEG")  # beside the class folders: as any image
    with pytest.raises(InputError, match="holds image files beside class folders"):
        scan_folder(root)


def test_a_folder_and_its_file_list_count_the_same_failures(tmp_path, capfd):
    root = _tree_with_a_dangling_link_and_a_fifo(tmp_path / "val")
    flist = tmp_path / "val.flist"
    flist.write_text("".join(f"{os.path.relpath(p, root)}\n" for p in sorted(root.rglob("*.*"))))
    fast = [*TINY, "--no-compile", "--batch-size", "2", "--skip-bad"]
    counts = []
    for where in (["--data-dir", root], ["--input-flist", flist, "--prefix", f"{root}/"]):
        out = tmp_path / "r.json"
        proc = run_main(capfd, *where, *fast, "--results-file", out)
        assert proc.returncode == 0, proc.stderr
        result = read_json(out)
        counts.append((result["listed"], result["classified"], result["failed"]))
    assert counts == [(4, 2, 2), (4, 2, 2)]


@pytest.mark.parametrize("flag", ["--input-flist", "--labels", None])
def test_a_closed_stdin_is_one_line(tmp_path, flag):
    # Started with stdin closed (cron, <&-), Python has no sys.stdin: only a list read from it fails.
    flist = tmp_path / "val.flist"
    flist.write_text("val/n01440764/a.JPEG\n")
    where = {"--input-flist": ["-"], "--labels": [flist, "--labels", "-"], None: [flist]}[flag]
    command = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", *where, "--no-compile"]
    proc = subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", *map(str, command)], capture_output=True, text=True, timeout=300
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    if flag is None:  # the list was read: the image it names is what is missing
        assert len(errors) == 1 and "the first listed image, val/n01440764/a.JPEG, does not" in errors[0]
    else:
        assert errors == [f"error: <stdin>: not open ({flag} -)"], proc.stderr


def test_a_label_of_thousands_of_digits_is_out_of_range(tmp_path):
    # int() refuses strings of over 4,300 digits; the line is an index out of range all the same.
    flist, labels = tmp_path / "list.txt", tmp_path / "labels.txt"
    flist.write_text("val/n01440764/a.JPEG " + "9" * 5000 + "\n")
    with pytest.raises(InputError, match=r"list\.txt:1: class index 9+… \(5000 digits\) is out of range \(0-999\)"):
        read_file_list(flist)
    labels.write_text("a.JPEG 0\nb.JPEG -" + "0" * 5000 + "7\n")
    with pytest.raises(InputError, match=r"labels\.txt:2: class index -0+… \(5001 digits\) is out of range") as e:
        read_labels(labels)
    assert len(str(e.value)) < len(str(labels)) + 80  # not the 5000 digits
    flist.write_text("val/n01440764/a.JPEG " + "0" * 5000 + "281\n")  # zeros first: still index 281
    assert read_file_list(flist).labels == (281,)
    flist.write_text("val/n01440764/a.JPEG -0\nval/n01440764/b.JPEG +999\n")  # as int() reads them
    assert read_file_list(flist).labels == (0, 999)


def test_a_byte_order_mark_on_any_line_is_dropped(tmp_path):
    # Lists joined with cat, one of them saved by Notepad: its mark begins a later line.
    bom = "\ufeff".encode()
    flist, labels = tmp_path / "list.txt", tmp_path / "labels.txt"
    flist.write_bytes(bom + b"val/n01440764/a.JPEG\n" + bom + b"val/n03709823/b.JPEG\r\n")
    assert read_file_list(flist).paths == ("val/n01440764/a.JPEG", "val/n03709823/b.JPEG")
    labels.write_bytes(b"a.JPEG 0\n" + bom + b"b.JPEG 636\n")
    assert dict(read_labels(labels)) == {"a": 0, "b": 636}


def test_lines_ending_in_cr_alone_are_named(tmp_path):
    # Classic Mac OS ends lines in CR: the file is one line to a reader of LF and CRLF lines.
    flist = tmp_path / "list.txt"
    flist.write_bytes(b"val/n01440764/a.JPEG\rval/n03709823/b.JPEG\r")
    with pytest.raises(InputError, match=r"list\.txt:1: the lines end in CR"):
        read_file_list(flist)
    flist.write_bytes(b"val/n01440764/a.JPEG 0\r" * 1000)  # over one line's 8192 bytes: no binary data either
    with pytest.raises(InputError, match=r"list\.txt:1: the lines end in CR"):
        read_file_list(flist)
    flist.write_bytes(b"val/n01440764/a.JPEG\r\nval/n03709823/b.JPEG\r\n")  # CRLF stays fine
    assert len(read_file_list(flist)) == 2


def test_the_file_list_and_the_labels_cannot_both_be_stdin(capfd):
    proc = run_main(capfd, "--input-flist", "-", "--labels", "-", *TINY)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "--input-flist -" in errors[0] and "--labels -" in errors[0] and "stdin" in errors[0], proc.stderr


def test_a_label_column_that_gives_one_path_two_classes_names_both_lines(tmp_path, capfd):
    # One file, two classes: one line is a miss whatever the model says. The same class twice is
    # a repeated pass (a steady FPS window), and stays fine.
    flist = tmp_path / "list.txt"
    flist.write_text("val/a.JPEG 0\nval/b.JPEG n02123045\nval/a.JPEG 0\nval/b.JPEG 281\n")
    assert read_file_list(flist).labels == (0, 281, 0, 281)
    flist.write_text("val/a.JPEG 0\nval/b.JPEG 281\nval/a.JPEG 281\n")
    with pytest.raises(InputError) as e:
        read_file_list(flist)
    assert str(e.value) == f"{flist}:3: gives 'val/a.JPEG' class 281, but {flist}:1 gives it class 0"
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY)
    assert proc.returncode == 2 and f"error: {flist}:3: gives 'val/a.JPEG' class 281, but {flist}:1" in proc.stderr


def test_predictions_of_a_list_that_repeats_paths_follow_it_line_by_line(tmp_path, capfd):
    # Row i is line i, repeats too (a list repeated for a steady FPS window): a join with the
    # list, or a diff of two runs, goes image by image.
    names = [write_jpeg(tmp_path / "val" / wnid / f"{i}.JPEG", (64, 48), (40 * i, 90, 200 - 40 * i), seed=i)
             for i, wnid in enumerate(("n01440764", "n02123045", "n03709823", "n07920052"))]  # fmt: skip
    lines = [str(names[i].relative_to(tmp_path)) for i in (0, 1, 2, 0, 3, 1, 0)]
    flist, rows = tmp_path / "dup.flist", tmp_path / "rows.jsonl"
    flist.write_text("\n".join(lines) + "\n")
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile",
                    "--batch-size", "2", "--predictions-file", rows)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line)["path"] for line in rows.read_text().splitlines()]
    assert got == [f"{tmp_path}/{line}" for line in lines]
