"""report.html renders: its inline script runs to the end (replay included) under node
with a stub canvas (skipped where node is not installed), and in Debian's headless
Chromium it draws every chart, replays, and raises no JavaScript error (skipped where
/usr/bin/chromium is missing, unless BURSAR_REQUIRE_SYSTEM_TESTS=1: then it fails)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CHROMIUM, missing_system_part

from bursar.cli.main import main
from bursar.sim.study import run_scenario

_STUB = r"""
const calls = {n: 0};
const props = new Set(['fillStyle', 'strokeStyle', 'font', 'globalAlpha']);
function ctx2d() {
  const t = {};
  t.getImageData = (x, y, w, h) => ({data: new Uint8ClampedArray(w * h * 4).fill(255)});
  return new Proxy(t, {
    get: (o, k) => (k in o || props.has(k)) ? o[k] : (...a) => {
      calls.n++;
      for (const v of a) if (typeof v === 'number' && !isFinite(v)) throw new Error('non-finite ' + String(k));
    },
    set: (o, k, v) => { o[k] = v; return true; },
  });
}
const els = {};
function el(id) {
  if (!els[id]) els[id] = {id, width: 1000, height: 200, value: 0, textContent: '',
    getContext: () => ctx2d(), appendChild() {}};
  return els[id];
}
els['data'] = {textContent: DATA};
globalThis.document = {getElementById: el, createElement: () => ({}), body: {dataset: {}},
  querySelectorAll: () => ['occ', 'idle', 'bkt', 'price', 'lat'].map(el)};
globalThis.location = {hash: ''};
globalThis.window = globalThis;
globalThis.setInterval = (f) => { for (let i = 0; i < 250; i++) f(); return 1; };
globalThis.clearInterval = () => {};
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_report_script_renders_and_replays(tmp_path: Path) -> None:
    _, _, report = run_scenario(tmp_path, (2,), duration=1800.0)
    page = report.read_text()
    data = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert data and scripts
    js = (
        f"const DATA = {json.dumps(data.group(1))};\n{_STUB}\n{scripts[-1]}\n"
        "el('play').onclick();\n"
        "if (!window.reportRendered || calls.n < 100) throw new Error('not rendered');\n"
        "console.log('drawn', calls.n);\n"
    )
    (tmp_path / "check.js").write_text(js)
    res = subprocess.run(
        ["node", str(tmp_path / "check.js")], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("drawn")


def _chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    missing_system_part(f"{CHROMIUM} is not installed (scripts/system-deps.sh installs it)")


def _body(url: str, profile: Path, budget_ms: int) -> dict[str, str | None]:
    """Load ``url`` in headless Chromium (offline flags, a throwaway profile), let the
    page run for ``budget_ms`` of virtual time, and return the attributes of <body>."""
    res = subprocess.run(
        [
            str(_chromium()),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]

    found: dict[str, str | None] = {}

    class Body(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "body" and not found:
                found.update(attrs)
                found["<body>"] = "seen"

    Body().feed(res.stdout)
    assert found, f"no <body> in Chromium's DOM dump: {res.stdout[:500]!r}"
    return found


@pytest.mark.slow
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    _chromium()
    out = tmp_path / "run"
    res = CliRunner().invoke(
        main, ["sim", "run", "--seed", "2", "--minutes", "40", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    page = out / "report.html"
    assert f"report: {page}" in res.output
    # #play starts the animated replay on load: 200 frames, 40 ms apart (virtual time).
    body = _body(page.as_uri() + "#play", tmp_path / "profile", 10_000)
    assert body.get("data-js-errors") == "0", body.get("data-js-error-text")
    assert body.get("data-charts") == "5"
    assert body.get("data-charts-rendered") == "5", body.get("data-painted-pixels")
    assert all(int(n) > 2000 for n in (body["data-painted-pixels"] or "").split(","))
    assert body.get("data-replay-done") == "1" and int(body["data-replay-frames"] or 0) >= 200

    # Another seed's replay, chosen by the link (the page holds every seed's).
    res = CliRunner().invoke(
        main, ["sim", "run", "--minutes", "20", "--out", str(tmp_path / "two")]
    )
    assert res.exit_code == 0, res.output
    two = tmp_path / "two" / "report.html"
    body = _body(two.as_uri() + "#seed=2", tmp_path / "profile3", 2_000)
    assert body.get("data-js-errors") == "0", body.get("data-js-error-text")
    assert body.get("data-seed-shown") == "2"
    assert body.get("data-charts-rendered") == "5", body.get("data-painted-pixels")

    # The same page with a script error: the markers must say so (the check can fail).
    broken = out / "broken.html"
    broken.write_text(
        page.read_text().replace("draw(Infinity);", "draw(Infinity); notAFunction();", 1)
    )
    body = _body(broken.as_uri(), tmp_path / "profile2", 2_000)
    assert body.get("data-js-errors") == "1"
    assert "notAFunction" in (body.get("data-js-error-text") or "")
    assert body.get("data-charts-rendered") is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--grace", "-1"], "'--grace': -1.0 is not in the range x>=0"),
        (["--minutes", "0"], "'--minutes': 0.0 is not in the range x>0"),
        (["--minutes", "inf"], "'--minutes': 'inf' is not a finite number"),
        (["--headroom", "-4"], "'--headroom': -4.0 is not in the range x>=0"),
        (["--boot", "nan"], "'--boot': 'nan' is not a finite number"),
        (["--meter-window", "0"], "'--meter-window': 0.0 is not in the range x>0"),
    ],
)
def test_a_scenario_run_with_bad_numbers_is_refused_before_it_starts(
    tmp_path: Path, args: list[str], says: str
) -> None:
    # A negative grace period used to crash the run midway (time going back); infinite
    # minutes never ended.
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sim", "run", *args, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert not out.exists()
