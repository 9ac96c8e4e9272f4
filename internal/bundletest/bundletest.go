// Package bundletest builds OPA bundles of fcd policy sets the way an
// operator does — `opa build -b DIR` through OPA's own compile and bundle
// packages, signed with OPA's signer — and serves them over HTTP as a
// bundle server does, with ETags, for the tests of the bundle source.
package bundletest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/compile"

	"github.com/fcd-authz/fcd/authz/policy"
)

// Key is an RSA key pair in PEM files, as `openssl genrsa` and `openssl
// rsa -pubout` write them.
type Key struct {
	Private, Public string // file names
}

// NewKey writes a new 2048-bit RSA key pair into a temporary directory.
func NewKey(t testing.TB) Key {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key := Key{Private: filepath.Join(dir, "bundle-key.pem"), Public: filepath.Join(dir, "bundle-key.pub.pem")}
	write(t, key.Private, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
	write(t, key.Public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	return key
}

// Build copies the policy set fsys into a directory, writes its Cedar
// files as the data document fcd/cedar/data.json
// (policy.BundleCedarData), and builds the directory as `opa build -b DIR
// --revision revision --signing-key key.Private` does; a zero key builds
// an unsigned bundle. It returns the .tar.gz.
func Build(t testing.TB, fsys fs.FS, revision string, key Key) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, fsys); err != nil {
		t.Fatal(err)
	}
	data, err := policy.BundleCedarData(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "fcd", "cedar"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "fcd", "cedar", "data.json"), data)
	var out bytes.Buffer
	c := compile.New().WithAsBundle(true).WithPaths(dir).WithOutput(&out).WithRevision(revision)
	if key.Private != "" {
		c = c.WithBundleSigningConfig(bundle.NewSigningConfig(key.Private, "RS256", ""))
	}
	if err := c.Build(context.Background()); err != nil {
		t.Fatalf("opa build -b: %v", err)
	}
	return out.Bytes()
}

func write(t testing.TB, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Server serves one bundle at /bundles/fcd.tar.gz, as a bundle server
// does: with an ETag (the SHA-256 of its bytes) and 304 Not Modified to a
// request whose If-None-Match names it.
type Server struct {
	*httptest.Server
	mu   sync.Mutex
	data []byte
	// Downloads counts the answers that carried the bundle (200),
	// NotModified the 304s.
	Downloads, NotModified atomic.Int64
}

// NewServer starts a server serving data; Close stops it.
func NewServer(t testing.TB, data []byte) *Server {
	s := &Server{data: data}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// URL is the bundle's URL.
func (s *Server) BundleURL() string { return s.URL + "/bundles/fcd.tar.gz" }

// Set replaces the bundle served.
func (s *Server) Set(data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data = data
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/bundles/fcd.tar.gz" {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	data := s.data
	s.mu.Unlock()
	sum := sha256.Sum256(data)
	etag := `"` + hex.EncodeToString(sum[:]) + `"`
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		s.NotModified.Add(1)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	s.Downloads.Add(1)
	w.Header().Set("Content-Type", "application/gzip")
	_, _ = w.Write(data)
}
