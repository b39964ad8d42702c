"""MkDocs hooks: pages made from the code when the site builds (``mkdocs.yml`` names this file).

The configuration page's table is ``gt_core.options``' fields: each one's environment variable,
its default as ``Options()`` has it, and what it does (``gt_core.options_help.HELP``); the
architecture page's lifecycle tables are the ones the code moves by (a hot path's:
``gt_core.observe.status.TRANSITIONS``; a jit call key's: ``gt_core.observe.jit_states``), so
the pages cannot drift from the code.
"""

from __future__ import annotations

import dataclasses

PLACEHOLDER = "{{ options_table }}"
LIFECYCLE = "{{ hot_path_lifecycle }}"


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


def hot_path_lifecycle() -> str:
    from gt_core.observe.status import TRANSITIONS

    rows = ["| from | to | when |", "|---|---|---|"]
    for state, moves in TRANSITIONS.items():
        if not moves:
            rows.append(f"| `{state}` | (final) | |")
        rows += [f"| `{state}` | `{to}` | {when} |" for to, when in moves.items()]
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' hook)
    if PLACEHOLDER in markdown:
        markdown = markdown.replace(PLACEHOLDER, options_table())
    if LIFECYCLE in markdown:
        markdown = markdown.replace(LIFECYCLE, hot_path_lifecycle())
    return markdown
