"""Where the checkpoints that ship with locos_tl live: the model organisms and the LoRA
adapters of the elicited models.

In a source checkout they sit in the repository's ``data/organisms/``;
``locos_tl/organisms_data`` links there, and a built wheel installs the same files as
``locos_tl/organisms_data/``. So one path serves a clone, an editable install and a
wheel.
"""

from __future__ import annotations

from pathlib import Path

from locos_tl.errors import ModelLoadError

#: the shipped checkpoints' folder (``data/organisms`` of a checkout, package data of a wheel)
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "organisms_data"


def shipped_path(*parts: str, root: Path | None = None) -> Path:
    """A file or folder under :data:`SHIPPED_DIR`, checked to exist.

    Args:
        parts: path components below the shipped folder, e.g. ``("retrieval-long",)`` or
            ``("smollm2-135m-nolima", "adapter", "adapter_model.safetensors")``.
        root: the shipped folder (default :data:`SHIPPED_DIR`).

    Raises:
        ModelLoadError: the path is missing from this installation (names it and says
            how to reinstall).
    """
    path = (SHIPPED_DIR if root is None else root).joinpath(*parts)
    if not path.exists():
        raise ModelLoadError(
            f"{'/'.join(parts)} is missing from this installation of locos_tl ({path}); "
            "it ships with the package: reinstall it (pip install --force-reinstall "
            "locos_tl) or, in a clone, restore data/organisms (git checkout -- data)")
    return path
