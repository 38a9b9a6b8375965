"""A Hugging Face Dataset of text -> UniversalDataModule (TaskSpec.lm_tiny()) -> a tiny causal LM.

    python examples/hf_text_lm.py [--small] [--epochs 3] [--workers 2]

The texts come from a small grammar (so a tiny model can learn them); a word-level tokenizer is
trained on them here (nothing is downloaded). ``UniversalDataModule`` holds out a seeded 10 %
for validation and picks the ``text`` collator from ``TaskSpec.lm_tiny()``'s modality: each
batch is padded to its longest text, with ``labels`` = ``input_ids`` and -100 on the padding.
The model (embedding, a causal transformer layer, a head) predicts token t+1 from tokens <= t;
the validation loss printed after each epoch falls.
"""

from __future__ import annotations

import argparse
import math
import random

import torch
from torch import nn

SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a child"]
VERBS = ["sees", "likes", "finds", "follows", "draws", "calls"]
OBJECTS = ["the ball", "a tree", "the river", "a small house", "the red car", "the moon"]
PLACES = ["in the park", "at night", "near the school", "by the sea", "every day"]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of one to three clauses from the grammar above."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        clauses = [
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}"
            for _ in range(rng.randint(1, 3))
        ]
        texts.append(" and ".join(clauses) + " .")
    return texts


def train_tokenizer(texts: list[str]):
    """A word-level ``tokenizers.Tokenizer`` with [PAD]=0, [UNK], [BOS], [EOS] around each text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"])
    tok.train_from_iterator(texts, trainer=trainer)
    bos, eos = tok.token_to_id("[BOS]"), tok.token_to_id("[EOS]")
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", bos), ("[EOS]", eos)]
    )
    return tok


class TinyCausalLM(nn.Module):
    """Token + position embeddings, one causal transformer layer, a linear head."""

    def __init__(self, vocab_size: int, dim: int = 64, max_len: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=1)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        x = self.embed(input_ids) + self.pos(torch.arange(length, device=input_ids.device))
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).triu(1)
        x = self.body(x, mask=causal, src_key_padding_mask=attention_mask == 0, is_causal=True)
        return self.head(x)


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy: logits at t against labels at t+1 (-100 ignored)."""
    logits = model(batch["input_ids"], batch["attention_mask"])
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1)
    )


@torch.no_grad()
def evaluate(model: nn.Module, loader) -> float:
    model.eval()
    total, n = 0.0, 0
    for batch in loader:
        total += lm_loss(model, batch).item()
        n += 1
    model.train()
    return total / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a quick run (the test suite's)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    n_texts, epochs = (400, 2) if args.small else (2000, 2)
    epochs = args.epochs or epochs

    import datasets

    from wdsloader import set_epoch
    from wdsloader.collate import TaskSpec
    from wdsloader.training import UniversalDataModule

    torch.manual_seed(0)
    texts = make_texts(n_texts)
    tokenizer = train_tokenizer(texts)
    data = datasets.Dataset.from_dict({"text": texts})
    module = UniversalDataModule(
        data,
        task_spec=TaskSpec.lm_tiny(),
        tokenizer=tokenizer,
        batch_size=16,
        val_split=0.1,
        num_workers=args.workers,
        seed=0,
    )
    train, val = module.train_dataloader(), module.val_dataloader()
    first = next(iter(train))
    pad = first["attention_mask"] == 0
    print(
        f"{len(texts)} texts, vocabulary {tokenizer.get_vocab_size()}, {len(train)} train / "
        f"{len(val)} val batches; first batch input_ids {tuple(first['input_ids'].shape)}, "
        f"pad labels all -100: {bool((first['labels'][pad] == -100).all())}"
    )
    model = TinyCausalLM(tokenizer.get_vocab_size())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = [evaluate(model, val)]
    print(
        f"epoch 0: val loss {losses[0]:.3f} (uniform guess {math.log(tokenizer.get_vocab_size()):.3f})"
    )
    for epoch in range(1, epochs + 1):
        set_epoch(train, epoch)
        for batch in train:
            loss = lm_loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses.append(evaluate(model, val))
        print(f"epoch {epoch}: train loss {loss.item():.3f}, val loss {losses[-1]:.3f}")
    print(f"val loss fell: {losses[-1] < 0.7 * losses[0]} ({losses[0]:.3f} -> {losses[-1]:.3f})")


if __name__ == "__main__":
    main()
