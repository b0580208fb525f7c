// metaq console: one page, five views, fed by the server's snapshots (server-sent events).
// No framework: each view is rendered from the latest snapshot; charts are uPlot (vendored).
"use strict";

const state = {
  me: null,            // {user, logins, admin, csrf}
  snap: null,          // the latest snapshot (/api/events)
  page: "cluster",
  expanded: new Set(), // topics whose partitions are shown
  drill: null,         // the drill shown on the drills page: {id, view}
  drillTimer: null,
  sparks: [],
  history: null,
};
const charts = {};     // exposed for tests: window.metaqConsole.drillChart
window.metaqConsole = charts;

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (v) => (v === null || v === undefined || v < 0 ? "–" : Number(v).toLocaleString("en-US"));
const bytes = (v) => {
  if (v === null || v === undefined || v < 0) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, x = v;
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return (i === 0 ? x : x.toFixed(1)) + " " + units[i];
};
const secs = (v) => (v === null || v === undefined ? "–" : v.toFixed(2) + " s");
const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–");
const addr = (url) => esc(String(url || "").replace("meta://", ""));

function statePill(s) {
  const cls = s === "up" ? "ok" : s === "?" ? "" : s === "NO MASTER" || /unreachable|refused|stopped/.test(s) ? "bad" : "warn";
  return `<span class="pill ${cls}">${esc(s)}</span>`;
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (options.method && options.method !== "GET") headers["X-CSRF-Token"] = state.me ? state.me.csrf : "";
  if (options.json !== undefined) { headers["Content-Type"] = "application/json"; options.body = JSON.stringify(options.json); }
  const response = await fetch(path, { ...options, headers, credentials: "same-origin" });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  return { status: response.status, ok: response.ok, body };
}

// --- login and the event stream -----------------------------------------------------------------

async function boot() {
  const r = await api("/api/me");
  if (r.status === 401) return showLogin();
  state.me = r.body;
  $("#login").classList.add("hidden");
  $("#shell").classList.remove("hidden");
  $("#who").textContent = state.me.user ? `${state.me.user}${state.me.admin ? " · admin" : " · read-only"}` : (state.me.admin ? "no login · may act" : "");
  $("#logout").classList.toggle("hidden", !state.me.logins);
  connect();
  route();
}

function showLogin() {
  $("#shell").classList.add("hidden");
  $("#login").classList.remove("hidden");
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const form = new FormData(ev.target);
  const r = await api("/api/login", { method: "POST", json: { user: form.get("user"), password: form.get("password") } });
  if (!r.ok) { $("#login-error").textContent = r.body ? r.body.error : "login failed"; return; }
  ev.target.reset();
  $("#login-error").textContent = "";
  boot();
});

$("#logout").addEventListener("click", async () => {
  await api("/api/logout", { method: "POST" });
  if (state.source) state.source.close();
  location.hash = "";
  showLogin();
});

function connect() {
  if (state.source) state.source.close();
  const source = state.source = new EventSource("/api/events");
  source.addEventListener("snapshot", (ev) => {
    state.snap = JSON.parse(ev.data);
    renderChrome();
    if (state.page !== "drills" && state.page !== "failovers") render();
  });
  source.onerror = () => { $("#updated").textContent = "reconnecting…"; };
}

function renderChrome() {
  const s = state.snap;
  if (!s) return;
  const health = $("#health");
  if (s.error) { health.className = "pill bad"; health.textContent = "cannot read cluster"; }
  else if (s.healthy) { health.className = "pill ok"; health.textContent = "healthy"; }
  else { health.className = "pill bad"; health.textContent = `unhealthy (${s.problems.length})`; }
  health.dataset.exitCode = s.exit_code;
  $("#updated").textContent = "updated " + new Date(s.at_ms).toLocaleTimeString();
  $("#where").textContent = `${s.zk}${s.zk_root}`;
}

// --- routing ---------------------------------------------------------------------------------------

const TITLES = { cluster: "Cluster", topics: "Topics", groups: "Consumer groups", failovers: "Failover history", drills: "Drills" };

function route() {
  const [, page, arg] = (location.hash || "#/cluster").split("/");
  state.page = TITLES[page] ? page : "cluster";
  document.querySelectorAll(".sidebar a").forEach((a) => a.classList.toggle("active", a.dataset.page === state.page));
  $("#title").textContent = TITLES[state.page];
  clearInterval(state.drillTimer);
  if (state.page === "drills") return showDrills(arg);
  if (state.page === "failovers") return showFailovers();
  render();
}
window.addEventListener("hashchange", route);

function render() {
  const page = $("#page");
  if (!state.snap) { page.innerHTML = `<div class="empty">Reading the cluster…</div>`; return; }
  state.sparks.forEach((u) => u.destroy());
  state.sparks = [];
  if (state.page === "cluster") page.innerHTML = clusterView(state.snap);
  if (state.page === "topics") page.innerHTML = topicsView(state.snap);
  if (state.page === "groups") { page.innerHTML = groupsView(state.snap); drawSparks(state.snap); }
}

// --- cluster ---------------------------------------------------------------------------------------

function clusterView(s) {
  let html = "";
  if (s.error) html += `<div class="banner bad">${esc(s.error)}</div>`;
  if (s.healthy) html += `<div class="banner ok" data-testid="verdict"><b>Healthy</b> — every group has a master taking writes (<span class="mono">metaq cluster</span> exits 0).</div>`;
  else html += `<div class="banner bad" data-testid="verdict"><b>Unhealthy</b> — <span class="mono">metaq cluster</span> exits ${s.exit_code}:<ul>${s.problems.map((p) => `<li>${esc(p)}</li>`).join("")}</ul></div>`;
  if (s.warnings.length) html += `<div class="banner warn"><b>Attention</b><ul>${s.warnings.map((p) => `<li>${esc(p)}</li>`).join("")}</ul></div>`;
  if (!s.groups.length) html += `<div class="card"><div class="empty">No broker registered under ${esc(s.zk_root)}.</div></div>`;
  for (const g of s.groups) html += groupCard(g);
  return html;
}

function groupCard(g) {
  const admin = state.me.admin;
  const members = [g.master, ...g.slaves];
  const inSync = (m) => (g.sync_set && g.sync_set.includes(m.role) ? `<span class="pill ok">in sync set</span>` : g.mode === "sync" && m.role !== "master" ? `<span class="pill warn">out of sync set</span>` : "");
  const rows = members.map((m) => `
    <tr data-role="${esc(m.role)}" class="${m.role === "master" ? "master" : "slave"}">
      <td><b>${esc(m.role)}</b></td>
      <td class="addr">${m.state === "NO MASTER" ? "(none)" : addr(m.url)}</td>
      <td>${statePill(m.state)} ${m.role !== "master" ? inSync(m) : ""}</td>
      <td class="num">${m.role === "master" ? "" : bytes(m.lag_bytes)}</td>
      <td class="num">${m.role === "master" ? "" : num(m.lag_messages)}</td>
      <td class="num">${m.role === "master" || m.lag_ms === null ? "" : num(Math.round(m.lag_ms)) + " ms"}</td>
      <td class="num">${m.heartbeat_age_ms === null ? "" : num(Math.round(m.heartbeat_age_ms)) + " ms"}</td>
      <td>${admin && m.role.startsWith("slave") ? `<button data-promote="${g.broker_id}:${esc(m.role.slice(5))}">Promote…</button>` : ""}</td>
    </tr>`).join("");
  const parts = g.partitions.map((p) => `
    <tr><td class="mono">${esc(p.partition)}</td><td>${esc(p.slave)}</td><td class="num">${bytes(p.lag_bytes)}</td>
    <td class="num">${num(p.lag_messages)}${p.approx ? " ≈" : ""}</td><td class="num">${num(Math.round(p.lag_ms))} ms</td></tr>`).join("");
  const verdict = g.problems.length ? `<span class="pill bad">unhealthy</span>` : `<span class="pill ok">healthy</span>`;
  return `
  <div class="card" data-testid="group-${g.broker_id}">
    <div class="card-head">
      <h2>Broker group ${g.broker_id}</h2> ${verdict}
      <div class="facts">
        <span>master <b class="mono" data-testid="master">${g.master.state === "NO MASTER" ? "(none)" : addr(g.master.url)}</b></span>
        <span>epoch <b data-testid="epoch">${g.epoch ?? "–"}</b></span>
        <span>mode <b>${esc(g.mode)}</b></span>
        <span>sync set <b>${g.sync_set === null ? "–" : g.sync_set.length ? esc(g.sync_set.join(", ")) : "(empty)"}</b></span>
      </div>
      <span class="grow"></span>
      ${admin ? `<a href="#/drills" data-drill-group="${g.broker_id}"><button>Drill…</button></a>` : ""}
    </div>
    ${g.problems.length ? `<div class="card-body"><div class="banner bad" style="margin:0">${g.problems.map(esc).join("<br>")}</div></div>` : ""}
    <table>
      <thead><tr><th>member</th><th>address</th><th>state</th><th class="num">lag</th><th class="num">lag msgs</th><th class="num">lag time</th><th class="num">heartbeat age</th><th></th></tr></thead>
      <tbody>${rows}</tbody>
    </table>
    ${parts ? `<div class="card-head"><h2 class="small muted">Replication lag per partition</h2></div>
    <table><thead><tr><th>partition</th><th>slave</th><th class="num">bytes</th><th class="num">messages</th><th class="num">time</th></tr></thead><tbody>${parts}</tbody></table>` : ""}
  </div>`;
}

// --- topics ------------------------------------------------------------------------------------------

function topicsView(s) {
  const admin = state.me.admin;
  let html = admin ? `<div class="form-row" style="margin-bottom:16px"><button class="primary" id="new-topic">New topic…</button></div>` : "";
  if (!s.topics.length) return html + `<div class="card"><div class="empty">No topics in any group's topic configuration.</div></div>`;
  const rows = s.topics.map((t) => {
    const key = `${t.broker_id}/${t.topic}`;
    const open = state.expanded.has(key);
    const settings = Object.entries(t.settings).filter(([k]) => k !== "numPartitions").map(([k, v]) => `<span>${esc(k)}=${esc(v)}</span>`).join("");
    let html = `<tr data-topic="${esc(t.topic)}">
      <td><button class="link" data-expand="${esc(key)}">${open ? "▾" : "▸"} ${esc(t.topic)}</button></td>
      <td>${t.broker_id}</td><td class="num">${t.partitions}</td><td class="num">${bytes(t.size)}</td>
      <td class="chips">${settings || `<span class="muted">defaults</span>`}</td>
      <td>${admin ? `<button data-alter="${esc(key)}">Alter…</button> <button data-delete="${esc(key)}">Delete…</button>` : ""}</td></tr>`;
    if (open) {
      html += `<tr><td colspan="6" style="padding:0 0 0 28px"><table><thead><tr><th>partition</th><th class="num">first offset</th><th class="num">log end</th><th class="num">committed</th><th class="num">size</th></tr></thead><tbody>
        ${t.parts.map((p) => `<tr><td class="mono">${esc(t.topic)}-${esc(p.name)}</td><td class="num">${num(p.min_offset)}</td><td class="num">${num(p.max_offset)}</td><td class="num">${num(p.committed)}</td><td class="num">${bytes(p.size)}</td></tr>`).join("")}
      </tbody></table></td></tr>`;
    }
    return html;
  }).join("");
  return html + `<div class="card"><table data-testid="topics">
    <thead><tr><th>topic</th><th>group</th><th class="num">partitions</th><th class="num">size</th><th>settings</th><th></th></tr></thead>
    <tbody>${rows}</tbody></table></div>`;
}

// --- consumer groups ------------------------------------------------------------------------------------

function groupsView(s) {
  if (!s.consumer_groups.length) return `<div class="card"><div class="empty">No consumer groups under ${esc(s.zk_root)}.</div></div>`;
  return s.consumer_groups.map((g) => {
    const topics = g.topics.map((t) => `
      <div class="card-head"><h2 class="small">${esc(t.topic)}</h2>
        <span class="muted">lag</span> <b data-testid="lag-${esc(g.group)}-${esc(t.topic)}" data-bytes="${t.lag_bytes}">${bytes(t.lag_bytes)}</b>
        <div class="spark" data-spark="${esc(g.group)}\u0000${esc(t.topic)}"></div>
      </div>
      <table><thead><tr><th>partition</th><th>owner</th><th class="num">committed</th><th class="num">readable end</th><th class="num">lag</th></tr></thead><tbody>
      ${t.partitions.map((p) => `<tr><td class="mono">${esc(t.topic)}-${esc(p.partition)}</td><td class="mono small">${esc(p.owner || "–")}</td>
        <td class="num">${num(p.committed)}</td><td class="num">${num(p.end)}</td><td class="num">${bytes(p.lag_bytes)}</td></tr>`).join("")}
      </tbody></table>`).join("");
    return `<div class="card" data-testid="consumer-${esc(g.group)}">
      <div class="card-head"><h2>${esc(g.group)}</h2>
        ${g.members.length ? `<span class="pill ok">${g.members.length} live member(s)</span>` : `<span class="pill warn">no live members</span>`}
        <span class="muted small mono">${g.members.map(esc).join(", ")}</span><span class="grow"></span>
        <button data-describe="${esc(g.group)}">Count messages…</button>
        ${state.me.admin ? `<button data-reset="${esc(g.group)}">Reset offsets…</button>` : ""}
      </div>${topics}</div>`;
  }).join("");
}

function drawSparks(s) {
  if (!window.uPlot) return;
  for (const g of s.consumer_groups) for (const t of g.topics) {
    const el = document.querySelector(`[data-spark="${CSS.escape(g.group + "\u0000" + t.topic)}"]`);
    if (!el || t.history.length < 2) continue;
    const xs = t.history.map((p) => p[0] / 1000), ys = t.history.map((p) => p[1]);
    state.sparks.push(new uPlot({
      width: 160, height: 34, legend: { show: false }, cursor: { show: false }, select: { show: false },
      axes: [{ show: false }, { show: false }], scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
      series: [{}, { stroke: "#2f6fed", fill: "rgba(47,111,237,.12)", width: 1.5, points: { show: false } }],
    }, [xs, ys], el));
  }
}

// --- failover history -------------------------------------------------------------------------------------

async function showFailovers() {
  const page = $("#page");
  page.innerHTML = `<div class="empty">Asking the masters for their epochs…</div>`;
  const r = await api("/api/history");
  if (state.page !== "failovers") return;
  if (!r.ok) { page.innerHTML = `<div class="banner bad">${esc(r.body && r.body.error)}</div>`; return; }
  page.innerHTML = r.body.groups.map((g) => `
    <div class="card" data-testid="history-${g.broker_id}">
      <div class="card-head"><h2>Broker group ${g.broker_id}</h2><div class="facts"><span>epoch <b>${g.epoch ?? "–"}</b></span><span>master <b class="mono">${addr(g.master)}</b></span></div></div>
      ${g.problem ? `<div class="card-body"><div class="banner warn" style="margin:0">The master gave no epoch history: ${esc(g.problem)}</div></div>` : ""}
      <table><thead><tr><th>epoch</th><th>when</th><th>master</th><th>why</th><th class="num">its lag then</th><th class="num">truncated on the old master</th><th>starts (partition: offset)</th></tr></thead><tbody>
      ${g.epochs.map((e) => `<tr><td><b>${e.epoch}</b></td><td class="small">${when(e.at_ms)}</td><td class="addr">${e.master ? addr(e.master) : "–"}</td>
        <td data-testid="why-${g.broker_id}-${e.epoch}">${esc(e.why || (e.observed ? "" : "not recorded"))}${e.previous_master ? `<div class="small muted">after ${addr(e.previous_master)}</div>` : ""}${e.reported ? `<div class="small muted">as the broker reported it</div>` : ""}${e.doubt ? `<div class="banner warn small" data-testid="doubt-${g.broker_id}-${e.epoch}" style="margin:2px 0 0">doubtful: ${esc(e.doubt)}</div>` : ""}</td><td class="num">${e.lag_bytes_at_takeover == null ? "–" : bytes(e.lag_bytes_at_takeover)}</td>
        <td class="num" title="${esc(Object.entries(e.truncated || {}).map(([k, parts]) => `slave${k}: ` + Object.entries(parts).map(([p, n]) => `${p} ${n}`).join(", ")).join("; "))}">${e.truncated_bytes == null ? "–" : bytes(e.truncated_bytes)}</td>
        <td class="chips">${Object.entries(e.starts).map(([p, o]) => `<span>${esc(p)}: ${num(o)}</span>`).join("")}</td></tr>`).join("")
        || `<tr><td colspan="7" class="empty">No epoch yet.</td></tr>`}
      </tbody></table></div>`).join("") || `<div class="card"><div class="empty">No broker groups.</div></div>`;
}

// --- drills -----------------------------------------------------------------------------------------------

async function showDrills(id) {
  const page = $("#page");
  const list = await api("/api/drills");
  if (state.page !== "drills") return;
  const groups = state.snap ? state.snap.groups : [];
  const preset = state.drillGroup ?? (groups[0] ? groups[0].broker_id : 0);
  const form = state.me.admin ? `
    <div class="card"><div class="card-head"><h2>Start a drill</h2><span class="muted small">faults the master under load, measures the failover, checks every acked message (metaq drill)</span></div>
    <div class="card-body"><form id="drill-form" class="form-row">
      <label>Broker group <select name="broker_id">${groups.map((g) => `<option value="${g.broker_id}" ${g.broker_id === preset ? "selected" : ""}>${g.broker_id} (master ${addr(g.master.url)})</option>`).join("")}</select></label>
      <label>Fault <select name="fault"><option value="kill">kill -9 the master</option><option value="stop">SIGSTOP the master</option><option value="promote">planned hand-over (promote)</option></select></label>
      <label>Topic <input name="topic" placeholder="the group's first"></label>
      <label>Rate (msgs/s) <input name="rate" type="number" value="200" min="1" max="10000" style="width:100px"></label>
      <button class="danger" id="start-drill" type="submit">Start drill…</button>
    </form></div></div>` : `<div class="banner warn">Only users with the admin permission may start drills; you can watch and read their reports.</div>`;
  const rows = list.ok ? list.body.drills : [];
  page.innerHTML = form + `<div id="drill-live"></div><div id="drill-list">${drillList(rows)}</div>`;
  const running = rows.find((d) => d.state === "running");
  const shown = id || (running && running.id);
  if (shown) watchDrill(shown);
}

async function refreshDrillList() {
  const list = await api("/api/drills");
  const box = $("#drill-list");
  if (list.ok && box) box.innerHTML = drillList(list.body.drills);
}

function drillList(rows) {
  return `<div class="card"><div class="card-head"><h2>Drill reports</h2></div>
    ${rows.length ? `<table><thead><tr><th>drill</th><th>group</th><th>fault</th><th>state</th><th>started by</th><th class="num">first acked write</th><th class="num">lost</th><th>chart</th></tr></thead><tbody>
    ${rows.map((d) => `<tr><td><a href="#/drills/${esc(d.id)}">${esc(d.id)}</a></td><td>${esc(d.broker_id)}</td><td>${esc(d.fault)}</td>
      <td>${d.state === "running" ? `<span class="pill info">running</span>` : d.state === "failed" ? `<span class="pill bad" title="${esc(d.error)}">failed</span>` : d.ok ? `<span class="pill ok">passed</span>` : `<span class="pill bad">violations</span>`}</td>
      <td>${esc(d.started_by || "–")}</td><td class="num">${secs(d.first_ack_s)}</td><td class="num">${num(d.lost)}</td>
      <td>${d.chart ? `<a href="/api/drills/${esc(d.id)}/chart.png" target="_blank">PNG</a> · ` : ""}<a href="/api/drills/${esc(d.id)}" target="_blank">JSON</a></td></tr>`).join("")}
    </tbody></table>` : `<div class="empty">No drills yet.</div>`}</div>`;
}

async function watchDrill(id) {
  clearInterval(state.drillTimer);
  let wasRunning = false;
  const tick = async () => {
    const r = await api(`/api/drills/${encodeURIComponent(id)}`);
    if (!r.ok || state.page !== "drills") { clearInterval(state.drillTimer); return; }
    drawDrill(r.body);
    if (r.body.state === "running") { wasRunning = true; return; }
    clearInterval(state.drillTimer);
    if (!r.body.chart && state.me.admin && charts.drillChart && r.body.timeline.t.length) await keepChart(id);
    if (wasRunning) refreshDrillList();
  };
  state.drillTimer = setInterval(tick, 500);
  await tick();
}

const MARKER_COLOURS = { "fault": "#d64545", "detection": "#b7791f", "first acked write": "#1f9d55", "first read": "#2f6fed" };

function drawDrill(v) {
  const box = $("#drill-live");
  if (!box) return;
  if (!box.dataset.id || box.dataset.id !== v.id) {
    if (charts.drillChart) { charts.drillChart.destroy(); charts.drillChart = null; }
    box.dataset.id = v.id;
    box.innerHTML = `<div class="card" data-testid="drill-${esc(v.id)}"><div class="card-head"><h2>Drill ${esc(v.id)}</h2>
      <span id="drill-state"></span><div class="facts"><span>group <b>${esc(v.broker_id)}</b></span><span>fault <b>${esc(v.fault)}</b></span><span>load <b>${esc(v.rate)} msgs/s</b></span><span>started by <b>${esc(v.started_by || "–")}</b></span></div></div>
      <div class="chart-wrap" id="drill-chart"></div><div class="markers" id="drill-markers"></div><div id="drill-result"></div></div>`;
  }
  $("#drill-state").innerHTML = v.state === "running" ? `<span class="pill info">running</span>` : v.state === "failed" ? `<span class="pill bad">failed</span>` : v.report && v.report.ok ? `<span class="pill ok">passed</span>` : `<span class="pill bad">violations</span>`;
  const t = v.timeline;
  const data = [t.t, t.rate, t.latency_p50, t.latency_max];
  charts.drillMarkers = v.markers;
  if (!charts.drillChart && window.uPlot) {
    const width = Math.max(600, $("#drill-chart").clientWidth - 10);
    charts.drillChart = new uPlot({
      width, height: 300,
      scales: { x: { time: false }, rate: { auto: true }, ms: { auto: true } },
      axes: [
        { label: "seconds since the load started", stroke: "#6b7587", grid: { stroke: "#eef1f6" } },
        { scale: "rate", label: "acked writes/s", stroke: "#6b7587", grid: { stroke: "#eef1f6" } },
        { scale: "ms", side: 1, label: "put latency (ms)", stroke: "#6b7587", grid: { show: false } },
      ],
      series: [
        { label: "t (s)" },
        { label: "acked writes/s", scale: "rate", stroke: "#2f6fed", fill: "rgba(47,111,237,.10)", width: 2, points: { show: false } },
        { label: "latency p50 (ms)", scale: "ms", stroke: "#1f9d55", width: 1.5, points: { show: false }, spanGaps: false },
        { label: "latency max (ms)", scale: "ms", stroke: "#b7791f", width: 1, dash: [4, 3], points: { show: false }, spanGaps: false },
      ],
      hooks: { draw: [drawMarkers] },
    }, data, $("#drill-chart"));
  } else if (charts.drillChart) {
    charts.drillChart.setData(data);
  }
  $("#drill-markers").innerHTML = v.markers.map((m) => `<span data-marker="${esc(m.name)}"><span class="marker-dot" style="background:${MARKER_COLOURS[m.name] || "#555"}"></span>${esc(m.name)} at ${m.t.toFixed(2)} s</span>`).join("");
  $("#drill-result").innerHTML = v.error ? `<div class="card-body"><div class="banner bad" style="margin:0">${esc(v.error)}</div></div>` : v.report ? resultTable(v.report) : "";
}

function drawMarkers(u) {
  const ctx = u.ctx;
  ctx.save();
  for (const m of charts.drillMarkers || []) {
    const x = Math.round(u.valToPos(m.t, "x", true));
    ctx.strokeStyle = MARKER_COLOURS[m.name] || "#555";
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
    ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = ctx.strokeStyle;
    ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
    ctx.fillText(m.name, x + 4 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio * (1 + (charts.drillMarkers.indexOf(m) % 4)));
  }
  ctx.restore();
}

function resultTable(r) {
  const rows = [
    ["failover", `${addr(r.old_master)} → ${r.new_master ? addr(r.new_master) : "nobody"} (epoch ${r.epoch_before} → ${r.epoch_after}, ${esc(r.mode)})`],
    ["detection", secs(r.detection_s)], ["first acked write", secs(r.first_ack_s)], ["first read", secs(r.first_read_s)],
    ["acked before the fault / found after", `${num(r.acked_before_fault)} / ${num(r.found_after)}`],
    ["acked in all", num(r.acked_total)],
    ["lost", `<b data-testid="lost" class="${r.lost && r.mode === "sync" ? "error-line" : ""}">${num(r.lost)}</b>`],
    ["duplicates", `${num(r.duplicates)} (${r.idempotent ? "idempotent" : "plain"} producer)`],
    ["failed sends / unknown outcome", `${num(r.failed_sends)} / ${num(r.unknown_outcome_sends)}`],
    ["old master rejoined as", esc(r.rejoined_as || "nothing (yet)")],
    ["logs identical", `<b data-testid="logs-identical">${r.logs_identical === null ? "–" : r.logs_identical}</b>`],
  ];
  return `<table class="result" data-testid="drill-result">${rows.map(([k, v]) => `<tr><td>${k}</td><td>${v}</td></tr>`).join("")}
    ${(r.notes || []).map((n) => `<tr><td>note</td><td>${esc(n)}</td></tr>`).join("")}</table>`;
}

async function keepChart(id) {
  const canvas = document.querySelector("#drill-chart canvas");
  if (!canvas) return;
  const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
  await fetch(`/api/drills/${encodeURIComponent(id)}/chart`, { method: "POST", body: blob, credentials: "same-origin",
    headers: { "Content-Type": "image/png", "X-CSRF-Token": state.me.csrf } });
}

// --- actions: dialogs over the CLI's commands ----------------------------------------------------------------

// confirmName: what must be typed before OK (null: nothing); confirmWhen(form): when it must
// (default: always), e.g. a reset only when it executes.
function dialog({ title, body, confirmName, okLabel, run, confirmWhen = () => true }) {
  const d = $("#dialog");
  $("#dialog-title").textContent = title;
  $("#dialog-body").innerHTML = body;
  $("#dialog-confirm-label").classList.toggle("hidden", confirmName === null);
  $("#dialog-confirm-name").textContent = confirmName ?? "";
  $("#dialog-confirm").value = "";
  $("#dialog-output").classList.add("hidden");
  $("#dialog-ok").textContent = okLabel || "Run";
  const form = $("#dialog-form");
  const check = () => {
    $("#dialog-ok").disabled = confirmName !== null && confirmWhen(new FormData(form)) && $("#dialog-confirm").value.trim() !== String(confirmName);
  };
  form.oninput = check;
  check();
  $("#dialog-form").onsubmit = async (ev) => {
    ev.preventDefault();
    $("#dialog-ok").disabled = true;
    const out = $("#dialog-output");
    out.classList.remove("hidden");
    out.textContent = "running…";
    const r = await run(new FormData($("#dialog-form")), $("#dialog-confirm").value.trim());
    const b = r.body || {};
    out.textContent = b.command !== undefined ? `$ ${b.command}\n${b.output}${b.error}(exit ${b.exit_code})` : (b.output || b.error || `HTTP ${r.status}`);
    $("#dialog-ok").disabled = false;
    if (r.ok && r.after) r.after();
  };
  d.classList.remove("hidden");
  (confirmName === null ? $("#dialog-body input, #dialog-body select") : $("#dialog-confirm"))?.focus();
}
$("#dialog-cancel").addEventListener("click", () => $("#dialog").classList.add("hidden"));

const post = (path, json) => api(path, { method: "POST", json });

document.addEventListener("click", (ev) => {
  const el = ev.target.closest("button, a");
  if (!el) return;
  const d = el.dataset;
  if (d.expand) { state.expanded.has(d.expand) ? state.expanded.delete(d.expand) : state.expanded.add(d.expand); render(); }
  if (d.drillGroup) state.drillGroup = Number(d.drillGroup);
  if (d.promote) {
    const [group, slave] = d.promote.split(":");
    dialog({ title: `Promote slave${slave} of broker group ${group}`, confirmName: group, okLabel: "Promote",
      body: `<p>Planned hand-over (<span class="mono">metaq promote</span>): the master pauses writes, waits until slave${esc(slave)} holds its whole log, and hands over.</p>
             <label style="flex-direction:row;gap:8px;align-items:center"><input type="checkbox" name="unclean"> --unclean (only for a group with no master and no eligible slave: may lose acked messages)</label>`,
      run: (f, confirm) => post("/api/promote", { broker_id: Number(group), slave: Number(slave), unclean: f.get("unclean") === "on", confirm }) });
  }
  if (el.id === "new-topic" || d.alter) {
    const [group, topic] = d.alter ? d.alter.split("/") : [null, null];
    const groups = state.snap.groups.map((g) => g.broker_id);
    dialog({ title: d.alter ? `Alter topic ${topic}` : "New topic", confirmName: null, okLabel: d.alter ? "Alter" : "Create",
      body: `<div class="form-row">${d.alter ? "" : `<label>Broker group <select name="broker_id">${groups.map((g) => `<option>${g}</option>`).join("")}</select></label><label>Topic <input name="topic" required></label>`}
             <label>Partitions <input name="partitions" type="number" min="1" style="width:90px" ${d.alter ? "" : 'value="1"'}></label></div>
             <label>Settings (KEY=VALUE, one per line) <textarea name="settings" rows="3" style="font-family:var(--mono)"></textarea></label>`,
      run: (f) => {
        const name = d.alter ? topic : f.get("topic");
        const body = { broker_id: Number(d.alter ? group : f.get("broker_id")), topic: name, partitions: f.get("partitions"),
          settings: String(f.get("settings") || "").split("\n").filter((s) => s.trim()), confirm: name };
        return post(`/api/topics/${d.alter ? "alter" : "create"}`, body);
      } });
  }
  if (d.delete) {
    const [group, topic] = d.delete.split("/");
    dialog({ title: `Delete topic ${topic} in broker group ${group}`, confirmName: topic, okLabel: "Delete",
      body: `<p>Every member of group ${esc(group)} drops the topic and its files (<span class="mono">metaq topics delete</span>).</p>`,
      run: (f, confirm) => post("/api/topics/delete", { broker_id: Number(group), topic, confirm }) });
  }
  if (d.reset) {
    const group = d.reset;
    const g = state.snap.consumer_groups.find((x) => x.group === group);
    dialog({ title: `Reset the offsets of ${group}`, confirmName: group, okLabel: "Run", confirmWhen: (f) => f.get("execute") === "on",
      body: `<div class="form-row"><label>Topic <select name="topic">${(g ? g.topics : []).map((t) => `<option>${esc(t.topic)}</option>`).join("")}<option value="*">all topics</option></select></label>
        <label>To <select name="target"><option value="earliest">earliest</option><option value="latest">latest</option><option value="datetime">date-time (ISO 8601)</option><option value="duration">duration ago (30m, 2h)</option><option value="shift">shift by N messages</option><option value="offset">offset</option></select></label>
        <label>Value <input name="value" placeholder="for date-time, duration, shift, offset"></label></div>
        <p class="muted small">Without <i>execute</i>, a dry run (<span class="mono">metaq groups reset-offsets</span>) shows the plan; to execute, tick it and type the group's name. Refused while the group has live members.</p>
        <label style="flex-direction:row;gap:8px;align-items:center"><input type="checkbox" name="execute"> execute (write the new offsets)</label>`,
      run: (f, confirm) => post("/api/groups/reset-offsets", { group, topic: f.get("topic"), target: f.get("target"), value: f.get("value"),
                                                              execute: f.get("execute") === "on", confirm }) });
  }
  if (d.describe) {
    dialog({ title: `metaq groups describe --group ${d.describe}`, confirmName: null, okLabel: "Count",
      body: `<p class="muted">Counts the messages behind each partition by walking them through the masters.</p>`,
      run: async () => {
        const r = await api(`/api/groups/${encodeURIComponent(d.describe)}/describe`);
        if (!r.ok) return r;
        const lines = r.body.partitions.map((p) => `${p.topic}-${p.partition}  committed ${p.committed ?? "-"}  log end ${p.log_end ?? p.problem}  lag ${p.lag_bytes ?? "-"} bytes, ${p.lag_messages ?? "-"} messages`);
        return { ok: true, status: 200, body: { output: `live members: ${r.body.live_members.join(", ") || "none"}\n` + lines.join("\n") } };
      } });
  }
});

document.addEventListener("submit", (ev) => {
  if (ev.target.id !== "drill-form") return;
  ev.preventDefault();
  const f = new FormData(ev.target);
  const group = Number(f.get("broker_id"));
  const fault = { kill: "kill -9 its master", stop: "SIGSTOP its master", promote: "hand its master over to a sync slave" }[f.get("fault")];
  dialog({ title: `Drill broker group ${group}: ${fault}`, confirmName: String(group), okLabel: "Start drill",
    body: `<p>Under a load of ${esc(f.get("rate"))} msgs/s, broker group <b>${group}</b>'s master is faulted (${esc(fault)}); a slave takes over; every acked message is checked (<span class="mono">metaq drill --fault ${esc(f.get("fault"))}</span>).</p>`,
    run: async (_f, confirm) => {
      const r = await post("/api/drills", { broker_id: group, fault: f.get("fault"), topic: f.get("topic") || null, rate: Number(f.get("rate")), confirm });
      if (r.ok) { $("#dialog").classList.add("hidden"); location.hash = `#/drills/${r.body.id}`; }
      return r;
    } });
});

boot();
