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
	// the outcome of a call ("effect", "rejected" or "uncertain"). It must
	// be set before the first write; the middleware removes it from the
	// response.
	OutcomeHeader = "Fcd-Outcome"
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
// through. Report must not block: it is called on the request's goroutine
// (or the timeout's timer). [*Reporter] implements it.
type OutcomeReporter interface {
	Report(jti string, outcome Outcome, detail string) bool
}

// MiddlewareOptions configure [Verifier.Middleware]. The zero value is
// usable, but Server is needed whenever tool names are not already
// "server/tool".
type MiddlewareOptions struct {
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
// 413 beyond) and handed to next unchanged. A body that is not JSON, or an
// object with two members whose names differ only in case, is answered
// 400: another parser could read a tools/call in it that this one does not
// see. A method named tools/call in any letter case counts as tools/call.
// So does a request whose Mcp-Method header says tools/call; a body that
// disagrees with the Mcp-Method or Mcp-Name header is answered 400. A
// batch that holds a tools/call is refused whole (403, reason batch).
//
// After a verified call the outcome is reported to opts.Reporter, once:
// the outcome the handler declared in [OutcomeHeader]; else uncertain for
// a status of 500 or above, effect below. A handler that panics is
// reported uncertain and the panic continues up the stack (net/http then
// drops the connection); one that exceeds opts.Timeout is reported
// uncertain. Refused tokens are never reported: see the package README.
func (v *Verifier) Middleware(next http.Handler, opts MiddlewareOptions) http.Handler {
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
	opts MiddlewareOptions
	log  *slog.Logger
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every request with a body is classified, whatever its method: a
	// lenient server might run a JSON-RPC body that came with PUT.
	if r.ContentLength == 0 && !headerSaysCall(r) {
		m.next.ServeHTTP(w, r)
		return
	}
	if r.ContentLength > m.opts.MaxBodyBytes {
		writeRPCError(w, http.StatusRequestEntityTooLarge, nil, errorCodeInvalidRequest, "request body too large", "")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.opts.MaxBodyBytes))
	r.Body.Close()
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeRPCError(w, http.StatusRequestEntityTooLarge, nil, errorCodeInvalidRequest, "request body too large", "")
			return
		}
		writeRPCError(w, http.StatusBadRequest, nil, errorCodeInvalidRequest, "request body could not be read", "")
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
		claims, rerr = m.v.verify(r.Context(), tokens[0], tool, msg.Arguments)
	default:
		rerr = reject(ReasonMalformed, "%d %s headers", len(tokens), Header)
	}
	if rerr != nil {
		m.refuse(w, r, msg.ID, tool, rerr)
		return
	}
	m.serveCall(w, r, claims, tool, msg.ID)
}

// refuse answers a refused call. Refusals are never reported to authzd:
// the verifier cannot tell whether the same token runs, or ran, on
// another instance, and a forged token must cost authzd nothing.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, id json.RawMessage, tool string, rerr *RejectError) {
	m.log.Warn("fencecheck: request refused", "reason", rerr.Reason, "detail", rerr.Detail,
		"tool", tool, "remote", r.RemoteAddr)
	switch rerr.Reason {
	case ReasonParse:
		writeRPCError(w, http.StatusBadRequest, id, errorCodeParse, "parse error", rerr.Reason)
	case ReasonInvalidRequest:
		writeRPCError(w, http.StatusBadRequest, id, errorCodeInvalidRequest, "invalid request", rerr.Reason)
	case ReasonEncoding, ReasonDuplicateMember, ReasonMemberCase, ReasonNameCollision, ReasonHeaders, ReasonBatch:
		writeRPCError(w, http.StatusForbidden, id, ErrorCodeRejected, "fcd: request refused: "+string(rerr.Reason), rerr.Reason)
	default:
		writeRPCError(w, http.StatusForbidden, id, ErrorCodeRejected,
			"fcd: dispatch token rejected: "+string(rerr.Reason), rerr.Reason)
	}
}

// serveCall runs a verified call and reports its outcome exactly once.
func (m *middleware) serveCall(w http.ResponseWriter, r *http.Request, claims *Claims, tool string, id json.RawMessage) {
	var reported atomic.Bool
	report := func(o Outcome, detail string) {
		if !reported.CompareAndSwap(false, true) {
			return
		}
		m.log.Info("fencecheck: call outcome", "jti", claims.ID, "tool", tool, "outcome", o, "detail", detail)
		if m.opts.Reporter != nil {
			m.opts.Reporter.Report(claims.ID, o, detail)
		}
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), claimsKey{}, claims))
	defer cancel()
	if m.opts.Timeout > 0 {
		timer := time.AfterFunc(m.opts.Timeout, func() {
			report(OutcomeUncertain, "handler exceeded "+m.opts.Timeout.String())
			cancel()
		})
		defer timer.Stop()
	}
	ow := &outcomeWriter{ResponseWriter: w, id: id}
	defer func() {
		if p := recover(); p != nil {
			// A reverse proxy (the fencecheck sidecar) aborts with
			// http.ErrAbortHandler when relaying fails, typically because
			// an SSE client closed the stream as soon as it had its answer.
			// If the backend's JSON-RPC answer to this call already went
			// through, the call ran: report what it answered. Otherwise the
			// outcome is unknown.
			switch {
			case p == http.ErrAbortHandler && ow.answered == answeredResult && ow.status < 500:
				report(OutcomeEffect, "answered, then the relay was aborted")
			case p == http.ErrAbortHandler && ow.answered == answeredError && ow.status < 500:
				report(OutcomeRejected, "answered with a JSON-RPC error, then the relay was aborted")
			default:
				report(OutcomeUncertain, "handler panicked")
			}
			panic(p)
		}
	}()
	m.next.ServeHTTP(ow, r.WithContext(ctx))

	status := ow.status
	if status == 0 {
		status = http.StatusOK // nothing written: net/http answers 200
	}
	switch {
	case ow.declared != "":
		report(ow.declared, "declared by the handler, status "+strconv.Itoa(status))
	case status >= 500:
		report(OutcomeUncertain, "handler answered "+strconv.Itoa(status))
	default:
		report(OutcomeEffect, "handler answered "+strconv.Itoa(status))
	}
}

// outcomeWriter records the final status and the declared outcome,
// strips OutcomeHeader from the response, and notices when the JSON-RPC
// answer to the call (its id with a result or an error) is written.
type outcomeWriter struct {
	http.ResponseWriter
	status   int
	declared Outcome
	// id is the call's JSON-RPC id; answered says whether its answer was
	// written; tail keeps the end of the last write so that an answer split
	// across writes is still seen.
	id       json.RawMessage
	answered answer
	tail     []byte
}

type answer int

const (
	answeredNone answer = iota
	answeredResult
	answeredError
)

// maxAnswerScan bounds how much of a streamed response is scanned for the
// answer: the answer to a call comes early in its stream.
const maxAnswerScan = 1 << 20

// scan looks for the JSON-RPC answer to the call in b. It matches the
// member "id":<id> and a "result" or "error" member in the same window;
// inside JSON strings quotes are escaped, so tool output cannot fake it.
func (w *outcomeWriter) scan(b []byte) {
	if w.answered != answeredNone || len(w.id) == 0 || len(w.tail) >= maxAnswerScan {
		return
	}
	window := append(w.tail, b...)
	for _, pat := range [][]byte{append([]byte(`"id":`), w.id...), append([]byte(`"id": `), w.id...)} {
		if bytes.Contains(window, pat) {
			switch {
			case bytes.Contains(window, []byte(`"result":`)) || bytes.Contains(window, []byte(`"result": `)):
				w.answered = answeredResult
			case bytes.Contains(window, []byte(`"error":`)) || bytes.Contains(window, []byte(`"error": `)):
				w.answered = answeredError
			}
			if w.answered != answeredNone {
				return
			}
		}
	}
	// Keep the whole unanswered stream so far (bounded), so that members of
	// one message split across writes are seen together.
	w.tail = window
}

func (w *outcomeWriter) WriteHeader(code int) {
	if w.status == 0 {
		h := w.Header()
		if vals := h.Values(OutcomeHeader); len(vals) > 0 {
			h.Del(OutcomeHeader)
			if code >= 200 {
				switch o := Outcome(strings.TrimSpace(vals[0])); o {
				case OutcomeEffect, OutcomeRejected, OutcomeUncertain:
					w.declared = o
				}
			}
		}
		if code >= 200 { // 1xx responses precede the final one
			w.status = code
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *outcomeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.scan(b)
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
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string, reason Reason) {
	type rpcErrData struct {
		Reason Reason `json:"reason"`
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
		body.Error.Data = &rpcErrData{Reason: reason}
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
