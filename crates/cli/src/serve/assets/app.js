// sortie serve's pages: the run list (/) and a run (/runs/ID). Plain JS, no library; every
// read is the JSON API (/api/v1), every change of a run arrives as a server-sent event.
"use strict";
const CSRF = document.querySelector('meta[name="csrf"]').content;
const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
};
async function api(path, opts) {
  const r = await fetch(path, Object.assign({ credentials: "same-origin", cache: "no-store" }, opts || {}));
  const ct = r.headers.get("content-type") || "";
  const body = ct.includes("json") ? await r.json() : await r.text();
  if (!r.ok && !(body && body.message)) throw new Error((body && body.error) || body || r.status);
  return body;
}
const money = (usd) => "$" + (usd || 0).toFixed(4);
function dur(ms) {
  if (ms == null) return "";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
}
const clock = (ms) => (ms ? new Date(ms).toLocaleString() : "");

// ---- the run list --------------------------------------------------------------------------
async function runsPage() {
  $("#where").textContent = "runs";
  const runs = await api("/api/v1/runs");
  const main = $("#main");
  main.replaceChildren();
  const filter = el("input", { id: "runfilter", placeholder: "filter runs (id, state, source)" });
  const body = el("tbody");
  const draw = () => {
    const q = filter.value.toLowerCase();
    body.replaceChildren(...runs.filter((r) => !q || (r.run_id + " " + r.status + " " + r.source).toLowerCase().includes(q)).map((r) =>
      el("tr", { "data-run": r.run_id },
        el("td", {}, el("a", { href: "/runs/" + encodeURIComponent(r.run_id) }, r.run_id)),
        el("td", {}, el("span", { class: "st st-" + r.status }, r.status)),
        el("td", {}, Object.entries(r.counts).map(([k, n]) => k + " " + n).join(", ") || r.tasks + " tasks"),
        el("td", { class: "n" }, r.cost),
        el("td", {}, clock(r.started || r.created)),
        el("td", { class: "n" }, dur(r.duration_ms)),
        el("td", { class: "muted" }, r.error || r.source))));
  };
  filter.addEventListener("input", draw);
  main.append(el("h2", {}, "Runs, newest first"), filter,
    el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["run", "state", "tasks", "cost", "started", "duration", "source"].map((h) => el("th", {}, h)))), body));
  draw();
}

// ---- a run ---------------------------------------------------------------------------------
const ROW = 24;
const COLS = [["label", "task"], ["state", "state"], ["model", "model"], ["cost", "cost"], ["tokens", "tokens"], ["attempts", "attempts"], ["duration_ms", "duration"]];
const R = { id: null, cols: null, pos: null, view: new Int32Array(0), sort: null, desc: false, head: null, sel: null, drawn: 0 };
window.sortie = R;

function applyView() {
  const c = R.cols, n = c.label.length;
  const q = ($("#q").value || "").toLowerCase(), st = $("#st").value;
  const out = new Int32Array(n);
  let k = 0;
  for (let j = 0; j < n; j++) {
    if (st && c.state[j] !== st) continue;
    if (q && !(c.label[j].toLowerCase().includes(q) || (c.model[j] || "").toLowerCase().includes(q))) continue;
    out[k++] = j;
  }
  let v = out.subarray(0, k);
  if (R.sort) {
    const col = c[R.sort], d = R.desc ? -1 : 1;
    v = Int32Array.from(v).sort((a, b) => {
      const x = col[a], y = col[b];
      return (x === y ? a - b : x == null ? 1 : y == null ? -1 : x < y ? -d : d);
    });
  }
  R.view = v;
  $("#shown").textContent = k + " of " + n + " tasks";
  $("#spacer").style.height = (k * ROW + ROW) + "px";
  drawRows();
  return k;
}
function drawRows() {
  const box = $("#tbl"), rows = $("#rows");
  if (!box || !R.cols) return;
  const first = Math.max(0, Math.floor(box.scrollTop / ROW) - 5);
  const last = Math.min(R.view.length, first + Math.ceil(box.clientHeight / ROW) + 10);
  const c = R.cols, frag = document.createDocumentFragment();
  for (let r = first; r < last; r++) {
    const j = R.view[r];
    const state = c.held[j] && !["completed", "failed", "cancelled"].includes(c.state[j]) ? c.state[j] + " (held)" : c.state[j];
    const row = el("div", { class: "tr" + (R.sel === c.i[j] ? " sel" : ""), "data-label": c.label[j], "data-state": c.state[j], "data-i": c.i[j], style: "top:" + (ROW + r * ROW) + "px" },
      el("span", { title: c.label[j] }, c.label[j]), el("span", {}, el("span", { class: "st st-" + c.state[j] }, state)),
      el("span", {}, c.model[j] || "-"), el("span", { class: "n" }, money(c.cost[j])), el("span", { class: "n" }, c.tokens[j]),
      el("span", { class: "n" }, c.attempts[j]), el("span", { class: "n" }, dur(c.duration_ms[j])));
    row.addEventListener("click", () => openTask(c.i[j]));
    frag.append(row);
  }
  rows.replaceChildren(frag);
  R.drawn++;
}
function drawHead() {
  const h = R.head;
  if (!h) return;
  const n = h.tasks, counts = h.counts || {};
  const done = ["completed", "failed", "cancelled"].reduce((a, k) => a + (counts[k] || 0), 0);
  const elapsed = h.started ? Math.max(0, h.now - h.started) : null;
  const left = h.status === "running" && done > 0 && done < n ? elapsed / done * (n - done) : null;
  const card = (k, v) => el("div", { class: "card" }, k, el("b", {}, v));
  $("#head").replaceChildren(card("status", h.status), card("tasks", n),
    ...Object.entries(counts).map(([k, v]) => card(k, v)),
    card("tokens", h.usage ? (h.usage.input + h.usage.output + h.usage.cache_read + h.usage.cache_write) : 0),
    card("cost", h.cost), card("elapsed", dur(elapsed)), card("estimate left", left == null ? "-" : dur(left)));
  $("#runcontrols").style.display = h.live_pid ? "" : "none";
}
async function control(body) {
  const r = await fetch("/api/v1/runs/" + encodeURIComponent(R.id) + "/control", {
    method: "POST", credentials: "same-origin",
    headers: { "content-type": "application/json", "x-sortie-csrf": CSRF }, body: JSON.stringify(body),
  });
  const a = await r.json().catch(() => ({}));
  $("#said").textContent = a.message || a.error || ("HTTP " + r.status);
  $("#said").className = a.ok ? "muted" : "err";
}
async function runPage(id) {
  R.id = id;
  $("#where").textContent = "run " + id;
  const main = $("#main");
  main.replaceChildren(
    el("div", { id: "head", class: "cards" }),
    el("div", { id: "runcontrols", class: "controls" },
      el("button", { id: "holdrun", onclick: () => control({ action: "hold", task: null }) }, "Hold run"),
      el("button", { id: "releaserun", onclick: () => control({ action: "release", task: null }) }, "Release all"),
      el("button", { id: "cancelrun", onclick: () => confirm("Cancel the whole run?") && control({ action: "cancel", task: null }) }, "Cancel run"),
      el("input", { id: "conc", type: "number", min: "1", style: "width:5em", placeholder: "n" }),
      el("button", { id: "setconc", onclick: () => control({ action: "concurrency", n: Number($("#conc").value) }) }, "Set concurrency"),
      el("span", { id: "said", class: "muted" })),
    el("h2", {}, "Tasks"),
    el("div", { class: "controls" }, el("input", { id: "q", placeholder: "filter by label or model" }),
      el("select", { id: "st" }, el("option", { value: "" }, "every state")), el("span", { id: "shown", class: "muted" })),
    el("div", { id: "tbl", class: "tbl" },
      el("div", { class: "thead" }, ...COLS.map(([k, name]) => el("span", { "data-sort": k, onclick: () => { R.desc = R.sort === k ? !R.desc : false; R.sort = k; applyView(); } }, name))),
      el("div", { id: "spacer" }), el("div", { id: "rows" })),
    el("div", { id: "task" }),
    el("h2", {}, "Timeline"), el("div", { id: "timeline" }, "…"));
  $("#q").addEventListener("input", applyView);
  $("#st").addEventListener("change", applyView);
  $("#tbl").addEventListener("scroll", () => requestAnimationFrame(drawRows));
  const base = "/api/v1/runs/" + encodeURIComponent(id);
  const [head, cols] = await Promise.all([api(base + "/head"), api(base + "/rows")]);
  R.head = head; R.cols = cols;
  R.pos = new Map(); cols.i.forEach((t, j) => R.pos.set(t, j));
  fillStates();
  drawHead();
  applyView();
  R.ready = performance.now();
  // The first moment the page's thread is free again after drawing: it answers input from here.
  setTimeout(() => { R.idle = performance.now(); }, 0);
  listen(base, cols.next_seq);
  refreshTimeline(base);
  const linked = location.hash.match(/^#task=(\d+)$/);
  if (linked) openTask(Number(linked[1]));
}
function fillStates() {
  const sel = $("#st"), have = new Set([...sel.options].map((o) => o.value));
  for (const s of new Set(R.cols.state)) if (!have.has(s)) sel.append(el("option", { value: s }, s));
}
let dirty = new Set(), pending = null, timelineAt = 0, timelineTimer = null;
function listen(base, next) {
  const src = new EventSource(base + "/events" + (next > 0 ? "?after=" + (next - 1) : ""));
  src.onopen = () => { $("#conn").textContent = "live"; };
  src.onerror = () => { $("#conn").textContent = "reconnecting…"; };
  src.onmessage = (m) => {
    let rec;
    try { rec = JSON.parse(m.data); } catch (e) { return; }
    const body = rec.event && Object.values(rec.event)[0];
    const action = body && body.action && typeof body.action === "object" ? Object.values(body.action)[0] : null;
    if (body && typeof body.task === "number") dirty.add(body.task);
    else if (action && typeof action.task === "number") dirty.add(action.task);
    else if (body && body.action) R.cols.i.forEach((t) => dirty.add(t));
    if (!pending) pending = setTimeout(() => update(base), 100);
  };
}
async function update(base) {
  const ids = [...dirty]; dirty = new Set(); pending = null;
  const [head, part] = await Promise.all([api(base + "/head"), ids.length ? api(base + "/rows?i=" + ids.join(",")) : null]);
  R.head = head; drawHead();
  if (part) {
    for (let k = 0; k < part.i.length; k++) {
      const j = R.pos.get(part.i[k]);
      for (const key of ["label", "state", "model", "cost", "tokens", "attempts", "duration_ms", "held"]) R.cols[key][j] = part[key][k];
    }
    fillStates();
    applyView();
    if (R.sel != null && ids.includes(R.sel)) openTask(R.sel, true);
  }
  refreshTimeline(base);
}
function refreshTimeline(base) {
  const wait = Math.max(0, timelineAt + 2000 - Date.now());
  if (timelineTimer) return;
  timelineTimer = setTimeout(async () => {
    timelineTimer = null; timelineAt = Date.now();
    $("#timeline").innerHTML = await api(base + "/timeline");
  }, wait);
}

// ---- a task --------------------------------------------------------------------------------
const T = { i: null, attempt: null, latest: null, next: 0, timer: null };
async function openTask(i, refresh) {
  const base = "/api/v1/runs/" + encodeURIComponent(R.id) + "/tasks/" + i;
  R.sel = i; drawRows();
  if (!refresh) history.replaceState(null, "", "#task=" + i);
  const d = await api(base);
  const t = d.task, last = d.transcripts.length ? d.transcripts[d.transcripts.length - 1].attempt : null;
  let again = refresh && T.i === i;
  // A retry: a panel that followed the newest attempt follows the new one.
  if (again && last !== T.latest && T.attempt === T.latest) again = false;
  if (!again) { T.i = i; T.attempt = last; T.next = 0; }
  T.latest = last;
  const live = d.live && !["completed", "failed", "cancelled"].includes(t.state);
  const panel = $("#task");
  const old = again ? $("#transcript") : null;
  panel.replaceChildren(
    el("h2", {}, "Task " + t.label + ": " + t.state + (t.held ? " (held)" : "")),
    el("div", { class: "cards" }, el("div", { class: "card" }, "attempts", el("b", {}, t.attempts)),
      el("div", { class: "card" }, "model", el("b", {}, t.model || "-")),
      el("div", { class: "card" }, "tokens", el("b", {}, t.usage.input + t.usage.output)),
      el("div", { class: "card" }, "cost", el("b", {}, money(t.usage.cost.nanos / 1e9))),
      el("div", { class: "card" }, "duration", el("b", {}, dur(t.duration_ms))),
      t.verify ? el("div", { class: "card" }, "check", el("b", {}, JSON.stringify(t.verify.verdict || t.verify.state || t.verify))) : ""),
    live ? el("div", { class: "controls" },
      el("button", { id: "hold", onclick: () => control({ action: "hold", task: t.label }) }, "Hold"),
      el("button", { id: "release", onclick: () => control({ action: "release", task: t.label }) }, "Release"),
      el("button", { id: "cancel", onclick: () => control({ action: "cancel", task: t.label }) }, "Cancel"),
      el("input", { id: "steermsg", placeholder: "message to the agent (pi-rpc)" }),
      el("button", { id: "steer", onclick: () => control({ action: "steer", task: t.label, message: $("#steermsg").value }) }, "Steer")) : "",
    t.error ? el("p", { class: "err" }, t.error) : "",
    d.denied.length ? el("p", { id: "denied", class: "err" }, "sandbox denied: " + d.denied.join(", ") + " (" + d.denied_field + ")") : "",
    t.text ? el("details", {}, el("summary", {}, "answer"), el("pre", {}, t.text)) : "",
    el("div", { class: "controls" }, "attempt ",
      el("select", { id: "attempt", onchange: (e) => { T.attempt = Number(e.target.value); T.next = 0; $("#transcript").replaceChildren(); tail(base); } },
        ...d.transcripts.map((x) => { const o = el("option", { value: x.attempt }, x.attempt + " (" + x.executor + ", " + x.end + ")"); if (x.attempt === T.attempt) o.selected = true; return o; })),
      el("button", { onclick: () => api(base + "/check" + (T.attempt ? "?attempt=" + T.attempt : "")).then((x) => { $("#extra").textContent = x; }) }, "check output"),
      t.worktree ? el("button", { onclick: () => api(base + "/diff").then((x) => { $("#extra").textContent = x; }, (e) => { $("#extra").textContent = String(e); }) }, "diff") : ""),
    old || el("div", { id: "transcript", class: "transcript" }),
    el("pre", { id: "extra" }));
  if (!again) tail(base);
}
async function tail(base) {
  clearTimeout(T.timer);
  if (T.attempt == null) return;
  const want = T.i, attempt = T.attempt;
  const p = await api(base + "/transcript?attempt=" + attempt + "&from=" + T.next).catch(() => null);
  if (!p || want !== T.i || attempt !== T.attempt) return;
  const box = $("#transcript");
  const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
  for (const line of p.text.split("\n")) if (line) box.append(render(line));
  if (p.cut) box.append(el("div", { class: "msg raw muted" }, "(part of this transcript was cut to keep it under its cap)"));
  if (stick) box.scrollTop = box.scrollHeight;
  T.next = p.next;
  if (!p.ended) T.timer = setTimeout(() => tail(base), 500);
}
// An agent's JSON event as a message or a tool call; any other line as it is.
function render(line) {
  let o;
  try { o = JSON.parse(line); } catch (e) { o = null; }
  if (!o || typeof o !== "object") return el("div", { class: "msg raw" }, line);
  const parts = [];
  const walk = (x, depth) => {
    if (!x || depth > 6) return;
    if (Array.isArray(x)) { x.forEach((y) => walk(y, depth + 1)); return; }
    if (typeof x !== "object") return;
    const type = x.type || "";
    if ((type === "tool_use" || type === "toolCall" || type === "function_call" || type === "command_execution") && (x.name || x.command)) {
      parts.push(["tool", "→ " + (x.name || "shell") + " " + JSON.stringify(x.input || x.arguments || x.command || {})]);
      return;
    }
    if (type === "tool_result" || type === "toolResult" || type === "function_call_output") {
      parts.push(["result", "← " + (typeof x.content === "string" ? x.content : JSON.stringify(x.content || x.output || "")).slice(0, 2000)]);
      return;
    }
    if (typeof x.text === "string" && x.text) { parts.push(["text", x.text]); return; }
    for (const k of ["message", "content", "item", "assistantMessageEvent", "partial", "delta"]) if (x[k]) walk(x[k], depth + 1);
  };
  walk(o, 0);
  if (!parts.length) return el("div", { class: "msg raw muted" }, (o.type ? "[" + o.type + "] " : "") + line.slice(0, 300));
  const box = el("div", {});
  for (const [k, s] of parts) box.append(el("div", { class: "msg " + k }, s));
  return box;
}

const m = location.pathname.match(/^\/runs\/([^/]+)$/);
(m ? runPage(decodeURIComponent(m[1])) : runsPage()).catch((e) => {
  $("#main").replaceChildren(el("p", { class: "err" }, "Cannot load: " + e.message));
});
