package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// TestGRPCListen starts authzd with --grpc-listen and asks its Envoy
// ext_authz service with a real gRPC client (Envoy itself is not available
// on this machine), then checks that the server still stops cleanly.
func TestGRPCListen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	_, log, stop := startServerLog(t, dir, "--dev", "--grpc-listen", "127.0.0.1:0")
	defer stop()
	m := regexp.MustCompile(`authzd: ext_authz gRPC on (\S+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no gRPC address printed:\n%s", log)
	}
	addr := m[1]
	raw, err := os.ReadFile(filepath.Join(dir, "dev-credentials.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dc devCredentials
	if err := json.Unmarshal(raw, &dc); err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	check := func(secret, mcpMethod string) *authv3.CheckResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if secret != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+secret)
		}
		resp, err := client.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/mcp", Headers: map[string]string{"mcp-method": mcpMethod}},
		}}})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		return resp
	}
	gw := string(dc.Credentials["gateway"])
	if got := check(gw, "tools/list"); codes.Code(got.GetStatus().GetCode()) != codes.OK || got.GetOkResponse() == nil {
		t.Fatalf("session traffic: %v", got)
	}
	if got := check(gw, "tools/call"); codes.Code(got.GetStatus().GetCode()) != codes.PermissionDenied ||
		got.GetDeniedResponse().GetStatus().GetCode() != 403 {
		t.Fatalf("tools/call without a formation: %v", got)
	}
	if got := check("", "tools/list"); codes.Code(got.GetStatus().GetCode()) != codes.Unauthenticated ||
		got.GetDeniedResponse().GetStatus().GetCode() != 401 {
		t.Fatalf("no credential: %v", got)
	}
}

func TestGRPCListenConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "authzd.yaml")
	if err := os.WriteFile(file, []byte("grpcListen: 127.0.0.1:9001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--config", file}, "127.0.0.1:9001"},
		{[]string{"--config", file, "--grpc-listen", ":9002"}, ":9002"},
	} {
		c, err := parseServeFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if c.GRPCListen != tc.want {
			t.Errorf("%v: grpcListen %q, want %q", tc.args, c.GRPCListen, tc.want)
		}
	}
}
