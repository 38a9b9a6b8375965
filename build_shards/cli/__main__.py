"""``python -m build_shards.cli``: the ``build-shards`` command."""

from build_shards.cli.main import main

raise SystemExit(main())
