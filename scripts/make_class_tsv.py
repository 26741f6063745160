"""Regenerate ``imagenet_class.tsv`` from the ImageNet-1k synset lists that timm ships.

Each line is ``index<TAB>wnid<TAB>name``. The index is the position of the WordNet ID in
sorted order, which is the class index that public ImageNet-1k models use.

Usage::

    python scripts/make_class_tsv.py > imagenet_class.tsv
"""

from importlib import resources


def _timm_info(name: str) -> list[str]:
    return resources.files("timm.data").joinpath("_info", name).read_text().splitlines()


def main() -> None:
    wnids = sorted(line.strip() for line in _timm_info("imagenet_synsets.txt") if line.strip())
    assert len(wnids) == 1000, f"expected 1000 ImageNet-1k synsets, found {len(wnids)}"
    lemmas = dict(line.split("\t", 1) for line in _timm_info("imagenet_synset_to_lemma.txt") if "\t" in line)
    for index, wnid in enumerate(wnids):
        print(f"{index}\t{wnid}\t{lemmas[wnid].strip()}")


if __name__ == "__main__":
    main()
