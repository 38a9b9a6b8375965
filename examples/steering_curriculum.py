"""Train a tiny steering model with a per-sample steering curriculum read from WebDataset shards.

python examples/steering_curriculum.py [--pairs 8000] [--epochs 8] [--small] [--out DIR]

A JASPER-style corpus is generated: questions and sources as embeddings, keyword clusters with
centroids, steering variants computed from them (centroid = normalize(c - q), keyword =
normalize(mean of the pair's keyword embeddings) falling back to centroid, residual = q - c),
hard negatives in four tiers (same cluster, adjacent clusters, most similar elsewhere, random)
and relevance scores. ``build_shards`` writes one sample per (question, source) pair with splits
grouped by question (no question lands in two splits) and stores the curriculum in the
manifest as the loader's default. Training draws the steering variant of every sample from
probabilities that depend on the epoch (P(zero) decays from 0.5 to 0.1); validation forces
``centroid``. The model (an MLP on question, steering and variant) is trained with InfoNCE
against the target source and the hard negatives.

One line per epoch: train loss, val loss, val accuracy (the target ranked first among itself
and the negatives), the variant mix training saw (zero/centroid/keyword/residual fractions),
the scheduled probabilities, and the validation mix. The variant of a sample is a function of
(seed, epoch, key), so the mix does not depend on ``--workers``; the batch order does, and with
it the losses. The dataset goes to a temporary folder unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from build_shards import LoaderDefaults, SampleOptions, ShardOptions, build_shards
from wdsloader import create_loader, set_epoch
from wdsloader.curriculum import Curriculum, zero_decay
from wdsloader.validate import validate_first_batch

VARIANTS = {
    "zero": None,
    "centroid": "steering_centroid",
    "keyword": "steering_keyword",
    "residual": "steering_residual",
}
SPLITS = {"train": 0.8, "val": 0.1, "test": 0.1}
KEYWORDS_PER_CLUSTER = 8
NO_KEYWORD_RATE = 0.15  # pairs without keywords: their keyword steering falls back to centroid


# ------------------------------------------------------------------------------------------------
# Synthetic corpus
# ------------------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Corpus:
    questions: np.ndarray  # [N_q, D] unit vectors
    sources: np.ndarray  # [N_s, D] unit vectors
    source_cluster: np.ndarray  # [N_s]
    keywords: np.ndarray  # [N_k, D] unit vectors
    centroids: np.ndarray  # [K, D] unit vectors
    pairs: np.ndarray  # [N_p, 2] (question, source)
    pair_cluster: np.ndarray  # [N_p] the source's cluster
    pair_keywords: list[np.ndarray]  # keyword ids of each pair (may be empty)
    negatives: np.ndarray  # [N_p, N_neg] source ids, grouped by tier
    tiers: np.ndarray  # [N_p, N_neg] 1..4


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _noise(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    return rng.normal(size=(n, dim)) / np.sqrt(dim)  # norm ~1


def tier_sizes(n_neg: int) -> list[int]:
    """n_neg // 4 per tier, the remainder to tier 1 first (as JASPER's NegativeMiner)."""
    sizes = [n_neg // 4] * 4
    for t in range(n_neg % 4):
        sizes[t] += 1
    return sizes


def make_corpus(
    n_pairs: int, dim: int, n_clusters: int, n_neg: int, seed: int, adjacent_k: int = 3
) -> Corpus:
    """Keywords around cluster centroids; a source is its cluster plus two of its keywords; a
    question sits between its 1-3 sources, taken from different clusters. A pair is (question,
    source) and its cluster is the source's: only the steering tells which of the question's
    sources a pair means (the others come back as hard negatives)."""
    rng = np.random.default_rng(seed)
    k = n_clusters
    centroids = _unit(rng.normal(size=(k, dim)))
    kw_cluster = np.repeat(np.arange(k), KEYWORDS_PER_CLUSTER)
    keywords = _unit(centroids[kw_cluster] + 0.8 * _noise(rng, len(kw_cluster), dim))

    n_sources = max(n_pairs // 2, 12 * k)
    source_cluster = rng.integers(0, k, size=n_sources)
    source_kw = KEYWORDS_PER_CLUSTER * source_cluster[:, None] + np.stack(
        [rng.choice(KEYWORDS_PER_CLUSTER, size=2, replace=False) for _ in range(n_sources)]
    )
    sources = _unit(
        0.6 * centroids[source_cluster]
        + keywords[source_kw].mean(axis=1)
        + 0.4 * _noise(rng, n_sources, dim)
    )
    by_cluster = [np.flatnonzero(source_cluster == c) for c in range(k)]

    # questions with 1-3 sources from distinct clusters, cut to exactly n_pairs pairs
    positives: list[np.ndarray] = []
    n_made = 0
    while n_made < n_pairs:
        clusters = rng.choice(k, size=min(int(rng.integers(1, 4)), n_pairs - n_made), replace=False)
        positives.append(np.array([rng.choice(by_cluster[c]) for c in clusters]))
        n_made += len(clusters)
    questions = _unit(
        np.stack([sources[p].mean(axis=0) for p in positives])
        + 0.4 * _noise(rng, len(positives), dim)
    )
    pairs = np.array([(q, s) for q, pos in enumerate(positives) for s in pos], dtype=np.int64)
    pair_cluster = source_cluster[pairs[:, 1]]
    pair_keywords = [
        np.empty(0, np.int64) if rng.uniform() < NO_KEYWORD_RATE else source_kw[s]
        for s in pairs[:, 1]
    ]

    # hard negatives in tiers (the pair's cluster c): 1 other sources of c, 2 sources of the
    # adjacent_k clusters nearest to c, 3 the sources outside c most similar to the question,
    # 4 random sources outside c
    sim_cc = centroids @ centroids.T
    np.fill_diagonal(sim_cc, -np.inf)
    adjacent = np.argsort(-sim_cc, axis=1)[:, :adjacent_k]
    sims = questions @ sources.T
    n1, n2, n3, n4 = tier_sizes(n_neg)
    negatives = np.empty((len(pairs), n_neg), dtype=np.int64)
    for p, (q, s) in enumerate(pairs):
        c = pair_cluster[p]
        own = by_cluster[c]
        t1 = rng.choice(own[own != s], size=n1, replace=False)
        t2 = rng.choice(np.concatenate([by_cluster[a] for a in adjacent[c]]), size=n2)
        outside = np.where(source_cluster == c, -np.inf, sims[q])
        t3 = np.argpartition(-outside, n3)[:n3] if n3 else np.empty(0, np.int64)
        t4 = rng.choice(np.flatnonzero(source_cluster != c), size=n4)
        negatives[p] = np.concatenate([t1, t2, t3, t4])
    tiers = np.repeat(np.arange(1, 5), [n1, n2, n3, n4])[None].repeat(len(pairs), axis=0)
    return Corpus(
        questions=questions.astype(np.float32),
        sources=sources.astype(np.float32),
        source_cluster=source_cluster,
        keywords=keywords.astype(np.float32),
        centroids=centroids.astype(np.float32),
        pairs=pairs,
        pair_cluster=pair_cluster,
        pair_keywords=pair_keywords,
        negatives=negatives,
        tiers=tiers.astype(np.int64),
    )


def steering_variants(q: np.ndarray, c: np.ndarray, kw: np.ndarray) -> dict[str, np.ndarray]:
    """JASPER's SteeringBuilder for one pair (float64 in, float32 out)."""
    diff = c - q
    norm = np.linalg.norm(diff)
    centroid = diff / norm if norm >= 1e-8 else np.zeros_like(q)
    keyword = centroid
    if len(kw):
        mean = kw.mean(axis=0)
        if np.linalg.norm(mean) >= 1e-8:
            keyword = mean / np.linalg.norm(mean)
    nq, nc = np.linalg.norm(q), np.linalg.norm(c)
    cos = float(np.clip(q @ c / (nq * nc), -1.0, 1.0)) if min(nq, nc) >= 1e-8 else 0.0
    return {
        "steering_centroid": centroid.astype(np.float32),
        "steering_keyword": keyword.astype(np.float32),
        "steering_residual": (q - c).astype(np.float32),
        "centroid_distance": np.float32(1.0 - cos),
    }


def samples(corpus: Corpus):
    """One sample per (question, source) pair, keyed by the pair."""
    for p, (q, s) in enumerate(corpus.pairs):
        c = int(corpus.pair_cluster[p])
        qv, sv = corpus.questions[q].astype(np.float64), corpus.sources[s].astype(np.float64)
        steer = steering_variants(
            qv, corpus.centroids[c].astype(np.float64), corpus.keywords[corpus.pair_keywords[p]]
        )
        yield {
            "__key__": f"q{q:06d}-s{s:06d}",
            "question_id": int(q),
            "question_emb": corpus.questions[q],
            "target_source_emb": corpus.sources[s],
            "negative_embs": corpus.sources[corpus.negatives[p]],
            "negative_tiers": corpus.tiers[p],
            "cluster_id": np.array(c, dtype=np.int64),
            "relevance": np.float32(np.clip((1.0 + qv @ sv) / 2.0, 0.0, 1.0)),
            **steer,
        }


def schema(n_clusters: int) -> dict[str, dict]:
    vec = {"encoding": "npy", "dtype": "float32", "shape": ["D"]}
    unit = {**vec, "range": [-1.0, 1.0]}
    scalar = {"encoding": "npy", "dtype": "float32", "shape": []}
    return {
        "question_emb": unit,
        "target_source_emb": unit,
        "negative_embs": {**unit, "shape": ["N_neg", "D"]},
        "negative_tiers": {"encoding": "npy", "dtype": "int64", "shape": ["N_neg"], "range": [1, 4]},
        # scalars as 0-d .npy: fixed size, so the loader gathers them for the whole batch
        "cluster_id": {**scalar, "dtype": "int64", "range": [0, n_clusters - 1]},
        "relevance": {**scalar, "range": [0.0, 1.0]},
        "centroid_distance": {**scalar, "range": [0.0, 2.0]},
        "steering_centroid": unit,
        "steering_keyword": unit,
        "steering_residual": vec,  # q - c: not normalised, norm up to 2
        "question_id": {"encoding": "cls", "dtype": "int"},
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Model and training
# ------------------------------------------------------------------------------------------------


class SteeringModel(torch.nn.Module):
    """Predicts the source embedding from the question, the steering vector and which variant
    it is (centroid and residual point in opposite directions: the model has to know)."""

    def __init__(self, dim: int, n_variants: int, hidden: int = 128) -> None:
        super().__init__()
        self.n_variants = n_variants
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2 * dim + n_variants, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, dim),
        )

    def forward(
        self, question: torch.Tensor, steering: torch.Tensor, variant: torch.Tensor
    ) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(variant, self.n_variants).to(question.dtype)
        out = self.net(torch.cat([question, steering, onehot], dim=-1))
        return torch.nn.functional.normalize(out, dim=-1)


def info_nce(model: SteeringModel, batch: dict, tau: float = 0.1) -> tuple[torch.Tensor, int]:
    """Cross-entropy of the target among (target, hard negatives); also the number correct."""
    pred = model(batch["question_emb"], batch["steering"], batch["steering_variant"])
    cands = torch.cat([batch["target_source_emb"][:, None], batch["negative_embs"]], dim=1)
    logits = torch.einsum("bd,bnd->bn", pred, cands) / tau
    target = torch.zeros(len(logits), dtype=torch.long)
    loss = torch.nn.functional.cross_entropy(logits, target)
    return loss, int((logits.argmax(dim=1) == 0).sum())


def split_questions(data: str, workers: int) -> dict[str, set[int]]:
    """The question ids each split holds (read back from the shards)."""
    seen: dict[str, set[int]] = {}
    for split in SPLITS:
        ids: set[int] = set()
        for batch in create_loader(data, split, batch_size=512, num_workers=workers, shuffle=False):
            ids.update(batch["question_id"].tolist())
        seen[split] = ids
    return seen


def fmt_mix(x: np.ndarray) -> str:
    return "/".join(f"{v:.3f}" for v in x)


def run(args: argparse.Namespace, out: Path) -> None:
    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a tiny model: more threads only add synchronisation
    corpus = make_corpus(args.pairs, args.dim, args.clusters, args.neg, args.seed)
    no_kw = np.mean([len(k) == 0 for k in corpus.pair_keywords])
    print(
        f"corpus: {len(corpus.pairs)} pairs, {len(corpus.questions)} questions, "
        f"{len(corpus.sources)} sources, {args.clusters} clusters, {len(corpus.keywords)} "
        f"keywords, D={args.dim}, N_neg={args.neg} (tiers 1-4: "
        f"{'/'.join(map(str, tier_sizes(args.neg)))}), {no_kw:.0%} pairs without keywords"
    )

    curriculum = Curriculum(
        VARIANTS,
        output="steering",
        index_output="steering_variant",
        schedule=zero_decay(epochs=max(args.epochs - 1, 1)),
    )
    data = str(out / "dataset")
    t0 = time.perf_counter()
    manifest = build_shards(
        samples(corpus),
        data,
        splits=SPLITS,
        schema=schema(args.clusters),
        samples=SampleOptions(
            group_by="question_id",  # a question never straddles two splits
            dims={"D": args.dim, "N_neg": args.neg},
        ),
        shards=ShardOptions(max_count=1000),
        seed=args.seed,
        defaults=LoaderDefaults(curriculum=curriculum),
        overwrite=True,
    )
    build_s = time.perf_counter() - t0
    by_split = split_questions(data, args.workers)
    shared = sum(
        len(by_split[a] & by_split[b]) for i, a in enumerate(SPLITS) for b in list(SPLITS)[i + 1 :]
    )
    print(
        f"built {manifest.num_samples} samples in {build_s:.1f}s: "
        + ", ".join(
            f"{name} {manifest.splits[name].num_samples} ({len(by_split[name])} questions)"
            for name in SPLITS
        )
        + f"; questions in two splits: {shared}"
    )

    train = create_loader(
        data, "train", batch_size=args.batch_size, num_workers=args.workers, seed=args.seed
    )
    val = create_loader(data, "val", batch_size=256, num_workers=args.workers, seed=args.seed)
    val.dataset_obj.force_steering("centroid")
    validate_first_batch(train)
    validate_first_batch(val)
    names = list(curriculum.names)
    print(
        f"first batches valid (train, val); variants {'/'.join(names)}; "
        f"P(zero) decays over {max(args.epochs - 1, 1)} epochs; val steering forced to centroid"
    )

    model = SteeringModel(args.dim, len(names), args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    print(f"{'epoch':>5}  {'train_loss':>10}  {'val_loss':>8}  {'val_acc':>7}  "
          f"{'train_mix ' + '/'.join(n[0] for n in names):<24}  "
          f"{'scheduled ' + '/'.join(n[0] for n in names):<24}  "
          f"val_mix {'/'.join(n[0] for n in names)}")  # fmt: skip
    for epoch in range(args.epochs):
        set_epoch(train, epoch)
        model.train()
        counts = np.zeros(len(names), dtype=np.int64)
        loss_sum, n_train = 0.0, 0
        for batch in train:
            loss, _ = info_nce(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            counts += np.bincount(batch["steering_variant"].numpy(), minlength=len(names))
            loss_sum += loss.item() * len(batch["__key__"])
            n_train += len(batch["__key__"])

        model.eval()
        val_counts = np.zeros(len(names), dtype=np.int64)
        val_sum, val_correct, n_val = 0.0, 0, 0
        with torch.no_grad():
            for batch in val:
                loss, correct = info_nce(model, batch)
                val_counts += np.bincount(batch["steering_variant"].numpy(), minlength=len(names))
                val_sum += loss.item() * len(batch["__key__"])
                val_correct += correct
                n_val += len(batch["__key__"])
        print(
            f"{epoch:>5}  {loss_sum / n_train:>10.4f}  {val_sum / n_val:>8.4f}  "
            f"{val_correct / n_val:>7.3f}  {fmt_mix(counts / n_train):<24}  "
            f"{fmt_mix(curriculum.probabilities(epoch)):<24}  {fmt_mix(val_counts / n_val)}"
        )
    print(f"done in {time.perf_counter() - t_start:.1f}s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="keep the dataset here (default: a temp dir)")
    p.add_argument("--pairs", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--small", action="store_true", help="1500 pairs, 3 epochs (the test)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--clusters", type=int, default=16)
    p.add_argument("--neg", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.small:
        args.pairs, args.epochs = 1500, 3
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        run(args, out)  # writes OUT/dataset (build_shards(overwrite=True) replaces an old one)
        return
    with tempfile.TemporaryDirectory(prefix="steering_curriculum_") as tmp:
        run(args, Path(tmp))


if __name__ == "__main__":
    main()
