// The Bursar dashboard: one page, no dependencies. The token lives in sessionStorage and
// travels as a bearer header; live updates come from /api/events (server-sent events read
// through fetch, since EventSource cannot send a header), resuming with Last-Event-ID.
"use strict";

const KEY = "bursar.token";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
  "#db2777", "#4b5563", "#65a30d"];
let state = null;
let lastId = "";
let stream = null;
let revoking = "";
let recent = [];  // lease events lately applied: a state older than some is brought up to date

const $ = (sel) => document.querySelector(sel);
const token = () => sessionStorage.getItem(KEY) || "";
const fmt = (x, d = 2) => (x === null || x === undefined) ? "—" :
  (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : String(x));
const size = (m) => Object.entries(m || {}).map(([k, v]) => `${k}=${fmt(v)}`).join(" ");
const iso = (t) => (t ? new Date(t * 1000).toISOString().replace(".000Z", "Z") : "");
const short = (e) => String(e || "").replace(/^LEASE_(STATE|PATH|EVENT_KIND)_/, "").toLowerCase();

function el(tag, attrs = {}, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v);
  }
  for (const c of kids) n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return n;
}

async function api(path, body) {
  const init = { headers: { Authorization: "Bearer " + token() } };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

const selected = () => $("#campaign").value;
const shown = (campaign) => !selected() || campaign === selected();

// ---------------------------------------------------------------- rendering

function render() {
  if (!state) return;
  $("#caller").textContent = state.caller;
  $("#clock").textContent = state.now_iso;
  $("#seq").textContent = "journal " + state.journal_seq;
  const sel = $("#campaign");
  const names = state.campaigns.map((c) => c.name);
  const have = [...sel.options].slice(1).map((o) => o.value);
  if (names.join() !== have.join()) {
    const keep = sel.value;
    sel.replaceChildren(el("option", { value: "" }, "all"),
      ...names.map((n) => el("option", { value: n }, n)));
    sel.value = names.includes(keep) ? keep : "";
    $("#whatif-campaign").replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  renderCampaigns();
  renderSupply();
  renderLeases();
  renderQueue();
  renderJournal();
  renderUsable();
  renderChart();
}

function primaryDim() {
  const d = Object.keys((state.supply || {}).dims || {});
  return d.includes("gpu") ? "gpu" : (d[0] || "gpu");
}

function renderCampaigns() {
  const dim = primaryDim();
  const rows = state.campaigns.filter((c) => shown(c.name)).map((c) => {
    const e = c.envelopes[dim] || {};
    const paused = Object.values(c.envelopes).every((x) => x.burst === 0);
    const tr = el("tr", { "data-campaign": c.name, class: c.name === selected() ? "selected" : "" },
      el("td", {}, el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); pick(c.name); } },
        c.name)),
      el("td", { class: "num" }, fmt(c.held[dim] || 0)),
      el("td", { class: "num" }, fmt(e.guarantee)),
      el("td", { class: "num" }, fmt(e.burst)),
      el("td", { class: "num" }, fmt(c.bucket[dim])),
      el("td", { class: "num" }, fmt(c.credits)),
      el("td", { class: "num" }, c.leases),
      el("td", { class: "num" }, c.queued),
      el("td", {}));
    if (state.admin) {
      tr.lastChild.append(el("button", { class: "pause", onclick: () => pause(c.name, !paused) },
        paused ? "Resume" : "Pause"));
    }
    return tr;
  });
  $("#campaigns tbody").replaceChildren(...rows);
}

function renderSupply() {
  const s = state.supply;
  const dim = primaryDim();
  const d = (s.dims || {})[dim] || {};
  const items = [["at", s.at_iso], ["price", fmt(s.price, 4)], ["pressure", fmt(s.pressure, 3)],
    [`${dim} capacity`, fmt(d.capacity)], [`${dim} warm free`, fmt(d.warm_free)],
    [`${dim} available warm`, fmt(d.available_warm)], [`${dim} reclaimable`, fmt(d.reclaimable)],
    [`${dim} cold`, fmt(d.cold)], ["grace s", fmt(s.grace_s)],
    ["boot latency s", fmt(s.boot_latency_s)]];
  $("#supply").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("#paths").replaceChildren(...Object.entries(state.paths).flatMap(([k, v]) =>
    [el("dt", {}, k), el("dd", {}, v)]));
}

function renderLeases() {
  const leases = state.leases.filter((l) => shown(l.campaign));
  $("#leases tbody").replaceChildren(...leases.map((l) => {
    const tr = el("tr", { "data-lease-id": l.lease_id, class: l._new ? "new" : "" },
      el("td", {}, l.lease_id), el("td", {}, l.campaign), el("td", {}, short(l.state)),
      el("td", {}, size(l.size)), el("td", {}, short(l.path)), el("td", {}, iso(l.granted_at)),
      el("td", {}, iso(l.expires_at)),
      el("td", {}, el("button", { class: "history", onclick: () => history(l.lease_id) },
        "History")));
    if (state.admin) {
      tr.lastChild.append(" ", el("button", { class: "revoke danger",
        onclick: () => askRevoke(l.lease_id) }, "Revoke"));
    }
    delete l._new;
    return tr;
  }));
  const elastic = leases.filter((l) => l.elastic && Object.keys(l.elastic).length);
  $("#elastic tbody").replaceChildren(...elastic.map((l) => {
    const e = l.elastic;
    return el("tr", {}, el("td", {}, l.lease_id), el("td", { class: "num" }, fmt(e.units)),
      el("td", {}, e.mode), el("td", { class: "num" }, fmt(e.slack_s, 1)),
      el("td", { class: "num" }, fmt(e.risk, 3)),
      el("td", { class: "num" }, fmt(e.marginal_utility, 4)),
      el("td", { class: "num" }, fmt(e.remaining_work, 1)), el("td", {}, iso(e.deadline)));
  }));
}

function renderQueue() {
  $("#queue tbody").replaceChildren(...state.queue.filter((q) => shown(q.campaign)).map((q) =>
    el("tr", { "data-request-id": q.request_id }, el("td", {}, q.request_id),
      el("td", {}, q.campaign), el("td", {}, size(q.size)), el("td", {}, q.reason),
      el("td", { class: "num" }, fmt(q.waited_s, 1)),
      el("td", { class: "num" }, fmt(q.estimated_wait_s, 1)),
      el("td", {}, q.reservation_at_iso || "—"))));
}

function journalRow(r, campaign = true) {
  const details = Object.entries(r.details).map(([k, v]) =>
    `${k}=${typeof v === "object" ? JSON.stringify(v) : fmt(v)}`).join(" ");
  return el("tr", {}, el("td", { class: "num" }, r.seq), el("td", {}, r.at_iso),
    el("td", {}, r.kind), ...(campaign ? [el("td", {}, r.campaign), el("td", {}, r.id)] : []),
    el("td", {}, details));
}

function renderJournal() {
  const rows = state.journal.filter((r) => shown(r.campaign) || !r.campaign).slice().reverse();
  $("#journal tbody").replaceChildren(...rows.map((r) => journalRow(r)));
}

function renderUsable() {
  // One small histogram per path: how many grants became usable within each bucket of seconds.
  const box = $("#ttu");
  box.replaceChildren();
  for (const [path, xs] of Object.entries(state.time_to_usable)) {
    const max = Math.max(1, ...xs);
    const bins = new Array(10).fill(0);
    for (const x of xs) bins[Math.min(9, Math.floor((x / max) * 10))]++;
    const top = Math.max(1, ...bins);
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 200 50");
    svg.setAttribute("width", "200");
    svg.setAttribute("height", "50");
    bins.forEach((b, i) => {
      const r = document.createElementNS(svg.namespaceURI, "rect");
      const h = (b / top) * 46;
      r.setAttribute("x", i * 20 + 1); r.setAttribute("y", 48 - h);
      r.setAttribute("width", 18); r.setAttribute("height", h); r.setAttribute("fill", "#2563eb");
      svg.append(r);
    });
    const sorted = xs.slice().sort((a, b) => a - b);
    const q = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
    box.append(el("div", { class: "ttu", "data-path": path },
      el("b", {}, path), ` n=${xs.length} median ${fmt(q(0.5), 1)} s, p95 ${fmt(q(0.95), 1)} s,` +
      ` max ${fmt(max, 1)} s`, el("br"), svg));
  }
  if (!box.childNodes.length) box.append("no grants in the journal's recent entries");
}

function renderChart() {
  // Held units of the primary dimension per campaign over time; for a selected campaign,
  // its guarantee and burst as dashed lines.
  const svg = $("#pool-chart");
  const ns = svg.namespaceURI;
  const dim = primaryDim();
  $("#chart-dim").textContent = `(${dim})`;
  const hist = state.history;
  svg.replaceChildren();
  if (!hist.length) return;
  const names = state.campaigns.map((c) => c.name).filter(shown);
  const t0 = hist[0].at, t1 = Math.max(hist[hist.length - 1].at, state.now, t0 + 1);
  let top = 1;
  for (const s of hist) for (const n of names) top = Math.max(top, (s.held[n] || {})[dim] || 0);
  const one = state.campaigns.find((c) => c.name === selected());
  const env = one ? one.envelopes[dim] || {} : {};
  if (one) top = Math.max(top, env.burst || 0);
  const X = (t) => ((t - t0) / (t1 - t0)) * 890 + 5;
  const Y = (v) => 215 - (v / top) * 205;
  const legend = [];
  names.forEach((n, i) => {
    // The campaign's colour is the reports' (bursar.broker.colours), sent with the state.
    const c = state.campaigns.find((x) => x.name === n);
    const color = (c && c.colour) || COLORS[i % COLORS.length];
    let d = "";
    let prev = null;
    for (const s of hist) {
      const v = (s.held[n] || {})[dim] || 0;
      d += prev === null ? `M${X(s.at)},${Y(v)}` : `H${X(s.at)}V${Y(v)}`;
      prev = v;
    }
    d += `H${X(t1)}`;
    const p = document.createElementNS(ns, "path");
    p.setAttribute("d", d); p.setAttribute("fill", "none"); p.setAttribute("stroke", color);
    p.setAttribute("stroke-width", "2"); p.setAttribute("data-campaign", n);
    svg.append(p);
    legend.push(el("span", {}, el("i", { style: `background:${color}` }), `${n} held`));
  });
  for (const [what, v, color] of [["guarantee", env.guarantee, "#16a34a"],
    ["burst", env.burst, "#dc2626"]]) {
    if (!one || v === undefined) continue;
    const l = document.createElementNS(ns, "line");
    l.setAttribute("x1", 5); l.setAttribute("x2", 895); l.setAttribute("y1", Y(v));
    l.setAttribute("y2", Y(v)); l.setAttribute("stroke", color);
    l.setAttribute("stroke-dasharray", "6 4"); l.setAttribute("class", what);
    svg.append(l);
    legend.push(el("span", {}, el("i", { style: `background:${color}` }), `${what} ${fmt(v)}`));
  }
  legend.push(el("span", {}, `0–${fmt(top)} ${dim}, ${iso(t0)} – ${iso(t1)}`));
  $("#chart-legend").replaceChildren(...legend);
}

// ---------------------------------------------------------------- actions

function pick(name) {
  $("#campaign").value = name;
  render();
}

async function history(leaseId) {
  const data = await api("/api/lease/" + encodeURIComponent(leaseId));
  const l = data.lease;
  $("#lease-title").textContent = `${l.lease_id} (${l.campaign})`;
  $("#lease-facts").textContent = `state ${short(l.state)}, size ${size(l.size)}, path ` +
    `${short(l.path)}\ngranted ${l.granted_at_iso}, expires ${l.expires_at_iso}` +
    (l.ended_at_iso ? `\nended ${l.ended_at_iso} ${l.end_cause || ""}` : "");
  $("#lease-history tbody").replaceChildren(...data.history.map((r) => journalRow(r, false)));
  $("#lease-dialog").showModal();
}

function askRevoke(leaseId) {
  revoking = leaseId;
  $("#revoke-lease").textContent = leaseId;
  $("#revoke-error").textContent = "";
  $("#revoke-dialog").showModal();
}

async function revoke() {
  try {
    await api("/api/revoke", { lease_id: revoking, reason: $("#revoke-reason").value });
    $("#revoke-dialog").close();
  } catch (e) {
    $("#revoke-error").textContent = e.message;
  }
}

async function pause(name, paused) {
  const what = paused ? "Pause" : "Resume";
  if (!confirm(`${what} campaign ${name}? ` + (paused
    ? "Its burst and guarantee become 0: its leases keep running, new requests are refused."
    : "Its envelope is set back to what it was when paused."))) return;
  try { await api("/api/pause", { campaign: name, paused }); } catch (e) { alert(e.message); }
}

async function whatIf(ev) {
  ev.preventDefault();
  const out = $("#whatif-result");
  try {
    const r = await api("/api/whatif", { campaign: $("#whatif-campaign").value,
      size: { gpu: Number($("#whatif-gpu").value) }, duration_s: Number($("#whatif-duration").value) });
    out.textContent = r.outcome === "grant"
      ? `granted now on the ${r.path} path (${fmt(r.credits)} credits)`
      : `${r.outcome}: ${r.reason}` + (r.estimated_wait_s !== undefined
        ? `, estimated wait ${fmt(r.estimated_wait_s, 1)} s` : "") +
        (r.retry_after_s !== undefined ? `, retry after ${fmt(r.retry_after_s, 1)} s` : "");
  } catch (e) {
    out.textContent = "error: " + e.message;
  }
}

// ---------------------------------------------------------------- live stream

function onLease(ev, keep = true) {
  if (!state) return;
  if (keep) { recent.push(ev); if (recent.length > 500) recent.shift(); }
  const l = ev.lease;
  const ended = ["released", "expired", "revoked"].includes(short(ev.kind));
  const i = state.leases.findIndex((x) => x.lease_id === l.lease_id);
  if (ended) { if (i >= 0) state.leases.splice(i, 1); }
  else if (i >= 0) state.leases[i] = l;
  else { l._new = true; state.leases.push(l); }
  renderLeases();
}

function dispatch(chunk) {
  let event = "message", data = "", id = null;
  for (const line of chunk.split("\n")) {
    if (line.startsWith(":")) continue;
    const [k, ...rest] = line.split(":");
    const v = rest.join(":").replace(/^ /, "");
    if (k === "event") event = v; else if (k === "data") data += v; else if (k === "id") id = v;
  }
  if (id) lastId = id;
  if (!data) return;
  const msg = JSON.parse(data);
  if (event === "state") {
    state = msg;
    // A state shared between streams may predate lease events this page already has.
    recent = recent.filter((ev) => Number(ev.seq) > state.journal_seq);
    for (const ev of recent) onLease(ev, false);
    render();
  }
  else if (event === "lease") onLease(msg);
}

async function follow() {
  const mine = stream = new AbortController();
  while (stream === mine) {
    try {
      const headers = { Authorization: "Bearer " + token() };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const r = await fetch("/api/events", { headers, signal: mine.signal });
      if (r.status === 401 || r.status === 403) { signOut((await r.json()).error); return; }
      if (r.status === 416) lastId = "";  // too far behind: start afresh from a new state
      if (!r.ok) throw new Error(r.statusText);
      $("#live").className = "on"; $("#live").textContent = "live";
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) { dispatch(buf.slice(0, i)); buf = buf.slice(i + 2); }
      }
    } catch (e) {
      if (mine.signal.aborted) return;
    }
    $("#live").className = "off"; $("#live").textContent = "reconnecting";
    await new Promise((res) => setTimeout(res, 1000));
  }
}

function signIn(t) {
  sessionStorage.setItem(KEY, t);
  $("#signin-panel").hidden = true;
  $("#board").hidden = false;
  $("#signout").hidden = false;
  follow();
}

function signOut(why = "") {
  sessionStorage.removeItem(KEY);
  if (stream) stream.abort();
  stream = null; state = null; lastId = "";
  $("#signin-panel").hidden = false;
  $("#board").hidden = true;
  $("#signout").hidden = true;
  $("#signin-error").textContent = why;
}

$("#signin").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const t = $("#token").value.trim();
  if (t) signIn(t);
});
$("#signout").addEventListener("click", () => signOut());
$("#campaign").addEventListener("change", render);
$("#whatif").addEventListener("submit", whatIf);
$("#revoke-confirm").addEventListener("click", revoke);
$("#revoke-cancel").addEventListener("click", () => $("#revoke-dialog").close());
if (token()) signIn(token());
