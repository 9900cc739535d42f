"""One trial: greedy decoding feeding every detector, and the JSON record it leaves
(:class:`locos_tl.runs.runner.ScoringRun` keeps the records)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from locos_tl.detectors import Detector, TrialOutcome
from locos_tl.engine.answers import GATE_THRESHOLD, answer_steps, rouge1_recall
from locos_tl.engine.continuation_tokens import answer_prefix, trial_context
from locos_tl.engine.decode import DecodeResult, DecodeStep, greedy_decode
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.errors import NonFiniteError, warn_caller
from locos_tl.trials import Trial


def non_finite_record(
    trial: Trial, reason: str, detectors: Sequence[Detector] | None = None
) -> dict[str, Any]:
    """The record of a trial whose forward pass produced NaN or inf (logits, or phi of a
    phi-based detector): dropped with reason ``"non_finite"``, and a ``RuntimeWarning``.
    With ``detectors``, also ``dropped_by`` (every method ``"non_finite"``) and
    ``spans`` (method -> span name), as :func:`run_trial` records it."""
    warn_caller(f"trial {trial.trial_id} dropped (non_finite): {reason}", RuntimeWarning)
    rec = {
        "trial_id": trial.trial_id, "n_prompt_tokens": trial.n_tokens,
        "needle_span": list(trial.needle_span), "answer": trial.answer, "response": "",
        "generated": [], "stopped_by": "non_finite", "rouge1_recall": 0.0,
        "accepted": False, "dropped": "non_finite", "non_finite": reason,
        "answer_steps": [], "scores": {}, "step_values": {}, "meta": trial.meta,
    }
    if detectors is not None:
        rec["dropped_by"] = {d.name: "non_finite" for d in detectors}
        rec["spans"] = {d.name: d.span for d in detectors}
    return rec


#: the answer-step acceptance rule (LOCOS) behind a record's ``accepted``/``dropped``
_ANSWER_STEP_RULE = Detector()


class _Collector:
    """One trial's detector inputs, gathered while decoding (kept on the device):
    per-step values, phi's per-step finiteness, prompt-row values."""

    def __init__(self, trial: Trial, detectors: Sequence[Detector]) -> None:
        self.detectors = detectors
        self.per_step: dict[str, list[torch.Tensor]] = {d.name: [] for d in detectors}
        self.needs_phi = any(d.needs_phi for d in detectors)
        self.phi_ok: list[torch.Tensor] = []
        self.spans = {d.name: trial.span(d.span) for d in detectors}
        self.prompt_vals: dict[str, dict[int, torch.Tensor]] = {
            d.name: {} for d in detectors if d.prompt_window}

    def on_step(self, step: DecodeStep) -> None:
        if self.needs_phi:
            self.phi_ok.append(torch.isfinite(step.phi).all())
        for d in self.detectors:
            if d.steps == "prompt" and step.t > 0:  # prompt-only: step 0 is position N-1
                continue
            self.per_step[d.name].append(d.step_value(step, self.spans[d.name]))

    def on_prompt_rows(self, layer: int, rows: torch.Tensor) -> None:
        for d in self.detectors:
            if d.prompt_window:
                self.prompt_vals[d.name][layer] = d.prompt_value(rows, self.spans[d.name])


def run_trial(
    model: Any,
    trial: Trial,
    detectors: Sequence[Detector],
    *,
    directions: AnswerDirections | None,
    decode: DecodeOptions | None = None,
    gate_threshold: float = GATE_THRESHOLD,
) -> dict[str, Any]:
    """Decode one trial and return its record (JSON-serialisable).

    ``decode``: how the trial is decoded (:class:`~locos_tl.engine.options.DecodeOptions`;
    None: the defaults), handed whole to :func:`locos_tl.engine.decode.greedy_decode`;
    answer steps are searched only after a thinking block (``response_start``).
    ``gate_threshold``: the ROUGE-1 recall a response must exceed. Detector values stay
    on the device while decoding and are stacked and moved to the host once per trial.

    Record fields: ``trial_id``, ``response``, ``generated``, ``rouge1_recall``,
    ``accepted`` (gate passed and an answer step found), ``dropped`` (``None``,
    ``"gate"``, ``"no_answer_step"`` or ``"non_finite"``: NaN/inf logits or phi, with a
    ``RuntimeWarning`` and the reason in ``non_finite``), ``answer_steps``, ``scores`` (method ->
    ``[n_layers][n_heads]`` per-trial score), ``step_values`` (method -> values of the
    used steps, answer-step methods only), ``meta``. ``accepted``/``dropped`` are the
    answer-step rule (LOCOS); each method accepts by its own published rule
    (``Detector.drop_reason``): ``dropped_by`` maps method -> ``None`` (counted) or the
    reason, and only counted methods get a score. ``spans`` maps method -> the span
    name it read (``"needle"``/``"answer"``, :meth:`Trial.span`); ``needle_span`` and
    ``answer_span`` are the trial's spans.
    """
    col = _Collector(trial, detectors)
    window = max((d.prompt_window for d in detectors), default=0)

    try:
        result = greedy_decode(
            model, trial.tokens, decode, on_step=col.on_step, directions=directions,
            prompt_window=window, on_prompt_rows=col.on_prompt_rows if window else None,
        )
    except NonFiniteError as exc:
        return non_finite_record(trial, str(exc), detectors)
    return trial_record(model, trial, detectors, result, col, gate_threshold)


def names_a_distractor(trial: Trial, response: str) -> bool:
    """Whether ``response`` names a distractor's character (``meta["distractor_names"]``
    of a trial built with distractor needles). Detection counts a distractor trial only
    when the answer names the target (the gate) and no distractor: every method then
    drops it with reason ``"distractor"``."""
    rivals = trial.meta.get("distractor_names") or ()
    text = response.strip()
    return any(isinstance(r, str) and r and r in text for r in rivals)


def response_context(tokenizer: Any, trial: Trial, result: DecodeResult) -> str:
    """The text the response's answer continues: the trial's prompt text
    (:func:`~locos_tl.engine.continuation_tokens.trial_context`), then the thinking
    block decoded (special tokens kept) when the response starts after one."""
    text = trial_context(tokenizer, trial)
    if result.response_start:
        think = list(result.generated[: result.response_start])
        text += str(tokenizer.decode(think, skip_special_tokens=False))
    return text


def trial_record(
    model: Any,
    trial: Trial,
    detectors: Sequence[Detector],
    result: DecodeResult,
    col: _Collector,
    gate_threshold: float = GATE_THRESHOLD,
) -> dict[str, Any]:
    """A decoded trial's record (fields of :func:`run_trial`), from its decode result
    and the detector values gathered on the device while decoding.

    Args:
        result: the trial's :class:`locos_tl.engine.decode.DecodeResult`.
        col: the detector values gathered while decoding (``col.on_step``,
            ``col.on_prompt_rows``).
        gate_threshold: ROUGE-1 recall gate (strictly above it passes).

    Returns:
        The record; a ``"non_finite"`` record (:func:`non_finite_record`) when a step's
        phi holds NaN or inf. Detector values move to the host in one transfer.
    """
    host = _to_host(col.per_step, col.prompt_vals, col.phi_ok)  # one transfer per trial
    ok = host.pop("__phi_ok__", None)
    if ok is not None and not bool(ok.all()):
        bad = int((~ok).nonzero()[0])
        return non_finite_record(
            trial, str(NonFiniteError(f"decoding step {bad}: phi holds NaN or inf")),
            detectors)
    recall = rouge1_recall(result.text, trial.answer)
    steps = answer_steps(model.tokenizer, result.generated, trial.answer,
                         start=result.response_start)
    outcome = TrialOutcome(
        generated=list(result.generated), response=result.text, answer=trial.answer,
        rouge1_recall=recall, answer_steps=list(steps), gate_threshold=gate_threshold,
        tokenizer=model.tokenizer, response_start=result.response_start,
        context=response_context(model.tokenizer, trial, result),
        answer_prefix=answer_prefix(trial),
    )
    dropped = _ANSWER_STEP_RULE.drop_reason(outcome)  # the trial-level accepted/dropped
    dropped_by = {d.name: d.drop_reason(outcome) for d in detectors}
    if names_a_distractor(trial, result.text):  # right name or not, a wrong one too
        dropped = dropped or "distractor"
        dropped_by = {m: r or "distractor" for m, r in dropped_by.items()}
    record: dict[str, Any] = {
        "trial_id": trial.trial_id,
        "n_prompt_tokens": trial.n_tokens,
        "needle_span": list(trial.needle_span),
        "answer_span": None if trial.answer_span is None else list(trial.answer_span),
        "spans": {d.name: d.span for d in detectors},
        "answer": trial.answer,
        "response": result.text,
        "generated": result.generated,
        "stopped_by": result.stopped_by,
        "response_start": result.response_start,
        "rouge1_recall": recall,
        "accepted": dropped is None,
        "dropped": dropped,
        "dropped_by": dropped_by,
        "answer_steps": steps,
        "scores": {},
        "step_values": {},
        "meta": trial.meta,
    }
    for d in detectors:
        if dropped_by[d.name] is not None:
            continue
        used = d.used_steps(outcome)
        vals = host[d.name][torch.as_tensor(used, dtype=torch.long)]
        pv_t = host.get(f"__prompt__{d.name}")
        score = d.trial_score(vals, prompt_values=pv_t)
        record["scores"][d.name] = None if score is None else score.tolist()
        if d.steps == "answer":
            record["step_values"][d.name] = vals.tolist()
    return record


def _to_host(
    per_step: dict[str, list[torch.Tensor]],
    prompt_vals: dict[str, dict[int, torch.Tensor]],
    phi_ok: list[torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Stack one trial's device values and move them to the host in one transfer.

    Returns ``{method: [n_steps, n_layers, n_heads]}`` (empty ``[0]`` with no step),
    ``{"__prompt__<method>": [n_layers, n_heads, n_rows]}`` and ``"__phi_ok__"``
    (per-step bool) on the CPU.
    """
    parts: dict[str, torch.Tensor] = {}
    for name, vals in per_step.items():
        if vals:
            parts[name] = torch.stack(vals).to(torch.float32)
    for name, pv in prompt_vals.items():
        if pv:
            parts[f"__prompt__{name}"] = torch.stack([pv[l] for l in sorted(pv)]).float()
    if phi_ok:
        parts["__phi_ok__"] = torch.stack(phi_ok).to(torch.float32)
    out: dict[str, torch.Tensor] = {n: torch.zeros(0) for n in per_step}
    if parts:
        by_device: dict[Any, list[str]] = {}
        for n, t in parts.items():
            by_device.setdefault(t.device, []).append(n)
        for names in by_device.values():
            flat = torch.cat([parts[n].reshape(-1) for n in names]).cpu()  # the one read
            for n, chunk in zip(names, flat.split([parts[n].numel() for n in names]),
                                strict=True):
                out[n] = chunk.view(parts[n].shape)
    if "__phi_ok__" in out:
        out["__phi_ok__"] = out["__phi_ok__"].bool()
    return out
