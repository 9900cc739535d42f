"""The options of one protocol run as a frozen object, :class:`ProtocolConfig`.

``locos reproduce``'s options build it (each option's help is its field's ``help``,
:func:`help_of`); every stage takes it whole. It is written as the run's ``args.json``
(:meth:`~locos_tl.engine.options.Options.settings`, the keys and values ``args.json``
has always held) and read back from one (:meth:`ProtocolConfig.from_settings`: a
published run's ``args.json`` rebuilds its trials). Importing this module imports
neither torch nor TransformerLens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from locos_tl.engine.options import Options
from locos_tl.errors import ConfigError
from locos_tl.experiments.protocol.common import PRESETS, RANKINGS, STAGES

__all__ = ["ProtocolConfig", "help_of"]


def _opt(default: Any, help: str) -> Any:  # noqa: A002  (the option's help text)
    return dataclasses.field(default=default, metadata={"help": help})


def _preset(help: str) -> Any:  # noqa: A002
    return _opt(None, help + " (default: the preset's)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProtocolConfig(Options):
    """Every option of one run of the paper's protocol
    (:mod:`locos_tl.experiments.protocol`; ``locos reproduce``), each field's unit and
    default in its ``help`` (:func:`help_of`, the command line's help).

    A field left None takes its default when the object is built: ``out`` is
    ``runs/real/<model>``, ``detect_needle_set`` and ``eval_needle_set`` are
    ``needle_set``, and the sizes, grids and methods (``n_detect`` ... ``questions``)
    are the ``preset``'s (:data:`~locos_tl.experiments.protocol.common.PRESETS`).
    Comma-separated lists stay strings, as ``args.json`` records them.

    Raises:
        ConfigError: an unknown preset, template, stage or ``--methods`` entry
            (``baseline`` only alone), or a count below 1.
    """

    model: str = _opt("smollm2-135m-instruct",
                      "model: hub name, local directory, .gguf file or a model of "
                      "`locos models list`")
    out: str | None = _opt(None, "run directory (default runs/real/<model>)")
    preset: str = _opt("cpu", f"sizes and grids: {', '.join(sorted(PRESETS))} (full: the "
                       "paper's, GPU-sized; cpu: this repository's published runs)")
    needle_set: str = _opt("everyday",
                           "NoLiMa needle set (shipped name or file) of the detection and "
                           "evaluation trials, unless one of the two options below is given")
    detect_needle_set: str | None = _opt(None, "needle set of the detection trials (head "
                                         "rankings, CRI); default: --needle-set")
    eval_needle_set: str | None = _opt(None, "needle set of the evaluation trials "
                                       "(ablations, compression); default: --needle-set. "
                                       "Give both to keep the sets disjoint (e.g. "
                                       "hop_detect and hop_eval)")
    template: Literal["chat", "completion"] = _opt(
        "chat", "prompt form: chat (the chat template) or completion (base models)")
    data_dir: str | None = _opt(None, "folder with haystack/*.txt and niah_needles.jsonl "
                                "(default: the copies shipped with locos_tl)")
    stages: str = _opt(",".join(STAGES), f"comma-separated stages to run, of "
                       f"{', '.join(STAGES)} (they run in that order)")
    detect_length: int = _opt(1000, "context length of the detection trials, in tokens")
    detect_haystack: str = _opt("prose", "detection book: dracula (shipped), prose "
                                "(shipped, no named people) or a text file; evaluation "
                                "always uses Mohicans")
    distractors: int = _opt(0, "distractor needles (other entries, other characters) in "
                            "every NoLiMa detection and evaluation trial: detection then "
                            "accepts answers that name the target and no distractor, and "
                            "the ablation grid records the teacher-forced name margin")
    max_new_tokens: int = _opt(16, "greedy budget of the NoLiMa detection trials and CRI, "
                               "in tokens (16, not the scoring default 50: the answer is "
                               "a name)")
    eval_max_new_tokens: int = _opt(16, "greedy budget of the evaluation (ablation) "
                                    "trials, in tokens (16: the answer is a name)")
    niah_max_new_tokens: int = _opt(50, "greedy budget of the NIAH detection trials (Wu on "
                                    "NIAH), in tokens: their answers are sentences of "
                                    "16-25 tokens, which 16 tokens cut off before the "
                                    "trial gate (ROUGE-1 recall > 0.5) can pass; 50 is the "
                                    "paper's scoring budget")
    control_ks: str | None = _opt(None, "k values of the control runs, comma-separated "
                                  "(default: --ks)")
    control_seeds: str | None = _opt(None, "random seeds of the control runs, "
                                     "comma-separated (default: --random-seeds)")
    n_calibration: int = _opt(50, "calibration prompts (raw text of the evaluation books)")
    calibration_chars: int = _opt(4000, "characters of each calibration prompt")
    calibration_tokens: int = _opt(1000, "tokens of each calibration prompt at most")
    batch_size: int = _opt(1, "detection trials decoded together (same records as 1; "
                           "faster on a GPU)")
    workers: int = _opt(1, "ablation stage: spread the generations over this many Ray "
                        "actors (one CPU core or GPU each; identical results)")
    dtype: str = _opt("float32", "float32, bfloat16 or float16")
    device: str | None = _opt(None, "cpu, cuda, ... (default: auto)")
    resume_from: str | None = _opt(None, "a published run directory (e.g. "
                                   "docs/real_models/smollm2): copy its records, cells and "
                                   "calibration means into --out where missing, so the run "
                                   "goes on on this machine; run the trials stage with it "
                                   "(the trial files are rebuilt)")
    publish: str | None = _opt(None, "copy the small result files here after the report "
                               "(e.g. docs/real_models/smollm2)")
    n_detect: int | None = _preset("NoLiMa detection trials")
    n_eval: int | None = _preset("evaluation trials per question type and length (the "
                                 "samples nest: a larger value keeps the finished ones)")
    n_niah: int | None = _preset("NIAH detection trials (Wu on NIAH)")
    n_control: int | None = _preset("parametric and arithmetic control trials, each")
    n_cri: int | None = _preset("detection trials patched for CRI")
    n_compress: int | None = _preset("evaluation trials of the compression sweep")
    eval_lengths: str | None = _preset("evaluation context lengths in tokens, "
                                       "comma-separated")
    random_seeds: str | None = _preset("seeds of the random-heads control, comma-separated")
    methods: str | None = _preset(
        f"rankings to ablate, comma-separated: {', '.join(RANKINGS)} (wu_niah: Wu on the "
        "NIAH trials; the own-pass methods are scored only when named here), or baseline "
        "alone")
    fractions: str | None = _preset("KV-cache fractions kept by the compression sweep, "
                                    "comma-separated")
    ks: str | None = _preset("head counts ablated, comma-separated")
    questions: str | None = _preset("question types evaluated, comma-separated (onehop, "
                                    "direct)")
    model_hashes: Mapping[str, str] | None = _opt(
        None, "the model's content hashes, recorded once it is loaded (not an option)")

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown --preset {self.preset!r}; use one of "
                              f"{', '.join(sorted(PRESETS))}")
        if self.template not in ("chat", "completion"):
            raise ConfigError(f"unknown --template {self.template!r}; use chat or completion")
        derived = {k: v for k, v in PRESETS[self.preset].items() if getattr(self, k) is None}
        if self.out is None:
            derived["out"] = f"runs/real/{self.model.replace('/', '_')}"
        for side in ("detect_needle_set", "eval_needle_set"):
            if getattr(self, side) is None:
                derived[side] = self.needle_set
        for k, v in derived.items():
            object.__setattr__(self, k, v)
        unknown = sorted(set(self.stage_list) - set(STAGES))
        if unknown or not self.stage_list:
            raise ConfigError(f"unknown --stages entr{'y' if len(unknown) == 1 else 'ies'} "
                              f"{unknown}; choose from {', '.join(STAGES)}")
        names = self.method_list
        if names != ["baseline"]:
            bad = [m for m in names if m not in RANKINGS]
            if bad or not names:
                raise ConfigError(f"unknown --methods entry {bad[0] if bad else ''!r}; "
                                  f"choose from {', '.join(RANKINGS)}, or 'baseline' alone")
        for name in ("detect_length", "max_new_tokens", "eval_max_new_tokens",
                     "niah_max_new_tokens", "n_calibration", "calibration_chars",
                     "calibration_tokens", "batch_size", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got "
                                  f"{getattr(self, name)}")

    @property
    def stage_list(self) -> list[str]:
        """``stages`` as a list."""
        return [s.strip() for s in self.stages.split(",") if s.strip()]

    @property
    def method_list(self) -> list[str]:
        """``methods`` as a list of ranking names."""
        return [m.strip() for m in str(self.methods).split(",") if m.strip()]

    def settings(self) -> dict[str, Any]:
        """The run's ``args.json``: every field (``model_hashes`` once known), as
        :meth:`Options.settings`."""
        out = super().settings()
        if self.model_hashes is None:
            del out["model_hashes"]
        else:
            out["model_hashes"] = dict(self.model_hashes)
        return out

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ProtocolConfig:
        """The configuration an ``args.json`` records; a method named as in runs made
        before the method registry (``wu_nolima``) reads as its registered name.

        Raises:
            ConfigError: as the constructor.
        """
        from locos_tl.experiments.methods import current_name

        settings = dict(settings)
        if settings.get("methods"):
            settings["methods"] = ",".join(
                current_name(m.strip()) for m in str(settings["methods"]).split(","))
        return super().from_settings(settings)


def help_of(name: str) -> str:
    """The help of :class:`ProtocolConfig`'s field ``name`` (the command line's)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(ProtocolConfig)}[name]
