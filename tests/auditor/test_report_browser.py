"""report.html in a real browser: headless Chromium (Debian's ``chromium``) at 800 and 1400 px.

The checks run inside the page: a probe script is put first in ``<head>`` (so it sees every
console error and uncaught exception of the page) and writes its findings into the DOM once
the page has loaded; ``chromium --dump-dom`` returns them. Checked: no console errors,
every image decodes (loaded, with a non-zero natural size), nothing sticks out past the
window's width except inside a box that scrolls by itself (the results table's), and the
page itself does not scroll sideways. ``.ci/run`` installs Debian's chromium where
apt-get can; elsewhere the test skips and says why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.auditor.test_legacy_log import FIXTURE, RUNS

pytestmark = pytest.mark.slow

PROBE = r"""<script>
(function () {
  var errors = [];
  var origError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    return origError.apply(console, arguments);
  };
  window.addEventListener("error", function (e) {
    errors.push("uncaught: " + (e.message || (e.target && e.target.outerHTML) || "?"));
  }, true);
  function scrollsItself(el) {
    for (var p = el.parentElement; p; p = p.parentElement) {
      var s = getComputedStyle(p);
      if (s.overflowX === "auto" || s.overflowX === "scroll" || s.overflowX === "hidden") {
        return p.getBoundingClientRect().right <= window.innerWidth + 0.5;
      }
    }
    return false;
  }
  window.addEventListener("load", function () {
    var imgs = Array.prototype.slice.call(document.images);
    // after "load" every image has loaded or failed: a decoded image has a natural size
    var broken = [];
    imgs.forEach(function (im) {
      if (!(im.complete && im.naturalWidth > 0 && im.naturalHeight > 0)) {
        broken.push("does not decode: " + im.alt);
      }
    });
    (function () {
      var over = [];
      Array.prototype.forEach.call(document.body.querySelectorAll("*"), function (el) {
        var r = el.getBoundingClientRect();
        if (r.width > 0 && r.right > window.innerWidth + 0.5 && !scrollsItself(el)) {
          over.push(el.tagName + "." + el.className + " right=" + Math.round(r.right));
        }
      });
      // the verdict cards must be in the first screen; a verdict word never wraps
      var cards = Array.prototype.slice.call(document.querySelectorAll(".card"));
      var below = cards.filter(function (c) {
        return c.getBoundingClientRect().bottom > window.innerHeight;
      }).map(function (c) { return c.textContent.slice(0, 60); });
      var broken_words = [];
      Array.prototype.forEach.call(document.querySelectorAll(".badge, td.nw"), function (el) {
        var lh = parseFloat(getComputedStyle(el).fontSize) * 1.9;
        var rects = el.getClientRects();
        if (rects.length > 1 || (rects.length && rects[0].height > lh + 8 &&
            el.tagName !== "TD")) {
          broken_words.push(el.textContent);
        }
        if (el.tagName === "TD" && el.scrollWidth > el.clientWidth + 1) {
          broken_words.push("cut: " + el.textContent);
        }
      });
      var out = document.createElement("pre");
      out.id = "dpicl-probe";
      out.textContent = JSON.stringify({
        width: window.innerWidth,
        scrollWidth: document.documentElement.scrollWidth,
        images: imgs.length,
        broken: broken,
        overflow: over.slice(0, 20),
        cards: cards.length,
        belowFold: below,
        brokenWords: broken_words.slice(0, 20),
        errors: errors
      });
      document.body.appendChild(out);
    })();
  });
})();
</script>"""


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _probe(browser: str, html: Path, width: int, tmp: Path) -> dict[str, object]:
    page = tmp / f"probe-{width}.html"
    text = html.read_text(encoding="utf-8")
    page.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},1000",
            f"--user-data-dir={tmp / f'profile-{width}'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.search(r'<pre id="dpicl-probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the probe did not report (rc {proc.returncode}): {proc.stderr[-2000:]}"
    raw = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    result: dict[str, object] = json.loads(raw.replace("&amp;", "&"))
    return result


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One combined report of every kind of run (voting real and bootstrap, ESA, DPS-MOZO)."""
    from dpicl_audit.report import write_report

    tmp = tmp_path_factory.mktemp("browser")
    db = tmp / "log.db"
    shutil.copy(FIXTURE, db)
    return write_report(list(RUNS), f"sqlite:///{db}", tmp, name="all")


@pytest.mark.parametrize("width", [800, 1400])
def test_report_in_headless_chromium(report_html: Path, width: int, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip(
            "no Chromium on PATH: install Debian's chromium package (.ci/run does so with "
            "apt-get where it can) to run the browser test of report.html"
        )
    res = _probe(browser, report_html, width, tmp_path)
    assert res["errors"] == [], res["errors"]
    assert res["images"] == 4 and res["broken"] == [], res  # 4 plots, every one decoded
    assert res["overflow"] == [], res["overflow"]
    assert res["scrollWidth"] <= res["width"], res  # type: ignore[operator]
    # one verdict card per run, all in the first 1000 px; no verdict broken mid-word
    assert res["cards"] == len(RUNS), res
    assert res["belowFold"] == [], res["belowFold"]
    assert res["brokenWords"] == [], res["brokenWords"]


def test_the_probe_sees_what_it_must(tmp_path: Path) -> None:
    """A positive control: a page with a wide block outside a scroll box, a broken image, a
    console error, a verdict card below the fold and a wrapped verdict badge is caught on
    all five counts."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on PATH (see test_report_in_headless_chromium)")
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><title>x</title></head><body>"
        "<div style='width:1500px'>wide</div>"
        "<img alt='broken' src='data:image/png;base64,AAAA'>"
        "<span class='badge' style='display:inline-block;width:3em'>NOT OK HERE</span>"
        "<div class='card' style='margin-top:1200px'>late card</div>"
        "<script>console.error('boom')</script></body></html>"
    )
    res = _probe(browser, bad, 800, tmp_path)
    assert any("boom" in e for e in res["errors"])  # type: ignore[union-attr]
    assert any("broken" in b for b in res["broken"])  # type: ignore[union-attr]
    assert res["overflow"]
    assert res["belowFold"] and "late card" in res["belowFold"][0]  # type: ignore[index]
    assert res["brokenWords"] == ["NOT OK HERE"], res["brokenWords"]


PHONE_PROBE = r"""<script>
window.addEventListener("load", function () {
  // The results table at phone width: it must fit the window (no sideways scrolling inside
  // its box), and no run name may be broken inside a word ("de / mo / ora / cle").
  var table = document.querySelector("table.results");
  var box = table.parentElement;
  var split = [];
  Array.prototype.forEach.call(table.querySelectorAll("td.name"), function (td) {
    var longest = td.textContent.split(/\s+/).reduce(function (a, b) {
      return b.length > a.length ? b : a;
    }, "");
    var probe = document.createElement("span");
    probe.style.whiteSpace = "nowrap";
    probe.textContent = longest;
    td.appendChild(probe);
    var need = probe.getBoundingClientRect().width;
    td.removeChild(probe);
    var room = td.getBoundingClientRect().width;
    if (need > room) { split.push(longest); }
  });
  // Every other table of the page (ledger, conformance, from outside, ROC, noise check):
  // at phone width each is blocks of "header: value" that fit without scrolling sideways.
  var stackScrolls = [];
  Array.prototype.forEach.call(document.querySelectorAll("table.stack"), function (t) {
    var b = t.parentElement;
    var right = t.getBoundingClientRect().right;
    if (b.scrollWidth > b.clientWidth + 1 || right > window.innerWidth + 1) {
      stackScrolls.push(t.textContent.slice(0, 60));
    }
  });
  // Inside the phone-sized frame the findings go to the top page, which --dump-dom prints.
  var top = window.parent !== window ? window.parent.document : document;
  var out = top.createElement("pre");
  out.id = "dpicl-probe";
  out.textContent = JSON.stringify({
    width: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    tableRight: table.getBoundingClientRect().right,
    boxScrolls: box.scrollWidth > box.clientWidth + 1,
    rows: table.querySelectorAll("tr").length,
    split: split,
    stacks: document.querySelectorAll("table.stack").length,
    stackScrolls: stackScrolls,
    overall: !!document.getElementById("overall"),
    errors: []
  });
  top.body.appendChild(out);
});
</script>"""


@pytest.mark.parametrize("phone", [420, 390])
def test_results_table_at_phone_width(report_html: Path, tmp_path: Path, phone: int) -> None:
    """At 420 px (issue 39, item 15) and 390 px (issue 45) the results table is one card per
    row that fits the window: nothing to scroll sideways, no run name broken inside a word;
    every other table is blocks that fit too, and the page opens with the overall verdict."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on PATH (see test_report_in_headless_chromium)")
    page = tmp_path / "phone.html"
    page.write_text(report_html.read_text(encoding="utf-8"), encoding="utf-8")
    res = _probe_with(browser, page, phone, tmp_path, PHONE_PROBE)
    assert res["scrollWidth"] <= res["width"], res  # type: ignore[operator]
    assert res["tableRight"] <= res["width"] and not res["boxScrolls"], res  # type: ignore[operator]
    assert res["rows"] > len(RUNS) and res["split"] == [], res  # type: ignore[operator]
    assert res["stacks"] and res["stackScrolls"] == [], res  # type: ignore[operator]
    assert res["overall"], res
    # The same probe at a desktop width sees the one wide table (a control: the cards are the
    # phone's layout only).
    wide = _probe_with(browser, page, 1400, tmp_path, PHONE_PROBE)
    assert wide["split"] == [] and not wide["boxScrolls"], wide


def _probe_with(browser: str, html: Path, width: int, tmp: Path, probe: str) -> dict[str, object]:
    """``probe`` run in ``html`` seen ``width`` px wide. Headless Chromium's window is at least
    500 px wide, so the page is shown in a frame of that width inside a wider window."""
    page = tmp / f"with-{width}.html"
    page.write_text(
        html.read_text(encoding="utf-8").replace("<head>", "<head>" + probe, 1), encoding="utf-8"
    )
    frame = tmp / f"frame-{width}.html"
    frame.write_text(
        "<!DOCTYPE html><html><head><style>body{margin:0}iframe{border:0}</style></head><body>"
        f"<iframe src='{page.name}' width='{width}' height='1000'></iframe></body></html>",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--allow-file-access-from-files",
            f"--window-size={max(width, 500) + 40},1000",
            f"--user-data-dir={tmp / f'profile-w{width}'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            frame.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.search(r'<pre id="dpicl-probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the probe did not report (rc {proc.returncode}): {proc.stderr[-2000:]}"
    raw = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    result: dict[str, object] = json.loads(raw.replace("&amp;", "&"))
    assert result["width"] == width, result  # the page really was seen at that width
    return result


def test_run_colours_are_never_the_colours_of_a_verdict() -> None:
    """Red, orange and yellow mean something is wrong (violation, bug): no run is drawn in
    them (issue 39: a run drawn in red read as a violation on a card that said ok)."""
    import colorsys

    from dpicl_audit.report.plots import _COLORS

    for colour in _COLORS:
        r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
        hue, _, sat = colorsys.rgb_to_hls(r, g, b)
        warm = hue * 360 < 65 or hue * 360 > 330
        assert not (warm and sat > 0.25), colour
