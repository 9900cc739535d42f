"""mkdocs hook: the command-line reference is generated from the typer app at build time.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; it is replaced by the
``--help`` of every ``locos`` command (typer's own Markdown renderer), so the page can
never drift from the code.
"""

from __future__ import annotations

import re

MARKER = "<!-- cli-reference -->"


def cli_reference() -> str:
    import typer
    import typer.main
    from typer.cli import get_docs_for_click

    from locos_tl.cli import app

    cmd = typer.main.get_command(app)
    text = get_docs_for_click(obj=cmd, ctx=typer.Context(cmd), name="locos")
    # one heading level down: the page title is the only H1
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
