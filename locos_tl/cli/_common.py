"""Helpers shared by the ``locos`` commands: option checks that run before any model is
loaded, Ctrl-C handling with a resume hint, resume notes, and HTML figures that share one
``plotly.min.js``.

Only typer and the standard library are imported here at module level (the
command line must start without torch, TransformerLens or plotly).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer

PLOTLY_JS = "plotly.min.js"

# The click context class typer passes to a command's ``ctx`` parameter (typer >= 0.24
# vendors click; `typer.Context` is a subclass used for annotations, not what it passes,
# and the runtime type checks of the tests see the difference).
ClickContext = typer.Context.__bases__[0]


def fail(exc: Exception | str) -> NoReturn:
    """Print ``error: ...`` in red on stderr and exit with code 2."""
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=2)


def check_choice(value: str, allowed: Iterable[str], option: str) -> str:
    """``value`` if it is one of ``allowed``.

    Raises:
        typer.BadParameter: naming ``option`` and the accepted values (exit code 2).
    """
    allowed = list(allowed)
    if value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}",
                                 param_hint=f"'{option}'")
    return value


def method_choices() -> tuple[str, ...]:
    """The names ``--method`` accepts: the registry's
    (:data:`locos_tl.experiments.methods.METHODS`, which imports no torch), in its order."""
    from locos_tl.experiments.methods import method_names

    return method_names()


def method_help() -> str:
    """``locos score --method``'s help, from the registry: the shared decode pass's
    methods and those with their own forward passes."""
    from locos_tl.experiments.methods import method_names

    return (f"Comma-separated methods: {', '.join(method_names('decode_pass'))} share one "
            f"decode pass; {', '.join(method_names('own_passes'))} run their own forward "
            "passes, into OUT/<method>/.")


def check_methods(text: str, option: str = "--method") -> list[str]:
    """Comma-separated method names (``"locos,wu"``), each one of :func:`method_choices`.

    Raises:
        typer.BadParameter: no name, or an unknown one (the message lists the registered
            ones).
    """
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise typer.BadParameter("no method given", param_hint=f"'{option}'")
    for m in names:
        check_choice(m, method_choices(), option)
    return names


def check_dtype(dtype: str) -> str:
    """``dtype`` if :func:`locos_tl.models.load.load_model` accepts it.

    Raises:
        typer.BadParameter: an unknown dtype name.
    """
    from locos_tl.errors import ModelLoadError
    from locos_tl.models.load import resolve_dtype

    try:
        resolve_dtype(dtype)
    except ModelLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--dtype'") from None
    return dtype


# -- checks that need no model: --out, the checkpoint's config.json, the trials file --------
def check_out_dir(out: Path, option: str = "--out") -> Path:
    """``out`` if it can be a run directory: not an existing file, nor under one.

    Raises:
        typer.BadParameter: naming ``option`` (exit code 2).
    """
    for p in (out, *out.parents):
        if p.exists() and not p.is_dir():
            what = "is a file" if p == out else f"lies under the file {p}"
            raise typer.BadParameter(f"{out} {what}; give a directory for the run",
                                     param_hint=f"'{option}'")
    return out


def check_out_file(out: Path, option: str = "--out") -> Path:
    """``out`` if a file can be written there: not a directory, no file among its parents.

    Raises:
        typer.BadParameter: naming ``option`` (exit code 2).
    """
    if out.is_dir():
        raise typer.BadParameter(f"{out} is a directory; give a file name",
                                 param_hint=f"'{option}'")
    for p in out.parents:
        if p.exists() and not p.is_dir():
            raise typer.BadParameter(f"{out} lies under the file {p}",
                                     param_hint=f"'{option}'")
    return out


def checkpoint_dir(model: str) -> Path | None:
    """The local Hugging Face directory behind ``--model`` without loading it: the
    directory itself, or a registry model's / ``.gguf`` file's prepared directory
    (:func:`locos_tl.models.zoo.resolve_checkpoint`); None for a hub name.

    Raises:
        ModelLoadError: a registry model that is not fetched, a missing ``.gguf`` file.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from locos_tl.models.zoo import resolve_checkpoint
    except ImportError:  # pragma: no cover - the registry is optional
        return None
    found = resolve_checkpoint(model)
    return Path(found) if found is not None else None


def checkpoint_config(model: str) -> dict[str, Any] | None:
    """The language model's ``config.json`` of a local checkpoint (its ``text_config``
    for multimodal ones), read without loading the model; None when there is none."""
    import json

    path = checkpoint_dir(model)
    if path is None or not (path / "config.json").is_file():
        return None
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = cfg.get("text_config")
    return text if isinstance(text, dict) and "num_hidden_layers" in text else cfg


def checkpoint_n_ctx(model: str) -> int | None:
    """The context length (``max_position_embeddings``; ``n_positions``/``n_ctx`` for
    GPT-2-style configs) of a local checkpoint, None when unknown."""
    cfg = checkpoint_config(model) or {}
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    return None


def checkpoint_d_head(model: str) -> int | None:
    """Width of one head (``head_dim``, else ``hidden_size / num_attention_heads``) of a
    local checkpoint, None when unknown."""
    cfg = checkpoint_config(model) or {}
    if isinstance(cfg.get("head_dim"), int):
        return int(cfg["head_dim"])
    d, h = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return d // h if isinstance(d, int) and isinstance(h, int) and h else None


def check_length(model: str, lengths: Sequence[int], max_new_tokens: int,
                 option: str = "--length") -> None:
    """Refuse prompt ``lengths`` that, with ``max_new_tokens`` new tokens, do not fit the
    checkpoint's context (:func:`checkpoint_n_ctx`; nothing is checked when unknown),
    before any work.

    Raises:
        LocosError: naming the option, the checkpoint, its context and the longest
            prompt that fits.
    """
    from locos_tl.errors import LocosError

    n_ctx = checkpoint_n_ctx(model)
    if n_ctx is None or not lengths:
        return
    top = n_ctx - max_new_tokens + 1
    if max(lengths) > top:
        raise LocosError(
            f"{option} {max(lengths)} does not fit {Path(model).name}: its context is "
            f"{n_ctx} tokens (max_position_embeddings), which holds prompts of at most "
            f"{top} tokens plus the {max_new_tokens} new tokens decoded")


def model_key(model: str) -> str | None:
    """The name a run directory records for ``--model`` (``settings.model``, from
    :func:`locos_tl.models.load.model_name`) when it is known before loading: a zoo name
    itself, a cache entry's name (:func:`locos_tl.models.identity.identity_of`), the
    resolved path of any other local directory; None otherwise (then only the load can
    tell)."""
    from locos_tl.models.identity import identity_of
    from locos_tl.models.zoo import ELICITED_MODELS, REAL_MODELS

    path = Path(model).expanduser()
    if model in REAL_MODELS or model in ELICITED_MODELS or path.is_dir():
        return identity_of(model).name
    return None


def early_tokenizer(model: str) -> Any | None:
    """The checkpoint's own tokenizer, loaded alone (a second or two, against the
    model's load), for checking trials before the model loads; None when it cannot be
    had without the model (a hub name that is not cached, no tokenizer files): the
    trials are then checked after the load."""
    path = checkpoint_dir(model)
    name = str(path) if path is not None else model
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure: the model load reports it
        return None


def check_trial_records(path: Path) -> int:
    """Check a trials file without a tokenizer: every line JSON, each record a token
    record (``tokens``, ``needle_span``, ``answer``; spans checked) or a text record
    (``prompt``, ``needle``, ``answer``) whose needle occurs in its prompt.

    Returns:
        The number of trials.

    Raises:
        TrialError: naming the file and line; or the file holds no trial.
    """
    import json

    from locos_tl.errors import TrialError
    from locos_tl.trials import Trial

    n = 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise TrialError(f"{path}:{i}: not valid JSON ({exc})") from None
        if not isinstance(d, dict):
            raise TrialError(f"{path}:{i}: a trial record is a JSON object, got "
                             f"{type(d).__name__}")
        try:
            if "tokens" in d:
                Trial.from_dict(d)
            else:
                missing = [k for k in ("prompt", "needle", "answer") if k not in d]
                if missing:
                    raise TrialError(f"record lacks field(s) {missing} (a text record "
                                     "has prompt, needle, answer; a token record tokens, "
                                     "needle_span, answer)")
                if str(d["needle"]) not in str(d["prompt"]):
                    raise TrialError(f"needle {str(d['needle'])[:60]!r} not found in the "
                                     "prompt text")
        except TrialError as exc:
            raise TrialError(f"{path}:{i}: {exc}") from None
        n += 1
    if not n:
        raise TrialError(f"{path} holds no trial")
    return n


def read_trials_early(path: Path, model: str, *, n_ctx: int | None = None) -> list[Any] | None:
    """The trials of ``path``, read and checked before the model loads.

    With the checkpoint's tokenizer at hand (:func:`early_tokenizer`) they are loaded as
    :func:`locos_tl.trials.load_trials` does after the load (same tokens and spans), and
    checked against the context ``n_ctx`` (default: the checkpoint's); otherwise only
    :func:`check_trial_records` runs and None is returned (load them after the model).

    Raises:
        TrialError: broken JSON, a missing field, a needle not in its prompt or not on
            token boundaries, a prompt longer than the context (each naming the file
            and line), or no trial in the file.
    """
    from locos_tl.errors import TrialError
    from locos_tl.trials import load_trials

    tok = early_tokenizer(model)
    if tok is None:
        check_trial_records(path)
        return None
    trials = load_trials(path, tok, n_ctx=n_ctx if n_ctx is not None else checkpoint_n_ctx(model))
    if not trials:
        raise TrialError(f"{path} holds no trial")
    return trials


def trials_after_load(path: Path, bridge: Any, early: list[Any] | None) -> list[Any]:
    """``early`` (read before the load), else the trials of ``path`` read with the
    loaded model's tokenizer and context.

    Raises:
        TrialError: as :func:`read_trials_early`.
    """
    if early is not None:
        return early
    from locos_tl.errors import TrialError
    from locos_tl.trials import load_trials

    trials = load_trials(path, bridge.tokenizer, n_ctx=getattr(bridge.cfg, "n_ctx", None))
    if not trials:
        raise TrialError(f"{path} holds no trial")
    return trials


def check_run_dir(out: Path, trials: Sequence[Any], settings: dict[str, Any],
                  keys: Iterable[str], *, extend_field: str | None = None
                  ) -> dict[str, Any] | None:
    """Refuse, before anything is loaded or written, a run directory ``out`` that holds
    a run over other trials or with other ``settings`` (the rule of
    :class:`locos_tl.runs.records.RecordStore`, reading only). A setting given as None is
    not known yet and not compared (the loaded run checks it again). With
    ``extend_field`` (the record field naming a trial), a run over a subset of
    ``trials`` is accepted: it grows (``RecordStore(extend_to=...)``).

    Returns:
        The settings recorded in ``out`` (None: no run there yet).

    Raises:
        LocosError: the message names the settings that differ and the way out.
    """
    import json

    from locos_tl.errors import LocosError
    from locos_tl.runs.records import META_FILE, RECORDS_FILE, RecordStore
    from locos_tl.trials import trial_set_hash

    if not ((out / META_FILE).exists() and (out / RECORDS_FILE).exists()):
        return None
    try:
        old = json.loads((out / META_FILE).read_text()).get("settings", {})
    except (ValueError, AttributeError):
        raise LocosError(f"{out}/{META_FILE} is not valid JSON: use a new --out") from None
    known = {k: v for k, v in settings.items() if v is not None}
    new = dict(known, n_trials=len(trials), trial_set_hash=trial_set_hash(trials))
    extend = None if extend_field is None else {t.trial_id for t in trials}
    RecordStore(out, new, [k for k in keys if k in known], extend_to=extend,
                trial_field=extend_field or "trial_id")  # raises on a mismatch
    return old


def resume_command(ctx: ClickContext) -> str:
    """The command line that reruns the command of ``ctx`` (its click context) with the
    same options.

    Rebuilt from the parsed parameters (options left at their default are omitted), so
    it is exact however the command was started.
    """
    words = ["locos", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name is None:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name == "DEFAULT":
            continue
        value = ctx.params.get(param.name)
        if param.is_flag and param.secondary_opts:
            words.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            if value:
                words.append(param.opts[0])
        elif value is not None:
            for v in (value if param.multiple else [value]):
                words += [param.opts[0], str(v)]
    return shlex.join(words)


@contextmanager
def resumable(out: Path, ctx: ClickContext) -> Iterator[None]:
    """Turn Ctrl-C into a message with the command that resumes the run (``ctx``: the
    command's click context), and exit with code 130."""
    try:
        yield
    except KeyboardInterrupt:
        typer.secho(f"\ninterrupted: the finished trials are saved in {out}/. To resume, run "
                    f"the same command again:\n  {resume_command(ctx)}",
                    err=True, fg=typer.colors.YELLOW)
        raise typer.Exit(code=130) from None


def note_resume(out: Path, n_done: int, n_total: int | None = None,
                what: str = "trials") -> None:
    """Say on stderr how many finished ``what`` a resumed run skips (nothing when none).

    Passed as ``on_resume=partial(note_resume, out)`` to the function that runs the work
    (``score_trials``, ``evaluate``, ``patch_heads``), so the count is its own reuse rule,
    said once the run directory is accepted."""
    if n_done:
        of = f" of {n_total}" if n_total is not None else ""
        typer.secho(f"resuming {out}: skipping {n_done}{of} finished {what}",
                    err=True, fg=typer.colors.CYAN)


def write_figure(fig: Any, path: Path, js_dir: Path | None = None) -> Path:
    """Write a plotly figure as HTML that loads ``plotly.min.js`` from a file, offline.

    The bundle is written once into ``js_dir`` (default: the figure's folder) and every
    figure references it by a relative path, instead of each file embedding 4.8 MB.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    js_dir = path.parent if js_dir is None else Path(js_dir)
    if js_dir.resolve() == path.parent.resolve():
        fig.write_html(path, include_plotlyjs="directory")  # plotly writes the bundle
        return path
    bundle = js_dir / PLOTLY_JS
    if not bundle.exists():
        from plotly.offline import get_plotlyjs

        js_dir.mkdir(parents=True, exist_ok=True)
        bundle.write_text(get_plotlyjs(), encoding="utf-8")
    rel = Path(os.path.relpath(bundle, path.parent)).as_posix()
    fig.write_html(path, include_plotlyjs=rel)
    return path
