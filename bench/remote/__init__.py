"""The remote mode of the benchmark: an S3 server on loopback behind a latency proxy."""
