// skyward dashboard: fills the page's tables from the JSON API and keeps them current.
// Every value goes into the page with textContent: nothing the API returns is read as HTML.
"use strict";

const TOKEN = document.querySelector('meta[name="skyward-token"]').content;
const PAGE = document.body.dataset.page;
const CLUSTER = document.body.dataset.cluster;
const JOB = document.body.dataset.job;
const ACTIVE = ["PENDING", "SETTING_UP", "RUNNING"];

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function link(href, text) {
  const a = el("a", text);
  a.href = href;
  return a;
}

function say(text, bad) {
  const m = document.getElementById("message");
  m.textContent = text || "";
  m.className = bad ? "bad" : "";
}

async function api(path) {
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  const body = await r.json();
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  return body;
}

async function post(path, question) {
  if (!window.confirm(question)) return;
  say("working: " + question.replace(/\?$/, "") + " ...");
  try {
    const r = await fetch(path, {method: "POST", credentials: "same-origin",
                                 headers: {"X-Skyward-Token": TOKEN}});
    const body = await r.json();
    say(body.error ? body.error : "done", Boolean(body.error));
  } catch (e) {
    say("the dashboard did not answer: " + e, true);
  }
  refresh();
}

function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const cell of cells) {
      const td = el("td");
      td.append(cell instanceof Node ? cell : document.createTextNode(cell === null || cell === undefined ? "-" : String(cell)));
      tr.append(td);
    }
    return tr;
  }));
  const empty = document.querySelector('.empty[data-for="' + tableId + '"]');
  if (empty) empty.hidden = rows.length > 0;
}

function badge(status) {
  return el("span", status, "badge " + String(status).toLowerCase());
}

function dollars(x) {
  return x === null || x === undefined ? "-" : "$" + Number(x).toFixed(x > 0 && x < 1 ? 4 : 2);
}

function gpu(n) {
  if (n.gpus === null || n.gpus === undefined) return "no GPU";
  if (!n.gpus.length) return "nvidia-smi failed";
  return n.gpus.map((g, i) => "GPU" + i + " " + g.util.toFixed(0) + " %, " + (g.memory_used / 1024).toFixed(1) +
                    " of " + (g.memory_total / 1024).toFixed(1) + " GiB").join("; ");
}

// A cluster's timeline, newest first: each event's time, kind and text (as text).
function timeline(events) {
  const list = document.getElementById("events");
  list.replaceChildren(...(events || []).map((e) => {
    const li = el("li");
    li.append(el("span", new Date(e.at * 1000).toLocaleString(), "when"), el("span", e.kind, "kind"), el("span", e.text));
    return li;
  }));
  document.querySelector('.empty[data-for="events"]').hidden = list.children.length > 0;
}

function ago(when) {
  if (!when) return "-";
  const s = Math.max(0, Math.floor(Date.now() / 1000 - when));
  if (s >= 86400) return Math.floor(s / 86400) + " d ago";
  if (s >= 3600) return Math.floor(s / 3600) + " h ago";
  if (s >= 60) return Math.floor(s / 60) + " min ago";
  return s + " s ago";
}

function duration(job) {
  if (!job.started) return "-";
  const s = Math.floor((job.ended || Date.now() / 1000) - job.started);
  return s >= 3600 ? Math.floor(s / 3600) + "h " + Math.floor(s % 3600 / 60) + "m" :
    s >= 60 ? Math.floor(s / 60) + "m " + (s % 60) + "s" : s + "s";
}

function bytes(n) {
  return (n / 1073741824).toFixed(1) + " GiB";
}

function button(text, cls, onclick) {
  const b = el("button", text, cls);
  b.addEventListener("click", onclick);
  return b;
}

function clusterButtons(name, status) {
  const span = el("span", null, "buttons");
  const q = (what) => what + " cluster " + name + "?";
  if (status === "UP") span.append(button("stop", "", () => post("/api/clusters/" + name + "/stop", q("stop"))));
  if (status === "STOPPED") span.append(button("start", "", () => post("/api/clusters/" + name + "/start", q("start"))));
  span.append(button("down", "danger", () => post("/api/clusters/" + name + "/down", q("down (end) "))));
  return span;
}

async function clusters() {
  const found = await api("/api/clusters");
  if (found.error) return say(found.error, true);
  let total = 0;
  let priced = false;
  fill("clusters", found.map((c) => {
    total += c.cost_so_far || 0;
    priced = priced || c.price_per_hour !== null;
    return [link("/clusters/" + c.name, c.name), c.provider, c.nodes, badge(c.status), c.autostop,
            dollars(c.price_per_hour), dollars(c.cost_so_far), clusterButtons(c.name, c.status)];
  }));
  const month = await api("/api/costs");
  document.getElementById("total").textContent = (!found.length ? "" : priced ? "clusters up now, so far: " +
    dollars(total) + ". " : "no price known for these clusters (SSH hosts). ") + (month.error ? month.error :
    "This month (" + month.month + "): " + dollars(month.total) + (month.ended ? ", " + month.ended +
    " ended cluster(s) counted" : "") + (month.unpriced.length ? "; no price for " + month.unpriced.join(", ") : ""));
}

// The pools of running scripts that opted in (their snapshots), with their tasks per second.
async function pools() {
  const found = await api("/api/pools");
  if (found.error) return say(found.error, true);
  fill("pools", found.map((p) => {
    const ready = p.nodes.filter((n) => n.stage === "ready").length;
    const rate = el("span", null, "rate");
    rate.append(Number(p.tasks_per_second).toFixed(1) + " ", spark("pool " + p.pid + " " + p.pool, p.tasks_per_second, null));
    return [p.script || "-", p.pid, p.pool, p.provider, ready + " of " + p.nodes.length + " ready",
            p.running + " running, " + p.done + " done, " + p.failed + " failed", rate, ago(p.started)];
  }));
}

async function home() {
  await Promise.all([clusters(), pools()]);
}

// The last minutes of CPU % per node, drawn as a small SVG line (no library).
const HISTORY = {};
const SVG = "http://www.w3.org/2000/svg";

// (``top``: the value drawn at the top; null: the highest of the points shown)
function spark(key, value, top) {
  const points = (HISTORY[key] = (HISTORY[key] || []).concat([value]).slice(-60));
  const high = top || Math.max(1, ...points);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 120 24");
  svg.setAttribute("class", "spark");
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.map((v, i) => (i * 2) + "," + (23 - v * 22 / high).toFixed(1)).join(" "));
  svg.append(line);
  return svg;
}

function jobRows(list, withCluster) {
  return list.map((j) => {
    const row = [link("/clusters/" + j.cluster + "/jobs/" + j.id, j.id), j.name, ago(j.submitted), duration(j),
                 j.resources, dollars(j.cost), badge(j.status)];
    return withCluster ? [link("/clusters/" + j.cluster, j.cluster), ...row] : row;
  });
}

async function cluster() {
  const c = await api("/api/clusters/" + CLUSTER);
  if (c.error) {
    say(c.error, true);
    if (c.gone) {  // (ended while this page was open)
      document.getElementById("summary").replaceChildren(badge("GONE"));
      document.getElementById("actions").replaceChildren();
      fill("nodes", []);
      fill("jobs", []);
      timeline(c.events);
    }
    return;
  }
  document.getElementById("summary").replaceChildren(badge(c.status), " " + c.provider + ", " + c.nodes +
    " node(s), " + c.resources + ", autostop " + c.autostop + ", " + dollars(c.price_per_hour) + "/h, " +
    dollars(c.cost_so_far) + " so far");
  document.getElementById("actions").replaceChildren(clusterButtons(c.name, c.status));
  fill("nodes", c.nodes.map((n) => n.state === "up" ?
    [n.node, n.host, badge("up"), n.cpu.toFixed(1) + " %", spark("node " + n.node, n.cpu, 100),
     bytes(n.memory_used) + " of " + bytes(n.memory_total), gpu(n)] :
    [n.node, n.host, badge(n.state || c.status), null, null, n.why || null, null]));
  timeline(c.events);
  if (c.jobs.error) say(c.jobs.error, true);
  else fill("jobs", jobRows(c.jobs.map((j) => Object.assign({cluster: c.name}, j)), false));
}

function seconds(s) {
  s = Math.floor(s);
  return s >= 3600 ? Math.floor(s / 3600) + "h " + Math.floor(s % 3600 / 60) + "m" :
    s >= 60 ? Math.floor(s / 60) + "m " + (s % 60) + "s" : s + "s";
}

function managedCancel(id) {
  return button("cancel", "danger", () => post("/api/managed/" + id + "/cancel", "cancel managed job " + id + "?"));
}

async function managed() {
  const found = await api("/api/managed");
  if (found.error) return say(found.error, true);
  fill("managed", found.map((j) => [link("/managed/" + j.id, j.id), j.name, ago(j.submitted), seconds(j.total_duration),
    seconds(j.job_duration), j.recoveries, j.resources, dollars(j.cost), badge(j.status),
    j.active ? managedCancel(j.id) : ""]));
}

async function jobs() {
  await managed();
  const found = await api("/api/jobs");
  if (found.error) return say(found.error, true);
  const rows = [];
  const problems = [];
  for (const q of found) {
    if (q.error) problems.push(q.cluster + ": " + q.error);
    rows.push(...q.jobs.map((j) => Object.assign({cluster: q.cluster}, j)));
  }
  rows.sort((a, b) => b.submitted - a.submitted);
  fill("jobs", jobRows(rows, true));
  say(problems.join("; "), problems.length > 0);
}

// A job's log: only the lines not seen yet are asked for (per node), and appended as text; the
// page keeps the last KEPT_LINES of them (a job printing thousands a second stays readable).
const KEPT_LINES = 5000;
let seen = "";
let dropped = 0;
let finished = false;

function shown(line) {
  const filter = document.getElementById("filter").value;
  return !filter || line.textContent.includes(filter);
}

// (a cluster job's log, or with MANAGED a managed job's: its saved attempts, then the live one)
const MANAGED = PAGE === "managed";

async function log() {
  const r = await api(MANAGED ? "/api/managed/" + JOB + "/log?seen=" + encodeURIComponent(seen) :
                      "/api/clusters/" + CLUSTER + "/jobs/" + JOB + "/log?seen=" + encodeURIComponent(seen));
  if (r.error) return say(r.error, true);
  const j = r.job;
  const active = MANAGED ? r.active : ACTIVE.includes(j.status);
  document.getElementById("summary").replaceChildren(badge(j.status), " " + j.name + ", " + j.resources +
    ", submitted " + ago(j.submitted) + ", ran " + (MANAGED ? seconds(j.job_duration) + ", " + j.recoveries +
    " recoveries" + (j.cluster ? " (cluster " + j.cluster + ")" : "") : duration(j)) +
    (j.exit_code !== null ? ", exit code " + j.exit_code : "") + (MANAGED && j.reason ? ": " + j.reason : ""));
  document.getElementById("cancel").hidden = !active;
  const pre = document.getElementById("log");
  const kept = r.lines.slice(-KEPT_LINES);  // (a page keeps the last lines, as a terminal does)
  dropped += r.lines.length - kept.length;
  for (const line of kept) {
    const div = el("div", (line.node === null ? "" : "[node " + line.node + "] ") + line.text, "line");
    div.hidden = !shown(div);
    pre.append(div);
  }
  for (let extra = pre.querySelectorAll(".line").length - KEPT_LINES; extra > 0; extra--) {
    pre.querySelector(".line").remove();
    dropped++;
  }
  if (r.note) pre.prepend(el("div", r.note, "skipped muted"));  // (it starts from a node's last bytes)
  if (dropped) {
    const note = pre.querySelector(".dropped") || el("div", null, "dropped muted");
    note.textContent = dropped + " earlier lines not shown here (the page keeps the last " + KEPT_LINES +
      "; `skyward " + (MANAGED ? "jobs logs " + JOB : "logs " + CLUSTER + " " + JOB) + "` prints them all)";
    pre.prepend(note);
  }
  seen = Object.entries(r.seen).map(([n, c]) => n + ":" + c).join(",");
  if (r.lines.length && document.getElementById("follow").checked) pre.scrollTop = pre.scrollHeight;
  finished = !active && r.lines.length === 0;
}

function setUpJob() {
  document.getElementById("cancel").addEventListener("click", () => MANAGED ?
    post("/api/managed/" + JOB + "/cancel", "cancel managed job " + JOB + "?") :
    post("/api/clusters/" + CLUSTER + "/jobs/" + JOB + "/cancel", "cancel job " + JOB + " of cluster " + CLUSTER + "?"));
  document.getElementById("filter").addEventListener("input", () => {
    for (const line of document.querySelectorAll("#log .line")) line.hidden = !shown(line);
  });
}

const REFRESH = {clusters: [home, 3000], cluster: [cluster, 3000], jobs: [jobs, 3000], job: [log, 1000],
                 managed: [log, 1000]};
let busy = false;

async function refresh() {
  if (busy || finished) return;
  busy = true;
  try {
    await REFRESH[PAGE][0]();
  } catch (e) {
    say("the dashboard did not answer: " + e, true);
  } finally {
    busy = false;
  }
}

if (PAGE === "job" || MANAGED) setUpJob();
refresh();
setInterval(refresh, REFRESH[PAGE][1]);
