"""Options as frozen dataclasses: :class:`DecodeOptions`, the options of greedy decoding,
and :class:`Options`, the base every options object of the package derives from.

An options object is built once, at a public function's front (its keyword arguments,
:meth:`Options.from_kwargs`), checked there, and handed whole to the layers below:
adding a decode option is one field here and its one use. Each object writes itself as
a flat JSON-able dict (:meth:`Options.settings`: the ``settings`` a run directory's
``meta.json`` records) and is read back from one (:meth:`Options.from_settings`).

This module imports neither torch nor TransformerLens, so the command line can read the
defaults before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, get_args

__all__ = ["ABLATION_MODES", "DECODE_ENGINES", "DEFAULT_PREFIX_BYTES", "PREFILL_MODES",
           "STOP_RULES", "AblationMode", "DecodeEngine", "DecodeOptions", "Options",
           "PrefillMode", "StopRule", "check_max_new_tokens", "check_mode", "check_stop_rule"]

StopRule = Literal["newline_token", "contains_newline", "none"]
STOP_RULES: tuple[str, ...] = get_args(StopRule)
PrefillMode = Literal["auto", "sdpa", "bridge"]
PREFILL_MODES: tuple[str, ...] = get_args(PrefillMode)
DecodeEngine = Literal["auto", "twin", "bridge"]
DECODE_ENGINES: tuple[str, ...] = get_args(DecodeEngine)
#: how :func:`locos_tl.engine.ablation.ablate` silences a head
AblationMode = Literal["query_mean", "query_zero", "output_mean", "output_zero"]
ABLATION_MODES: tuple[str, ...] = get_args(AblationMode)
#: default cap on the kept ``resid_pre`` of one prompt (bytes;
#: :func:`locos_tl.engine.prefix.prompt_prefix`)
DEFAULT_PREFIX_BYTES = 1 << 30

O = TypeVar("O", bound="Options")


def check_max_new_tokens(max_new_tokens: object) -> int:
    """The decoding budget, checked.

    Raises:
        ValueError: ``max_new_tokens`` is not an integer >= 1 (a bool is refused).
    """
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
            or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    return max_new_tokens


def check_mode(mode: str) -> AblationMode:
    """Validate an ablation mode name.

    Raises:
        ValueError: unknown mode; the message lists the known ones.
    """
    if mode not in ABLATION_MODES:
        raise ValueError(f"unknown ablation mode {mode!r}; use one of {list(ABLATION_MODES)}")
    return mode  # type: ignore[return-value]


def check_stop_rule(rule: str) -> StopRule:
    """Validate a stop rule name.

    Raises:
        ValueError: not one of :data:`STOP_RULES`.
    """
    if rule not in STOP_RULES:
        raise ValueError(f"unknown stop rule {rule!r}; use one of {STOP_RULES}")
    return rule  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """Base of the package's options objects (frozen dataclasses).

    A field whose default is itself an :class:`Options` (say ``ScoreOptions.decode``)
    is *nested*: :meth:`from_kwargs` routes that object's field names to it and
    :meth:`settings` writes its fields beside the outer ones (one flat dict, the layout
    ``meta.json`` has always had).
    """

    #: settings keys written under another name (field -> key), for records older than
    #: the options objects; empty for most classes
    SETTINGS_NAMES: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def _nested(cls) -> dict[str, type[Options]]:
        out = {}
        for f in dataclasses.fields(cls):
            default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else f.default)
            if isinstance(default, Options):
                out[f.name] = type(default)
        return out

    @classmethod
    def option_names(cls) -> list[str]:
        """Every keyword :meth:`from_kwargs` takes: the fields, a nested object's too."""
        nested = cls._nested()
        names = []
        for f in dataclasses.fields(cls):
            names += nested[f.name].option_names() if f.name in nested else [f.name]
        return names

    @classmethod
    def from_kwargs(cls: type[O], base: O | None = None, /, *, where: str | None = None,
                    **kwargs: Any) -> O:
        """``base`` (default: every default) with the fields given as keywords replaced;
        a nested object's fields are given by their own names (``max_new_tokens=8`` of
        ``ScoreOptions`` sets ``decode.max_new_tokens``). None is a value like any other.

        Args:
            base: the object the keywords override (None: the defaults).
            where: the public function whose keywords these are, for the message.

        Raises:
            TypeError: an unknown keyword (the message names a near miss and the
                accepted ones).
            ValueError: a value the object refuses (each class's checks).
        """
        names = cls.option_names()
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            near = [f"did you mean {m[0]} for {k}?" for k in unknown
                    if (m := difflib.get_close_matches(k, names, n=1))]
            raise TypeError(f"{where or cls.__name__}() got unknown keyword(s) {unknown}"
                            + "".join(f"; {h}" for h in near)
                            + f"; accepted options: {', '.join(sorted(names))}")
        obj = cls() if base is None else base
        own = {k: v for k, v in kwargs.items() if k in {f.name for f in dataclasses.fields(cls)}}
        for name, sub in cls._nested().items():
            theirs = {k: kwargs[k] for k in sub.option_names() if k in kwargs}
            if theirs:
                own[name] = sub.from_kwargs(getattr(obj, name), where=where, **theirs)
        return dataclasses.replace(obj, **own) if own else obj

    def settings(self) -> dict[str, Any]:
        """The object as one flat JSON-able dict: each field (a nested object's fields
        in its place), under its settings name (:attr:`SETTINGS_NAMES`)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Options):
                out.update(value.settings())
            else:
                out[self.SETTINGS_NAMES.get(f.name, f.name)] = _jsonable(value)
        return out

    @classmethod
    def from_settings(cls: type[O], settings: Mapping[str, Any]) -> O:
        """The object recorded as ``settings`` (:meth:`settings`' dict, or a run's
        ``meta.json`` settings): keys that are not options (the model, the trial-set
        hash, ...) are ignored, options missing (older records) take their defaults.

        Raises:
            ValueError: a recorded value the object refuses.
        """
        back = {v: k for k, v in cls.SETTINGS_NAMES.items()}
        kwargs = {back.get(k, k): v for k, v in settings.items()}
        names = set(cls.option_names())
        return cls.from_kwargs(**{k: v for k, v in kwargs.items() if k in names})


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeOptions(Options):
    """How :func:`locos_tl.engine.decode.greedy_decode` decodes (every decoder of the
    package reads the same fields).

    Attributes:
        max_new_tokens: the greedy budget, in generated tokens (an integer >= 1).
            Default 50: the paper's scoring budget (docs/concepts.md). A command whose
            answers are shorter says so where its default differs.
        stop_rule: ``"newline_token"`` (default, the authors' release: only the bare
            newline token stops), ``"contains_newline"`` (any token containing a
            newline) or ``"none"`` (no newline stops: multi-line answers);
            :func:`locos_tl.engine.stops.is_newline_stop`.
        thinking: skip a ``<think> ... </think>`` block (Qwen3 style): newlines inside
            it never stop and its text is kept out of the response (default True).
        stop_at_eos: stop after an end-of-sequence token (default True).
        prefill_mode: ``"auto"`` (default: the SDPA twin when it runs every attached
            hook, else the bridge), ``"sdpa"`` or ``"bridge"``;
            :func:`locos_tl.engine.forward.prefill`.
        chunk_size: prefill queries per forward, in tokens (None, the default: the whole
            prompt on the SDPA twin, 1024 on the bridge); memory
            ``O(chunk_size x N)`` per layer on the bridge.
        decode_engine: ``"auto"`` (default), ``"twin"`` or ``"bridge"``: the engine of
            the decode steps (:func:`locos_tl.engine.forward.step_engine`).

    Raises:
        ValueError: ``max_new_tokens`` not an integer >= 1, an unknown stop rule,
            prefill mode or decode engine, a ``chunk_size`` that is not None nor an
            integer >= 1.
    """

    max_new_tokens: int = 50
    stop_rule: StopRule = "newline_token"
    thinking: bool = True
    stop_at_eos: bool = True
    prefill_mode: PrefillMode = "auto"
    chunk_size: int | None = None
    decode_engine: DecodeEngine = "auto"

    def __post_init__(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
        check_stop_rule(self.stop_rule)
        if self.prefill_mode not in PREFILL_MODES:
            raise ValueError(f"unknown prefill mode {self.prefill_mode!r}; use 'auto', "
                             "'sdpa' or 'bridge'")
        if self.decode_engine not in DECODE_ENGINES:
            raise ValueError(f"unknown decode_engine {self.decode_engine!r}; use one of "
                             f"{DECODE_ENGINES}")
        if self.chunk_size is not None:
            try:
                ok = not isinstance(self.chunk_size, bool) and \
                    operator.index(self.chunk_size) >= 1
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(f"chunk_size must be None or an integer >= 1, got "
                                 f"{self.chunk_size!r}")
