"""Where the loader's time goes, per sample, on the whole-batch path of a built dataset.

    .venv/bin/python bench/experiments/profile_loader.py DATASET [--split train] [--batches 20] [--fields a,b]

Reads ``--batches`` planned batches, then times (CPU time of this process, best of 5) each step
of the columnar decode on them: the prefix gather, keys, the walk that finds the variable
members (step by step, and in one pass where an earlier batch of the layout taught it where
the headers lie), their decoders, each fixed-size field, collation and the whole batch; and
the read itself. Each step's result is dropped before the next batch's step, as the loader
drops a batch (kept, every result would be new memory and the steps would time page faults).
CPU time keeps the numbers comparable when other jobs share the cores; compare steps within
one run.

Then (``--loop``, default on) whole epochs through the loader (``num_workers=0``) at batch
sizes 256 and 1024: wall samples/s, the CPU per sample of the main thread (the decode) and of
the other threads (the read-ahead thread), and from the two batch sizes the decode's cost per
batch (numpy and Python calls whose cost does not depend on the batch size) and per sample.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from wdsloader import create_loader, plan
from wdsloader.collate.batch import collate_columns


def best_of(n: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--fields", default=None, help="comma-separated fields (default: all)")
    parser.add_argument("--no-loop", dest="loop", action="store_false", help="skip the epochs")
    args = parser.parse_args()
    fields = args.fields.split(",") if args.fields else None
    ds = create_loader(args.dataset, args.split, batch_size=256, seed=0, fields=fields).dataset_obj
    batches = plan.worker_batches(ds.config, 0, 0, 0, None)[: args.batches]
    read = best_of(3, lambda: ds.reader.read(batches))
    raws = ds.reader.read(batches)
    n = sum(len(r.start) for r in raws)
    col = ds.columnar
    if col is None:
        print("no field of this dataset is gathered: every batch is decoded by rows")
        return

    def per_sample(step: Callable[[Any], Any]) -> float:
        def each() -> None:
            for r in raws:
                step(r)

        return best_of(5, each) / n * 1e6

    blocks = {id(r): col._block(r) for r in raws}
    heads = {id(r): col._heads(r, blocks[id(r)]) for r in raws}
    print(f"{n} samples, block {col.block_len} B/sample, fields {col.fields}, rows: {col.others}")
    print(f"read (one group)             {read / n * 1e6:6.2f} us/sample (CPU)")
    print(f"prefix gather                {per_sample(col._block):6.2f}")
    print(f"keys + header checksums      {per_sample(lambda r: col._heads(r, blocks[id(r)])):6.2f}")

    def find(r: Any) -> Any:
        keys, h = heads[id(r)]  # type: ignore[misc]
        return col._find_others(r, keys, blocks[id(r)], h)

    def find_afresh(r: Any) -> Any:
        col.finder.walks.clear()  # no layout learned from an earlier batch: step by step
        return find(r)

    found = {id(r): find(r) for r in raws}
    print(f"walk to the variable members {per_sample(find_afresh):6.2f} (step by step)")
    found = {id(r): find(r) for r in raws}
    print(f"  one pass, layout learned   {per_sample(find):6.2f}")
    decode = per_sample(lambda r: col._decode_others(r, heads[id(r)][0], found[id(r)], {}))
    print(f"decode the variable members  {decode:6.2f}")
    others = col.others
    for name in others:  # each variable field decoded on its own
        col.others = [name]
        cost = per_sample(lambda r: col._decode_others(r, heads[id(r)][0], found[id(r)], {}))
        print(f"  decode {name:21s} {cost:6.2f}")
    col.others = others
    for name in col.tables:
        cost = per_sample(lambda r, name=name: col._gather(name, r, blocks[id(r)], heads[id(r)][1]))
        print(f"field {name:22s} {cost:6.2f} (name checks included)")
    print(f"whole columnar decode        {per_sample(lambda r: col.decode(r, 0, None)):6.2f}")
    cols = {id(r): col.decode(r, 0, None) for r in raws}
    collate = per_sample(lambda r: collate_columns(ds.collate_fn, cols[id(r)].columns))
    print(f"collate                      {collate:6.2f}")
    print(
        f"whole batch (_make_batch)    {per_sample(lambda r: ds._make_batch(r, 0, 0, None)):6.2f}"
    )
    if args.loop:
        loop_costs(args.dataset, args.split, fields)


def epoch_costs(loader: Any) -> tuple[float, float, float]:
    """One epoch (after an untimed one): samples/s, and CPU us per sample of the main thread
    and of the other threads."""
    for _ in loader:
        pass
    wall, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    n = sum(len(b["__key__"]) for b in loader)
    main_cpu = time.thread_time() - main_cpu
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return n / wall, main_cpu / n * 1e6, (cpu - main_cpu) / n * 1e6


def loop_costs(dataset: str, split: str, fields: list[str] | None, repeats: int = 3) -> None:
    """Whole epochs at batch sizes 256 and 1024 (best of ``repeats`` by main-thread CPU), and
    the decode's cost split into per batch and per sample."""
    print("\nwhole epochs, num_workers=0 (best of 3 by main-thread CPU):")
    main_us = {}
    for size in (256, 1024):
        loader = create_loader(dataset, split, batch_size=size, seed=0, fields=fields)
        rate, main, other = min((epoch_costs(loader) for _ in range(repeats)), key=lambda r: r[1])
        main_us[size] = main
        print(
            f"  batch {size:4d}: {rate:9,.0f} samples/s; CPU us/sample: main thread {main:6.2f}, "
            f"other threads {other:6.2f}"
        )
    per_batch = (main_us[256] - main_us[1024]) / (1 / 256 - 1 / 1024)
    per_sample = main_us[1024] - per_batch / 1024
    print(
        f"  main thread = {per_batch:,.0f} us per batch + {per_sample:.2f} us per sample "
        f"(at batch 256: {per_batch / 256:.2f} us/sample of per-batch cost)"
    )


if __name__ == "__main__":
    main()
