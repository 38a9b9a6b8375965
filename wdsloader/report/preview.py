"""One sampled value as the report page previews it: images as thumbnails (PNG data URIs),
text as an excerpt, arrays summarised. Everything returned is HTML with the data escaped."""

from __future__ import annotations

import base64
import io
import json
from html import escape
from typing import Any

import numpy as np

from wdsloader.report.stats import as_array, shape_text

THUMB_PX = 128  # a thumbnail's longer side
MIN_THUMB_PX = 48  # smaller images are enlarged (nearest neighbour) to at least this
EXCERPT_CHARS = 300  # characters of a text value shown
ARRAY_ITEMS = 6  # leading items of an array shown


def thumbnail_uri(image: np.ndarray) -> str | None:
    """A PNG data URI of ``image`` (``(H, W)`` or ``(H, W, C)`` with C in 1, 3, 4; ``(C, H, W)``
    too), at most ``THUMB_PX`` on its longer side; None when it is not such an image."""
    from PIL import Image

    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[2] not in (1, 3, 4):
        arr = arr.transpose(1, 2, 0)  # CHW -> HWC
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (3, 4)) or not arr.size:
        return None
    if arr.dtype != np.uint8:
        arr = _to_uint8(arr)
    img = Image.fromarray(np.ascontiguousarray(arr))
    img.thumbnail((THUMB_PX, THUMB_PX))
    if max(img.size) < MIN_THUMB_PX:  # a tiny image, enlarged to be seen
        factor = -(-MIN_THUMB_PX // max(img.size))
        img = img.resize((img.width * factor, img.height * factor), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    """A float or wide-integer image scaled to 0..255 (floats in [0, 1] as they are meant)."""
    f = np.nan_to_num(arr.astype(np.float64))
    low, high = float(f.min()), float(f.max())
    if arr.dtype.kind == "f" and low >= 0.0 and high <= 1.0:
        return np.round(f * 255).astype(np.uint8)
    scale = (high - low) or 1.0
    return np.round((f - low) * 255 / scale).astype(np.uint8)


def array_summary(arr: np.ndarray) -> str:
    """``float32[4] [0.1, 2, ...] min 0.1 max 7``: dtype, shape, leading items, range."""
    head = f"{arr.dtype}[{shape_text(arr.shape)}]"
    if arr.size == 0 or arr.dtype.kind not in "biuf":
        return head
    flat = arr.reshape(-1)
    items = ", ".join(f"{float(x):.4g}" for x in flat[:ARRAY_ITEMS])
    more = ", …" if flat.size > ARRAY_ITEMS else ""
    with np.errstate(all="ignore"):
        low, high = np.nanmin(flat.astype(np.float64)), np.nanmax(flat.astype(np.float64))
    return f"{head} [{items}{more}] min {low:.4g} max {high:.4g}"


def excerpt(text: str) -> str:
    """The first ``EXCERPT_CHARS`` characters of ``text``, with its length when cut."""
    if len(text) <= EXCERPT_CHARS:
        return text
    return f"{text[:EXCERPT_CHARS]}… ({len(text):,} characters)"


def preview_cell(value: Any, image: bool) -> str:
    """The HTML of one value in the previews table (data escaped)."""
    if value is None:
        return '<span class="none">missing</span>'
    arr = as_array(value)
    if arr is not None and image:
        uri = thumbnail_uri(arr)
        if uri is not None:
            tip = escape(f"{arr.dtype}[{shape_text(arr.shape)}]")
            return f'<img class="thumb" alt="{tip}" title="{tip}" src="{uri}">'
    if arr is not None:
        return f"<code>{escape(array_summary(arr))}</code>"
    if isinstance(value, str):
        return f'<div class="text">{escape(excerpt(value))}</div>'
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<code>bytes, {len(bytes(value)):,}</code>"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False, default=str)
        return f"<code>{escape(excerpt(text))}</code>"
    if isinstance(value, (float, np.floating)):
        return f"<code>{float(value):.6g}</code>"
    return f"<code>{escape(str(value))}</code>"
