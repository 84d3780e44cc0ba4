// Charon's dead-letter console: a page of the service that talks only to its public API (/v2), with the
// caller's own credentials, so that everything it shows or does is what the API and its policy allow.
// No framework, no build step; docs/console.md says what it does.
"use strict";

const BASE = location.pathname.replace(/\/console\/?$/, "");
let PAGE = 20; // the API's largest page by default; a service configured for less says so (pageLimit)
const SCAN_PAGES = 50; // a filtered list reads at most this many pages a step (1,000 messages)
const REASONS = ["max_claims", "expired", "rejected"];
// Where the operator published `charon insights`' report (CHARON_INSIGHTS_REPORT_URL), or ""
const REPORT = document.querySelector('meta[name="charon-insights-report"]').content;
const state = {
  project: sessionStorage.getItem("charon.project") || "",
  token: sessionStorage.getItem("charon.token") || "",
  client: sessionStorage.getItem("charon.client") || crypto.randomUUID(),
};
sessionStorage.setItem("charon.client", state.client);

// --- The API -------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.title) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

async function api(method, path, { query, body } = {}) {
  const headers = { "Client-ID": state.client, Accept: "application/json" };
  if (state.project) headers["X-Project-ID"] = state.project;
  if (state.token) headers["X-Auth-Token"] = state.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const qs = query ? "?" + new URLSearchParams(query) : "";
  let r;
  try {
    r = await fetch(BASE + path + qs, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, { title: "The service did not answer", description: String(e) });
  }
  const text = await r.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { title: `HTTP ${r.status}`, description: text.slice(0, 400) }; }
  }
  if (r.status === 401) {
    askForToken(data);
    throw new ApiError(401, data);
  }
  const smaller = r.status === 400 && query && query.limit && pageLimit(data);
  if (smaller && smaller < query.limit) { // CHARON_LIMITS__MAX_MESSAGES_PER_PAGE below 20: ask again with it
    PAGE = smaller;
    return api(method, path, { query: { ...query, limit: smaller }, body });
  }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

// The largest page a 400 names ("limit must be between 1 and 10; got 20"), or 0.
function pageLimit(body) {
  const m = body && body.description && body.description.match(/limit must be between 1 and (\d+)/);
  return m ? Number(m[1]) : 0;
}

const q = (name) => `/v2/queues/${encodeURIComponent(name)}`;

// --- Small helpers -------------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function notice(err, info = false) {
  const box = document.getElementById("notice");
  box.replaceChildren();
  box.classList.toggle("info", info);
  if (!err) { box.hidden = true; return; }
  const body = err instanceof ApiError ? err.body : { title: String(err.message || err) };
  box.append(el("strong", { text: body.title || "Error" }));
  if (body.description) box.append(el("span", { text: body.description }));
  box.hidden = false;
}

function fail(err) {
  if (err instanceof ApiError && err.status === 401) return; // the token prompt says it
  notice(err);
}

function askForToken(body) {
  const box = document.getElementById("notice");
  notice(new ApiError(401, {
    title: "Sign in again",
    description: ((body && body.description) || "The service wants a valid token.") +
      " Paste a Keystone token (and its project) above and press Use.",
  }));
  box.hidden = false;
  const token = document.getElementById("token");
  token.value = "";
  state.token = "";
  state.prompted = true; // the focus stays on the token field
  sessionStorage.removeItem("charon.token");
  token.focus();
}

function confirmAction(title, text, ok = "Do it") {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = ok;
  d.returnValue = "";
  d.showModal();
  return new Promise((resolve) => d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true }));
}

const fmtTime = (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z") : "");
const fmtAge = (s) => (s === undefined || s === null ? "" : s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` :
  s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`);
const preview = (body) => { const t = JSON.stringify(body); return t.length > 120 ? t.slice(0, 120) + "…" : t; };
const markerOf = (links) => {
  const next = (links || []).find((l) => l.rel === "next");
  return next ? new URL(next.href, location.origin).searchParams.get("marker") : null;
};

async function inTurns(items, width, fn) { // fn over items, `width` at a time; the first failure is shown
  let i = 0, failed = null;
  const worker = async () => { while (i < items.length) { const k = i++; await fn(items[k]).catch((e) => { failed = failed || e; }); } };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, worker));
  if (failed) fail(failed);
}

// --- Queues --------------------------------------------------------------------------------------------

const list = { name: "", markers: [null], sort: "name", desc: false, rows: [], gen: 0 };

async function showQueues() {
  const view = document.getElementById("view");
  const filter = el("input", { id: "queue-filter", type: "search", value: list.name, placeholder: "part of a name" });
  const form = el("form", { class: "tools", onsubmit: (e) => { e.preventDefault(); notice(null); list.name = filter.value.trim(); list.markers = [null]; loadQueues(); } },
    el("label", {}, "Name contains", filter), el("button", { type: "submit" }, "Filter"));
  const quota = el("p", { id: "quota", class: "muted" });
  view.replaceChildren(el("h1", { text: `Queues of ${state.project || "your project"}` }), quota, form,
    el("div", { id: "queues" }), el("div", { class: "pager", id: "queues-pager" }));
  showQuota(quota);
  await loadQueues();
}

async function showQuota(box) {
  if (!state.project) return;
  try {
    const qu = await api("GET", `/v2/quotas/${encodeURIComponent(state.project)}`);
    const parts = [`${qu.use.queues} queue(s)` + (qu.quotas.queues ? ` of ${qu.quotas.queues}` : "")];
    if (qu.use.message_bytes !== undefined) parts.push(`${qu.use.message_bytes} message bytes` + (qu.quotas.message_bytes ? ` of ${qu.quotas.message_bytes}` : ""));
    box.textContent = "Quota use: " + parts.join(", ");
  } catch { box.textContent = ""; }
}

async function loadQueues() {
  const box = document.getElementById("queues");
  const page = list.markers.length - 1;
  const query = { detailed: "true", limit: PAGE };
  if (list.markers[page]) query.marker = list.markers[page];
  if (list.name) query.name = list.name;
  const gen = ++list.gen; // a later load (another page, filter or project) wins over this one
  let data;
  try { data = await api("GET", "/v2/queues", { query }); } catch (e) { if (gen === list.gen) fail(e); return; }
  if (gen !== list.gen) return;
  const queues = data.queues || [];
  const dlqOf = {};
  for (const x of queues) {
    const d = x.metadata && x.metadata._dead_letter_queue;
    if (d) (dlqOf[d] = dlqOf[d] || []).push(x.name);
  }
  list.rows = queues.map((x) => ({ name: x.name, meta: x.metadata || {}, sources: dlqOf[x.name] || [], stats: null }));
  list.next = markerOf(data.links);
  renderQueues();
  performance.mark("charon:queues-listed");
  await inTurns(list.rows, 6, async (row) => {
    const stats = (await api("GET", q(row.name) + "/stats")).messages;
    if (gen === list.gen) row.stats = stats;
  });
  if (gen !== list.gen) return;
  renderQueues();
  performance.mark("charon:queues-counted");
}

const queueColumns = [
  ["name", "Queue", (r) => r.name],
  ["free", "Ready", (r) => r.stats && r.stats.free],
  ["claimed", "Claimed", (r) => r.stats && r.stats.claimed],
  ["delayed", "Delayed", (r) => r.stats && r.stats.delayed],
  ["oldest", "Oldest", (r) => r.stats && r.stats.oldest ? r.stats.oldest.age : -1],
  ["received", "Dead letters in", (r) => r.stats && r.stats.dead_letters_received],
  ["out", "Dead-lettered out", (r) => r.stats && r.stats.dead_lettered],
];

function renderQueues() {
  const box = document.getElementById("queues");
  const col = queueColumns.find((c) => c[0] === list.sort) || queueColumns[0];
  const rows = [...list.rows].sort((a, b) => {
    const x = col[2](a), y = col[2](b);
    const c = typeof x === "string" ? x.localeCompare(y) : (x ?? -1) - (y ?? -1);
    return list.desc ? -c : c;
  });
  const head = el("tr", {}, queueColumns.map(([key, label]) => el("th", { class: key === "name" ? "" : "num", "aria-sort": list.sort === key ? (list.desc ? "descending" : "ascending") : "none" },
    el("button", { onclick: () => { list.desc = list.sort === key ? !list.desc : false; list.sort = key; renderQueues(); } }, label + (list.sort === key ? (list.desc ? " ▼" : " ▲") : "")))),
  el("th", { text: "Dead-letter settings" }));
  const body = rows.map((r) => {
    const s = r.stats || {};
    const isDlq = r.sources.length > 0 || s.dead_letters_received > 0;
    const settings = [];
    if (r.meta._dead_letter_queue) settings.push(`→ ${r.meta._dead_letter_queue}`);
    if (r.meta._max_claim_count) settings.push(`max claims ${r.meta._max_claim_count}`);
    if (r.meta._dead_letter_queue_messages_ttl) settings.push(`ttl there ${r.meta._dead_letter_queue_messages_ttl} s`);
    const n = (v) => el("td", { class: "num", text: r.stats ? String(v ?? 0) : "…" });
    return el("tr", { "data-queue": r.name },
      el("td", {}, el("a", { href: `#/q/${encodeURIComponent(r.name)}` }, r.name), " ",
        isDlq ? el("span", { class: "tag dlq", title: r.sources.length ? `DLQ of ${r.sources.join(", ")}` : "holds dead letters" },
          r.sources.length ? `DLQ of ${r.sources.join(", ")}` : "DLQ") : null),
      n(s.free), n(s.claimed), n(s.delayed),
      el("td", { class: "num", text: r.stats ? fmtAge(s.oldest && s.oldest.age) : "…" }),
      n(s.dead_letters_received), n(s.dead_lettered),
      el("td", { class: "muted", text: settings.join(", ") }));
  });
  box.replaceChildren(rows.length ? el("table", { id: "queue-table" }, el("thead", {}, head), el("tbody", {}, body))
    : el("p", { class: "muted", text: list.name ? `No queue's name contains "${list.name}".` : "This project has no queue yet." }));
  const pager = document.getElementById("queues-pager");
  const page = list.markers.length - 1;
  pager.replaceChildren(
    el("button", { disabled: page === 0, onclick: () => { list.markers.pop(); loadQueues(); } }, "Previous"),
    el("span", { class: "muted", text: `Page ${page + 1}` }),
    el("button", { disabled: !list.next, onclick: () => { list.markers.push(list.next); loadQueues(); } }, "Next"));
}

// --- One queue: its dead letters -----------------------------------------------------------------------

let current = null; // the queue view's state

async function showQueue(name) {
  current = { name, markers: [null], next: null, messages: [], selected: new Set(), filter: { source: "", reason: "", after: "", before: "", signature: "" }, scanned: 0, seen: new Map(), gen: 0, causeCounts: null };
  const view = document.getElementById("view");
  view.replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← Queues")),
    el("h1", {}, "Queue ", el("code", { text: name })),
    REPORT ? el("p", {}, el("a", { id: "insights-report", href: REPORT, target: "_blank", rel: "noopener noreferrer" }, "The insights report (charon insights): why messages die ↗")) : null,
    el("div", { id: "summary", class: "cards" }),
    el("p", { id: "settings", class: "muted" }),
    el("h2", { text: "Dead letters" }),
    filterForm(),
    el("div", { id: "dead-letters" }),
    el("div", { class: "pager", id: "messages-pager" }),
    el("div", { class: "columns" },
      el("section", {}, el("h2", { text: "By source queue" }), el("div", { id: "by-source", class: "counts" })),
      el("section", {}, el("h2", { text: "By reason" }), el("div", { id: "by-reason", class: "counts" })),
      el("section", { class: "chart" }, el("h2", { text: "Dead-lettered over time" }), el("div", { id: "chart" }))),
    el("h2", { text: "By cause (failure signature)" }), el("div", { id: "by-cause", class: "counts" }),
    el("h2", { text: "Redrive" }), redriveForm(),
    el("h2", { text: "Redrive tasks" }), el("div", { id: "tasks" }),
    el("h2", { text: "Subscriptions (who is told when messages die)" }), el("div", { id: "subscriptions" }));
  const mine = current;
  loadSummary();
  await loadMessages();
  if (mine !== current) return; // another view meanwhile
  loadCounts();
  loadTasks();
  loadSubscriptions();
}

// Each of the queue view's loads: its answer dropped when the view changed meanwhile.
const still = (mine) => mine === current && document.getElementById("summary") !== null;

async function loadSummary() {
  const mine = current;
  try {
    const [stats, meta] = await Promise.all([api("GET", q(mine.name) + "/stats"), api("GET", q(mine.name))]);
    if (!still(mine)) return;
    const s = stats.messages;
    const card = (label, v) => el("div", { class: "card" }, el("b", { text: String(v ?? 0) }), label);
    document.getElementById("summary").replaceChildren(card("ready", s.free), card("claimed", s.claimed),
      card("delayed", s.delayed), card("in all", s.total), card("dead letters received", s.dead_letters_received),
      card("dead-lettered out", s.dead_lettered), card("discarded", s.discarded),
      el("div", { class: "card" }, el("b", { text: fmtAge(s.oldest && s.oldest.age) || "–" }), "oldest"));
    const set = Object.entries(meta).filter(([k]) => k.startsWith("_")).map(([k, v]) => `${k} ${JSON.stringify(v)}`);
    document.getElementById("settings").textContent = set.length ? "Settings: " + set.join(", ") : "";
  } catch (e) { if (still(mine)) fail(e); }
}

function filterForm() {
  const f = current.filter;
  const source = el("input", { id: "filter-source", list: "sources", value: f.source, size: 14 });
  const reason = el("select", { id: "filter-reason" }, el("option", { value: "" }, "any"), REASONS.map((r) => el("option", { value: r }, r)));
  const after = el("input", { id: "filter-after", type: "datetime-local", step: 1 });
  const before = el("input", { id: "filter-before", type: "datetime-local", step: 1 });
  const signature = el("input", { id: "filter-signature", size: 16, maxlength: 16, pattern: "[0-9a-f]{16}", title: "16 hex digits, as charon insights names a cause" });
  return el("form", { class: "tools", id: "filters", oninput: () => current.invalidatePlan(), onchange: () => current.invalidatePlan(), onsubmit: (e) => {
    e.preventDefault();
    notice(null);
    Object.assign(current.filter, { source: source.value.trim(), reason: reason.value, after: after.value, before: before.value, signature: signature.value.trim() });
    current.markers = [null];
    loadMessages();
  } },
  el("datalist", { id: "sources" }),
  el("label", {}, "Source queue", source), el("label", {}, "Reason", reason),
  el("label", {}, "Dead-lettered after (UTC)", after), el("label", {}, "before (UTC)", before),
  el("label", {}, "Signature", signature),
  el("button", { type: "submit" }, "Filter"),
  el("button", { type: "button", onclick: () => filterBy({}) }, "Clear"));
}

// Show the dead letters of exactly these filters (the others cleared).
function filterBy(f) {
  for (const k of ["source", "reason", "after", "before", "signature"]) document.getElementById(`filter-${k}`).value = f[k] || "";
  document.getElementById("filters").requestSubmit();
}

const utc = (local) => (local ? new Date(local + "Z").getTime() : null);

function matches(m) {
  const f = current.filter, d = m.dead_letter || {};
  if (f.source && d.source_queue !== f.source) return false;
  if (f.reason && d.reason !== f.reason) return false;
  if (f.signature && d.signature !== f.signature) return false;
  const at = d.dead_lettered_at ? Date.parse(d.dead_lettered_at) : null;
  if (f.after && !(at !== null && at >= utc(f.after))) return false;
  if (f.before && !(at !== null && at < utc(f.before))) return false;
  return true;
}
const filtering = () => Object.values(current.filter).some(Boolean);

// A page of dead letters: one page of the API, or with a filter, pages read until PAGE match (or SCAN_PAGES
// were read): the API lists a queue's messages by marker and filters none of them.
async function loadMessages() {
  const box = document.getElementById("dead-letters");
  const at = current.markers.length - 1;
  let marker = current.markers[at], found = [], scanned = 0, pages = 0;
  if (current.invalidatePlan) current.invalidatePlan();
  const mine = current, gen = ++current.gen; // a later load wins over this one
  try {
    do {
      const query = { limit: PAGE, echo: "true", include_claimed: "true", include_delayed: "true", provenance: "true" };
      if (marker) query.marker = marker;
      const data = await api("GET", q(current.name) + "/messages", { query });
      const got = (data && data.messages) || [];
      scanned += got.length;
      pages += 1;
      for (const m of got) current.seen.set(m.id, m);
      found.push(...got.filter(matches));
      marker = markerOf(data && data.links);
      if (!got.length) marker = null;
    } while (filtering() && found.length < PAGE && marker && pages < SCAN_PAGES);
  } catch (e) { if (mine === current && gen === current.gen) fail(e); return; }
  if (mine !== current || gen !== current.gen) return;
  current.messages = found;
  current.next = marker;
  current.scanned = scanned;
  current.selected.clear();
  renderMessages();
  drawChart();
  renderCauses();
  performance.mark("charon:dead-letters-listed");
}

function renderMessages() {
  const box = document.getElementById("dead-letters");
  const rows = current.messages.map((m) => {
    const d = m.dead_letter || {};
    const check = el("input", { type: "checkbox", "aria-label": `select ${m.id}`, onchange: (e) => {
      e.target.checked ? current.selected.add(m.id) : current.selected.delete(m.id); renderActions(); current.invalidatePlan(); } });
    return el("tr", { "data-id": m.id },
      el("td", {}, check),
      el("td", {}, el("button", { class: "link", onclick: () => openMessage(m) }, m.id)),
      el("td", { text: d.source_queue || "" }),
      el("td", {}, d.reason ? el("span", { class: "tag", text: d.reason }) : "",
        d.rejection ? el("span", { class: "muted", text: " " + (d.rejection.reason || "") }) : ""),
      el("td", {}, d.signature ? el("button", { class: "link", title: "show this cause's dead letters", onclick: () => filterBy({ signature: d.signature }) }, d.signature) : ""),
      el("td", { class: "num", text: String(d.claim_count ?? m.claim_count ?? 0) }),
      el("td", { class: "num", text: String(d.redrive_count ?? 0) }),
      el("td", { text: fmtTime(d.dead_lettered_at) }),
      el("td", { class: "body", text: preview(m.body) }));
  });
  const page = current.markers.length - 1;
  const what = filtering() ? `${current.messages.length} matching of ${current.scanned} read` : `${current.messages.length} shown`;
  box.replaceChildren(
    el("div", { class: "tools" }, el("span", { class: "muted", id: "messages-count", text: what }),
      el("button", { id: "delete-selected", class: "danger", disabled: true, onclick: deleteSelected }, "Delete selected"),
      el("button", { id: "purge", onclick: purge }, "Purge this queue…")),
    rows.length ? el("table", { id: "message-table" }, el("thead", {}, el("tr", {},
      el("th", {}, ""), el("th", { text: "Message" }), el("th", { text: "Source" }), el("th", { text: "Reason" }),
      el("th", { text: "Cause" }), el("th", { class: "num", text: "Claims" }), el("th", { class: "num", text: "Redrives" }),
      el("th", { text: "Dead-lettered at" }), el("th", { text: "Body" }))), el("tbody", {}, rows))
      : el("p", { class: "muted", text: filtering() ? "No dead letter matches the filter here." : "No message in this queue." }));
  document.getElementById("messages-pager").replaceChildren(
    el("button", { disabled: page === 0, onclick: () => { current.markers.pop(); loadMessages(); } }, "Previous"),
    el("span", { class: "muted", text: `Page ${page + 1}` }),
    el("button", { id: "messages-next", disabled: !current.next, onclick: () => { current.markers.push(current.next); loadMessages(); } }, "Next"));
}

function renderActions() {
  const b = document.getElementById("delete-selected");
  if (b) { b.disabled = current.selected.size === 0; b.textContent = current.selected.size ? `Delete ${current.selected.size} selected` : "Delete selected"; }
}

async function deleteIds(ids) {
  for (const id of ids) current.seen.delete(id);
  for (let i = 0; i < ids.length; i += PAGE) {
    await api("DELETE", q(current.name) + "/messages", { query: { ids: ids.slice(i, i + PAGE).join(",") } });
  }
}

async function deleteSelected() {
  const ids = [...current.selected];
  if (!await confirmAction("Delete dead letters", `Delete ${ids.length} message(s) from ${current.name}? They are gone for good.`, "Delete")) return;
  try { await deleteIds(ids); notice({ message: `Deleted ${ids.length} message(s).` }, true); } catch (e) { fail(e); }
  loadSummary(); loadMessages(); loadCounts();
}

async function purge() {
  if (!await confirmAction("Purge the queue", `Delete every message of ${current.name}? Its settings and subscriptions stay.`, "Purge")) return;
  current.seen.clear();
  try { await api("POST", q(current.name) + "/purge", { body: { resource_types: ["messages"] } }); notice({ message: `Purged ${current.name}.` }, true); } catch (e) { fail(e); }
  loadSummary(); loadMessages(); loadCounts();
}

function openMessage(m) {
  const d = document.getElementById("message");
  document.getElementById("message-id").textContent = m.id;
  const p = m.dead_letter || {};
  const rows = [["source queue", p.source_queue], ["reason", p.reason], ["signature (cause)", p.signature], ["rejection reason", p.rejection && p.rejection.reason],
    ["rejection description", p.rejection && p.rejection.description], ["claims", p.claim_count ?? m.claim_count],
    ["redrives", p.redrive_count], ["first enqueued", fmtTime(p.first_enqueued_at)], ["dead-lettered at", fmtTime(p.dead_lettered_at)],
    ["last claimer (Client-ID)", p.consumer], ["age", fmtAge(m.age)], ["ttl", m.ttl !== undefined ? `${m.ttl} s` : ""]]
    .filter(([, v]) => v !== undefined && v !== null && v !== "");
  document.getElementById("message-body").replaceChildren(
    el("table", {}, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: String(v) }))))),
    el("h2", { text: "Body" }), el("pre", { id: "message-json", text: JSON.stringify(m.body, null, 2) }));
  document.getElementById("message-delete").onclick = async () => {
    d.close();
    if (!await confirmAction("Delete a dead letter", `Delete message ${m.id} from ${current.name}?`, "Delete")) return;
    try { await deleteIds([m.id]); notice({ message: `Deleted ${m.id}.` }, true); } catch (e) { fail(e); }
    loadSummary(); loadMessages(); loadCounts();
  };
  d.showModal();
}

// Counts by source and reason. A DLQ of up to AUTO_COUNT messages is counted whole at once (a redrive dry
// run: the API reads the DLQ, at most 100,000 messages, about 10 s at 100,000 here); a bigger one shows the
// counts of the dead letters read so far, and counts whole when asked.
const AUTO_COUNT = 5000;

async function loadCounts(whole = false) {
  const mine = current;
  const bySource = document.getElementById("by-source"), byReason = document.getElementById("by-reason");
  const table = (counts) => {
    const entries = Object.entries(counts).sort((a, b) => b[1] - a[1]);
    return entries.length ? el("table", {}, el("tbody", {}, entries.map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { class: "num", text: String(v) })))))
      : el("p", { class: "muted", text: "none" });
  };
  try {
    if (!whole) {
      const total = (await api("GET", q(mine.name) + "/stats")).messages.total;
      if (!still(mine)) return;
      if (total > AUTO_COUNT) {
        current.causeCounts = null;
        const read = { source: {}, reason: {} };
        for (const m of current.seen.values()) {
          const d = m.dead_letter;
          if (!d) continue;
          read.source[d.source_queue] = (read.source[d.source_queue] || 0) + 1;
          read.reason[d.reason] = (read.reason[d.reason] || 0) + 1;
        }
        bySource.replaceChildren(table(read.source), el("p", { class: "muted" }, `Of the ${current.seen.size} read here, of ${total}. `,
          el("button", { id: "count-all", type: "button", onclick: () => loadCounts(true) }, "Count them all")));
        byReason.replaceChildren(table(read.reason));
        return;
      }
    } else {
      bySource.replaceChildren(el("p", { class: "muted", text: "Counting (a dry run reads the DLQ)…" }));
    }
    const p = await api("POST", q(mine.name) + "/redrive", { body: { dry_run: true } });
    if (!still(mine)) return;
    current.causeCounts = p.complete ? p.by_signature || {} : null;
    renderCauses();
    bySource.replaceChildren(table(p.by_source_queue || {}), p.complete ? "" : el("p", { class: "muted", text: `(the first ${p.scanned} read)` }));
    byReason.replaceChildren(table(p.by_reason || {}));
    document.getElementById("sources").replaceChildren(...Object.keys(p.by_source_queue || {}).map((s) => el("option", { value: s })));
  } catch (e) {
    if (still(mine)) bySource.replaceChildren(el("p", { class: "muted", text: e.body ? e.body.title : String(e) }));
  }
}

function drawChart() { // the dead letters read so far, by the minute (or hour) they were moved: 30 to 60 bars
  const times = [...current.seen.values()].map((m) => m.dead_letter && Date.parse(m.dead_letter.dead_lettered_at)).filter(Boolean);
  const box = document.getElementById("chart");
  if (!times.length) { box.replaceChildren(el("p", { class: "muted", text: "No dead letter read yet." })); return; }
  const lo = Math.min(...times), hi = Math.max(...times);
  const step = hi - lo > 60 * 60e3 ? 3600e3 : 60e3, n = Math.max(30, Math.min(60, Math.floor((hi - lo) / step) + 1));
  const first = Math.floor(hi / step) * step - (n - 1) * step, bins = new Array(n).fill(0);
  for (const t of times) bins[Math.max(0, Math.floor((t - first) / step))] += 1; // older ones: the first bar
  const top = Math.max(...bins), ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${n * 10} 100`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${times.length} dead letters, per ${step === 60e3 ? "minute" : "hour"}`);
  bins.forEach((v, i) => {
    const r = document.createElementNS(ns, "rect");
    const h = (v / top) * 96;
    Object.entries({ x: i * 10 + 1, y: 100 - h, width: 8, height: h }).forEach(([k, val]) => r.setAttribute(k, val));
    const t = document.createElementNS(ns, "title");
    t.textContent = `${new Date(first + i * step).toISOString().slice(0, 16)}Z: ${v}`;
    r.append(t);
    svg.append(r);
  });
  box.replaceChildren(svg, el("p", { class: "muted", text: `${times.length} dead letters read, per ${step === 60e3 ? "minute" : "hour"}, from ${new Date(first).toISOString().slice(0, 16)}Z` }));
}

// The dead letters read so far by failure signature (core/signatures.py: what `charon insights` names a
// cause), each with an example of its text and a redrive of that cause one click away (its dry run).
function renderCauses() {
  const causes = new Map(), whole = current.causeCounts; // whole: the DLQ's counts from a dry run, if it ran
  for (const m of current.seen.values()) {
    const d = m.dead_letter;
    if (!d || !d.signature) continue;
    const c = causes.get(d.signature) || { n: 0, example: d.rejection ? d.rejection.description || d.rejection.reason : `${d.source_queue} ${d.reason}: ${preview(m.body)}` };
    c.n += 1;
    causes.set(d.signature, c);
  }
  if (whole) {
    for (const [sig, n] of Object.entries(whole)) causes.set(sig, { n, example: causes.has(sig) ? causes.get(sig).example : "" });
    for (const sig of [...causes.keys()]) if (!(sig in whole)) causes.delete(sig);
  }
  const rows = [...causes.entries()].sort((a, b) => b[1].n - a[1].n).map(([sig, c]) => el("tr", { "data-signature": sig },
    el("td", {}, el("code", { text: sig })), el("td", { class: "num", text: String(c.n) }), el("td", { class: "body", text: c.example || "(none of them read here yet)" }),
    el("td", {}, el("button", { type: "button", onclick: () => redriveCause(sig) }, "Redrive this cause…"))));
  const said = whole ? "In the whole DLQ (its redrive dry run); an example of each from the dead letters read here."
    : `Of the ${current.seen.size} dead letters read here.`;
  document.getElementById("by-cause").replaceChildren(rows.length ? el("table", { id: "cause-table" }, el("tbody", {}, rows),
    el("caption", { class: "muted", text: said })) : el("p", { class: "muted", text: "No dead letter read yet." }));
}

function redriveCause(signature) {
  filterBy({ signature });
  document.getElementById("redrive-scope").value = "filter";
  document.getElementById("redrive-dry-run").click();
  document.getElementById("redrive-dry-run").scrollIntoView({ block: "center" });
}

// --- Redrive -------------------------------------------------------------------------------------------

function redriveForm() {
  const dest = el("input", { id: "redrive-destination", size: 18, placeholder: "each message's source" });
  const limit = el("input", { id: "redrive-limit", type: "number", min: 1, size: 8 });
  const rate = el("input", { id: "redrive-rate", type: "number", min: 1, size: 8, placeholder: "as fast as it can" });
  const scope = el("select", { id: "redrive-scope" }, el("option", { value: "filter" }, "the dead letters matching the filter above"),
    el("option", { value: "selected" }, "the selected dead letters"));
  const out = el("div", { id: "redrive-result" });
  const run = el("button", { id: "redrive-run", class: "primary", disabled: true, type: "button" }, "Redrive…");
  let planned = null;
  const invalidate = () => { // what the last dry run planned no longer holds: dry-run again before a redrive
    planned = null;
    run.disabled = true;
    const said = document.getElementById("dry-run");
    if (said) out.replaceChildren();
  };
  current.invalidatePlan = invalidate;
  for (const input of [dest, limit, rate, scope]) { input.addEventListener("input", invalidate); input.addEventListener("change", invalidate); }
  const spec = () => {
    const body = {}, filter = {}, f = current.filter;
    if (dest.value.trim()) body.destination = dest.value.trim();
    if (limit.value) body.limit = Number(limit.value);
    if (rate.value) body.max_per_second = Number(rate.value);
    if (scope.value === "selected") filter.message_ids = [...current.selected];
    else {
      if (f.source) filter.source_queue = f.source;
      if (f.reason) filter.reason = f.reason;
      if (f.after) filter.dead_lettered_after = new Date(utc(f.after)).toISOString();
      if (f.before) filter.dead_lettered_before = new Date(utc(f.before)).toISOString();
      if (f.signature) filter.signature = f.signature;
    }
    if (Object.keys(filter).length) body.filter = filter;
    return body;
  };
  const dry = async () => {
    notice(null);
    invalidate();
    const mine = planned = spec();
    try {
      const p = await api("POST", q(current.name) + "/redrive", { body: { ...mine, dry_run: true } });
      if (planned !== mine) return; // changed meanwhile
      const to = mine.destination || "each message's source queue";
      out.replaceChildren(el("p", { id: "dry-run" }, el("strong", { text: `${p.would_move} would move` }),
        ` to ${to}${describe(mine)} (${p.matched} match of ${p.scanned} read${p.complete ? "" : ", not all read"}` +
        (p.claimed ? `, ${p.claimed} claimed now and left` : "") + ")."),
      p.sample && p.sample.length ? el("p", { class: "muted", text: "Sample: " + p.sample.slice(0, 5).map((m) => `${m.id} ${preview(m.body)}`).join(" · ") }) : "");
      run.disabled = p.would_move === 0;
      mine.would_move = p.would_move;
    } catch (e) { fail(e); out.replaceChildren(); }
  };
  run.addEventListener("click", async () => {
    const { would_move: n, ...body } = planned;
    const to = body.destination || "each message's source queue";
    if (!await confirmAction("Redrive", `Move up to ${n} dead letter(s)${describe(body)} from ${current.name} to ${to}` +
      (body.max_per_second ? `, ${body.max_per_second} a second` : "") + "? They are claimable there at once.", "Redrive")) return;
    run.disabled = true;
    try {
      const task = await api("POST", q(current.name) + "/redrive", { body });
      watchTask(task, out, n);
    } catch (e) { fail(e); }
  });
  return el("div", { class: "redrive" },
    el("div", { class: "tools" }, el("label", {}, "Redrive", scope), el("label", {}, "Destination", dest),
      el("label", {}, "At most (messages)", limit), el("label", {}, "Per second", rate),
      el("button", { id: "redrive-dry-run", type: "button", onclick: dry }, "Dry run"), run),
    out);
}

// What a redrive's body selects, as words: " (reason rejected, source orders)", or "".
function describe(body) {
  const f = body.filter || {}, parts = [];
  if (f.message_ids) parts.push(`${f.message_ids.length} selected`);
  if (f.source_queue) parts.push(`source ${f.source_queue}`);
  if (f.reason) parts.push(`reason ${f.reason}`);
  if (f.signature) parts.push(`signature ${f.signature}`);
  if (f.dead_lettered_after) parts.push(`dead-lettered from ${fmtTime(f.dead_lettered_after)}`);
  if (f.dead_lettered_before) parts.push(`before ${fmtTime(f.dead_lettered_before)}`);
  if (body.limit) parts.push(`at most ${body.limit}`);
  return parts.length ? ` (${parts.join(", ")})` : "";
}

function taskLine(t, expected) { // `expected`: what its dry run said would move, if known
  const p = t.progress || {};
  const total = Math.min(...[t.request && t.request.limit, expected].filter((x) => x > 0)); // Infinity: unknown
  const fill = el("span");
  const done = t.status === "succeeded" ? 100 : total < Infinity ? Math.min(100, (100 * p.moved) / total) : 50;
  fill.style.width = `${done}%`; // through CSSOM: the page's CSP takes no style attribute
  const bar = el("span", { class: "progress", title: `${p.moved} moved` }, fill);
  return el("span", { class: "task", "data-status": t.status },
    el("span", { class: "tag", text: t.status }), " ", bar, ` ${p.moved} moved, ${p.skipped} skipped, ${p.scanned} read `);
}

async function watchTask(task, out, expected) {
  const mine = current, queue = current.name;
  const line = el("p", { id: "redrive-task" });
  const cancel = el("button", { id: "redrive-cancel", type: "button", onclick: async () => {
    try { render(await api("DELETE", q(queue) + `/redrive/${task.id}`)); } catch (e) { fail(e); }
  } }, "Cancel");
  const render = (t) => { task = t; line.replaceChildren(`Task ${t.id}: `, taskLine(t, expected), t.status === "running" ? cancel : ""); };
  out.replaceChildren(line);
  render(task);
  let wait = 1000;
  while (task.status === "running") { // each second until it ends; a 429 or 503 waits longer, then asks again
    await new Promise((r) => setTimeout(r, wait));
    if (!still(mine) || !line.isConnected) return; // the operator went elsewhere: the task runs on regardless
    try {
      render(await api("GET", q(queue) + `/redrive/${task.id}`));
      wait = 1000;
    } catch (e) {
      if (e.status !== 429 && e.status !== 503 && e.status !== 0) { fail(e); return; }
      wait = Math.min(wait * 2, 10000);
    }
  }
  current.seen.clear();
  loadSummary(); loadMessages(); loadCounts(); loadTasks();
}

async function loadTasks() {
  const mine = current;
  try {
    const data = await api("GET", q(mine.name) + "/redrive", { query: { limit: PAGE } });
    if (!still(mine)) return;
    const rows = (data.tasks || []).map((t) => el("tr", {}, el("td", {}, el("code", { text: t.id })), el("td", { text: fmtTime(t.created) }),
      el("td", {}, taskLine(t)), el("td", { class: "muted", text: JSON.stringify(t.request || {}) })));
    document.getElementById("tasks").replaceChildren(rows.length ? el("table", { id: "task-table" }, el("tbody", {}, rows)) : el("p", { class: "muted", text: "No redrive in the last 7 days." }));
  } catch (e) { if (still(mine)) document.getElementById("tasks").replaceChildren(el("p", { class: "muted", text: e.body ? e.body.title : String(e) })); }
}

async function loadSubscriptions() {
  const mine = current;
  try {
    const data = await api("GET", q(mine.name) + "/subscriptions", { query: { limit: PAGE } });
    if (!still(mine)) return;
    const rows = (data.subscriptions || []).map((s) => el("tr", {}, el("td", { text: s.subscriber }),
      el("td", { text: s.confirmed ? "confirmed" : "not confirmed" }), el("td", { class: "muted", text: JSON.stringify(s.options || {}) })));
    document.getElementById("subscriptions").replaceChildren(rows.length ? el("table", {}, el("tbody", {}, rows)) : el("p", { class: "muted", text: "Nobody subscribes to this queue." }));
  } catch (e) { if (still(mine)) document.getElementById("subscriptions").replaceChildren(el("p", { class: "muted", text: e.body ? e.body.title : String(e) })); }
}

// --- Start ---------------------------------------------------------------------------------------------

function route() {
  notice(null);
  if (!state.project && !state.token) { // nothing to ask the API as yet
    document.getElementById("view").replaceChildren(el("h1", { text: "Sign in" }),
      el("p", { text: "Enter the project whose queues to show (X-Project-ID, without Keystone), or a Keystone token " +
        "and, if you like, its project; then press Use. This tab keeps them until it is closed, nowhere else." }));
    document.getElementById("project").focus();
    return;
  }
  state.prompted = false;
  const m = location.hash.match(/^#\/q\/(.+)$/);
  let name = null;
  try { name = m ? decodeURIComponent(m[1]) : null; } catch { name = null; }
  if (m && name === null) { location.hash = "#/"; return; } // a malformed link: the queue list
  const go = name !== null ? showQueue(name) : showQueues();
  go.catch(fail).finally(() => { if (!state.prompted) document.getElementById("view").focus({ preventScroll: true }); });
}

document.addEventListener("DOMContentLoaded", () => {
  const project = document.getElementById("project"), token = document.getElementById("token");
  project.value = state.project;
  token.value = state.token;
  document.getElementById("identity").addEventListener("submit", (e) => {
    e.preventDefault();
    state.project = project.value.trim();
    state.token = token.value.trim();
    sessionStorage.setItem("charon.project", state.project);
    if (state.token) sessionStorage.setItem("charon.token", state.token); else sessionStorage.removeItem("charon.token");
    list.markers = [null];
    list.name = "";
    route();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem("charon.project"); sessionStorage.removeItem("charon.token");
    state.project = state.token = ""; project.value = token.value = "";
    list.markers = [null];
    list.name = "";
    route();
  });
  window.addEventListener("hashchange", route);
  route();
});
