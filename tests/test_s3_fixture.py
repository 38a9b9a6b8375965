"""The loopback S3 endpoint round-trips a dataset written through the format layer."""

from tests.dataset_factory import write_dataset
from wdsloader.format import Manifest


def test_manifest_round_trip_on_s3(s3_bucket):
    url, options = s3_bucket
    m = write_dataset(f"{url}/ds", {"train": [3, 2]}, storage_options=options)
    loaded = Manifest.load(f"{url}/ds", storage_options=options)
    assert loaded.to_dict() == m.to_dict()
