"""Bytes to values: the decoder registry and codecs, the sample parser, whole-batch gathering."""

from wdsloader.decode.codecs import (
    IMAGE_ENCODINGS,
    PICKLE_ENCODINGS,
    Decoder,
    SampleDecoder,
    decode_bytes,
    decode_image,
    decode_int,
    decode_json,
    decode_npy,
    decode_npz,
    decode_pickle_refused,
    decode_pt,
    decode_text,
    get_decoder,
    parse_sample,
    register_decoder,
)
from wdsloader.decode.gather import FieldTable, field_tables, gather_rows, sample_keys

__all__ = [
    "IMAGE_ENCODINGS",
    "PICKLE_ENCODINGS",
    "Decoder",
    "FieldTable",
    "SampleDecoder",
    "decode_bytes",
    "decode_image",
    "decode_int",
    "decode_json",
    "decode_npy",
    "decode_npz",
    "decode_pickle_refused",
    "decode_pt",
    "decode_text",
    "field_tables",
    "gather_rows",
    "get_decoder",
    "parse_sample",
    "register_decoder",
    "sample_keys",
]
