// fcdFetch: a fetch for the official MCP TypeScript SDK's
// StreamableHTTPClientTransport (its `fetch` option) that forms each
// tools/call with authzd and sends it with its formation — what
// github.com/fcd-authz/fcd/host does for the Go SDK. docs/hosts.md
// explains it; internal/e2e/hostjs_test.go runs it.
//
//   const transport = new StreamableHTTPClientTransport(new URL(gatewayURL), {
//     fetch: fcdFetch({ authzdURL, credential, snapshot, server: "github",
//                       principal: { id: "alice" }, waitForApproval: true }),
//   });
//
// A POST whose body is one tools/call is formed (POST /v1/formations: the
// snapshot, `server/name`, the arguments, the principal, and the request's
// Mcp-Session-Id as the session), then sent with Fcd-Formation and
// Mcp-Method: tools/call once it is ready. Every other request — initialize,
// notifications, tools/list, the GET stream, DELETE — is sent untouched.
// The call's promise (client.callTool) rejects with an FcdError whose
// `kind` says why: "pending" (not waiting; `formation` and `approvalURL`
// say what to approve where), "denied" (`reasons`), "expired", "problem"
// (authzd refused to form it: `problem`, `status`, `retryAfter`),
// "refused" (the gateway or the fence refused the call: `problem`, `fence`,
// `retryAfter`), "unknown-tool", "batched-call".

export class FcdError extends Error {
  constructor(kind, message, fields = {}) {
    super(message);
    this.name = "FcdError";
    this.kind = kind;
    Object.assign(this, fields);
  }
}

const retryAfterMs = (headers) => {
  const s = Number.parseInt(headers.get("retry-after") ?? "", 10);
  return Number.isFinite(s) && s >= 0 ? s * 1000 : 0;
};

const reasonsOf = (f) => {
  const reasons = [];
  for (const e of f.decision?.engines ?? []) {
    for (const r of e.reasons ?? []) if (!reasons.includes(r)) reasons.push(r);
  }
  for (const a of f.approvals ?? []) {
    if (a.decision === "deny") reasons.push(`denied by ${a.approver}${a.reason ? ": " + a.reason : ""}`);
  }
  return reasons;
};

/**
 * @param {object} o
 * @param {string} o.authzdURL     authzd's base URL
 * @param {string} o.credential    the host's bearer credential (never logged)
 * @param {string} o.snapshot      the snapshot the model was shown (POST /v1/snapshots)
 * @param {string} [o.server]      the registered server behind this endpoint; a call of
 *                                 tool "x" is formed as "server/x" (required unless the
 *                                 MCP tool names are already "server/tool")
 * @param {{id?: string, attributes?: object}} [o.principal] who calls are formed for
 * @param {boolean} [o.waitForApproval] wait until approvers decide (else reject "pending")
 * @param {(pending: FcdError) => void} [o.onPending] called once per waiting call
 * @param {number} [o.pollMs]      how often a waiting call reads its formation (1000)
 * @param {number} [o.maxWaitMs]   give up waiting after this long (15 minutes, a formation's life)
 * @param {string} [o.session]     the session of a request without Mcp-Session-Id
 * @param {typeof fetch} [o.fetch] the fetch to send with (globalThis.fetch)
 */
export function fcdFetch(o) {
  const base = o.fetch ?? globalThis.fetch;
  const authzd = o.authzdURL.replace(/\/+$/, "");
  const session = o.session ?? `host-${crypto.randomUUID()}`;
  const pollMs = o.pollMs ?? 1000;
  const maxWaitMs = o.maxWaitMs ?? 15 * 60 * 1000;

  const api = async (method, path, body) => {
    const res = await base(authzd + path, {
      method,
      headers: { authorization: `Bearer ${o.credential}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = await res.json().catch(() => ({}));
    // A denied formation is answered 403 with the formation itself.
    if (res.ok || (res.status === 403 && json.status === "denied")) return json;
    throw new FcdError("problem", `authzd refused (${res.status} ${res.headers.get("fcd-problem")}): ${json.detail ?? json.title ?? ""}`,
      { status: res.status, problem: res.headers.get("fcd-problem"), retryAfter: retryAfterMs(res.headers), violations: json.violations });
  };

  const pendingError = (f) => new FcdError("pending",
    `the call of ${f.tool} waits for approval (formation ${f.id}); approvers decide at ${authzd}/ui/`,
    { formation: f.id, digest: f.digest, approvalsRequired: f.approvalsRequired, approvalURL: `${authzd}/ui/` });

  // The snapshot's tools, read once (a snapshot never changes).
  let tools;
  const snapshotTools = () => (tools ??= api("GET", `/v1/snapshots/${o.snapshot}`)
    .then((s) => new Set(s.tools.map((t) => t.name)))
    .catch((e) => { tools = undefined; throw e; }));

  const form = async (call, mcpSession) => {
    const tool = o.server ? `${o.server}/${call.name}` : call.name;
    if (!(await snapshotTools()).has(tool)) {
      throw new FcdError("unknown-tool", `${tool} is not in snapshot ${o.snapshot}`, { tool });
    }
    let f = await api("POST", "/v1/formations", {
      snapshot: o.snapshot, session: mcpSession ?? session, tool, arguments: call.arguments ?? {},
      ...(o.principal ? { principal: o.principal } : {}),
    });
    if (f.status === "pending_approval") {
      if (!o.waitForApproval) throw pendingError(f);
      o.onPending?.(pendingError(f));
      const deadline = Date.now() + maxWaitMs;
      while (f.status === "pending_approval") {
        if (Date.now() > deadline) throw new FcdError("expired", `gave up waiting for the approval of formation ${f.id}`, { formation: f.id });
        let wait = pollMs;
        try {
          f = await api("GET", `/v1/formations/${f.id}`);
        } catch (e) {
          if (!(e instanceof FcdError) || !e.retryAfter) throw e;
          wait = Math.max(wait, e.retryAfter);
        }
        if (f.status === "pending_approval") await new Promise((r) => setTimeout(r, wait));
      }
    }
    if (f.status === "denied") {
      const reasons = reasonsOf(f);
      throw new FcdError("denied", `the call of ${tool} is denied (formation ${f.id}): ${reasons.join("; ")}`, { formation: f.id, reasons });
    }
    if (f.status === "expired") throw new FcdError("expired", `formation ${f.id} expired unapproved`, { formation: f.id });
    if (f.status !== "ready") throw new FcdError("problem", `formation ${f.id} is ${f.status}, not ready to send`, { formation: f.id });
    return f;
  };

  return async function fetchWithFormation(input, init = {}) {
    if ((init.method ?? "GET").toUpperCase() !== "POST" || typeof init.body !== "string") return base(input, init);
    let msg;
    try {
      msg = JSON.parse(init.body);
    } catch {
      return base(input, init);
    }
    if (Array.isArray(msg)) {
      if (msg.some((m) => m?.method === "tools/call")) {
        throw new FcdError("batched-call", "a tools/call inside a JSON-RPC batch cannot carry a formation; send each call on its own");
      }
      return base(input, init);
    }
    if (msg?.method !== "tools/call") return base(input, init);
    const headers = new Headers(init.headers);
    const f = await form(msg.params ?? {}, headers.get("mcp-session-id") ?? undefined);
    headers.set("fcd-formation", f.id);
    headers.set("mcp-method", "tools/call");
    // The body is sent as the SDK wrote it: the fence runs only the call formed.
    const res = await base(input, { ...init, headers });
    const problem = res.headers.get("fcd-problem");
    if (res.status >= 400 && problem) {
      const body = await res.json().catch(() => ({}));
      const fence = body.error !== undefined;
      throw new FcdError("refused", `${fence ? "the backend's fence" : "the gateway"} refused the call of formation ${f.id} (${res.status} ${problem})`,
        { formation: f.id, status: res.status, problem, fence, retryAfter: retryAfterMs(res.headers),
          detail: fence ? body.error.message : (body.detail ?? body.title) });
    }
    return res;
  };
}
