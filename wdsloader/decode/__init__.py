"""Bytes to values: codecs and their registry, the sample parser, whole-batch gathering, and the
columnar and row decoders of a batch."""

from wdsloader.decode.codecs import (
    IMAGE_ENCODINGS,
    PICKLE_ENCODINGS,
    Decoder,
    decode_bytes,
    decode_image,
    decode_int,
    decode_json,
    decode_npy,
    decode_npz,
    decode_pickle_refused,
    decode_pt,
    decode_text,
)
from wdsloader.decode.gather import FieldTable, field_tables, gather_rows, sample_keys
from wdsloader.decode.parse import parse_sample
from wdsloader.decode.registry import SampleDecoder, get_decoder, register_decoder

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
