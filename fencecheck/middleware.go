package fencecheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const (
	// ErrorCodeRejected is the JSON-RPC error code of a tools/call refused
	// by the middleware (HTTP 403). It lies in the range JSON-RPC 2.0
	// leaves to implementations (-32000 to -32099); error.data.reason
	// carries the [Reason].
	ErrorCodeRejected = -32001
	// OutcomeHeader is the response header by which a handler declares
	// the outcome of a call ("effect", "failed", "rejected" or
	// "uncertain"), overriding what its answer shows. It must be set
	// before the first write (or with nothing written); the middleware
	// removes it from the response.
	OutcomeHeader = "Fcd-Outcome"
	// ProblemHeader names a refusal's reason on the HTTP answer, as
	// authzd's Fcd-Problem names its problem types (reasons are spelled
	// with underscores, authzd's types with hyphens).
	ProblemHeader = "Fcd-Problem"
	// ProblemBase prefixes a refusal's problem type (the JSON-RPC error's
	// data.type): the reason's entry in fencecheck's README.
	ProblemBase = "https://github.com/fcd-authz/fcd/blob/main/fencecheck/README.md#reason-"
	// RecoveryHeader carries a verified recovery's [Claims.RecoveryOf] to
	// the handler: the middleware sets it on the request it passes on (so
	// `fencecheck proxy` sends it upstream) and removes any a client sent.
	RecoveryHeader = "Fcd-Recovery-Of"
	// DefaultMaxBodyBytes bounds a request body when MaxBodyBytes is zero.
	DefaultMaxBodyBytes = 1 << 20
)

// Standard JSON-RPC 2.0 error codes the middleware answers with HTTP 400
// and 413 for bodies it cannot classify.
const (
	errorCodeParse          = -32700
	errorCodeInvalidRequest = -32600
)

// OutcomeReporter receives the outcome of every call the middleware let
// through, and the releases of leases whose calls it refused. Report must
// not block: it is called on the request's goroutine (or the timeout's
// timer). [*Reporter] implements it.
type OutcomeReporter interface {
	Report(r OutcomeReport) bool
}

// MiddlewareConfig configure [Verifier.Middleware]. The zero value is
// usable, but Server is needed whenever tool names are not already
// "server/tool".
type MiddlewareConfig struct {
	// Server is this MCP server's name in fcd; the middleware verifies a
	// call of params.name N as the tool "Server/N". Empty verifies N as
	// given, which fits only a server whose tool names already contain
	// the server name.
	Server string
	// MaxBodyBytes bounds request bodies, which the middleware must read
	// to find tools/call; a larger body is answered 413. Zero means
	// [DefaultMaxBodyBytes].
	MaxBodyBytes int64
	// Timeout, if positive, bounds a verified call. When it passes, the
	// handler's context is cancelled and the outcome is reported as
	// uncertain at once; the handler is not interrupted otherwise, and
	// whatever it does later is not reported. Zero means no bound.
	Timeout time.Duration
	// Reporter receives the outcome of each verified call; nil reports
	// nothing (authzd then holds the lease until it is resolved).
	Reporter OutcomeReporter
	// Logger receives refusals and outcomes; nil means slog.Default().
	Logger *slog.Logger
}

type claimsKey struct{}

// ClaimsFromContext returns the verified claims of the call a handler
// behind [Verifier.Middleware] is serving.
func ClaimsFromContext(ctx context.Context) (*Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(*Claims)
	return c, ok
}

// Middleware guards an MCP streamable-HTTP handler: every JSON-RPC
// tools/call must carry a dispatch token in the [Header] request header
// that [Verifier.Verify] accepts for the tool "Server/params.name" and
// params.arguments; otherwise the middleware answers HTTP 403 with a
// JSON-RPC error (code [ErrorCodeRejected], data.reason) and next never
// runs. Other traffic — initialize, tools/list, notifications, responses,
// GET streams, DELETE — passes untouched.
//
// Request bodies, whatever the method, are read (bounded by MaxBodyBytes,
// 413 beyond), checked by [ReadMessage], and handed to next byte for byte:
// what the backend parses is what was verified. A body that is not JSON
// or not a request is answered 400; one that could be read two ways
// (duplicate members, a protected name only under case folding, argument
// names folding alike, invalid UTF-8 or lone surrogates, a batch holding a
// tools/call) or whose Mcp-Method or Mcp-Name header disagrees with it is
// answered 403 with its reason; so is a request whose Mcp-Method header
// says tools/call in any letter case while its body is not exactly that
// call.
//
// After a verified call the outcome is reported to opts.Reporter, once,
// under the lease and the claim (Claims.ClaimID): the outcome the handler
// declared in [OutcomeHeader]; else what its answer to the call's id
// shows — a result is effect, a result with isError failed, a JSON-RPC
// error rejected; with no answer a 4xx is rejected, anything else
// uncertain. A handler that panics before answering is reported uncertain
// and the panic continues up the stack (net/http then drops the
// connection); one that exceeds opts.Timeout is reported uncertain. In
// online mode (a Claimer is set) a genuine token whose call is refused
// before the effect — its body, tool or arguments — releases its lease:
// outcome rejected with no claim. See the package README.
func (v *Verifier) Middleware(next http.Handler, opts MiddlewareConfig) http.Handler {
	m := &middleware{v: v, next: next, opts: opts, log: opts.Logger}
	if m.opts.MaxBodyBytes <= 0 {
		m.opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	return m
}

type middleware struct {
	v    *Verifier
	next http.Handler
	opts MiddlewareConfig
	log  *slog.Logger
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.v.Tracer != nil {
		// The reports and the claim trace with the verifier's tracer.
		r = r.WithContext(withTracer(r.Context(), m.v.Tracer))
	}
	// Only a verified token says a call is a recovery.
	r.Header.Del(RecoveryHeader)
	// Every request with a body is classified, whatever its method: a
	// lenient server might run a JSON-RPC body that came with PUT.
	if r.ContentLength == 0 && !headerSaysCall(r) {
		m.next.ServeHTTP(w, r)
		return
	}
	if r.ContentLength > m.opts.MaxBodyBytes {
		writeRPCError(w, http.StatusRequestEntityTooLarge, nil, errorCodeInvalidRequest, "request body too large", "", "")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.opts.MaxBodyBytes))
	r.Body.Close()
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeRPCError(w, http.StatusRequestEntityTooLarge, nil, errorCodeInvalidRequest, "request body too large", "", "")
			return
		}
		writeRPCError(w, http.StatusBadRequest, nil, errorCodeInvalidRequest, "request body could not be read", "", "")
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }

	msg, rerr := readMessage(body)
	if rerr == nil {
		rerr = checkMCPHeaders(r, msg)
	}
	if rerr != nil {
		m.refuse(w, r, nil, "", rerr)
		if tokens := r.Header.Values(Header); len(tokens) == 1 {
			m.release(r, tokens[0], rerr)
		}
		return
	}
	if !msg.Call {
		m.next.ServeHTTP(w, r)
		return
	}

	tool := msg.Name
	if m.opts.Server != "" {
		tool = m.opts.Server + "/" + msg.Name
	}
	var claims *Claims
	switch tokens := r.Header.Values(Header); len(tokens) {
	case 0:
		rerr = reject(ReasonMissing, "no %s header", Header)
	case 1:
		claims, rerr = m.v.verify(r.Context(), tokens[0], tool, msg.Arguments, true)
	default:
		rerr = reject(ReasonMalformed, "%d %s headers", len(tokens), Header)
	}
	if rerr != nil {
		m.refuse(w, r, msg.ID, tool, rerr)
		if rerr.Reason == ReasonTool || rerr.Reason == ReasonArguments {
			m.release(r, r.Header.Get(Header), rerr)
		}
		return
	}
	m.serveCall(w, r, claims, tool, msg.ID)
}

// refuse answers a refused request.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, id json.RawMessage, tool string, rerr *RejectError) {
	m.log.WarnContext(r.Context(), "fencecheck: request refused", "reason", rerr.Reason, "detail", rerr.Detail,
		"tool", tool, "remote", r.RemoteAddr)
	switch rerr.Reason {
	case ReasonParse:
		writeRPCError(w, http.StatusBadRequest, id, errorCodeParse, "parse error", rerr.Reason, rerr.Formation)
	case ReasonInvalidRequest:
		writeRPCError(w, http.StatusBadRequest, id, errorCodeInvalidRequest, "invalid request", rerr.Reason, rerr.Formation)
	case ReasonEncoding, ReasonDuplicateMember, ReasonMemberCase, ReasonNameCollision, ReasonHeaders, ReasonBatch:
		writeRPCError(w, http.StatusForbidden, id, ErrorCodeRejected, "fcd: request refused: "+string(rerr.Reason), rerr.Reason, rerr.Formation)
	default:
		writeRPCError(w, http.StatusForbidden, id, ErrorCodeRejected,
			"fcd: dispatch token rejected: "+string(rerr.Reason), rerr.Reason, rerr.Formation)
	}
}

// release gives up the lease of a genuine token whose call the fence
// refused before any effect (its body could be read two ways, or its tool
// or arguments are not the ones the token is for), so that the epoch is
// not held back until the sweep. Only in online mode: authzd closes the
// lease only while no call has claimed it, and once it is closed no claim
// can succeed — so the release is safe even when the same token is
// presented intact elsewhere at the same moment (one of the two wins). A
// token that is not genuine for this backend costs authzd nothing.
func (m *middleware) release(r *http.Request, token string, rerr *RejectError) {
	if m.v.Claimer == nil || m.opts.Reporter == nil || token == "" {
		return
	}
	c, terr := m.v.verifyToken(r.Context(), token)
	if terr != nil {
		return
	}
	m.opts.Reporter.Report(OutcomeReport{Lease: c.ID, Outcome: OutcomeRejected, Admission: c.Admission(),
		Detail: "refused by the fence before the effect: " + string(rerr.Reason), ctx: r.Context()})
}

// serveCall runs a verified call and reports its outcome exactly once,
// from the evidence of the backend's answer.
func (m *middleware) serveCall(w http.ResponseWriter, r *http.Request, claims *Claims, tool string, id json.RawMessage) {
	var reported atomic.Bool
	report := func(o Outcome, detail string, failure *Failure) {
		if !reported.CompareAndSwap(false, true) {
			return
		}
		m.log.InfoContext(r.Context(), "fencecheck: call outcome", "jti", claims.ID, "tool", tool, "outcome", o, "detail", detail)
		if m.opts.Reporter != nil {
			m.opts.Reporter.Report(OutcomeReport{Lease: claims.ID, Claim: claims.ClaimID, Outcome: o, Detail: detail,
				Admission: claims.Admission(), Failure: failure, ctx: r.Context()})
		}
	}
	if claims.RecoveryOf != "" {
		r.Header.Set(RecoveryHeader, claims.RecoveryOf)
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), claimsKey{}, claims))
	defer cancel()
	if m.opts.Timeout > 0 {
		timer := time.AfterFunc(m.opts.Timeout, func() {
			report(OutcomeUncertain, "handler exceeded "+m.opts.Timeout.String(), nil)
			cancel()
		})
		defer timer.Stop()
	}
	ow := &outcomeWriter{ResponseWriter: w, scan: answerScanner{id: id}}
	defer func() {
		if p := recover(); p != nil {
			// A reverse proxy (the fencecheck sidecar) aborts with
			// http.ErrAbortHandler when relaying fails, typically because
			// an SSE client closed the stream as soon as it had its answer.
			// If the backend's JSON-RPC answer to this call already went
			// through, report what it answered; otherwise the call may
			// have run: uncertain.
			if p == http.ErrAbortHandler && ow.scan.got != answeredNone {
				o, d := classify(ow, "; then the relay was aborted")
				report(o, d, ow.scan.failureFor(o))
			} else {
				report(OutcomeUncertain, "handler panicked before answering the call", nil)
			}
			panic(p)
		}
	}()
	m.next.ServeHTTP(ow, r.WithContext(ctx))
	if ow.status == 0 {
		// Nothing written: net/http answers 200 with the headers the
		// handler set, so read (and strip) its declared outcome now.
		ow.WriteHeader(http.StatusOK)
	}
	ow.scan.finish()
	o, d := classify(ow, "")
	report(o, d, ow.scan.failureFor(o))
}

// classify is the outcome table of the package README: what the handler
// declared; else what its answer shows.
func classify(ow *outcomeWriter, suffix string) (Outcome, string) {
	status := ow.status
	if status == 0 {
		status = http.StatusOK // nothing written: net/http answers 200
	}
	st := strconv.Itoa(status)
	switch {
	case ow.declared != "":
		return ow.declared, "declared by the handler, status " + st + suffix
	case ow.scan.got == answeredResult:
		return OutcomeEffect, "answered a result, status " + st + suffix
	case ow.scan.got == answeredToolError:
		return OutcomeFailed, "answered a result with isError, status " + st + suffix
	case ow.scan.got == answeredError:
		return OutcomeRejected, "answered a JSON-RPC error, status " + st + suffix
	case status >= 400 && status < 500:
		// A transport answer given before any handler ran: unknown
		// session, bad request, wrong content type.
		return OutcomeRejected, "answered " + st + " without an answer to the call" + suffix
	}
	return OutcomeUncertain, "answered " + st + " without an answer to the call" + suffix
}

// outcomeWriter records the final status and the declared outcome,
// strips OutcomeHeader from the response, and passes the body to the
// answer scanner.
type outcomeWriter struct {
	http.ResponseWriter
	status   int
	declared Outcome
	scan     answerScanner
}

func (w *outcomeWriter) WriteHeader(code int) {
	if w.status == 0 {
		h := w.Header()
		if vals := h.Values(OutcomeHeader); len(vals) > 0 {
			h.Del(OutcomeHeader)
			if code >= 200 {
				switch o := Outcome(strings.TrimSpace(vals[0])); o {
				case OutcomeEffect, OutcomeFailed, OutcomeRejected, OutcomeUncertain:
					w.declared = o
				}
			}
		}
		if code >= 200 { // 1xx responses precede the final one
			w.status = code
			w.scan.start(h.Get("Content-Type"))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *outcomeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.scan.write(b)
	return w.ResponseWriter.Write(b)
}

// Flush supports streamed (SSE) responses.
func (w *outcomeWriter) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *outcomeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeRPCError answers a JSON-RPC error object.
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string, reason Reason, formation string) {
	type rpcErrData struct {
		Reason Reason `json:"reason"`
		// Type is the refusal's problem type (a URL of the reasons'
		// documentation), RetryAfter the seconds after which a retry may
		// pass, for the transient reasons only.
		Type       string `json:"type"`
		Formation  string `json:"formation,omitempty"`
		RetryAfter int    `json:"retryAfter,omitempty"`
	}
	type rpcErr struct {
		Code    int         `json:"code"`
		Message string      `json:"message"`
		Data    *rpcErrData `json:"data,omitempty"`
	}
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	body := struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcErr          `json:"error"`
	}{"2.0", id, rpcErr{Code: code, Message: msg}}
	if reason != "" {
		body.Error.Data = &rpcErrData{Reason: reason, Type: ProblemBase + string(reason), Formation: formation, RetryAfter: reason.retryAfter()}
		// The reason in a header too, as authzd's Fcd-Problem: a client
		// whose SDK shows only "HTTP 403" still reads it.
		w.Header().Set(ProblemHeader, string(reason))
		if s := reason.retryAfter(); s > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(s))
		}
	}
	data, err := json.Marshal(body)
	if err != nil { // an id that is not valid JSON cannot come from classify
		data = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// Headers by which MCP clients from protocol 2026-07-28 on name the method
// and tool of a request, so that gateways need not read the body.
const (
	mcpMethodHeader = "Mcp-Method"
	mcpNameHeader   = "Mcp-Name"
)

// headerSaysCall reports whether the request's Mcp-Method header names
// tools/call, in any letter case: such a request is treated as a call
// (and needs a token) whatever its body says.
func headerSaysCall(r *http.Request) bool {
	for _, m := range r.Header.Values(mcpMethodHeader) {
		if FoldName(strings.TrimSpace(m)) == foldedCalls {
			return true
		}
	}
	return false
}

// checkMCPHeaders refuses a request whose Mcp-Method or Mcp-Name header
// disagrees with its body: a server that dispatches on the headers must
// not run a call the middleware did not verify. Values must equal the
// body's method and tool name exactly.
func checkMCPHeaders(r *http.Request, msg Message) *RejectError {
	if headerSaysCall(r) && !msg.Call {
		return reject(ReasonHeaders, "the Mcp-Method header says tools/call, the body does not")
	}
	if msg.Method != "" {
		for _, h := range r.Header.Values(mcpMethodHeader) {
			if strings.TrimSpace(h) != msg.Method {
				return reject(ReasonHeaders, "the Mcp-Method header does not match the body")
			}
		}
	}
	if msg.Call {
		for _, n := range r.Header.Values(mcpNameHeader) {
			if strings.TrimSpace(n) != msg.Name {
				return reject(ReasonHeaders, "the Mcp-Name header does not match the body")
			}
		}
	}
	return nil
}
