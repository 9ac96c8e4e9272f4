package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
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

// TestServeTLS: with --tls-cert and --tls-key authzd serves HTTPS (HTTP/2
// negotiated) and the gRPC service over TLS; a plain-HTTP request, a
// client that does not trust the certificate and a plaintext gRPC client
// get nothing; --dev writes the https URL.
func TestServeTLS(t *testing.T) {
	tmp := t.TempDir()
	certs := etcdtest.WriteCerts(t, tmp)
	pem, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	dir := filepath.Join(tmp, "data")
	url, log, stop := startServerLog(t, dir, "--dev", "--tls-cert", certs.ServerCert, "--tls-key", certs.ServerKey, "--grpc-listen", "127.0.0.1:0")
	defer stop()
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("listening on %s, want https", url)
	}

	trusting := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true,
	}}
	resp, err := trusting.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.ProtoMajor != 2 {
		t.Fatalf("healthz over TLS: %d, TLS %v, HTTP/%d", resp.StatusCode, resp.TLS != nil, resp.ProtoMajor)
	}
	if _, err := (&http.Client{Timeout: 30 * time.Second}).Get(url + "/healthz"); err == nil {
		t.Fatal("a client that does not trust the certificate got an answer")
	}
	plain, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + strings.TrimPrefix(url, "https://") + "/healthz")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was answered 200 on the TLS listener")
		}
	}
	env, err := os.ReadFile(filepath.Join(dir, devEnvFile))
	if err != nil || !strings.Contains(string(env), "export FCD_URL="+url+"\n") {
		t.Fatalf("dev env file: %v\n%s", err, env)
	}

	m := regexp.MustCompile(`authzd: ext_authz gRPC on (\S+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no gRPC address printed:\n%s", log)
	}
	ask := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{})
		return err
	}
	if err := ask(credentials.NewTLS(&tls.Config{RootCAs: pool})); err != nil {
		t.Fatalf("gRPC over TLS: %v", err)
	}
	if err := ask(insecure.NewCredentials()); err == nil {
		t.Fatal("a plaintext gRPC client was answered")
	}
}

func TestServeTLSNeedsBoth(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--dev", "--data-dir", t.TempDir(), "--tls-cert", "x.crt"}, nil, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "tlsCert and tlsKey go together") {
		t.Fatalf("--tls-cert without --tls-key: exit %d %s", code, errb.String())
	}
}

// TestServeExternalEtcdOverTLS: authzd on an external etcd member that
// serves TLS and requires client certificates: with --etcd-ca,
// --etcd-cert and --etcd-key it is ready; with the CA alone the member
// refuses it and /readyz answers 503 (fail closed).
func TestServeExternalEtcdOverTLS(t *testing.T) {
	m, files := etcdtest.StartTLS(t)
	for _, tc := range []struct {
		name   string
		flags  []string
		status int
	}{
		{"client certificate", []string{"--etcd-ca", files.CA, "--etcd-cert", files.ClientCert, "--etcd-key", files.ClientKey}, http.StatusOK},
		{"CA only", []string{"--etcd-ca", files.CA}, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--dev", "--etcd-endpoints", m.Endpoints()[0]}, tc.flags...)
			url, stop := startServer(t, filepath.Join(t.TempDir(), "data"), args...)
			defer stop()
			readyz(t, url, tc.status)
		})
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--dev", "--data-dir", t.TempDir(), "--etcd-ca", files.CA}, nil, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), "external cluster") {
		t.Fatalf("--etcd-ca without --etcd-endpoints: exit %d %s", code, errb.String())
	}
}

// TestServeUnreachableEtcd: serve with an external etcd that refuses
// connections starts, says at startup which endpoints it uses, and logs
// each failed store operation with the endpoints and the network's reason
// — not a bare "context deadline exceeded" — while it keeps retrying
// (the signing-key publisher tries again until etcd answers).
func TestServeUnreachableEtcd(t *testing.T) {
	const endpoint = "http://127.0.0.1:1"
	failure := regexp.MustCompile(`(?m)^.*msg="etcd operation failed".*$`)
	c, _, err := cmdtest.Start(t, "authzd", regexp.MustCompile(`(msg="etcd operation failed".*connection refused)`),
		func(ctx context.Context, stderr io.Writer) int {
			return run(ctx, []string{"serve", "--dev", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
				"--etcd-endpoints", endpoint}, nil, io.Discard, stderr)
		})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.Stderr.String())
	}
	defer c.Stop(t)
	// Keeps retrying: wait for a second failure.
	testutil.EventuallyState(t, time.Minute, "a second failure logged", func() bool { return len(failure.FindAllString(c.Stderr.String(), -1)) >= 2 },
		func() string { return "log:\n" + c.Stderr.String() })
	log := c.Stderr.String()
	if !strings.Contains(log, `msg="external etcd" endpoints=[`+endpoint+`]`) {
		t.Errorf("startup does not name the etcd endpoints:\n%s", log)
	}
	for _, line := range failure.FindAllString(log, -1) {
		for _, want := range []string{"endpoints=[" + endpoint + "]", `reason="`, endpoint + ": connection refused"} {
			if !strings.Contains(line, want) {
				t.Errorf("failure line without %q: %s", want, line)
			}
		}
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasSuffix(line, `err="context deadline exceeded"`) && !strings.Contains(line, "reason=") {
			t.Errorf("a bare deadline, without endpoint or reason: %s", line)
		}
	}
}
