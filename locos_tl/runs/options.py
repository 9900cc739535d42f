"""The options of a scoring run as one frozen object, :class:`ScoreOptions`.

It lives with the scoring run's executors (:mod:`locos_tl.runs`: the runner, the local
and the Ray executor take it whole), below :func:`locos_tl.experiments.score.score_methods`,
whose keyword arguments build it once. ``meta.json``'s ``settings`` are its
:meth:`~locos_tl.engine.options.Options.settings` (the keys runs have always recorded:
``variant``, ``methods``, ``max_new_tokens``, ``gate_threshold``, ``stop_rule``,
``thinking``, ``spans``, ``seed``, and the other decode options beside them), and
:meth:`~locos_tl.engine.options.Options.from_settings` reads a run's options back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from locos_tl.engine.answers import GATE_THRESHOLD
from locos_tl.engine.options import DecodeOptions, Options
from locos_tl.head_spec import as_int

__all__ = ["ScoreOptions"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreOptions(Options):
    """What a scoring run computes (:func:`locos_tl.experiments.score.score_methods`).

    Attributes:
        methods: method names (:data:`~locos_tl.experiments.methods.METHODS`), default
            ``("locos",)``; one name as a string is one method.
        variant: ``"raw"`` (default, the paper) or ``"exact"`` (norm scales frozen; phi
            sums to DLA).
        spans: per-method override of the span a method reads (method -> ``"needle"``
            or ``"answer"``), given as a dict, kept as sorted pairs; default none: each
            method's published span.
        gate_threshold: the ROUGE-1 recall a response must exceed to count (a fraction
            in [0, 1]; default 0.5, :data:`locos_tl.engine.answers.GATE_THRESHOLD`;
            None is the default).
        seed: the bootstrap seed (default 0; decoding is greedy, hence deterministic).
        batch_size: trials decoded together on the plain HF twins (default 1; the same
            records, :mod:`locos_tl.runs.batch`).
        decode: how each trial is decoded (:class:`~locos_tl.engine.options.DecodeOptions`;
            ``max_new_tokens`` 50 tokens by default).

    Raises:
        ValueError: an unknown variant, a ``spans`` that is not a mapping of names,
            a ``batch_size`` below 1; a decode option refused by
            :class:`~locos_tl.engine.options.DecodeOptions`.
    """

    # the annotations name what the constructor takes; __post_init__ keeps tuples
    methods: Sequence[str] = ("locos",)
    variant: str = "raw"
    spans: Mapping[str, str] | Sequence[tuple[str, str]] | None = ()
    gate_threshold: float | None = GATE_THRESHOLD
    seed: int = 0
    batch_size: int = 1
    decode: DecodeOptions = dataclasses.field(default_factory=DecodeOptions)

    def __post_init__(self) -> None:
        from locos_tl.engine.unembed import check_variant

        methods = self.methods
        methods = (methods,) if isinstance(methods, str) else tuple(methods)
        spans = self.spans
        if isinstance(spans, Mapping):
            spans = tuple(sorted(spans.items()))
        elif spans is None:
            spans = ()
        else:
            spans = tuple(tuple(p) for p in spans)  # type: ignore[misc]
        if not all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in spans):
            raise ValueError(f"spans must map method names to span names, got {self.spans!r}")
        object.__setattr__(self, "methods", methods)
        object.__setattr__(self, "spans", spans)
        if self.gate_threshold is None:
            object.__setattr__(self, "gate_threshold", GATE_THRESHOLD)
        check_variant(self.variant)
        if as_int(self.batch_size, "batch_size") < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @property
    def span_overrides(self) -> dict[str, str]:
        """The ``spans`` overrides as a dict (method -> span name)."""
        return dict(self.spans)

    def settings(self) -> dict[str, Any]:
        """As :meth:`Options.settings`, with ``methods`` a list and ``spans`` a dict."""
        out = super().settings()
        out["methods"] = list(self.methods)
        out["spans"] = self.span_overrides
        return out
