"""Medians, targets, the markdown tables and the chart of a benchmark run."""

from __future__ import annotations

import statistics
from typing import Any

from bench import busy, systems

SETTINGS = {
    "ours": 'create_loader(path, "train", batch_size=256, num_workers=W, seed=0): planned '
    "spans of ~256 KiB permuted globally, shuffled within ~64 MiB windows",
    "webdataset": f"WebDataset(shardshuffle={systems.WDS_SHARD_SHUFFLE}, seed=0, "
    f"split_by_worker).shuffle({systems.WDS_BUFFER}).decode().batched(256) + WebLoader",
    "mosaic": "StreamingDataset(local=..., shuffle=True, shuffle_seed=0, batch_size=256) "
    "(default py1e shuffle) + torch DataLoader(batch_size=256)",
    "litdata": "StreamingDataset(dir, shuffle=True, seed=0) + StreamingDataLoader(batch_size=256)",
    "litdata_bd0": "the same with StreamingDataset(..., batch_decode=0): its default "
    '"auto" decodes a window of items around every item it serves in a shuffled read',
    "hf": 'load_dataset("webdataset", data_files=..., streaming=True)'
    f".shuffle(seed=0, buffer_size={systems.HF_BUFFER}) + torch DataLoader(batch_size=256)",
    "ours_adopted": "the same loader on the webdataset-written shards of the same samples, "
    "adopted by build_shards.adopt (idx files + manifest beside the untouched tars)",
    "raw_read": "the raw limit: every shard file of ours read with readinto into one reused "
    "1 MiB buffer, after one untimed pass of the same loop in the same process (a warm page "
    "cache, exactly like the reads it bounds); 'of limit' = samples/s / this",
    "raw_batches": "the same bytes read into a fresh numpy buffer of one batch's bytes at a "
    "time (the copy's destination is new memory, as for a loader that hands out each batch in "
    "memory of its own)",
    "raw_tarfile": 'tarfile.open(shard, "r|"): read every member of our shards (no decoding)',
    "writers": "shards/chunks of 64 MiB (--quick: 4 MiB), no compression; ours: "
    "build_shards(torch map-style Dataset, default block size); webdataset: ShardWriter "
    "(.npy/.bin/.jpg + .cls + .json); mosaic: MDSWriter (ndarray/bytes columns + int + json); "
    "litdata: optimize(fn, range(n), num_workers=W) (arrays, bytes, int, JSON text)",
    "batch": "every system ends with the same batch: a stacked tensor per payload field (blobs "
    "uint8[n, 163840], JPEGs decoded by Pillow to uint8[n, 256, 256, 3]), label int64[n], "
    "meta: list of dicts",
    "mb_per_s": "payload bytes (array bytes + JSON text) per second, the same for every system",
    "cpu": "samples/CPU-s: samples per second of CPU time of the reading process and its "
    "DataLoader workers (user + system): robust where other jobs share the cores, unlike "
    "samples/s; a read stopped at the time limit leaves workers that are not counted",
    "busy": "busy consumer (bench/busy.py): after each batch the reading process does fixed "
    "CPU work (matmul: numpy on one BLAS thread, releases the GIL; gil: pure Python, holds "
    "it); waiting for data = time in next() on the loader after the first batch / time from "
    "the first batch to the end",
    "shuffle": "dist/N: mean |source position difference| of consecutive samples over N "
    "(uniform permutation: 1/3); |rho|: Spearman between source order and stream order "
    "(uniform: ~0); both on what was read (the first part of the epoch for partial runs)",
}
SYSTEM_ORDER = (
    "ours", "ours_adopted", "webdataset", "mosaic", "litdata", "litdata_bd0", "hf", "raw_read",
    "raw_batches", "raw_tarfile",
)  # fmt: skip
LIMIT = "raw_read"
NUMERIC = (
    "samples_per_s",
    "steady_samples_per_s",
    "parsed_samples",
    "samples_per_cpu_s",
    "mb_per_s",
    "file_mb_per_s",
    "ttfb_s",
    "import_s",
    "peak_rss_mb",
    "peak_rss_worker_mb",
    "rss_baseline_mb",
    "seconds",
    "samples",
    "dist_over_n",
    "abs_rho",
    "disk_over_payload",
    "disk_bytes",
    "cpu_seconds",
    "wait_share",
    "work_ms",
    "step_work_ms",
)


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if isinstance(v, int | float)]
    return statistics.median(vals) if vals else None


def _complete(r: dict[str, Any]) -> bool:
    """A run read the whole epoch (also when the time limit struck on its last batch)."""
    n_total = r.get("n_total")
    return bool(r.get("complete", True) or (n_total and (r.get("samples") or 0) >= n_total))


def _exactly_once(r: dict[str, Any]) -> bool:
    if r.get("exactly_once") is not None:
        return bool(r["exactly_once"])
    return bool(r.get("no_duplicates") and r.get("samples") == r.get("n_total"))


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the successful runs of one measurement, and what went wrong in the others."""
    ok = [r for r in results if "error" not in r]
    out: dict[str, Any] = {"runs": len(ok), "errors": [r["error"] for r in results if "error" in r]}
    if not ok:
        return out
    for k in NUMERIC:
        out[k] = _median([r.get(k) for r in ok])
    out["values"] = [r.get("samples_per_s") for r in ok]
    out["complete"] = all(_complete(r) for r in ok)
    out["n_total"] = ok[0].get("n_total")
    if "exactly_once" in ok[0] or "no_duplicates" in ok[0]:
        out["exactly_once"] = all(_exactly_once(r) for r in ok) if out["complete"] else None
        out["no_duplicates"] = all(r.get("no_duplicates") for r in ok)
        out["duplicates"] = max(r.get("duplicates") or 0 for r in ok)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """Medians per measurement, ratios vs ours, and every target with PASS/MISS."""
    agg = {label: aggregate(rs) for label, rs in doc["runs"].items()}

    def rate(label: str) -> float | None:
        return agg.get(label, {}).get("samples_per_s")

    def get(label: str, key: str) -> Any:
        return agg.get(label, {}).get(key)

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, ok: bool | None, shown: str) -> None:
        status = "n/a" if value is None or ok is None else ("PASS" if ok else "MISS")
        targets.append({"target": name, "measured": value, "shown": shown, "status": status})

    def fmt(v: float | None, spec: str = ".1f", suffix: str = "x") -> str:
        return "n/a" if v is None else f"{v:{spec}}{suffix}"

    def best(workload: str, nw: int, *names: str) -> float | None:
        rates = [rate(f"read {workload} {s} W{nw}") for s in names]
        known = [r for r in rates if r]
        return max(known) if known else None

    def at_least(name: str, value: float | None, need: float, spec: str = ".1f") -> None:
        target(name, value, None if value is None else value >= need, fmt(value, spec))

    litdata = ("litdata", "litdata_bd0")
    ours0 = rate("read embed ours W0")
    target(
        "realistic embedding sample (label + JSON), num_workers=0: >= 100k samples/s",
        ours0,
        None if ours0 is None else ours0 >= 100_000,
        fmt(ours0, ",.0f", " samples/s"),
    )
    at_least(
        "realistic embedding sample, num_workers=0: ours >= 3x LitData (its faster setting)",
        _ratio(ours0, best("embed", 0, *litdata)),
        3.0,
    )
    arrays0 = rate("read embed_arrays ours W0")
    target(
        "embedding arrays only, num_workers=0: >= 150k samples/s",
        arrays0,
        None if arrays0 is None else arrays0 >= 150_000,
        fmt(arrays0, ",.0f", " samples/s"),
    )
    for w in ("embed", "embed_arrays"):
        peers = ("webdataset", "mosaic", *litdata)
        at_least(
            f"{w}, num_workers=2: ours >= 1x the fastest peer (keep the lead)",
            _ratio(rate(f"read {w} ours W2"), best(w, 2, *peers)),
            1.0,
        )
    r = _ratio(rate("read blobs ours W0"), rate(f"read blobs {LIMIT} W0"))
    target(
        "large blobs: ours >= 40% of the raw limit (warm readinto loop, same files)",
        r,
        None if r is None else r >= 0.4,
        fmt(None if r is None else 100 * r, ".0f", "%"),
    )
    at_least(
        "large blobs, num_workers=0: ours >= 1.5x LitData (its faster setting)",
        _ratio(rate("read blobs ours W0"), best("blobs", 0, *litdata)),
        1.5,
    )
    r = _ratio(rate("read embed ours W0"), rate("read embed ours_adopted W0"))
    target(
        "adopted webdataset shards within 1.5x of our own (ours / adopted <= 1.5)",
        r,
        None if r is None else r <= 1.5,
        fmt(r, ".2f"),
    )
    d = get("read embed ours W0", "dist_over_n")
    target("shuffle: consecutive distance / N >= 0.25", d, None if d is None else d >= 0.25,
           fmt(d, ".3f", ""))  # fmt: skip
    rho = get("read embed ours W0", "abs_rho")
    target("shuffle: |rho| source vs stream <= 0.05", rho, None if rho is None else rho <= 0.05,
           fmt(rho, ".3f", ""))  # fmt: skip
    eo = [get(lbl, "exactly_once") for lbl in agg if lbl.startswith("read") and " ours " in lbl]
    eo_known = [e for e in eo if e is not None]
    target(
        "ours: every sample exactly once per epoch (all reads)",
        1.0 if eo_known else None,
        all(eo_known) if eo_known else None,
        f"{sum(eo_known)}/{len(eo_known)} reads",
    )
    at_least(
        "build embeddings: ours (1 worker) >= 2x MDSWriter samples/s",
        _ratio(rate("build embed ours w1"), rate("build embed mosaic w1")),
        2.0,
    )
    at_least(
        "build blobs: ours (1 worker) >= webdataset's ShardWriter",
        _ratio(rate("build blobs ours w1"), rate("build blobs webdataset w1")),
        1.0,
        ".2f",
    )
    for w in ("embed", "blobs"):
        at_least(
            f"build {w}: 2 workers / 1 worker >= 1.3x on 2 cores",
            _ratio(rate(f"build {w} ours w2"), rate(f"build {w} ours w1")),
            1.3,
            ".2f",
        )
    small = get("memory embed-small ours W0", "peak_rss_mb")
    big = get("memory embed ours W0", "peak_rss_mb")
    r = _ratio(big, small)
    target(
        "memory: peak RSS at 10x the samples within 10%",
        r,
        None if r is None else abs(r - 1) <= 0.10,
        "n/a" if r is None else f"{small:.0f} -> {big:.0f} MB ({100 * (r - 1):+.1f}%)",
    )
    ttfbs = [
        (lbl, get(lbl, "ttfb_s"))
        for lbl in agg
        if lbl.startswith("read") and " ours " in lbl and get(lbl, "ttfb_s") is not None
    ]
    worst = max(ttfbs, key=lambda x: x[1]) if ttfbs else (None, None)
    target(
        "time to first batch, local: < 1 s (slowest of our reads)",
        worst[1],
        None if worst[1] is None else worst[1] < 1.0,
        fmt(worst[1], ".3f", " s") + (f" ({worst[0][5:]})" if worst[0] else ""),
    )
    s3 = doc.get("s3")
    s3_agg = None
    if isinstance(s3, dict):
        s3_agg = aggregate(s3["runs"])
        s3_agg["moto_get_mb_per_s"] = s3.get("moto_get_mb_per_s")
    s3_ttfb = s3_agg.get("ttfb_s") if s3_agg else None
    shown = str(s3)
    if s3_agg:
        shown = fmt(s3_ttfb, ".3f", " s")
        if s3_agg.get("moto_get_mb_per_s"):
            shown += f" (moto serves a whole shard at {s3_agg['moto_get_mb_per_s']:.0f} MB/s)"
    targets.append(
        {
            "target": "time to first batch, S3 on loopback (moto): reported",
            "measured": s3_ttfb,
            "shown": shown,
            "status": "info",
        }
    )
    gpu = doc.get("gpu") or {}
    targets.append(
        {
            "target": "GPU feed (DevicePrefetcher, CUDA only)",
            "measured": gpu.get("samples_per_s"),
            "shown": (
                f"skipped: {gpu['skipped']}"
                if "skipped" in gpu
                else gpu.get("error") or f"{gpu.get('samples_per_s', 0):,.0f} samples/s"
            ),
            "status": "info",
        }
    )
    for name, value, need in busy.targets(agg):
        at_least(name, value, need)
    return {"measurements": agg, "targets": targets, "s3": s3_agg}


# ------------------------------------------------------------------------------------------------
# markdown
# ------------------------------------------------------------------------------------------------


def _n(v: float | None, spec: str = ",.0f") -> str:
    return "–" if v is None else format(v, spec)


def _share(rate: float | None, limit: float | None) -> str:
    share = _ratio(rate, limit)
    return "–" if share is None else f"{100 * share:.1f}%"


def _title(system: str) -> str:
    return systems.TITLES.get(system, system)


def _read_rows(doc: dict[str, Any], workload: str) -> list[tuple[str, int, dict[str, Any]]]:
    agg = doc["summary"]["measurements"]
    rows = []
    for system in SYSTEM_ORDER:
        for nw in (0, 1, 2, 4, 8):
            label = f"read {workload} {system} W{nw}"
            if label in agg:
                rows.append((system, nw, agg[label]))
    return rows


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    cfg = doc["config"]
    v = m["versions"]
    lines = [
        "# wdsloader benchmark results",
        "",
        f"{m['date']} · {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM · "
        f"Python {m['python']}, torch {v.get('torch')}, numpy {v.get('numpy')} · "
        f"{'quick mode, ' if cfg['quick'] else ''}median of {cfg['repeats']} interleaved runs, "
        f"each in a fresh process, warm page cache (each run's files read once just before it), "
        f"batch {cfg['batch_size']}, "
        f"reads stopped after {cfg['max_seconds']:g} s (partial epochs are marked).",
        "",
        "Peers: "
        + ", ".join(
            dict.fromkeys(
                f"{d} {v.get(d) or '(missing)'}"
                for s, (_, d) in systems.PEERS.items()
                if s in doc["systems"] or s in doc["missing"]
            )
        )
        + ".",
    ]
    if doc.get("note"):
        lines += ["", str(doc["note"])]
    if cfg["quick"]:
        lines += [
            "",
            "Quick mode: tiny datasets and one run each, so start-up dominates every number; "
            "the targets mean something only in a full run.",
        ]
    if doc["missing"]:
        lines += [
            "",
            "Missing or failed: " + "; ".join(f"{k}: {r}" for k, r in doc["missing"].items()),
        ]
    lines += ["", "## Targets", "", "| target | measured | status |", "|---|---|---|"]
    for t in doc["summary"]["targets"]:
        name = t["target"].replace("|", "\\|")
        lines.append(f"| {name} | {t['shown']} | {t['status']} |")
    for workload, info in cfg["workloads"].items():
        rows = _read_rows(doc, workload)
        if not rows:
            continue
        ours = {nw: a.get("samples_per_s") for s, nw, a in rows if s == "ours"}
        lines += [
            "",
            f"## Read: {info['title']}, {info['n']:,} samples",
            "",
            "| system | workers | samples/s | MB/s | of limit | ours ÷ this | samples/CPU-s "
            "| first batch s | import s | peak RSS MB | exactly once | dist/N | \\|rho\\| |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        limit = next((a.get("samples_per_s") for s, _, a in rows if s == LIMIT), None)
        for system, nw, a in rows:
            if not a.get("runs"):
                err = (a.get("errors") or ["?"])[0].splitlines()[0][:120]
                lines.append(f"| {_title(system)} | {nw} | failed: {err} |||||||||||")
                continue
            base = ours.get(nw) or ours.get(0)
            ratio = _ratio(base, a.get("samples_per_s"))
            rss = _n(a.get("peak_rss_mb"))
            if a.get("peak_rss_worker_mb"):
                rss += f" + {nw}×{_n(a['peak_rss_worker_mb'])}"
            if system in systems.RAW:
                once = "–"
            elif a.get("exactly_once") is None:
                dup = "no duplicates" if a.get("no_duplicates") else "DUPLICATES"
                share = a.get("samples", 0) / max(1, a.get("n_total") or 1)
                once = f"partial ({int(100 * share)}% read, {dup})"
            else:
                once = "yes" if a["exactly_once"] else "NO"
            lines.append(
                f"| {_title(system)} | {nw} | {_n(a.get('samples_per_s'))} "
                f"| {_n(a.get('mb_per_s'), ',.1f')} | {_share(a.get('samples_per_s'), limit)} "
                f"| {'–' if system == 'ours' or ratio is None else f'{ratio:.1f}x'} "
                f"| {_n(a.get('samples_per_cpu_s'))} "
                f"| {_n(a.get('ttfb_s'), '.3f')} | {_n(a.get('import_s'), '.2f')} | {rss} "
                f"| {once} | {_n(a.get('dist_over_n'), '.3f')} | {_n(a.get('abs_rho'), '.3f')} |"
            )
    agg = doc["summary"]["measurements"]
    lines += busy.markdown(agg, systems.TITLES, busy.WORK_TITLES)
    for workload, n in cfg["build_n"].items():
        builds = [(lbl, a) for lbl, a in agg.items() if lbl.startswith(f"build {workload} ")]
        if builds:
            lines += _build_table(agg, workload, n, builds)
    small = agg.get("memory embed-small ours W0")
    big = agg.get("memory embed ours W0")
    if small or big:
        lines += [
            "",
            "## Memory: our loader, one epoch, num_workers=0",
            "",
            "| samples | peak RSS MB | RSS after imports MB | samples/s |",
            "|---|---|---|---|",
        ]
        for a, n in ((small, cfg["memory_n"][0]), (big, cfg["memory_n"][1])):
            if a and a.get("runs"):
                lines.append(
                    f"| {n:,} | {_n(a.get('peak_rss_mb'))} | {_n(a.get('rss_baseline_mb'))} "
                    f"| {_n(a.get('samples_per_s'))} |"
                )
    s3 = doc["summary"].get("s3")
    lines += ["", "## Time to first batch (our loader)", ""]
    lines += ["| where | first batch s | samples/s |", "|---|---|---|"]
    for lbl, a in agg.items():
        if lbl.startswith("read") and " ours " in lbl and a.get("ttfb_s") is not None:
            lines.append(
                f"| local, {lbl[5:]} | {_n(a['ttfb_s'], '.3f')} | {_n(a.get('samples_per_s'))} |"
            )
    if s3 and s3.get("runs"):
        note = ""
        if s3.get("moto_get_mb_per_s"):
            note = f" (moto serves one shard at {s3['moto_get_mb_per_s']:.0f} MB/s)"
        lines.append(
            f"| S3 on loopback (moto + s3fs), embed {cfg['memory_n'][0]:,} samples, W0{note} "
            f"| {_n(s3.get('ttfb_s'), '.3f')} | {_n(s3.get('samples_per_s'))} |"
        )
    else:
        lines.append(f"| S3 on loopback | {doc.get('s3')} | |")
    lines += ["", "## Settings", ""]
    for k, text in cfg["settings"].items():
        if k in SYSTEM_ORDER and k not in doc["systems"]:
            continue
        lines.append(f"- {_title(k)}: {text}")
    lines.append(f"- total time of this run: {doc['elapsed_s'] / 60:.1f} min")
    return "\n".join(lines) + "\n"


def _build_table(
    agg: dict[str, Any], workload: str, n: int, builds: list[tuple[str, dict[str, Any]]]
) -> list[str]:
    base = agg.get(f"build {workload} ours w1", {}).get("samples_per_s")
    lines = [
        "",
        f"## Build: {workload}, {n:,} samples",
        "",
        "| writer | workers | samples/s | MB/s | ours (1 worker) ÷ this | bytes on disk / payload "
        "| CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for lbl, a in sorted(builds, key=lambda x: SYSTEM_ORDER.index(x[0].split()[2])):
        _, _, system, w = lbl.split()
        if not a.get("runs"):
            err = (a.get("errors") or ["?"])[0].splitlines()[0][:120]
            lines.append(f"| {_title(system)} | {w[1:]} | failed: {err} |||||")
            continue
        ratio = _ratio(base, a.get("samples_per_s"))
        first = lbl == f"build {workload} ours w1"
        lines.append(
            f"| {_title(system)} | {w[1:]} | {_n(a.get('samples_per_s'))} "
            f"| {_n(a.get('mb_per_s'), ',.1f')} "
            f"| {'–' if first or ratio is None else f'{ratio:.2f}x'} "
            f"| {_n(a.get('disk_over_payload'), '.2f')} | {_n(a.get('cpu_seconds'), '.1f')} |"
        )
    return lines


# ------------------------------------------------------------------------------------------------
# chart
# ------------------------------------------------------------------------------------------------


def chart(doc: dict[str, Any], path: str) -> str | None:
    """A log-scale bar chart of samples/s per system per workload; a string if skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart: skipped (matplotlib is not installed; make bench installs it)"
    agg = doc["summary"]["measurements"]
    groups = []
    for workload in doc["config"]["workloads"]:
        for nw in (0, 2):
            if any(lbl.startswith(f"read {workload} ") and lbl.endswith(f" W{nw}") for lbl in agg):
                groups.append((workload, nw))
    present = [
        s for s in SYSTEM_ORDER if any(f" {s} W" in lbl for lbl in agg if lbl.startswith("read"))
    ]
    if not groups or not present:
        return "chart: skipped (no read measurements)"
    fig, ax = plt.subplots(figsize=(max(7, 1.8 * len(groups) + 3), 5.2))
    width = 0.8 / len(present)
    colors = plt.get_cmap("tab10")
    for j, system in enumerate(present):
        xs, ys = [], []
        for g, (workload, nw) in enumerate(groups):
            rate = agg.get(f"read {workload} {system} W{nw}", {}).get("samples_per_s")
            if rate:
                xs.append(g + (j - (len(present) - 1) / 2) * width)
                ys.append(rate)
        bars = ax.bar(
            xs,
            ys,
            width * 0.95,
            label=_title(system),
            color=colors(j),
            hatch="//" if system in systems.RAW else None,
            edgecolor="white" if system in systems.RAW else None,
        )
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(
                f"{y / 1000:.1f}k" if y >= 1000 else f"{y:.0f}",
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=6,
                rotation=90,
            )
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{w}\nnum_workers={nw}" for w, nw in groups])
    ax.set_ylabel("samples/s (log scale)")
    m = doc["machine"]
    ax.set_title(
        f"One shuffled epoch, batch 256 — {m['cores']} cores, {m['date'][:10]}", fontsize=10
    )
    ax.set_ylim(top=ax.get_ylim()[1] * 4)  # room for the labels
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return None
