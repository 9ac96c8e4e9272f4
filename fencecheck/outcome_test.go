package fencecheck_test

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
)

// callWithID is a tools/call of tool with args under the JSON-RPC id id
// (as written).
func callWithID(id, tool, args string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
}

// answerJSON answers status with one JSON body.
func answerJSON(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// answerSSE answers an event stream, written in chunks of size bytes
// (0: in one write), each flushed: the scanner must find the answer
// however the stream is cut.
func answerSSE(stream string, size int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if size <= 0 {
			size = len(stream)
		}
		for i := 0; i < len(stream); i += size {
			_, _ = io.WriteString(w, stream[i:min(i+size, len(stream))])
			_ = http.NewResponseController(w).Flush()
		}
	}
}

// Event streams of a call with id 7: notifications and a request from the
// server (which has an id too, but a method) before the answer.
const (
	sseBefore = ": connected\n\n" +
		"event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":7,\"progress\":1}}\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"sampling/createMessage\",\"params\":{}}\n\n" +
		"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"working\"}}\n\n"
	resultData  = `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}]}}`
	toolErrData = `{"jsonrpc":"2.0","id":7,"result":{"isError":true,"content":[{"type":"text","text":"quota exceeded"}]}}`
	rpcErrData  = `{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"unknown tool"}}`
)

// sseAnswer is sseBefore, then an event carrying data, with line ending
// eol throughout.
func sseAnswer(data, eol string) string {
	return strings.ReplaceAll(sseBefore+"event: message\ndata: "+data+"\n\n", "\n", eol)
}

// declaring is answer with the handler's declaration of its outcome
// (fencecheck.OutcomeHeader) set first.
func declaring(outcome string, answer http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(fencecheck.OutcomeHeader, outcome)
		answer(w, r)
	}
}

// TestMiddlewareOutcomeFromEvidence: the outcome reported for a verified
// call is what the backend's answer shows (the table of the README), and
// it is reported under the lease and the claim the call was admitted
// under. Online mode: each call is claimed in a real HTTP stand-in for
// authzd's claim endpoint through the real LeaseClient, and the outcome
// reaches it through the real Reporter.
func TestMiddlewareOutcomeFromEvidence(t *testing.T) {
	const args = `{"name":"payroll-exports"}`
	cases := []struct {
		note    string
		id      string // the call's JSON-RPC id; "" is 7
		handler http.HandlerFunc
		status  int // the client's status; 0: not checked (the connection may break)
		want    fencecheck.Outcome
		header  bool // the response must not carry Fcd-Outcome
	}{
		// A JSON answer.
		{note: "result", handler: answerJSON(200, resultData), status: 200, want: fencecheck.OutcomeEffect},
		{note: "result with isError", handler: answerJSON(200, toolErrData), status: 200, want: fencecheck.OutcomeFailed},
		{note: "result with isError false", status: 200, want: fencecheck.OutcomeEffect,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":7,"result":{"isError":false,"content":[]}}`)},
		{note: "JSON-RPC error", handler: answerJSON(200, rpcErrData), status: 200, want: fencecheck.OutcomeRejected},
		{note: "result with status 500", handler: answerJSON(500, resultData), status: 500, want: fencecheck.OutcomeEffect},
		{note: "answer in a batch", status: 200, want: fencecheck.OutcomeFailed,
			handler: answerJSON(200, `[{"jsonrpc":"2.0","id":6,"result":{}},`+toolErrData+`]`)},
		{note: "answer after JSON whitespace", handler: answerJSON(200, "\r\n\t "+resultData+"\n"), status: 200, want: fencecheck.OutcomeEffect},

		// No answer: the status decides.
		{note: "404 session not found before any handler", status: 404, want: fencecheck.OutcomeRejected,
			handler: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "session not found", http.StatusNotFound) }},
		{note: "400 bad request", status: 400, want: fencecheck.OutcomeRejected,
			handler: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "Bad Request: missing session id", 400) }},
		{note: "406 not acceptable", status: 406, want: fencecheck.OutcomeRejected,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotAcceptable) }},
		{note: "200 with nothing written", status: 200, want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) {}},
		{note: "200 with text, no answer", status: 200, want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }},
		{note: "202 accepted, no answer", status: 202, want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }},
		{note: "500", status: 500, want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "database down", 500) }},
		{note: "502 from a proxy", status: 502, want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) }},
		{note: "answer to another id", status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":8,"result":{}}`)},
		{note: "JSON answer over the scan bound", status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"`+strings.Repeat("x", 1<<20)+`"}]}}`)},
		{note: "answer with a duplicate member is no answer", status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":7,"result":{},"result":{"isError":true}}`)},

		// Ids: the same value, however spelled; a string is not a number.
		{note: "id 1 answered 1.0", id: "1", status: 200, want: fencecheck.OutcomeEffect,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":1.0,"result":{}}`)},
		{note: "id 1.0 answered 1e0", id: "1.0", status: 200, want: fencecheck.OutcomeEffect,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":1e0,"result":{}}`)},
		{note: "string id answered the same string", id: `"req-7"`, status: 200, want: fencecheck.OutcomeEffect,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":"req\u002d7","result":{}}`)},
		{note: "string id answered as a number", id: `"7"`, status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerJSON(200, resultData)},
		{note: "numeric id answered as a string", id: `7`, status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":"7","result":{}}`)},

		// Tool output is data, never an answer.
		{note: "answer quoted in another answer's text", status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","text":"\"id\":7,\"result\":{}"}]}}`)},
		{note: "isError quoted in the answer's text", status: 200, want: fencecheck.OutcomeEffect,
			handler: answerJSON(200, `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"{\"isError\":true,\"error\":{}}"}]}}`)},
		{note: "answer quoted in a notification, stream ends", status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerSSE("data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":\"{\\\"jsonrpc\\\":\\\"2.0\\\",\\\"id\\\":7,\\\"result\\\":{}}\"}}\n\n", 3)},
		{note: "answer-like text in an SSE comment", status: 200, want: fencecheck.OutcomeUncertain,
			handler: answerSSE(": {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n", 0)},

		// Event streams, cut anywhere.
		{note: "SSE result, one write", handler: answerSSE(sseAnswer(resultData, "\n"), 0), status: 200, want: fencecheck.OutcomeEffect},
		{note: "SSE result, byte by byte, CRLF", handler: answerSSE(sseAnswer(resultData, "\r\n"), 1), status: 200, want: fencecheck.OutcomeEffect},
		{note: "SSE result, 5-byte writes, CRLF", handler: answerSSE(sseAnswer(resultData, "\r\n"), 5), status: 200, want: fencecheck.OutcomeEffect},
		{note: "SSE result, 64-byte writes, CR", handler: answerSSE(sseAnswer(resultData, "\r"), 64), status: 200, want: fencecheck.OutcomeEffect},
		{note: "SSE result, CR endings, the stream ends with the event", status: 200, want: fencecheck.OutcomeEffect,
			handler: answerSSE("data: "+resultData+"\r\r", 0)},
		{note: "SSE isError, 7-byte writes, CRLF", handler: answerSSE(sseAnswer(toolErrData, "\r\n"), 7), status: 200, want: fencecheck.OutcomeFailed},
		{note: "SSE JSON-RPC error, 3-byte writes", handler: answerSSE(sseAnswer(rpcErrData, "\n"), 3), status: 200, want: fencecheck.OutcomeRejected},
		{note: "SSE answer split over data lines", status: 200, want: fencecheck.OutcomeEffect,
			handler: answerSSE(sseBefore+"data: {\"jsonrpc\":\"2.0\",\r\ndata:\"id\":7,\r\ndata: \"result\":{}}\r\n\r\n", 2)},
		{note: "SSE answer split mid-line across writes", status: 200, want: fencecheck.OutcomeEffect,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for _, part := range []string{sseBefore, "data: {\"jsonrpc\":\"2.0\",\"id\"", ":7,\"resu", "lt\":{}}\r", "\n\r", "\n"} {
					_, _ = io.WriteString(w, part)
					w.(http.Flusher).Flush()
				}
			}},
		{note: "SSE notifications only", handler: answerSSE(sseBefore, 4), status: 200, want: fencecheck.OutcomeUncertain},
		{note: "SSE answer without the closing blank line", handler: answerSSE(sseBefore+"data: "+resultData+"\n", 0), status: 200,
			want: fencecheck.OutcomeUncertain},
		{note: "SSE answer to another id", handler: answerSSE(sseAnswer(`{"jsonrpc":"2.0","id":70,"result":{}}`, "\n"), 0), status: 200,
			want: fencecheck.OutcomeUncertain},

		// Panics.
		{note: "handler panics before answering", want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) { panic("backend bug") }},
		{note: "handler panics after a flushed answer", want: fencecheck.OutcomeUncertain,
			handler: func(w http.ResponseWriter, r *http.Request) {
				answerSSE(sseAnswer(resultData, "\n"), 0)(w, r)
				panic("backend bug")
			}},

		// The handler's declaration wins, and never reaches the client.
		{note: "declared effect on a 500", status: 500, want: fencecheck.OutcomeEffect, header: true,
			handler: declaring("effect", func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "the effect happened, the answer failed", 500)
			})},
		{note: "declared rejected on a result", status: 200, want: fencecheck.OutcomeRejected, header: true,
			handler: declaring("rejected", answerJSON(200, toolErrData))},
		{note: "declared failed on a result", status: 200, want: fencecheck.OutcomeFailed, header: true,
			handler: declaring("failed", answerJSON(200, resultData))},
		{note: "declared uncertain on a JSON-RPC error", status: 200, want: fencecheck.OutcomeUncertain, header: true,
			handler: declaring(" uncertain ", answerJSON(200, rpcErrData))},
		{note: "declared on an event stream", status: 200, want: fencecheck.OutcomeFailed, header: true,
			handler: declaring("failed", answerSSE(sseAnswer(resultData, "\n"), 9))},
		{note: "declared rejected, nothing written", status: 200, want: fencecheck.OutcomeRejected, header: true,
			handler: declaring("rejected", func(http.ResponseWriter, *http.Request) {})},
		{note: "an unknown declaration is ignored", status: 200, want: fencecheck.OutcomeEffect, header: true,
			handler: declaring("done", answerJSON(200, resultData))},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			b := newBackend(t, backendConfig{online: true, call: tc.handler})
			id := tc.id
			if id == "" {
				id = "7"
			}
			tok, claims := b.token(t, "create_repository", args)
			res, err := do(t, "POST", b.url, callWithID(id, "create_repository", args), tok)
			if tc.status != 0 {
				if err != nil {
					t.Fatal(err)
				}
				if res.status != tc.status {
					t.Fatalf("status = %d (%.200s), want %d", res.status, res.body, tc.status)
				}
				if tc.header && res.header.Get(fencecheck.OutcomeHeader) != "" {
					t.Fatalf("%s reached the client: %q", fencecheck.OutcomeHeader, res.header.Get(fencecheck.OutcomeHeader))
				}
			}
			if n := b.calls.Load(); n != 1 {
				t.Fatalf("handler ran %d calls, want 1", n)
			}
			claim := b.authzd.claimOf(claims.ID)
			if claim == "" {
				t.Fatalf("lease %s was not claimed in authzd", claims.ID)
			}
			if c := b.claims.Load(); c == nil || c.ClaimID != claim {
				t.Fatalf("the handler's claims %+v, want ClaimID %s", c, claim)
			}
			got := b.drained(t)
			if len(got) != 1 || got[0].Lease != claims.ID || got[0].Claim != claim || got[0].Outcome != tc.want {
				t.Fatalf("authzd received %+v, want one %s for lease %s under claim %s", got, tc.want, claims.ID, claim)
			}
			if f := got[0].Failure; f != nil && tc.want != fencecheck.OutcomeFailed && tc.want != fencecheck.OutcomeRejected {
				t.Fatalf("a %s outcome reported failure %+v", tc.want, f)
			}
		})
	}
}

// TestMiddlewareReportsTheFailure: a tool error or a JSON-RPC error is
// reported with what it says — the error's code, the error name it states
// (data.error, structuredContent.error) and its message or first text,
// cut to MaxFailureMessage bytes — for authzd to match against the tool's
// failure modes; a result reports none.
func TestMiddlewareReportsTheFailure(t *testing.T) {
	const args = `{"name":"payroll-exports"}`
	long := strings.Repeat("é", 200) // 400 bytes
	for _, tc := range []struct {
		note   string
		answer string
		want   fencecheck.Outcome
		fail   *fencecheck.Failure
	}{
		{"tool error with a stated name", `{"jsonrpc":"2.0","id":7,"result":{"isError":true,"structuredContent":{"error":"rate_limited"},"content":[{"type":"image","data":"x"},{"type":"text","text":"rate_limited: slow down"}]}}`,
			fencecheck.OutcomeFailed, &fencecheck.Failure{Error: "rate_limited", Message: "rate_limited: slow down"}},
		{"tool error, text only", toolErrData, fencecheck.OutcomeFailed, &fencecheck.Failure{Message: "quota exceeded"}},
		{"JSON-RPC error with data.error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"the name is taken","data":{"error":"name_taken"}}}`,
			fencecheck.OutcomeRejected, &fencecheck.Failure{Code: -32000, Error: "name_taken", Message: "the name is taken"}},
		{"JSON-RPC error, a non-string data.error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"unknown tool","data":{"error":7}}}`,
			fencecheck.OutcomeRejected, &fencecheck.Failure{Code: -32602, Message: "unknown tool"}},
		{"a long message is cut on a rune", `{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"` + long + `"}}`,
			fencecheck.OutcomeRejected, &fencecheck.Failure{Code: 1, Message: strings.Repeat("é", fencecheck.MaxFailureMessage/2)}},
		{"a result", resultData, fencecheck.OutcomeEffect, nil},
	} {
		t.Run(tc.note, func(t *testing.T) {
			b := newBackend(t, backendConfig{online: true, call: answerJSON(200, tc.answer)})
			tok, claims := b.token(t, "create_repository", args)
			if _, err := do(t, "POST", b.url, callWithID("7", "create_repository", args), tok); err != nil {
				t.Fatal(err)
			}
			got := b.drained(t)
			if len(got) != 1 || got[0].Lease != claims.ID || got[0].Outcome != tc.want {
				t.Fatalf("authzd received %+v, want one %s", got, tc.want)
			}
			if !reflect.DeepEqual(got[0].Failure, tc.fail) {
				t.Fatalf("failure %+v, want %+v", got[0].Failure, tc.fail)
			}
		})
	}
}

// TestMiddlewarePassesTheRecoveryOn: the handler of a recovery's call sees
// the chain's first formation as the RecoveryHeader and in its claims; a
// RecoveryHeader a client sent never reaches it, on a first call or on a
// request that is no call at all.
func TestMiddlewarePassesTheRecoveryOn(t *testing.T) {
	const args = `{"name":"payroll-exports"}`
	var seen atomic.Value
	handler := func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(fencecheck.RecoveryHeader))
		answerJSON(200, resultData)(w, r)
	}
	for _, tc := range []struct {
		note       string
		recoveryOf string
	}{{"a recovery", "fm_first"}, {"a first call", ""}} {
		t.Run(tc.note, func(t *testing.T) {
			b := newBackend(t, backendConfig{online: true, call: handler})
			c := claimsFor(t, "github/create_repository", args)
			now := time.Now()
			c.IssuedAt, c.NotBefore, c.Expiry, c.Admitted = now.Unix(), now.Unix(), now.Unix()+30, now.UnixMilli()
			c.RecoveryOf = tc.recoveryOf
			req, _ := http.NewRequest("POST", b.url, strings.NewReader(callWithID("7", "create_repository", args)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set(fencecheck.Header, b.key.Issue(c))
			req.Header.Set(fencecheck.RecoveryHeader, "fm_forged")
			if res, err := doRequest(req); err != nil || res.status != 200 {
				t.Fatalf("call: %+v %v", res, err)
			}
			if got := seen.Load(); got != tc.recoveryOf {
				t.Fatalf("the handler saw %s %q, want %q", fencecheck.RecoveryHeader, got, tc.recoveryOf)
			}
			if cl := b.claims.Load(); cl == nil || cl.RecoveryOf != tc.recoveryOf {
				t.Fatalf("the handler's claims %+v", cl)
			}
		})
	}
}

// TestRefusalNamesTheFormation: a refusal of a genuine token (here, other
// arguments than it was issued for) names its formation in data.formation,
// so the host knows which call to look at; one of a token whose signature
// does not verify names none — nothing unverified is repeated back.
func TestRefusalNamesTheFormation(t *testing.T) {
	const args = `{"name":"payroll-exports"}`
	b := newBackend(t, backendConfig{online: true})
	tok, claims := b.token(t, "create_repository", args)
	res, err := do(t, "POST", b.url, callWithID("7", "create_repository", `{"name":"other"}`), tok)
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, res, fencecheck.ReasonArguments)
	var body struct {
		Error struct {
			Data struct {
				Formation string `json:"formation"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(res.body, &body); err != nil || body.Error.Data.Formation != claims.Formation || claims.Formation == "" {
		t.Fatalf("a refused genuine call: %s (formation %q)", res.body, claims.Formation)
	}
	forged := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1").Issue(claims)
	if res, err = do(t, "POST", b.url, callWithID("8", "create_repository", args), forged); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, res, fencecheck.ReasonSignature)
	if strings.Contains(string(res.body), "formation") {
		t.Fatalf("a forged token's refusal repeats its formation: %s", res.body)
	}
}
