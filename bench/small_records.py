"""Small records: shard bytes, build and read speed of the ways ``build_shards`` can store a JSONL
of small rows.

    python bench/small_records.py [--rows 20000] [--repeats 3] [--levels 1,6,9]

Rows of four small fields (an int id, a ~60-character question, an int label, a float score),
the shape of the JSONL that became 24x its size as shards. The JSONL file is built with the
real ``build_shards`` options (``workers=1``) and read back with our loader (``num_workers=0``,
batch 256, shuffled, the default collator), for:

- ``default``: one member per field (``.cls``/``.txt``/``.json``);
- ``grouped``: ``group_small_fields=True`` (one member ``KEY.fields.json``);
- ``gzip``: ``compression="gzip"``;
- ``grouped+gzip``: both;

and, for the gzip variants, each deflate level of ``--levels``. Prints shard bytes over the
JSONL's bytes, build samples/s and read samples/s (best of ``--repeats``, each read a fresh
loader over a warm page cache).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from build_shards import build_shards
from wdsloader import create_loader
from wdsloader.format import deflate

VARIANTS = {
    "default": {},
    "grouped": {"group_small_fields": True},
    "gzip": {"compression": "gzip"},
    "grouped+gzip": {"group_small_fields": True, "compression": "gzip"},
}


def rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "question": f"what is the {i % 1013}th prime number after {i * 7 % 9973}?",
            "label": i % 10,
            "score": round((i * 37 % 1000) / 1000, 3),
        }
        for i in range(n)
    ]


def build(src: Path, out: Path, options: dict[str, Any]) -> tuple[float, int]:
    """Seconds of one build, and its shard bytes."""
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    manifest = build_shards([str(src)], out, **options)
    dt = time.perf_counter() - t
    return dt, sum(s.num_bytes for split in manifest.splits.values() for s in split.shards)


def read(out: Path, n: int) -> float:
    """Seconds of one shuffled epoch read by a fresh loader."""
    t = time.perf_counter()
    loader = create_loader(str(out), "train", batch_size=256, drop_last=False, num_workers=0)
    count = sum(len(batch["__key__"]) for batch in loader)
    dt = time.perf_counter() - t
    assert count == n, (count, n)
    return dt


def measure(src: Path, out: Path, options: dict[str, Any], n: int, repeats: int) -> list[float]:
    t_build, size = min(build(src, out, options) for _ in range(repeats))
    read(out, n)  # warm the page cache
    t_read = min(read(out, n) for _ in range(repeats))
    return [size, n / t_build, n / t_read]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--levels", default="1,6,9", help="deflate levels of the gzip variants")
    args = p.parse_args()
    data = rows(args.rows)
    with tempfile.TemporaryDirectory(prefix="small-records-") as tmp:
        src = Path(tmp) / "rows.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in data))
        source = src.stat().st_size
        print(f"{len(data):,} rows, JSONL {source / 1e6:.2f} MB ({source / len(data):.0f} B/row)")
        print(
            "| variant | gzip level | shard bytes / JSONL bytes | build samples/s | read samples/s |"
        )
        print("|---|---|---|---|---|")
        default_level = deflate.GZIP_LEVEL
        for name, options in VARIANTS.items():
            levels = [int(x) for x in args.levels.split(",")] if "compression" in options else [0]
            for level in levels:
                deflate.GZIP_LEVEL = level or default_level
                size, build_rate, read_rate = measure(
                    src, Path(tmp) / "out", options, len(data), args.repeats
                )
                shown = str(level) if level else "-"
                print(
                    f"| {name} | {shown} | {size / source:.2f} | {build_rate:,.0f} | "
                    f"{read_rate:,.0f} |",
                    flush=True,
                )
        deflate.GZIP_LEVEL = default_level


if __name__ == "__main__":
    main()
