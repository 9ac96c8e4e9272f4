// fcd approval UI: lists the formations waiting for approval and posts an
// approver's decision, bound to the digest shown on the card, to the REST API.
// Signed in with an operator credential instead, it shows the uncertain
// leases, read-only: resolving one takes a resolution signed with the
// operator's key, which stays out of the browser (`authzd lease resolve`).
//
// Safety: every value from the server reaches the page through text nodes
// and DOM properties (el() below), never through HTML parsing. Arguments and
// principal attributes come from an agent and may hold markup. Invisible and
// bidirectional control characters are shown escaped, so text cannot pose
// as something else. The credential lives in sessionStorage only (this tab).

const CREDENTIAL_KEY = "fcd.approver.credential";
const REFRESH_MS = 5000;
// Relative to /ui/, so the UI also works behind a path prefix.
const API = "../v1";

const $ = (id) => document.getElementById(id);

// cards holds the card of each formation on screen, by formation id.
const cards = new Map();
// parts holds, per card, the nodes a refresh updates in place.
const parts = new WeakMap();
let me = null;
let timer = null;
let ticker = null;
let refreshing = false;
let refreshes = 0;
let uid = 0;

// el creates an element with properties and children (strings become
// text nodes); nothing is ever parsed as HTML.
function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props ?? {})) {
    if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("aria-") || k === "role") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// Characters that render invisibly or reorder text; shown as \uXXXX.
const HIDDEN_CHARS = "[\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f\\u00ad\\u061c\\u115f\\u1160\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u206f\\u3164\\ufe00-\\ufe0f\\ufeff\\ufff9-\\ufffb]";
const hiddenAll = new RegExp(HIDDEN_CHARS, "gu");
const hiddenAny = new RegExp(HIDDEN_CHARS, "u");
const escapeHidden = (s) => s.replace(hiddenAll, (c) => "\\u" + c.codePointAt(0).toString(16).padStart(4, "0"));

// text shows any value as plain, visible text.
function text(v) {
  if (v === null || v === undefined || v === "") return "—";
  return escapeHidden(typeof v === "string" ? v : JSON.stringify(v));
}

// pretty pretty-prints JSON with hidden characters escaped.
const pretty = (v) => escapeHidden(JSON.stringify(v ?? null, null, 2));
const hasHidden = (v) => hiddenAny.test(JSON.stringify(v ?? null));

function rows(pairs) {
  return el("dl", null, pairs.filter(Boolean).map(([k, v]) => [el("dt", null, k), el("dd", null, v)]));
}
const mono = (v) => el("span", { className: "mono" }, text(v));
const list = (xs) => (Array.isArray(xs) && xs.length ? el("ul", { className: "plain" }, xs.map((x) => el("li", null, text(x)))) : "none");
const yesNo = (b) => (b === true ? "yes" : b === false ? "no" : "—");
const verdict = (v) => el("span", { className: v === "allow" ? "verdict-allow" : "verdict-deny" }, text(v));

function ago(iso) {
  const ms = Date.parse(iso) - Date.now();
  if (Number.isNaN(ms)) return "";
  const s = Math.round(Math.abs(ms) / 1000);
  const span = s >= 3600 ? `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min` : s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
  return ms >= 0 ? `in ${span}` : `${span} ago`;
}
// when shows a timestamp in the reader's local time, with how long ago or
// how soon, and the UTC value the server sent in the title.
function when(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return text(iso);
  return el("time", { dateTime: String(iso), title: `${new Date(t).toISOString()} (UTC)` }, `${new Date(t).toLocaleString()} (${ago(iso)})`);
}

// ---- API ------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
  get slug() {
    return String(this.problem.type ?? "").split("#").pop();
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(CREDENTIAL_KEY) ?? ""}`, Accept: "application/json, application/problem+json" };
  const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(`${API}${path}`, init);
  } catch (err) {
    throw new ApiError(0, { title: "The server did not answer", detail: String(err?.message ?? err) });
  }
  const raw = await resp.text();
  let data = null;
  try {
    data = raw ? JSON.parse(raw) : null;
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const problem = data && typeof data === "object" ? data : { title: `HTTP ${resp.status}`, detail: raw.slice(0, 300) };
    throw new ApiError(resp.status, problem);
  }
  return data;
}

// problemNode shows an API error: the problem's title, status, detail and slug.
function problemNode(err, hint) {
  const p = err.problem ?? {};
  return el("div", { className: "problem" },
    el("span", { className: "problem-title" }, text(p.title ?? err.message)),
    err.status ? ` (${err.status}${err.slug ? ", " + text(err.slug) : ""})` : "",
    p.detail ? [": ", text(p.detail)] : "",
    hint ? el("div", null, hint) : null);
}

// A credential problem ends the session: back to the sign-in.
const credentialProblem = (err) => err.status === 401 || (err.status === 403 && err.slug === "forbidden-role");

// ---- sign-in ----------------------------------------------------------------

function showSignin(err) {
  $("signin").hidden = false;
  $("queue").hidden = true;
  $("uncertain").hidden = true;
  $("account").hidden = true;
  const box = $("signin-error");
  if (err) {
    const hint = err.status === 401 ? "Check that you pasted the whole credential."
      : err.status === 403 ? "The approval UI needs a credential of the approver role (or of the operator role, to see the uncertain leases)." : null;
    box.replaceChildren(problemNode(err, hint));
    box.hidden = false;
  } else {
    box.replaceChildren();
    box.hidden = true;
  }
  $("credential").focus();
}

// whoAmI asks who the credential is: an approver, else an operator; any
// other role is refused with the approver route's answer.
async function whoAmI() {
  try {
    return await api("GET", "/approvers/me");
  } catch (err) {
    if (err.status !== 403 || err.slug !== "forbidden-role") throw err;
    try {
      return await api("GET", "/operators/me");
    } catch (err2) {
      if (err2.status === 403 && err2.slug === "forbidden-role") throw err;
      throw err2;
    }
  }
}

async function signIn(secret) {
  sessionStorage.setItem(CREDENTIAL_KEY, secret);
  $("signin-button").disabled = true;
  try {
    me = await whoAmI();
  } catch (err) {
    $("credential").value = "";
    signOut(err);
    return;
  } finally {
    $("signin-button").disabled = false;
  }
  $("credential").value = "";
  $("account-id").textContent = text(me.id);
  $("account").hidden = false;
  $("signin").hidden = true;
  $("signin-error").hidden = true;
  $("queue").hidden = me.role !== "approver";
  $("uncertain").hidden = me.role !== "operator";
  await refresh();
  if (!me) return; // the first refresh found the credential refused
  timer = setInterval(refresh, REFRESH_MS);
  ticker = setInterval(tick, 1000);
}

function signOut(err) {
  sessionStorage.removeItem(CREDENTIAL_KEY);
  clearInterval(timer);
  clearInterval(ticker);
  timer = ticker = me = null;
  for (const card of cards.values()) card.remove();
  cards.clear();
  $("decision-log").replaceChildren();
  $("decisions").hidden = true;
  $("queue-error").hidden = true;
  $("uncertain-rows").replaceChildren();
  $("uncertain-table").hidden = true;
  $("uncertain-error").hidden = true;
  showSignin(err);
}

// ---- the queue ----------------------------------------------------------------

// The queue is read in pages of PAGE_LIMIT, in id order, following `next`;
// one refresh reads at most MAX_PAGES pages (each page reads a bounded
// number of records on the server, so a large store takes several). What
// lies past the last page read stays as it was until a later refresh.
const PAGE_LIMIT = 1000;
const MAX_PAGES = 20;

// pendingPages lists the formations waiting for approval and returns them
// with `upTo`: the id the listing stopped after, or null when it reached
// the end.
async function pendingPages() {
  const all = [];
  let after = "";
  for (let page = 0; page < MAX_PAGES; page++) {
    const q = new URLSearchParams({ status: "pending_approval", limit: String(PAGE_LIMIT) });
    if (after) q.set("after", after);
    const data = await api("GET", `/formations?${q}`);
    if (Array.isArray(data?.formations)) all.push(...data.formations);
    if (typeof data?.next !== "string" || data.next === "") return { formations: all, upTo: null };
    after = data.next;
  }
  return { formations: all, upTo: after };
}

async function refresh() {
  if (refreshing || !me) return;
  if (me.role === "operator") return refreshUncertain();
  refreshing = true;
  try {
    const { formations, upTo } = await pendingPages();
    if (!me) return;
    render(formations, upTo);
    $("queue-error").hidden = true;
    const more = upTo === null ? "" : " More may wait beyond these; they show as the queue empties.";
    $("queue-status").textContent = `Updated ${new Date().toLocaleTimeString()}: ${cards.size} waiting.${more}`;
  } catch (err) {
    if (credentialProblem(err)) return signOut(err);
    $("queue-error").replaceChildren(problemNode(err, "The list below may be out of date."));
    $("queue-error").hidden = false;
  } finally {
    refreshing = false;
    $("queue").dataset.refreshes = String(++refreshes);
  }
}

// render adds new cards, updates the others in place and removes those no
// longer pending, so focus and a half-typed reason survive a refresh. With
// upTo (the listing stopped there), only cards up to that id in id order
// are known to be gone when absent; the others stay.
function render(formations, upTo = null) {
  const seen = new Set();
  for (const f of formations) {
    if (typeof f?.id !== "string") continue;
    seen.add(f.id);
    let card = cards.get(f.id);
    if (card && card.dataset.digest !== f.digest) {
      // Never the case for an immutable record; if it were, the approver
      // must see the new record, not approve the old one.
      drop(card);
      card = null;
    }
    if (card) {
      update(card, f);
    } else {
      card = buildCard(f);
      cards.set(f.id, card);
      $("queue-lines").append(parts.get(card).line.item);
      $("cards").append(card);
      if (location.hash === `#${f.id}`) openCard(card);
    }
  }
  for (const [id, card] of cards) {
    if (!seen.has(id) && (upTo === null || id <= upTo)) {
      drop(card);
      cards.delete(id);
    }
  }
  $("queue-empty").hidden = cards.size > 0;
}

function drop(card) {
  parts.get(card)?.line.item.remove();
  card.remove();
}

// queueLine is a formation's line in the compact queue: tool, principal,
// side effect, age and approvals so far; it opens and closes the card.
function queueLine(f, cardID) {
  const m = f.metadata ?? {};
  const age = el("span", { className: "age" }, ago(f.createdAt));
  const tally = el("span", { className: "tally", title: "approvals so far / needed" });
  const button = el("button", { type: "button", className: "line", dataset: { formation: f.id }, "aria-expanded": "false", "aria-controls": cardID },
    el("span", { className: "mono tool" }, text(f.tool)),
    el("span", { className: "who" }, text(f.principal?.id)),
    el("span", { className: `badge ${m.sideEffects === "delete" ? "delete" : m.sideEffects === "write" ? "write" : ""}` }, text(m.sideEffects)),
    age, tally);
  return { item: el("li", null, button), button, age, tally };
}

// openCard shows a formation's card (and reads its comparison once);
// toggled again, it hides it.
function openCard(card, toggle = false) {
  const p = parts.get(card);
  const open = toggle ? card.hidden : true;
  card.hidden = !open;
  p.line.button.setAttribute("aria-expanded", String(open));
  if (!open) return;
  if (!p.compared) {
    p.compared = true;
    loadComparison(p);
  }
  card.querySelector("h3")?.focus();
}

async function loadComparison(p) {
  try {
    const c = await api("GET", `/formations/${encodeURIComponent(p.formation.id)}/comparison`);
    p.comparison.replaceChildren(compareTable(c));
  } catch (err) {
    if (credentialProblem(err)) return signOut(err);
    p.comparison.replaceChildren(problemNode(err));
    p.compared = false;
  }
}

// compareTable shows a comparison: a row per member, a column per epoch
// (source, successor, active), cells that differ from the source marked.
function compareTable(c) {
  const cols = [["source", "Source (formed on)", c.source], ["successor", "Successor (captured)", c.successor], ["active", "Active now", c.active]]
    .filter(([, , e]) => e);
  const diffs = Array.isArray(c.differences) ? c.differences : [];
  const differs = (col, ptr) => col !== "source" && diffs.some((d) => d.column === col && (d.pointer === ptr || d.pointer.startsWith(ptr + "/")));
  const esc = (k) => k.replaceAll("~", "~0").replaceAll("/", "~1");
  const members = [
    ["Release", "/release", (e) => text(e.release)],
    ["Epoch", "/epoch", (e) => mono(e.epoch)],
    ["State", "/state", (e) => text(e.state)],
    ["Pool", "/pool", (e) => text(e.pool)],
    ["Artifact", "/artifact", (e) => [text(e.artifact?.image), " ", mono(e.artifact?.digest)]],
    ["Config digest", "/config/digest", (e) => mono(e.config?.digest)],
  ];
  const keys = (get) => [...new Set(cols.flatMap(([, , e]) => Object.keys(get(e) ?? {})))].sort();
  for (const k of keys((e) => e.config?.values)) members.push([`Config: ${k}`, `/config/values/${esc(k)}`, (e) => text(e.config?.values?.[k])]);
  for (const k of keys((e) => e.featureFlags?.values)) members.push([`Flag: ${k}`, `/featureFlags/values/${esc(k)}`, (e) => text(e.featureFlags?.values?.[k])]);
  members.push(
    ["Descriptor digest", "/tool/descriptorDigest", (e) => (e.tool ? mono(e.tool.descriptorDigest) : "not declared")],
    ["Description", "/tool/description", (e) => text(e.tool?.description)],
    ["Input schema", "/tool/inputSchema", (e) => el("pre", null, pretty(e.tool?.inputSchema))],
    ["Side effects", "/tool/sideEffects", (e) => text(e.tool?.sideEffects)],
    ["Requires approval", "/tool/requiresApproval", (e) => yesNo(e.tool?.requiresApproval)],
    ["Failure modes", "/tool/failureModes", (e) => list((e.tool?.failureModes ?? []).map((m) => `${m.error} → ${m.recovery}`))],
    ["Dependencies", "/tool/dependencies", (e) => (e.tool?.dependencies ? el("pre", null, pretty(e.tool.dependencies)) : "none")],
    ["Modeled effects", "/certificate", (e) => (e.certificate ? el("pre", null, pretty(e.certificate.effects)) : "—")],
  );
  const table = el("table", { className: "compare" },
    el("thead", null, el("tr", null, el("th", { scope: "col" }, "Member"), cols.map(([, h]) => el("th", { scope: "col" }, h)))),
    el("tbody", null, members.map(([label, ptr, show]) => {
      const marked = cols.some(([col]) => differs(col, ptr));
      return el("tr", { className: marked ? "differs" : "" }, el("th", { scope: "row" }, label, marked ? el("span", { className: "mark", title: "differs from the source" }, " ≠") : ""),
        cols.map(([col, , e]) => el("td", { className: differs(col, ptr) ? "differs" : "" }, show(e))));
    })));
  const omitted = Array.isArray(c.omitted) && c.omitted.length
    ? el("p", { className: "omitted" }, "The call leaves out ", c.omitted.map((o, i) => [i ? ", " : "", el("code", null, text(o))]),
      ": the handler fills these in from its own defaults, which the configuration above may set differently in each epoch.")
    : "";
  const summary = cols.length === 1 ? el("p", null, "The source is the server's active epoch and the call has no successor: nothing to compare.")
    : el("p", null, `${diffs.length} difference${diffs.length === 1 ? "" : "s"} from the source.`);
  return el("div", null, summary, omitted, scroll(table));
}

function tick() {
  for (const card of cards.values()) {
    const p = parts.get(card);
    p.expires.replaceChildren(when(p.formation.expiresAt));
    p.line.age.textContent = ago(p.formation.createdAt);
  }
}

const approved = (f) => (f.approvals ?? []).filter((a) => a.decision === "approve").length;

// sameIdentity compares approver ids as the server does, near enough for
// the page: trimmed, NFC, case-insensitive.
const sameIdentity = (a, b) => String(a ?? "").normalize("NFC").trim().toLowerCase() === String(b ?? "").normalize("NFC").trim().toLowerCase();

// decidedByMe: the signed-in approver already approved or denied f; the
// server refuses a second decision of theirs (duplicate-approver).
const decidedByMe = (f) => !!me && (f.approvals ?? []).some((a) => sameIdentity(a.approver, me.id));
const tally = (f) => `${approved(f)} of ${f.approvalsRequired} approval${f.approvalsRequired === 1 ? "" : "s"}`;

// update shows the mutable part of a formation: status, approvals, time left.
function update(card, f) {
  const p = parts.get(card);
  p.formation = f;
  p.status.textContent = text(f.status);
  for (const t of p.tallies) t.textContent = tally(f);
  p.approvals.replaceChildren(...(f.approvals ?? []).map((a) =>
    el("li", null, `${text(a.decision)} by `, el("strong", null, text(a.approver)), " at ", when(a.at),
      a.reason ? [": ", el("q", null, text(a.reason))] : "", ` (digest ${text(a.digest)})`)));
  p.expires.replaceChildren(when(f.expiresAt));
  p.line.tally.textContent = `${approved(f)}/${f.approvalsRequired}`;
  if (p.approve) {
    const mine = decidedByMe(f);
    p.mine.hidden = !mine;
    if (mine) p.approve.disabled = p.deny.disabled = true;
  }
}

function section(title, ...body) {
  return el("section", null, el("h4", null, title), ...body);
}

// wideSection spans the card's whole width: its tables need the room.
function wideSection(title, ...body) {
  return el("section", { className: "wide" }, el("h4", null, title), ...body);
}

// scroll lets a table scroll sideways instead of overflowing the card.
const scroll = (table) => el("div", { className: "table-scroll" }, table);

function target(t) {
  return [
    ["Release", text(t.release)],
    ["Server", text(t.server)],
    ["Pool", text(t.pool)],
    ["Epoch", mono(t.epoch)],
    ["Artifact image", text(t.artifact?.image)],
    ["Artifact digest", mono(t.artifact?.digest)],
    ["Config digest", mono(t.configDigest)],
  ];
}

function successorSection(f) {
  const s = f.successor;
  if (!s) return section("Successor", el("p", { className: "successor" }, "none — runs only on the source"));
  return section("Successor (may run here once the source is retired)", el("div", { className: "successor" },
    rows([...target(s),
      ["Certificate", mono(s.certificate)],
      ["Issuer", mono(s.issuer)],
      ["Profile", s.profile ? [text(s.profile.id), " ", mono(s.profile.digest)] : "—"],
      ["Certificate expires", when(s.expiresAt)],
    ]),
    el("p", null, "Modeled effects:"), el("pre", null, pretty(s.effects))));
}

// recoverySection shows what a recovery recovers: the approver decides on
// a retry knowing how the earlier attempt ended.
function recoverySection(f) {
  const r = f.recovery;
  if (!r) return "";
  const fm = r.failureMode;
  return section("Recovery of an earlier call", el("div", { className: "recovery" }, rows([
    ["Recovers", mono(r.of)],
    ["First call", mono(r.root)],
    ["Attempt", text(String(r.attempt))],
    ["Earlier outcome", text(r.outcome)],
    ["Failure mode", fm ? [text(fm.error), " → ", text(fm.recovery)] : "none (the earlier outcome was uncertain)"],
  ])));
}

function metadataSection(m = {}) {
  const deps = m.dependencies ?? {};
  const modes = Array.isArray(m.failureModes) && m.failureModes.length
    ? el("table", null,
      el("thead", null, el("tr", null, ["Error", "Recovery", "Max attempts", "Fallback", "Description"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", null, m.failureModes.map((fm) => el("tr", null,
        [fm.error, fm.recovery, fm.maxAttempts, fm.fallback, fm.description].map((v) => el("td", null, text(v)))))))
    : "none";
  return wideSection("MCP+ metadata", rows([
    ["Summary", text(m.summary)],
    ["Side effects", text(m.sideEffects)],
    ["Requires approval", yesNo(m.requiresApproval)],
    ["Requires", list(deps.requires)],
    ["Produces input for", list(deps.producesInputFor)],
    ["Exclusive with", list(deps.exclusiveWith)],
  ]), el("p", null, "Failure modes:"), typeof modes === "string" ? modes : scroll(modes));
}

function decisionSection(d = {}) {
  const engines = el("table", null,
    el("thead", null, el("tr", null, ["Engine", "Verdict", "Approvals", "Rules", "Reasons", "Successor"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", null, (d.engines ?? []).map((e) => el("tr", null,
      el("td", null, text(e.engine)),
      el("td", null, verdict(e.verdict), e.error ? [" — error: ", text(e.error)] : ""),
      el("td", null, text(e.approvals)),
      el("td", null, list(e.rules)),
      el("td", null, list(e.reasons)),
      el("td", null, e.successor ? [
        el("div", null, verdict(e.successor.verdict)),
        e.successor.rules?.length ? el("div", null, "refused by ", list(e.successor.rules)) : "",
        e.successor.reasons?.length ? el("div", null, list(e.successor.reasons)) : "",
        e.successor.error ? el("div", null, "error: ", text(e.successor.error)) : ""] : "—")))));
  const s = d.successor;
  return wideSection("Policy decision", rows([
    ["Verdict", verdict(d.verdict)],
    ["Approvals asked by policy", text(d.approvals)],
    ["Policy digest", mono(d.policyDigest)],
    ["Decided at", text(d.decidedAt)],
    ["On the successor", el("span", { className: "decision-successor" },
      s ? [verdict(s.verdict), " for certificate ", mono(s.certificate), " → epoch ", mono(s.epoch)] : "no candidate")],
  ]), scroll(engines));
}

function buildCard(f) {
  const n = ++uid;
  const p = {
    formation: f,
    status: el("span", { className: "badge" }),
    tallies: [el("strong"), el("strong")],
    approvals: el("ul", { className: "plain" }),
    expires: el("span"),
    comparison: el("div", { className: "comparison" }, "Reading the comparison…"),
  };
  p.line = queueLine(f, `card-${n}`);
  const m = f.metadata ?? {};
  const principal = f.principal ?? {};
  const reasonID = `reason-${n}`;
  const reason = el("textarea", { id: reasonID, rows: 2, maxLength: 2000 });
  const result = el("div", { className: "result", role: "status" });
  const approve = el("button", { type: "button", className: "approve" }, "Approve");
  const deny = el("button", { type: "button", className: "deny" }, "Deny");

  const warnings = [];
  if (hasHidden(f.arguments) || hasHidden(principal)) {
    warnings.push(el("p", { className: "warning" }, "Contains invisible or direction-changing characters, shown as \\uXXXX escapes."));
  }
  if (me && principal.id === me.id) {
    warnings.push(el("p", { className: "warning" }, "You are this call's principal: the server refuses your approval."));
  }

  const card = el("article", { className: "card", id: `card-${n}`, hidden: true, dataset: { formation: f.id, digest: f.digest }, "aria-labelledby": `title-${n}` },
    el("div", { className: "card-head" },
      el("h3", { id: `title-${n}`, tabIndex: -1 }, text(f.tool)),
      el("span", { className: `badge ${m.sideEffects === "delete" ? "delete" : m.sideEffects === "write" ? "write" : ""}` }, text(m.sideEffects)),
      p.status,
      el("span", null, p.tallies[0])),
    warnings,
    el("div", { className: "grid" },
      section("Call", rows([
        ["Formation", mono(f.id)],
        ["Tool", el("span", { className: "mono tool" }, text(f.tool))],
        ["Principal", el("span", { className: "principal" }, text(principal.id))],
        ["Principal attributes", principal.attributes ? el("pre", { className: "attributes" }, pretty(principal.attributes)) : "none"],
        ["Host", text(principal.host)],
        ["Session", text(f.session)],
        ["Snapshot", mono(f.snapshot)],
        ["Created", when(f.createdAt)],
        ["Expires", p.expires],
      ])),
      section("Arguments", el("pre", { className: "arguments" }, pretty(f.arguments)),
        rows([["Argument digest", mono(f.argumentDigest)], ["Descriptor digest", mono(f.descriptorDigest)]])),
      section("Source (runs here)", el("div", { className: "source" }, rows(target(f.source ?? {})))),
      successorSection(f),
      wideSection("What changed: source, successor and the server's active epoch", p.comparison),
      recoverySection(f),
      metadataSection(m),
      decisionSection(f.decision)),
    section("Approvals", el("p", null, p.tallies[1], " so far"), p.approvals),
    el("p", null, "Your decision is bound to this record's digest: ", el("strong", { className: "mono digest" }, text(f.digest))),
    el("div", { className: "decide" },
      el("label", { htmlFor: reasonID }, "Reason (recorded with your decision)"),
      reason,
      el("div", { className: "buttons" }, approve, deny),
      p.mine = el("p", { className: "mine", hidden: true }, "You have decided on this call; another approver must add theirs."),
      result));
  p.approve = approve;
  p.deny = deny;
  parts.set(card, p);
  update(card, f);

  const decide = async (decision) => {
    approve.disabled = deny.disabled = true;
    result.replaceChildren(el("p", null, "Sending…"));
    try {
      const out = await api("POST", `/formations/${encodeURIComponent(f.id)}/approvals`, { decision, digest: f.digest, reason: reason.value.trim() });
      update(card, out);
      const verb = decision === "approve" ? "Approved" : "Denied";
      const msg = out.status === "pending_approval" ? `${verb}: ${tally(out)}; still waiting for approval.`
        : out.status === "ready" ? `${verb}: ${tally(out)}; the formation is now ready.`
        : `${verb}: the formation is now ${text(out.status)}.`;
      result.replaceChildren(el("p", { className: "ok" }, msg));
      reason.value = "";
      log(f, msg);
      if (out.status === "pending_approval" && !decidedByMe(out)) approve.disabled = deny.disabled = false;
    } catch (err) {
      if (credentialProblem(err)) return signOut(err);
      result.replaceChildren(problemNode(err));
      approve.disabled = deny.disabled = false;
    }
  };
  p.line.button.addEventListener("click", () => openCard(card, true));
  approve.addEventListener("click", () => decide("approve"));
  deny.addEventListener("click", () => decide("deny"));
  return card;
}

function log(f, msg) {
  $("decisions").hidden = false;
  $("decision-log").append(el("li", { dataset: { formation: f.id } },
    `${new Date().toLocaleTimeString()} `, el("span", { className: "mono" }, text(f.tool)), ` ${text(f.id)}: ${msg}`));
}

// ---- uncertain leases (operators, read-only) ---------------------------------------

const EPOCH_ID = /^sha256:[0-9a-f]{64}$/;

// uncertainLeases reads the open leases of every epoch that counts an
// uncertain one, and returns those uncertain, each with its epoch.
async function uncertainLeases() {
  const data = await api("GET", "/epochs");
  const epochs = (Array.isArray(data?.epochs) ? data.epochs : []).filter((e) => e?.uncertainLeases > 0 && EPOCH_ID.test(e.id ?? ""));
  const out = [];
  for (const ep of epochs) {
    const ls = await api("GET", `/epochs/${ep.id}/leases`);
    for (const l of Array.isArray(ls?.leases) ? ls.leases : []) {
      if (l?.state === "uncertain" && typeof l.id === "string") out.push({ lease: l, epoch: ep });
    }
  }
  out.sort((a, b) => String(a.lease.admittedAt).localeCompare(String(b.lease.admittedAt)) || a.lease.id.localeCompare(b.lease.id));
  return out;
}

async function refreshUncertain() {
  if (refreshing || !me) return;
  refreshing = true;
  try {
    const rows = await uncertainLeases();
    if (!me) return;
    $("uncertain-rows").replaceChildren(...rows.map(uncertainRow));
    $("uncertain-table").hidden = rows.length === 0;
    $("uncertain-empty").hidden = rows.length > 0;
    $("uncertain-error").hidden = true;
    $("uncertain-status").textContent = `Updated ${new Date().toLocaleTimeString()}: ${rows.length} uncertain.`;
  } catch (err) {
    if (credentialProblem(err)) return signOut(err);
    $("uncertain-error").replaceChildren(problemNode(err, "The list below may be out of date."));
    $("uncertain-error").hidden = false;
  } finally {
    refreshing = false;
    $("uncertain").dataset.refreshes = String(++refreshes);
  }
}

// uncertainRow shows one uncertain lease and the command that resolves it.
function uncertainRow({ lease: l, epoch: ep }) {
  const cmd = `authzd lease resolve --key "$FCD_OPERATOR_KEY" --outcome effect|no_effect --reason '…' ${text(l.id)}`;
  return el("tr", { dataset: { lease: String(l.id), formation: String(l.formation ?? "") } },
    el("td", null, mono(l.id)),
    el("td", { className: "formation" }, mono(l.formation)),
    el("td", { className: "tool" }, el("span", { className: "mono" }, text(l.tool))),
    el("td", null, text(l.session)),
    el("td", null, text(ep.release), " ", el("span", { className: "muted" }, `(${text(l.target?.pool ?? ep.pool)})`), el("div", null, mono(ep.id))),
    el("td", null, when(l.admittedAt)),
    el("td", null, l.claim ? [mono(l.claim.id), el("div", { className: "muted" }, text(l.claim.at))] : "none"),
    el("td", null, el("code", null, cmd)));
}

// ---- start ----------------------------------------------------------------------

$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const secret = $("credential").value.trim();
  if (!secret) {
    showSignin(new ApiError(0, { title: "Paste your approver or operator credential first" }));
    return;
  }
  signIn(secret);
});
$("signout").addEventListener("click", () => signOut());
$("refresh").addEventListener("click", () => refresh());
$("uncertain-refresh").addEventListener("click", () => refresh());

const stored = sessionStorage.getItem(CREDENTIAL_KEY);
if (stored) signIn(stored);
else showSignin();
