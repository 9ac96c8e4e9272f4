package lease_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestEmbeddedMemberAcceptsOnlyItsCredential: the embedded member serves
// its clients and its peers mutual TLS with the credential it generated in
// its directory (the directory 0700, every credential file 0600). A store
// opened with EmbeddedAccess works; a local client without that
// credential can neither read nor write — plain http on the recorded
// port, TLS without a client certificate, TLS with a certificate of
// another CA — and the peer port refuses the client credential and every
// client without one.
func TestEmbeddedMemberAcceptsOnlyItsCredential(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	m, err := lease.StartEmbedded(context.Background(), lease.EmbedConfig{Dir: dir, LogFile: filepath.Join(t.TempDir(), "etcd.log"),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	acc, err := lease.EmbeddedAccess(dir)
	if err != nil {
		t.Fatal(err)
	}
	if acc.TLS == nil || len(acc.Endpoints) != 1 || acc.Endpoints[0] != m.Endpoints()[0] || acc.CertFile != m.Access().CertFile {
		t.Fatalf("access %+v, member %+v", acc, m.Access())
	}
	assertMode(t, dir, 0o700)
	assertMode(t, filepath.Join(dir, lease.TLSDir), 0o700)
	entries, err := os.ReadDir(filepath.Join(dir, lease.TLSDir))
	if err != nil || len(entries) != 5 {
		t.Fatalf("credential files %v (%v)", entries, err)
	}
	for _, e := range entries {
		assertMode(t, filepath.Join(dir, lease.TLSDir, e.Name()), 0o600)
		if strings.HasPrefix(e.Name(), "ca.") && e.Name() != "ca.crt" {
			t.Errorf("a CA file besides its certificate: %s", e.Name())
		}
	}

	s, err := lease.Open(context.Background(), lease.Config{Endpoints: acc.Endpoints, TLS: acc.TLS, Prefix: "/own/", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("authzd's own credential: %v", err)
	}
	put(t, acc, "/fcd/states/f1", "approved")

	hostPort := strings.TrimPrefix(acc.Endpoints[0], "https://")
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(acc.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA %s: %v", acc.CAFile, err)
	}
	other := etcdtest.WriteCerts(t, t.TempDir()) // a CA of its own, and a client certificate it signed
	otherCert, err := tls.LoadX509KeyPair(other.ClientCert, other.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	intruders := []struct {
		name     string
		endpoint string
		tls      *tls.Config
	}{
		{"plain http on the recorded port", "http://" + hostPort, nil},
		{"TLS, trusting the member, no client certificate", acc.Endpoints[0], &tls.Config{RootCAs: pool}},
		{"TLS, no verification, no client certificate", acc.Endpoints[0], &tls.Config{InsecureSkipVerify: true}},
		{"TLS, a client certificate of another CA", acc.Endpoints[0], &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{otherCert}}},
	}
	for _, tc := range intruders {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{tc.endpoint}, TLS: tc.tls, DialTimeout: time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, perr := cli.Put(ctx, "/fcd/states/f1", "forged")
			_, gerr := cli.Get(ctx, "/fcd/states/f1")
			for op, err := range map[string]error{"put": perr, "get": gerr} {
				if !refused(err) {
					t.Errorf("%s: %v, want the connection refused", op, err)
				}
			}
		})
	}
	if v := get(t, acc, "/fcd/states/f1"); v != "approved" {
		t.Fatalf("after the intruders the state is %q", v)
	}

	// The peer listener speaks raft over HTTP: only the member's own
	// certificate gets an answer there.
	raw, err := os.ReadFile(filepath.Join(dir, lease.EndpointsFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ PeerURL string }
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	peer, err := url.Parse(rec.PeerURL)
	if err != nil || peer.Scheme != "https" {
		t.Fatalf("peer URL %q (%v)", rec.PeerURL, err)
	}
	clientCert, err := tls.LoadX509KeyPair(acc.CertFile, acc.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	memberCert, err := tls.LoadX509KeyPair(filepath.Join(dir, lease.TLSDir, "member.crt"), filepath.Join(dir, lease.TLSDir, "member.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		url  string
		tls  *tls.Config
		ok   bool
	}{
		{"the member's certificate", "https://" + peer.Host + "/members", &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{memberCert}}, true},
		{"the client credential", "https://" + peer.Host + "/members", &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}}, false},
		{"no certificate", "https://" + peer.Host + "/members", &tls.Config{RootCAs: pool}, false},
		{"plain http", "http://" + peer.Host + "/members", nil, false},
	} {
		t.Run("peer, "+tc.name, func(t *testing.T) {
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc.tls}}
			defer hc.CloseIdleConnections()
			resp, err := hc.Get(tc.url)
			if err == nil {
				resp.Body.Close()
			}
			switch {
			case tc.ok && (err != nil || resp.StatusCode != http.StatusOK):
				t.Fatalf("GET %s: %v %v", tc.url, resp, err)
			case !tc.ok && err == nil && resp.StatusCode == http.StatusOK:
				t.Fatalf("GET %s answered %s", tc.url, resp.Status)
			}
		})
	}
}

// TestEmbeddedMemberUpgradesAnOpenDirectory: a data directory of the
// earlier layout — a member on plain http, its URLs recorded, no
// credentials, the directory 0755 — starts on the same ports, now mutual
// TLS: the data is there, the recorded URLs are https and name the
// credential, the membership advertises the https peer URL, the directory
// is 0700, the move is logged, and the old plain-http URL no longer
// answers. A second start keeps the credential.
func TestEmbeddedMemberUpgradesAnOpenDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	cfg := lease.EmbedConfig{Dir: dir, LogFile: filepath.Join(t.TempDir(), "etcd.log"), OpenLoopback: true}
	old, err := lease.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	oldURL := old.Endpoints()[0]
	if !strings.HasPrefix(oldURL, "http://127.0.0.1:") {
		t.Fatalf("the old layout's URL %s", oldURL)
	}
	put(t, old.Access(), "/fcd/epochs/e1", "v1")
	old.Close()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	cfg.OpenLoopback = false
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	m, err := lease.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	acc := m.Access()
	if want := "https://" + strings.TrimPrefix(oldURL, "http://"); acc.Endpoints[0] != want || acc.TLS == nil {
		t.Fatalf("upgraded to %+v, want %s with TLS", acc, want)
	}
	if v := get(t, acc, "/fcd/epochs/e1"); v != "v1" {
		t.Fatalf("after the upgrade the data reads %q", v)
	}
	assertMode(t, dir, 0o700)
	if !strings.Contains(logs.String(), "moved from plain http to mutual TLS") || !strings.Contains(logs.String(), oldURL) {
		t.Errorf("the move is not logged:\n%s", logs.String())
	}
	cli := client(t, acc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	members, err := cli.MemberList(ctx)
	if err != nil || len(members.Members) != 1 || len(members.Members[0].PeerURLs) != 1 || !strings.HasPrefix(members.Members[0].PeerURLs[0], "https://") {
		t.Fatalf("membership after the upgrade: %v (%v)", members, err)
	}
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{oldURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer pcancel()
	if _, err := plain.Get(pctx, "/fcd/epochs/e1"); !refused(err) {
		t.Fatalf("the old plain URL after the upgrade: %v", err)
	}
	ca, err := os.ReadFile(acc.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()

	logs.Reset()
	again, err := lease.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if ca2, err := os.ReadFile(acc.CAFile); err != nil || !bytes.Equal(ca, ca2) || strings.Contains(logs.String(), "moved") ||
		strings.Contains(logs.String(), "new credentials") {
		t.Fatalf("a second start changed the credential (%v) or logged:\n%s", err, logs.String())
	}
	if v := get(t, again.Access(), "/fcd/epochs/e1"); v != "v1" {
		t.Fatalf("after a second start the data reads %q", v)
	}
}

// TestEmbeddedMemberReplacesBrokenCredentials: a start that finds the
// credential unusable (a key file lost) writes a new set and serves with
// it; EmbeddedAccess of a directory no member started on says so.
func TestEmbeddedMemberReplacesBrokenCredentials(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	if _, err := lease.EmbeddedAccess(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("access to a directory never started: %v", err)
	}
	var logs bytes.Buffer
	cfg := lease.EmbedConfig{Dir: dir, LogFile: filepath.Join(t.TempDir(), "etcd.log"), Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	m, err := lease.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	put(t, m.Access(), "k", "v")
	m.Close()
	if err := os.Remove(filepath.Join(dir, lease.TLSDir, "client.key")); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	m, err = lease.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !strings.Contains(logs.String(), "new credentials") {
		t.Errorf("no new credentials logged:\n%s", logs.String())
	}
	if v := get(t, m.Access(), "k"); v != "v" {
		t.Fatalf("with the new credential k = %q", v)
	}
}

// refused reports whether err is what an etcd client gets from a member
// that will not talk to it: no connection (Unavailable), or none before
// the deadline.
func refused(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %o, want %o", path, got, want)
	}
}
