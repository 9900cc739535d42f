"""The options of an ablation sweep as one frozen object, :class:`AblationOptions`.

:func:`locos_tl.experiments.evaluate.ablation_sweep`'s keyword arguments build it once;
the sweep's ``meta.json`` settings are its
:meth:`~locos_tl.engine.options.Options.settings` (the keys sweeps have always recorded,
``mode``, ``max_new_tokens``, ``stop_rule``, ``thinking``, ``reuse_prefix``, ``scorer``,
``ks``, ``seeds``, and the other options beside them). Like
:mod:`locos_tl.engine.options`, this module imports neither torch nor TransformerLens:
``locos ablate`` reads its defaults before any model is loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from locos_tl.engine.options import (
    DEFAULT_PREFIX_BYTES,
    AblationMode,
    DecodeOptions,
    Options,
    check_mode,
)

__all__ = ["ABLATION_DECODE", "AblationOptions"]

#: how an ablation sweep decodes by default: at most 100 new tokens (the authors'
#: release evaluates ablations with ``max_new_tokens=100``, docs/concepts.md protocol
#: table, where scoring decodes 50), and the prompt prefilled 1024 queries at a time
#: (the published sweeps' generations were made so; another chunking changes float
#: rounding, hence some generations)
ABLATION_DECODE = DecodeOptions(max_new_tokens=100, chunk_size=1024)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AblationOptions(Options):
    """What an ablation sweep runs (:func:`locos_tl.experiments.evaluate.ablation_sweep`).

    Attributes:
        k: head counts to ablate, each in ``1..n_layers * n_heads`` (None, the default:
            the paper's 1, 5, 10, 20, 50, 100 up to the model's head count). Recorded as
            ``ks`` (the counts planned).
        mode: how a head is silenced (:func:`locos_tl.ablate`; default ``"query_mean"``,
            the paper's).
        seeds: seeds of the random-heads control (one int or several; default
            ``(0, 1, 2)``).
        random: include the random-heads control (default True).
        bottom: bottom-k control source (default ``"auto"``;
            :func:`locos_tl.experiments.ablation_plan.build_jobs`).
        scorer: ``"nolima"`` (default: ``rougeL``, ``contains``), ``"musique"``,
            ``"babilong"``, ``"control"`` or a callable ``(response, trial) -> {metric:
            value}``; recorded by name.
        name_margin: also record each generation's teacher-forced name margin (nats);
            None (default): when every trial has distractor needles.
        reuse_prefix: compute each ablated prompt from its lowest ablated layer on one
            unablated prefill per trial (default True; same tokens and logits).
        prefix_bytes: cap on the ``resid_pre`` kept per trial, in bytes (default 1 GiB).
        ci: confidence level of the bootstrap intervals over trials, in (0, 1)
            (default 0.95); None: no interval columns.
        decode: how each generation is decoded (default :data:`ABLATION_DECODE`: 100
            new tokens and 1024-token prefill chunks, where
            :class:`~locos_tl.engine.options.DecodeOptions` has 50 and None; the reason
            is :data:`ABLATION_DECODE`'s).

    Raises:
        ValueError: an unknown mode or scorer name; ``ci`` not None nor a level in
            (0, 1); a decode option refused by
            :class:`~locos_tl.engine.options.DecodeOptions`.
    """

    SETTINGS_NAMES: ClassVar[Mapping[str, str]] = {"k": "ks"}

    k: int | Sequence[int] | None = None
    mode: AblationMode = "query_mean"
    seeds: int | Sequence[int] = (0, 1, 2)
    random: bool = True
    bottom: str | None = "auto"
    scorer: str | Callable[..., Mapping[str, float]] = "nolima"
    name_margin: bool | None = None
    reuse_prefix: bool = True
    prefix_bytes: int = DEFAULT_PREFIX_BYTES
    ci: float | int | None = 0.95  # an int (95) is refused by check_confidence, not the type
    decode: DecodeOptions = dataclasses.field(default_factory=lambda: ABLATION_DECODE)

    def __post_init__(self) -> None:
        from locos_tl.head_spec import check_confidence

        for name in ("k", "seeds"):  # a list given is kept as a tuple (hashable, frozen)
            value = getattr(self, name)
            if value is not None and not isinstance(value, int) and \
                    isinstance(value, Sequence):
                object.__setattr__(self, name, tuple(value))
        check_mode(self.mode)
        if self.ci is not None:
            object.__setattr__(self, "ci", check_confidence(self.ci, "ci"))
        if isinstance(self.scorer, str):
            from locos_tl.experiments.task_metrics import get_scorer

            get_scorer(self.scorer)  # an unknown name fails here

    @property
    def scorer_name(self) -> str:
        """The scorer's name, as recorded (a callable's ``__name__``, else ``"custom"``)."""
        s = self.scorer
        return s if isinstance(s, str) else getattr(s, "__name__", "custom")

    def settings(self) -> dict[str, Any]:
        """As :meth:`Options.settings`, with the scorer by name; also the key
        ``stop_at_newline`` (``stop_rule != "none"``) that sweeps have always recorded."""
        out = super().settings()
        out["scorer"] = self.scorer_name
        out["stop_at_newline"] = self.decode.stop_rule != "none"
        return out

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> AblationOptions:
        """As :meth:`Options.from_settings`; ``stop_at_newline`` is derived, not read."""
        return super().from_settings(
            {k: v for k, v in settings.items() if k != "stop_at_newline"})
