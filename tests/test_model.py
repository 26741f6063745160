"""The model bundle: normalisation, top-k counting, padding, checkpoints."""

import argparse
import functools
import os

import pytest
import timm
import torch

from imagenet_classification import Classification, EvalTransform, InputError, ModelBundle, Preprocessing, get_model


def test_classification_counts_equal_direct_topk():
    torch.manual_seed(0)
    logits = torch.randn(64, 1000)
    labels = torch.randint(0, 1000, (64, 1))
    top = logits.argsort(dim=1, descending=True)[:, :5]
    labels[:8, 0] = top[:8, 0]  # some certain top-1 hits
    labels[8:16, 0] = top[8:16, 3]  # some certain top-5-only hits
    top1, top5 = Classification()(logits, labels)
    assert int(top1) == int((top[:, 0] == labels[:, 0]).sum()) >= 8
    assert int(top5) == int((top == labels).any(dim=1).sum()) >= 16
    assert int(top5) > int(top1)


def test_padding_label_never_counts():
    logits = torch.zeros(2, 10)
    logits[:, 0] = 1
    assert [int(v) for v in Classification()(logits, torch.tensor([[-1], [0]]))] == [1, 1]


def test_preprocessing_broadcasts_over_any_batch_size():
    pre = Preprocessing((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    for n in (1, 3, 17):
        x = torch.full((n, 3, 8, 8), 255, dtype=torch.uint8)
        out = pre(x)
        assert out.shape == (n, 3, 8, 8) and out.dtype == torch.float32
        assert torch.allclose(out, torch.full_like(out, 2.0))


def test_get_model_reads_pretrained_config():
    bundle = get_model("test_efficientnet", "cpu", pretrained=False, compile=False, use_bf16=False)
    assert bundle.transform == EvalTransform(160, 0.95, "bicubic", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert not bundle.model.training and bundle.dtype == torch.float32


def test_bundle_counts_match_manual_forward_and_padding_changes_nothing():
    torch.manual_seed(0)
    model = timm.create_model("test_efficientnet", pretrained=False).eval()
    transform = EvalTransform.from_model(model)
    images = torch.randint(0, 256, (5, 3, 160, 160), dtype=torch.uint8)
    with torch.inference_mode():
        logits = model((images.float() / 255 - torch.tensor(transform.mean).view(1, 3, 1, 1))
                       / torch.tensor(transform.std).view(1, 3, 1, 1))  # fmt: skip
        labels = logits.argmax(dim=1, keepdim=True)
        labels[0, 0] = (labels[0, 0] + 1) % 1000
        plain = ModelBundle(Preprocessing(transform.mean, transform.std), model, Classification(),
                            torch.float32, transform)  # fmt: skip
        padded = ModelBundle(plain.preprocessing, model, plain.classification, torch.float32, transform, batch_size=8)
        assert [int(v) for v in plain(images, labels)][0] == 4
        assert [int(v) for v in padded(images, labels)] == [int(v) for v in plain(images, labels)]


def test_bf16_bundle_runs_and_counts(jpeg_set):
    bundle = get_model("test_efficientnet", "cpu", pretrained=False, compile=False, use_bf16=True)
    assert bundle.dtype == torch.bfloat16
    with torch.inference_mode():
        top1, top5 = bundle(torch.zeros((4, 3, 160, 160), dtype=torch.uint8), torch.zeros((4, 1), dtype=torch.int64))
    assert 0 <= int(top1) <= int(top5) <= 4


def test_checkpoint_loads_and_mismatch_names_key(tmp_path):
    model = timm.create_model("test_efficientnet", pretrained=False)
    good = tmp_path / "good.pth"
    torch.save(model.state_dict(), good)
    bundle = get_model("test_efficientnet", "cpu", checkpoint=good, compile=False, use_bf16=False)
    assert torch.equal(bundle.model.conv_stem.weight, model.conv_stem.weight)

    state = model.state_dict()
    state["classifier.weight"] = torch.zeros(10, state["classifier.weight"].shape[1])
    bad = tmp_path / "bad.pth"
    torch.save(state, bad)
    with pytest.raises(InputError, match=r"'classifier.weight' has shape \(10, \d+\) in the checkpoint, the model"):
        get_model("test_efficientnet", "cpu", checkpoint=bad, compile=False)

    other = tmp_path / "other.pth"
    torch.save(timm.create_model("test_resnet", pretrained=False).state_dict(), other)
    with pytest.raises(InputError, match="checkpoint lacks 'conv_stem.weight'"):
        get_model("test_efficientnet", "cpu", checkpoint=other, compile=False)

    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="junk.pth: cannot load checkpoint"):
        get_model("test_efficientnet", "cpu", checkpoint=tmp_path / "junk.pth", compile=False)


def test_training_torchvision_and_safetensors_checkpoints_load(tmp_path):
    from safetensors.torch import save_file

    model = timm.create_model("test_efficientnet", pretrained=False)
    state = model.state_dict()
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1).state_dict()
    args = argparse.Namespace(model="test_efficientnet", lr=0.1)  # timm's train.py and torchvision's save theirs
    training = {"epoch": 3, "state_dict": state, "optimizer": optimizer, "args": args, "state_dict_ema": ema}
    checkpoints = {"checkpoint-3.pth.tar": training, "model_3.pth": {"model": state, "args": args, "epoch": 3}}
    for name, saved in checkpoints.items():
        torch.save(saved, tmp_path / name)
    save_file(state, tmp_path / "model.safetensors")
    for name in (*checkpoints, "model.safetensors"):
        bundle = get_model("test_efficientnet", "cpu", checkpoint=tmp_path / name, compile=False, dtype="float32")
        loaded = bundle.model.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in state.items()), name  # the weights, not the EMA's


def test_a_checkpoint_holding_code_is_refused_without_running_it(tmp_path):
    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    path = tmp_path / "code.pth"
    torch.save({"state_dict": timm.create_model("test_efficientnet", pretrained=False).state_dict(), "x": Runs()}, path)
    with pytest.raises(InputError, match=r"code.pth: cannot load checkpoint \(it holds Python objects \(\w+\.system\)"):
        get_model("test_efficientnet", "cpu", checkpoint=path, compile=False)
    with pytest.raises(InputError) as refused:
        get_model("test_efficientnet", "cpu", checkpoint=path, compile=False)
    assert refused.value.flag == "--checkpoint" and "\n" not in str(refused.value)
    assert "weights_only=False" not in str(refused.value) and not (tmp_path / "ran").exists()


def test_unknown_model_is_a_usage_error():
    with pytest.raises(InputError, match="'no_such_model' is not a timm model"):
        get_model("no_such_model", "cpu", pretrained=False, compile=False)


def test_auto_precision_follows_the_hardware():
    # The decision, for hardware this machine does not have; and the real check on this CPU.
    from imagenet_classification import _auto_dtype, _choose_dtype

    assert _auto_dtype((9, 0), False)[0] == _auto_dtype((8, 0), False)[0] == torch.bfloat16  # H100, A100
    assert _auto_dtype((7, 5), False)[0] == _auto_dtype((7, 0), False)[0] == torch.float16  # T4, V100
    assert _auto_dtype(None, True)[0] == torch.bfloat16 and _auto_dtype(None, False)[0] == torch.float32
    assert "lacks native bfloat16" in _auto_dtype(None, False)[1] and "8.0" in _auto_dtype((7, 5), False)[1]
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert _choose_dtype(torch.device("cpu"))[0] == (torch.bfloat16 if native else torch.float32)
    assert _choose_dtype(torch.device("cpu"), "float16") == (torch.float16, "asked for")
    assert (
        get_model("test_efficientnet", "cpu", pretrained=False, compile=False).dtype
        == _choose_dtype(torch.device("cpu"))[0]
    )


def test_from_model_takes_a_bundles_own_transform_and_refuses_a_module_timm_did_not_make():
    # get_model's bundle carries the transform it was built with (here not the config's 224 / 0.875).
    bundle = get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype="float32",
                       transform={"img_size": 160, "crop_pct": 0.95, "interpolation": "bilinear"})  # fmt: skip
    assert EvalTransform.from_model(bundle) == bundle.transform
    assert EvalTransform.from_model(bundle, {"crop_pct": 1.0}) == EvalTransform(160, 1.0, "bilinear")
    with pytest.raises(InputError, match="a Linear is not a timm model: it has no pretrained config"):
        EvalTransform.from_model(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("fields", "words"),
    [({"size": 0}, "its size 0 is not a whole number of pixels from 1 to 4096"),
     ({"size": 224.0}, "its size 224.0 is not a whole number"),
     ({"crop_pct": 0.0}, "its crop_pct 0.0 is not a number above 0"),
     ({"crop_pct": -1.0}, "its crop_pct -1.0 is not a number above 0"),
     ({"crop_pct": 87.5}, "its crop_pct 87.5 is not a number above 0, at most 2.0"),
     ({"crop_pct": 1e-5}, "resizes each shorter side to 22400000: every image would be over the limit"),
     ({"crop_mode": "border"}, "its crop mode 'border' is neither center nor squash"),
     ({"interpolation": "box"}, "its interpolation 'box' is not one of"),
     ({"mean": (123.7, 116.3, 103.5)}, r"its mean \(123.7, 116.3, 103.5\) is not 3 numbers from 0 to 1"),
     ({"std": (0.0, 0.0, 0.0)}, "its std .* is not 3 numbers from 0.001 to 1"),
     ({"std": (0.2, 0.2)}, "its std .* is not 3 numbers")],
)  # fmt: skip
def test_a_transform_out_of_range_is_refused_by_field_however_it_is_made(fields, words):
    with pytest.raises(ValueError, match=words):
        EvalTransform(**fields)
    assert EvalTransform(crop_pct=1.15).resize_short == 194  # above 1 pads the crop (volo_d4_448's)


def test_transform_overrides_out_of_range_or_unknown_are_refused():
    build = functools.partial(get_model, "test_efficientnet", "cpu", pretrained=False, compile=False)
    with pytest.raises(InputError, match="its mean .* is not 3 numbers from 0 to 1, on the 0-1 scale"):
        build(transform={"mean": (123.7, 116.3, 103.5)})
    with pytest.raises(InputError, match="its crop_pct 0.0 is not a number above 0"):  # timm would keep 0.875
        build(transform={"crop_pct": 0})
    with pytest.raises(ValueError, match=r"unknown transform overrides \['size'\]: expected some of"):
        build(transform={"size": 160})  # timm would ignore it


def test_a_dtype_that_is_not_one_is_refused_by_name():
    build = functools.partial(get_model, "test_efficientnet", "cpu", pretrained=False, compile=False)
    with pytest.raises(ValueError, match="dtype='fp16': expected auto, bfloat16, float16, float32 or a torch dtype"):
        build(dtype="fp16")
    with pytest.raises(ValueError, match="use_bf16=True and dtype='float16' disagree"):
        build(use_bf16=True, dtype="float16")
    assert build(use_bf16=True, dtype=torch.bfloat16).dtype == torch.bfloat16  # agreeing is fine


def test_a_padding_batch_size_below_one_is_refused():
    build = functools.partial(get_model, "test_efficientnet", "cpu", pretrained=False, compile=False)
    for size in (0, -8, 2.5, "8"):
        with pytest.raises(ValueError, match=r"batch_size=.*: expected at least 1, or None"):
            build(batch_size=size)
