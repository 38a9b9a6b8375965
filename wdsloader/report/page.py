"""The report page: one self-contained HTML file (inline CSS, inline SVG plots, thumbnails as
data URIs, no script) from a :class:`~wdsloader.report.collect.ReportData`. Every string that
comes from the data or the manifest is HTML-escaped."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from html import escape
from typing import Any

from wdsloader.redact import MASK, redact
from wdsloader.report.collect import ReportData, SplitSample
from wdsloader.report.preview import preview_cell
from wdsloader.report.stats import FieldStats, NumberSummary, is_image
from wdsloader.report.svg import bar_chart, histogram

MAX_ERRORS = 20  # unreadable rows listed per split

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;
max-width:1200px;padding:0 16px;color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dde}
h3{font-size:15px;margin:18px 0 6px}.muted{color:#667}
table{border-collapse:collapse;margin:6px 0 12px}th,td{border:1px solid #dde;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f4f8}td.n{text-align:right;
font-variant-numeric:tabular-nums}code,pre{font:12px ui-monospace,Menlo,Consolas,monospace}
pre{background:#f6f7f9;padding:10px;overflow:auto;max-height:420px}
.charts{display:flex;flex-wrap:wrap;gap:18px}figure{margin:0}figcaption{font-size:12px;color:#556}
rect{fill:#4c72b0}rect:hover{fill:#dd8452}.text{max-width:420px;white-space:pre-wrap;
word-break:break-word;max-height:9em;overflow:auto}img.thumb{max-width:128px;max-height:128px;
image-rendering:auto;border:1px solid #ccd}.ok{color:#1a7f37;font-weight:600}
.bad{color:#c62828;font-weight:600}.none{color:#99a}
"""


def render_report(data: ReportData) -> str:
    """The whole page as one HTML string (credentials masked)."""
    return _mask(data, _page(escape(data.where), _body(data)))


def render_reports(datas: Sequence[ReportData]) -> str:
    """One page for several datasets (e.g. the sources of a mix): a list of them, then each
    one's report in its own section (``id="dataset-K"``, its element ids prefixed ``dK-``);
    every dataset's credentials masked. One dataset: :func:`render_report`'s page."""
    if len(datas) == 1:
        return render_report(datas[0])
    items, sections = [], []
    for k, data in enumerate(datas):
        body = _ID.sub(lambda m, k=k: f'id="d{k}-{m[1]}"', _body(data))  # type: ignore[misc]
        where = escape(data.where)
        items.append(
            f'<li><a href="#dataset-{k}">{where}</a>: {data.manifest.num_samples:,} samples</li>'
        )
        sections.append(f'<section id="dataset-{k}">{body}</section>')
    title = f"{len(datas)} datasets"
    contents = f'<h1>{title}</h1><ul id="datasets">{"".join(items)}</ul>'
    page = _page(title, contents + "\n".join(sections))
    for data in datas:
        page = _mask(data, page)
    return page


_ID = re.compile(r'id="([^"]*)"')


def _page(title: str, body: str) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>wdsloader report: {title}</title><style>{CSS}</style></head><body>",
            body,
            "</body></html>",
        ]
    )


def _body(data: ReportData) -> str:
    """One dataset's report: its title and sections."""
    m = data.manifest
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    shown = "every row" if data.samples is None else f"up to {data.samples:,} rows"
    parts = [
        f"<h1>{escape(data.where)}</h1>",
        f'<p class="muted">format {escape(m.format)} {escape(m.version)} · '
        f"{m.num_samples:,} samples · {_mb(m.num_bytes)} · statistics from {shown} per split "
        f"(seed {data.seed}) · made {when}</p>",
        _splits_section(data),
        _schema_section(data),
        *(_split_section(s, data) for s in data.splits),
        _build_section(data),
        _validation_section(data),
    ]
    return "\n".join(p for p in parts if p)


def _mask(data: ReportData, page: str) -> str:
    for secret in sorted(data.secrets, key=len, reverse=True):
        page = page.replace(secret, MASK).replace(escape(secret), MASK)
    return page


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def _num(x: float | None) -> str:
    """A number cell: shown in 6 significant digits, exact in ``data-value``."""
    if x is None:
        return '<td class="n"></td>'
    return f'<td class="n" data-value="{x!r}">{x:.6g}</td>'


def _table(table_id: str, headers: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table id="{escape(table_id)}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _splits_section(data: ReportData) -> str:
    rows, charts = [], []
    for name, split in data.manifest.splits.items():
        sizes = [s.num_bytes for s in split.shards]
        mean = split.num_bytes / len(sizes) if sizes else 0
        rows.append(
            f'<tr data-split="{escape(name)}"><td>{escape(name)}</td>'
            f'<td class="n" data-value="{len(sizes)}">{len(sizes):,}</td>'
            f'<td class="n" data-value="{split.num_samples}">{split.num_samples:,}</td>'
            f'<td class="n" data-value="{split.num_bytes}">{_mb(split.num_bytes)}</td>'
            f'<td class="n">{_mb(mean)}</td></tr>'
        )
        if sizes:
            scale, unit = (1e6, "MB") if max(sizes) >= 1e6 else (1e3, "kB")
            title = f"{name}: shard sizes ({unit}), {len(sizes):,} shards"
            charts.append(histogram([s / scale for s in sizes], title=title))
    table = _table("splits", ["split", "shards", "samples", "bytes", "mean shard"], rows)
    return f'<h2>Splits and shards</h2>{table}<div class="charts">{"".join(charts)}</div>'


def _schema_section(data: ReportData) -> str:
    m = data.manifest
    rows = []
    for name, spec in m.schema.items():
        cells = [name, spec.ext, spec.encoding, spec.dtype, spec.shape, spec.range]
        flags = [f for f, on in (("optional", spec.optional), ("grouped", spec.grouped)) if on]
        cells.append(", ".join(flags))
        rows.append("<tr>" + "".join(f"<td>{escape(_text(c))}</td>" for c in cells) + "</tr>")
    headers = ["field", "member", "encoding", "dtype", "shape", "range", "flags"]
    dims = ", ".join(f"{k} = {v}" for k, v in m.dims.items())
    dims_html = f"<p>dims: <code>{escape(dims)}</code></p>" if dims else ""
    return f"<h2>Schema</h2>{_table('schema', headers, rows)}{dims_html}"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _split_section(split: SplitSample, data: ReportData) -> str:
    sid = f"split-{split.name}"
    read = len(split.indices)
    head = (
        f'<h2 id="{escape(sid)}">Split {escape(split.name)}</h2><p class="muted">'
        f"{read - len(split.errors):,} of {split.num_rows:,} rows read in {split.seconds:.2f} s</p>"
    )
    return (
        head + _read_errors(split) + _stats_table(split) + _charts(split) + _previews(split, data)
    )


def _read_errors(split: SplitSample) -> str:
    if not split.errors:
        return ""
    items = "".join(f"<li>{escape(e)}</li>" for e in split.errors[:MAX_ERRORS])
    more = len(split.errors) - MAX_ERRORS
    tail = f"<li>… and {more:,} more</li>" if more > 0 else ""
    return (
        f'<p class="bad">{len(split.errors):,} of the rows drawn could not be read:</p>'
        f'<ul id="read-errors-{escape(split.name)}">{items}{tail}</ul>'
    )


def _stats_table(split: SplitSample) -> str:
    rows = []
    for f in split.fields:
        n = f.numbers or NumberSummary(0, None, None, None, 0.0)
        nan = f"{n.nan_share:.1%}" if f.numbers else ""
        nan_cell = (
            f'<td class="n" data-value="{n.nan_share!r}">{nan}</td>' if f.numbers else "<td></td>"
        )
        shapes = ", ".join(f"{s} ×{c}" for s, c in f.shapes.most_common(5))
        dtypes = ", ".join(f.dtypes)
        lengths = _length_text(f.lengths)
        rows.append(
            f'<tr data-field="{escape(f.name)}"><td>{escape(f.name)}</td><td>{escape(f.kind)}</td>'
            f'<td class="n">{f.rows - f.missing:,}</td><td class="n">{f.missing:,}</td>'
            f"{_num(n.min)}{_num(n.max)}{_num(n.mean)}{nan_cell}"
            f"<td>{escape(' '.join(x for x in (dtypes, shapes) if x))}</td>"
            f"<td>{escape(lengths)}</td></tr>"
        )
    headers = ["field", "kind", "rows", "missing", "min", "max", "mean", "NaN", "dtype, shapes"]
    return _table(f"stats-{split.name}", [*headers, "length"], rows)


def _length_text(lengths: list[int]) -> str:
    if not lengths:
        return ""
    return f"{min(lengths):,}–{max(lengths):,} (mean {sum(lengths) / len(lengths):,.1f})"


def _charts(split: SplitSample) -> str:
    charts = []
    for f in split.fields:
        charts += _field_charts(f, split.name)
    return f'<div class="charts">{"".join(charts)}</div>' if charts else ""


def _field_charts(f: FieldStats, split: str) -> list[str]:
    out = []
    if f.labels:
        items = sorted(f.labels.items(), key=_label_order)
        labels, counts = [k for k, _ in items], [c for _, c in items]
        chart = bar_chart(labels, counts, title=f"{f.name}: label distribution ({split})")
        out.append(chart.replace("<figure ", f'<figure data-labels="{escape(f.name)}" ', 1))
    if f.lengths:
        unit = " chars" if f.kind == "text" else " B"
        out.append(histogram(f.lengths, title=f"{f.name}: length ({unit.strip()})", unit=""))
    if len(f.shapes) > 1:
        items = f.shapes.most_common()
        out.append(
            bar_chart([s for s, _ in items], [c for _, c in items], title=f"{f.name}: shapes")
        )
    return out


def _label_order(item: tuple[str, int]) -> tuple[int, float, str]:
    """Numeric labels in numeric order, then the others by name."""
    try:
        return (0, float(item[0]), "")
    except ValueError:
        return (1, 0.0, item[0])


def _previews(split: SplitSample, data: ReportData) -> str:
    if not split.previews:
        return ""
    schema = data.manifest.schema
    names = [f.name for f in split.fields]
    rows = []
    for row in split.previews:
        cells = "".join(
            f"<td>{preview_cell(row.get(n), is_image(schema.get(n)))}</td>" for n in names
        )
        rows.append(
            f'<tr><td class="n">{int(row["__index__"]):,}</td>'
            f"<td><code>{escape(str(row['__key__']))}</code></td>{cells}</tr>"
        )
    table = _table(f"previews-{split.name}", ["index", "key", *names], rows)
    return f"<h3>Samples</h3>{table}"


def _build_section(data: ReportData) -> str:
    m = data.manifest
    parts = ["<h2>Build parameters</h2>"]
    build = json.dumps(m.build, indent=2, sort_keys=True, default=str)
    parts.append(f'<pre id="build">{escape(redact(build, data.secrets))}</pre>')
    if m.loader_defaults:
        defaults = json.dumps(m.loader_defaults, indent=2, sort_keys=True, default=str)
        parts.append(f'<h3>Loader defaults</h3><pre id="loader-defaults">{escape(defaults)}</pre>')
    return "".join(parts)


def _validation_section(data: ReportData) -> str:
    v = data.validation
    if v is None:
        return ""
    mode = " (deep: every sample decoded)" if data.validation_deep else ""
    checked = f"{v.shards_checked:,} shards, {v.samples_checked:,} samples checked{mode}"
    if v.ok:
        return f'<h2>Validation</h2><p id="validation" class="ok">OK: {escape(checked)}</p>'
    items = "".join(f"<li>{escape(redact(p, data.secrets))}</li>" for p in v.problems)
    return (
        f'<h2>Validation</h2><p id="validation" class="bad">{len(v.problems):,} problems: '
        f"{escape(checked)}</p><ul>{items}</ul>"
    )
