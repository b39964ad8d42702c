"""MkDocs hooks: pages made from the code when the site builds (``mkdocs.yml`` names this file).

The configuration page's table is ``gt_core.options``' fields: each one's environment variable,
its default as ``Options()`` has it, and what it does (``gt_core.options_help.HELP``), so the
page cannot drift from the code.
"""

from __future__ import annotations

import dataclasses

PLACEHOLDER = "{{ options_table }}"


def options_table() -> str:
    from gt_core.options import ENV, Options
    from gt_core.options_help import HELP

    variables: dict[str, list[str]] = {}
    for var, key in ENV.items():
        variables.setdefault(key, []).append(var)
    defaults = Options()
    rows = ["| variable | option | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Options):
        if f.name not in variables:
            continue  # (derived from another option: ``signals`` from ``config``)
        value = getattr(defaults, f.name)
        default = "none" if value in (None, (), {}) else f"`{_text(value)}`"
        var = " / ".join(f"`{v}`" for v in variables[f.name])
        rows.append(f"| {var} | `{f.name}` | {default} | {HELP[f.name]} |")
    return "\n".join(rows)


def _text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' hook)
    if PLACEHOLDER in markdown:
        return markdown.replace(PLACEHOLDER, options_table())
    return markdown
