package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// testConfig is a Config with what only an operator can give: a registrar
// key, one credential and a signing key (so that the trail and the token
// publisher run), the embedded etcd member on free ports in dir.
func testConfig(t *testing.T, dir string) Config {
	t.Helper()
	_, cred, err := api.NewCredential("operator", api.RoleOperator)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := api.NewAuthenticator([]api.Credential{cred})
	if err != nil {
		t.Fatal(err)
	}
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Listen: "127.0.0.1:0", DataDir: dir, Replica: "test",
		EmbeddedEtcdClientURL: "http://" + etcdtest.FreeAddr(t), EmbeddedEtcdPeerURL: "http://" + etcdtest.FreeAddr(t),
		Registrars: manifesttest.NewSigner(t).Verifier, Auth: auth, Signer: key,
		Logger: slog.New(slog.DiscardHandler),
	}
}

// TestZeroConfigIsDefaults: the zero Config means the Default… values,
// and Validate accepts every zero duration and limit.
func TestZeroConfigIsDefaults(t *testing.T) {
	d := Config{}.withDefaults()
	if d.Listen != DefaultListen || d.DataDir != DefaultDataDir || d.FormationRate != DefaultFormationRate ||
		d.FormationBurst != DefaultFormationBurst || d.BodyLimit != DefaultBodyLimit || d.FormationTTL != DefaultFormationTTL ||
		d.TokenLifetime != DefaultTokenLifetime || len(d.DecisionLogMask) != 1 || d.DecisionLogMask[0] != DefaultDecisionLogMask {
		t.Fatalf("zero Config's defaults: %+v", d)
	}
	if m := (Config{DecisionLogMask: []string{}}).withDefaults().DecisionLogMask; len(m) != 0 {
		t.Errorf("an empty mask became %v", m)
	}
	err := Config{}.Validate()
	if err == nil || !strings.Contains(err.Error(), "RegistrarKeys") || !strings.Contains(err.Error(), "Credentials") {
		t.Fatalf("zero Config: %v, want only registrar keys and credentials missing", err)
	}
	if err := (Config{RegistrarKeys: "r", Credentials: "c"}).Validate(); err != nil {
		t.Fatalf("zero Config with keys and credentials: %v", err)
	}
}

// TestPolicyBundleConfig: a bundle excludes a directory, a URL needs
// keys, keys need a bundle, and the poll delays are ordered.
func TestPolicyBundleConfig(t *testing.T) {
	base := Config{RegistrarKeys: "r", Credentials: "c"}
	for _, tc := range []struct {
		note string
		set  func(*Config)
		want string // in the error; empty: valid
	}{
		{"a file without keys", func(c *Config) { c.PolicyBundle = "b.tar.gz" }, ""},
		{"a URL with keys", func(c *Config) { c.PolicyBundle, c.PolicyBundleKeys = "https://b/fcd.tar.gz", "k.pem" }, ""},
		{"a URL without keys", func(c *Config) { c.PolicyBundle = "https://b/fcd.tar.gz" }, "needs PolicyBundleKeys"},
		{"a directory too", func(c *Config) { c.PolicyBundle, c.PolicyDir = "b.tar.gz", "dir" }, "exclude each other"},
		{"keys without a bundle", func(c *Config) { c.PolicyBundleKeys = "k.pem" }, "are for a PolicyBundle"},
		{"delays out of order", func(c *Config) {
			c.PolicyBundle, c.PolicyBundleMinDelay, c.PolicyBundleMaxDelay = "b.tar.gz", time.Minute, time.Second
		}, "PolicyBundleMinDelay"},
	} {
		c := base
		tc.set(&c)
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.note, err, tc.want)
		}
	}
}

// TestShutdownOrder: when ctx ends, the listener stops accepting at once,
// a request in flight finishes with the store still open and the loops
// still running (the signing key still published), and run returns only
// after it; Close then closes the store and the embedded etcd.
func TestShutdownOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := filepath.Join(t.TempDir(), "data")
	var s *Server
	for attempt := 0; s == nil; attempt++ {
		var err error
		s, err = New(ctx, testConfig(t, dir))
		if err != nil && (attempt == 7 || !strings.Contains(err.Error(), "address already in use")) {
			t.Fatalf("build: %v", err)
		}
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()

	// A request that stays in flight until released, then uses the store
	// and reports whether the signing key is still published.
	entered, release := make(chan struct{}), make(chan struct{})
	s.http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		if err := s.store.Ping(r.Context()); err != nil {
			http.Error(w, "store: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !s.issuer.Published() {
			http.Error(w, "signing key no longer published", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	ran := make(chan error, 1)
	go func() { ran <- s.run(ctx) }()

	// The publisher runs before the request: wait for the key.
	testutil.Eventually(t, time.Minute, "the signing key to be published", s.issuer.Published)
	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	go func() {
		resp, err := (&http.Client{Transport: tr}).Get(s.url + "/slow")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		done <- result{code: resp.StatusCode, body: string(body)}
	}()
	<-entered
	cancel()

	// New connections are refused while the request is in flight.
	addr := s.httpLn.Addr().String()
	testutil.Eventually(t, time.Minute, "new connections to be refused once shutdown began", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	select {
	case err := <-ran:
		t.Fatalf("run returned (%v) with a request in flight", err)
	default:
	}

	close(release)
	if r := <-done; r.err != nil || r.code != http.StatusOK {
		t.Fatalf("request in flight during shutdown: %d %q %v", r.code, r.body, r.err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("run: %v", err)
	}
	closed = true
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.store.Ping(context.Background()); err == nil {
		t.Fatal("the store answers after Close")
	}
}

// TestBusyEtcdPort: an embedded etcd whose client port is taken fails
// with the advice to give free ports, found by the errno
// (syscall.EADDRINUSE), not by the error's text.
func TestBusyEtcdPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := testConfig(t, filepath.Join(t.TempDir(), "data"))
	cfg.EmbeddedEtcdClientURL = "http://" + l.Addr().String()
	s, err := New(context.Background(), cfg)
	if err == nil {
		s.Close()
		t.Fatal("New on a busy etcd port succeeded")
	}
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "another etcd or authzd listens there") {
		t.Fatalf("New: %v, want EADDRINUSE with the advice", err)
	}
}
