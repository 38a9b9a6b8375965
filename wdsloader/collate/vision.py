"""The ``vision`` collator: images (arrays, tensors, PIL) -> normalised ``pixel_values``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wdsloader.collate.batch import check_batch, describe, sample_key
from wdsloader.collate.default import DefaultCollator

if TYPE_CHECKING:
    from wdsloader.collate.task import TaskSpec

# Per-channel statistics of images scaled to [0, 1].
NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
LAYOUTS = ("auto", "chw", "hwc")
_CHANNELS = (1, 3, 4)


def _statistics(
    normalize: bool | str | None, mean: Sequence[float] | None, std: Sequence[float] | None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The (mean, std) to normalise with, or None for no normalisation."""
    if isinstance(normalize, str):
        if normalize not in NORMALIZATIONS:
            raise ValueError(
                f"vision: normalize={normalize!r} is not one of {sorted(NORMALIZATIONS)} "
                "(or pass normalize=True with mean= and std=)"
            )
        if mean is not None or std is not None:
            raise ValueError(f"vision: normalize={normalize!r} and mean/std: give one of them")
        return NORMALIZATIONS[normalize]
    if not normalize:
        if mean is not None or std is not None:
            raise ValueError("vision: mean/std given with normalize=False would be unused")
        return None
    if (mean is None) != (std is None):
        raise ValueError("vision: give both mean and std, or neither (ImageNet statistics)")
    if mean is None or std is None:
        return NORMALIZATIONS["imagenet"]
    m, s = tuple(float(x) for x in mean), tuple(float(x) for x in std)
    if len(m) != len(s) or not m:
        raise ValueError(f"vision: mean {list(m)} and std {list(s)} need one value per channel")
    if any(x <= 0 for x in s):
        raise ValueError(f"vision: std values must be > 0, got {list(s)}")
    return m, s


def _to_array(value: Any) -> np.ndarray | torch.Tensor:
    if isinstance(value, np.ndarray | torch.Tensor):
        return value
    if hasattr(value, "mode") and hasattr(value, "getbands"):  # a PIL image
        return np.asarray(value)
    raise TypeError(f"an image must be a numpy array, torch tensor or PIL image, not {value!r}")


def _auto_layout(shape: Sequence[int]) -> str:
    """``"chw"`` or ``"hwc"``: the end whose size is a channel count (1, 3 or 4); when both
    are, the smaller one."""
    first, last = shape[0], shape[-1]
    if first in _CHANNELS and (last not in _CHANNELS or first < last):
        return "chw"
    if last in _CHANNELS and (first not in _CHANNELS or last < first):
        return "hwc"
    raise ValueError(
        f"cannot tell channels-first from channels-last in shape {list(shape)}; "
        "pass layout='chw' or layout='hwc'"
    )


def _as_float(image: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The pixels as a float32 tensor in [0, 1] for uint8, as they are for floats."""
    if isinstance(image, np.ndarray):  # converted in numpy: a read-only array is copied
        if image.dtype == np.uint8:
            return torch.from_numpy(image.astype(np.float32) / np.float32(255))
        if image.dtype.kind in "fb":
            return torch.from_numpy(image.astype(np.float32))
        raise ValueError(f"pixels of dtype {image.dtype}: give uint8 (scaled to [0, 1]) or floats")
    if image.dtype == torch.uint8:
        return image.to(torch.float32) / 255.0
    if image.is_floating_point() or image.dtype == torch.bool:
        return image.to(torch.float32)
    raise ValueError(f"pixels of dtype {image.dtype}: give uint8 (scaled to [0, 1]) or floats")


def _channels_first(image: np.ndarray | torch.Tensor, layout: str) -> torch.Tensor:
    """A CHW float32 tensor (uint8 scaled to [0, 1])."""
    if image.ndim == 2:
        return _as_float(image).unsqueeze(0)
    if image.ndim != 3:
        raise ValueError(
            f"an image needs 2 (HW) or 3 (CHW/HWC) dims, got shape {list(image.shape)}"
        )
    if layout == "auto":
        layout = _auto_layout(image.shape)
    t = _as_float(image)
    return t if layout == "chw" else t.permute(2, 0, 1)


class VisionCollator:
    """The ``vision`` collator: ``image_field`` of each sample -> ``pixel_values``, a float32
    (B, C, H, W) tensor, and ``label_field`` -> ``labels`` (int64) when the samples have it
    (for a classification task without an explicit ``label_field``, also ``labels`` or the
    Hugging Face column name ``label``).

    Images are numpy arrays, torch tensors or PIL images, HW (grayscale), HWC or CHW
    (``layout="auto"`` tells them apart by where the 1, 3 or 4 channels are; pass ``"chw"`` or
    ``"hwc"`` when both ends could be channels). uint8 pixels are scaled to [0, 1]; float
    pixels are kept as they are. ``normalize``: ``"imagenet"``, ``"cifar10"``, True (with
    ``mean``/``std``, or ImageNet's statistics without), or False (only the scaling). A
    grayscale image normalised with 3-channel statistics uses channel 0's. Options come from the
    keyword arguments, else from ``task_spec.preprocessing_config`` (same keys), else the
    defaults; ``task_spec.input_fields[0]`` and ``target_field`` name the fields. Other fields
    go through :class:`~wdsloader.collate.DefaultCollator`, with ``optional`` (the schema's
    optional fields: the loader passes them) kept as lists in every batch.
    """

    def __init__(
        self,
        task_spec: TaskSpec | None = None,
        *,
        normalize: bool | str | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        layout: str | None = None,
        image_field: str | None = None,
        label_field: str | None = None,
        optional: Iterable[str] = (),
    ) -> None:
        self.rest = DefaultCollator(optional=optional)
        given: dict[str, Any] = dict(
            normalize=normalize, mean=mean, std=std, layout=layout,
            image_field=image_field, label_field=label_field,
        )  # fmt: skip
        config = dict(task_spec.preprocessing_config) if task_spec is not None else {}
        opts: dict[str, Any] = {k: v if v is not None else config.get(k) for k, v in given.items()}
        named = opts["label_field"]
        if task_spec is not None:
            fields = task_spec.input_fields
            opts["image_field"] = opts["image_field"] or (fields[0] if fields else None)
            opts["label_field"] = opts["label_field"] or task_spec.target_field
        self.layout = opts["layout"] or "auto"
        if self.layout not in LAYOUTS:
            raise ValueError(f"vision: layout={self.layout!r} is not one of {list(LAYOUTS)}")
        norm = opts["normalize"]
        self.stats = _statistics(True if norm is None else norm, opts["mean"], opts["std"])
        self.image_field: str = opts["image_field"] or "pixel_values"
        self.label_field: str = opts["label_field"] or "labels"
        classification = task_spec is not None and task_spec.task_type.endswith("classification")
        # a classification task also reads the Hugging Face column name ``label``
        extra = ("labels", "label") if classification and not named else ()
        self.label_fields = tuple(dict.fromkeys((self.label_field, *extra)))

    def _image(self, sample: dict[str, Any], position: int) -> torch.Tensor:
        field = self.image_field
        if field not in sample:
            raise ValueError(
                f"vision: sample {sample_key(sample, position)} has no field {field!r}; "
                f"its fields: {sorted(sample)}"
            )
        try:
            return _channels_first(_to_array(sample[field]), self.layout)
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"vision: field {field!r} of sample {sample_key(sample, position)}: {exc}"
            ) from None

    def _normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.stats is None:
            return pixels
        mean, std = self.stats
        channels = pixels.shape[1]
        if channels == 1:
            mean, std = mean[:1], std[:1]
        elif len(mean) == 1:
            mean, std = mean * channels, std * channels
        if len(mean) != channels:
            raise ValueError(
                f"vision: field {self.image_field!r} has {channels} channels but the "
                f"normalisation has {len(mean)} (mean {list(mean)})"
            )
        m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        return (pixels - m) / s

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        names = check_batch(samples, "vision")
        images = [self._image(s, i) for i, s in enumerate(samples)]
        for i, im in enumerate(images):
            if im.shape != images[0].shape:
                raise ValueError(
                    f"vision: field {self.image_field!r}: sample {sample_key(samples[0], 0)} is "
                    f"CHW {list(images[0].shape)} but sample {sample_key(samples[i], i)} is "
                    f"{list(im.shape)}; cannot stack (resize the images first)"
                )
        batch: dict[str, Any] = {"pixel_values": self._normalise(torch.stack(images))}
        label = next((f for f in self.label_fields if f in names), None)
        if label is not None:
            batch["labels"] = self._labels(samples, label)
        rest = [n for n in names if n not in (self.image_field, label)]
        if rest:
            batch.update(self.rest([{n: s[n] for n in rest} for s in samples]))
        return batch

    def _labels(self, samples: list[dict[str, Any]], field: str) -> torch.Tensor:
        values = [np.asarray(s[field]) for s in samples]
        if any(v.dtype.kind not in "iub" or v.shape != values[0].shape for v in values):
            kinds = sorted({describe(v) for v in values})
            raise ValueError(
                f"vision: field {field!r} must hold integer classes of one shape, got {kinds}"
            )
        return torch.from_numpy(np.stack(values).astype(np.int64))

    def __eq__(self, other: object) -> bool:
        return type(other) is VisionCollator and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((VisionCollator, self.stats, self.layout, self.image_field))

    def __repr__(self) -> str:
        return (
            f"VisionCollator(stats={self.stats}, layout={self.layout!r}, "
            f"image_field={self.image_field!r}, label_field={self.label_field!r})"
        )
