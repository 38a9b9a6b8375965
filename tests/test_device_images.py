"""Images kept encoded by the loader (``DecodeOptions(images="encoded")``) and decoded by the
``DevicePrefetcher`` on the device: the same pixels as the loader's own decode, the decoder seam,
nvJPEG's batching and fallbacks (through a stand-in for torchvision on the CPU; on a real GPU
when one is present), and clear errors."""

from __future__ import annotations

import io
import logging
import sys
import types

import numpy as np
import pytest
import torch

from build_shards import ShardOptions, build_shards
from tests.test_decode_images import _jpeg, _photo
from wdsloader import create_loader
from wdsloader.decode.images import decode_image
from wdsloader.stream import (
    DecodeOptions,
    DevicePrefetcher,
    device_images,
    register_device_image_decoder,
)
from wdsloader.stream.device_images import (
    decode_on_cpu,
    decode_with_nvjpeg,
    device_image_decoder,
    encoded_files,
)

Image = pytest.importorskip("PIL.Image")
ENCODED = DecodeOptions(images="encoded")


def _png(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format="PNG")
    return out.getvalue()


def _file(i: int) -> bytes:
    """Sample ``i``'s image: JPEGs of two sizes, a grey JPEG and a PNG among them."""
    if i % 7 == 3:
        return _png(_photo(20, 16, i))
    if i % 5 == 4:
        return _jpeg(_photo(24, 32, i)[..., 0])
    return _jpeg(_photo(48, 40, i) if i % 2 else _photo(40, 48, i))


def _dataset(tmp_path_factory, name: str, image_of, n: int) -> str:
    root = tmp_path_factory.mktemp(name) / "ds"
    rows = [{"__key__": f"k{i:04d}", "image.jpg": image_of(i), "label": i} for i in range(n)]
    build_shards(rows, str(root), shards=ShardOptions(max_count=16))
    return str(root)


@pytest.fixture(scope="module")
def mixed_images(tmp_path_factory):
    return _dataset(tmp_path_factory, "devimg", _file, 40)


@pytest.fixture(scope="module")
def same_size(tmp_path_factory):
    return _dataset(tmp_path_factory, "devimg1", lambda i: _jpeg(_photo(48, 40, i)), 24)


def _same(a, b) -> bool:
    """Equal values and shapes; the loader's own list of a batch's images of several shapes
    holds numpy arrays, the prefetcher's tensors (on the device)."""
    if isinstance(a, np.ndarray):
        a = torch.from_numpy(a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def test_encoded_files_take_tensors_arrays_and_bytes():
    files = [_file(i) for i in range(4)]
    forms = [
        [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files],
        [np.frombuffer(f, dtype=np.uint8) for f in files],
        files,
        [bytearray(f) for f in files],
        [memoryview(f) for f in files],
    ]
    for form in forms:
        got = encoded_files(form, "image")
        assert [t.numpy().tobytes() for t in got] == files
        assert all(t.dtype == torch.uint8 and t.dim() == 1 for t in got)


def test_the_loader_hands_the_stored_files_when_images_are_kept_encoded(mixed_images):
    seen = 0
    for batch in create_loader(mixed_images, "train", batch_size=8, seed=1, decode=ENCODED):
        files = encoded_files(batch["image"], "image")
        for key, data in zip(batch["__key__"], files, strict=True):
            assert data.dtype == torch.uint8 and data.dim() == 1
            assert data.numpy().tobytes() == _file(int(key[1:]))
            seen += 1
    assert seen == 40


@pytest.mark.parametrize("workers", [0, 2])
def test_the_prefetcher_decodes_to_the_loaders_own_pixels(mixed_images, same_size, workers):
    """Stacked where a batch's images share a shape (the loader's layout), a list otherwise;
    grey JPEGs as (H, W, 1), a PNG among JPEGs; the other fields untouched."""
    kw = {"batch_size": 8, "seed": 1, "num_workers": workers}
    kinds = {}
    for name, root in (("mixed", mixed_images), ("same", same_size)):
        plain = list(create_loader(root, "train", **kw))
        encoded = create_loader(root, "train", decode=ENCODED, **kw)
        moved = list(DevicePrefetcher(encoded, "cpu", images=["image"]))
        assert len(moved) == len(plain) > 0
        for a, b in zip(plain, moved, strict=True):
            assert a["__key__"] == b["__key__"] and torch.equal(a["label"], b["label"])
            assert _same(a["image"], b["image"]), a["__key__"]
        kinds[name] = {type(b["image"]).__name__ for b in moved}
    assert kinds == {"mixed": {"list"}, "same": {"Tensor"}}
    assert moved[0]["image"].shape == (8, 48, 40, 3)


def test_a_registered_decoder_is_used_and_unknown_names_are_refused(same_size, monkeypatch):
    monkeypatch.setattr(device_images, "_DECODERS", dict(device_images._DECODERS))
    calls: list[int] = []

    def counting(encoded, device):
        calls.append(len(encoded))
        return decode_on_cpu(encoded, device)

    register_device_image_decoder("counting", counting)
    with pytest.raises(ValueError, match="'counting' is registered; pass replace=True"):
        register_device_image_decoder("counting", counting)
    loader = create_loader(same_size, "train", batch_size=8, seed=1, decode=ENCODED)
    batches = list(DevicePrefetcher(loader, "cpu", images=["image"], image_decoder="counting"))
    assert calls == [8] * len(batches) == [8, 8, 8]
    with pytest.raises(ValueError, match=r"'nope': choose from auto, counting, cpu, nvjpeg"):
        DevicePrefetcher(loader, "cpu", images=["image"], image_decoder="nope")
    assert device_image_decoder("auto", torch.device("cpu")) is decode_on_cpu


def test_a_field_that_is_not_encoded_images_is_refused_saying_what_to_set(same_size):
    loader = create_loader(same_size, "train", batch_size=8, seed=1)  # decodes itself
    with pytest.raises(ValueError) as err:
        next(iter(DevicePrefetcher(loader, "cpu", images=["image"])))
    assert str(err.value) == (
        "DevicePrefetcher(images=['image']): the batch's 'image' is not encoded images (a "
        "torch.uint8 tensor of shape (8, 48, 40, 3)); make the loader with "
        "DecodeOptions(images='encoded')"
    )
    with pytest.raises(KeyError, match="the batch has no field 'img'"):
        next(iter(DevicePrefetcher(loader, "cpu", images=["img"])))
    with pytest.raises(TypeError, match="not the string"):
        DevicePrefetcher(loader, "cpu", images="image")
    with pytest.raises(ValueError, match="images must be one of"):
        DecodeOptions(images="gpu")


class _FakeTorchvisionIO(types.ModuleType):
    """``torchvision.io`` for the CPU: ``decode_jpeg`` of a list gives CHW tensors (Pillow's
    pixels), records each call, and refuses a batch when told to."""

    class ImageReadMode:
        UNCHANGED = "unchanged"

    def __init__(self) -> None:
        super().__init__("torchvision.io")
        self.calls: list[tuple[int, str, str]] = []
        self.refuse = False

    def decode_jpeg(self, files, mode, device):
        self.calls.append((len(files), mode, str(device)))
        if self.refuse:
            raise RuntimeError("nvjpeg: unsupported")
        return [torch.from_numpy(decode_image(f.numpy().data)).permute(2, 0, 1) for f in files]


@pytest.fixture
def fake_torchvision(monkeypatch):
    io_module = _FakeTorchvisionIO()
    package = types.ModuleType("torchvision")
    package.io = io_module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", io_module)
    return io_module


def test_nvjpeg_decodes_a_batchs_jpegs_in_one_call_and_the_rest_on_the_cpu(
    fake_torchvision, caplog
):
    files = [_file(i) for i in range(8)]  # 3: a PNG, 4: grey
    encoded = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    want = [torch.from_numpy(decode_image(f)) for f in files]
    got = decode_with_nvjpeg(encoded, torch.device("cpu"))
    assert fake_torchvision.calls == [(7, "unchanged", "cpu")]  # the PNG is not sent
    assert all(_same(a, b) for a, b in zip(want, got, strict=True))
    assert got[4].shape == (24, 32, 1)
    fake_torchvision.refuse = True
    with caplog.at_level(logging.WARNING, logger="wdsloader.stream.device_images"):
        got = decode_with_nvjpeg(encoded, torch.device("cpu"))
    assert all(_same(a, b) for a, b in zip(want, got, strict=True))
    assert "nvJPEG refused a batch (nvjpeg: unsupported); decoding it on the CPU" in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_nvjpeg_decodes_close_to_the_cpu_pixels(same_size):
    pytest.importorskip("torchvision.io")
    loader = create_loader(same_size, "train", batch_size=8, seed=1, decode=ENCODED)
    plain = list(create_loader(same_size, "train", batch_size=8, seed=1))
    moved = list(DevicePrefetcher(loader, "cuda", images=["image"]))
    for a, b in zip(plain, moved, strict=True):
        assert b["image"].device.type == "cuda" and b["image"].shape == a["image"].shape
        diff = (b["image"].cpu().int() - a["image"].int()).abs().float().mean()
        assert diff < 2.0  # nvJPEG's IDCT is not libjpeg-turbo's: a level or two apart
