"""A data module as Lightning's ``LightningDataModule`` (imports ``lightning``; load on demand).

Lightning 2.x's ``Trainer`` calls ``LightningDataModule`` hooks (``on_exception``,
``state_dict``, ...) on the object passed as ``datamodule=``, so a module that only has the
loader methods (:class:`~wdsloader.training.DataModuleProtocol`) is wrapped. Passing its loaders
directly (``trainer.fit(model, dm.train_dataloader(), dm.val_dataloader())``) works too.
"""

from __future__ import annotations

from typing import Any

import lightning

__all__ = ["LightningDataModuleAdapter", "as_lightning_datamodule"]


class LightningDataModuleAdapter(lightning.LightningDataModule):
    """Lightning hooks around ``module``'s ``train_dataloader``/``val_dataloader`` (and
    ``test_dataloader`` when it has one); a missing loader (None) becomes no loader (``[]``)."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def train_dataloader(self) -> Any:
        return self.module.train_dataloader()

    def val_dataloader(self) -> Any:
        loader = self.module.val_dataloader()
        return [] if loader is None else loader

    def test_dataloader(self) -> Any:
        method = getattr(self.module, "test_dataloader", None)
        loader = method() if callable(method) else None
        return [] if loader is None else loader


def as_lightning_datamodule(module: Any) -> LightningDataModuleAdapter:
    """``module`` (any :class:`~wdsloader.training.DataModuleProtocol`) as a
    ``LightningDataModule`` for ``Trainer.fit(model, datamodule=...)``."""
    return LightningDataModuleAdapter(module)
