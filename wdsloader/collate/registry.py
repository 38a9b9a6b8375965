"""``CollatorRegistry``: the one registry of collators, keyed by name and modality.

A collator is made by a *factory* ``(task_spec=None, **options) -> collate`` where
``collate(samples) -> batch``. :meth:`CollatorRegistry.get_collator` picks one by name, or by
the task's modality (the one registered first for it), and never falls back silently: an
unknown name or a modality nothing serves is a ValueError listing what exists.

Collate functions run inside DataLoader workers, which receive them by pickle under the
``spawn``/``forkserver`` start methods: a factory should return an instance of a module-level
class (as the built-ins do) or a module-level function, never a closure or lambda.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from wdsloader.collate.batch import CollateFn
from wdsloader.collate.causal_lm import CausalLMCollator
from wdsloader.collate.default import DefaultCollator
from wdsloader.collate.packed import PackedCollator
from wdsloader.collate.text import TextCollator
from wdsloader.collate.vision import VisionCollator

if TYPE_CHECKING:
    from wdsloader.collate.task import TaskSpec

Factory = Callable[..., CollateFn]
ANY = "any"  # the modality of collators used only by name (never picked for a task)

# name, modality, description, factory: the order is the order of modality lookup
BUILTINS: tuple[tuple[str, str, str, Factory], ...] = (
    (
        "default",
        ANY,
        "arrays, tensors and numbers stacked into tensors; strings and ragged values as lists",
        DefaultCollator,
    ),
    (
        "text",
        "text",
        "tokenize text or pad token ids to the longest: input_ids, attention_mask, labels "
        "(causal LM with -100 on padding, or masked LM with mlm=True)",
        TextCollator,
    ),
    (
        "vision",
        "vision",
        "images (arrays, tensors, PIL; HWC or CHW) -> normalised pixel_values, int64 labels",
        VisionCollator,
    ),
    (
        "causal_lm",
        "text",
        "pre-packed token chunks: input_ids = tokens[:-1], labels = tokens[1:], optional padding",
        CausalLMCollator,
    ),
    (
        "packed",
        ANY,
        "documents packed into rows of max_tokens: input_ids, position_ids restarting per "
        "document, document_ids, cu_seqlens, labels with -100 across document boundaries",
        PackedCollator,
    ),
)


@dataclass(frozen=True)
class CollatorInfo:
    """One registered collator: its name, factory, modality and description."""

    name: str
    factory: Factory
    modality: str
    description: str


def _accepts_task_spec(factory: Factory) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell, trust it
        return True
    return any(p.name == "task_spec" or p.kind is p.VAR_KEYWORD for p in params)


class CollatorRegistry:
    """Collator factories by name, each serving a modality (``"any"``: only by name).

    ``CollatorRegistry.get_instance()`` is the process-wide registry that
    ``create_loader(collate_fn="name")`` and the training API use; ``CollatorRegistry()`` makes
    an independent one (with the built-ins unless ``builtins=False``). Built-ins, in lookup
    order: ``default`` (any), ``text`` (text), ``vision`` (vision), ``causal_lm`` (text),
    ``packed`` (any: by name only).
    """

    _instance: ClassVar[CollatorRegistry | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, builtins: bool = True) -> None:
        self._collators: dict[str, CollatorInfo] = {}
        if builtins:
            self._add_builtins()

    def _add_builtins(self) -> None:
        for name, modality, description, factory in BUILTINS:
            self.register(name, modality=modality, description=description)(factory)

    @classmethod
    def get_instance(cls) -> CollatorRegistry:
        """The process-wide registry (made with the built-ins on first use)."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @classmethod
    def reset(cls) -> CollatorRegistry:
        """Put the process-wide registry back to the built-ins only (for tests); returns it."""
        registry = cls.get_instance()
        registry._collators.clear()
        registry._add_builtins()
        return registry

    def register(
        self, name: str, modality: str = ANY, description: str = "", *, replace: bool = False
    ) -> Callable[[Factory], Factory]:
        """Decorator registering a collator factory under ``name`` for ``modality``.

        The factory takes ``task_spec=`` (None, or the :class:`TaskSpec` it serves) and keyword
        options, and returns ``collate(samples) -> batch``, a picklable callable (see the module
        docstring). A name already registered is a ValueError unless ``replace=True``; a factory
        that cannot take ``task_spec`` is a TypeError.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"collator name must be a non-empty string, got {name!r}")
        if not isinstance(modality, str) or not modality:
            raise ValueError(f"modality must be a non-empty string, got {modality!r}")

        def decorate(factory: Factory) -> Factory:
            if not callable(factory):
                raise TypeError(f"collator factory for {name!r} must be callable, got {factory!r}")
            if not _accepts_task_spec(factory):
                raise TypeError(
                    f"collator factory for {name!r} must accept task_spec= (the TaskSpec it "
                    "serves, or None)"
                )
            if name in self._collators and not replace:
                raise ValueError(
                    f"a collator named {name!r} is already registered; pass replace=True to "
                    "override it"
                )
            self._collators[name] = CollatorInfo(name, factory, modality, description)
            return factory

        return decorate

    def list_collators(self) -> list[CollatorInfo]:
        """Every registered collator, in registration order."""
        return list(self._collators.values())

    def _listing(self) -> str:
        return ", ".join(f"{i.name} ({i.modality})" for i in self._collators.values())

    def get_collator(
        self,
        task_spec: TaskSpec | None = None,
        collator_name: str | None = None,
        **kwargs: Any,
    ) -> CollateFn:
        """A collate function: ``collator_name``'s, else the first registered for
        ``task_spec.modality``; its factory gets ``kwargs`` and, when given, ``task_spec=``.

        An unknown name, a modality no collator serves, or neither argument is a ValueError
        listing the registered collators; ``default`` is used only when named.
        """
        if collator_name is not None:
            info = self._collators.get(collator_name)
            if info is None:
                raise ValueError(
                    f"unknown collator {collator_name!r}; registered: {self._listing()}"
                )
        elif task_spec is not None:
            modality = task_spec.modality
            serving = (i for i in self._collators.values() if i.modality == modality != ANY)
            info = next(serving, None)
            if info is None:
                raise ValueError(
                    f"no collator registered for modality {modality!r} (task "
                    f"{task_spec.name!r}); registered: {self._listing()}; register one or pass "
                    "collator_name= (e.g. 'default')"
                )
        else:
            raise ValueError(
                f"get_collator needs a task_spec or a collator_name; registered: {self._listing()}"
            )
        if task_spec is not None:
            kwargs["task_spec"] = task_spec
        collate = info.factory(**kwargs)
        if not callable(collate):
            raise TypeError(
                f"collator factory {info.name!r} returned {type(collate).__name__}, not a callable"
            )
        return collate

    def accepts(self, name: str, option: str) -> bool:
        """Whether collator ``name``'s factory names the keyword ``option`` among its
        parameters (a factory taking only ``**kwargs`` does not: it may pass them on to
        something that refuses them). False for an unknown name."""
        info = self._collators.get(name)
        if info is None:
            return False
        try:
            params = inspect.signature(info.factory).parameters
        except (TypeError, ValueError):  # a builtin without a signature: cannot tell
            return False
        param = params.get(option)
        return param is not None and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)

    def __contains__(self, name: object) -> bool:
        return name in self._collators

    def __repr__(self) -> str:
        return f"CollatorRegistry({self._listing()})"
