"""What ``build-shards`` prints: the progress bar, the summary of a finished build, and an
error as one line that names the command's flags."""

from __future__ import annotations

import re
from typing import Any

from wdsloader.progress import progress_bar
from wdsloader.redact import redact

SUGGEST_RATIO = 4.0
"""Shard bytes per input byte above which ``build`` prints the small-record options."""

# the library's keyword arguments that errors name (``name=value``, or an option object's field
# as ``name=Options(field=value)``), and this command's flags for them; a ``name=value`` entry
# maps that value alone
FLAGS = {
    "samples=SampleOptions(allow_nan=True)": "--allow-nan",
    "lock=LockOptions(break_lock=True)": "--force-unlock",
    "allow_nan": "--allow-nan",
    "overwrite": "--overwrite",
    "break_lock": "--force-unlock",
    "lock_timeout": "--lock-timeout",
    "bos_id": "--bos-id",
    "eos_id": "--eos-id",
    "add_special_tokens=False": "--no-separators",
}


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


class Progress:
    """A tqdm bar fed by ``progress(done, total)`` callbacks; hidden when stderr is not a
    terminal (so errors stay one line in logs and tests)."""

    def __init__(self, unit: str, enabled: bool) -> None:
        self._bar = progress_bar(unit=unit, unit_scale=True, enabled=enabled)

    def __call__(self, done: int, total: int | None = None) -> None:
        bar = self._bar
        if total and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def close(self) -> None:
        self._bar.close()


def format_summary(manifest: Any, where: str, elapsed: float, verb: str = "built") -> str:
    """A table of shards, samples and bytes per split, a total, the time and the rates."""
    rows = [
        (name, len(s.shards), s.num_samples, s.num_bytes) for name, s in manifest.splits.items()
    ]
    total = (
        "total",
        sum(r[1] for r in rows),
        sum(r[2] for r in rows),
        sum(r[3] for r in rows),
    )
    width = max(5, *(len(r[0]) for r in rows))
    lines = [f"{'split':<{width}}  {'shards':>7}  {'samples':>12}  {'bytes':>10}"]
    for name, shards, samples, nbytes in [*rows, total]:
        lines.append(f"{name:<{width}}  {shards:>7,}  {samples:>12,}  {_human_bytes(nbytes):>10}")
    lines.insert(-1, "-" * len(lines[0]))
    rate = total[2] / elapsed if elapsed > 0 else float("inf")
    mbps = total[3] / elapsed / 1e6 if elapsed > 0 else float("inf")
    shown = redact(where)
    lines.append(f"{verb} {shown} in {elapsed:.2f} s ({rate:,.0f} samples/s, {mbps:.1f} MB/s)")
    return "\n".join(lines)


def small_records_hint(
    manifest: Any, input_bytes: int | None, grouped: bool, compressed: bool
) -> str | None:
    """One line when the shards take over :data:`SUGGEST_RATIO` times the input's bytes (small
    fields: each is a tar member of at least 1,024 bytes) and an option would shrink them."""
    flags = [
        f
        for f, used in (("--group-small-fields", grouped), ("--compression gzip", compressed))
        if not used
    ]
    if not input_bytes or not flags or manifest.num_bytes <= SUGGEST_RATIO * input_bytes:
        return None
    return (
        f"hint: the shards take {manifest.num_bytes / input_bytes:.0f}x the input's bytes "
        f"({_human_bytes(manifest.num_bytes)} for {_human_bytes(input_bytes)}): each small field "
        f"is a tar member of at least 1,024 bytes (a 512-byte header, the data padded to 512); "
        f"{' '.join(flags)} make{'s' if len(flags) == 1 else ''} such shards much smaller"
    )


def describe_error(exc: BaseException) -> str:
    """One line: the error (an OSError's file and reason), its notes, in the command's flags."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    text = "; ".join([text, *getattr(exc, "__notes__", ())])
    return _as_flags(text, getattr(exc, "options", ()))


def _as_flags(text: str, options: tuple[str, ...]) -> str:
    """``text`` with each ``name=value`` of the keyword arguments ``options`` in flag form:
    ``--flag`` for True (or a bare ``name=``), ``--flag VALUE`` for other values."""
    for option, flag in FLAGS.items():
        if "(" in option:  # an option object's field: replaced whole
            text = text.replace(option, flag)
    for name in options:
        text = re.sub(rf"\b{re.escape(name)}=([^\s,;)]*)", _as_flag, text)
    return text


def _as_flag(m: re.Match[str]) -> str:
    name, value = m.group(0).split("=", 1)
    if m.group(0) in FLAGS:
        return FLAGS[m.group(0)]
    flag = FLAGS.get(name)
    if flag is None:
        return m.group(0)
    return flag if value in ("", "True") else f"{flag} {value}"
