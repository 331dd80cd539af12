"""The report in a real headless Chromium (Debian's `chromium`, driven by playwright): it loads, nothing errors, the
DAG and the plots are drawn, no hostile string became markup; a screenshot lands in the test's tmp dir."""

import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.flagship import rendered
from tests.report_runs import curves, page_of

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless, and none of the background connections this machine's closed network refuses.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--headless",
]

WIDTH = 1400  # a laptop's browser window, in CSS pixels
MIN_LABEL_PX = 11
# The smallest text of the DAG as drawn: its font size times the scale the SVG is shown at.
LABEL_PX = """
(() => {
  const svg = document.querySelector("svg.dag");
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  const sizes = [...svg.querySelectorAll("text")].map(t => parseFloat(getComputedStyle(t).fontSize) * scale);
  return Math.min(...sizes);
})()
"""

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).is_file(),
    reason="no chromium binary: install Debian's `chromium` (`make browser` does, as root) to run the browser test",
)


def flagship_tasks() -> list[str]:
    """Every task of the flagship's DAGs: the page draws each once."""
    templates = rendered()["spec"]["templates"]
    return [task["name"] for t in templates if "dag" in t for task in t["dag"]["tasks"]]


def test_the_report_renders_in_headless_chromium_with_its_plots_and_no_errors(tmp_path):
    page_file = tmp_path / "report.html"
    page_file.write_text(page_of(tmp_path / "state", "succeeded", hostile=True, runs=[curves()]), encoding="utf-8")
    errors: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            page.on("pageerror", lambda err: errors.append(f"page error: {err}"))
            page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(page_file.as_uri(), wait_until="load")

            assert page.title().endswith("llama-lora-t3st1")
            assert page.locator("svg.dag g.task").count() == len(flagship_tasks())  # main DAG and exit handler
            assert page.locator("svg.chart polyline.series").count() == 2  # loss, learning rate
            assert page.locator("svg.bars rect.bar").count() == 5  # base and tuned of 2 metrics, champion of 1
            assert page.locator("script, img, iframe").count() == 0  # the hostile strings stayed text
            dag_box = page.locator("svg.dag").bounding_box()
            assert dag_box is not None and dag_box["width"] > 600 and dag_box["height"] > 100
            assert page.get_by_text("gate PASSED").is_visible()
            # Nothing widens the page (a long output in "Tasks and outputs" did at 1,400 px); the DAG's labels read
            # at its own size, which scrolls in its box (scaled to the page they were ~6 px).
            assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
            tasks = page.locator("section", has=page.get_by_role("heading", name="Tasks and outputs"))
            assert tasks.evaluate("section => section.scrollWidth <= section.clientWidth")
            assert page.evaluate(LABEL_PX) >= MIN_LABEL_PX
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == [] and dialogs == []
    assert shot.stat().st_size > 20_000
