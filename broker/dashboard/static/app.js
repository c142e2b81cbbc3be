// The Bursar dashboard: one page, no dependencies. Signed in by a one-time login link (the
// server sets an HttpOnly session cookie the page never sees) or by a pasted token, kept in
// sessionStorage and sent as a bearer header; live updates come from /api/events
// (server-sent events read through fetch, since EventSource cannot send a header),
// resuming with Last-Event-ID.
"use strict";

const KEY = "bursar.token";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
  "#db2777", "#4b5563", "#65a30d"];
let state = null;
let lastId = "";
let stream = null;
let revoking = "";
let recent = [];  // lease events lately applied: a state older than some is brought up to date
let offset = 0;  // the broker's clock less this page's (s): times since are counted here

const $ = (sel) => document.querySelector(sel);
const token = () => sessionStorage.getItem(KEY) || "";
const fmt = (x, d = 2) => (x === null || x === undefined) ? "—" :
  (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : String(x));
const size = (m) => Object.entries(m || {}).map(([k, v]) => `${k}=${fmt(v)}`).join(" ");
const iso = (t) => (t ? new Date(t * 1000).toISOString().replace(".000Z", "Z") : "");
const serverNow = () => Date.now() / 1000 + offset;
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
  const init = { headers: auth() };
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

// A pasted token travels as a bearer header; without one the session cookie (same origin,
// sent by the browser) signs the request.
const auth = () => (token() ? { Authorization: "Bearer " + token() } : {});

const selected = () => $("#campaign").value;
const shown = (campaign) => !selected() || campaign === selected();

// ---------------------------------------------------------------- rendering

function render() {
  if (!state) return;
  $("#caller").textContent = state.caller;
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
  tick();  // the clock, the waits and the chart
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

// What each supply figure means, in words (the wire's field name is the tooltip).
const SUPPLY = [
  ["capacity", "capacity", "every unit in the pool"],
  ["warm_free", "warm free", "idle powered nodes, ready now (the reserve included)"],
  ["available_warm", "available now", "warm free beyond the reserve: what a request above " +
    "its guarantee gets at once"],
  ["reserve", "reserved", "kept warm for unmet guarantees: only their owners may use it"],
  ["reclaimable", "reclaimable", "held by preemptible leases: free after the grace period"],
  ["cold", "cold", "on powered-off or booting nodes: free after a boot"],
];

function unitName(dim) {
  return dim === "gpu" ? "GPUs" : dim;
}

function renderSupply() {
  const s = state.supply;
  const dim = primaryDim();
  const d = (s.dims || {})[dim] || {};
  const unit = unitName(dim);
  const items = [
    ["at", "as of", s.at_iso, "the broker's time of these figures (UTC)"],
    ["price", "price", fmt(s.price, 4), `credits per ${dim}-hour now: rises with pressure`],
    ["pressure", "pressure", fmt(s.pressure, 3), "(firm units held + units queued) / " +
      "capacity: above 1, demand exceeds the pool"],
    ...SUPPLY.map(([k, label, why]) => [k, `${label}`, `${fmt(d[k])} ${unit}`, why]),
    ["grace_s", "grace period", `${fmt(s.grace_s)} s`, "a preemption warning to the revocation: " +
      "how long reclaimable takes"],
    ["boot_latency_s", "boot time", `${fmt(s.boot_latency_s)} s`, "how long a cold node takes " +
      "to become usable"],
  ];
  items.push(...powerItems(s.power));
  $("#supply").replaceChildren(...items.flatMap(([k, label, v, why]) => [
    el("dt", { title: `${k}: ${why}`, "data-field": k }, label),
    el("dd", {}, el("b", {}, v), " ", el("span", { class: "why" }, why))]));
  const meter = $("#power-meter");
  if (s.power && meter) {
    // The draw against the cap, with the watts kept for guarantees marked as "high".
    const cap = Number(s.power.cap_w);
    meter.hidden = !Number.isFinite(cap);
    if (Number.isFinite(cap)) {
      meter.max = cap;
      meter.value = Number(s.power.draw_w);
      meter.high = Math.max(0, cap - Number(s.power.reserved_w));
      meter.title = `${fmt(s.power.draw_w, 0)} W of ${fmt(cap, 0)} W`;
    }
  } else if (meter) {
    meter.hidden = true;
  }
  $("#paths").replaceChildren(...Object.entries(state.paths).flatMap(([k, v]) =>
    [el("dt", { title: PATHS[k] || k }, k),
      el("dd", {}, el("b", {}, v), " ", el("span", { class: "why" }, PATHS[k] || ""))]));
}

// The facility's power, while the broker leases it (a cap, or a power envelope).
function powerItems(p) {
  if (!p) return [];
  const watts = (x) => `${fmt(Number(x), 0)} W`;
  const cap = Number(p.cap_w);
  return [
    ["power.draw_w", "power draw", `${watts(p.draw_w)} of ${Number.isFinite(cap) ? watts(cap) :
      "no cap"}`, "idle powered and booting nodes plus the leases' watts, against the facility cap"],
    ["power.headroom_w", "power headroom", watts(p.headroom_w), "what a lease above its " +
      "guarantee may add now: cap less draw less the watts kept for guarantees"],
    ["power.reserved_w", "power reserved", watts(p.reserved_w), "kept for unmet power " +
      "guarantees: only their owners may use them"],
    ["power.price", "power price", fmt(p.price, 4), "credits per kWh on the pool price's curve: " +
      "a signal to ask for a lower power limit rather than wait"],
  ];
}

const PATHS = {
  warm: "granted on idle powered nodes: usable at once",
  reclaim: "granted by preempting a preemptible lease: usable after the grace period",
  cold: "granted on a node being booted: usable after the boot",
};

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
      el("td", { class: "num waited", "data-queued-at": q.queued_at, title: `since ${q.queued_at_iso}` },
        fmt(Math.max(0, serverNow() - q.queued_at), 1)),
      el("td", { class: "num" }, fmt(q.estimated_wait_s, 1)),
      el("td", {}, q.reservation_at_iso || "—"))));
}

// Once a second: the clock, the queue's waits and the chart's right edge move on with the
// broker's time (this page's clock plus the offset measured on the last state).
function tick() {
  if (!state) return;
  $("#clock").textContent = iso(Math.floor(serverNow())) + " UTC";
  for (const td of document.querySelectorAll("#queue td.waited")) {
    td.textContent = fmt(Math.max(0, serverNow() - Number(td.dataset.queuedAt)), 1);
  }
  renderChart();
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

const SVG = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs = {}, text = "") {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  if (text) n.textContent = text;
  return n;
}

// Round tick steps: 1, 2 or 5 times a power of ten (units), and clock-friendly seconds.
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600];

function timeLabel(t, step) {
  const s = new Date(t * 1000).toISOString();
  return step < 60 ? s.slice(11, 19) : s.slice(11, 16);
}

// The steps of one campaign: [time, units held from then on], from the series the server
// builds from the journal (a point per grant, resize and end, at the decision's time).
function stepsOf(series, name, dim) {
  const steps = [[series.start, ((series.base[name] || {})[dim]) || 0]];
  for (const p of series.points) {
    if (p.campaign === name) steps.push([p.at, (p.held || {})[dim] || 0]);
  }
  return steps;
}

function renderChart() {
  // Held units of the primary dimension per campaign over time, as steps; for a selected
  // campaign, its guarantee and burst as dashed lines.
  const svg = $("#pool-chart");
  const dim = primaryDim();
  const unit = unitName(dim);
  $("#chart-dim").textContent = `(${unit} held, from the journal)`;
  const series = state.series;
  svg.replaceChildren();
  if (!series) return;
  const W = Math.max(300, svg.clientWidth || 900), H = 260;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const L = 56, R = 12, T = 10, B = 42;
  const names = state.campaigns.map((c) => c.name).filter(shown);
  const t0 = series.start;
  const last = series.points.length ? series.points[series.points.length - 1].at : t0;
  const t1 = Math.max(serverNow(), series.now, last, t0 + 1);
  const steps = Object.fromEntries(names.map((n) => [n, stepsOf(series, n, dim)]));
  let top = 1;
  for (const n of names) for (const [, v] of steps[n]) top = Math.max(top, v);
  const one = state.campaigns.find((c) => c.name === selected());
  const env = one ? one.envelopes[dim] || {} : {};
  if (one) top = Math.max(top, env.burst || 0);
  const ystep = niceStep(top, 5);
  top = Math.ceil(top / ystep) * ystep;
  const X = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const Y = (v) => H - B - (v / top) * (H - B - T);
  // Axes: ticks and grid lines, then the labels.
  const axes = svgEl("g", { class: "axes" });
  for (let v = 0; v <= top + 1e-9; v += ystep) {
    axes.append(svgEl("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "grid" }),
      svgEl("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end", class: "ytick" }, fmt(v)));
  }
  const tstep = TIME_STEPS.find((s) => (t1 - t0) / s <= 8) || 86400;
  for (let t = Math.ceil(t0 / tstep) * tstep; t <= t1; t += tstep) {
    axes.append(svgEl("line", { x1: X(t), x2: X(t), y1: H - B, y2: H - B + 5, class: "tick" }),
      svgEl("text", { x: X(t), y: H - B + 17, "text-anchor": "middle", class: "xtick" },
        timeLabel(t, tstep)));
  }
  axes.append(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }),
    svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }),
    svgEl("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "label" },
      "time (UTC)"),
    svgEl("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", class: "label",
      transform: `rotate(-90 12 ${(T + H - B) / 2})` }, `${unit} held`));
  svg.append(axes);
  const legend = [];
  names.forEach((n, i) => {
    // The campaign's colour is the reports' (bursar.broker.colours), sent with the state.
    const c = state.campaigns.find((x) => x.name === n);
    const color = (c && c.colour) || COLORS[i % COLORS.length];
    const st = steps[n];
    let d = `M${X(st[0][0])},${Y(st[0][1])}`;
    for (const [t, v] of st.slice(1)) d += `H${X(t)}V${Y(v)}`;
    d += `H${X(t1)}`;
    const p = svgEl("path", { d, fill: "none", stroke: color, "stroke-width": 2,
      "data-campaign": n, "data-steps": JSON.stringify(st) });
    p.append(svgEl("title", {}, `${n}: ${fmt(st[st.length - 1][1])} ${unit} held now`));
    svg.append(p);
    legend.push(el("span", {}, el("i", { style: `background:${color}` }), `${n} held`));
  });
  for (const [what, v, color] of [["guarantee", env.guarantee, "#16a34a"],
    ["burst", env.burst, "#dc2626"]]) {
    if (!one || v === undefined) continue;
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: color,
      "stroke-dasharray": "6 4", class: what }));
    legend.push(el("span", {}, el("i", { style: `background:${color}` }), `${what} ${fmt(v)}`));
  }
  legend.push(el("span", { class: "why" }, `from ${iso(t0)} (every grant, resize and end ` +
    "in the journal, at its time)"));
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
    brokers = state.brokers || brokers;
    offset = state.now - Date.now() / 1000;
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
      const headers = auth();
      if (lastId) headers["Last-Event-ID"] = lastId;
      const r = await fetch("/api/events", { headers, signal: mine.signal });
      if (r.status === 401 || r.status === 403) {
        // Not signed in yet (no cookie, no token): the sign-in panel, without a complaint;
        // a token refused, a session ended or a cookie this broker does not know: why.
        const { error, reason } = await r.json();
        if (stream !== mine) return;  // signed in another way meanwhile
        signOut(token() || signedIn || reason === "UNKNOWN_SESSION" ? error : "");
        return;
      }
      if (r.status === 416) lastId = "";  // too far behind: start afresh from a new state
      if (r.status === 503) {
        // This broker is now a standby (another took the lead): it names the leader.
        const { error, dashboard } = await r.json().catch(() => ({}));
        if (error === "standby" && await followLead(dashboard || "")) return;
      }
      if (!r.ok) throw new Error(r.statusText);
      $("#failover").hidden = true;
      showBoard();
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
    if (await followLead("")) return;
    await new Promise((res) => setTimeout(res, 1000));
  }
}

// ---------------------------------------------------------------- following the leader
// On a journal shared by several brokers (PostgreSQL), the state lists them with their
// dashboards. When this broker stops answering, or answers as a standby, the page asks
// the others' /api/role (no token, readable from any origin) and opens the dashboard of
// the one that says it leads. A pasted token stays with this origin (sessionStorage), so
// the leader's page asks for a sign-in: its login link or the same token.
let brokers = [];
const here = () => location.origin + "/";

async function findLeader(hint) {
  if (hint && hint !== here()) return hint;  // this broker's own word: it follows that one
  for (const b of brokers) {
    if (!b.dashboard || b.dashboard === here()) continue;
    try {
      const r = await fetch(b.dashboard + "api/role", { cache: "no-store" });
      const role = await r.json();
      // Only a broker's word about itself: a standby's record of the leader may be the
      // broker that just died.
      if (role.role === "leader") return role.dashboard || b.dashboard;
    } catch (e) { /* that one does not answer either */ }
  }
  return "";
}

async function followLead(hint) {
  const url = await findLeader(hint);
  if (!url || url === here()) return false;
  const note = $("#failover");
  note.replaceChildren("This broker no longer leads; opening the leader's dashboard: ",
    el("a", { href: url }, url));
  note.hidden = false;
  location.assign(url);
  return true;
}

let signedIn = false;  // the board has been shown in this page's life

function showBoard() {
  signedIn = true;
  $("#signin-panel").hidden = true;
  $("#board").hidden = false;
  $("#signout").hidden = false;
}

function connect() {
  if (stream) stream.abort();
  stream = null;
  follow();
}

function signIn(t) {
  sessionStorage.setItem(KEY, t);
  connect();
}

function signOut(why = "", server = false) {
  sessionStorage.removeItem(KEY);
  if (stream) stream.abort();
  stream = null; state = null; lastId = "";
  // The session cookie is HttpOnly: only the server can end it.
  if (server) fetch("/api/logout", { method: "POST" }).catch(() => {});
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
$("#signout").addEventListener("click", () => signOut("", true));
$("#campaign").addEventListener("change", render);
$("#whatif").addEventListener("submit", whatIf);
$("#revoke-confirm").addEventListener("click", revoke);
$("#revoke-cancel").addEventListener("click", () => $("#revoke-dialog").close());
window.addEventListener("resize", () => state && renderChart());
setInterval(tick, 1000);
// Signed in already (a session cookie from a login link, or a token in this tab)? The
// stream says; if not, the sign-in panel stays.
connect();
