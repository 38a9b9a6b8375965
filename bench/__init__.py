"""The benchmark suite: ``python bench/run.py`` (``make bench``; see docs/benchmarks.md).

One-off measurements behind the numbers in docs/ live in ``bench/experiments/``.
"""
