"""Text for language models: read documents, tokenize them, pack the token stream into chunks.

The pipeline is ``iter_documents`` (JSONL or plain text) -> ``pack_tokens`` (one token stream with
separators between documents, cut into chunks of ``seq_length + 1`` tokens) -> ``build_shards``
(one ``tokens.npy`` member per sample). A chunk of ``seq_length + 1`` tokens gives a causal LM
``seq_length`` inputs and their ``seq_length`` next-token labels (``loader_defaults`` names the
``causal_lm`` collator, which does the shift).

Document separators (the rule, in order):

1. ``bos_id`` / ``eos_id`` given explicitly are used as given (one or both).
2. A ``transformers`` tokenizer: its ``bos_token_id`` and ``eos_token_id``; when it declares
   neither, its ``cls_token_id`` (as BOS) and ``sep_token_id`` (as EOS).
3. A ``tokenizers.Tokenizer`` (which has no token roles): its *special* added tokens with a
   well-known name: BOS from ``<|begin_of_text|>``, ``<|startoftext|>``, ``<s>``, ``[BOS]``,
   ``<bos>``; EOS from ``<|end_of_text|>``, ``<|endoftext|>``, ``</s>``, ``[EOS]``, ``<eos>``;
   ``[CLS]``/``[SEP]`` only when none of those exist.
4. None found -> ``ValueError`` (pass ``bos_id=``/``eos_id=``).

Each document becomes ``[BOS] + ids + [EOS]`` with whichever of the two exists; when BOS and EOS
are the same token (GPT-2's ``<|endoftext|>``) only the EOS follows each document. Documents
are always encoded with ``add_special_tokens=False``, so the tokenizer's own template never
doubles the separators; ``pack_tokens(..., add_special_tokens=False)`` concatenates bare
documents (no separators at all).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from build_shards.errors import BuildError, naming_options
from wdsloader.format import FieldSpec, Manifest

logger = logging.getLogger(__name__)

PathArg = str | os.PathLike[str]
Paths = PathArg | Iterable[PathArg]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "[BOS]", "<bos>")
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "[EOS]", "<eos>")
_ENCODE_BATCH = 256


# -- documents -----------------------------------------------------------------------------------
def _format_of(path: str) -> str:
    from fsspec.utils import infer_compression

    name = path.lower()
    compression = infer_compression(name)
    if compression:
        name = name.rsplit(".", 1)[0]
    return "jsonl" if name.endswith(JSONL_SUFFIXES) else "text"


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of a file read as UTF-8 (a bad byte names file:line)."""
    import fsspec

    with fsspec.open(path, "rb", compression="infer") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BuildError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from None


def _jsonl_documents(path: str, text_field: str) -> Iterator[str]:
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BuildError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise BuildError(
                f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
            )
        if text_field not in record:
            raise BuildError(
                f"{path}:{lineno}: no field {text_field!r} (fields: {sorted(record)[:10]})"
            )
        value = record[text_field]
        if not isinstance(value, str):
            raise BuildError(
                f"{path}:{lineno}: field {text_field!r} is {type(value).__name__}, not a string"
            )
        yield value


def _text_documents(path: str) -> Iterator[str]:
    lines: list[str] = []
    for _, line in _lines(path):
        if line.strip():
            lines.append(line)
            continue
        doc = "".join(lines).strip()
        lines = []
        if doc:
            yield doc
    doc = "".join(lines).strip()
    if doc:
        yield doc


def iter_documents(paths: Paths, *, text_field: str = "text") -> Iterator[str]:
    """The documents of JSONL or plain text files, in order.

    ``paths``: a path, glob or fsspec URL, or a list of them (globs expand sorted). Files ending
    in ``.jsonl``/``.json``/``.ndjson`` (optionally compressed, e.g. ``.jsonl.gz``) are JSONL: one
    object per line, the document is its ``text_field`` (blank lines are skipped; a bad line or
    a missing field raises :class:`BuildError` naming ``file:line``). Other files are plain
    text: documents are separated by blank (or whitespace-only) lines, stripped, empty ones
    dropped. Missing inputs raise :class:`BuildError` before anything is read.
    """
    from build_shards.sources import resolve_files

    for path in resolve_files(paths):
        if _format_of(path) == "jsonl":
            yield from _jsonl_documents(path, text_field)
        else:
            yield from _text_documents(path)


# -- tokenizers ----------------------------------------------------------------------------------
def _is_tokenizers_lib(tokenizer: Any) -> bool:
    return hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size")


def load_tokenizer(path: PathArg) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file (nothing is downloaded)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tokenizing text needs `tokenizers` (pip install wdsloader[text])"
        ) from exc
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such tokenizer file")
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises a bare Exception for a bad file
        raise BuildError(f"{path}: not a tokenizers tokenizer.json ({exc})") from None


def vocab_size(tokenizer: Any) -> int | None:
    """Number of token ids the tokenizer can produce (added tokens included), if it says."""
    if _is_tokenizers_lib(tokenizer):
        return int(tokenizer.get_vocab_size(with_added_tokens=True))
    if hasattr(tokenizer, "__len__"):
        return len(tokenizer)
    size = getattr(tokenizer, "vocab_size", None)
    return int(size) if size is not None else None


def document_separators(
    tokenizer: Any, *, bos_id: int | None = None, eos_id: int | None = None
) -> tuple[int | None, int | None]:
    """``(bos, eos)`` ids put around each document, by the rule in this module's docstring.

    Raises ``ValueError`` when neither is given nor defined by the tokenizer.
    """
    if bos_id is not None or eos_id is not None:
        return bos_id, eos_id
    bos: int | None = None
    eos: int | None = None
    if _is_tokenizers_lib(tokenizer):
        special = {
            tok.content: tid
            for tid, tok in tokenizer.get_added_tokens_decoder().items()
            if getattr(tok, "special", True)
        }
        bos = next((special[n] for n in _BOS_NAMES if n in special), None)
        eos = next((special[n] for n in _EOS_NAMES if n in special), None)
        if bos is None and eos is None:
            bos, eos = special.get("[CLS]"), special.get("[SEP]")
    else:
        bos = getattr(tokenizer, "bos_token_id", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        if bos is None and eos is None:
            bos = getattr(tokenizer, "cls_token_id", None)
            eos = getattr(tokenizer, "sep_token_id", None)
    if bos is None and eos is None:
        raise naming_options(
            ValueError(
                "the tokenizer defines no BOS/EOS/SEP token to separate documents; pass bos_id= "
                "and/or eos_id=, or add_special_tokens=False to concatenate documents without "
                "separators"
            ),
            "bos_id",
            "eos_id",
            "add_special_tokens",
        )
    return bos, eos


def _encode_batch(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without the tokenizer's own special tokens."""
    if _is_tokenizers_lib(tokenizer):
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    if callable(tokenizer):  # transformers
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])
    out = []
    for text in texts:
        enc = tokenizer.encode(text)
        out.append(list(getattr(enc, "ids", enc)))
    return out


def token_dtype(size: int | None) -> np.dtype:
    """The dtype chunks are stored in: uint16 when every id fits (ids < 65536), else uint32."""
    if size is not None and size <= 2**16:
        return np.dtype("uint16")
    return np.dtype("uint32")


# -- packing -------------------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class PackStats:
    """What :func:`pack_tokens` consumed and produced (filled in while it runs)."""

    documents: int = 0
    tokens: int = 0
    chunks: int = 0
    dropped_tail_tokens: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    dtype: str = ""


def _check_lengths(seq_length: int, stride: int | None) -> int:
    if not isinstance(seq_length, int) or isinstance(seq_length, bool) or seq_length < 1:
        raise ValueError(f"seq_length must be a positive integer, got {seq_length!r}")
    stride = seq_length if stride is None else stride
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ValueError(f"stride must be a positive integer, got {stride!r}")
    return stride


def pack_tokens(
    documents: Iterable[str],
    tokenizer: Any,
    *,
    seq_length: int,
    stride: int | None = None,
    add_special_tokens: bool = True,
    dtype: Any = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    stats: PackStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples ``{"__key__": chunk index, "tokens": array of seq_length + 1 ids}``.

    Every document is tokenized (a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or
    any object whose ``.encode(text)`` returns ids or has ``.ids``), wrapped in the separators
    (see the module docstring) and appended to one stream. Chunk ``i`` is
    ``stream[i * stride : i * stride + seq_length + 1]``: with the default ``stride =
    seq_length`` consecutive chunks share exactly one token (the label of the last position);
    a smaller stride overlaps them more, a larger one skips tokens. The incomplete tail is
    dropped and logged with its token count. ``dtype`` defaults to :func:`token_dtype` of the
    vocabulary; an id that does not fit it raises ``ValueError``. ``stats``, if given, is
    updated as the stream is consumed.
    """
    stride = _check_lengths(seq_length, stride)
    stats = PackStats() if stats is None else stats
    if add_special_tokens:
        bos, eos = document_separators(tokenizer, bos_id=bos_id, eos_id=eos_id)
        if bos is not None and bos == eos:
            bos = None
    else:
        bos, eos = None, None
    size = vocab_size(tokenizer)
    out_dtype = np.dtype(dtype) if dtype is not None else token_dtype(size)
    if out_dtype.kind not in "iu":
        raise ValueError(f"dtype must be an integer type, got {out_dtype}")
    max_id = np.iinfo(out_dtype).max
    stats.bos_id, stats.eos_id, stats.dtype = bos, eos, out_dtype.name
    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    window = seq_length + 1

    buf = np.empty(0, dtype=out_dtype)
    pos = 0  # start of the next chunk, relative to buf (may lie beyond it when stride > window)
    consumed = 0  # stream offset of buf[0]
    last_end = 0  # stream offset just past the last emitted chunk
    it = iter(documents)
    while True:
        batch = list(itertools.islice(it, _ENCODE_BATCH))
        if not batch:
            break
        pieces = [head + ids + tail for ids in _encode_batch(tokenizer, batch)]
        n = sum(len(p) for p in pieces)
        stats.documents += len(batch)
        if n == 0:
            continue
        new = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=n)
        lo, hi = int(new.min()), int(new.max())
        if lo < 0 or hi > max_id:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} does not fit dtype {out_dtype.name}")
        new = new.astype(out_dtype)
        stats.tokens += n
        if pos >= len(buf):
            consumed += len(buf)
            pos -= len(buf)
            buf = new
        else:
            consumed += pos
            buf = np.concatenate([buf[pos:], new])
            pos = 0
        while pos + window <= len(buf):
            yield {"__key__": f"{stats.chunks:010d}", "tokens": buf[pos : pos + window].copy()}
            stats.chunks += 1
            last_end = consumed + pos + window
            pos += stride
    stats.dropped_tail_tokens = stats.tokens - last_end
    logger.info(
        "packed %d documents (%d tokens) into %d chunks of %d tokens; dropped the incomplete "
        "tail: %d tokens",
        stats.documents,
        stats.tokens,
        stats.chunks,
        window,
        stats.dropped_tail_tokens,
    )


# -- building ------------------------------------------------------------------------------------
def _tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"class": type(tokenizer).__name__, "vocab_size": vocab_size(tokenizer)}
    if _is_tokenizers_lib(tokenizer):
        info["sha256"] = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    name = getattr(tokenizer, "name_or_path", None)
    if name and not os.path.isabs(str(name)):
        info["name"] = str(name)
    return info


def build_text_shards(
    paths: Paths,
    output: PathArg,
    tokenizer: Any,
    *,
    seq_length: int,
    stride: int | None = None,
    text_field: str = "text",
    add_special_tokens: bool = True,
    bos_id: int | None = None,
    eos_id: int | None = None,
    dtype: Any = None,
    **build_options: Any,
) -> Manifest:
    """Tokenize JSONL/text files and write the packed chunks as shards (``tokens.npy`` each).

    ``tokenizer`` is a tokenizer object or the path of a ``tokenizer.json``. The schema is
    declared (``tokens``: npy, the token dtype, shape ``[seq_length + 1]``), the loader default
    collator is ``causal_lm``, and ``manifest.build["text"]`` records the packing (tokenizer,
    seq_length, stride, separators, documents, tokens, chunks, dropped tail). Other keyword
    arguments go to :func:`build_shards.build_shards` (splits, shard sizes, workers, overwrite,
    storage_options, progress ...). No document or too few tokens for one chunk raises
    :class:`BuildError` before anything is written.
    """
    from build_shards.build import build_shards

    stride = _check_lengths(seq_length, stride)
    if not isinstance(paths, str | os.PathLike):
        paths = list(paths)
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = load_tokenizer(tokenizer)
    for reserved in ("schema", "source", "key_field"):
        if reserved in build_options:
            raise TypeError(f"build_text_shards sets {reserved!r} itself")
    stats = PackStats()
    documents = iter_documents(paths, text_field=text_field)
    chunks = pack_tokens(
        documents,
        tokenizer,
        seq_length=seq_length,
        stride=stride,
        add_special_tokens=add_special_tokens,
        dtype=dtype,
        bos_id=bos_id,
        eos_id=eos_id,
        stats=stats,
    )
    first = next(chunks, None)
    if first is None:
        if stats.documents == 0:
            raise BuildError(f"{_describe(paths)}: no documents found")
        raise BuildError(
            f"{_describe(paths)}: {stats.documents} documents hold {stats.tokens} tokens, "
            f"fewer than one chunk of seq_length + 1 = {seq_length + 1}"
        )
    schema = {
        "tokens": FieldSpec(
            ext="tokens.npy", encoding="npy", dtype=stats.dtype, shape=[seq_length + 1]
        )
    }
    loader_defaults = {"collate": "causal_lm", **dict(build_options.pop("loader_defaults", {}))}
    manifest = build_shards(
        itertools.chain([first], chunks),
        output,
        schema=schema,
        loader_defaults=loader_defaults,
        **build_options,
    )
    manifest.build["text"] = {
        "tokenizer": _tokenizer_info(tokenizer),
        "seq_length": seq_length,
        "stride": stride,
        "text_field": text_field,
        "add_special_tokens": add_special_tokens,
        **asdict(stats),
    }
    manifest.save(output, build_options.get("storage_options"))
    return manifest


def _describe(paths: Paths) -> str:
    if isinstance(paths, str | os.PathLike):
        return os.fspath(paths)
    items = [os.fspath(p) for p in paths]
    return items[0] if len(items) == 1 else f"{items[0]} (+{len(items) - 1} more)"
