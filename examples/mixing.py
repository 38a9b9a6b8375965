"""Mix three corpora 0.6/0.3/0.1, by loaders and by samples; checkpoint mid-epoch, resume exactly.

python examples/mixing.py [--out mixing_out] [--small]

Three synthetic corpora of very different sizes are built as datasets, each read by its own
``create_loader``; a ``MultiDataLoader`` with ``WEIGHTED`` 0.6/0.3/0.1 draws each step's batch
from one of them: exactly its largest-remainder quota of the epoch's steps, evenly interleaved.
The small corpora are cycled (each pass a new epoch of their loader). A first run stops in the
middle of epoch 0 and saves ``state_dict()``; new loaders load it and play the rest of the two
epochs, which the script checks against an uninterrupted run.

Then the same corpora are mixed sample by sample: ``create_loader`` over a list of ``MixSource``
with weights 0.6/0.3/0.1 gives every batch samples of all three, each source exactly its
largest-remainder quota of the epoch (the curated corpus repeated, each sample k or k+1 times),
with the same checkpoint and resume, and each source's share per epoch printed against its quota.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np

from build_shards import ShardOptions, build_shards
from wdsloader import MultiDataLoader, MultiDataLoaderConfig, create_loader
from wdsloader.mix import Mix, MixSource, mix_quotas_for
from wdsloader.plan.quotas import largest_remainder

WEIGHTS = {"web": 0.6, "code": 0.3, "curated": 0.1}


def corpus(name: str, n: int):
    rng = np.random.default_rng(len(name))
    for i in range(n):
        yield {"x": rng.normal(size=8).astype(np.float32), "text": f"{name} document {i}"}


def build(root: Path, sizes: dict[str, int]) -> None:
    for name, n in sizes.items():
        shards = ShardOptions(max_count=500)
        build_shards(corpus(name, n), str(root / name), shards=shards, overwrite=True)


def mixer(root: Path, batch_size: int) -> MultiDataLoader:
    loaders = [create_loader(str(root / name), "train", batch_size, seed=1) for name in WEIGHTS]
    config = MultiDataLoaderConfig(
        sampling_strategy="weighted",
        dataloader_weights=list(WEIGHTS.values()),
        dataloader_names=list(WEIGHTS),
    )
    return MultiDataLoader(loaders, config)


def play(mdl: MultiDataLoader, epochs: int, stop_after: int | None = None) -> list[list]:
    """(epoch, source, keys) of every step, up to ``stop_after`` steps."""
    seen: list[list] = []
    while mdl.epoch < epochs:
        epoch = mdl.epoch
        for step in mdl:
            seen.append([epoch, step.name, list(step.batch["__key__"])])
            if stop_after is not None and len(seen) == stop_after:
                return seen
    return seen


def sample_mix(root: Path, batch_size: int, epoch_samples: int):
    """One loader over the three corpora mixed sample by sample (field ``source``: the index),
    ``epoch_samples`` a whole number of batches (nothing dropped: the quotas are exact)."""
    sources = [MixSource(root / name, weight=w) for name, w in WEIGHTS.items()]
    mix = Mix(sources, source_field="source", epoch_samples=epoch_samples)
    return create_loader(mix, "train", batch_size, seed=1)


def play_samples(loader, epochs: int, stop_after: int | None = None) -> list[list]:
    """(epoch, sources, keys) of every batch, up to ``stop_after`` batches."""
    seen: list[list] = []
    while loader.dataset_obj.epoch < epochs:
        epoch = loader.dataset_obj.epoch
        for batch in loader:
            seen.append([epoch, batch["source"].tolist(), list(batch["__key__"])])
            if stop_after is not None and len(seen) == stop_after:
                return seen
    return seen


def sample_level(out: Path, sizes: dict[str, int], batch_size: int) -> None:
    epoch_samples = sum(sizes.values()) // batch_size * batch_size
    full = play_samples(sample_mix(out, batch_size, epoch_samples), epochs=2)
    steps = len(sample_mix(out, batch_size, epoch_samples))
    half = steps // 2
    first = sample_mix(out, batch_size, epoch_samples)
    head = play_samples(first, epochs=2, stop_after=half)
    checkpoint = out / "sample_mix_state.json"
    checkpoint.write_text(json.dumps(first.state_dict()))
    resumed = sample_mix(out, batch_size, epoch_samples)
    resumed.load_state_dict(json.loads(checkpoint.read_text()))
    tail = play_samples(resumed, epochs=2)
    mixed = sum(len(set(srcs)) == 3 for _, srcs, _ in full)
    print(f"sample-level mix: {steps} batches of {batch_size} per epoch; "
          f"{mixed} of {len(full)} batches hold all three sources")  # fmt: skip
    print(f"sample-level checkpoint after {half} batches, resumed: {head + tail == full}")
    names = list(WEIGHTS)
    sources = [MixSource(out / name, weight=w) for name, w in WEIGHTS.items()]
    print(f"{'level':>6} {'epoch':>5} {'source':>8} {'samples':>7} {'quota':>6} {'share':>6} "
          f"{'weight':>6} passes")  # fmt: skip
    for epoch in (0, 1):
        quotas = mix_quotas_for(sources, list(sizes.values()), epoch, epoch_samples=epoch_samples)
        counts = Counter(s for e, srcs, _ in full if e == epoch for s in srcs)
        total = sum(counts.values())
        for i, name in enumerate(names):
            n = counts[i]
            print(
                f"{'sample':>6} {epoch:>5} {name:>8} {n:>7} {quotas[i]:>6} {n / total:>6.3f} "
                f"{WEIGHTS[name]:>6.3f} {n / sizes[name]:>6.2f}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="mixing_out")
    p.add_argument("--small", action="store_true", help="a quick run (the test suite's)")
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    scale = 1 if args.small else 10
    sizes = {"web": 2000 * scale, "code": 400 * scale, "curated": 60 * scale}
    t0 = time.perf_counter()
    build(out, sizes)
    print(
        f"built {sum(sizes.values())} samples: " + ", ".join(f"{k} {v}" for k, v in sizes.items())
    )

    full = play(mixer(out, args.batch_size), epochs=2)
    steps = len(mixer(out, args.batch_size))
    print(f"{steps} steps per epoch (the sum of the loaders' lengths)")

    half = steps // 2
    first = mixer(out, args.batch_size)
    head = play(first, epochs=2, stop_after=half)
    checkpoint = out / "mix_state.json"
    checkpoint.write_text(json.dumps(first.state_dict()))  # JSON-able: every part is
    resumed = mixer(out, args.batch_size)  # new loaders, as after a restart
    resumed.load_state_dict(json.loads(checkpoint.read_text()))
    tail = play(resumed, epochs=2)
    print(f"checkpoint after {half} steps of epoch 0, resumed with new loaders")
    print(f"identical to an uninterrupted run: {head + tail == full}")

    quotas = largest_remainder(list(WEIGHTS.values()), steps)
    print(f"{'epoch':>5} {'source':>8} {'steps':>6} {'quota':>6} {'share':>6} {'weight':>6} passes")
    for epoch in (0, 1):
        counts = Counter(name for e, name, _ in full if e == epoch)
        for (name, weight), quota in zip(WEIGHTS.items(), quotas.tolist(), strict=True):
            n = counts[name]
            per_pass = len(create_loader(str(out / name), "train", args.batch_size))
            print(
                f"{epoch:>5} {name:>8} {n:>6} {quota:>6} {n / steps:>6.3f} {weight:>6.3f} "
                f"{n / per_pass:>6.2f}"
            )
    sample_level(out, sizes, args.batch_size)
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
