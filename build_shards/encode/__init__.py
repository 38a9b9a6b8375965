"""Encode: the build schema and how each field of a sample becomes tar member bytes."""
