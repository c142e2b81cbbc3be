"""report.html's inline script runs to the end (replay included) under node with a stub
canvas; skipped where node is not installed. (A headless-Chromium check is issue 4's.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bursar.sim.cli import run_scenario

_STUB = r"""
const calls = {n: 0};
const props = new Set(['fillStyle', 'strokeStyle', 'font', 'globalAlpha']);
function ctx2d() {
  const t = {};
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
globalThis.document = {getElementById: el, createElement: () => ({})};
globalThis.window = globalThis;
globalThis.setInterval = (f) => { for (let i = 0; i < 250; i++) f(); return 1; };
globalThis.clearInterval = () => {};
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_report_script_renders_and_replays(tmp_path: Path) -> None:
    _, _, report = run_scenario(tmp_path, (2,), duration=1800.0)
    page = report.read_text()
    data = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    script = re.search(r"<script>(.*?)</script>", page, re.S)
    assert data and script
    js = (
        f"const DATA = {json.dumps(data.group(1))};\n{_STUB}\n{script.group(1)}\n"
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
