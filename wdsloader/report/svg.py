"""Inline SVG bar charts: the report page's plots, with no script and no external file."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

import numpy as np

WIDTH, HEIGHT = 420, 150  # the plot area, px
MARGIN_BOTTOM = 34  # room for the axis labels
MAX_BARS = 40  # categories beyond these are summed into "other"
EVERY_LABEL = 12  # up to this many bars, each is labelled (when the labels fit)
CHAR_PX = 6.5  # the width of a label's character, px


def bar_chart(
    labels: Sequence[str], counts: Sequence[int], *, title: str, css_class: str = "bars"
) -> str:
    """A bar per label, heights proportional to ``counts``. Each bar is a ``<rect>`` carrying
    ``data-label`` and ``data-count`` (and a tooltip); ``title`` is the chart's caption."""
    labels, counts = list(labels), [int(c) for c in counts]
    if len(labels) > MAX_BARS:
        other = sum(counts[MAX_BARS - 1 :])
        labels, counts = labels[: MAX_BARS - 1] + ["other"], counts[: MAX_BARS - 1] + [other]
    top = max(counts, default=0) or 1
    height = HEIGHT - 14  # room for the "max" label
    step = WIDTH / max(len(labels), 1)
    parts = []
    for i, (label, count) in enumerate(zip(labels, counts, strict=True)):
        h = height * count / top
        x = i * step
        tip = escape(f"{label}: {count}")
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{HEIGHT - h:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{h:.1f}" data-label="{escape(label)}" data-count="{count}">'
            f"<title>{tip}</title></rect>"
        )
    if len(labels) <= EVERY_LABEL and all(len(x) * CHAR_PX <= step for x in labels):
        parts += [_axis_text((i + 0.5) * step, label, "middle") for i, label in enumerate(labels)]
    elif labels:
        parts += [_axis_text(0, labels[0], "start"), _axis_text(WIDTH, labels[-1], "end")]
    parts.append(f'<text x="2" y="11" font-size="11" fill="#556">max {top:,}</text>')
    total = HEIGHT + MARGIN_BOTTOM
    return (
        f'<figure class="{escape(css_class)}"><svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{WIDTH}" height="{total}" viewBox="0 0 {WIDTH} {total}" role="img">'
        f"{''.join(parts)}</svg><figcaption>{escape(title)}</figcaption></figure>"
    )


def _axis_text(x: float, text: str, anchor: str) -> str:
    shown = text if len(text) <= 24 else text[:23] + "…"
    return (
        f'<text x="{x:.1f}" y="{HEIGHT + 16}" text-anchor="{anchor}" '
        f'font-size="11">{escape(shown)}</text>'
    )


def histogram(values: Sequence[float], *, title: str, unit: str = "", bins: int = 20) -> str:
    """A histogram of ``values`` in at most ``bins`` equal-width bins (integers: one bin per
    value when they span fewer than ``bins``); bars are labelled with their bin's range."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return ""
    low, high = float(arr.min()), float(arr.max())
    integral = bool(np.all(arr == np.round(arr)))
    if integral and high - low < bins:
        edges = np.arange(low, high + 2) - 0.5
    else:
        edges = np.linspace(low, high if high > low else low + 1, bins + 1)
    counts, edges = np.histogram(arr, bins=edges)
    labels = [_bin_label(edges[i], edges[i + 1], integral, unit) for i in range(len(counts))]
    return bar_chart(labels, counts.tolist(), title=title, css_class="hist")


def _bin_label(lo: float, hi: float, integral: bool, unit: str) -> str:
    if integral and hi - lo <= 1:
        return f"{lo + 0.5:.0f}{unit}"
    return f"{_short(lo)}–{_short(hi)}{unit}"


def _short(x: float) -> str:
    return f"{x:.4g}"
