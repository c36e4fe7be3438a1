// The agentrun dashboard: polls /ui/api/snapshot every second and /ui/api/denials every
// two, and searches /ui/api/audit from the form. Every value reaches the page as text
// (textContent), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const c of cells) {
    if (c instanceof Node) {
      const td = document.createElement("td");
      td.appendChild(c);
      tr.appendChild(td);
    } else if (Array.isArray(c)) {
      tr.appendChild(el("td", c[0], c[1]));
    } else {
      tr.appendChild(el("td", c));
    }
  }
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function ms(v) {
  if (v === null || v === undefined) return "–";
  if (v >= 10000) return (v / 1000).toFixed(1) + " s";
  if (v >= 1000) return (v / 1000).toFixed(2) + " s";
  return v.toFixed(v < 10 ? 1 : 0) + " ms";
}

function duration(msv) {
  const s = Math.floor(msv / 1000);
  if (s < 60) return (msv / 1000).toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + (s % 60) + "s";
  return Math.floor(m / 60) + "h " + (m % 60) + "m";
}

function bytes(b) {
  if (b === null || b === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (i === 0 ? b : b.toFixed(1)) + " " + units[i];
}

// A sparkline of `values` (null: no data at that point) into the <svg> `svg`.
function spark(svg, values) {
  const w = 240, h = 40, pad = 2;
  const nums = values.map((v) => (v === null || v === undefined ? null : Number(v)));
  const max = Math.max(1e-9, ...nums.filter((v) => v !== null));
  const step = nums.length > 1 ? w / (nums.length - 1) : w;
  const pts = nums.map((v, i) => [i * step, v === null ? null : h - pad - (v / max) * (h - 2 * pad)]);
  let d = "";
  let pen = false;
  for (const [x, y] of pts) {
    if (y === null) { pen = false; continue; }
    d += (pen ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1) + " ";
    pen = true;
  }
  const area = document.createElementNS(SVG, "path");
  area.setAttribute("class", "area");
  const filled = pts.map(([x, y]) => [x, y === null ? h : y]);
  area.setAttribute("d", "M0 " + h + " " + filled.map(([x, y]) => "L" + x.toFixed(1) + " " + y.toFixed(1)).join(" ") + " L" + w + " " + h + " Z");
  const line = document.createElementNS(SVG, "path");
  line.setAttribute("class", "line");
  line.setAttribute("d", d.trim() || "M0 " + (h - pad) + " L" + w + " " + (h - pad));
  svg.replaceChildren(area, line);
  svg.dataset.points = String(nums.filter((v) => v !== null).length);
  svg.dataset.max = String(max);
}

let failures = 0;

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (r.status === 401) {
    // The session ended: the page shows the login form again.
    window.location.reload();
    throw new Error("signed out");
  }
  const body = await r.json();
  if (!r.ok) throw new Error(body.message || r.statusText);
  return body;
}

function showSnapshot(s) {
  const w = s.window;
  $("stat-runs-per-s").textContent = w.runs_per_s.toFixed(2);
  $("stat-p50").textContent = ms(w.p50_ms);
  $("stat-p99").textContent = ms(w.p99_ms);
  $("stat-runs").textContent = String(w.runs);
  $("stat-running").textContent = String(s.commands.length);
  $("stat-shells").textContent = s.status.running + " / " + s.status.max_sandboxes;
  $("stat-memory").textContent = bytes(s.daemon_memory_bytes);
  spark($("spark-runs"), w.runs_per_second);
  spark($("spark-latency"), w.p50_ms_per_second);

  const running = (p) => s.shells.filter((sh) =>
    sh.state === "running" && sh.image === p.image && sh.profile === p.profile).length;
  fill($("pools").tBodies[0], s.status.pools.map((p) =>
    row([p.image, p.profile, p.ready + " / " + p.target, running(p), p.hits, p.misses,
      p.discarded])));
  const discarded = Object.entries(s.status.discarded || {}).map(([k, v]) => k + " " + v).join(", ");
  $("pool-totals").textContent = "shells " + s.status.shells + ", created " + s.status.created +
    ", cells " + s.status.cells + ", unpooled runs " + s.status.unpooled +
    (discarded ? ", discarded: " + discarded : "");

  fill($("commands").tBodies[0], s.commands.map((c) => {
    const tr = row([c.sandbox, c.kind, c.profile, [c.command, "cmd"], duration(c.elapsed_ms),
      c.cpu_ms === null ? "–" : ms(c.cpu_ms), bytes(c.memory_bytes)]);
    tr.dataset.id = c.id;
    return tr;
  }));
  $("commands-empty").hidden = s.commands.length > 0;
  $("updated").textContent = "updated " + new Date(s.unix_ms).toLocaleTimeString();
}

async function pollSnapshot() {
  try {
    showSnapshot(await getJSON("/ui/api/snapshot"));
    failures = 0;
    $("status").textContent = "live";
    $("status").className = "status live";
  } catch (e) {
    failures++;
    if (failures > 1) {
      $("status").textContent = "disconnected: " + e.message;
      $("status").className = "status down";
    }
  }
}

function traceLink(id) {
  if (!id) return el("span", "–", "muted");
  const a = el("a", id.slice(0, 12) + "…", "trace");
  a.href = "/ui/trace/" + encodeURIComponent(id);
  a.title = id;
  a.dataset.trace = id;
  return a;
}

async function pollDenials() {
  try {
    const recs = await getJSON("/ui/api/denials?limit=30");
    const items = recs.slice().reverse().map((r) => {
      const li = document.createElement("li");
      li.append(el("span", r.time + " "), el("span", (r.sandbox_id || "-") + " "),
        el("span", r.decision + (r.escalation ? "/" + r.escalation : "") + " "),
        el("span", r.action + " " + r.resource + " "), el("span", r.rule, "rule"),
        el("span", r.reason ? " " + r.reason : ""));
      li.dataset.sandbox = r.sandbox_id;
      return li;
    });
    $("denials").replaceChildren(...items);
    $("denials-empty").hidden = items.length > 0;
  } catch (e) {
    /* shown by the snapshot's status */
  }
}

async function search(ev) {
  if (ev) ev.preventDefault();
  const form = $("audit-form");
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(form)) {
    if (String(v).trim() !== "") params.set(k, String(v).trim());
  }
  $("audit-error").textContent = "";
  try {
    const recs = await getJSON("/ui/api/audit?" + params.toString());
    const rows = recs.slice().reverse().map((r) => {
      const detail = r.kind === "run"
        ? "exit " + (r.exit === undefined || r.exit === null ? "–" : r.exit)
        : (r.escalation ? r.escalation + ": " : "") + (r.reason || "");
      const tr = row([[r.time, "time"], r.kind, [r.sandbox_id || "–", "sb"], [r.decision, "decision"], r.action,
        [r.resource, "res"], r.rule || "", detail, traceLink(r.trace_id)], r.decision);
      tr.dataset.decision = r.decision;
      tr.dataset.sandbox = r.sandbox_id;
      tr.dataset.kind = r.kind;
      return tr;
    });
    fill($("audit").tBodies[0], rows);
    $("audit-count").textContent = rows.length + " record" + (rows.length === 1 ? "" : "s") + ", newest first";
    $("audit-count").dataset.count = String(rows.length);
  } catch (e) {
    $("audit-error").textContent = e.message;
    fill($("audit").tBodies[0], []);
    $("audit-count").textContent = "";
    delete $("audit-count").dataset.count;
  }
}

function start() {
  const m = window.location.pathname.match(/^\/ui\/trace\/([^/]+)$/);
  if (m) {
    const id = decodeURIComponent(m[1]);
    $("audit-form").elements.trace.value = id;
    $("audit-title").textContent = "Audit log: trace " + id;
  }
  $("audit-form").addEventListener("submit", search);
  pollSnapshot();
  pollDenials();
  search();
  setInterval(pollSnapshot, 1000);
  setInterval(pollDenials, 2000);
}

document.addEventListener("DOMContentLoaded", start);
