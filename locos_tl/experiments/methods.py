"""The head-scoring methods and what each needs of a trial: the seed of one registry.

Each method is a :class:`Method`: its name; whether it rides the shared decode pass (the
detectors of :data:`locos_tl.detectors.DETECTORS`, fed by one greedy decode per trial,
:func:`locos_tl.experiments.score.score_methods`) or runs its own forward passes per
trial (``atp``, ``qrhead``, ``cri``); the trial span it reads by default and the spans
it accepts; and its per-trial requirements, small named checks
``check(model, trial, options) -> problem or None``.

:func:`check_trials` runs the checks of every method a run scores (and a sweep's own
ones) on every trial before the first forward pass, and refuses all the bad trials in
one :class:`~locos_tl.errors.TrialError` naming each (index and id) and what is wrong,
instead of stopping at the last trial after the others were scored.

The decode-pass entries are derived from :data:`~locos_tl.detectors.DETECTORS` when the
registry is first read (:func:`get_method`, ``METHODS``): importing this module imports
neither torch nor TransformerLens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any

from locos_tl.engine.answers import answer_token_variants
from locos_tl.errors import TrialError
from locos_tl.experiments.corruption import DEFAULT_FILLER, DEFAULT_SWAP_NAMES, corrupt_tokens
from locos_tl.experiments.question import qrhead_inputs
from locos_tl.trials import Trial, as_span, as_trial_list, check_trials_tokenizer

__all__ = ["Check", "Method", "answer_tokenizes", "check_trials", "corruptible",
           "fits_decode", "fits_patching", "fits_prompt", "get_method", "question_located",
           "spans_in_prompt"]

#: A per-trial requirement: ``check(model, trial, options)`` returns what is wrong with
#: ``trial`` for a run with ``options`` (the run's keyword arguments), or None.
Check = Callable[[Any, Trial, Mapping[str, Any]], "str | None"]


def _fits(model: Any, trial: Trial, n_new: int) -> str | None:
    from locos_tl.runs.runner import fit_problem  # imports torch: only when checking

    return fit_problem(model, trial, n_new)


def fits_decode(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """The prompt plus ``options["max_new_tokens"]`` (default 50) greedy tokens fits the
    model's context, and its token ids its vocabulary."""
    return _fits(model, trial, int(options.get("max_new_tokens", 50)))


def fits_patching(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """As :func:`fits_decode` for ``answer_position="generated"`` (the clean run's
    greedy response is searched for the answer); the prompt alone for ``"prompt_end"``."""
    prompt_end = options.get("answer_position", "generated") == "prompt_end"
    return _fits(model, trial, 1 if prompt_end else int(options.get("max_new_tokens", 50)))


def fits_prompt(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """The prompt alone fits the model's context (nothing is generated)."""
    return _fits(model, trial, 1)


def spans_in_prompt(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """The needle span and the answer span (when set) lie inside the prompt. ``Trial``
    checks this when built; a trial changed afterwards is caught here."""
    for name, span in (("needle span", trial.needle_span), ("answer span", trial.answer_span)):
        if span is not None:
            try:
                as_span(span, trial.n_tokens, f"Trial.{name.replace(' ', '_')}", name=name)
            except TrialError as exc:
                return str(exc)
    return None


def answer_tokenizes(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """The gold answer has a tokenization (answer steps, the gold token of patching:
    :func:`locos_tl.engine.answers.answer_token_variants`)."""
    try:
        answer_token_variants(model.tokenizer, trial.answer)
    except TrialError as exc:
        return str(exc)
    return None


def corruptible(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """The needle can be corrupted as ``options["corruption"]`` asks (default
    ``"filler"``; :func:`~locos_tl.experiments.corruption.corrupt_tokens` with the
    options' ``filler`` and ``swap_names``): for ``"name_swap"`` the answer's tokens occur
    in the needle and a swap name has their token length."""
    corruption = options.get("corruption", "filler")
    try:
        corrupt_tokens(model.tokenizer, trial, corruption,
                       filler=options.get("filler", DEFAULT_FILLER),
                       swap_names=options.get("swap_names", DEFAULT_SWAP_NAMES))
    except TrialError as exc:
        return f"{exc} (corruption={corruption!r})"
    return None


def question_located(model: Any, trial: Trial, options: Mapping[str, Any]) -> str | None:
    """QRHead's inputs exist (:func:`~locos_tl.experiments.question.qrhead_inputs`): a
    question, the span read (``options["spans"]["qrhead"]``, default ``"needle"``)
    before it, and a null question (``options["null_question"]``, default ``"N/A"``)
    with a token."""
    span = (options.get("spans") or {}).get("qrhead") or "needle"
    try:
        qrhead_inputs(model.tokenizer, trial, span, options.get("null_question", "N/A"))
    except TrialError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Method:
    """One head-scoring method (see the module docstring).

    Attributes:
        name: the method's name (``score_trials(method=...)``; ``cri`` is
            :func:`~locos_tl.experiments.patching.patch_heads`'s).
        decode_pass: True when it rides the shared decode pass (a detector of
            :data:`~locos_tl.detectors.DETECTORS`); False when it runs its own forward
            passes per trial.
        default_span: the trial span it reads unless told otherwise
            (:meth:`locos_tl.trials.Trial.span`); None: it reads no span (patching
            corrupts the whole needle).
        spans: the spans it accepts (empty: none).
        checks: its per-trial requirements, run by :func:`check_trials`.
    """

    name: str
    decode_pass: bool
    default_span: str | None
    spans: tuple[str, ...]
    checks: tuple[Check, ...]


_DECODE_CHECKS: tuple[Check, ...] = (fits_decode, spans_in_prompt, answer_tokenizes)
_PATCHING_CHECKS: tuple[Check, ...] = (fits_patching, answer_tokenizes, corruptible)


@cache
def _registry() -> Mapping[str, Method]:
    from locos_tl.detectors import DETECTORS, SPAN_NAMES

    out = {name: Method(name, True, cls.span, SPAN_NAMES, _DECODE_CHECKS)
           for name, cls in DETECTORS.items()}
    out["atp"] = Method("atp", False, None, (), _PATCHING_CHECKS)
    out["qrhead"] = Method("qrhead", False, "needle", SPAN_NAMES,
                           (fits_prompt, spans_in_prompt, question_located))
    out["cri"] = Method("cri", False, None, (), _PATCHING_CHECKS)
    return MappingProxyType(out)


def get_method(name: str) -> Method:
    """The registered method ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown method {name!r}; use one of {sorted(registry)}")
    return registry[name]


def __getattr__(name: str) -> Any:
    if name == "METHODS":  # name -> Method, read-only; built on first use
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_trials(
    model: Any,
    trials: Sequence[Trial],
    methods: Sequence[str] = (),
    *,
    checks: Sequence[Check] = (),
    where: str = "",
    **options: Any,
) -> None:
    """Refuse, before any forward pass, every trial that a run cannot take.

    Trials built by another tokenizer than the model's are refused first
    (:func:`locos_tl.trials.check_trials_tokenizer`); then every check of every method in
    ``methods`` and every check in ``checks`` runs on every trial (each distinct check
    once a trial), and the bad trials are refused together.

    Args:
        model: the TransformerBridge the run uses (``tokenizer``, ``cfg.n_ctx``,
            ``cfg.d_vocab``).
        trials: the run's trials.
        methods: the names of the methods the run scores (:func:`get_method`).
        checks: further per-trial checks (a sweep's own requirements).
        where: the calling function's name, for the message.
        **options: the run's options that the checks read: ``max_new_tokens``,
            ``answer_position``, ``corruption``, ``filler``, ``swap_names``, ``spans``
            (method -> span name), ``null_question``, ... (see each check).

    Raises:
        ValueError: an unknown method; an option a check cannot use (an unknown
            corruption or span, an empty filler).
        TrialError: a bare Trial or a non-Trial item; trials built by another
            tokenizer; one trial or more failing a check: one error naming each, by
            index and id, with what is wrong (:meth:`~locos_tl.errors.TrialError.of_trials`).
    """
    trials = as_trial_list(trials, where or "check_trials")
    todo = list(dict.fromkeys([c for m in methods for c in get_method(m).checks]
                              + list(checks)))
    check_trials_tokenizer(model, trials)
    bad = []
    for i, t in enumerate(trials):
        found: list[str] = []
        for check in todo:
            try:
                problem = check(model, t, options)
            except (IndexError, KeyError, TypeError):
                if found:  # a trial already refused (ids outside the vocabulary, ...)
                    continue
                raise
            head = f"trial {t.trial_id}: "  # the line names the trial itself
            problem = problem[len(head):] if problem and problem.startswith(head) else problem
            if problem is not None and problem not in found:
                found.append(problem)
        if found:
            bad.append((i, t.trial_id, "; ".join(found)))
    if bad:
        raise TrialError.of_trials(bad, len(trials), where)
