"""JPEG decoding: simplejpeg when installed, Pillow otherwise, the same pixels either way; DCT
scaling to ``decode_size``; and a whole column of a batch decoded on the image threads."""

from __future__ import annotations

import io
import pickle
import sys
import types

import numpy as np
import pytest
import torch

from build_shards import ShardOptions, build_shards
from wdsloader import create_loader
from wdsloader.decode import images
from wdsloader.decode.codecs import decode_image
from wdsloader.decode.fastcols import batch_decoder
from wdsloader.decode.images import ImageDecoder, dct_scale
from wdsloader.decode.registry import register_decoder

Image = pytest.importorskip("PIL.Image")


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A natural-looking image: smooth gradients, a disc and noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack(
        [127 + 100 * np.sin(0.05 * xx + seed), 127 + 90 * np.cos(0.03 * yy), 60 + xx / w * 150],
        axis=-1,
    )
    img += rng.normal(0, 12, img.shape)
    img[(yy - h / 3) ** 2 + (xx - w / 2) ** 2 < (h / 5) ** 2] = rng.integers(0, 255, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(arr: np.ndarray, mode: str | None = None, **kw) -> bytes:
    out = io.BytesIO()
    img = Image.fromarray(arr)
    (img.convert(mode) if mode else img).save(out, format="JPEG", quality=90, **kw)
    return out.getvalue()


JPEGS = {
    "420": _jpeg(_photo(256, 256, 0)),
    "444": _jpeg(_photo(120, 200, 1), subsampling=0),
    "odd-size": _jpeg(_photo(251, 203, 2)),
    "progressive": _jpeg(_photo(96, 80, 3), progressive=True),
    "grey": _jpeg(_photo(64, 48, 4)[..., 0]),
    "cmyk": _jpeg(_photo(40, 56, 5), "CMYK"),
}


def _pillow(data: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
    """What Pillow alone gives (the reference)."""
    with Image.open(io.BytesIO(data)) as img:
        if size is not None:
            img.draft(None, (size[1], size[0]))
        arr = np.asarray(img if img.mode in ("RGB", "L") else img.convert("RGB"))
    return arr[:, :, None] if arr.ndim == 2 else arr


def _assert_pillows(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.dtype == np.uint8 and out.shape == ref.shape
    # libjpeg-turbo builds may round differently by 1; the bundled ones agree exactly
    assert int(np.abs(out.astype(np.int16) - ref).max()) <= 1


@pytest.mark.parametrize("name", sorted(JPEGS))
@pytest.mark.parametrize("backend", ["auto", "pillow", "simplejpeg"])
def test_jpegs_decode_to_pillows_pixels(name, backend):
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    data = JPEGS[name]
    fn = decode_image if backend == "auto" else ImageDecoder(backend=backend)
    _assert_pillows(fn(memoryview(data)), _pillow(data))


class _FakeSimplejpeg(types.ModuleType):
    """Stands in for simplejpeg (installed or not): records its calls, decodes via Pillow."""

    def __init__(self) -> None:
        super().__init__("simplejpeg")
        self.calls: list[tuple] = []

    def decode_jpeg_header(self, data):
        with Image.open(io.BytesIO(bytes(data))) as img:
            return img.height, img.width, {"L": "Gray", "RGB": "YCbCr"}.get(img.mode, "CMYK"), ""

    def decode_jpeg(self, data, colorspace, fastdct, fastupsample, h=0, w=0, factor=1):
        self.calls.append((colorspace, fastdct, fastupsample, h, w, factor))
        height, width = self.decode_jpeg_header(data)[:2]
        return _pillow(bytes(data), (height // factor, width // factor) if h else None)


@pytest.fixture
def fake_simplejpeg(monkeypatch):
    fake = _FakeSimplejpeg()
    monkeypatch.setitem(sys.modules, "simplejpeg", fake)
    return fake


def test_jpegs_go_to_simplejpeg_when_installed(fake_simplejpeg):
    _assert_pillows(decode_image(JPEGS["420"]), _pillow(JPEGS["420"]))
    _assert_pillows(decode_image(JPEGS["grey"]), _pillow(JPEGS["grey"]))
    # exact decoding only (no fast DCT or upsampling); CMYK and non-JPEGs stay with Pillow
    assert fake_simplejpeg.calls == [
        ("RGB", False, False, 0, 0, 1),
        ("GRAY", False, False, 0, 0, 1),
    ]
    _assert_pillows(decode_image(JPEGS["cmyk"]), _pillow(JPEGS["cmyk"]))
    png = io.BytesIO()
    Image.fromarray(_photo(8, 8, 6)).save(png, format="PNG")
    np.testing.assert_array_equal(decode_image(png.getvalue()), _photo(8, 8, 6))
    ImageDecoder(backend="pillow")(JPEGS["420"])
    assert len(fake_simplejpeg.calls) == 2


def test_without_simplejpeg_pillow_decodes(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import simplejpeg -> ImportError
    assert images._simplejpeg() is None
    for data in JPEGS.values():
        _assert_pillows(decode_image(data), _pillow(data))
        _assert_pillows(ImageDecoder()(data), _pillow(data))
    with pytest.raises(ImportError, match=r"backend='simplejpeg'\) needs simplejpeg"):
        ImageDecoder(backend="simplejpeg")(JPEGS["420"])


@pytest.mark.parametrize(
    ("size", "shape"),
    [((100, 100), (128, 128)), ((64, 64), (64, 64)), ((33, 31), (64, 64)), ((32, 32), (32, 32)),
     ((129, 129), (256, 256)), ((1000, 10), (256, 256))],
)  # fmt: skip
@pytest.mark.parametrize("backend", ["pillow", "simplejpeg"])
def test_decode_size_gives_the_dct_scaled_size(size, shape, backend):
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    data = JPEGS["420"]
    out = ImageDecoder(decode_size=size, backend=backend)(data)
    assert out.shape == (*shape, 3)
    _assert_pillows(out, _pillow(data, size))


def test_decode_size_of_an_odd_size_and_other_formats(fake_simplejpeg):
    assert dct_scale(251, 203, (125, 101)) == 2 and dct_scale(251, 203, (126, 101)) == 1
    out = ImageDecoder(decode_size=(62, 50))(JPEGS["odd-size"])
    assert out.shape == (63, 51, 3)  # ceil(251 / 4) x ceil(203 / 4)
    assert fake_simplejpeg.calls == [("RGB", False, False, 63, 51, 4)]
    assert ImageDecoder(decode_size=(62, 50), backend="pillow")(JPEGS["odd-size"]).shape == (
        63, 51, 3,
    )  # fmt: skip
    png = io.BytesIO()
    Image.fromarray(_photo(20, 30, 7)).save(png, format="PNG")
    assert ImageDecoder(decode_size=(5, 5))(png.getvalue()).shape == (20, 30, 3)  # not JPEG


def test_image_decoder_checks_and_pickles():
    with pytest.raises(ValueError, match="backend must be one of"):
        ImageDecoder(backend="turbo")
    with pytest.raises(ValueError, match="decode_size must be two positive ints"):
        ImageDecoder(decode_size=(0, 5))
    copy = pickle.loads(pickle.dumps(ImageDecoder((64, 48), "pillow")))
    assert (copy.decode_size, copy.backend) == ((64, 48), "pillow")


def test_an_image_column_decodes_on_the_pool():
    data = [JPEGS["420"], JPEGS["444"], JPEGS["grey"]]
    buf = np.frombuffer(b"".join(data), dtype=np.uint8)
    sizes = np.array([len(d) for d in data])
    positions = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for fn in (decode_image, ImageDecoder(decode_size=(50, 50))):
        column = batch_decoder(fn)
        assert column is not None
        out = column(buf, positions, sizes)
        assert len(out) == 3
        for value, d in zip(out, data, strict=True):
            np.testing.assert_array_equal(value, fn(d))
    broken = buf.copy()
    broken[positions[1] + 200 : positions[1] + 2000] = 0xFF
    assert batch_decoder(decode_image)(broken, positions, sizes) is None  # per sample: errors


def _column(data: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    buf = np.frombuffer(b"".join(data), dtype=np.uint8)
    sizes = np.array([len(d) for d in data])
    return buf, np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes


def test_jpegs_of_one_size_decode_straight_into_one_batch_array():
    pytest.importorskip("simplejpeg")
    data = [_jpeg(_photo(64, 48, i)) for i in range(7)]
    buf, positions, sizes = _column(data)
    for fn, shape in ((decode_image, (64, 48)), (ImageDecoder(decode_size=(30, 20)), (32, 24))):
        out = batch_decoder(fn)(buf, positions, sizes)
        # one array for the batch (the collator hands it on as it is: no stacking copy)
        assert isinstance(out, np.ndarray) and out.shape == (7, *shape, 3) and out.base is None
        for row, d in zip(out, data, strict=True):
            np.testing.assert_array_equal(row, fn(d))
    grey = [_jpeg(_photo(40, 32, i)[..., 0]) for i in range(3)]
    out = batch_decoder(decode_image)(*_column(grey))
    assert isinstance(out, np.ndarray) and out.shape == (3, 40, 32, 1)
    # sizes that differ, or Pillow asked for: one array per image, as before
    mixed = batch_decoder(decode_image)(*_column([*data[:2], JPEGS["444"]]))
    assert isinstance(mixed, list) and [v.shape for v in mixed][2] == (120, 200, 3)
    pil = batch_decoder(ImageDecoder(backend="pillow"))(buf, positions, sizes)
    assert isinstance(pil, list) and len(pil) == 7


def test_a_batch_array_image_that_fails_its_check_goes_sample_by_sample():
    pytest.importorskip("simplejpeg")
    from wdsloader.decode.checks import Then

    data = [_jpeg(_photo(64, 48, i)) for i in range(6)]
    third = decode_image(data[2])

    def refuse_third(value):
        if np.array_equal(value, third):
            raise ValueError("not this one")
        return value

    assert batch_decoder(Then(decode_image, refuse_third))(*_column(data)) is None


@pytest.fixture(scope="module")
def jpeg_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpg") / "ds"
    rows = [
        {"__key__": f"k{i:04d}", "image.jpg": _jpeg(_photo(48, 40, i)), "label": i}
        for i in range(40)
    ]
    build_shards(rows, str(root), shards=ShardOptions(max_count=16))
    return str(root)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_gives_pillows_pixels_and_decode_size(jpeg_dataset, workers):
    kw = {"batch_size": 8, "seed": 1, "num_workers": workers}
    for batch in create_loader(jpeg_dataset, "train", **kw):
        assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (8, 48, 40, 3)
        for key, image in zip(batch["__key__"], batch["image"], strict=True):
            ref = _pillow(_jpeg(_photo(48, 40, int(key[1:]))))
            _assert_pillows(image.numpy(), ref)
    register_decoder("jpg", ImageDecoder(decode_size=(24, 20)), replace=True)
    try:
        loader = create_loader(jpeg_dataset, "train", **kw)
        assert loader.dataset_obj.rows.threads == images.IMAGE_THREADS  # on the image threads
        batches = list(loader)
    finally:
        register_decoder("jpg", decode_image, replace=True)
    assert {tuple(b["image"].shape) for b in batches} == {(8, 24, 20, 3)}


def test_a_jpeg_dataset_takes_the_whole_batch_path(jpeg_dataset):
    """Images, labels and nothing gathered: the batch is still decoded as columns (one walk
    finds the members; the images go straight into one batch array), with Pillow's pixels."""
    pytest.importorskip("simplejpeg")
    loader = create_loader(jpeg_dataset, "train", batch_size=8, seed=1)
    batches = list(loader)
    assert loader.stats["gathered_batches"] == len(batches) == 5
    assert loader.stats["parsed_samples"] == 0
    for batch in batches:
        for key, image in zip(batch["__key__"], batch["image"], strict=True):
            ref = _pillow(_jpeg(_photo(48, 40, int(key[1:]))))
            _assert_pillows(image.numpy(), ref)
