"""``python -m wdsloader.cli``: the ``wdsloader`` command."""

from wdsloader.cli.commands import main

if __name__ == "__main__":
    raise SystemExit(main())
