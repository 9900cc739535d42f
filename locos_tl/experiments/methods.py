"""The registry of head-scoring methods: one :class:`Method` a method, and what each needs
of a trial.

Each method declares its name; its kind: ``"decode_pass"`` (a detector of
:data:`locos_tl.detectors.DETECTORS`, fed by the one greedy decode per trial that every
such method shares, :func:`locos_tl.experiments.score.score_methods`) or
``"own_passes"`` (its own forward passes per trial: ``atp``, ``qrhead``, ``cri``, each
run by its function, :meth:`Method.run`); the trial span it reads by default and the
spans it accepts; and its per-trial requirements, small named checks
``check(model, trial, options) -> problem or None``. :data:`METHODS` (name ->
:class:`Method`, in a fixed order) is what ``score_trials(method=...)``, the protocol,
``locos score --method`` and the cost benchmark read.

:func:`check_trials` runs the checks of every method a run scores (and a sweep's own
ones) on every trial before the first forward pass, and refuses all the bad trials in
one :class:`~locos_tl.errors.TrialError` naming each (index and id) and what is wrong,
instead of stopping at the last trial after the others were scored.

Result files written before the registry name one method otherwise: :data:`OLD_NAMES`
maps those names to the registered ones, and :func:`current_name` applies it where old
records are read (nowhere else).

Importing this module imports neither torch nor TransformerLens: a method's detector
class or function is imported when it is used (:meth:`Method.detector_class`,
:meth:`Method.function`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from locos_tl.engine.answers import answer_token_variants
from locos_tl.errors import TrialError
from locos_tl.experiments.corruption import DEFAULT_FILLER, DEFAULT_SWAP_NAMES, corrupt_tokens
from locos_tl.experiments.question import qrhead_inputs
from locos_tl.trials import Trial, as_span, as_trial_list, check_trials_tokenizer

if TYPE_CHECKING:
    from locos_tl.detectors import Detector
    from locos_tl.heads import HeadScores

__all__ = ["METHODS", "OLD_NAMES", "Check", "Method", "MethodKind", "answer_tokenizes",
           "check_trials", "corruptible", "current_name", "fits_decode", "fits_patching",
           "fits_prompt", "get_method", "method_names", "question_located",
           "spans_in_prompt"]

#: ``"decode_pass"``: rides the one greedy decode per trial that every such method
#: shares; ``"own_passes"``: runs its own forward (and backward) passes per trial.
MethodKind = Literal["decode_pass", "own_passes"]
#: The trial spans a method may read (:meth:`locos_tl.trials.Trial.span`; the detectors'
#: ``SPAN_NAMES``).
SPANS: tuple[str, ...] = ("needle", "answer")

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
        name: its one name, in Python (``score_trials(method=...)``), on the command
            line (``locos score --method``) and in result files.
        kind: ``"decode_pass"`` or ``"own_passes"`` (:data:`MethodKind`).
        summary: what it scores, in a few words, with its source.
        default_span: the trial span it reads unless told otherwise
            (:meth:`locos_tl.trials.Trial.span`; a decode-pass method's is its detector
            class's ``span``); None: it reads no span (patching corrupts the whole
            needle).
        spans: the spans it accepts (empty: none).
        checks: its per-trial requirements, run by :func:`check_trials`.
        detector: ``"module:Class"`` of a decode-pass method's
            :class:`~locos_tl.detectors.Detector` (:meth:`detector_class`).
        runner: ``"module:function"`` of an own-pass method's function,
            ``(model, trials, **options) -> HeadScores`` (:meth:`function`).
        options: the options of :func:`~locos_tl.experiments.score.score_methods`
            that ``score_methods`` hands an own-pass method's function (each of the same
            meaning there), beside ``span`` when it accepts spans; its other options
            keep the function's defaults.
        variant_of: the method this one is a variant of (``headkv_anchor`` of
            ``headkv``), or None.
    """

    name: str
    kind: MethodKind
    summary: str
    default_span: str | None
    spans: tuple[str, ...]
    checks: tuple[Check, ...]
    detector: str | None = None
    runner: str | None = None
    options: tuple[str, ...] = ()
    variant_of: str | None = None

    @property
    def decode_pass(self) -> bool:
        """Whether it rides the shared decode pass (``kind == "decode_pass"``)."""
        return self.kind == "decode_pass"

    def detector_class(self) -> type[Detector]:
        """A decode-pass method's detector class (imports torch).

        Raises:
            TypeError: an own-pass method (it has no detector).
        """
        if self.detector is None:
            raise TypeError(f"{self.name} runs its own forward passes: it has no "
                            "decode-pass detector (Method.run scores it)")
        return _imported(self.detector)

    def function(self) -> Callable[..., HeadScores]:
        """An own-pass method's function, ``(model, trials, **options) -> HeadScores``
        (imported now: torch and the model code).

        Raises:
            TypeError: a decode-pass method (``score_trials(method=...)`` scores it).
        """
        if self.runner is None:
            raise TypeError(f"{self.name} rides the shared decode pass: score it with "
                            f"score_trials(model, trials, method={self.name!r})")
        return _imported(self.runner)

    def run(self, model: Any, trials: Any, **options: Any) -> HeadScores:
        """Score ``trials`` with an own-pass method's function and its keyword
        ``options`` (:attr:`runner`: e.g. ``corruption=``, ``answer_position=`` of
        ``cri`` and ``atp``).

        Returns:
            The function's :class:`~locos_tl.heads.HeadScores` (``[n_layers,
            n_heads]`` scores, per-trial scores).

        Raises:
            TypeError: a decode-pass method; an option the function does not take.
        """
        return self.function()(model, trials, **options)


def _imported(path: str) -> Any:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


_DECODE_CHECKS: tuple[Check, ...] = (fits_decode, spans_in_prompt, answer_tokenizes)
_PATCHING_CHECKS: tuple[Check, ...] = (fits_patching, answer_tokenizes, corruptible)
#: score_methods' options that the own-pass functions take, with the same meaning
_OWN_OPTIONS = ("out_dir", "progress", "on_resume")


def _decode(name: str, cls: str, summary: str, span: str,
            variant_of: str | None = None) -> Method:
    return Method(name, "decode_pass", summary, span, SPANS, _DECODE_CHECKS,
                  detector=f"locos_tl.detectors.{cls}", variant_of=variant_of)


#: Every head-scoring method, name -> :class:`Method` (read-only), in the order the
#: command line lists them: the decode-pass methods, then the own-pass ones.
METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in (
    _decode("locos", "locos:Locos", "LOCOS, the per-head logit contribution contrasted "
            "on the needle (Gema, Alex & Minervini 2026, arXiv 2607.01002)", "needle"),
    _decode("wu", "attention:WuCopy", "Wu et al.'s copy-paste retrieval score (Wu et al. "
            "2025, arXiv 2404.15574)", "answer"),
    _decode("attention_spatial", "attention:AttentionSpatial", "LOCOS's spatial "
            "contrast on attention (arXiv 2607.01002, Sec. 4)", "needle"),
    _decode("headkv", "headkv:HeadKV", "HeadKV's retrieval-reasoning score (Fu et al. "
            "2025, arXiv 2410.19258)", "answer"),
    _decode("headkv_anchor", "headkv:HeadKVAnchor", "HeadKV's anchor-window variant of "
            "the LOCOS release (prompt only)", "needle", variant_of="headkv"),
    _decode("dla", "locos:DLA", "direct logit attribution, no spatial contrast (arXiv "
            "2607.01002, Sec. 4)", "needle"),
    Method("atp", "own_passes", "attribution patching, a gradient estimate of CRI "
           "(Nanda 2023; Kramár et al. 2024, arXiv 2403.00745)", None, (),
           _PATCHING_CHECKS, runner="locos_tl.experiments.atp:atp_heads",
           options=("max_new_tokens", *_OWN_OPTIONS)),
    Method("qrhead", "own_passes", "QRHead's query-context attention (Zhang et al. 2025, "
           "arXiv 2506.09944)", "needle", SPANS,
           (fits_prompt, spans_in_prompt, question_located),
           runner="locos_tl.experiments.qrhead:qrhead_heads", options=_OWN_OPTIONS),
    Method("cri", "own_passes", "causal retrieval importance: per-head activation "
           "patching, clean into corrupted (arXiv 2607.01002)", None, (),
           _PATCHING_CHECKS, runner="locos_tl.experiments.patching:patch_heads",
           options=("max_new_tokens", *_OWN_OPTIONS)),
)})

#: Names that result files written before this registry use for a registered method:
#: the ablation cells (``jobs.json``) and the tables of the protocol's published runs
#: (``docs/real_models/``) call Wu's ranking ``wu_nolima``. Read, never written:
#: :func:`current_name` applies it where old records are loaded.
OLD_NAMES: Mapping[str, str] = MappingProxyType({"wu_nolima": "wu"})


def current_name(name: str) -> str:
    """The registered name of a method that an old record calls ``name``
    (:data:`OLD_NAMES`); any other name as it is."""
    return OLD_NAMES.get(name, name)


def method_names(kind: MethodKind | None = None) -> tuple[str, ...]:
    """The registered names (of one ``kind`` if given), in :data:`METHODS`' order."""
    return tuple(n for n, m in METHODS.items() if kind is None or m.kind == kind)


def get_method(name: str) -> Method:
    """The registered method ``name``.

    Raises:
        ValueError: an unknown name (the message lists the registered ones).
    """
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; use one of {', '.join(METHODS)}")
    return METHODS[name]


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
