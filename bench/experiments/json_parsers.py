"""JSON parsers on the bench's metadata objects: per sample, and one decode per batch.

    .venv-bench/bin/python bench/experiments/json_parsers.py [--n 100000]

Times (CPU time, best of 5) the stdlib (``json.loads`` and the C scanner our decoder uses),
``orjson`` and ``msgspec`` on ~130-byte JSON objects as memoryviews into a buffer, per sample
and joined into one JSON array per 256-sample batch, and checks that each gives results
identical to ``json.loads`` (values and types), then on the edge cases where parsers differ.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable
from typing import Any

from bench.workloads import meta_json

BATCH = 256
EDGE = [b'{"a":1,"a":2}', b"12345678901234567890123", b"NaN", b"1e400", b'"\\ud800"', b" {} "]


def parsers() -> dict[str, Callable[[list[memoryview]], list[Any]]]:
    scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    out: dict[str, Callable[[list[memoryview]], list[Any]]] = {
        "json.loads(bytes)": lambda vs: [json.loads(bytes(v)) for v in vs],
        "stdlib C scanner (ours today)": lambda vs: [scan(str(v, "utf-8"), 0)[0] for v in vs],
        "json.loads, one array per batch": lambda vs: json.loads(b"[" + b",".join(vs) + b"]"),
    }
    try:
        orjson = importlib.import_module("orjson")
        out["orjson.loads"] = lambda vs: [orjson.loads(v) for v in vs]
        out["orjson, one array per batch"] = lambda vs: orjson.loads(b"[" + b",".join(vs) + b"]")
    except ImportError:
        pass
    try:
        msgspec = importlib.import_module("msgspec")
        dec = msgspec.json.Decoder()
        raw = msgspec.json.Decoder(list[msgspec.Raw])
        out["msgspec Decoder.decode"] = lambda vs: [dec.decode(v) for v in vs]
        out["msgspec, one array per batch"] = lambda vs: dec.decode(b"[" + b",".join(vs) + b"]")

        def checked(vs: list[memoryview]) -> list[Any]:
            joined = b"[" + b",".join(vs) + b"]"
            spans = raw.decode(joined)  # every element is exactly one member's text
            assert len(spans) == len(vs) and all(map(_same_len, spans, vs))
            return dec.decode(joined)

        out["msgspec, one array per batch, checked"] = checked
    except ImportError:
        pass
    return out


def _same_len(a: Any, b: memoryview) -> bool:
    return len(a) == len(b)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    n = p.parse_args().n
    buf = b"".join(meta_json("embed", i).encode() for i in range(n))
    view, views, pos = memoryview(buf), [], 0
    for i in range(n):
        size = len(meta_json("embed", i))
        views.append(view[pos : pos + size])
        pos += size
    batches = [views[i : i + BATCH] for i in range(0, n, BATCH)]
    ref = [json.loads(bytes(v)) for v in views]
    print("| parser | us/sample (CPU) | identical to json.loads |")
    print("|---|---|---|")
    for name, fn in parsers().items():
        got = [x for b in batches for x in fn(b)]
        same = got == ref and all(map(_same_types, got, ref))
        t_best = float("inf")
        for _ in range(5):
            t = time.process_time()
            for b in batches:
                fn(b)
            t_best = min(t_best, time.process_time() - t)
        print(f"| {name} | {t_best / n * 1e6:.2f} | {same} |")
    print("\nedge cases (value or error):")
    for doc in EDGE:
        row = []
        for name, fn in parsers().items():
            if "batch" in name:
                continue
            try:
                row.append(f"{name}: {fn([memoryview(doc)])[0]!r}")
            except Exception as exc:  # noqa: BLE001 - reported
                row.append(f"{name}: {type(exc).__name__}")
        print(f"- {doc!r}: " + "; ".join(row))


def _same_types(a: Any, b: Any) -> bool:
    return all(type(a[k]) is type(b[k]) for k in b) if isinstance(b, dict) else True


if __name__ == "__main__":
    main()
