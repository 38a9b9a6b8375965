"""Checks: batch rules against the manifest's schema, and the whole-dataset check."""

from wdsloader.validate.batch import BatchValidationError, validate_batch, validate_first_batch
from wdsloader.validate.dataset_check import ValidationReport, validate_dataset

__all__ = [
    "BatchValidationError",
    "ValidationReport",
    "validate_batch",
    "validate_dataset",
    "validate_first_batch",
]
