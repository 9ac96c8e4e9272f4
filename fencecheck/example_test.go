package fencecheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
)

// exampleIssuer stands in for authzd: an Ed25519 key that signs
// dispatch tokens as authzd does, and the JWKS of its public half.
type exampleIssuer struct {
	key  *fencechecktest.Key
	jwks []byte
}

func newExampleIssuer() *exampleIssuer {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-2026-11")
	return &exampleIssuer{key: key, jwks: fencechecktest.JWKS(key)}
}

// issue signs a token for one call of tool with arguments, admitted now.
func (is *exampleIssuer) issue(jti, tool, arguments string) string {
	digest, _ := fencecheck.ArgumentDigest(tool, json.RawMessage(arguments))
	now := time.Now()
	return is.key.Issue(fencecheck.Claims{
		Issuer: "https://authzd.example", Audience: "github-prod", Subject: "session-1", ID: jti,
		IssuedAt: now.Unix(), NotBefore: now.Unix(), Expiry: now.Unix() + 30,
		Formation: "f-1", Tool: tool, ArgumentDigest: digest, Epoch: "sha256:e1",
		Artifact: "sha256:a1", Config: "sha256:c1", Generation: 3, Revision: 1042, Cluster: "cdf818194e3a8c32",
		Admitted: now.UnixMilli(),
	})
}

// processStart stands for when the backend's process started. An offline
// verifier (no Claimer) refuses the tokens of leases admitted before it;
// here the process started a minute before the examples' admissions.
var processStart = time.Now().Add(-time.Minute)

func ExampleVerifier_Verify() {
	authzd := newExampleIssuer()

	// The backend's verifier: what it runs, and whom it trusts. Here a
	// static key set, read from a JWKS document (a file authzd keys new
	// wrote, say). In production set JWKSURL to authzd's
	// /.well-known/jwks.json instead, and Claimer to a
	// *fencecheck.LeaseClient so that each lease is claimed in authzd
	// before the effect (online mode). Without a Claimer (offline mode)
	// the replay memory of this process is the only check.
	keys, err := fencecheck.ParseJWKS(authzd.jwks)
	if err != nil {
		panic(err)
	}
	v := &fencecheck.Verifier{
		Pool: "github-prod", Artifact: "sha256:a1", Config: "sha256:c1", Generation: 3,
		Issuer: "https://authzd.example", Keys: keys, Started: processStart,
	}
	if err := v.Validate(); err != nil {
		panic(err)
	}
	token := authzd.issue("lease-1", "github/create_repository", `{"name":"demo","private":true}`)
	ctx := context.Background()

	// The call arrives with one argument changed: refused, and the jti is
	// not consumed.
	_, err = v.Verify(ctx, token, "github/create_repository", json.RawMessage(`{"name":"demo","private":false}`))
	var re *fencecheck.RejectError
	if errors.As(err, &re) {
		fmt.Println("changed call:", re.Reason)
	}

	// The call as formed (key order does not matter).
	claims, err := v.Verify(ctx, token, "github/create_repository", json.RawMessage(`{"private":true,"name":"demo"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println("accepted:", claims.Tool, claims.ID)

	// The same token again.
	_, err = v.Verify(ctx, token, "github/create_repository", json.RawMessage(`{"name":"demo","private":true}`))
	fmt.Println("second use:", fencecheck.ReasonOf(err))
	// Output:
	// changed call: arguments
	// accepted: github/create_repository lease-1
	// second use: replay
}

// printReporter prints outcomes; a backend uses a *fencecheck.Reporter
// posting them to authzd.
type printReporter struct{}

func (printReporter) Report(r fencecheck.OutcomeReport) bool {
	fmt.Println("outcome:", r.Lease, r.Outcome)
	return true
}

func ExampleVerifier_Middleware() {
	authzd := newExampleIssuer()
	v := &fencecheck.Verifier{
		Pool: "github-prod", Artifact: "sha256:a1", Config: "sha256:c1", Generation: 3,
		Keys: fencechecktest.Keys(authzd.key), Started: processStart,
	}
	// The MCP server's own streamable-HTTP handler. Its JSON-RPC answer is
	// the evidence of the outcome: a result is an effect.
	mcp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := fencecheck.ClaimsFromContext(r.Context()); ok {
			fmt.Println("handler runs", c.Tool)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	guarded := v.Middleware(mcp, fencecheck.MiddlewareConfig{
		Server:   "github", // tools/call of "create_repository" is github/create_repository
		Reporter: printReporter{},
		Timeout:  30 * time.Second,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})

	post := func(body, token string) {
		req := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
		if token != "" {
			req.Header.Set(fencecheck.Header, token)
		}
		rec := httptest.NewRecorder()
		guarded.ServeHTTP(rec, req)
		fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":{"name":"demo"}}}`
	post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "")
	post(call, "")
	post(call, authzd.issue("lease-7", "github/create_repository", `{"name":"demo"}`))
	// Output:
	// 200 {"jsonrpc":"2.0","id":1,"result":{}}
	// 403 {"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"fcd: dispatch token rejected: missing","data":{"reason":"missing","type":"https://github.com/fcd-authz/fcd/blob/main/fencecheck/README.md#reason-missing"}}}
	// handler runs github/create_repository
	// outcome: lease-7 effect
	// 200 {"jsonrpc":"2.0","id":1,"result":{}}
}
