"""``wdsloader report``: one self-contained HTML page whose numbers are the data's (split table =
the manifest; statistics = numpy over exactly the rows sampled; label counts; thumbnails that
decode to the stored pixels), with everything from the data escaped, on local and S3 datasets,
and rendered by a real headless Chromium without a console message."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser

import numpy as np
import pytest

from build_shards import SampleOptions, ShardOptions, build_shards
from wdsloader.access import ShardDataset
from wdsloader.cli.commands import main
from wdsloader.io.manifest_io import load_manifest
from wdsloader.report import collect_report, render_report
from wdsloader.report.stats import field_stats

Image = pytest.importorskip("PIL.Image")

N = 90
HOSTILE = '</td><script>alert("x")</script><img src=x onerror=alert(1)>'


def _color(i):
    return (i * 37 % 256, i * 11 % 256, 255 - i % 256)


def _items():
    for i in range(N):
        yield {
            "__key__": f"s{i:04d}",
            "jpg": Image.fromarray(np.full((20, 30, 3), _color(i), np.uint8)),
            "label": i % 7,
            "score": float(np.sin(i)) * 10,
            "emb": np.arange(4, dtype=np.float32) + i,
            "text": HOSTILE if i % 10 == 3 else "word " * (i % 13),
            "meta": {"note": HOSTILE, "i": i},
            "split": "val" if i % 5 == 0 else "train",
        }


def _score(key):
    return float(np.sin(int(key[1:]))) * 10


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report") / "ds"
    build_shards(
        _items(),
        root,
        shards=ShardOptions(max_count=12),
        samples=SampleOptions(split_field="split"),
    )
    return root


class _Page(HTMLParser):
    """The parts of a report page the tests read: table cells by table id, SVG bars by their
    figure, thumbnails."""

    def __init__(self, text):
        super().__init__()
        self.tables, self.bars, self.thumbs = {}, {}, []
        self._table = self._row = self._figure = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("id"), {})
        elif tag == "tr" and self._table is not None:
            self._row = self._table.setdefault(a.get("data-split") or a.get("data-field"), [])
        elif tag == "td" and self._row is not None:
            self._row.append(a.get("data-value"))
        elif tag == "figure":
            self._figure = self.bars.setdefault(a.get("data-labels"), {})
        elif tag == "rect" and self._figure is not None:
            self._figure[a["data-label"]] = int(a["data-count"])
        elif tag == "img" and "thumb" in (a.get("class") or ""):
            self.thumbs.append(a["src"])

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = self._row = None
        elif tag == "figure":
            self._figure = None


def _report(root, out, *args):
    assert main(["report", str(root), "-o", str(out), *args]) == 0
    return out.read_text(encoding="utf-8")


def test_split_table_equals_the_manifest(built, tmp_path):
    page = _Page(_report(built, tmp_path / "r.html"))
    m = load_manifest(built, None)
    assert set(page.tables["splits"]) - {None} == set(m.splits) == {"train", "val"}
    for name, split in m.splits.items():
        _name, shards, samples, nbytes, _mean = page.tables["splits"][name]
        assert (int(shards), int(samples), int(nbytes)) == (
            len(split.shards), split.num_samples, split.num_bytes,
        )  # fmt: skip


def test_statistics_are_numpys_over_exactly_the_sampled_rows(built, monkeypatch):
    reads = Counter()
    real = ShardDataset._read

    def counting(self, shard, pos):
        reads[self.split] += 1
        return real(self, shard, pos)

    monkeypatch.setattr(ShardDataset, "_read", counting)
    data = collect_report(built, splits=["train"], samples=30, seed=3, previews=0)
    (split,) = data.splits
    assert reads == {"train": 30} and len(set(split.indices)) == 30  # bounded, no row twice
    assert split.indices == sorted(split.indices) and split.indices[-1] >= split.num_rows // 2
    keys = [ShardDataset(built, "train")[i]["__key__"] for i in split.indices]
    scores = np.array([_score(k) for k in keys])
    page = _Page(render_report(data))
    row = page.tables["stats-train"]["score"]  # min, max, mean, NaN share among the cells
    assert [float(v) for v in row if v is not None] == [
        scores.min(),
        scores.max(),
        pytest.approx(scores.mean(), rel=1e-12, abs=0),
        0.0,
    ]
    embs = np.stack([np.arange(4, dtype=np.float32) + int(k[1:]) for k in keys])
    emb = [float(v) for v in page.tables["stats-train"]["emb"] if v is not None]
    assert emb == [embs.min(), embs.max(), pytest.approx(embs.astype(np.float64).mean()), 0.0]
    labels = Counter(str(int(k[1:]) % 7) for k in keys)
    assert page.bars["label"] == dict(labels) and sum(labels.values()) == 30


def test_samples_all_reads_every_row_and_other_seeds_other_rows(built, tmp_path):
    page = _Page(_report(built, tmp_path / "all.html", "--samples", "all", "--split", "val"))
    assert set(page.bars["label"]) == {str(i % 7) for i in range(0, N, 5)}
    assert sum(page.bars["label"].values()) == N // 5
    a = collect_report(built, splits=["train"], samples=10, seed=0, previews=0)
    b = collect_report(built, splits=["train"], samples=10, seed=1, previews=0)
    assert a.splits[0].indices != b.splits[0].indices


def test_numbers_with_nan_and_missing_values():
    stats = field_stats("x", None, [1.0, float("nan"), None, 3.0, 5.0])
    assert (stats.kind, stats.rows, stats.missing) == ("number", 5, 1)
    n = stats.numbers
    assert (n.count, n.min, n.max, n.mean, n.nan_share) == (4, 1.0, 5.0, 3.0, 0.25)
    arrays = [np.array([1.0, np.nan]), np.array([[3.0, 8.0]])]
    stats = field_stats("a", None, arrays)
    assert stats.shapes == {"2": 1, "1x2": 1} and stats.numbers.nan_share == 0.25
    assert (stats.numbers.min, stats.numbers.max, stats.numbers.mean) == (1.0, 8.0, 4.0)
    assert field_stats("m", None, [None, None]).kind == "missing"


def test_thumbnails_are_pngs_of_the_stored_pixels(built, tmp_path):
    page = _Page(_report(built, tmp_path / "r.html", "--split", "train", "--previews", "5"))
    assert len(page.thumbs) == 5
    ds = ShardDataset(built, "train")
    data = collect_report(built, splits=["train"], previews=5)
    for src, row in zip(page.thumbs, data.splits[0].previews, strict=True):
        assert src.startswith("data:image/png;base64,")
        img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        img.load()
        assert img.format == "PNG" and img.width > 0
        i = int(row["__key__"][1:])
        assert img.convert("RGB").getpixel((1, 1)) == _color(i)
        assert ds[row["__index__"]]["__key__"] == row["__key__"]


def test_text_from_the_data_shows_as_text(built, tmp_path):
    text = _report(built, tmp_path / "r.html", "--samples", "all")
    assert "<script" not in text.lower()
    assert "&lt;/td&gt;&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert "<img src=x" not in text
    page = _Page(text)  # the hostile cell did not close its cell: every row has all columns
    widths = {len(r) for r in page.tables["previews-train"].values()}
    assert len(widths) == 1


def test_validate_shows_the_result(built, tmp_path):
    page = _report(built, tmp_path / "ok.html", "--validate")
    m = load_manifest(built, None)
    shards = sum(len(s.shards) for s in m.splits.values())
    assert re.search(rf'id="validation" class="ok">OK: {shards} shards, {N} samples', page)
    broken = tmp_path / "broken"
    shutil.copytree(built, broken)
    shard = m.splits["val"].shards[0].path
    with open(broken / shard, "r+b") as f:
        f.truncate(1024)
    out = tmp_path / "bad.html"
    assert main(["report", str(broken), "-o", str(out), "--validate"]) == 1
    text = out.read_text()
    assert re.search(rf'class="bad">1 problems: {shards} shards', text)
    assert re.search(rf"<li>{re.escape(shard)}: [^<]*size", text), text[text.find("Valid") :]
    val = m.splits["val"].shards[0].num_samples  # the rows of the broken shard: read errors
    errors = re.search(r'<ul id="read-errors-val">(.*?)</ul>', text).group(1)
    assert errors.count("<li>") == val and f"{shard}: truncated" in errors


def test_bad_samples_value_is_a_usage_error(built, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(built), "-o", str(tmp_path / "r.html"), "--samples", "0"])
    assert exc.value.code == 2
    assert "expected a positive number or 'all', got '0'" in capsys.readouterr().err


def test_remote_dataset_without_its_credentials_in_the_page(built, s3_bucket, tmp_path):
    import s3fs

    bucket, options = s3_bucket
    options = {**options, "key": "AKIDREPORT", "secret": "report-secret-value"}
    s3fs.S3FileSystem(**options).put(str(built), f"{bucket}/ds", recursive=True)
    flags = [
        "--storage-option=key=AKIDREPORT",
        "--storage-option=secret=report-secret-value",
        f"--storage-option=client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}",
        "--storage-option=skip_instance_cache=true",
    ]
    text = _report(f"{bucket}/ds", tmp_path / "s3.html", "--samples", "20", "--validate", *flags)
    assert "report-secret-value" not in text and "AKIDREPORT" not in text
    page = _Page(text)
    m = load_manifest(built, None)
    assert int(page.tables["splits"]["train"][2]) == m.splits["train"].num_samples
    assert len(page.thumbs) == 16 and 'class="ok">OK' in text
    remote = collect_report(f"{bucket}/ds", samples=20, storage_options=options, previews=0)
    local = collect_report(built, samples=20, previews=0)
    for r, loc in zip(remote.splits, local.splits, strict=True):  # same rows, same statistics
        assert (r.name, r.indices, r.errors) == (loc.name, loc.indices, [])
        assert r.fields == loc.fields and len(r.indices) == min(20, r.num_rows)


def test_several_datasets_share_one_page_with_a_section_each(built, tmp_path, capsys):
    other = tmp_path / "other"
    build_shards(
        [{"__key__": f"o{i}", "label": 100 + i % 3, "n": np.float32(i)} for i in range(30)],
        other,
        shards=ShardOptions(max_count=8),
    )
    out = tmp_path / "both.html"
    assert main(["report", str(built), str(other), "-o", str(out), "--samples", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{built}: {N:,} rows read; report in {out}",
        f"{other}: 30 rows read; report in {out}",
    ]
    text = out.read_text(encoding="utf-8")
    page = _Page(text)
    ids = re.findall(r'id="([^"]*)"', text)
    assert len(ids) == len(set(ids))  # every id once on the page
    assert {"datasets", "dataset-0", "dataset-1", "d0-splits", "d1-splits"} <= set(ids)
    for k, root in enumerate((built, other)):
        m = load_manifest(root, None)
        for name, split in m.splits.items():
            _, shards, samples, nbytes, _ = page.tables[f"d{k}-splits"][name]
            assert (int(shards), int(samples), int(nbytes)) == (
                len(split.shards), split.num_samples, split.num_bytes,
            )  # fmt: skip
    first, second = (_Page(part) for part in text.split('<section id="dataset-1">'))
    assert second.bars["label"] == dict(Counter(str(100 + i % 3) for i in range(30)))
    assert (
        first.bars["label"]
        == _Page(_report(built, tmp_path / "one.html", "--samples", "all")).bars["label"]
    )
    assert len(page.thumbs) == 16 and not second.thumbs  # the image dataset's (8 per split)


# -- a real browser ------------------------------------------------------------------------------
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
    "--enable-logging=stderr", "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND",
]  # fmt: skip
PROBE = (
    "<script>window.addEventListener('load', () => {const t = [...document.images].filter("
    "i => i.classList.contains('thumb') && i.complete && i.naturalWidth > 0);"
    "document.body.dataset.thumbsRendered = t.length;"
    "document.body.dataset.splitRows = document.querySelectorAll('#splits tbody tr').length;});"
    "</script></body>"
)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium installed (apt-get install chromium): the browser test needs one")


def _browse(browser, page, tmp_path, *args):
    """Chromium's stdout and its console messages (lines of its log naming CONSOLE or an
    uncaught error) for the file ``page``."""
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    return done.stdout, console


def test_the_page_renders_in_headless_chromium(built, tmp_path):
    browser = _chromium()
    control = tmp_path / "control.html"  # the console check sees a page's errors
    control.write_text("<html><body><script>throw new Error('probe-marker')</script></body></html>")
    _, console = _browse(browser, control, tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    assert any("probe-marker" in ln for ln in console), console
    page = tmp_path / "report.html"
    _report(built, page)
    shot = tmp_path / "report.png"
    _, console = _browse(browser, page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    assert console == []  # no error, no blocked request (the network is unreachable)
    print(f"report screenshot: {shot}")
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 2400) and len(img.getcolors(1 << 21)) > 50  # not blank
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE), encoding="utf-8")
    dom, console = _browse(browser, probed, tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    assert console == []
    assert re.search(r'data-split-rows="2"', dom) and '<table id="splits">' in dom
    rendered = int(re.search(r'data-thumbs-rendered="(\d+)"', dom).group(1))
    assert rendered == 16  # 8 previews in each of the two splits


def test_unknown_split_and_missing_dataset_are_one_line_errors(built, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(built), "-o", str(out), "--split", "tset"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wdsloader: error: ") and "'tset'" in err and err.count("\n") == 1
    assert main(["report", str(tmp_path / "nothing"), "-o", str(out)]) == 2
    assert "nothing" in capsys.readouterr().err and not out.exists()
