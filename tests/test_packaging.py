"""pyproject metadata: an SPDX license expression (no setuptools deprecation warning)."""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_expression_setuptools_accepts_silently(monkeypatch):
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(REPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the TOML-table form warns (deprecated)
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "MIT"
    # setuptools understands the string form from version 77 on: the build requires it
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    version = next(re.fullmatch(r"setuptools>=(\d+)", r) for r in requires if "setuptools" in r)
    assert version and int(version.group(1)) >= 77
