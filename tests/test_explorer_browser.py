"""The explorer in a real browser: JupyterLab (started as `make lab` starts it) with
notebooks/explore.ipynb open in Debian's headless Chromium, driven by Playwright. Runs every cell,
waits for Table 1, changes the region set with its widget, presses Run, waits for Table 1 to be
redrawn for that region set, and saves a screenshot to build/explorer.png.

Chromium is Debian's (``$CARBONROUTER_CHROMIUM``, default /usr/bin/chromium; `make test` installs
it with apt-get when missing and root). Without it the test is skipped with the reason, or fails
where ``CARBONROUTER_REQUIRE_BROWSER=1`` (CI). Every wait is bounded; the server and the browser
are always stopped. A copy of the notebook is served, so the one in notebooks/ never gets outputs.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from labserver import running_lab

from carbonrouter_lib import notebooks

CHROMIUM = Path(os.environ.get("CARBONROUTER_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOT = notebooks.REPO_DIR / "build" / "explorer.png"
FAILURE_SCREENSHOT = SCREENSHOT.with_name("explorer-failure.png")
# Flags that work on machines with no network beyond package registries: no background
# connections, no GPU, no sandbox (CI runs as root).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
# Bounds of the waits, ms: JupyterLab's page and kernel; the first run of the quick preset (it
# may build the workload and carbon caches on a fresh clone); a rerun of a few quick replays.
PAGE_MS, FIRST_RUN_MS, RERUN_MS = 90_000, 180_000, 90_000


def _chromium_or_skip() -> Path:
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    reason = (f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium with apt-get "
              f"when run as root; otherwise apt-get install chromium (or set "
              f"CARBONROUTER_CHROMIUM)")
    if os.environ.get("CARBONROUTER_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + " — required here (CARBONROUTER_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


def test_explorer_runs_in_jupyterlab_in_chromium(tmp_path):
    chromium = _chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(notebooks.NOTEBOOK_DIR / "explore.ipynb", root / "explore.ipynb")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with running_lab(root, tmp_path / "jupyter") as lab, sync_playwright() as pw:
        # A fresh profile of our own; Playwright never downloads a browser here.
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(chromium), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1500, "height": 1500})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(PAGE_MS)  # actions
            expect.set_options(timeout=PAGE_MS)  # assertions (Playwright's default is 5 s)
            page.goto(f"{lab.url}/lab/tree/explore.ipynb?token={lab.token}")
            notebook = page.locator(".jp-NotebookPanel").first
            expect(notebook).to_be_visible()
            # The notebook's own kernel, started and idle (a missing kernel would open a dialog).
            expect(page.locator(".jp-Toolbar-kernelName").first).to_have_text(
                notebooks.KERNEL_DISPLAY_NAME)
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
                   .first).to_be_attached()

            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()

            # Text printed into the explorer's Output widget (the line on the replay's scale).
            printed = notebook.locator(".jp-RenderedText")
            table = notebook.locator("table.dataframe")
            # Table 1, or an error (shown at once rather than after the whole wait).
            expect(table.or_(_errors(notebook)).first).to_be_visible(timeout=FIRST_RUN_MS)
            _assert_no_error(notebook, lab)
            expect(table).to_have_count(1)
            expect(table).to_contain_text("session-affinity")
            expect(table).to_contain_text("carbonrouter")
            expect(notebook.get_by_text("Table 1", exact=True)).to_be_visible()
            expect(notebook.locator(".jp-RenderedImage img")).to_have_count(1)  # the figure
            expect(printed.filter(has_text="on 'paper'")).to_have_count(1)

            # A widget changes the setting; Run redraws Table 1 in place for it.
            notebook.locator(".widget-dropdown", has_text="regions").locator("select") \
                .select_option("em-only")
            notebook.locator("button.jupyter-button", has_text="Run").click()
            redrawn = printed.filter(has_text="on 'em-only'")
            expect(redrawn.or_(_errors(notebook)).first).to_be_visible(timeout=RERUN_MS)
            _assert_no_error(notebook, lab)
            expect(redrawn).to_have_count(1)
            expect(printed.filter(has_text="on 'paper'")).to_have_count(0)
            expect(table).to_have_count(1)
            expect(notebook.locator(".widget-html", has_text="done in")).to_be_visible()

            figure = notebook.locator(".jp-RenderedImage img")
            expect(figure).to_have_count(1)
            figure.evaluate("img => img.decode()")  # drawn, not still loading
            # The controls, the line on the replay, Table 1 and the figure in one picture.
            notebook.locator("button.jupyter-button", has_text="preset: quick").evaluate(
                "el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SCREENSHOT))
        except Exception:
            # What the page showed, for the failure's reader (CI keeps build/).
            page.screenshot(path=str(FAILURE_SCREENSHOT))
            raise
        finally:
            context.close()
    elapsed = time.perf_counter() - t0
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 20_000, SCREENSHOT
    print(f"explorer in Chromium: {elapsed:.1f} s, screenshot {SCREENSHOT}")


def _errors(notebook):
    """Tracebacks shown in the notebook (cells' outputs and the explorer's Output widget; Lab
    renders an error as stderr), and the explorer's "failed" status."""
    traceback = notebook.locator("[data-mime-type='application/vnd.jupyter.stderr']",
                                 has_text=re.compile(r"Traceback|\w+Error\b"))
    return traceback.or_(notebook.locator(".widget-html", has_text="failed"))


def _assert_no_error(notebook, lab) -> None:
    shown = _errors(notebook).all_inner_texts()
    if shown:
        raise AssertionError("the explorer shows an error:\n" + "\n".join(shown)
                             + f"\nend of the server's log:\n{lab.log_tail(1500)}")
