package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/fencecheck"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// checkClient returns a real gRPC client of the fixture server's Envoy
// ext_authz service (api.NewCheckServer on its GRPCListen listener, over
// the use cases its HTTP handler serves).
//
// Envoy itself is not available on this machine, so the client stands in
// for it: it sends the CheckRequests Envoy's ext_authz filter sends (the
// original request's method, path, lower-cased headers and, with
// with_request_body, its body), with the gateway credential in the
// "authorization" metadata as grpc_service.initial_metadata would.
func (f *fixture) checkClient() authv3.AuthorizationClient {
	f.t.Helper()
	conn, err := grpc.NewClient(f.server.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn)
}

// checkRequest is an Envoy CheckRequest for an MCP request.
func checkRequest(method string, headers map[string]string, body []byte, raw bool) *authv3.CheckRequest {
	h := &authv3.AttributeContext_HttpRequest{Method: method, Path: "/mcp", Host: "mcp.example", Scheme: "http", Protocol: "HTTP/1.1",
		Headers: map[string]string{":method": method, ":path": "/mcp", "content-type": "application/json"}}
	for k, v := range headers {
		h.Headers[strings.ToLower(k)] = v
	}
	if raw {
		h.RawBody = body
	} else {
		h.Body = string(body)
	}
	h.Size = int64(len(body))
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: h}}}
}

func (f *fixture) check(c authv3.AuthorizationClient, secret api.Secret, req *authv3.CheckRequest) *authv3.CheckResponse {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if secret != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+string(secret))
	}
	resp, err := c.Check(ctx, req)
	if err != nil {
		f.t.Fatalf("Check answered a gRPC error, not a CheckResponse: %v", err)
	}
	return resp
}

// okHeaders checks an OK answer and returns the headers to set upstream.
func (f *fixture) okHeaders(resp *authv3.CheckResponse) map[string]*corev3.HeaderValueOption {
	f.t.Helper()
	if codes.Code(resp.GetStatus().GetCode()) != codes.OK || resp.GetOkResponse() == nil {
		f.t.Fatalf("want OK, got %v", resp)
	}
	out := map[string]*corev3.HeaderValueOption{}
	for _, h := range resp.GetOkResponse().GetHeaders() {
		out[h.GetHeader().GetKey()] = h
	}
	return out
}

// deniedCheck checks a refusal and returns its problem body.
func (f *fixture) deniedCheck(resp *authv3.CheckResponse, code codes.Code, status int, slug string) map[string]any {
	f.t.Helper()
	d := resp.GetDeniedResponse()
	if codes.Code(resp.GetStatus().GetCode()) != code || d == nil || int(d.GetStatus().GetCode()) != status {
		f.t.Fatalf("want %v with HTTP %d, got %v", code, status, resp)
	}
	hs := map[string]string{}
	for _, h := range d.GetHeaders() {
		hs[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			f.t.Fatalf("denied header %s would be appended", h.GetHeader().GetKey())
		}
	}
	if hs["fcd-problem"] != slug || hs["content-type"] != "application/problem+json" {
		f.t.Fatalf("denied headers %v, want fcd-problem %s", hs, slug)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(d.GetBody()), &p); err != nil {
		f.t.Fatalf("denied body %q: %v", d.GetBody(), err)
	}
	if p["type"] != api.ProblemBase+slug || p["status"] != float64(status) {
		f.t.Fatalf("denied body %v", p)
	}
	if id, _ := p["formation"].(string); id != hs["fcd-formation"] {
		f.t.Fatalf("formation %q in body, %q in header", id, hs["fcd-formation"])
	}
	return p
}

func TestCheckGRPC(t *testing.T) {
	f, snap := newReadyFixture(t)
	client := f.checkClient()
	gwc := f.creds[api.RoleGateway]
	const readArgs = `{"owner":"octo","repo":"demo"}`

	// OK with the formation in a header: the token and pool are set
	// upstream, replacing any the client sent.
	read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", readArgs, ""))
	id := read.Body["id"].(string)
	ok := f.okHeaders(f.check(client, gwc, checkRequest("POST", map[string]string{"Fcd-Formation": id, "fcd-dispatch-token": "forged"},
		toolsCall("get_repository", readArgs, ""), false)))
	tok, target := ok[strings.ToLower(fencecheck.Header)], ok[strings.ToLower(fencecheck.TargetHeader)]
	if tok == nil || target == nil || target.GetHeader().GetValue() != "github-v1-4" {
		t.Fatalf("OK headers %v", ok)
	}
	if tok.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
		t.Fatal("the token header would be appended to a client's")
	}
	if c := f.verifyToken(tok.GetHeader().GetValue(), "github/get_repository", readArgs); c.Formation != id {
		t.Fatalf("claims %+v", c)
	}

	// One step from the raw body (pack_as_bytes), with the formation
	// reached through the same use cases as the HTTP API.
	one := f.okHeaders(f.check(client, gwc, checkRequest("POST", map[string]string{"Fcd-Snapshot": snap, "Fcd-Session": "g1", "Fcd-Server": "github"},
		toolsCall("get_repository", `{"owner":"o","repo":"r"}`, ""), true)))
	c := f.verifyToken(one["fcd-dispatch-token"].GetHeader().GetValue(), "github/get_repository", `{"owner":"o","repo":"r"}`)
	f.expect(f.do("GET", "/v1/formations/"+c.Formation, api.RoleHost, nil), http.StatusOK, "")

	// Session traffic: OK, no token, and any the client sent is removed.
	pass := f.check(client, gwc, checkRequest("POST", nil, []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`), false))
	if len(f.okHeaders(pass)) != 0 || strings.Join(pass.GetOkResponse().GetHeadersToRemove(), ",") != "fcd-dispatch-token,fcd-target" {
		t.Fatalf("session traffic: %v", pass)
	}
	f.okHeaders(f.check(client, gwc, checkRequest("GET", map[string]string{"accept": "text/event-stream"}, nil, false)))

	// PermissionDenied with the HTTP answer of the cause.
	f.deniedCheck(f.check(client, gwc, checkRequest("POST", map[string]string{"mcp-method": "tools/call"}, nil, false)),
		codes.PermissionDenied, http.StatusForbidden, "formation-required")
	w := f.deniedCheck(f.check(client, gwc, checkRequest("POST", map[string]string{"Fcd-Snapshot": snap, "Fcd-Session": "g2", "Fcd-Server": "github", "Fcd-Principal": "alice"},
		toolsCall("create_repository", `{"name":"x"}`, ""), false)), codes.PermissionDenied, http.StatusForbidden, "not-approved")
	wid, _ := w["formation"].(string)
	if !strings.HasPrefix(wid, "fm_") {
		t.Fatalf("pending one-step call without its formation: %v", w)
	}
	// Approved over REST, retried by id in _meta: OK.
	pending := f.do("GET", "/v1/formations/"+wid, api.RoleApprover, nil)
	f.expect(f.do("POST", "/v1/formations/"+wid+"/approvals", api.RoleApprover, approvalBody("approve", pending.Body["digest"].(string))), http.StatusOK, "")
	retried := f.okHeaders(f.check(client, gwc, checkRequest("POST", nil, toolsCall("create_repository", `{"name":"x"}`, wid), false)))
	f.verifyToken(retried["fcd-dispatch-token"].GetHeader().GetValue(), "github/create_repository", `{"name":"x"}`)
	f.deniedCheck(f.check(client, gwc, checkRequest("POST", nil, []byte(`{"method":"tools/list","Method":"tools/call"}`), false)),
		codes.PermissionDenied, http.StatusBadRequest, "malformed-mcp")

	// Raw headers (encode_raw_headers): repeated headers stay apart, and
	// two formation ids are refused.
	rawReq := checkRequest("POST", nil, nil, false)
	rawReq.Attributes.Request.Http.Headers = nil
	rawReq.Attributes.Request.Http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: "fcd-formation", RawValue: []byte(id)}, {Key: "fcd-formation", RawValue: []byte(wid)},
	}}
	f.deniedCheck(f.check(client, gwc, rawReq), codes.PermissionDenied, http.StatusBadRequest, "invalid-parameter")
	rawReq.Attributes.Request.Http.HeaderMap.Headers = rawReq.Attributes.Request.Http.HeaderMap.Headers[:1]
	f.okHeaders(f.check(client, gwc, rawReq))

	// Credentials: Unauthenticated (401) without a valid one,
	// PermissionDenied (403) with another role.
	req := checkRequest("POST", map[string]string{"Fcd-Formation": id}, nil, false)
	f.deniedCheck(f.check(client, "", req), codes.Unauthenticated, http.StatusUnauthorized, "unauthenticated")
	f.deniedCheck(f.check(client, "fcd_gateway_forged", req), codes.Unauthenticated, http.StatusUnauthorized, "unauthenticated")
	f.deniedCheck(f.check(client, f.creds[api.RoleHost], req), codes.PermissionDenied, http.StatusForbidden, "forbidden-role")

	// The network (L4) filter's CheckRequest has no HTTP request: refused.
	f.deniedCheck(f.check(client, gwc, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{}}),
		codes.PermissionDenied, http.StatusBadRequest, "invalid-request")

	// A body over the limit.
	big := checkRequest("POST", nil, append(toolsCall("get_repository", readArgs, ""), make([]byte, api.DefaultBodyLimit)...), true)
	f.deniedCheck(f.check(client, gwc, big), codes.PermissionDenied, http.StatusRequestEntityTooLarge, "body-too-large")

	// A draining source: the status of ext_authz (409), with Retry-After.
	r2 := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s3", "github/get_repository", readArgs, ""))
	f.expect(f.do("POST", "/v1/epochs/"+read.Body["source"].(map[string]any)["epoch"].(string)+"/drain", api.RoleOperator, nil), http.StatusOK, "")
	dr := f.check(client, gwc, checkRequest("POST", map[string]string{"Fcd-Formation": r2.Body["id"].(string)}, nil, false))
	f.deniedCheck(dr, codes.PermissionDenied, http.StatusConflict, "source-draining")
	var retryAfter string
	for _, h := range dr.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retryAfter = h.GetHeader().GetValue()
		}
	}
	if retryAfter != "5" {
		t.Fatalf("source-draining without retry-after: %v", dr)
	}
}
