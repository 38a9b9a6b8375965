"""The registry of loader-level sampling strategies: name -> :class:`LoaderSampling`, the four
built-in ones registered on import, a user's with :func:`register_sampling_strategy`."""

from __future__ import annotations

import re

from wdsloader.mix.sampling.alternating import ALTERNATING
from wdsloader.mix.sampling.base import STRATEGY_OPTIONS, LoaderSampling
from wdsloader.mix.sampling.round_robin import ROUND_ROBIN
from wdsloader.mix.sampling.sequential import SEQUENTIAL
from wdsloader.mix.sampling.weighted import WEIGHTED

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_BUILTIN: dict[str, LoaderSampling] = {
    s.name: s for s in (SEQUENTIAL, ROUND_ROBIN, WEIGHTED, ALTERNATING)
}
_STRATEGIES: dict[str, LoaderSampling] = dict(_BUILTIN)


def register_sampling_strategy(strategy: LoaderSampling, *, replace: bool = False) -> None:
    """Make ``MultiDataLoaderConfig(sampling_strategy=strategy.name)`` use ``strategy``.

    A name already registered (a built-in one included) is a ValueError unless
    ``replace=True``; :func:`unregister_sampling_strategy` undoes it. Configs already made keep
    their name and use what is registered under it when they schedule.
    """
    if not isinstance(strategy, LoaderSampling):
        raise TypeError(
            "a sampling strategy needs name, label, options, configure, epoch_steps and "
            f"schedule (subclass wdsloader.mix.sampling.BaseSampling); got {strategy!r}"
        )
    name = strategy.name
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"sampling strategy name {name!r} must be lower-case letters, digits and '_'"
        )
    unknown = sorted(set(strategy.options) - set(STRATEGY_OPTIONS))
    if unknown:
        raise ValueError(
            f"sampling strategy {name!r}: options {unknown} are not config options "
            f"({', '.join(STRATEGY_OPTIONS)})"
        )
    if name in _STRATEGIES and not replace:
        raise ValueError(
            f"a sampling strategy named {name!r} is already registered; pass replace=True to "
            "override it"
        )
    _STRATEGIES[name] = strategy


def unregister_sampling_strategy(name: str) -> None:
    """Undo :func:`register_sampling_strategy`: a built-in name gets its built-in back."""
    if name in _BUILTIN:
        _STRATEGIES[name] = _BUILTIN[name]
    else:
        _STRATEGIES.pop(name, None)


def get_sampling_strategy(name: str) -> LoaderSampling:
    """The strategy registered under ``name``; a ValueError listing the registered ones."""
    strategy = _STRATEGIES.get(name)
    if strategy is None:
        raise ValueError(
            f"SamplingStrategy: unknown value {name!r}; valid: {', '.join(sampling_strategies())}"
        )
    return strategy


def sampling_strategies() -> list[str]:
    """The registered names: the built-in ones (as their enum names) first, then the others."""
    builtin = [s.label for s in _BUILTIN.values()]
    return builtin + sorted(n for n in _STRATEGIES if n not in _BUILTIN)


def strategy_users(option: str) -> list[str]:
    """The labels of the registered strategies that read ``option``."""
    return [s.label for s in _STRATEGIES.values() if option in s.options]
