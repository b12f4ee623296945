"""Measures how the built guide fits a laptop and a phone.

Opens every chapter of guide/book (built by `mdbook build guide`) in headless
Chromium at each width (1280 and 390 CSS px unless told otherwise; a width
under 600 px is emulated as a phone, so the page's viewport tag applies) and
counts, per page:

  code, wide       code blocks, and those whose lines are wider than their
                   box (they scroll sideways inside it)
  tables, wide     tables, and those wider than their box
  unpinned         wide tables whose first column leaves the box when it is
                   scrolled to its end (a first column wider than the box
                   cannot stay)
  cramped          pinned tables with a cell wider than the room beside the
                   first column: it is only ever seen in pieces
  cut              elements that reach past a box that hides them instead
                   of scrolling: content a reader cannot get to
  sideways         whether the page itself scrolls sideways (something wide
                   that no box of its own holds)
  figures, small   figures, and those whose smallest text renders under
                   12 px at this width
  unlinked         figures that do not link to themselves, full size

    mdbook build guide && python3 scripts/guide_widths.py
    python3 scripts/guide_widths.py --list 390          # each wide block
    python3 scripts/guide_widths.py --page phase2/launching.html

Needs Python 3.9+ and Chromium (CHROMIUM, or chromium on the PATH), nothing
else: it speaks the DevTools protocol over --remote-debugging-pipe. Not part
of any test; a run over the whole guide takes under half a minute.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "guide" / "book"
SUMMARY = ROOT / "guide" / "src" / "SUMMARY.md"
PHONE = 600  # at or under this width, emulate a phone
SMALLEST_TEXT = 12.0  # px: a figure's text below this is hard to read

# Runs in each page once it has loaded; returns what the page shows.
MEASURE = r"""
(async () => {
  await document.fonts.ready;
  const main = document.querySelector('main');
  const px = (v) => Math.round(v * 10) / 10;
  const scrolls = (e) => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const clips = (e) => getComputedStyle(e).overflowX !== 'visible';
  const label = (e) => (e.textContent || '').trim().split('\n')[0].slice(0, 60);
  const out = {code: [], tables: [], cut: [], figures: [], page: null};

  for (const pre of main.querySelectorAll('pre')) {
    // mdBook's code box is pre > code.hljs, which scrolls; pre holds it.
    const box = pre.querySelector(':scope > code') || pre;
    const lines = box.textContent.replace(/\n$/, '').split('\n');
    out.code.push({
      label: label(box),
      columns: Math.max(...lines.map((l) => [...l].length)),
      box: box.clientWidth, content: box.scrollWidth,
      wide: box.scrollWidth > box.clientWidth + 1,
    });
  }

  for (const table of main.querySelectorAll('table')) {
    const box = table.closest('.table-wrapper') || table.parentElement;
    const wide = box.scrollWidth > box.clientWidth + 1;
    let pinned = null;
    if (wide) {
      // Scroll to the far end: a pinned first column stays at the box's left.
      const cells = [...table.querySelectorAll('tr > :first-child')];
      const before = box.scrollLeft;
      box.scrollLeft = box.scrollWidth;
      const left = box.getBoundingClientRect().left + box.clientLeft;
      pinned = box.scrollLeft > 0 && cells.length > 0 && cells.every(
        (c) => Math.abs(c.getBoundingClientRect().left - left) <= 1);
      box.scrollLeft = before;
    }
    const width = (c) => c.getBoundingClientRect().width;
    const rows = [...table.rows];
    const first = Math.max(0, ...rows.filter((r) => r.cells[0]).map((r) => width(r.cells[0])));
    const rest = Math.max(0, ...rows.flatMap((r) => [...r.cells].slice(1).map(width)));
    out.tables.push({
      label: label(table.querySelector('th, td') || table),
      columns: table.rows[0] ? table.rows[0].cells.length : 0,
      first, rest, box: box.clientWidth, content: box.scrollWidth,
      wide, scrolls: scrolls(box), pinned,
      // A column wider than the room beside the pinned one is never seen whole.
      cramped: wide && !!pinned && rest > box.clientWidth - first + 1,
    });
  }

  // Something reaching past the nearest box that clips it: cut off if that
  // box hides what overflows, fine if the box is its own scroller.
  const content = document.querySelector('.content') || document.body;
  const cutOff = new Set();
  for (const e of main.querySelectorAll('*')) {
    // A box that hides what overflows it, rather than scrolling.
    if (clips(e) && !scrolls(e) && e.scrollWidth > e.clientWidth + 1) {
      cutOff.add(e);
      out.cut.push({tag: e.tagName.toLowerCase(), label: label(e),
                    right: px(e.getBoundingClientRect().left + e.scrollWidth),
                    limit: px(e.getBoundingClientRect().left + e.clientWidth)});
    }
  }
  for (const e of main.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || [...cutOff].some((c) => c.contains(e))) continue;
    let a = e.parentElement;
    while (a && a !== document.documentElement && !clips(a)) a = a.parentElement;
    if (!a || a === document.documentElement) continue;
    const ar = a.getBoundingClientRect();
    const right = ar.left + a.clientLeft + a.clientWidth;
    if (r.right <= right + 1 && r.left >= ar.left - 1) continue;
    if (scrolls(a) && a !== content && main.contains(a)) continue;
    if (a === content && scrolls(a)) continue;  // counted as the page's own scroll
    cutOff.add(e);
    out.cut.push({tag: e.tagName.toLowerCase(), label: label(e),
                  right: px(r.right), limit: px(right)});
  }
  out.page = {width: document.documentElement.clientWidth,
              content: content.scrollWidth, box: content.clientWidth,
              scrolls: content.scrollWidth > content.clientWidth + 1};

  for (const img of main.querySelectorAll('img')) {
    const link = img.closest('a');
    const src = img.getAttribute('src');
    out.figures.push({
      src, rendered: img.getBoundingClientRect().width, natural: img.naturalWidth,
      linked: !!link && new URL(link.href).pathname === new URL(img.src).pathname,
    });
  }
  return out;
})()
"""


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe."""

    def __init__(self, binary):
        self.profile = tempfile.TemporaryDirectory(prefix="guide-widths-")
        # Chromium reads commands on its fd 3 and writes replies on its fd 4.
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()

        def child_fds():
            # Copied out of the way first: either pipe may already sit on 3 or 4.
            read, write = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", "--hide-scrollbars",
             f"--user-data-dir={self.profile.name}", "about:blank"],
            preexec_fn=child_fds, pass_fds=(3, 4),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.reader = os.fdopen(self.from_browser, "rb")
        self.buffer = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.receive()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def receive(self):
        while b"\0" not in self.buffer:
            chunk = self.reader.read1(1 << 16)
            if not chunk:
                sys.exit("chromium closed its pipe; is it a build with --remote-debugging-pipe?")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_for(self, method, session):
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    del self.events[i]
                    return event
            self.events.append(self.receive())

    def close(self):
        try:
            self.send("Browser.close")
        except (RuntimeError, SystemExit, OSError):
            pass
        self.process.wait(timeout=10)
        self.profile.cleanup()


def chapters():
    """The book's pages in the order SUMMARY.md lists them, as .html paths."""
    seen = []
    for link in re.findall(r"\]\(([^)#]+\.md)\)", SUMMARY.read_text()):
        page = link.removeprefix("./").removesuffix(".md") + ".html"
        if page not in seen:
            seen.append(page)
    return seen


def smallest_text(svg_path):
    """An SVG's smallest font size and its own width, in its user units."""
    root = ET.parse(svg_path).getroot()
    width = float(root.get("viewBox", "0 0 0 0").split()[2] or root.get("width"))
    sizes = [float(e.get("font-size")) for e in root.iter() if e.get("font-size")]
    return (min(sizes) if sizes else None), width


def measure(browser, session, page, width):
    browser.send("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": 844 if width <= PHONE else 800,
        "deviceScaleFactor": 3 if width <= PHONE else 1, "mobile": width <= PHONE,
    }, session)
    browser.send("Page.navigate", {"url": (BOOK / page).as_uri()}, session)
    browser.wait_for("Page.loadEventFired", session)
    result = browser.send("Runtime.evaluate", {
        "expression": MEASURE, "awaitPromise": True, "returnByValue": True,
    }, session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"{page}: {result['exceptionDetails']}")
    found = result["result"]["value"]
    for figure in found["figures"]:
        figure["text_px"] = None
        path = (BOOK / page).parent / figure["src"]
        if path.suffix == ".svg" and path.exists():
            size, own = smallest_text(path)
            if size and own:
                figure["text_px"] = round(size * figure["rendered"] / own, 1)
    return found


def counts(found):
    wide_tables = [t for t in found["tables"] if t["wide"]]
    return {
        "code": len(found["code"]),
        "code_wide": sum(c["wide"] for c in found["code"]),
        "tables": len(found["tables"]),
        "tables_wide": len(wide_tables),
        "unpinned": sum(not t["pinned"] for t in wide_tables),
        "cramped": sum(t["cramped"] for t in wide_tables),
        "cut": len(found["cut"]),
        "page_scrolls": int(found["page"]["scrolls"]),
        "figures": len(found["figures"]),
        "small": sum(f["text_px"] is not None and f["text_px"] < SMALLEST_TEXT
                     for f in found["figures"]),
        "unlinked": sum(not f["linked"] for f in found["figures"]),
    }


HEAD = ("page", "code", "wide", "tables", "wide", "unpinned", "cramped", "cut", "sideways",
        "figures", "small", "unlinked")


def row(name, c):
    return [name, c["code"], c["code_wide"], c["tables"], c["tables_wide"], c["unpinned"],
            c["cramped"], c["cut"], c["page_scrolls"], c["figures"], c["small"], c["unlinked"]]


def print_table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(r, widths))))


def details(page, found):
    for c in found["code"]:
        if c["wide"]:
            print(f"  {page}: code {c['columns']} columns, {c['content']} px in {c['box']} px:"
                  f" {c['label']}")
    for t in found["tables"]:
        if t["wide"]:
            pin = "pinned" if t["pinned"] else "NOT PINNED"
            if t["cramped"]:
                pin += f", CRAMPED: a cell of {t['rest']:.0f} px beside it"
            print(f"  {page}: table of {t['columns']} columns, {t['content']} px in"
                  f" {t['box']} px, first column {t['first']:.0f} px, {pin}: {t['label']}")
    for c in found["cut"]:
        print(f"  {page}: CUT OFF <{c['tag']}> reaches {c['right']} px, box ends at"
              f" {c['limit']} px: {c['label']}")
    if found["page"]["scrolls"]:
        print(f"  {page}: THE PAGE SCROLLS: {found['page']['content']} px in"
              f" {found['page']['box']} px")
    for f in found["figures"]:
        if f["text_px"] is not None and f["text_px"] < SMALLEST_TEXT or not f["linked"]:
            link = "linked full size" if f["linked"] else "NOT LINKED"
            print(f"  {page}: figure {f['src']} at {f['rendered']:.0f} of {f['natural']} px,"
                  f" smallest text {f['text_px']} px, {link}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("widths", nargs="*", type=int, default=[1280, 390],
                        help="viewport widths in CSS px (default 1280 390)")
    parser.add_argument("--page", action="append",
                        help="measure only this page (e.g. phase2/launching.html); repeatable")
    parser.add_argument("--list", action="store_true",
                        help="name each wide block, cut element and small figure")
    parser.add_argument("--per-page", action="store_true", help="a row per page")
    parser.add_argument("--json", type=pathlib.Path, help="write every measurement here")
    args = parser.parse_args()

    binary = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser") or shutil.which("google-chrome")
    if not binary:
        sys.exit("no Chromium: set CHROMIUM to its path")
    if not (BOOK / "index.html").exists():
        sys.exit(f"no book in {BOOK}: run `mdbook build guide` first")
    pages = args.page or chapters()

    browser = Chromium(binary)
    everything = {}
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        browser.send("Page.enable", None, session)
        for width in args.widths:
            everything[width] = {page: measure(browser, session, page, width) for page in pages}
    finally:
        browser.close()

    for width, found in everything.items():
        print(f"\nat {width} px ({'phone' if width <= PHONE else 'laptop'}), {len(found)} pages")
        per_page = {page: counts(f) for page, f in found.items()}
        total = {k: sum(c[k] for c in per_page.values()) for k in next(iter(per_page.values()))}
        rows = [list(HEAD)]
        if args.per_page:
            rows += [row(page, c) for page, c in per_page.items()]
        rows.append(row("all pages", total))
        print_table(rows)
        scrolling = [p for p, c in per_page.items() if c["code_wide"] or c["tables_wide"]]
        print(f"pages with a block that scrolls: {len(scrolling)}")
        if args.list:
            for page, f in found.items():
                details(page, f)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
