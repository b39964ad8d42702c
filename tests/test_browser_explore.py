"""The explorer as people see it: ``%gt explore`` in JupyterLab in headless Chromium.

It opens, its selector switches the graph, a node's source line shows, the Code tab shows
inductor's generated code, the page logs no errors, and the saved notebook keeps a static
copy of the view. Same fixtures as the dashboard's browser tests (tests/test_browser.py).
"""

from __future__ import annotations

import time

import _lab
import pytest
from test_browser import Page, _wait, browser, lab, run_all, shots  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.inductor]

TRAIN = """%%gt --backend inductor
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in (16, 8):  # two shapes: two hot paths to choose from
    x, y = torch.randn(batch, 64), torch.randn(batch, 4)
    for step in range(200):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
"""
WAIT = "import gt_core; gt_core.wait(compiles=True, timeout=400)"
EXPLORE = "%gt explore"
PAGE_BYTES = 500_000  # an explorer on the page, at most


def _title(p) -> str:
    figure = p.locator(".widget-output .js-plotly-plot").first
    return figure.locator(".gtitle").first.text_content() or ""


def test_the_explorer_opens_switches_and_shows_lines_and_code(lab, browser, shots):  # noqa: F811
    _lab.write_notebook(lab.root / "explore.ipynb", ["%load_ext gt_jupyter", TRAIN, WAIT, EXPLORE])
    page = Page(browser, lab, "explore.ipynb")
    shots.append(page)
    p = page.page
    run_all(p)
    t0 = time.monotonic()
    selects = p.locator(".widget-dropdown select")
    assert _wait(lambda: selects.count() >= 2, 500), "the explorer did not open"
    assert _wait(lambda: p.locator(".widget-output .js-plotly-plot").count() >= 1, 60)
    print(f"\nexplorer: open {time.monotonic() - t0:.1f} s after run-all")
    errors = {"open": len(page.real_errors())}  # console errors so far, by step
    # -- the selector switches the graph
    shown = _title(p)
    values = selects.nth(0).locator("option").all_text_contents()
    other = next(v for v in values if v.split()[2] not in shown)
    selects.nth(0).select_option(label=other)
    assert _wait(lambda: _title(p) != shown and other.split()[2] in _title(p), 30)
    errors["selector"] = len(page.real_errors())
    # -- open every group, pick an op: its line shows
    groups = p.locator(".widget-select-multiple select").first
    groups.select_option(label=groups.locator("option").all_text_contents())
    node = p.locator(".widget-dropdown select").nth(1)
    assert _wait(lambda: any("addmm" in o for o in node.locator("option").all_text_contents()), 30)
    node.select_option(
        label=next(o for o in node.locator("option").all_text_contents() if "addmm" in o)
    )
    detail = lambda: " ".join(p.locator(".widget-html table").all_inner_texts())  # noqa: E731
    assert _wait(lambda: "mse_loss(model(x), y)" in detail(), 30), detail()
    errors["node"] = len(page.real_errors())
    # -- the Code tab: inductor's generated code
    p.locator(".lm-TabBar-tab", has_text="Code").first.click()
    code = lambda: " ".join(p.locator(".widget-html pre").all_inner_texts())  # noqa: E731
    assert _wait(lambda: "def call(" in code(), 30), code()[:300]
    errors["code"] = len(page.real_errors())
    assert page.real_errors() == [], (errors, page.real_errors())
    # -- what the page received for the explorer: its widgets' state, figures and updates
    start = next(
        t for t, kind, _, c in page.messages if kind == "execute_input" and EXPLORE in c["code"]
    )
    kinds = ("display_data", "update_display_data", "comm_open", "comm_msg")
    sent = sum(n for t, kind, n, _ in page.messages if t >= start and kind in kinds)
    print(f"explorer: {sent} bytes on the kernel's websocket, open to the Code tab")
    assert sent <= PAGE_BYTES
    # -- saved: the static copy of the current view (the Code tab) is in the notebook
    p.locator('.jp-Toolbar [data-command="docmanager:save"]').first.click()
    saved = lambda: "gt explore</b>" in (lab.root / "explore.ipynb").read_text()  # noqa: E731
    assert _wait(saved, 30), "the notebook was not saved with the explorer's static copy"
    # -- a reload with the kernel alive shows the explorer again
    p.reload()
    p.wait_for_selector(".jp-Notebook .jp-Cell", state="attached", timeout=60_000)
    assert _wait(lambda: p.locator(".widget-dropdown select").count() >= 2, 60)
    assert "Error displaying widget" not in p.content()
    assert page.real_errors() == [], page.real_errors()
