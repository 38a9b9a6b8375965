"""JPEG decoding: a thread pool inside one process against worker processes.

    .venv-bench/bin/python bench/experiments/threads_jpeg.py DATASET [--batches 3]

Takes the JPEG members of the bench's ``jpeg`` dataset (read from its shards), then decodes
them in batches of 256 to uint8 arrays with Pillow (which releases the GIL while decoding):
serially, and on a thread pool of 2; and reads the dataset with our loader at
``num_workers=0`` and ``2`` (read + decode + collate). Prints samples/s (wall) and samples per
CPU second of each.
"""

from __future__ import annotations

import argparse
import io
import resource
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def decode(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def cpu() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def timed(label: str, n: int, fn) -> None:
    c, t = cpu(), time.perf_counter()
    fn()
    wall, used = time.perf_counter() - t, cpu() - c
    print(f"| {label} | {n / wall:,.0f} | {n / used:,.0f} |")


def main() -> None:
    import os

    from wdsloader import create_loader
    from wdsloader.format.members import iter_members
    from wdsloader.io.manifest_io import load_manifest

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    args = p.parse_args()
    jpegs = []
    for shard in load_manifest(args.dataset).split("train").shards:
        with open(os.path.join(args.dataset, shard.path), "rb") as f:
            data = f.read()
        for m in iter_members(data):
            if m.name.endswith(".jpg"):
                jpegs.append(data[m.data_offset : m.data_offset + m.size])
    batches = [jpegs[i : i + 256] for i in range(0, len(jpegs), 256)]
    n = len(jpegs)
    print(f"{n} JPEGs; decode to uint8 HWC")
    print("| how | samples/s | samples/CPU-s |")
    print("|---|---|---|")
    timed("serial, one thread", n, lambda: [[decode(d) for d in b] for b in batches])
    with ThreadPoolExecutor(2) as pool:
        timed("thread pool of 2", n, lambda: [list(pool.map(decode, b)) for b in batches])

    def loader(workers: int) -> None:
        for _ in create_loader(args.dataset, "train", batch_size=256, fields=["image"],
                               num_workers=workers, seed=0):  # fmt: skip
            pass

    timed("loader, num_workers=0 (read + decode)", n, lambda: loader(0))
    timed("loader, num_workers=2 (read + decode)", n, lambda: loader(2))


if __name__ == "__main__":
    main()
