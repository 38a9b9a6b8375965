"""The on-disk format contract shared by ``build_shards`` (writes) and ``wdsloader`` (reads)."""

import wdsloader.format.builtin_codecs  # noqa: F401 - registers the pure codecs
from wdsloader.format.codecs import (
    Codec,
    FunctionCodec,
    UnknownEncodingError,
    get_codec,
    register_codec,
    registered_encodings,
    unregister_codec,
)
from wdsloader.format.deflate import COMPRESSIONS, ShardDeflater, inflate_sample
from wdsloader.format.groups import GROUP_EXT
from wdsloader.format.index import (
    INDEX_SUFFIX,
    decode_index,
    encode_index,
    index_path,
    iter_samples,
    scan_tar,
)
from wdsloader.format.keys import (
    field_of_ext,
    member_ext,
    split_name,
    validate_field,
    validate_key,
)
from wdsloader.format.manifest import (
    FORMAT_NAME,
    FieldSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
)
from wdsloader.format.members import Member, iter_members
from wdsloader.format.npy import read_npy_header
from wdsloader.format.ustar import BLOCK, END_OF_ARCHIVE, padded
from wdsloader.format.version import FORMAT_VERSION, MANIFEST_NAME, check_version
from wdsloader.format.writer import TarStreamWriter, encode_header, encode_member

__all__ = [
    "BLOCK",
    "Codec",
    "FunctionCodec",
    "UnknownEncodingError",
    "get_codec",
    "register_codec",
    "registered_encodings",
    "unregister_codec",
    "COMPRESSIONS",
    "GROUP_EXT",
    "END_OF_ARCHIVE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_SUFFIX",
    "MANIFEST_NAME",
    "FieldSpec",
    "Manifest",
    "Member",
    "TarStreamWriter",
    "ShardInfo",
    "ShardDeflater",
    "SplitInfo",
    "check_version",
    "decode_index",
    "encode_header",
    "encode_index",
    "encode_member",
    "field_of_ext",
    "index_path",
    "inflate_sample",
    "iter_members",
    "iter_samples",
    "member_ext",
    "padded",
    "read_npy_header",
    "scan_tar",
    "split_name",
    "validate_field",
    "validate_key",
]
