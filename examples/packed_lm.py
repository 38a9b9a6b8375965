"""Packed batches for a tiny causal LM: documents of varied length packed into rows of
``seq_length`` tokens by the plan, each attending only to itself.

    python examples/packed_lm.py [--steps 300] [--small] [--out DIR]

A JSONL corpus is written from a small grammar (documents of 1 to 12 sentences, so a tiny model
can learn them) and a word-level tokenizer is trained on it here (nothing is downloaded).
``create_dataloaders(..., packing="documents")`` stores each document whole, with its length
recorded, and yields rows planned from the lengths: ``input_ids``, ``position_ids`` restarting
at each document, ``document_ids`` (a block-diagonal mask keeps documents apart), and
``labels`` with -100 on each document's first token and on padding. The model (embeddings, one
causal transformer layer masked per document, a head) trains for ``--steps`` steps; the loss
printed falls, and the pad share of the packed rows is printed beside that of the unpacked run
(one document a row, each batch padded to its longest document).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a child"]
VERBS = ["sees", "likes", "finds", "follows", "draws", "calls"]
OBJECTS = ["the ball", "a tree", "the river", "a small house", "the red car", "the moon"]
PLACES = ["in the park", "at night", "near the school", "by the sea", "every day"]
SEQ, BATCH = 64, 8


def make_documents(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 1 to 12 sentences of the grammar above."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        k = min(12, max(1, int(rng.lognormvariate(0.8, 0.8))))
        docs.append(
            " ".join(
                f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                f"{rng.choice(PLACES)} ."
                for _ in range(k)
            )
        )
    return docs


def train_tokenizer(texts: list[str]):
    """A word-level ``tokenizers.Tokenizer`` with [PAD]=0, [UNK], [BOS], [EOS] (the text
    builder puts [BOS]/[EOS] around each document)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"])
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


class PackedCausalLM(nn.Module):
    """Token + position embeddings (positions restart per document), one transformer layer
    whose mask is causal within each document, a linear head."""

    def __init__(self, vocab_size: int, dim: int = 64) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(SEQ, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, batch: dict) -> torch.Tensor:
        docs = batch["document_ids"]
        n = docs.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        same = docs[:, :, None] == docs[:, None, :]
        allowed = same & causal  # no attention across a document boundary
        allowed |= torch.eye(n, dtype=torch.bool)  # padding attends to itself (ignored)
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        mask = mask.repeat_interleave(4, dim=0)  # one per head
        x = self.tokens(batch["input_ids"]) + self.positions(batch["position_ids"])
        return self.head(self.layer(x, src_mask=mask))


def pad_shares(loader, lengths: list[int], seed: int = 0) -> tuple[float, float]:
    """Pad share of the packed rows of one epoch, and of the same documents unpacked: one a
    row, batches of ``BATCH`` padded to their longest (documents over SEQ cut to SEQ)."""
    pad = total = 0
    for batch in loader:
        pad += int((batch["document_ids"] < 0).sum())
        total += batch["document_ids"].numel()
    order = np.random.default_rng(seed).permutation(len(lengths))
    cut = np.minimum(np.asarray(lengths)[order], SEQ)
    padded = sum(len(b) * int(b.max()) for b in np.array_split(cut, -(-len(cut) // BATCH)))
    return pad / total, 1 - int(cut.sum()) / padded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--small", action="store_true", help="fewer documents and 80 steps")
    p.add_argument("--out", default=None, help="folder for the corpus and shards (default: temp)")
    args = p.parse_args()
    torch.manual_seed(0)
    from wdsloader.training import create_dataloaders

    n_docs, steps = (400, 80) if args.small else (2000, args.steps)
    out = Path(args.out or tempfile.mkdtemp(prefix="packed_lm_"))
    out.mkdir(parents=True, exist_ok=True)
    docs = make_documents(n_docs)
    corpus = out / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = train_tokenizer(docs)
    loader, _ = create_dataloaders(
        corpus, None, tok, batch_size=BATCH, seq_length=SEQ, cache_dir=out / "cache",
        packing="documents", seed=0,
    )  # fmt: skip
    lengths = [len(tok.encode(d, add_special_tokens=False).ids) + 2 for d in docs]
    packed, unpacked = pad_shares(loader, lengths)
    print(f"pad share: packed {packed:.1%} vs unpacked {unpacked:.1%}")
    model = PackedCausalLM(tok.get_vocab_size())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
    losses: list[float] = []
    while len(losses) < steps:
        for batch in loader:
            logits = model(batch)[:, :-1]  # the model shifts: token t predicts t + 1
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) % 20 == 0:
                print(f"step {len(losses)}: loss {np.mean(losses[-20:]):.3f}")
            if len(losses) == steps:
                break
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    print(f"loss fell: {first:.3f} -> {last:.3f} ({'yes' if last < first else 'no'})")


if __name__ == "__main__":
    main()
