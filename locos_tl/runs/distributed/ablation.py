"""Greedy generations under head ablation on Ray workers (``evaluate(..., workers=N)``,
``locos ablate --workers N``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from locos_tl.engine.options import DecodeOptions
from locos_tl.runs.distributed.hosts import ModelHost, model_pool_for
from locos_tl.runs.distributed.pool import RayPool, ResultEvent
from locos_tl.runs.distributed.ray_glue import require_ray


@dataclass(frozen=True)
class AblatedGenerationTask:
    """One greedy generation of ``trial`` with ``heads`` ablated (``mode``), run on a
    :class:`ModelHost`; returns ``{"response", "generated", "stopped_by"}``, and with
    ``continuations`` (token-id sequences) their log-probabilities right after the prompt
    under the ablation, ``"continuation_logprobs"`` (nats; read from the decoding's own
    prefill, as ``greedy_decode(score_continuations=...)`` does).

    The ablation acts at every position: the prompt is prefilled on the SDPA twin with
    the same hooks as module hooks, or through the bridge (see
    :func:`locos_tl.engine.ablation.ablate`, :mod:`locos_tl.engine.interventions`).
    """

    heads: tuple[tuple[int, int], ...]
    mode: str
    means: Any
    trial: Any
    decode: DecodeOptions
    continuations: tuple[tuple[int, ...], ...] | None = None

    def __call__(self, host: ModelHost) -> dict[str, Any]:
        from locos_tl.engine.ablation import ablate
        from locos_tl.engine.decode import greedy_decode

        with ablate(host.model, list(self.heads), self.mode, means=self.means):  # type: ignore[arg-type]
            res = greedy_decode(host.model, self.trial.tokens, self.decode,
                                score_continuations=self.continuations)
        out = {"response": res.text, "generated": res.generated, "stopped_by": res.stopped_by}
        if self.continuations is not None:
            out["continuation_logprobs"] = res.continuation_logprobs
        return out


def generate_ablated_distributed(
    model: Any,
    items: Sequence[tuple[Sequence[tuple[int, int]], Any]],
    *,
    mode: str,
    means: Any = None,
    decode: DecodeOptions | None = None,
    workers: int = 2,
    ray_address: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    pool: RayPool | None = None,
    on_result: Callable[[ResultEvent], None] | None = None,
    progress: bool = True,
    continuations: Sequence[Sequence[Sequence[int]] | None] | None = None,
    **pool_kwargs: Any,
) -> list[dict[str, Any]]:
    """Greedy generations under head ablation, ``(heads, trial)`` items spread over Ray
    workers (the engine of ``evaluate(..., workers=N)`` / ``locos ablate --workers N``).

    Args:
        model: hub name, local directory, or a loaded bridge (its path and dtype are
            used); ignored when ``pool`` is given.
        items: ``(heads, trial)`` pairs: the ``(layer, head)`` list to ablate (empty: no
            ablation) and the :class:`~locos_tl.trials.Trial` to generate for.
        mode, means: see :func:`locos_tl.engine.ablation.ablate`.
        decode: how each generation is decoded
            (:class:`~locos_tl.engine.options.DecodeOptions`; None: its defaults).
            :func:`~locos_tl.experiments.evaluate.ablation_sweep` passes its own
            (:data:`locos_tl.experiments.options.ABLATION_DECODE` unless told).
        workers, ray_address, load_kwargs, pool, **pool_kwargs: as in
            :func:`score_trials_distributed`.
        on_result: driver-side callback as each generation arrives (write the
            resumable record there); ``ev.index`` indexes ``items``.
        progress: show a tqdm bar.
        continuations: one entry per item (None: none for it): token-id sequences
            whose log-probabilities right after the prompt, under the item's ablation,
            its result also holds (``"continuation_logprobs"``, nats; the name margin's
            names, :func:`locos_tl.experiments.margin.candidate_token_ids`).

    Returns:
        One ``{"response", "generated", "stopped_by"}`` dict per item, in order, with
        ``"continuation_logprobs"`` where the item has continuations.

    Raises:
        ValueError: ``continuations`` is not one entry per item.
        DistributedError: Ray missing, every worker died, or an item keeps crashing
            workers.
    """
    conts = [None] * len(items) if continuations is None else list(continuations)
    if len(conts) != len(items):
        raise ValueError(f"continuations has {len(conts)} entries for {len(items)} items: "
                         "give one per item (None for an item without)")
    require_ray()
    decode = DecodeOptions() if decode is None else decode
    tasks = [AblatedGenerationTask(tuple((int(a), int(b)) for a, b in heads), mode, means,
                                   trial, decode,
                                   None if names is None
                                   else tuple(tuple(int(i) for i in n) for n in names))
             for (heads, trial), names in zip(items, conts, strict=True)]
    with model_pool_for(model, pool, workers=workers, ray_address=ray_address,
                         load_kwargs=load_kwargs, **pool_kwargs) as pool:
        return pool.map(tasks, on_result=on_result, progress=progress,
                        desc=f"ablation ({mode}, {pool.n_workers} workers)")
