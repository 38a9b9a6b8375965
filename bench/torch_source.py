"""The generated workloads as a torch map-style Dataset (the source ``build_shards`` reads).

A module of its own so that ``build_shards``' spawned workers can unpickle it by reference.
"""

from __future__ import annotations

import torch.utils.data

from bench.workloads import GeneratedDataset


class GeneratedTorchDataset(GeneratedDataset, torch.utils.data.Dataset):
    """:class:`bench.workloads.GeneratedDataset` seen by ``build_shards`` as a torch Dataset."""
