"""Where the loader's time goes, per sample, on the whole-batch path of a built dataset.

    .venv/bin/python bench/profile_loader.py DATASET [--split train] [--batches 20]

Reads ``--batches`` planned batches, times each step of the columnar decoder
(:class:`wdsloader.decode.columnar.ColumnarDecoder`) on them (best of 5): the prefix gather,
keys, each fixed-size field, the variable fields, collation and the whole batch; then the read
itself (best of 3, into fresh buffers and into pooled ones).
The numbers move with the allocator's state and the machine: compare steps within one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from wdsloader import create_loader, plan
from wdsloader.decode.batch import Columns
from wdsloader.decode.gather import keys_from_headers
from wdsloader.stream.buffers import BufferPool
from wdsloader.stream.dataset import _collate_columns


def best_of(n: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    ds = create_loader(args.dataset, args.split, batch_size=256, seed=0).dataset_obj
    col = ds.columnar
    if col is None:
        raise SystemExit("no field of this dataset is gathered: nothing to profile")
    batches = plan.worker_batches(ds.config, 0, 0, 0, None)[: args.batches]
    fresh = best_of(3, lambda: ds.reader.read(batches))
    raws = ds.reader.read(batches)
    n = sum(len(r.start) for r in raws)

    def per_sample(step: Callable[[Any], Any]) -> float:
        def run() -> None:
            for r in raws:
                step(r)  # each result dropped at once, as in the loader's loop

        return best_of(5, run) / n * 1e6

    blocks = {id(r): col._block(r) for r in raws}
    keys = {id(r): keys_from_headers(blocks[id(r)]) for r in raws}
    print(f"{n} samples, block {col.block_len} B/sample, fields {ds.fields}")
    print(f"prefix gather                {per_sample(col._block):6.2f} us/sample")
    print(
        f"keys from headers            {per_sample(lambda r: keys_from_headers(blocks[id(r)])):6.2f}"
    )
    print(f"keys + header checksums      {per_sample(lambda r: col._heads(r, blocks[id(r)])):6.2f}")
    heads = {id(r): col._heads(r, blocks[id(r)])[1] for r in raws}  # type: ignore[index]
    for name in col.tables:
        cost = per_sample(lambda r, name=name: col._gather(name, r, blocks[id(r)], heads[id(r)]))
        print(f"field {name:22s} {cost:6.2f} (name checks included)")

    def others(r: Any) -> Any:
        found = col._find_others(r, keys[id(r)], blocks[id(r)], heads[id(r)])
        return col._decode_others(r, keys[id(r)], found, {})  # type: ignore[arg-type]

    print(f"variable fields {col.others}: {per_sample(others):6.2f}")
    cols = {id(r): col.decode(r, 0, None) for r in raws}
    assert all(isinstance(c, Columns) for c in cols.values())
    collate = per_sample(lambda r: _collate_columns(ds.collate_fn, cols[id(r)].columns))  # type: ignore[union-attr]
    print(f"collate                      {collate:6.2f}")
    print(
        f"whole batch (_make_batch)    {per_sample(lambda r: ds._make_batch(r, 0, 0, None)):6.2f}"
    )
    pool = BufferPool()
    reused = best_of(3, lambda: ds.reader.read(batches, pool))
    print(f"read into fresh buffers      {fresh / n * 1e6:6.2f}")
    print(f"read into pooled buffers     {reused / n * 1e6:6.2f}")


if __name__ == "__main__":
    main()
