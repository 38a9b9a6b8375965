"""Tables and the chart of a remote benchmark run (bench/remote/run.py's JSON).

:func:`rows` derives every reported number of a run (the share of the ceiling, bytes fetched
over the dataset, requests by kind); :func:`markdown` makes the tables, :func:`update_block`
puts them between markers in the README or docs/speed.md, :func:`chart` draws samples/s.
"""

from __future__ import annotations

import json
import os
from typing import Any

from bench import systems

SETTINGS = {
    "ours": 'create_loader("s3://bench/ours", "train", batch_size=256, num_workers=W, seed=0, '
    "storage_options=...)",
    "ours_cache": "the same with cache_dir=<empty folder>",
    "ours_obstore": 'the same with read_options=ReadOptions(transport="obstore")',
    "litdata": 'StreamingDataset("s3://bench/litdata", cache_dir=<empty>, shuffle=True, seed=0, '
    "storage_options={endpoint_url, keys}) + StreamingDataLoader(batch_size=256); its obstore "
    "client told allow_http (the loopback server is http)",
    "mosaic": 'StreamingDataset(remote="s3://bench/mosaic", local=<empty>, shuffle=True, '
    "shuffle_seed=0, batch_size=256) + DataLoader (endpoint: S3_ENDPOINT_URL)",
    "webdataset": "WebDataset([s3:// urls], shardshuffle=100, seed=0).shuffle(5000).decode()"
    ".batched(256) + WebLoader (urls opened through fsspec/s3fs)",
    "hf": 'load_dataset("webdataset", data_files={"train": [s3:// urls]}, streaming=True, '
    "storage_options=...).shuffle(seed=0, buffer_size=1000) + DataLoader; s3fs registered "
    "for s3 drops the block_size=0 datasets passes (datasets 5.0 + s3fs 2026.6 fail on it)",
    "epoch": "each run: one cold epoch in a fresh process, an empty local cache, batch 256, "
    "the same collate as the local benchmark",
    "ceiling": "the path's ceiling: every byte of our shards as ranged GETs, the better of 8 "
    "connections x 16 MiB and 16 x 8 MiB, through the same proxy; share = dataset bytes / epoch "
    "s / ceiling",
    "fetched": "bytes the proxy carried to the readers (HTTP headers included) / the bytes of "
    "the system's dataset on the server",
    "cpu": "CPU-seconds of the reading process and its DataLoader workers (user + system), "
    "from the loader's construction to the end of the epoch (imports excluded)",
    "machine": "server + proxy CPU-s: the S3 server's process and the proxy (a thread of the "
    "bench process) during the reader's whole process (imports included); machine busy: the "
    "share of all cores busy meanwhile (every process on the machine)",
    "requests": "counted at the proxy: GET with a Range, whole-object GET, HEAD, LIST (a GET of "
    "the bucket); LIST by webdataset/HF includes the one listing of the shard names",
}
KINDS = ("GET-range", "GET", "HEAD", "LIST")


def rows(doc: dict[str, Any], profile: str) -> list[dict[str, Any]]:
    """One row per (system, num_workers) of ``profile`` with every reported number."""
    prof = doc["profiles"][profile]
    top = (prof.get("ceiling") or {}).get("mb_per_s")
    out = []
    for label, r in prof["runs"].items():
        system, nw = label.rsplit(" W", 1)
        size = doc["dataset_bytes"].get(_format(system))
        proxy = r.get("proxy") or {}
        machine = r.get("machine_cpu") or {}
        seconds = r.get("seconds")
        rate = size / seconds / 1e6 if size and seconds else None
        requests = proxy.get("requests") or {}
        out.append(
            {
                "system": system,
                "workers": int(nw),
                "error": (r.get("error") or "").splitlines()[0] if r.get("error") else None,
                "samples_per_s": r.get("samples_per_s"),
                "mb_per_s": r.get("mb_per_s"),
                "ttfb_s": r.get("ttfb_s"),
                "fetched_over_dataset": proxy.get("bytes_down", 0) / size if size else None,
                "requests": {k: requests.get(k, 0) for k in KINDS},
                "other_requests": sum(v for k, v in requests.items() if k not in KINDS),
                "connections": proxy.get("connections"),
                "cpu_seconds": r.get("cpu_seconds"),
                "samples_per_cpu_s": r.get("samples_per_cpu_s"),
                "share_of_ceiling": rate / top if rate and top else None,
                "server_proxy_cpu_s": _sum(machine.get("server_cpu_s"), machine.get("proxy_cpu_s")),
                "machine_busy_share": machine.get("machine_busy_share"),
                "exactly_once": r.get("exactly_once"),
                "dist_over_n": r.get("dist_over_n"),
                "abs_rho": r.get("abs_rho"),
            }
        )
    return out


def _sum(*values: float | None) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _format(system: str) -> str:
    from bench.remote.readers import FORMAT

    return FORMAT[system]


def _n(v: Any, spec: str = ",.0f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def table(doc: dict[str, Any], profile: str) -> str:
    """The markdown table of one profile."""
    prof = doc["profiles"][profile]
    rate = prof.get("rate_bytes_per_s")
    top = prof.get("ceiling") or {}
    head = (
        f"**{prof['rtt_s'] * 1000:g} ms RTT, "
        f"{f'{rate * 8 / 1e9:g} Gbit/s per connection' if rate else 'uncapped'}** "
        f"(ceiling {_n(top.get('mb_per_s'))} MB/s)\n\n"
        "| system | nw | samples/s | MB/s | first batch s | fetched / dataset "
        "| GET range / GET / HEAD / LIST | CPU-s | samples / CPU-s | share of ceiling "
        "| server + proxy CPU-s | machine busy | exactly once | dist/N, abs rho |\n"
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|\n"
    )
    lines = []
    for row in rows(doc, profile):
        name = TITLES.get(row["system"], row["system"])
        if row["error"]:
            lines.append(f"| {name} | {row['workers']} | failed: {row['error'][:80]} |" + " |" * 11)
            continue
        req = " / ".join(str(row["requests"][k]) for k in KINDS)
        lines.append(
            f"| {name} | {row['workers']} | {_n(row['samples_per_s'])} "
            f"| {_n(row['mb_per_s'], ',.1f')} | {_n(row['ttfb_s'], '.2f')} "
            f"| {_n(row['fetched_over_dataset'], '.2f', 'x')} | {req} "
            f"| {_n(row['cpu_seconds'], '.1f')} | {_n(row['samples_per_cpu_s'])} "
            f"| {_n(row['share_of_ceiling'] and row['share_of_ceiling'] * 100, '.0f', '%')} "
            f"| {_n(row['server_proxy_cpu_s'], '.1f')} "
            f"| {_n(row['machine_busy_share'] and row['machine_busy_share'] * 100, '.0f', '%')} "
            f"| {'yes' if row['exactly_once'] else 'NO'} "
            f"| {_n(row['dist_over_n'], '.2f')}, {_n(row['abs_rho'], '.3f')} |"
        )
    return head + "\n".join(lines) + "\n"


TITLES = {
    **systems.TITLES,
    "ours_cache": "wdsloader with cache_dir",
    "ours_obstore": "wdsloader, obstore transport",
    "hf": "HF datasets",
}


def markdown(doc: dict[str, Any]) -> str:
    """Every profile's table with the run's setting (what a README/docs section shows)."""
    cfg = doc["config"]
    bare = doc.get("server_ceiling") or {}
    parts = [
        f"Remote read: {cfg['n']:,} samples of {cfg['payload_bytes_per_sample']:,} B "
        f"({_n(doc['dataset_bytes'].get('ours', 0) / 1e6, ',.0f')} MB of shards), "
        f"server {doc['server']} on 127.0.0.1 (its own ceiling {_n(bare.get('mb_per_s'))} MB/s "
        f"with no proxy), {doc['machine']['cores']} cores; {doc.get('note') or ''}\n"
    ]
    warm = [w.get("ms_per_mb") for w in doc.get("server_warm_up") or []]
    if warm:
        parts.append(
            f"The server was warmed before any measurement: {len(warm)} rounds of 1 MiB ranged "
            "GETs of every shard until its CPU per MB settled (ms/MB by round: "
            + ", ".join(_n(w, ".2f") for w in warm)
            + "); a fresh s3rver spent up to 2.6x the CPU per MB of a warm one on its first rounds.\n"
        )
    parts += [table(doc, p) for p in doc["profiles"]]
    missing = doc.get("missing") or {}
    if missing:
        parts.append("Not measured: " + "; ".join(f"{k}: {v}" for k, v in missing.items()) + "\n")
    parts.append("\n".join(f"- {k}: {v}" for k, v in cfg["settings"].items()) + "\n")
    return "\n".join(parts)


def update_block(path: str, md: str, name: str = "remote-bench") -> bool:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``path``
    with ``md``; False (the file untouched) when the markers are not there."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    with open(path) as f:
        text = f.read()
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        return False
    with open(path, "w") as f:
        f.write(text[: i + len(start)] + "\n" + md.rstrip() + "\n" + text[j:])
    return True


def chart(doc: dict[str, Any], path: str) -> str | None:
    """samples/s per system, a panel per profile, bars for each num_workers; ``None`` when
    written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib not installed"
    names = list(doc["profiles"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.5), squeeze=False)
    for ax, profile in zip(axes[0], names, strict=True):
        data = rows(doc, profile)
        order = list(dict.fromkeys(r["system"] for r in data))
        counts = sorted({r["workers"] for r in data})
        width = 0.8 / max(1, len(counts))
        for k, nw in enumerate(counts):
            vals = [
                next(
                    (
                        r["samples_per_s"] or 0
                        for r in data
                        if (r["system"], r["workers"]) == (s, nw)
                    ),
                    0,
                )
                for s in order
            ]
            xs = [i + k * width for i in range(len(order))]
            ax.bar(xs, vals, width, label=f"num_workers={nw}")
            for x, s in zip(xs, order, strict=True):
                if any(r["error"] for r in data if (r["system"], r["workers"]) == (s, nw)):
                    ax.text(x, 0, "failed", rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_xticks([i + width * (len(counts) - 1) / 2 for i in range(len(order))])
        ax.set_xticklabels([TITLES.get(s, s).replace(" ", "\n", 1) for s in order], fontsize=7)
        ax.set_title(f"{profile} RTT: samples/s of a cold epoch from S3")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(doc: dict[str, Any], out: str, name: str = "remote") -> str:
    """OUT/NAME.json, NAME.md and NAME.png; returns the markdown."""
    os.makedirs(out, exist_ok=True)
    doc["summary"] = {p: rows(doc, p) for p in doc["profiles"]}
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md = markdown(doc)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(md)
    why = chart(doc, os.path.join(out, f"{name}.png"))
    print(md)
    print(why or f"chart: {name}.png written")
    return md
