"""Small records: bytes on disk and read cost of the ways to store a JSONL of small rows.

    python bench/small_records.py [--rows 50000]

Rows of four small fields (an int id, a ~60-character question, an int label, a float score),
the shape of the JSONL that became 24x its size as shards. Each variant is written into memory
with our tar writer (the members the builder writes), then read back sample by sample the way
a loader must (parse the tar members, decode the fields; a gzip variant first inflates the
sample's own gzip member, as a reader seeking through the idx must):

- ``members``: one member per field (today: ``.cls``/``.txt``/``.json`` members);
- ``grouped``: the four fields in one JSON member (``KEY.fields.json``);
- ``gzip``: ``members``, each sample its own gzip member (the shard a valid ``.tar.gz``);
- ``grouped+gzip``: both.

Prints bytes on disk over the JSONL's bytes, write and read microseconds per row.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from collections.abc import Callable
from typing import Any

from wdsloader.format.ustar import iter_members
from wdsloader.format.writer import encode_member


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


def members_of(key: str, row: dict[str, Any], grouped: bool) -> bytes:
    if grouped:
        text = json.dumps(row, separators=(",", ":")).encode()
        return encode_member(f"{key}.fields.json", text)
    parts = [
        encode_member(f"{key}.id", str(row["id"]).encode()),
        encode_member(f"{key}.label.cls", str(row["label"]).encode()),
        encode_member(f"{key}.question.txt", row["question"].encode()),
        encode_member(f"{key}.score.json", json.dumps(row["score"]).encode()),
    ]
    return b"".join(parts)


def gzip_member(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    return c.compress(data) + c.flush()


def decode(sample: bytes, grouped: bool) -> dict[str, Any]:
    view = memoryview(sample)
    found = {
        m.name.split(".", 1)[1]: bytes(view[m.data_offset : m.data_offset + m.size])
        for m in iter_members(view)
    }
    if grouped:
        return json.loads(found["fields.json"])
    return {
        "id": int(found["id"]),
        "label": int(found["label.cls"]),
        "question": found["question.txt"].decode(),
        "score": json.loads(found["score.json"]),
    }


def best(fn: Callable[[], Any], reps: int = 3) -> float:
    t_best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=50_000)
    args = p.parse_args()
    data = rows(args.rows)
    source = sum(len(json.dumps(r)) + 1 for r in data)  # JSONL: json.dumps + newline
    keys = [f"{i:09d}" for i in range(len(data))]
    print(f"{len(data):,} rows, JSONL {source / 1e6:.2f} MB ({source / len(data):.0f} B/row)")
    print("| variant | bytes / JSONL bytes | write us/row | read us/row |")
    print("|---|---|---|---|")
    for name in ("members", "grouped", "gzip", "grouped+gzip"):
        grouped, gz = name.startswith("grouped"), name.endswith("gzip")

        def write(grouped: bool = grouped, gz: bool = gz) -> list[bytes]:
            out = [members_of(k, r, grouped) for k, r in zip(keys, data, strict=True)]
            return [gzip_member(s) for s in out] if gz else out

        samples = write()
        size = sum(map(len, samples)) + 1024  # + the end-of-archive blocks
        t_write = best(write) / len(data) * 1e6

        def read(samples: list[bytes] = samples, grouped: bool = grouped, gz: bool = gz) -> None:
            for s in samples:
                decode(zlib.decompress(s, 31) if gz else s, grouped)

        t_read = best(read) / len(data) * 1e6
        check = [decode(zlib.decompress(s, 31) if gz else s, grouped) for s in samples[:100]]
        assert check == data[:100], name
        print(f"| {name} | {size / source:.2f} | {t_write:.1f} | {t_read:.1f} |")


if __name__ == "__main__":
    main()
