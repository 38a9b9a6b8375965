"""Credentials out of messages: every URL, option dict or storage error text that reaches an
error, a log line, a ``repr`` or a printed summary goes through :func:`redact` first.

What is hidden: the userinfo of URLs (``https://user:pass@host`` -> ``https://***@host``),
query parameters that carry signatures or tokens (``X-Amz-Signature``, ``X-Amz-Credential``,
``X-Amz-Security-Token``, ``sig``, ``signature``, ``token``, ``key``, ... any name containing
sig, token, key, secret, password, credential or auth), authorization-like headers written as
``Authorization: ...`` or ``'Authorization': '...'``, secret-looking keyword values
(``secret='...'``, ``token=...``) and, literally, any secret string passed in (e.g. the values
:func:`secrets_of` finds in fsspec storage options).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary words

# scheme://userinfo@ : everything between "//" and the last "@" before the host's end
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s'\"<>@]*(?:@[^/?#\s'\"<>@]*)*@"
)
_SECRET_NAME = r"[\w.\-]*(?:sig|token|key|secret|passw|pwd|credential|auth|policy)[\w.\-]*"
# ?name=value or &name=value in a query string
_QUERY = re.compile(rf"(?i)(?P<lead>[?&;]{_SECRET_NAME}=)[^&#\s'\"<>]*")
# header or keyword forms: Authorization: x, 'X-Api-Key': 'x', secret='x', token=x
_HEADER = re.compile(
    r"(?i)(?P<lead>\b(?:proxy-)?authorization|\bcookie|\bset-cookie|\bx-[\w\-]*(?:key|token|auth)"
    r"[\w\-]*)(?P<sep>['\"]?\s*:\s*)(?P<q>['\"]?)[^'\"\r\n,}]*"
)
_KEYWORD = re.compile(
    r"(?i)(?P<lead>\b(?:\w*(?:secret|token|password|passwd|credentials?)\w*|"
    r"aws_access_key_id|api_?key|account_key|private_key|sas_token))"
    r"(?P<sep>\s*=\s*|['\"]\s*:\s*)(?P<q>['\"]?)[^'\"\s,}&)]*"
)
# 'key': 'value' in a printed dict (a bare key=value is too common in ordinary messages)
_QUOTED_KEY = re.compile(
    r"(?P<lead>['\"](?:key|username|user|login)['\"]\s*:\s*)(?P<q>['\"])[^'\"]*"
)
# option names whose values are secrets (fsspec/s3fs/gcsfs/adlfs spellings), compared lower-case
_SECRET_OPTIONS = re.compile(
    r"(?i)^(?:key|secret|token|password|passwd|pwd|auth|session_token|"
    r"aws_\w+|account_key|sas_token|connection_string|credential|credentials|client_secret|"
    r"api_key|apikey|private_key|(?:proxy-)?authorization|cookie|x-[\w\-]*(?:key|token|auth)[\w\-]*"
    r"|[\w\-]*(?:secret|token|password)[\w\-]*)$"
)


def redact(text: object, secrets: Iterable[str] = ()) -> str:
    """``str(text)`` with credentials replaced by ``***`` (see the module docstring).

    ``secrets`` are strings masked wherever they appear (those shorter than 4 characters are
    ignored: they would mask ordinary words).
    """
    out = str(text)
    for value in sorted({s for s in secrets if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True):
        out = out.replace(value, MASK)
    out = _USERINFO.sub(rf"\g<scheme>{MASK}@", out)
    out = _QUERY.sub(rf"\g<lead>{MASK}", out)
    out = _HEADER.sub(rf"\g<lead>\g<sep>\g<q>{MASK}", out)
    out = _QUOTED_KEY.sub(rf"\g<lead>\g<q>{MASK}", out)
    return _KEYWORD.sub(rf"\g<lead>\g<sep>\g<q>{MASK}", out)


def redact_options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A copy of fsspec storage options safe to show: secret values (``key``, ``secret``,
    ``token``, ``password``, ``Authorization`` headers ...) become ``***``, URLs are redacted."""
    if options is None:
        return None
    return {str(k): _redact_value(k, v) for k, v in options.items()}


def secrets_of(options: Mapping[str, Any] | None, *urls: str) -> tuple[str, ...]:
    """The secret strings in storage options (values of secret-named options and headers, at
    any depth) and in the userinfo of ``urls``, for :func:`redact`'s ``secrets``."""
    found: list[str] = []
    _collect(options or {}, found)
    for url in urls:
        m = re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://([^/?#]*)@", url)
        if m:
            userinfo = m.group(1)
            found += [userinfo, *userinfo.split(":", 1)[1:]]
    return tuple(dict.fromkeys(s for s in found if len(s) >= _MIN_SECRET_LEN))


def _redact_value(name: object, value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _redact_value(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value(name, v) for v in value)
    if _SECRET_OPTIONS.match(str(name)) and value is not None and not isinstance(value, bool):
        return MASK
    return redact(value) if isinstance(value, str) else value


def _collect(value: Any, found: list[str], name: object = "") -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _collect(v, found, k)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, found, name)
    elif isinstance(value, str) and _SECRET_OPTIONS.match(str(name)):
        found.append(value)
        if " " in value:  # "Bearer abc": the credential alone may be echoed too
            found.append(value.split(" ", 1)[1])


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record it passes (URL userinfo, signed query strings,
    authorization headers): attach it to a handler to clean other libraries' lines too, e.g.
    fsspec's and botocore's DEBUG lines, which show URLs and signed request headers."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        shown = redact(text)
        if shown != text:
            record.msg, record.args = shown, None
        return True
