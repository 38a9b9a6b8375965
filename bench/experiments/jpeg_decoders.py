"""JPEG decoders compared: µs per 256x256 JPEG, on 1 and 2 threads, and pixels against Pillow.

    python bench/experiments/jpeg_decoders.py [--n 512] [--repeat 5] [--size 256]

Run it in a venv holding the decoders to compare (each one is skipped when it does not import):
Pillow (what :func:`wdsloader.decode.codecs.decode_image` does), simplejpeg, PyTurboJPEG (needs
the system's libturbojpeg), and the DCT-scaled decodes (Pillow's ``Image.draft``, simplejpeg's
``min_height``/``min_width``, PyTurboJPEG's ``scaling_factor``) to half size. The JPEGs are the
bench's photo-like ones (``bench.workloads._jpegs``: gradients, a disc and noise, quality 90),
cycled to ``--n`` members. Prints one Markdown row per decoder: µs per image (best of
``--repeat``) on one thread, samples/s on a pool of 2 threads and their ratio (about 2 when the
decoder releases the GIL on 2 free cores), and the max abs difference from Pillow's pixels
(full-size decoders against Pillow, scaled ones against Pillow's ``draft`` at the same size).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

Decode = Callable[[bytes], np.ndarray]


def pillow(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))


def pillow_draft(size: int) -> Decode:
    from PIL import Image

    def decode(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (size, size))
            return np.asarray(img)

    return decode


def decoders(half: int) -> dict[str, Decode]:
    """The decoders that import here, by name."""
    out: dict[str, Decode] = {"pillow": pillow, f"pillow draft {half}": pillow_draft(half)}
    try:
        import simplejpeg

        out["simplejpeg"] = lambda d: simplejpeg.decode_jpeg(d, "RGB", False, False)
        out["simplejpeg fastdct+fastupsample"] = lambda d: simplejpeg.decode_jpeg(
            d, "RGB", True, True
        )
        out[f"simplejpeg scaled {half}"] = lambda d: simplejpeg.decode_jpeg(
            d, "RGB", False, False, half, half
        )
    except ImportError:
        print("simplejpeg: not installed", file=sys.stderr)
    try:
        from turbojpeg import TJPF_RGB, TurboJPEG

        tj = TurboJPEG()
        out["pyturbojpeg"] = lambda d: tj.decode(d, TJPF_RGB)
        out[f"pyturbojpeg scaled {half}"] = lambda d: tj.decode(d, TJPF_RGB, (1, 2))
    except (ImportError, RuntimeError, OSError) as exc:
        print(f"pyturbojpeg: {exc}", file=sys.stderr)
    return out


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and process-CPU seconds of ``fn()``."""
    c, t = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def main() -> None:
    from bench.workloads import _jpegs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--size", type=int, default=256)
    args = p.parse_args()
    pool = _jpegs(args.size, args.size)
    jpegs = [pool[i % len(pool)] for i in range(args.n)]
    half = args.size // 2
    reference = [pillow(d) for d in pool]
    reference_half = [pillow_draft(half)(d) for d in pool]
    threads = ThreadPoolExecutor(2)
    print(
        f"{args.n} JPEGs {args.size}x{args.size} q90, mean {np.mean([len(d) for d in pool]):.0f} B"
    )
    print(
        "| decoder | µs/img 1 thread (wall) | CPU µs/img | img/s 1 thread | img/s 2 threads"
        " | 2T/1T | max diff vs Pillow |"
    )
    print("|---|---|---|---|---|---|---|")
    fns = decoders(half)
    one: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    two: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeat):  # rounds interleave the decoders: load drifts alike for all
        for name, fn in fns.items():
            one[name].append(timed(lambda fn=fn: [fn(d) for d in jpegs]))
            two[name].append(timed(lambda fn=fn: list(threads.map(fn, jpegs)))[0])
    n = args.n
    for name, fn in fns.items():
        ref = reference_half if "draft" in name or "scaled" in name else reference
        outs = [fn(d) for d in pool]
        same = all(o.shape == r.shape for o, r in zip(outs, ref, strict=True))
        diff = (
            max(int(np.abs(o.astype(np.int16) - r).max()) for o, r in zip(outs, ref, strict=True))
            if same
            else "shape differs"
        )
        wall, cpu = min(one[name])
        best_two = min(two[name])
        print(
            f"| {name} | {wall / n * 1e6:.0f} | {min(c for _, c in one[name]) / n * 1e6:.0f} "
            f"| {n / wall:,.0f} | {n / best_two:,.0f} | {wall / best_two:.2f} | {diff} |"
        )
    threads.shutdown()


if __name__ == "__main__":
    main()
