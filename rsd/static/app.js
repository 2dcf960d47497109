// rsd's dashboard: a hash router over /api/, one poll at a time, at most once a second.
// Everything shown is set as text (never as HTML), so no value can inject markup.
"use strict";

const POLL_MS = 1000;
let token = sessionStorage.getItem("rsd-token") || "";
let timer = null;
let lastOps = null;  // [ops_total, time] of the previous overview, for the rate

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function link(text, hash) { return el("a", { href: "#" + hash }, text); }
const enc = encodeURIComponent;

function table(headers, rows) {
  if (!rows.length) return el("p", {}, "None.");
  return el("table", {}, el("tr", {}, headers.map((h) => el("th", {}, h))),
    rows.map((row) => el("tr", {}, row.map((cell) => el("td", {}, cell ?? "")))));
}

function cards(pairs) {
  return el("div", { class: "cards" },
    pairs.map(([label, value]) => el("div", { class: "card" }, el("b", {}, value ?? "–"), label)));
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "never";
}

class HttpError extends Error {
  constructor(status, body) { super(body.message || ("HTTP " + status)); this.status = status; }
}

async function api(path, options) {
  const headers = { "Accept": "application/json" };
  if (token) headers["Authorization"] = "Bearer " + token;
  if (options && options.body) headers["Content-Type"] = "application/json";
  const response = await fetch("/api/" + path, { ...options, headers, credentials: "omit" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new HttpError(response.status, body);
  return body;
}

function post(path, body) {
  return api(path, { method: "POST", body: JSON.stringify(body || {}) });
}

// ---- pages: each returns the nodes to show --------------------------------------------

async function overview() {
  const data = await api("overview");
  const s = data.stats;
  const now = Date.now() / 1000;
  let rate = null;
  if (lastOps && now > lastOps[1]) rate = ((s.ops_total - lastOps[0]) / (now - lastOps[1])).toFixed(1);
  lastOps = [s.ops_total, now];
  document.getElementById("who").textContent = "tenant " + data.tenant + " (" + data.role + ")";
  const tasks = Object.entries(s.tasks || {});
  const boxes = (s.queue_depths || {}).mailboxes || [];
  const nodes = [
    el("h1", {}, "Overview"),
    cards([
      ["requests/s", rate], ["connections", s.connections], ["leases held", s.leases_held],
      ["loop: longest stall ms", (s.loop || {}).longest_stall_ms],
      ["fsync p99 ms", (s.fsync_ms || {}).p99], ["journal bytes", s.journal_bytes],
      ["last snapshot", when(s.last_snapshot_at)], ["uptime s", Math.round(s.uptime_seconds)],
    ]),
    el("h2", {}, "Tasks by state"),
    table(tasks.map(([state]) => state), [tasks.map(([, count]) => count)]),
    el("h2", {}, "Queue depths"),
    table(["mailbox", "ready", "running"], boxes.map((b) => [b.mailbox, b.ready, b.running])),
  ];
  const cluster = data.cluster || s.cluster;
  if (cluster) {
    nodes.push(el("h2", {}, "Cluster " + cluster.cluster + ", epoch " + cluster.epoch),
      table(["node", "address", "role", "sync", "lag records", "lag bytes"],
        cluster.members.map((m) => [m.node, m.address, m.role, m.sync ? "yes" : "",
          m.lag_records, m.lag_bytes])));
  }
  return nodes;
}

async function runs(query) {
  const cursor = query.get("cursor") || "0";
  const data = await api("runs?limit=100&cursor=" + enc(cursor));
  return [
    el("h1", {}, "Runs"),
    el("form", { onsubmit: (e) => { e.preventDefault(); location.hash = "/runs/" + enc(e.target.run.value); } },
      el("input", { name: "run", placeholder: "run id" }), el("button", {}, "Open")),
    table(["run", "created", "cancelled", "claims", "tasks", "unfinished", "mailboxes"],
      data.scopes.map((r) => [link(r.scope, "/runs/" + enc(r.scope)), when(r.created_at),
        r.cancelled ? "yes" : "", r.claims, r.tasks, r.unfinished, r.queues])),
    data.next !== null ? link("Next page", "/runs?cursor=" + data.next) : null,
  ];
}

async function run(id) {
  const data = await api("runs/" + enc(id));
  const status = data.run;
  const counts = Object.entries(status.tasks || {});
  const mailboxes = [...new Set(data.tasks.tasks.map((t) => t.mailbox).filter((m) => m))];
  return [
    el("h1", {}, "Run " + id, status.state === "cancelled" ? " (cancelled)" : ""),
    status.state === "cancelled" ? null : el("button", { class: "danger", id: "cancel", onclick: async () => {
      if (!confirm("Cancel run " + id + "?")) return;
      await act(() => post("runs/" + enc(id) + "/cancel"));
    } }, "Cancel the run"),
    " ", link("Schedules", "/runs/" + enc(id) + "/schedules"),
    el("h2", {}, "Tasks by state"),
    table(counts.map(([state]) => state), [counts.map(([, n]) => n)]),
    el("h2", {}, "Mailboxes"),
    el("ul", {}, mailboxes.map((m) => el("li", {}, link(m, "/runs/" + enc(id) + "/mailboxes/" + enc(m))))),
    el("h2", {}, "Claims"),
    table(["key", "holder", "generation", "expires in s", "waiters"],
      data.claims.claims.map((c) => [c.key, c.holder, c.generation, c.expires_in, c.waiters])),
    el("h2", {}, "Tasks"),
    table(["id", "kind", "mailbox", "key", "state", "attempt"],
      data.tasks.tasks.map((t) => [link(t.id, "/runs/" + enc(id) + "/tasks/" + enc(t.id)),
        t.kind, t.mailbox, t.key, t.state, t.attempt])),
    el("h2", {}, "Run status"), el("pre", {}, JSON.stringify(status, null, 2)),
  ];
}

async function mailbox(id, name) {
  const base = "runs/" + enc(id) + "/mailboxes/" + enc(name);
  const data = await api(base);
  const dead = await api(base + "/dead-letters?limit=100");
  const c = data.counts;
  return [
    el("h1", {}, "Mailbox " + name + " of run ", link(id, "/runs/" + enc(id))),
    cards([["ready", c.ready], ["running", c.running], ["delayed", c.delayed],
      ["consumers", c.consumers], ["dead letters", c.dead_letters]]),
    el("h2", {}, "Dead letters (" + dead.count + ")"),
    dead.count ? el("button", { id: "requeue-all", onclick: () => act(() => post(base + "/requeue", { all: true })) },
      "Requeue all") : null,
    table(["id", "kind", "reason", "attempts", "data", ""],
      dead.items.map((d) => [d.id, d.kind, d.reason, d.attempt ?? d.attempts,
        JSON.stringify(d.data ?? null).slice(0, 120),
        el("button", { onclick: () => act(() => post(base + "/requeue", { id: d.id })) }, "Requeue")])),
  ];
}

async function task(id, taskId) {
  const t = await api("runs/" + enc(id) + "/tasks/" + enc(taskId));
  return [
    el("h1", {}, "Task " + taskId + " of run ", link(id, "/runs/" + enc(id))),
    cards([["state", t.state], ["attempt", t.attempt], ["subscribers", (t.subscribers || []).length],
      ["deadline", t.deadline ? when(t.deadline) : "none"]]),
    el("pre", {}, JSON.stringify(t, null, 2)),
  ];
}

async function schedules(id) {
  const data = await api("runs/" + enc(id) + "/schedules");
  return [
    el("h1", {}, "Schedules of run ", link(id, "/runs/" + enc(id))),
    el("pre", {}, JSON.stringify(data.schedules, null, 2)),
  ];
}

async function pools(query) {
  const data = await api("pools?limit=100&cursor=" + enc(query.get("cursor") || "0"));
  return [
    el("h1", {}, "Pools"),
    table(["name", "size", "held", "waiters", "generation"],
      data.pools.map((p) => [p.name, p.size, p.held, p.waiters, p.generation])),
    data.next !== null ? link("Next page", "/pools?cursor=" + data.next) : null,
  ];
}

// ---- the router and the poll ----------------------------------------------------------

function route() {
  const [path, search] = (location.hash.slice(1) || "/").split("?");
  const query = new URLSearchParams(search || "");
  const parts = path.split("/").filter((p) => p).map(decodeURIComponent);
  if (!parts.length) return () => overview();
  if (parts[0] === "runs" && parts.length === 1) return () => runs(query);
  if (parts[0] === "pools") return () => pools(query);
  if (parts[0] === "runs" && parts.length === 2) return () => run(parts[1]);
  if (parts[0] === "runs" && parts[2] === "mailboxes" && parts.length === 4) return () => mailbox(parts[1], parts[3]);
  if (parts[0] === "runs" && parts[2] === "tasks" && parts.length === 4) return () => task(parts[1], parts[3]);
  if (parts[0] === "runs" && parts[2] === "schedules") return () => schedules(parts[1]);
  return async () => [el("h1", {}, "Not found")];
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function refresh() {
  clearTimeout(timer);
  const view = document.getElementById("view");
  try {
    const nodes = await route()();
    if (document.activeElement && view.contains(document.activeElement) &&
        document.activeElement.tagName === "INPUT") {
      // the user is typing in the page: keep it as it is this time
    } else {
      view.replaceChildren(...nodes.filter((n) => n !== null));
    }
    showError("");
    document.getElementById("login").hidden = true;
    document.getElementById("stamp").textContent = "Last: " + new Date().toLocaleTimeString();
  } catch (error) {
    if (error instanceof HttpError && error.status === 401) {
      document.getElementById("login").hidden = false;
      showError("This server needs an admin token: " + error.message);
      return;  // no polling until a token is given
    }
    showError(error.message);
  }
  timer = setTimeout(refresh, POLL_MS);
}

async function act(action) {
  try {
    await action();
    showError("");
  } catch (error) {
    showError(error.message);
  }
  refresh();
}

function start() {
  if (location.hash.startsWith("#token=")) {
    token = decodeURIComponent(location.hash.slice(7));
    sessionStorage.setItem("rsd-token", token);
    history.replaceState(null, "", "#/");
  }
  document.getElementById("forget").hidden = !token;
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem("rsd-token");
    token = "";
    location.reload();
  });
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    token = document.getElementById("token").value.trim();
    sessionStorage.setItem("rsd-token", token);
    document.getElementById("forget").hidden = false;
    refresh();
  });
  window.addEventListener("hashchange", () => { lastOps = null; refresh(); });
  refresh();
}

start();
