"""The ``build-shards`` command line: ``build``, ``text`` and ``adopt``."""

from build_shards.cli.main import main

__all__ = ["main"]
