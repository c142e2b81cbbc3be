"""``report.html``: one self-contained page (data and script inline, no network) with an
animated replay of the run (pool occupancy by campaign, where the idle GPUs are, bucket
levels, price, probe latencies) and the claims table with the measured value beside each."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from bursar.broker.colours import campaign_colour
from bursar.sim.scenario import IDLE_KINDS

__all__ = ["write_report"]

IDLE_COLORS = dict(
    zip(IDLE_KINDS, ("#8c564b", "#bcbd22", "#17becf", "#e377c2", "#c7c7c7", "#393b79"), strict=True)
)
"""One colour per kind of idle GPUs (``bursar.sim.scenario.idle_gpus``), stacked in order."""

_ERRORS = r"""
// Record any script error or console.error on the page, for a headless browser test.
window.reportErrors = [];
function reportError(msg){
  window.reportErrors.push(String(msg));
  document.body.dataset.jsErrors = String(window.reportErrors.length);
  document.body.dataset.jsErrorText = window.reportErrors.join(' | ');
}
window.addEventListener('error', e => reportError(e.message || e.type));
window.addEventListener('unhandledrejection', e => reportError(e.reason));
const consoleError = console.error.bind(console);
console.error = (...a) => { reportError(a.join(' ')); consoleError(...a); };
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const names = Object.keys(D.held);
const colors = D.colors;
function sel(id){ return document.getElementById(id); }
function axes(ctx, w, h, ymax, label, tmax){
  ctx.clearRect(0,0,w,h); ctx.strokeStyle='#999'; ctx.fillStyle='#333'; ctx.font='11px sans-serif';
  ctx.beginPath(); ctx.moveTo(50,10); ctx.lineTo(50,h-25); ctx.lineTo(w-10,h-25); ctx.stroke();
  for (let k=0;k<=4;k++){ const y=h-25-(h-35)*k/4; ctx.fillText((ymax*k/4).toFixed(ymax<10?1:0), 2, y+4); }
  for (let k=0;k<=8;k++){ const x=50+(w-60)*k/8; ctx.fillText(Math.round(tmax*k/8/60)+'m', x-8, h-8); }
  ctx.fillText(label, 55, 20);
}
function X(t,w,tmax){ return 50+(w-60)*t/tmax; }
function Y(v,h,ymax){ return h-25-(h-35)*Math.min(v,ymax)/ymax; }
// Stacked areas over the first m samples: rows of [colour, values], bottom first.
function stack(ctx, w, h, ymax, tmax, m, rows){
  let base = new Array(m).fill(0);
  for (const [col, vs] of rows){
    ctx.fillStyle = col || '#000'; ctx.beginPath();
    ctx.moveTo(X(D.t[0],w,tmax), Y(base[0],h,ymax));
    const top = [];
    for (let i=0;i<m;i++){ top.push(base[i]+vs[i]); ctx.lineTo(X(D.t[i],w,tmax), Y(top[i],h,ymax)); }
    for (let i=m-1;i>=0;i--) ctx.lineTo(X(D.t[i],w,tmax), Y(base[i],h,ymax));
    ctx.closePath(); ctx.globalAlpha=0.8; ctx.fill(); ctx.globalAlpha=1; base = top;
  }
}
function draw(upto){
  const tmax = D.t[D.t.length-1] || 1;
  const n = D.t.findIndex(t => t > upto); const m = n < 0 ? D.t.length : n;
  // Occupancy, stacked
  let c = sel('occ'), ctx = c.getContext('2d'), w=c.width, h=c.height;
  axes(ctx,w,h,D.capacity,'GPUs in use by campaign (pool '+D.capacity+')',tmax);
  stack(ctx, w, h, D.capacity, tmax, m, names.map(nm => [colors[nm], D.held[nm]]));
  // Idle GPUs by where they are, stacked on the same scale
  c = sel('idle'); ctx = c.getContext('2d'); w=c.width; h=c.height;
  const kinds = Object.keys(D.idle_colors);
  let imax = 1;
  for (let i=0;i<D.t.length;i++){ let v=0; for (const k of kinds) v+=D.idle[k][i]; imax=Math.max(imax,v); }
  axes(ctx,w,h,imax,'idle GPUs by where they are (stacked: '+kinds.join(', ')+')',tmax);
  stack(ctx, w, h, imax, tmax, m, kinds.map(k => [D.idle_colors[k], D.idle[k]]));
  // Buckets
  c = sel('bkt'); ctx = c.getContext('2d'); w=c.width; h=c.height;
  let bmax = 1; for (const nm in D.bucket) for (const v of D.bucket[nm]) bmax=Math.max(bmax,v);
  axes(ctx,w,h,bmax,'GPU bucket levels (GPU-s)',tmax);
  for (const nm in D.bucket){ ctx.strokeStyle = colors[nm]; ctx.beginPath();
    for (let i=0;i<m;i++){ const f = i? 'lineTo':'moveTo'; ctx[f](X(D.t[i],w,tmax), Y(D.bucket[nm][i],h,bmax)); } ctx.stroke(); }
  // Price
  c = sel('price'); ctx = c.getContext('2d'); w=c.width; h=c.height;
  let pmax = 1; for (const v of D.price) pmax=Math.max(pmax,v);
  axes(ctx,w,h,pmax,'congestion price (credits / GPU-h)',tmax);
  ctx.strokeStyle = '#d62728'; ctx.beginPath();
  for (let i=0;i<m;i++){ const f = i? 'lineTo':'moveTo'; ctx[f](X(D.t[i],w,tmax), Y(D.price[i],h,pmax)); } ctx.stroke();
  // Probe latencies
  c = sel('lat'); ctx = c.getContext('2d'); w=c.width; h=c.height;
  let lmax = 1; for (const p of D.probe) lmax=Math.max(lmax,p[1]);
  axes(ctx,w,h,lmax,'time to 128 GPUs, probe (s); victim (red); x = never served ('+D.unserved.length+')',tmax);
  for (const p of D.probe){ if (p[0] > upto) continue; ctx.fillStyle='#1f77b4'; ctx.fillRect(X(p[0],w,tmax)-3, Y(p[1],h,lmax)-3, 6, 6); }
  for (const p of D.victim){ if (p[0] > upto) continue; ctx.fillStyle='#d62728'; ctx.fillRect(X(p[0],w,tmax)-1, Y(p[1],h,lmax)-1, 3, 3); }
  // Requests never served (refused or timed out) have no latency: a cross along the top.
  for (const p of D.unserved){ if (p[0] > upto) continue; const x=X(p[0],w,tmax), y=Y(lmax,h,lmax)+6;
    ctx.strokeStyle=colors[p[1]]||'#000'; ctx.lineWidth=1.5; ctx.beginPath();
    ctx.moveTo(x-4,y-4); ctx.lineTo(x+4,y+4); ctx.moveTo(x+4,y-4); ctx.lineTo(x-4,y+4); ctx.stroke(); }
  ctx.lineWidth=1;
  sel('clock').textContent = 't = ' + Math.round(Math.min(upto,tmax)/60) + ' min';
  sel('slider').value = Math.min(upto, tmax);
}
let playing = null;
function play(){
  const tmax = D.t[D.t.length-1] || 1; let t = 0;
  if (playing) clearInterval(playing);
  playing = setInterval(() => {
    t += tmax/200; draw(t); document.body.dataset.replayFrames = (+document.body.dataset.replayFrames || 0) + 1;
    if (t >= tmax){ clearInterval(playing); playing=null; document.body.dataset.replayDone = '1'; }
  }, 40);
}
// Painted pixels per chart: what a headless browser test reads back from the DOM.
function painted(c){
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
  for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
  return n;
}
sel('slider').max = D.t[D.t.length-1] || 1;
sel('slider').oninput = e => { if (playing){ clearInterval(playing); playing=null; } draw(+e.target.value); };
sel('play').onclick = play;
const legend = sel('legend');
for (const nm of names){ const s=document.createElement('span'); s.innerHTML='<b style="color:'+(colors[nm]||'#000')+'">&#9632;</b> '+nm+' &nbsp; '; legend.appendChild(s); }
const idleLegend = sel('idle-legend');
for (const k in D.idle_colors){ const s=document.createElement('span'); s.innerHTML='<b style="color:'+D.idle_colors[k]+'">&#9632;</b> '+k+' &nbsp; '; idleLegend.appendChild(s); }
// The seed chooser: every seed's replay is in the page; choosing one swaps it in.
const seedSel = sel('seed');
const seedKeys = Object.keys(D.seeds || {});
for (const k of (seedKeys.length ? seedKeys : [String(D.seed)])){
  const o = document.createElement('option'); o.value = k; o.textContent = k;
  if (k === String(D.seed)) o.selected = true; seedSel.appendChild(o);
}
seedSel.onchange = e => {
  const r = D.seeds[e.target.value]; if (!r) return;
  if (playing){ clearInterval(playing); playing=null; }
  Object.assign(D, r); D.seed = +e.target.value;
  sel('slider').max = D.t[D.t.length-1] || 1; draw(Number.POSITIVE_INFINITY);
  document.body.dataset.seedShown = e.target.value;
};
// A link can name the seed: report.html#seed=2 (with #play too: #seed=2&play).
const asked = location.hash.match(/seed=(\d+)/);
if (asked && (D.seeds || {})[asked[1]]){ seedSel.value = asked[1]; seedSel.onchange({target: seedSel}); }
draw(Infinity);
const charts = Array.from(document.querySelectorAll('canvas'));
const pix = charts.map(painted);
document.body.dataset.charts = charts.length;
document.body.dataset.chartsRendered = pix.filter(n => n > 2000).length;
document.body.dataset.paintedPixels = pix.join(',');
window.reportRendered = true;
if (/(^#|&)play\b/.test(location.hash)) play();
"""


def write_report(
    out: Path,
    *,
    series: dict[str, Any],
    probe: list[tuple[float, float]],
    victim: list[tuple[float, float]],
    claims: list[dict[str, Any]],
    unserved: list[tuple[float, str]] | None = None,
    replays: dict[int, dict[str, Any]] | None = None,
    hashes: dict[int, str],
    audit_lines: list[str],
    wall: dict[int, float],
    title_seed: int,
    capacity: float,
) -> Path:
    data = {
        "t": series["t"],
        "held": series["held"],
        "bucket": series["bucket"],
        "price": series["price"],
        "idle": series["idle"],
        "idle_colors": IDLE_COLORS,
        "probe": probe,
        "victim": victim,
        "unserved": unserved or [],
        "colors": {
            n: campaign_colour(n)
            for n in sorted({*series["held"], *series["bucket"], "probe", "victim"})
        },
        "capacity": capacity,
        "seed": title_seed,
        # Every seed's replay (series, probe, victim, unserved), for the seed chooser.
        "seeds": {str(k): v for k, v in sorted((replays or {}).items())},
    }
    rows = "".join(
        "<tr class='{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            "ok" if c["holds"] else "miss",
            html.escape(c["claim"]),
            html.escape(c["prototype"]),
            html.escape(c["bound"]),
            html.escape(c["measured"])
            + (f"<div class='why'>{html.escape(c['why'])}</div>" if c.get("why") else ""),
            "-" if c["bound"] == "(measured only)" else ("pass" if c["holds"] else "miss"),
        )
        for c in claims
    )
    seeds = "".join(
        f"<li>seed {s}: journal SHA-256 <code>{h}</code> ({wall[s]:.2f} s wall)</li>"
        for s, h in sorted(hashes.items())
    )
    audits = "".join(f"<li>{html.escape(a)}</li>" for a in audit_lines)
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bursar simulator report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 14px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
th {{ background: #f3f3f3; }}
tr.miss td:last-child {{ color: #b00; font-weight: bold; }}
.why {{ color: #555; font-size: 0.9em; margin-top: 0.3em; }}
tr.ok td:last-child {{ color: #070; }}
canvas {{ border: 1px solid #eee; margin: 4px 0; }}
code {{ background: #f6f6f6; padding: 1px 4px; }}
</style></head><body data-js-errors="0">
<script>{_ERRORS}</script>
<h1>Bursar simulator: the agent-burst scenario</h1>
<p>Two simulated hours on the 512-GPU pool. Six agent programs (victim, adaptive-sci,
naive-sci, storm, backfill, probe) negotiate with the real policy engine through the
broker shell, journal and simulated pool, in virtual time. Claims are pooled over
{len(hashes)} seed(s); the replay below shows seed {title_seed} (choose another above the replay).</p>
<h2>Claims of the prototype, measured</h2>
<table><tr><th>claim</th><th>prototype</th><th>bound</th><th>measured</th>
<th>pass</th></tr>{rows}</table>
<h2>Replay</h2>
<p><label>seed <select id="seed"></select></label> <button id="play">&#9654; play</button> <input id="slider" type="range" min="0" step="10"
 style="width:60%"> <span id="clock"></span></p>
<div id="legend"></div>
<canvas id="occ" width="1000" height="260"></canvas>
<div id="idle-legend"></div>
<canvas id="idle" width="1000" height="170"></canvas>
<canvas id="bkt" width="1000" height="170"></canvas>
<canvas id="price" width="1000" height="140"></canvas>
<canvas id="lat" width="1000" height="170"></canvas>
<h2>Journals</h2>
<ul>{seeds}</ul>
<ul>{audits}</ul>
<script id="data" type="application/json">{payload}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
