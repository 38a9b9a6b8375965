"""The benchmark suite: ``python bench/run.py`` (see bench/README section in the top README)."""
