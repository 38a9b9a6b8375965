"""Small records: shard bytes, build and read speed of the ways ``build_shards`` can store a JSONL
of small rows.

    python bench/experiments/small_records.py [--rows 20000] [--repeats 3] [--levels 1,6,9]

Rows of four small fields (an int id, a ~60-character question, an int label, a float score),
the shape of the JSONL that became 24x its size as shards. The JSONL file is built with the
real ``build_shards`` options (``workers=1``) and read back with our loader (``num_workers=0``,
batch 256, shuffled, the default collator), for:

- ``default``: one member per field (``.cls``/``.txt``/``.json``);
- ``grouped``: ``group_small_fields=True`` (one member ``KEY.fields.json``);
- ``gzip``: ``compression="gzip"``;
- ``grouped+gzip``: both;

and, for the gzip variants, each deflate level of ``--levels``. Prints shard bytes over the
JSONL's bytes, build and read samples per second and per CPU-second (best of ``--repeats``;
each read a fresh loader over a warm page cache; CPU of this process and its threads). A second table times the deflate step alone (CPU microseconds
per sample to compress and to inflate each sample of the default and grouped shards, best of
``--repeats``): the level's own cost, without the rest of the build and the read.
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
from wdsloader.format import decode_index, deflate
from wdsloader.io.manifest_io import load_manifest

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


def build(src: Path, out: Path, options: dict[str, Any]) -> tuple[float, float, int]:
    """Wall and CPU seconds of one build (this process and its threads), its shard bytes."""
    shutil.rmtree(out, ignore_errors=True)
    t, c = time.perf_counter(), time.process_time()
    manifest = build_shards([str(src)], out, **options)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return wall, cpu, sum(s.num_bytes for split in manifest.splits.values() for s in split.shards)


def read(out: Path, n: int) -> tuple[float, float]:
    """Wall and CPU seconds of one shuffled epoch read by a fresh loader."""
    t, c = time.perf_counter(), time.process_time()
    loader = create_loader(str(out), "train", batch_size=256, drop_last=False, num_workers=0)
    count = sum(len(batch["__key__"]) for batch in loader)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert count == n, (count, n)
    return wall, cpu


def measure(src: Path, out: Path, options: dict[str, Any], n: int, repeats: int) -> list[float]:
    builds = [build(src, out, options) for _ in range(repeats)]
    read(out, n)  # warm the page cache
    reads = [read(out, n) for _ in range(repeats)]
    size = builds[0][2]
    return [
        size,
        n / min(b[0] for b in builds),
        n / min(b[1] for b in builds),
        n / min(r[0] for r in reads),
        n / min(r[1] for r in reads),
    ]


def tar_samples(out: Path) -> list[bytes]:
    """The tar bytes of every sample of a plain build, by its index."""
    manifest = load_manifest(str(out))
    samples = []
    for split in manifest.splits.values():
        for shard in split.shards:
            data = (out / shard.path).read_bytes()
            idx = decode_index((out / shard.idx_path).read_bytes())
            samples += [data[a:b] for a, b in zip(idx[:-1], idx[1:], strict=True)]
    return samples


def deflate_table(src: Path, tmp: Path, levels: list[int], repeats: int) -> None:
    """CPU us per sample to compress (full flush) and inflate the samples at each level."""
    print(
        "\n| samples | gzip level | compressed / tar bytes | deflate us/sample | inflate us/sample |"
    )
    print("|---|---|---|---|---|")
    for name, options in (("default", {}), ("grouped", {"group_small_fields": True})):
        build(src, tmp / name, options)
        samples = tar_samples(tmp / name)
        total = sum(map(len, samples))
        for level in levels:
            best_d = best_i = float("inf")
            for _ in range(repeats):
                z = deflate.ShardDeflater(level)
                t = time.process_time()
                packed = [z.sample(x) for x in samples]
                best_d = min(best_d, time.process_time() - t)
                t = time.process_time()
                for x in packed:
                    deflate.inflate_sample(x, "bench")
                best_i = min(best_i, time.process_time() - t)
            size = sum(map(len, packed))
            n = len(samples)
            print(
                f"| {name} | {level} | {size / total:.4f} | {best_d / n * 1e6:.2f} | "
                f"{best_i / n * 1e6:.2f} |",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--levels", default="1,6,9", help="deflate levels of the gzip variants")
    p.add_argument("--deflate-only", action="store_true", help="only the deflate table")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    data = rows(args.rows)
    with tempfile.TemporaryDirectory(prefix="small-records-") as tmp:
        src = Path(tmp) / "rows.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in data))
        source = src.stat().st_size
        print(f"{len(data):,} rows, JSONL {source / 1e6:.2f} MB ({source / len(data):.0f} B/row)")
        if args.deflate_only:
            deflate_table(src, Path(tmp), levels, args.repeats)
            return
        print(
            "| variant | gzip level | shard bytes / JSONL bytes | build samples/s | "
            "build samples/CPU-s | read samples/s | read samples/CPU-s |"
        )
        print("|---|---|---|---|---|---|---|")
        default_level = deflate.GZIP_LEVEL
        for name, options in VARIANTS.items():
            for level in levels if "compression" in options else [0]:
                deflate.GZIP_LEVEL = level or default_level
                size, *rates = measure(src, Path(tmp) / "out", options, len(data), args.repeats)
                shown = str(level) if level else "-"
                cells = " | ".join(f"{r:,.0f}" for r in rates)
                print(f"| {name} | {shown} | {size / source:.2f} | {cells} |", flush=True)
        deflate.GZIP_LEVEL = default_level
        deflate_table(src, Path(tmp), levels, args.repeats)


if __name__ == "__main__":
    main()
