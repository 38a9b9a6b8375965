"""``create_dataloaders`` of the micro-transformer text pipeline: JSONL or plain text -> token
shards (once) -> our loader.

The text is tokenized and packed into ``seq_length + 1``-token chunks by the text builder
(:func:`build_shards.text.build_text_shards`), written as shards under ``cache_dir`` in a folder
named by a fingerprint of the input files' bytes, the tokenizer (its serialized vocabulary and
settings) and the options. A later call with the same inputs reads those shards and builds
nothing; a changed input, tokenizer or option builds a new folder. A folder's manifest records
the key it was built for (``build["text"]["cache"]``) and its packing options: one that does not
match the request (copied or moved under another name) is refused, naming the folder and what
differs, unless ``rebuild=True``. The shards are streamed by
:func:`wdsloader.create_loader` with the ``causal_lm`` collator (``input_ids``/``labels``
shifted by one, both ``(B, seq_length)``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wdsloader.stream.loader import WdsDataLoader

__all__ = ["EncodeIds", "create_dataloaders", "text_fingerprint", "tokenizer_fingerprint"]

log = logging.getLogger(__name__)

Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]

CACHE_VERSION = 2  # bump when the layout of the cached shards changes (2: the key recorded)
BUILD_WAIT_S = 3600.0  # how long to wait for another process building the same shards
BUILD_POLL_S = 0.5
PROBE_DOCUMENTS = 4  # documents of the input whose ids fingerprint a tokenizer of unknown kind


def _is_tokenizers_lib(tokenizer: Any) -> bool:
    return hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size")


def _is_transformers(tokenizer: Any) -> bool:
    module = sys.modules.get("transformers")
    base = getattr(module, "PreTrainedTokenizerBase", None) if module is not None else None
    return base is not None and isinstance(tokenizer, base)


def _ids_of(encoded: Any) -> list[int]:
    if isinstance(encoded, Mapping):
        if "input_ids" not in encoded:
            raise TypeError(
                f"tokenizer.encode returned a dict without 'input_ids' (keys: {sorted(encoded)})"
            )
        encoded = encoded["input_ids"]
    encoded = getattr(encoded, "ids", encoded)
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    ids = list(encoded)
    if ids and not all(isinstance(i, int) for i in ids):
        raise TypeError(f"tokenizer.encode must give a flat list of int ids, got {ids[:5]!r}")
    return ids


class EncodeIds:
    """Any object whose ``encode(text)`` returns ids, an object with ``.ids``, or a dict with
    ``input_ids`` (as some tokenizer wrappers' ``encode`` returns), as the text builder reads it:
    ``encode`` returns a list of ids. Its ids are used as they come (no separators are added
    unless ``bos_id`` / ``eos_id`` are given)."""

    def __init__(self, tokenizer: Any) -> None:
        if not callable(getattr(tokenizer, "encode", None)):
            raise TypeError(
                f"the tokenizer must be a tokenizers.Tokenizer, a transformers tokenizer or an "
                f"object with encode(text); got {type(tokenizer).__name__}"
            )
        self.tokenizer = tokenizer
        size = getattr(tokenizer, "get_vocab_size", None)
        self.vocab_size: int | None = (
            int(size()) if callable(size) else getattr(tokenizer, "vocab_size", None)
        )

    def encode(self, text: str) -> list[int]:
        return _ids_of(self.tokenizer.encode(text))


def tokenizer_fingerprint(tokenizer: Any, probes: Iterable[str] = ()) -> str:
    """A digest of what decides the tokens: the serialized tokenizer (``tokenizers`` JSON, a
    fast ``transformers`` tokenizer's backend JSON plus its special tokens), else the class,
    the vocabulary when it has ``get_vocab()``, and the ids it gives the ``probes`` texts."""
    parts: list[Any] = [type(tokenizer).__module__, type(tokenizer).__qualname__]
    if _is_tokenizers_lib(tokenizer):
        parts.append(tokenizer.to_str())
    elif _is_transformers(tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        parts.append(
            backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items())
        )
        parts.append(sorted((str(k), str(v)) for k, v in tokenizer.special_tokens_map.items()))
    else:
        inner = tokenizer.tokenizer if isinstance(tokenizer, EncodeIds) else tokenizer
        parts[:2] = [type(inner).__module__, type(inner).__qualname__]
        get_vocab = getattr(inner, "get_vocab", None)
        if callable(get_vocab):
            parts.append(sorted((str(k), int(v)) for k, v in get_vocab().items()))
        wrapped = tokenizer if isinstance(tokenizer, EncodeIds) else EncodeIds(tokenizer)
        parts.append([wrapped.encode(p) for p in probes])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _files_digest(path: Paths) -> list[tuple[str, str]]:
    import fsspec

    from build_shards.sources.files import resolve_files

    out = []
    for file in resolve_files(path):
        digest = hashlib.sha256()
        with fsspec.open(file, "rb") as f:
            while chunk := f.read(4 * 2**20):
                digest.update(chunk)
        out.append((os.path.basename(str(file)), digest.hexdigest()))
    return out


def _cache_record(path: Paths, tokenizer: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """What names a cache folder: the files' digests (in order), :func:`tokenizer_fingerprint`
    (probed with the first documents of ``path``), the options, and ``key``, their digest."""
    doc: dict[str, Any] = {
        "version": CACHE_VERSION,
        "files": _files_digest(path),
        "tokenizer": tokenizer_fingerprint(tokenizer, _first_documents(path, options)),
        "options": dict(sorted(options.items())),
    }
    doc["key"] = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return json.loads(json.dumps(doc))  # as the manifest gives it back (lists, not tuples)


def text_fingerprint(path: Paths, tokenizer: Any, options: Mapping[str, Any]) -> str:
    """The cache folder name of ``path`` tokenized by ``tokenizer`` with ``options``: a digest
    of the files' bytes (in order), :func:`tokenizer_fingerprint` (probed with the first
    documents of ``path``) and the options."""
    return str(_cache_record(path, tokenizer, options)["key"])[:24]


def _first_documents(path: Paths, options: Mapping[str, Any]) -> list[str]:
    from build_shards.text import iter_documents

    docs = iter_documents(path, text_field=options.get("text_field", "text"))
    return [doc for _, doc in zip(range(PROBE_DOCUMENTS), docs, strict=False)]


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wdsloader", "text")


def _prepare_tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, str | os.PathLike):
        from build_shards.text import load_tokenizer

        return load_tokenizer(tokenizer)
    if _is_tokenizers_lib(tokenizer) or _is_transformers(tokenizer):
        return tokenizer
    return EncodeIds(tokenizer)


def _mismatch(manifest: Any, record: Mapping[str, Any]) -> list[str]:
    """How a cache folder's manifest differs from the request ``record`` (empty: it matches)."""
    text = manifest.build.get("text")
    if not isinstance(text, Mapping):
        return ["its manifest has no text-packing record (build['text'])"]
    options = record["options"]
    seq = options["seq_length"]
    want = {"seq_length": seq, "stride": options["stride"] or seq}
    want["text_field"] = options["text_field"]
    out = [f"{k} {text.get(k)!r} (requested {v!r})" for k, v in want.items() if text.get(k) != v]
    pack = options.get("pack", "windows")
    if text.get("pack", "windows") != pack:
        out.append(f"pack {text.get('pack', 'windows')!r} (requested {pack!r})")
    spec = manifest.schema.get("tokens")
    shape = None if spec is None else spec.shape
    if pack == "windows" and shape != [seq + 1]:
        out.append(f"tokens shape {shape} (requested [{seq + 1}])")
    cache = text.get("cache")
    if not isinstance(cache, Mapping):
        return [*out, "no cache key recorded"]
    recorded = cache.get("options")
    had: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
    for k in sorted(set(options) - set(want)):
        if had.get(k) != options[k]:
            out.append(f"{k} {had.get(k)!r} (requested {options[k]!r})")
    if cache.get("tokenizer") != record["tokenizer"]:
        out.append(
            f"tokenizer digest {str(cache.get('tokenizer'))[:12]} "
            f"(requested {record['tokenizer'][:12]})"
        )
    if cache.get("files") != record["files"]:
        out.append(f"input files {cache.get('files')} (requested {record['files']})")
    if not out and cache.get("key") != record["key"]:
        out.append(f"cache key {cache.get('key')} (requested {record['key']})")
    return out


def _cached_shards(
    path: Paths,
    split: str,
    tokenizer: Any,
    cache_dir: str,
    options: dict[str, Any],
    rebuild: bool = False,
) -> str:
    """The folder of ``path``'s token shards (split ``split``), built unless cached (or always
    with ``rebuild``); a folder built for another request is a ManifestError naming it.

    When another process builds the same folder (DDP ranks sharing a cache), this one waits
    for that build's manifest (polling, up to ``BUILD_WAIT_S`` seconds) instead of building
    too.
    """
    from build_shards.commit.lock import OutputLockedError
    from build_shards.errors import BuildError, OutputExistsError
    from build_shards.text import build_text_shards
    from wdsloader.errors import ManifestError
    from wdsloader.io.manifest_io import load_manifest
    from wdsloader.io.storage import join, url_to_fs

    record = _cache_record(path, tokenizer, options)
    root = join(cache_dir, f"{split}-{str(record['key'])[:24]}")
    fs, manifest_path = url_to_fs(join(root, "manifest.json"))
    deadline, overwrite = time.monotonic() + BUILD_WAIT_S, rebuild
    while overwrite or not fs.exists(manifest_path):  # written last: the build finished
        try:
            log.info("%s: tokenizing into %s", path, root)
            build_text_shards(
                path, root, tokenizer, splits={split: 1.0}, overwrite=overwrite,
                record={"cache": record}, **options,
            )  # fmt: skip
            break
        except OutputExistsError:  # another process finished it since the check
            pass
        except OutputLockedError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{root}: another process has been building these token shards for more "
                    f"than {BUILD_WAIT_S:.0f} s; remove {join(root, '_build.lock')} if it died"
                ) from None
            overwrite = False  # another process is (re)building it: read what it builds
            log.info("%s: another process is building it; waiting", root)
            time.sleep(BUILD_POLL_S)
        except BuildError as exc:  # its advice names build_shards' option, not ours
            if "overwrite=True" not in str(exc):
                raise
            advice = "rebuild=True (create_dataloaders)"
            raise type(exc)(str(exc).replace("overwrite=True", advice)) from exc
        fs.invalidate_cache()
    different = _mismatch(load_manifest(root), record)
    if different:
        raise ManifestError(
            f"{root}: these cached token shards were not built for this request: "
            f"{'; '.join(different)} (a cache folder copied or moved under another name?); "
            "pass rebuild=True to create_dataloaders to rebuild it, or remove the folder"
        )
    log.info("%s: token shards in %s", path, root)
    return root


def create_dataloaders(
    train_path: Paths,
    val_path: Paths | None,
    tokenizer: Any,
    batch_size: int = 16,
    seq_length: int = 128,
    num_workers: int = 0,
    text_field: str = "text",
    stride: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    bos_id: int | None = None,
    eos_id: int | None = None,
    rebuild: bool = False,
    packing: str = "windows",
) -> tuple[WdsDataLoader, WdsDataLoader | None]:
    """``(train_loader, val_loader)`` of causal-LM batches ``{"input_ids", "labels",
    "attention_mask"}`` of shape ``(batch_size, seq_length)``, ``labels`` the inputs shifted by
    one (``input_ids[:, 1:] == labels[:, :-1]``).

    ``train_path``/``val_path`` (None: no validation loader): a file, glob or fsspec URL (or a
    list) of JSONL (``.jsonl``/``.json``/``.ndjson``: one object per line, ``text_field``
    required; an error names ``file:line``) or plain text (documents separated by blank
    lines). ``tokenizer``: a ``tokenizers.Tokenizer`` (or the path of its ``tokenizer.json``),
    a ``transformers`` tokenizer, or any object whose ``encode(text)`` returns ids, an object
    with ``.ids``, or a dict with ``input_ids`` (its ids are used as they come). Documents are
    joined with the tokenizer's BOS/EOS (see :mod:`build_shards.text`; ``bos_id``/``eos_id``
    override) and cut into windows of ``seq_length + 1`` tokens every ``stride`` (default
    ``seq_length``) tokens.

    Token shards are cached under ``cache_dir`` (default ``$XDG_CACHE_HOME/wdsloader/text``)
    by a fingerprint of the files' contents, the tokenizer and these options; a cached folder
    whose manifest records other packing options, tokenizer or files (a folder copied or moved
    under another name) is a :class:`~wdsloader.errors.ManifestError` naming the folder and what
    differs. ``rebuild=True`` builds the shards again even when cached, replacing the folder
    (each call rebuilds: with DDP pass it on one rank, e.g. rank 0 before a barrier, and not on
    the others). Train: shuffled
    by ``seed``, ``drop_last``; val: in order, the last partial batch kept. ``num_workers``
    processes load batches with the platform's default start method.

    ``packing="documents"`` (instead of the default fixed ``"windows"``) stores each document
    whole and packs documents into rows of ``seq_length`` tokens per batch, planned from their
    lengths (:class:`~wdsloader.Packing`; a document over ``seq_length`` is cut into pieces):
    batches ``{"input_ids", "labels", "position_ids", "document_ids", "attention_mask",
    "cu_seqlens", "max_seqlen"}`` of shape ``(batch_size, seq_length)``, positions restarting
    at each document, and ``labels`` unshifted as Hugging Face causal LMs take them (the model
    shifts) with -100 on each document's first token and on padding, so no token is
    predicted across a document boundary; mask attention with ``document_ids`` (block
    diagonal) or pass ``cu_seqlens`` to a varlen kernel. ``stride`` does not apply.
    """
    if packing not in ("windows", "documents"):
        raise ValueError(f'packing must be "windows" or "documents", got {packing!r}')
    if packing == "documents" and stride is not None:
        raise ValueError('stride cuts fixed windows: it does not apply to packing="documents"')
    if not isinstance(train_path, str | os.PathLike):
        train_path = list(train_path)  # read twice: fingerprint, then build
    if val_path is not None and not isinstance(val_path, str | os.PathLike):
        val_path = list(val_path)
    tok = _prepare_tokenizer(tokenizer)
    cache = os.fspath(cache_dir) if cache_dir is not None else _default_cache_dir()
    options: dict[str, Any] = {"seq_length": seq_length, "stride": stride, "text_field": text_field}
    if isinstance(tok, EncodeIds) and bos_id is None and eos_id is None:
        options["add_special_tokens"] = False  # its own encode decides the specials
    else:
        options.update(bos_id=bos_id, eos_id=eos_id)
    from wdsloader.plan.packing import Packing
    from wdsloader.stream.loader import create_loader
    from wdsloader.stream.options import WorkerOptions

    common: dict[str, Any] = {"num_workers": num_workers, "collate_fn": "causal_lm", "seed": seed}
    if packing == "documents":
        options["pack"] = packing
        common.update(collate_fn=None, packing=Packing(max_tokens=seq_length, field="input_ids"))
    if num_workers > 0:
        common["workers"] = WorkerOptions(persistent_workers=True)
    train_root = _cached_shards(train_path, "train", tok, cache, options, rebuild)
    train = create_loader(train_root, "train", batch_size, shuffle=True, drop_last=True, **common)
    if val_path is None:
        return train, None
    val_root = _cached_shards(val_path, "val", tok, cache, options, rebuild)
    val = create_loader(val_root, "val", batch_size, shuffle=False, drop_last=False, **common)
    return train, val
