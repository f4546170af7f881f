// The Litz dashboard page: one job (live over server-sent events, or an ended one from its history), or the list
// of jobs. Everything from the server is put into the page as text, never as HTML.
"use strict";

const EVENT_COLOURS = {
  scale_out: "#16a34a", scale_in: "#ea580c", rebalance: "#0891b2", recovery: "#dc2626",
  partial_recovery: "#dc2626", partial_recovery_failed: "#991b1b", checkpoint: "#6b7280",
  checkpoint_failed: "#92400e", priority_checkpoint: "#65a30d", resume: "#06b6d4", stop: "#111827",
  memory_limit: "#7c3aed", registry_outage: "#db2777", evict: "#a78bfa", evict_failed: "#7c3aed",
  steal: "#94a3b8",
};
const NOT_MARKED = new Set(["load", "compile"]);  // too many, and they change nothing of the job's shape
const MAX_MARKS = 300;
const ROW_FIELDS = new Set(["t", "time", "workers", "servers", "workers_rss", "servers_rss",
  "executor_state_bytes", "evicted_executors"]);
const COUNTERS = new Set(["epoch", "iteration", "round", "stage"]);
const GONE_KEEP_S = 60;

const S = {
  name: null, allowControl: false, state: "unknown", info: {}, status: null, history: [], metrics: [],
  events: [], complete: true, joining: [], received: 0, gone: {}, chartsDue: true, lastCharts: 0,
};

// -- small helpers -------------------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
const $ = (id) => document.getElementById(id);
function fill(tbody, rows) { tbody.replaceChildren(...rows); }
function num(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  return Number(v).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}
function mib(bytes) { return bytes ? `${num(bytes / 2 ** 20, 0)} MiB` : "-"; }
function fmt(v) {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(4);
  return typeof v === "string" ? v : JSON.stringify(v);
}
function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
function details(ev) {
  return Object.entries(ev).filter(([k]) => k !== "t" && k !== "kind")
    .map(([k, v]) => `${k}=${fmt(v)}`).join("  ");
}
function metricKind(key) {
  const k = key.toLowerCase();
  if (k.includes("acc") || k.includes("recall") || k.includes("precision")) return "accuracy";
  if (["loss", "objective", "likelihood", "error", "sse"].some((w) => k.includes(w))) return "loss";
  return "other";
}

// -- the list of jobs ----------------------------------------------------------------------------------------
function showList() {
  $("list-view").hidden = false;
  $("title").textContent = "jobs";
  const es = new EventSource("/api/list");
  es.onopen = () => { $("conn").className = "conn live"; };
  es.onerror = () => { $("conn").className = "conn down"; };
  es.addEventListener("list", (e) => renderList(JSON.parse(e.data)));
}

function renderList(doc) {
  const link = (name) => el("a", { href: `/job/${encodeURIComponent(name)}`, text: name });
  fill($("running").tBodies[0], doc.running.map((j) => el("tr", { "data-name": j.name },
    el("td", {}, link(j.name)), el("td", { text: j.app || "-" }),
    el("td", {}, el("span", { class: `badge ${j.state}`, text: j.state })),
    el("td", { text: duration(j.elapsed_s) }), el("td", { class: "num", text: num(j.tasks_completed) }),
    el("td", { class: "num", text: num(j.tasks_per_s) }), el("td", { class: "num", text: j.workers }),
    el("td", { class: "num", text: j.servers }),
    el("td", { text: j.progress ? `${j.progress.unit} ${fmt(j.progress.done)}/${fmt(j.progress.total)}` : "-" }))));
  $("no-running").hidden = doc.running.length > 0;
  fill($("ended").tBodies[0], doc.ended.map((j) => el("tr", { "data-name": j.name },
    el("td", {}, link(j.name)), el("td", { text: j.app || "-" }), el("td", { text: j.state || "-" }),
    el("td", { text: j.ended ? `${duration(doc.now - j.ended)} ago` : "-" }),
    el("td", { class: "num", text: num(j.tasks_completed) }))));
  $("no-ended").hidden = doc.ended.length > 0;
}

// -- one job -------------------------------------------------------------------------------------------------
function showJob(name) {
  S.name = name;
  $("job-view").hidden = false;
  $("title").textContent = `job ${name}`;
  document.title = `${name} - Litz`;
  $("controls").hidden = !S.allowControl;
  const es = new EventSource(`/api/job/${encodeURIComponent(name)}/stream`);
  es.onopen = () => { $("conn").className = "conn live"; };
  es.onerror = () => { $("conn").className = S.state === "ended" ? "conn ended" : "conn down"; };
  es.addEventListener("snapshot", (e) => onSnapshot(JSON.parse(e.data)));
  es.addEventListener("status", (e) => onStatus(JSON.parse(e.data)));
  es.addEventListener("problem", (e) => note(`the registry did not answer: ${JSON.parse(e.data).message}`));
  setInterval(tick, 1000);
  if (S.allowControl) wireControls();
}

function note(text) { $("note").hidden = !text; $("note").textContent = text || ""; }

function onSnapshot(d) {
  Object.assign(S, { state: d.state, info: d.info || {}, status: d.status, history: d.history || [],
    metrics: d.metrics || [], events: d.events || [], complete: d.complete, joining: d.joining || [],
    received: Date.now() / 1000 });
  if (d.state === "ended") { S.gone = {}; $("conn").className = "conn ended"; }
  if (d.state === "unknown") note(`no running job named ${S.name}, and no history of one on this machine`);
  else if (d.state === "waiting") note("the job's master is up and has not published its status yet");
  else if (d.state === "running" && !d.complete) {
    note("the job's history before this dashboard started is not shown: the dashboard has not the job secret "
      + "(--secret-file)");
  } else note("");
  S.chartsDue = true;
  render();
}

function onStatus(d) {
  const before = S.status;
  if (before) noteGone(before, d.status);
  S.status = d.status;
  S.state = "running";
  S.joining = d.joining || [];
  S.received = Date.now() / 1000;
  if (d.sample) S.history.push(d.sample);
  if (d.row) S.metrics.push(d.row);
  if (d.events && d.events.length) S.events.push(...d.events);
  S.chartsDue = true;
  render();
}

// A process that left the status: drained ("left") if it was draining, else lost; shown for a minute.
function noteGone(before, after) {
  const now = Date.now() / 1000;
  for (const role of ["workers", "servers"]) {
    const still = new Set(after[role].map((p) => p.id));
    for (const p of before[role]) {
      if (!still.has(p.id)) {
        S.gone[p.id] = { role, row: p, draining: p.state === "draining", since: now };
      }
    }
  }
  for (const [id, g] of Object.entries(S.gone)) {
    if (now - g.since > GONE_KEEP_S || after.workers.concat(after.servers).some((p) => p.id === id)) {
      delete S.gone[id];
    }
  }
}

// Why a process left: a recovery names it lost, a scale-in or drain that it left (the event may come a moment
// after the process is gone from the status).
function goneState(g) {
  for (const ev of S.events.slice(-200)) {
    if ((ev.kind === "recovery" || ev.kind === "partial_recovery") && JSON.stringify(ev.lost || []).includes(`"${g.row.id}"`)) return "lost";
    if ((ev.kind === "scale_in" || ev.kind === "rebalance") && (ev.processes || []).includes(g.row.id)) return "left";
  }
  return g.draining ? "left" : "gone";
}

function tick() {  // the elapsed time between two statuses
  if (S.state === "running" && S.status) {
    $("elapsed").textContent = duration(S.status.elapsed_s + Date.now() / 1000 - S.received);
  }
  if (S.chartsDue && Date.now() - S.lastCharts > 900) renderCharts();
}

function render() {
  renderSummary();
  renderProcesses();
  renderEvents();
  renderConfig();
  if (Date.now() - S.lastCharts > 900) renderCharts();  // at most about once a second; tick() does the rest
}

function renderSummary() {
  const st = S.status || {};
  const ended = S.state === "ended";
  const state = ended ? (S.info.state || st.state || "ended") : (st.state || S.state);
  $("state").textContent = state;
  $("state").className = `badge ${state}`;
  $("app").textContent = S.info.app || st.app || "-";
  let elapsed = st.elapsed_s;
  if (ended && S.info.ended && S.info.started) elapsed = S.info.ended - S.info.started;
  $("elapsed").textContent = duration(elapsed);
  $("tasks").textContent = num(st.tasks_completed ?? S.info.tasks_completed);
  $("rate").textContent = ended ? "-" : num(st.tasks_per_s);
  const workers = ended ? "-" : (st.workers || []).length;
  const servers = ended ? "-" : (st.servers || []).length;
  $("counts").textContent = `${workers} / ${servers}`;
  const ckpts = S.events.filter((e) => e.kind === "checkpoint").length;
  $("ckpts").textContent = st.checkpointing ? `${ckpts} (one under way)` : String(ckpts);
  const p = st.progress;
  if (p && p.total) {
    const frac = Math.min(1, p.done / p.total);
    $("progress-bar").style.width = `${(100 * frac).toFixed(1)}%`;
    $("progress").textContent = `${p.unit} ${fmt(p.done)} of ${fmt(p.total)} (${(100 * frac).toFixed(0)} %)`
      + (p.eta_s !== null && p.eta_s !== undefined && !ended ? `, ETA ${duration(p.eta_s)}` : "");
  } else {
    $("progress-bar").style.width = "0";
    $("progress").textContent = "the app declares no total (Driver.set_total)";
  }
  const rep = st.report || (S.metrics.length ? S.metrics[S.metrics.length - 1] : {});
  $("report").textContent = Object.entries(rep).filter(([k]) => !ROW_FIELDS.has(k))
    .map(([k, v]) => `${k} ${fmt(v)}`).join("   ") || "none yet";
  if (S.allowControl) {
    for (const b of document.querySelectorAll("#controls button, #controls input")) b.disabled = S.state !== "running";
  }
}

function stateCell(state) { return el("td", {}, el("span", { class: `state ${state}`, text: state })); }

function budgetCell(p) {
  if (!p.budget) return el("td", { class: "muted", text: "no budget" });
  const used = p.state_bytes || 0;
  const bar = el("span", { class: used > p.budget ? "bar over" : "bar" });
  bar.append(el("span", { style: `width:${Math.min(100, (100 * used) / p.budget).toFixed(1)}%` }));
  return el("td", {}, bar, `${mib(used)} of ${mib(p.budget)}`);
}

function drainCell(p) {
  if (!S.allowControl || S.state !== "running" || p.state !== "active") return el("td");
  const b = el("button", { type: "button", class: "drain", "data-id": p.id, text: "drain" });
  b.addEventListener("click", () => control({ command: "drain", ids: [p.id] }, `drain ${p.id}`));
  return el("td", {}, b);
}

function renderProcesses() {
  const st = S.status || { workers: [], servers: [], moving: {} };
  const moving = (st.moving && st.moving.executors) || 0;
  const workerRow = (p, state, gone) => el("tr", { "data-id": p.id, class: gone ? "gone" : "" },
    el("td", { text: p.id }), stateCell(state), el("td", { text: `${p.pid ?? "-"} @ ${p.host ?? "-"}` }),
    el("td", { class: "num", title: (p.executors || []).join(" "), text: (p.executors || []).length }),
    el("td", { class: "num", title: p.cpu_limit ? `CPU limit ${num(p.cpu_limit, 2)} cores (its cgroup quota)` : "",
      text: (p.speed === null || p.speed === undefined ? "-" : `${num(p.speed, 1)} tasks/s`) +
        (p.cpu_limit ? ` (limit ${num(p.cpu_limit, 2)})` : "") }),
    el("td", { class: "num", text: p.task_ms ? `${num(p.task_ms, 1)} (${num(p.task_cpu_ms, 1)})` : "-" }),
    el("td", { class: "num", text: mib(p.memory) }), budgetCell(p),
    el("td", { class: "num", title: (p.evicted || []).join(" "), text: (p.evicted || []).length }),
    gone ? el("td") : drainCell(p));
  const serverRow = (p, state, gone) => el("tr", { "data-id": p.id, class: gone ? "gone" : "" },
    el("td", { text: p.id }), stateCell(state), el("td", { text: `${p.pid ?? "-"} @ ${p.host ?? "-"}` }),
    el("td", { class: "num", title: (p.shards || []).join(" "), text: (p.shards || []).length }),
    el("td", { class: "num", text: mib(p.memory) }), budgetCell(p),
    el("td", { class: "num", text: (p.evicted || []).length }), gone ? el("td") : drainCell(p));
  const live = (p) => (p.state === "active" && (p.executors || []).length === 0 && moving ? "joining" : p.state);
  const joining = S.joining.map((id) => ({ id, pid: null, host: null }));
  const rows = (role, procs, make) => [
    ...procs.map((p) => make(p, role === "workers" ? live(p) : p.state, false)),
    ...joining.filter((p) => p.id[0] === role[0]).map((p) => make(p, "joining", true)),
    ...Object.values(S.gone).filter((g) => g.role === role).map((g) => make(g.row, goneState(g), true)),
  ];
  fill($("workers").tBodies[0], rows("workers", st.workers || [], workerRow));
  fill($("servers").tBodies[0], rows("servers", st.servers || [], serverRow));
}

function renderEvents() {
  const shown = S.events.slice(-500).reverse();
  fill($("events").tBodies[0], shown.map((ev) => el("tr", { "data-kind": ev.kind },
    el("td", { class: "num", text: num(ev.t, 2) }),
    el("td", {}, el("span", { class: "kind", style: `color:${EVENT_COLOURS[ev.kind] || "inherit"}`, text: ev.kind })),
    el("td", { class: "small", text: details(ev) }))));
  $("events-count").textContent = `(${S.events.length}${S.events.length > 500 ? ", the latest 500 listed" : ""})`;
  const ckpts = S.events.filter((e) => e.kind.includes("checkpoint") || e.kind === "resume");
  fill($("checkpoints").tBodies[0], ckpts.slice(-50).reverse().map((ev) => el("tr", {},
    el("td", { class: "num", text: num(ev.t, 2) }), el("td", { text: ev.kind }),
    el("td", { class: "small", text: details(ev) }))));
  $("no-checkpoints").hidden = ckpts.length > 0;
}

function renderConfig() {
  const cfg = S.info.config || {};
  fill($("config").tBodies[0], Object.entries(cfg).map(([k, v]) => el("tr", {},
    el("td", { text: k }), el("td", { text: typeof v === "string" ? v : JSON.stringify(v) }))));
  $("no-config").hidden = Object.keys(cfg).length > 0;
}

// -- charts (plotly) -----------------------------------------------------------------------------------------
function eventMarks() {
  const marked = S.events.filter((e) => !NOT_MARKED.has(e.kind) && typeof e.t === "number").slice(-MAX_MARKS);
  const shapes = [];
  const annotations = [];
  for (const ev of marked) {
    const colour = EVENT_COLOURS[ev.kind] || "#9ca3af";
    if (typeof ev.end === "number" && ev.end > ev.t) {  // a scale or rebalance: from its start to its end
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: ev.t, x1: ev.end, y0: 0, y1: 1,
        fillcolor: colour, opacity: 0.12, line: { width: 0 } });
    }
    shapes.push({ type: "line", xref: "x", yref: "paper", x0: ev.t, x1: ev.t, y0: 0, y1: 1,
      line: { color: colour, width: 1, dash: ev.kind.startsWith("checkpoint") ? "dot" : "solid" } });
  }
  for (const ev of marked.filter((e) => !["steal", "evict"].includes(e.kind)).slice(-40)) {
    annotations.push({ x: ev.t, y: 1, xref: "x", yref: "paper", text: ev.kind, showarrow: false, textangle: -90,
      xanchor: "right", yanchor: "top", font: { size: 9, color: EVENT_COLOURS[ev.kind] || "#6b7280" } });
  }
  return { shapes, annotations };
}

function layout(title, ytitle, marks, extra) {
  return Object.assign({ title: { text: title, font: { size: 13 } }, margin: { l: 50, r: 10, t: 30, b: 32 },
    xaxis: { title: { text: "seconds since start", font: { size: 10 } }, zeroline: false },
    yaxis: { title: { text: ytitle, font: { size: 10 } }, rangemode: "tozero" },
    showlegend: true, legend: { orientation: "h", y: -0.25, font: { size: 10 } },
    shapes: marks.shapes, annotations: marks.annotations, uirevision: "keep" }, extra || {});
}

const PLOT_CONFIG = { displaylogo: false, responsive: true };

function renderCharts() {
  S.chartsDue = false;
  S.lastCharts = Date.now();
  const marks = eventMarks();
  const h = S.history;
  const t = h.map((s) => s.t);
  Plotly.react("chart-rate", [{ x: t, y: h.map((s) => s.tasks_per_s), name: "tasks/s", mode: "lines",
    line: { color: "#2563eb" } }], layout("tasks per second", "tasks/s", marks), PLOT_CONFIG);
  Plotly.react("chart-procs", [
    { x: t, y: h.map((s) => s.workers), name: "workers", mode: "lines", line: { shape: "hv", color: "#16a34a" } },
    { x: t, y: h.map((s) => s.servers), name: "servers", mode: "lines", line: { shape: "hv", color: "#ea580c" } },
  ], layout("live workers and servers", "processes", marks, { yaxis: { rangemode: "tozero", dtick: 1 } }),
  PLOT_CONFIG);
  Plotly.react("chart-memory", [
    { x: t, y: h.map((s) => s.workers_memory / 2 ** 20), name: "workers", mode: "lines" },
    { x: t, y: h.map((s) => s.servers_memory / 2 ** 20), name: "servers", mode: "lines" },
  ], layout("resident memory (all processes of a kind)", "MiB", marks), PLOT_CONFIG);
  // the app's report() values: loss-like and accuracy-like panels, else up to three others
  const skip = new Set(COUNTERS);
  if (S.status && S.status.progress) skip.add(S.status.progress.unit);
  const keys = [];
  for (const r of S.metrics) {
    for (const [k, v] of Object.entries(r)) {
      if (!ROW_FIELDS.has(k) && !skip.has(k) && !keys.includes(k) && typeof v === "number") keys.push(k);
    }
  }
  const panels = { loss: [], accuracy: [], other: [] };
  for (const k of keys) panels[metricKind(k)].push(k);
  const trace = (k) => {
    const rows = S.metrics.filter((r) => typeof r[k] === "number");
    return { x: rows.map((r) => r.t), y: rows.map((r) => r[k]), name: k, mode: rows.length < 60 ? "lines+markers" : "lines" };
  };
  const first = panels.loss.length ? ["loss", panels.loss] : ["metrics", panels.other.slice(0, 3)];
  if (first[1].length) {
    Plotly.react("chart-metrics", first[1].map(trace), layout(`report(): ${first[0]}`, first[0], marks,
      { yaxis: { rangemode: "normal" } }), PLOT_CONFIG);
  } else {
    Plotly.purge("chart-metrics");
    $("chart-metrics").replaceChildren();
  }
  if (panels.accuracy.length) {
    Plotly.react("chart-accuracy", panels.accuracy.map(trace), layout("report(): accuracy", "accuracy", marks,
      { yaxis: { rangemode: "normal" } }), PLOT_CONFIG);
  } else {
    Plotly.purge("chart-accuracy");
    $("chart-accuracy").replaceChildren();
  }
}

// -- controls: litzctl's commands, carried out by the dashboard server -----------------------------------------
async function control(body, what) {
  const msg = $("control-msg");
  msg.className = "small";
  msg.textContent = `${what}...`;
  try {
    const r = await fetch(`/api/job/${encodeURIComponent(S.name)}/control`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      credentials: "same-origin",
    });
    const answer = await r.json();
    msg.className = answer.ok ? "small" : "small error";
    msg.textContent = `${what}: ${answer.message}`;
  } catch (err) {
    msg.className = "small error";
    msg.textContent = `${what}: ${err}`;
  }
}

function wireControls() {
  $("scale-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const body = { command: "scale", workers: $("want-workers").value, servers: $("want-servers").value };
    control(body, "scale");
  });
  $("checkpoint-btn").addEventListener("click", () => control({ command: "checkpoint" }, "checkpoint"));
  $("memory-form").addEventListener("submit", (e) => {
    e.preventDefault();
    control({ command: "memory-limit", bytes: $("memory-limit").value }, "memory limit");
  });
  $("stop-btn").addEventListener("click", () => {
    if (window.confirm(`Stop job ${S.name}? Its result will be null.`)) control({ command: "stop" }, "stop");
  });
}

// -- start ---------------------------------------------------------------------------------------------------
(async function start() {
  const info = await (await fetch("/api/info", { credentials: "same-origin" })).json();
  S.allowControl = !!info.allow_control;
  const m = window.location.pathname.match(/^\/job\/([^/]+)$/);
  const name = info.name || (m && decodeURIComponent(m[1]));
  if (name) showJob(name);
  else showList();
}());
