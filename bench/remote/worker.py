"""One remote read in a fresh process: bench/worker.py with the remote readers.

    python bench/remote/worker.py SPEC_JSON RESULT_PATH

The spec's ``cache_dir`` (an empty folder) becomes ``$WDS_BENCH_CACHE``, the local cache of
the systems that keep one; the rest is bench/worker.py's ``read`` task.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import systems, worker  # noqa: E402
from bench.remote import readers  # noqa: E402


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    os.environ["WDS_BENCH_CACHE"] = spec.get("cache_dir") or ""
    systems.READ.update(readers.READ)
    systems.IMPORTS["ours_cache"] = systems.IMPORTS["ours"]
    systems.IMPORTS["ours_obstore"] = systems.IMPORTS["ours"]
    return worker.main(argv)


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as bench/worker.py: read-ahead threads of a stopped read are not awaited
