"""The ``vision`` collator: pixel layouts and dtypes, normalisation checked against numbers
computed by hand, labels, options from a TaskSpec, and every error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from wdsloader.collate import NORMALIZATIONS, CollatorRegistry, TaskSpec, VisionCollator

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def vision(task_spec=None, **kwargs):
    return CollatorRegistry.get_instance().get_collator(task_spec, "vision", **kwargs)


def _hwc(n: int = 3, h: int = 5, w: int = 6, c: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, c), dtype=np.uint8) for _ in range(n)]


def _by_hand(images_hwc: list[np.ndarray], mean, std) -> np.ndarray:
    """((pixel / 255) - mean[c]) / std[c], channel by channel, as (B, C, H, W) float64."""
    out = np.empty((len(images_hwc), images_hwc[0].shape[2], *images_hwc[0].shape[:2]))
    for b, im in enumerate(images_hwc):
        for c in range(im.shape[2]):
            out[b, c] = (im[:, :, c] / 255.0 - mean[c]) / std[c]
    return out


def _close(t: torch.Tensor, expected: np.ndarray) -> bool:
    return t.dtype == torch.float32 and np.allclose(t.numpy(), expected, atol=1e-5)


def test_presets_are_the_published_statistics():
    assert NORMALIZATIONS["imagenet"] == (IMAGENET_MEAN, IMAGENET_STD)
    assert NORMALIZATIONS["cifar10"] == (CIFAR10_MEAN, CIFAR10_STD)


def test_imagenet_by_default_from_hwc_uint8():
    images = _hwc()
    batch = vision()([{"__key__": f"k{i}", "pixel_values": im} for i, im in enumerate(images)])
    assert batch["pixel_values"].shape == (3, 3, 5, 6)
    assert _close(batch["pixel_values"], _by_hand(images, IMAGENET_MEAN, IMAGENET_STD))
    assert batch["__key__"] == ["k0", "k1", "k2"] and "labels" not in batch


@pytest.mark.parametrize(
    ("options", "config", "mean", "std"),
    [
        ({"normalize": "cifar10"}, {}, CIFAR10_MEAN, CIFAR10_STD),
        ({}, {"normalize": "cifar10"}, CIFAR10_MEAN, CIFAR10_STD),
        ({"normalize": True, "mean": [0.5] * 3, "std": [0.5] * 3}, {}, [0.5] * 3, [0.5] * 3),
        (
            {},
            {"normalize": True, "mean": [0.1, 0.2, 0.3], "std": [1, 2, 4]},
            [0.1, 0.2, 0.3],
            [1, 2, 4],
        ),
        ({"normalize": False}, {"normalize": "cifar10"}, [0] * 3, [1] * 3),  # kwargs win
        ({"normalize": "imagenet"}, {"normalize": "cifar10"}, IMAGENET_MEAN, IMAGENET_STD),
        ({"mean": [0.5], "std": [0.25]}, {}, [0.5] * 3, [0.25] * 3),  # one value: every channel
    ],
)
def test_normalisation_from_kwargs_or_the_task_spec(options, config, mean, std):
    spec = TaskSpec.vision_tiny()
    spec.preprocessing_config = config
    images = _hwc(seed=1)
    batch = vision(spec, **options)([{"pixel_values": im} for im in images])
    assert _close(batch["pixel_values"], _by_hand(images, mean, std))


def test_layouts_and_dtypes_give_the_same_pixels():
    images = _hwc(seed=2)
    expected = _by_hand(images, IMAGENET_MEAN, IMAGENET_STD)
    chw_float_tensors = [torch.from_numpy(im).permute(2, 0, 1).float() / 255 for im in images]
    chw_uint8_arrays = [np.ascontiguousarray(im.transpose(2, 0, 1)) for im in images]
    hwc_float64 = [im / 255.0 for im in images]
    pil = [Image.fromarray(im, "RGB") for im in images]
    for kind in (chw_float_tensors, chw_uint8_arrays, hwc_float64, pil):
        batch = vision()([{"pixel_values": im} for im in kind])
        assert _close(batch["pixel_values"], expected)
    # a float image is taken as already in [0, 1]: not scaled again
    raw = vision(normalize=False)([{"pixel_values": chw_float_tensors[0]}])["pixel_values"]
    assert torch.allclose(raw[0], chw_float_tensors[0])


def test_grayscale_uses_channel_zero_statistics():
    rng = np.random.default_rng(3)
    gray = [rng.integers(0, 256, (4, 7), dtype=np.uint8) for _ in range(2)]
    expected = np.stack([((g / 255.0 - 0.485) / 0.229)[None] for g in gray])
    for kind in (gray, [g[:, :, None] for g in gray], [Image.fromarray(g, "L") for g in gray]):
        batch = vision()([{"pixel_values": g} for g in kind])
        assert batch["pixel_values"].shape == (2, 1, 4, 7)
        assert _close(batch["pixel_values"], expected)
    cifar = vision(normalize="cifar10")([{"pixel_values": gray[0]}])["pixel_values"]
    assert _close(cifar, ((gray[0] / 255.0 - 0.4914) / 0.2470)[None, None])


def test_labels_are_int64_and_other_fields_pass_through():
    images = _hwc()
    labels = [np.int32(2), 1, torch.tensor(3)]
    samples = [
        {"pixel_values": im, "labels": lab, "name": f"n{i}", "w": 0.5}
        for i, (im, lab) in enumerate(zip(images, labels, strict=True))
    ]
    batch = vision(TaskSpec.vision_tiny())(samples)
    assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == [2, 1, 3]
    assert batch["name"] == ["n0", "n1", "n2"] and batch["w"].dtype == torch.float32
    own = vision(image_field="img", label_field="y")
    out = own([{"img": images[0], "y": 4}])
    assert set(out) == {"pixel_values", "labels"} and out["labels"].tolist() == [4]
    spec = TaskSpec(name="t", task_type="vision_classification", modality="vision",
                    input_fields=["image"], target_field="cls")  # fmt: skip
    out = vision(spec)([{"image": images[0], "cls": 1}])
    assert out["labels"].tolist() == [1]


def test_classification_reads_the_hf_label_column():
    """CIFAR-10 on the Hugging Face hub names its class column ``label``."""
    images = _hwc(2)
    samples = [{"__key__": f"k{i}", "img": im, "label": i + 3} for i, im in enumerate(images)]
    spec = TaskSpec.vision_tiny()
    spec.input_fields = ["img"]
    batch = vision(spec)(samples)
    assert sorted(batch) == ["__key__", "labels", "pixel_values"]
    assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == [3, 4]
    plain = vision(image_field="img")(samples)  # no task: the column passes through as is
    assert "labels" not in plain and plain["label"].tolist() == [3, 4]


def test_errors_name_the_field_and_samples():
    a, b = _hwc(2)
    with pytest.raises(
        ValueError,
        match=r"vision: field 'pixel_values': sample 'a' is CHW \[3, 5, 6\] but sample 'b' is "
        r"\[3, 6, 5\]; cannot stack",
    ):
        vision()(
            [
                {"__key__": "a", "pixel_values": a},
                {"__key__": "b", "pixel_values": b.transpose(1, 0, 2)},
            ]
        )
    with pytest.raises(
        ValueError,
        match=r"sample 'x': cannot tell channels-first from channels-last in shape \[3, 5, 3\]; pass layout=",
    ):
        vision()([{"__key__": "x", "pixel_values": np.zeros((3, 5, 3), np.uint8)}])
    with pytest.raises(ValueError, match=r"channels-last in shape \[5, 6, 7\]"):
        vision()([{"pixel_values": np.zeros((5, 6, 7), np.uint8)}])
    # both ends a channel count: the smaller one is
    assert vision()([{"pixel_values": np.zeros((1, 6, 3))}])["pixel_values"].shape == (1, 1, 6, 3)
    assert vision()([{"pixel_values": np.zeros((4, 6, 3))}])["pixel_values"].shape == (1, 3, 4, 6)
    square = np.zeros((3, 5, 3), np.uint8)
    assert vision(layout="hwc")([{"pixel_values": square}])["pixel_values"].shape == (1, 3, 3, 5)
    assert vision(layout="chw")([{"pixel_values": square}])["pixel_values"].shape == (1, 3, 5, 3)
    with pytest.raises(ValueError, match=r"pixels of dtype int32: give uint8"):
        vision()([{"pixel_values": np.zeros((4, 4, 3), np.int32)}])
    with pytest.raises(
        TypeError, match=r"field 'pixel_values' of sample #0: an image must be a numpy"
    ):
        vision()([{"pixel_values": [[1, 2]]}])
    with pytest.raises(
        ValueError,
        match=r"sample 'k' has no field 'pixel_values'; its fields: \['__key__', 'img'\]",
    ):
        vision()([{"__key__": "k", "img": a}])
    with pytest.raises(
        ValueError,
        match=r"field 'labels' must hold integer classes of one shape, got \['shape \[\] float64'\]",
    ):
        vision()([{"pixel_values": a, "labels": 1.5}])
    with pytest.raises(
        ValueError, match=r"has 3 channels but the normalisation has 2 \(mean \[0.5, 0.5\]\)"
    ):
        vision(mean=[0.5, 0.5], std=[0.5, 0.5])([{"pixel_values": a}])
    with pytest.raises(
        ValueError, match=r"normalize='imagenet21k' is not one of \['cifar10', 'imagenet'\]"
    ):
        vision(normalize="imagenet21k")
    with pytest.raises(ValueError, match="give both mean and std, or neither"):
        vision(mean=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="normalize='cifar10' and mean/std: give one of them"):
        vision(normalize="cifar10", mean=[0.5] * 3, std=[0.5] * 3)
    with pytest.raises(ValueError, match="mean/std given with normalize=False would be unused"):
        vision(normalize=False, mean=[0.5] * 3, std=[0.5] * 3)
    with pytest.raises(ValueError, match=r"std values must be > 0, got \[0.5, 0.0, 0.5\]"):
        vision(mean=[0.5] * 3, std=[0.5, 0, 0.5])
    with pytest.raises(ValueError, match=r"layout='nhwc' is not one of \['auto', 'chw', 'hwc'\]"):
        vision(layout="nhwc")
    with pytest.raises(ValueError, match="vision: cannot collate an empty batch"):
        vision()([])
    assert VisionCollator() == vision() != vision(normalize="cifar10")
