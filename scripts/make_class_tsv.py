"""Regenerate ``imagenet_class.tsv`` from the ImageNet-1k synset lists that timm ships.

Each line is ``index<TAB>wnid<TAB>name``. The index is the position of the WordNet ID in
sorted order, which is the class index that public ImageNet-1k models use.

Usage::

    python scripts/make_class_tsv.py > imagenet_class.tsv
"""

import argparse
import os
import sys
from importlib import resources

from cli_checks import run


def _timm_info(name: str) -> list[str]:
    return resources.files("timm.data").joinpath("_info", name).read_text().splitlines()


def class_table() -> str:
    """The table's text, one ``index<TAB>wnid<TAB>name`` line a class."""
    wnids = sorted(line.strip() for line in _timm_info("imagenet_synsets.txt") if line.strip())
    if len(wnids) != 1000:
        sys.exit(f"error: expected 1000 ImageNet-1k synsets in timm's imagenet_synsets.txt, found {len(wnids)}")
    lemmas = dict(line.split("\t", 1) for line in _timm_info("imagenet_synset_to_lemma.txt") if "\t" in line)
    return "".join(f"{index}\t{wnid}\t{lemmas[wnid].strip()}\n" for index, wnid in enumerate(wnids))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     epilog="The table goes to stdout: redirect it to imagenet_class.tsv.")  # fmt: skip
    parser.parse_args()
    try:
        sys.stdout.write(class_table())
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:  # a full disk: cli_checks.run says so in one line, naming what it wrote
        e.filename = e.filename or "standard output"
        raise


if __name__ == "__main__":
    run(main)
