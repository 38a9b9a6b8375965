"""Where ``build_shards`` spends its time per sample, on the embedding set, from memory.

Each sample: ``question_emb`` float32[384], ``steering`` float32[384], ``negatives``
float32[4, 384] and a small ``meta`` dict (~9.4 KB of fields, ~13.3 KB of tar). The samples are
generated once into a list of dicts of numpy arrays, so only the builder is measured. Run:

    .venv/bin/python bench/experiments/build_profile.py [--samples 30000] [--repeats 3] [--workers 1 2]
        [--cprofile 25]

Prints, per stage, CPU microseconds per sample (median of ``--repeats``), each stage timed alone
with the builder's own functions: ``prepare`` (key, split), each field's encoder (npy: checks,
NaN/Inf, header + bytes; json), tar framing (headers, padding, layout, sha256: a
``TarStreamWriter`` writing to a null file), sha256 alone, buffered file writes alone, and
fsync + rename per shard (wall time: it waits for the disk). Then end-to-end ``build_shards``
samples/s (wall, and per CPU-second of this process and its workers) for each ``--workers``,
and with ``--cprofile N`` the top N functions of one ``workers=1`` build.

To compare with another version in the same session, unpack it and put it first on the path:
``git archive HEAD | tar -x -C /tmp/base`` then ``PYTHONPATH=/tmp/base .venv/bin/python
bench/experiments/build_profile.py``. The machine may be shared: compare runs made together, and the CPU
columns rather than wall time.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.experiments.build_scaling import cpu_seconds
from build_shards import build_shards
from build_shards.encode.field_encoder import make_encoder
from build_shards.encode.sample import SampleEncoder
from build_shards.layout.splits import make_splitter
from build_shards.probe.infer import infer_schema
from build_shards.sources import open_source
from build_shards.write.blocks import BlockJob, prepare
from wdsloader.format import TarStreamWriter

DIM = 384
N_NEG = 4
SPLITS = {"train": 0.9, "val": 0.1}
SHARD_MAX_COUNT = 2_000


def make_samples(n: int) -> list[dict[str, Any]]:
    """``n`` embedding samples held in memory (what a caller of ``build_shards`` passes)."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        vecs = rng.standard_normal((2 + N_NEG, DIM), dtype=np.float32)
        samples.append(
            {
                "question_emb": vecs[0].copy(),
                "steering": vecs[1].copy(),
                "negatives": vecs[2:].copy(),
                "meta": {"i": i, "cluster": i % 97, "source": "synthetic"},
            }
        )
    return samples


class _NullFile:
    """A binary file that drops what it is given (to time tar framing without I/O)."""

    def write(self, data: Any) -> int:
        return len(data)


def _per_sample_us(fn: Callable[[], int], repeats: int) -> float:
    """Median over ``repeats`` of ``fn``'s CPU seconds (this process: steadier than wall time on
    a shared machine) divided by the samples it handled, in µs."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        n = fn()
        times.append((time.process_time() - t0) / max(n, 1) * 1e6)
    return statistics.median(times)


def _prepared(job: BlockJob, samples: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(key, sample)`` of every sample after ``prepare`` (key, split field handling)."""
    out = []
    for i, s in enumerate(samples):
        got = prepare(job, i, s)
        assert got is not None
        out.append((got[0], got[2]))
    return out


def stage_times(samples: list[dict[str, Any]], repeats: int, tmp: str) -> dict[str, float]:
    """CPU µs per sample of each stage of the builder, timed alone."""
    src = open_source(samples)
    splitter = make_splitter(src, splits=SPLITS, split_field=None, group_by=None, seed=0)
    schema, dims = infer_schema([("000000000", samples[0])])
    encoder = SampleEncoder(schema, dims)
    job = BlockJob(
        source=None, decoder=None, map_fn=None, key_field="__key__", splitter=splitter,
        encoder=encoder, shard_max_count=SHARD_MAX_COUNT, shard_max_bytes=2**40, fingerprint="",
    )  # fmt: skip
    prepared = _prepared(job, samples)
    encoded = [(key, encoder.encode(key, sample)[0]) for key, sample in prepared]
    blobs = []
    for key, members in encoded:
        buf = io.BytesIO()
        TarStreamWriter(buf).write_sample(key, members)
        blobs.append(buf.getvalue())
    out: dict[str, float] = {}

    def run_prepare() -> int:
        for i, s in enumerate(samples):
            prepare(job, i, s)
        return len(samples)

    out["prepare: key, split hash"] = _per_sample_us(run_prepare, repeats)
    for field, spec in schema.items():
        enc = make_encoder(field, spec, dims, False)
        values = [(key, sample[field]) for key, sample in prepared]

        def run_field(enc: Any = enc, values: list[Any] = values) -> int:
            for key, value in values:
                enc(key, value)
            return len(values)

        out[f"  encode {field} ({spec.encoding})"] = _per_sample_us(run_field, repeats)

    def run_sample_encoder() -> int:
        for key, sample in prepared:
            encoder.encode(key, sample)
        return len(prepared)

    out["SampleEncoder.encode: all fields + name checks"] = _per_sample_us(
        run_sample_encoder, repeats
    )

    def run_tar() -> int:
        w = TarStreamWriter(_NullFile())  # type: ignore[arg-type]
        for key, members in encoded:
            w.write_sample(key, members)
        w.close()
        return len(encoded)

    def run_sha() -> int:
        h = hashlib.sha256()
        for blob in blobs:
            h.update(blob)
        h.hexdigest()
        return len(blobs)

    def run_write() -> int:
        path = os.path.join(tmp, "write-test")
        with open(path, "wb", buffering=1 << 20) as f:
            for blob in blobs:
                f.write(blob)
        os.remove(path)
        return len(blobs)

    tar_and_sha = _per_sample_us(run_tar, repeats)
    out["sha256 of the shard bytes"] = sha = _per_sample_us(run_sha, repeats)
    out["tar: headers, padding, layout (writer minus sha256)"] = tar_and_sha - sha
    out["file writes (1 MiB buffer, page cache)"] = _per_sample_us(run_write, repeats)
    out["= sum (prepare, SampleEncoder, tar, sha256, writes)"] = (
        out["prepare: key, split hash"]
        + out["SampleEncoder.encode: all fields + name checks"]
        + tar_and_sha
        + out["file writes (1 MiB buffer, page cache)"]
    )

    def fsync_once() -> float:
        path = os.path.join(tmp, "fsync-test")
        shard = blobs[:SHARD_MAX_COUNT]
        with open(path, "wb", buffering=1 << 20) as f:
            for blob in shard:
                f.write(blob)
            f.flush()
            t0 = time.perf_counter()
            os.fsync(f.fileno())
        os.replace(path, path + ".done")
        elapsed = time.perf_counter() - t0
        os.remove(path + ".done")
        return elapsed / len(shard) * 1e6

    out[f"fsync + rename per shard of {SHARD_MAX_COUNT} (wall: disk wait)"] = statistics.median(
        fsync_once() for _ in range(repeats)
    )
    return out


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its worker processes (fork server's included)."""
    return sum(cpu_seconds())


def end_to_end(
    samples: list[dict[str, Any]], workers: int, out: str, profile: cProfile.Profile | None = None
) -> tuple[float, float]:
    """``(samples/s wall, samples per CPU-second)`` of one build of ``samples`` (CPU of this
    process and its worker processes); ``profile`` records the build call alone."""
    shutil.rmtree(out, ignore_errors=True)
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    manifest = build_shards(samples, out, splits=SPLITS, shard_max_count=SHARD_MAX_COUNT,
                            workers=workers)  # fmt: skip
    if profile is not None:
        profile.disable()
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    shutil.rmtree(out, ignore_errors=True)
    return manifest.num_samples / wall, manifest.num_samples / max(cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="*", default=[1])
    parser.add_argument("--cprofile", type=int, default=0, metavar="N")
    parser.add_argument("--no-stages", action="store_true", help="end-to-end numbers only")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-build-profile-")
    try:
        samples = make_samples(args.samples)
        print(
            f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} samples={args.samples} "
            f"repeats={args.repeats}"
        )
        if not args.no_stages:
            print(f"{'stage (each timed alone)':<58} CPU µs/sample")
            for name, us in stage_times(samples, args.repeats, tmp).items():
                print(f"  {name:<56} {us:7.2f}")
        runs: dict[int, list[tuple[float, float]]] = {w: [] for w in args.workers}
        for _ in range(args.repeats):  # interleaved, so that load changes hit every setting
            for workers in args.workers:
                runs[workers].append(end_to_end(samples, workers, os.path.join(tmp, "ds")))
        for workers, got in runs.items():
            wall = statistics.median(r[0] for r in got)
            cpu = statistics.median(r[1] for r in got)
            best = max(r[0] for r in got)
            print(
                f"build_shards workers={workers}: {wall:9,.0f} samples/s (median; best "
                f"{best:,.0f})  {1e6 / wall:6.1f} µs/sample wall  {cpu:9,.0f} samples per CPU-s"
            )
        if args.cprofile:
            prof = cProfile.Profile()
            end_to_end(samples, 1, os.path.join(tmp, "ds"), prof)
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.cprofile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
