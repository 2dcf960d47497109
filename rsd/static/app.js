// rsd's dashboard: a hash router over /api/, one poll at a time, at most once a second.
// Everything shown is set as text (never as HTML), so no value can inject markup. The
// overview's chart is uPlot (/static/vendor/, shipped in the package: no CDN).
"use strict";

const POLL_MS = 1000;
const HISTORY_ROWS = 600;  // the server's ring: ten minutes at one row a second
let token = sessionStorage.getItem("rsd-token") || "";
let timer = null;
// When a mouse button or a finger went down on the page (0: none is down): a click under
// way. A refresh that replaced the page between the press and the release would take away
// the element pressed, and the browser would give the click to no link or button at all
// (a real click lasts about a tenth of a second; the page is redrawn every second). A
// press held longer than PRESS_MS (or whose release the page never heard) holds nothing.
let pressedAt = 0;
const PRESS_MS = 5000;

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

function table(headers, rows, attrs) {
  if (!rows.length) return el("p", { class: "none" }, "None.");
  return el("table", attrs || {}, el("tr", {}, headers.map((h) => el("th", {}, h))),
    rows.map((row) => el("tr", {}, row.map((cell) => el("td", {}, cell ?? "")))));
}

function cards(pairs) {
  return el("div", { class: "cards" },
    pairs.map(([label, value]) => el("div", { class: "card" }, el("b", {}, value ?? "–"), label)));
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "never";
}

function yes(flag) { return flag ? "yes" : ""; }

function counts(map) {
  return Object.entries(map || {}).map(([state, n]) => state + " " + n).join(", ");
}

function json(value) { return JSON.stringify(value ?? null, null, 2); }

// Of a sharded cluster, every row of a listing names its shard: a first column for it
// (a server alone, or a cluster of one shard, has none and shows none).
function sharded(headers, rows, found, attrs) {
  if (!found.some((row) => row.shard !== undefined)) return table(headers, rows, attrs);
  return table(["shard", ...headers], rows.map((row, n) => [found[n].shard, ...row]), attrs);
}

// The shards a listing could not ask (no primary, no answer in time): named, not hidden.
function unavailable(data) {
  const missing = Object.entries((data && data.unavailable) || {});
  if (!missing.length) return null;
  return el("p", { class: "note unavailable" }, "Not shown: " +
    missing.map(([shard, why]) => "shard " + shard + " (" + why + ")").join("; "));
}

function spans(ranges) {
  return (ranges || []).map(([lo, hi]) => lo === hi ? String(lo) : lo + "-" + hi).join(", ");
}

// The overview's shards: each one's primary, members, slots and runs, its figures beside.
function shardTable(data) {
  const each = data.stats.shards || {};
  const failing = data.shards.some((row) => row.error);  // a column for why, only then
  return table(["shard", "primary", "members", "slots", "runs", "connections", "leases held",
    "requests", "fsync p99 ms", "loop: longest stall ms", ...(failing ? ["not answering"] : [])],
  data.shards.map((row) => {
    const s = each[row.shard] || {};
    return [row.shard, row.primary ?? "none", row.members.map((m) => m.node + " (" + m.role + ")").join(", "),
      spans(row.slots) || "none", row.runs, s.connections, s.leases_held, s.ops_total,
      (s.fsync_ms || {}).p99, (s.loop || {}).longest_stall_ms, ...(failing ? [row.error || ""] : [])];
  }), { id: "shards" });
}

// A listing's "Next page" link: the same route with ``cursor`` (or ``name``) set.
function more(data, hash, name) {
  if (data.next === null || data.next === undefined) return null;
  const [path, search] = hash.split("?");
  const query = new URLSearchParams(search || "");
  query.set(name || "cursor", data.next);
  return el("p", {}, link("Next page", path + "?" + query.toString()));
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

// A page's requests made together, answered together: their values once every one has
// answered, else the first one's error, thrown only then. A page refused (a wrong token
// refuses each of its requests) shows the login form once none of its requests is still
// out, so no refusal of the refused page lands after the form, in the next one's state.
async function together(requests) {
  const answers = await Promise.allSettled(requests);
  const refused = answers.find((answer) => answer.status === "rejected");
  if (refused) throw refused.reason;
  return answers.map((answer) => answer.value);
}

function post(path, body) {
  return api(path, { method: "POST", body: JSON.stringify(body || {}) });
}

// ---- the chart of the last minutes (/api/history) -------------------------------------

const hist = { rows: [], last: 0, columns: [] };  // the rows kept, the newest's number
const CHARTS = [
  { title: "Requests per second", series: [["requests_per_second", "requests/s", "#0969da"]] },
  { title: "Work and holders", series: [
    ["pending", "pending", "#9a6700"], ["running", "running", "#1a7f37"],
    ["delayed", "delayed", "#8250df"], ["leases_held", "leases held", "#0969da"],
    ["connections", "connections", "#57606a"]] },
  { title: "Latency (ms)", series: [
    ["loop_lag_ms", "loop lag", "#cf222e"], ["fsync_p99_ms", "fsync p99", "#bc4c00"]] },
];
let charts = null;  // [{spec, plot, node}] while the overview is shown

async function pollHistory() {
  const got = await api("history?after=" + hist.last);
  if (got.last < hist.last) hist.rows = [];  // another rsd since: start over
  hist.columns = got.columns;
  hist.rows = hist.rows.concat(got.rows).slice(-HISTORY_ROWS);
  hist.last = got.last;
}

function chartData(spec) {
  const column = (name) => hist.columns.indexOf(name);
  return [hist.rows.map((row) => row[column("time")]),
    ...spec.series.map(([name]) => hist.rows.map((row) => row[column(name)]))];
}

function chartNodes() {
  if (charts === null) {
    charts = CHARTS.map((spec) => {
      const node = el("div", { class: "chart" });
      const plot = new uPlot({
        title: spec.title, width: 420, height: 190,
        scales: { x: { time: true } },
        series: [{}, ...spec.series.map(([, label, stroke]) => ({ label, stroke, width: 1.5 }))],
        axes: [{}, { size: 48 }],
      }, chartData(spec), node);
      return { spec, plot, node };
    });
  } else {
    for (const chart of charts) chart.plot.setData(chartData(chart.spec));
  }
  return el("div", { class: "charts" }, charts.map((chart) => chart.node));
}

function leaveCharts() {
  if (charts === null) return;
  for (const chart of charts) chart.plot.destroy();
  charts = null;
}

// ---- pages: each returns the nodes to show --------------------------------------------

async function overview() {
  const [data] = await together([api("overview"), pollHistory()]);
  const s = data.stats;
  const newest = hist.rows.length ? hist.rows[hist.rows.length - 1] : null;
  const rate = newest ? newest[hist.columns.indexOf("requests_per_second")] : null;
  document.getElementById("who").textContent = "tenant " + data.tenant + " (" + data.role + ")";
  const tasks = Object.entries(s.tasks || {});
  const boxes = data.mailboxes;
  // Of a sharded cluster, the figures are every shard's summed (each one's in "Shards");
  // the chart is this node's, the shard the page is served from.
  const figures = data.shards ? [
    ["requests/s (shard " + data.shard + ")", rate], ["connections", s.connections],
    ["leases held", s.leases_held], ["runs", (s.core || {}).scopes], ["shards", data.shards.length],
    ["slots", data.slots], ["map epoch", data.map_epoch],
  ] : [
    ["requests/s", rate], ["connections", s.connections], ["leases held", s.leases_held],
    ["loop: longest stall ms", (s.loop || {}).longest_stall_ms],
    ["fsync p99 ms", (s.fsync_ms || {}).p99], ["journal bytes", s.journal_bytes],
    ["last snapshot", when(s.last_snapshot_at)], ["uptime s", Math.round(s.uptime_seconds)],
  ];
  const nodes = [
    el("h1", {}, "Overview"),
    cards(figures),
    data.shards ? el("h2", {}, "Shards (" + data.slots + " slots, map epoch " + data.map_epoch + ")") : null,
    data.shards ? shardTable(data) : null,
    unavailable(data),
    el("h2", {}, data.shards ? "The last minutes (shard " + data.shard + ")" : "The last minutes"),
    chartNodes(),
    el("h2", {}, "Tasks by state"),
    table(tasks.map(([state]) => state), [tasks.map(([, count]) => count)]),
    el("h2", {}, "Most recent runs"),
    sharded(["run", "created", "cancelled", "claims", "tasks", "unfinished", "mailboxes"],
      data.recent_runs.map((r) => [link(r.scope, "/runs/" + enc(r.scope)), when(r.created_at),
        r.cancelled ? "yes" : "", r.claims, r.tasks, r.unfinished, r.queues]),
      data.recent_runs, { id: "recent-runs" }),
    el("p", {}, link("Every run", "/runs")),
    el("h2", {}, "Mailboxes"),
    sharded(["mailbox", "ready", "running", "mode", "max attempts"],
      boxes.mailboxes.map((b) => [b.name, b.ready, b.running, b.mode, b.max_attempts]),
      boxes.mailboxes, { id: "mailboxes" }),
    boxes.next !== null ? el("p", {}, link("Every mailbox", "/mailboxes")) : null,
  ];
  const cluster = data.cluster || s.cluster;
  if (cluster) {
    // of a sharded cluster, the members of the serving node's shard (each shard's: "Shards")
    nodes.push(el("h2", {}, (data.shards ? "Nodes of shard " + data.shard + ": cluster " : "Cluster ") +
      cluster.cluster + ", epoch " + cluster.epoch),
      table(["node", "address", "role", "sync", "lag records", "lag bytes"],
        cluster.members.map((m) => [m.node, m.address, m.role, m.sync ? "yes" : "",
          m.lag_records, m.lag_bytes])));
  }
  return nodes;
}

async function runs(query) {
  const cursor = query.get("cursor") || "0";
  const data = await api("runs?newest_first=1&limit=100&cursor=" + enc(cursor));
  return [
    el("h1", {}, "Runs"),
    el("form", { onsubmit: (e) => { e.preventDefault(); location.hash = "/runs/" + enc(e.target.run.value); } },
      el("input", { name: "run", placeholder: "run id" }), el("button", {}, "Open")),
    el("p", { class: "note" }, data.scopes.some((r) => r.shard !== undefined)
      ? "Newest first, shard by shard." : "Newest first."),
    unavailable(data),
    sharded(["run", "created", "cancelled", "claims", "tasks", "unfinished", "mailboxes"],
      data.scopes.map((r) => [link(r.scope, "/runs/" + enc(r.scope)), when(r.created_at),
        r.cancelled ? "yes" : "", r.claims, r.tasks, r.unfinished, r.queues]), data.scopes,
      { id: "runs" }),
    more(data, "/runs?" + query.toString()),
  ];
}

async function run(id, query) {
  const base = "runs/" + enc(id);
  const [data, boxes, groups] = await together([
    api(base + "?tasks_limit=50&claims_limit=100&tasks_cursor=" + enc(query.get("tasks_cursor") || "0") +
      "&claims_cursor=" + enc(query.get("claims_cursor") || "0")),
    api(base + "/mailboxes?limit=100&cursor=" + enc(query.get("mailboxes_cursor") || "0")),
    api(base + "/groups?limit=100&cursor=" + enc(query.get("groups_cursor") || "0")),
  ]);
  const status = data.run;
  const tasks = Object.entries(status.tasks || {});
  const hash = "/runs/" + enc(id) + "?" + query.toString();
  const cancelled = status.state === "cancelled";
  return [
    el("h1", {}, "Run " + id, cancelled ? " (cancelled)" : ""),
    cancelled ? el("p", {}, "Cancelled: " + (status.reason || "")) : el("button", { class: "danger", id: "cancel", onclick: async () => {
      if (!confirm("Cancel run " + id + "? Its tasks end CANCELLED and its claims end.")) return;
      await act(() => post(base + "/cancel"));
    } }, "Cancel the run"),
    " ", link("Schedules", "/runs/" + enc(id) + "/schedules"),
    cards([["state", status.state], ["created", when(status.created_at)],
      ["claims held", status.claims], ["pool slots held", status.slots],
      data.shard !== undefined ? ["shard", data.shard] : null].filter((c) => c !== null)),
    el("h2", {}, "Tasks by state"),
    table(tasks.map(([state]) => state), [tasks.map(([, n]) => n)]),
    el("h2", {}, "Mailboxes"),
    table(["mailbox", "ready", "in flight", "delayed", "blocked", "consumers", "dead letters"],
      boxes.mailboxes.map((b) => [link(b.mailbox, "/runs/" + enc(id) + "/mailboxes/" + enc(b.mailbox)),
        b.ready, b.running, b.delayed, b.blocked_by_parents, b.consumers, b.dead_letters]), { id: "run-mailboxes" }),
    more(boxes, hash, "mailboxes_cursor"),
    el("h2", {}, "Groups"),
    table(["group", "tasks", "succeeded", "unfinished", "waiters", "by state"],
      groups.groups.map((g) => [g.group, g.tasks, g.succeeded, g.unfinished, g.waiters,
        counts(g.counts)]), { id: "groups" }),
    more(groups, hash, "groups_cursor"),
    el("h2", {}, "Claims"),
    table(["key", "holder", "generation", "expires in s", "released with its connection", "waiters"],
      data.claims.claims.map((c) => [c.key, c.holder, c.generation, c.expires_in,
        yes(c.release_on_disconnect), c.waiters]), { id: "claims" }),
    more(data.claims, hash, "claims_cursor"),
    el("h2", {}, "Tasks"),
    table(["id", "kind", "mailbox", "key", "state", "attempt", "reason"],
      data.tasks.tasks.map((t) => [link(t.id, "/runs/" + enc(id) + "/tasks/" + enc(t.id)),
        t.kind, t.mailbox, t.key, t.state, t.attempt, t.reason])),
    more(data.tasks, hash, "tasks_cursor"),
  ];
}

async function mailbox(id, name) {
  const base = "runs/" + enc(id) + "/mailboxes/" + enc(name);
  const [data, dead, owner] = await together([api(base), api(base + "/dead-letters?limit=100"),
    api("runs/" + enc(id) + "?tasks_limit=1&claims_limit=1")]);
  const c = data.counts;
  // A cancelled run takes no work: rsd refuses a requeue there (409), so none is offered.
  const requeue = owner.run.state !== "cancelled";
  return [
    el("h1", {}, "Mailbox " + name + " of run ", link(id, "/runs/" + enc(id))),
    cards([["ready", c.ready], ["in flight", c.running], ["delayed", c.delayed],
      ["blocked by parents", c.blocked_by_parents], ["consumers", c.consumers], ["dead letters", c.dead_letters], ["paused", c.paused ? "yes" : "no"]]),
    // A pause in this run (QUEUE_PAUSE): it takes work but delivers none. "paused" is also
    // yes while the mailbox is paused for every run, which only `rsctl mailbox resume` ends.
    requeue ? el("p", {},
      el("button", { id: "pause", onclick: () => act(() => post(base + "/pause", { paused: true })) },
        "Pause in this run"), " ",
      el("button", { id: "resume", onclick: () => act(() => post(base + "/pause", { paused: false })) },
        "Resume in this run")) : null,
    el("h2", {}, "Dead letters (" + dead.count + ")"),
    dead.count && requeue ? el("button", { id: "requeue-all", onclick: () => act(() => post(base + "/requeue", { all: true })) },
      "Requeue all") : null,
    dead.count && !requeue ? el("p", { class: "note" }, "The run is cancelled: its dead letters can be deleted, not requeued.") : null,
    dead.truncated ? el("p", { class: "note" }, "The newest that fit in one answer are shown.") : null,
    table(["id", "kind", "key", "reason", "attempts", "data", ""],
      dead.items.map((d) => [d.id, d.kind, d.key, d.reason, d.attempt,
        el("code", {}, JSON.stringify(d.data ?? null).slice(0, 120)),
        el("span", { class: "actions" },
          requeue ? el("button", { class: "requeue", "data-id": d.id, onclick: () => act(() => post(base + "/requeue", { id: d.id })) }, "Requeue") : null,
          el("button", { class: "delete danger", "data-id": d.id, onclick: () => {
            if (!confirm("Delete dead letter " + d.id + " for good?")) return;
            act(() => post(base + "/dead-letters/" + enc(d.id) + "/delete"));
          } }, "Delete"))]), { id: "dead-letters" }),
  ];
}

async function task(id, taskId) {
  const t = await api("runs/" + enc(id) + "/tasks/" + enc(taskId));
  const subscribers = t.subscribers || [];
  const delivery = t.delivery;
  return [
    el("h1", {}, (t.kind === "message" ? "Message " : "Task ") + taskId + " of run ", link(id, "/runs/" + enc(id))),
    cards([["state", t.state], ["attempt", t.attempt], ["subscribers", subscribers.length],
      ["deadline", t.deadline ? when(t.deadline) : "none"]]),
    table(["", ""], [
      ["mailbox", link(t.mailbox, "/runs/" + enc(id) + "/mailboxes/" + enc(t.mailbox))],
      ["key", t.key], ["reason", t.reason], ["dead-lettered", yes(t.dead)],
      ["created", when(t.created_at)], ["finished", t.finished_at ? when(t.finished_at) : ""],
      ["held by", delivery ? delivery.holder + " (expires in " + delivery.expires_in + " s)" : ""],
      ["subscribers", subscribers.join(", ")],
    ], { class: "fields" }),
    waitingFor(id, taskId, t),
    ...taskLinks(id, t),
    keyLimits(t),
    el("h2", {}, "Outcome"), el("pre", { id: "outcome" }, json(t.outcome)),
    el("h2", {}, "Data"), el("pre", { id: "data" }, json(t.data)),
    ...taskEvents(t),
  ];
}

// A task's parents (the tasks it was submitted after, and the one it is a child of) and
// its children, each a link to its own page with its state; the first 100 children.
function taskLinks(id, t) {
  const links = t.links;
  if (!links) return [];
  const tasks = (list) => list.length ? el("span", {}, ...list.flatMap((p, i) => [
    i ? ", " : "", link(p.id, "/runs/" + enc(id) + "/tasks/" + enc(p.id)), " (" + (p.state || "forgotten") + ")"])) : "";
  const rows = [];
  if (links.after.length) rows.push(["after", tasks(links.after)], ["on parent failure", links.on_parent_failure]);
  if (links.parent) rows.push(["parent", tasks([links.parent])]);
  if (links.children_count) rows.push(["children (" + links.children_count + ")", tasks(links.children)]);
  return [el("h2", {}, "Parents and children"), table(["", ""], rows, { class: "fields", id: "links" })];
}

// A task's retained events (its progress and the state changes between), newest last;
// the page polls, so new ones show within a refresh.
function taskEvents(t) {
  const events = t.events || [];
  if (!events.length) return [];
  const what = (e) => e.kind === "progress" ? el("code", {}, JSON.stringify(e.data ?? null).slice(0, 200))
    : e.state + (e.kind === "state" ? " (attempt " + e.attempt + ")" : "");
  return [
    el("h2", {}, "Events" + (t.events_missed ? " (" + t.events_missed + " older dropped)" : "")),
    table(["seq", "kind", "what", "at"],
      events.map((e) => [e.seq, e.kind, what(e), e.at ? when(e.at) : ""]), { id: "events" }),
  ];
}

// A task submitted with limits by key: its keys and limits, and while a key holds it
// back, that key's state (how many of it run, or its period's count and end).
function keyLimits(t) {
  const limits = t.limits;
  if (!limits) return null;
  const held = t.held_by;
  const rows = [];
  if (limits.concurrency_key != null) rows.push(["concurrency key", limits.concurrency_key + " (at most " + limits.concurrency_limit + " running)"]);
  if (limits.rate_key != null) rows.push(["rate key", limits.rate_key + " (at most " + limits.rate_limit + " per " + limits.rate_period_seconds + " s)"]);
  rows.push(["held back by", !held ? "nothing" : held.kind === "concurrency"
    ? "concurrency key " + held.key + ": " + held.running + " of " + held.limit + " running"
    : "rate key " + held.key + ": " + held.count + " of " + held.limit + " this period, until " + when(held.period_ends_at)]);
  return el("div", { id: "key-limits" }, el("h2", {}, "Limits by key"), table(["", ""], rows, { class: "fields" }));
}

// A WAITING task: what it waits for, until when, and a button that sends that signal
// (TASK_SIGNAL through the API), with the JSON typed beside it as its data.
function waitingFor(id, taskId, t) {
  const signals = t.signals;
  if (t.state !== "WAITING" || !signals) return null;
  const data = el("input", { id: "signal-data", placeholder: "data, as JSON (empty: null)", size: "40" });
  return el("div", { id: "waiting" },
    el("h2", {}, "Waiting for the signal " + signals.waiting_for),
    el("p", {}, "Until " + when(signals.timeout_at) + " at the latest; then it runs again without it."),
    data, " ",
    el("button", { id: "signal", onclick: () => act(async () => {
      const text = data.value.trim();
      let value = null;
      try {
        value = text ? JSON.parse(text) : null;
      } catch (error) {
        throw new Error("the signal's data is not JSON: " + error.message);
      }
      await post("runs/" + enc(id) + "/tasks/" + enc(taskId) + "/signal", { name: signals.waiting_for, data: value });
    }) }, "Send " + signals.waiting_for));
}

async function schedules(id, query) {
  const data = await api("runs/" + enc(id) + "/schedules?limit=100&cursor=" + enc(query.get("cursor") || "0"));
  return [
    el("h1", {}, "Schedules of run ", link(id, "/runs/" + enc(id))),
    table(["name", "mailbox", "cron / every", "timezone", "next fire", "paused", "last fire", "fires"],
      data.schedules.map((s) => [s.name, s.mailbox,
        s.cron !== null && s.cron !== undefined ? s.cron : "every " + s.every_seconds + " s",
        s.timezone, s.paused ? "" : when(s.next_fire), yes(s.paused),
        s.last_fire ? when(s.last_fire) : "never", s.fires]), { id: "schedules" }),
    more(data, "/runs/" + enc(id) + "/schedules?" + query.toString()),
  ];
}

async function pools(query) {
  const [data, quotas] = await together([
    api("pools?limit=100&cursor=" + enc(query.get("cursor") || "0")),
    api("quotas?limit=100&cursor=" + enc(query.get("quotas_cursor") || "0")),
  ]);
  const hash = "/pools?" + query.toString();
  return [
    el("h1", {}, "Pools"),
    unavailable(data),
    sharded(["pool", "slots", "held", "waiters", "generation"],
      data.pools.map((p) => [link(p.name, "/pools/" + enc(p.name)), p.size, p.held, p.waiters,
        p.generation]), data.pools, { id: "pools" }),
    more(data, hash),
    el("h2", {}, "Quotas"),
    unavailable(quotas),
    sharded(["quota", "limit", "per seconds", "level", "waiters", "head waits for"],
      quotas.quotas.map((q) => [q.name, q.limit, q.per_seconds, q.level.toFixed(1), q.waiters,
        q.head_amount]), quotas.quotas, { id: "quotas" }),
    more(quotas, hash, "quotas_cursor"),
  ];
}

async function pool(name) {
  const p = await api("pools/" + enc(name) + "?limit=100");
  return [
    el("h1", {}, "Pool " + name),
    cards([["slots", p.size], ["held", p.held], ["waiters", p.waiters]]),
    el("h2", {}, "Holders"),
    table(["holder", "run", "generation", "expires", "task", "released with its connection"],
      p.holders.map((h) => [h.holder, h.run ? link(h.run, "/runs/" + enc(h.run)) : "",
        h.generation, when(h.expires_at), h.item, yes(h.release_on_disconnect)]), { id: "holders" }),
  ];
}

async function mailboxes(query) {
  const data = await api("mailboxes?limit=100&cursor=" + enc(query.get("cursor") || "0"));
  return [
    el("h1", {}, "Mailboxes"),
    el("p", { class: "note" }, "Depths over every run: items ready, and deliveries in flight."),
    unavailable(data),
    sharded(["mailbox", "ready", "running", "mode", "max attempts", "retry backoff ms"],
      data.mailboxes.map((b) => [b.name, b.ready, b.running, b.mode, b.max_attempts,
        b.retry_backoff_ms]), data.mailboxes, { id: "mailboxes" }),
    more(data, "/mailboxes?" + query.toString()),
  ];
}

// ---- the router and the poll ----------------------------------------------------------

function route() {
  const [path, search] = (location.hash.slice(1) || "/").split("?");
  const query = new URLSearchParams(search || "");
  const parts = path.split("/").filter((p) => p).map(decodeURIComponent);
  if (!parts.length) return () => overview();
  if (parts[0] === "runs" && parts.length === 1) return () => runs(query);
  if (parts[0] === "pools" && parts.length === 1) return () => pools(query);
  if (parts[0] === "pools" && parts.length === 2) return () => pool(parts[1]);
  if (parts[0] === "mailboxes" && parts.length === 1) return () => mailboxes(query);
  if (parts[0] === "runs" && parts.length === 2) return () => run(parts[1], query);
  if (parts[0] === "runs" && parts[2] === "mailboxes" && parts.length === 4) return () => mailbox(parts[1], parts[3]);
  if (parts[0] === "runs" && parts[2] === "tasks" && parts.length === 4) return () => task(parts[1], parts[3]);
  if (parts[0] === "runs" && parts[2] === "schedules") return () => schedules(parts[1], query);
  return async () => [el("h1", {}, "Not found")];
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message || "";
  box.hidden = !message;
}

// Whether the page is to stay as it is this time: a click under way on it, or the user
// typing in it.
function inUse(view) {
  const active = document.activeElement;
  return (pressedAt !== 0 && Date.now() - pressedAt < PRESS_MS) ||
    (active !== null && view.contains(active) && active.tagName === "INPUT");
}

async function refresh() {
  clearTimeout(timer);
  const view = document.getElementById("view");
  try {
    const nodes = await route()();
    if (!inUse(view)) view.replaceChildren(...nodes.filter((n) => n !== null));
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
    window.history.replaceState(null, "", "#/");
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
  document.addEventListener("pointerdown", () => { pressedAt = Date.now(); }, true);
  for (const end of ["pointerup", "pointercancel"]) {
    document.addEventListener(end, () => { pressedAt = 0; }, true);
  }
  window.addEventListener("hashchange", () => {
    if (location.hash.slice(1).split("?")[0].replace(/\/$/, "") !== "") leaveCharts();
    refresh();
  });
  refresh();
}

start();
