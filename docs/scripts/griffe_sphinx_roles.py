"""Griffe extension for the API reference: Sphinx roles in docstrings become code spans.

The docstrings cross-reference with reST roles (``:func:`~locos_tl.score_trials```),
which Markdown would print verbatim; this rewrites each to a code span of the name
(the last component when the role has ``~``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def _sub(m: re.Match[str]) -> str:
    name = m.group(2).strip()
    return f"`{name.rsplit('.', 1)[-1] if m.group(1) else name}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_sub, obj.docstring.value)
