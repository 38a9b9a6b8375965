"""Encoded images decoded on the training device: the seam (a protocol and a registry) through
which :class:`~wdsloader.stream.DevicePrefetcher` decodes its ``images=`` fields.

A loader made with ``DecodeOptions(images="encoded")`` hands each image as its encoded file (a
1-D ``uint8`` tensor); the prefetcher decodes a batch's files with the decoder chosen here, on
its side stream, off the reading workers. Decoders:

- ``"nvjpeg"``: ``torchvision.io.decode_jpeg(files, device=...)``, one batched call on a CUDA
  device for the batch's JPEGs; other formats, and a batch nvJPEG refuses, on the CPU.
- ``"cpu"``: :func:`wdsloader.decode.images.decode_image` (simplejpeg or Pillow), then copied to
  the device: the same pixels as a loader that decodes (``images="decoded"``).
- ``"auto"`` (default): ``"nvjpeg"`` on a CUDA device where torchvision imports, else ``"cpu"``.

Every decoder gives ``uint8`` HWC tensors (``(H, W, 1)`` for a grey image), the layout of the
loader's own decode; a batch of one shape is stacked into one ``(B, H, W, C)`` tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

log = logging.getLogger(__name__)

_JPEG_SOI = b"\xff\xd8"


class DeviceImageDecoder(Protocol):
    """Decodes a batch's encoded images onto a device."""

    def __call__(self, encoded: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """One ``uint8`` HWC tensor on ``device`` per file of ``encoded`` (1-D ``uint8`` CPU
        tensors), in order."""
        ...


def decode_on_cpu(encoded: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The library's CPU decode of each file (on its image threads, as the loader decodes),
    copied to ``device``."""
    from wdsloader.decode.images import decode_image, decode_pool

    arrays = decode_pool().map(lambda t: decode_image(t.numpy().data), encoded)
    return [torch.from_numpy(a).to(device) for a in arrays]


def decode_with_nvjpeg(encoded: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The batch's JPEGs in one ``torchvision.io.decode_jpeg`` call on ``device``; the other
    files, and every file of a batch that call refuses (logged), through :func:`decode_on_cpu`."""
    from torchvision.io import ImageReadMode, decode_jpeg

    jpegs = [i for i, t in enumerate(encoded) if t[:2].numpy().tobytes() == _JPEG_SOI]
    out: list[torch.Tensor | None] = [None] * len(encoded)
    if jpegs:
        try:
            chw = decode_jpeg(
                [encoded[i] for i in jpegs], mode=ImageReadMode.UNCHANGED, device=device
            )
        except RuntimeError as exc:
            log.warning("nvJPEG refused a batch (%s); decoding it on the CPU", exc)
            jpegs = []
        else:
            for i, image in zip(jpegs, chw, strict=True):
                out[i] = image.permute(1, 2, 0)
    rest = [i for i, t in enumerate(out) if t is None]
    for i, image in zip(rest, decode_on_cpu([encoded[i] for i in rest], device), strict=True):
        out[i] = image
    return [t for t in out if t is not None]


_DECODERS: dict[str, DeviceImageDecoder] = {"cpu": decode_on_cpu, "nvjpeg": decode_with_nvjpeg}


def register_device_image_decoder(
    name: str, fn: DeviceImageDecoder, *, replace: bool = False
) -> None:
    """Register ``fn`` under ``name`` for ``DevicePrefetcher(image_decoder=name)``; a name
    already taken is a ValueError unless ``replace=True``."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"a device image decoder needs a name other than 'auto', got {name!r}")
    if not callable(fn):
        raise TypeError(f"device image decoder {name!r} must be callable, got {fn!r}")
    if name in _DECODERS and not replace:
        raise ValueError(f"a device image decoder {name!r} is registered; pass replace=True")
    _DECODERS[name] = fn


def _nvjpeg_available(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except (ImportError, RuntimeError):  # absent, or built for another torch
        return False
    return True


def device_image_decoder(
    choice: str | DeviceImageDecoder, device: torch.device
) -> DeviceImageDecoder:
    """The decoder ``choice`` names (or ``choice`` itself when callable); ``"auto"``: nvJPEG on
    a CUDA device where torchvision imports, else the CPU."""
    if callable(choice):
        return choice
    if choice == "auto":
        return _DECODERS["nvjpeg" if _nvjpeg_available(device) else "cpu"]
    if choice not in _DECODERS:
        names = ", ".join(["auto", *sorted(_DECODERS)])
        raise ValueError(f"unknown device image decoder {choice!r}: choose from {names}")
    return _DECODERS[choice]


def encoded_files(value: Any, field: str) -> list[torch.Tensor]:
    """The encoded files of batch field ``field`` as 1-D ``uint8`` tensors: a list of them, or
    the rows of one ``(B, n)`` tensor (files of one length)."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 2:
        return list(value)
    if isinstance(value, list | tuple) and all(_is_file(v) for v in value):
        return [v if isinstance(v, torch.Tensor) else _tensor(v) for v in value]
    raise ValueError(
        f"DevicePrefetcher(images=[{field!r}]): the batch's {field!r} is not encoded images "
        f"({_describe(value)}); make the loader with DecodeOptions(images='encoded')"
    )


def _tensor(v: np.ndarray | bytes | bytearray | memoryview) -> torch.Tensor:
    """A 1-D uint8 tensor of the bytes of ``v``: a view where ``v`` is writable, else a copy
    (torch holds no read-only memory)."""
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v if v.flags.writeable else v.copy())
    if isinstance(v, bytes) or (isinstance(v, memoryview) and v.readonly):
        v = bytearray(v)
    return torch.frombuffer(v, dtype=torch.uint8)


def _is_file(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.dtype == torch.uint8 and v.dim() == 1
    if isinstance(v, np.ndarray):
        return v.dtype == np.uint8 and v.ndim == 1
    return isinstance(v, bytes | bytearray | memoryview)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def stacked(images: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """``images`` as one ``(B, H, W, C)`` tensor when they share a shape, else the list."""
    if images and all(t.shape == images[0].shape for t in images):
        return torch.stack(images)
    return images
