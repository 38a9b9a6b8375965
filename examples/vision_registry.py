"""Images -> shards -> the `vision` collator picked by TaskSpec.vision_tiny() -> a tiny CNN.

python examples/vision_registry.py [--out vision_out] [--samples 2000] [--epochs 3] [--workers 2]
python examples/vision_registry.py --small   (400 samples, 2 epochs, 1 worker: the test's mode)

Synthetic 32x32 RGB images in 4 classes (class k: quadrant k brighter, plus noise) are written
as PNG members of shards with `build_shards` (the loader decodes them to uint8 HWC arrays); `CollatorRegistry.get_instance().get_collator(TaskSpec.
vision_tiny())` picks the `vision` collator (uint8 HWC -> float CHW in [0, 1], ImageNet
normalisation from the task's `preprocessing_config`, int64 labels), which `create_loader` runs
inside its workers. A small CNN learns the classes in a few steps.
"""

from __future__ import annotations

import argparse
import shutil

import numpy as np
import torch
from PIL import Image
from torch import nn

from build_shards import ShardOptions, build_shards
from wdsloader import CollatorRegistry, TaskSpec, create_loader

SIZE, CLASSES = 32, 4


def generate(n: int, seed: int = 0):
    """``n`` samples ``{"pixel_values": a 32x32 RGB PIL image, "labels": class}``."""
    rng = np.random.default_rng(seed)
    half = SIZE // 2
    for i in range(n):
        label = i % CLASSES
        image = rng.normal(90, 30, (SIZE, SIZE, 3))
        row, col = divmod(label, 2)
        image[row * half : (row + 1) * half, col * half : (col + 1) * half] += 90
        yield {
            "__key__": f"img{i:06d}",
            "pixel_values": Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB"),
            "labels": label,
        }


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(4),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )


def accuracy(model: nn.Module, loader) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in loader:
            pred = model(batch["pixel_values"]).argmax(1)
            right += int((pred == batch["labels"]).sum())
            total += len(pred)
    model.train()
    return right / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="vision_out")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--small", action="store_true", help="400 samples, 2 epochs, 1 worker")
    args = p.parse_args()
    if args.small:
        args.samples, args.epochs, args.workers = 400, 2, 1
    shutil.rmtree(args.out, ignore_errors=True)
    out = f"{args.out}/dataset"
    torch.manual_seed(0)

    manifest = build_shards(
        generate(args.samples),
        out,
        splits={"train": 0.8, "val": 0.2},
        shards=ShardOptions(max_count=250),
    )
    stored = manifest.schema["pixel_values"].encoding
    print(f"built {manifest.num_samples} samples -> {out} (images stored as {stored})")

    task = TaskSpec.vision_tiny()
    collate = CollatorRegistry.get_instance().get_collator(task_spec=task)
    print(f"collator for {task.name} ({task.modality}): {collate!r}")
    common = dict(batch_size=args.batch_size, collate_fn=collate, num_workers=args.workers)
    train = create_loader(out, "train", seed=0, **common)
    val = create_loader(out, "val", **common)

    batch = next(iter(train))
    pixels = batch["pixel_values"]
    print(
        f"batch: pixel_values {tuple(pixels.shape)} {pixels.dtype} mean {pixels.mean():.3f}, "
        f"labels {batch['labels'].dtype}"
    )

    model = tiny_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    print(f"val accuracy before training: {accuracy(model, val):.3f}")
    first = last = None
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        for batch in train:
            loss = loss_fn(model(batch["pixel_values"]), batch["labels"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = loss.item() if first is None else first
            last = loss.item()
        print(f"epoch {epoch}: {len(train)} steps, last loss {last:.3f}")
    print(f"train loss: first {first:.3f} -> last {last:.3f}")
    print(f"val accuracy after training: {accuracy(model, val):.3f}")


if __name__ == "__main__":
    main()
