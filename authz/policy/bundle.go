package policy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"
)

// BundleCedarPath is where a bundle carries its Cedar policies and cases:
// the data document data.fcd.cedar (a data.json at fcd/cedar/ in the
// bundle's tree), an object whose members are file names (*.cedar,
// *.cases.json) and whose values are the files' contents as strings. OPA's
// bundle format carries only Rego, data and Wasm; data is its one way to
// carry other text, and a string keeps each file's bytes exactly (the
// policy digest names them; `opa build` formats the Rego modules, so
// theirs are the formatted ones).
var BundleCedarPath = []string{"fcd", "cedar"}

// Defaults of a [BundleSource].
const (
	// DefaultBundleMinDelay and DefaultBundleMaxDelay bound the random
	// wait between two polls of a bundle, as OPA's bundle plugin's
	// min_delay_seconds and max_delay_seconds do (and with its defaults).
	DefaultBundleMinDelay = 60 * time.Second
	DefaultBundleMaxDelay = 120 * time.Second
	// DefaultBundleSizeLimit bounds a bundle, compressed and each file
	// uncompressed, in bytes.
	DefaultBundleSizeLimit = 32 << 20
	// DefaultBundleKeyID names the one key of a keys file that holds a
	// single key, as `opa build --signing-key` names it by default.
	DefaultBundleKeyID = "default"
)

// Errors of a bundle source, besides those of the set it carries
// (ErrInvalidPolicy, ErrTestsFailed).
var (
	// ErrBundleSignature: the bundle's signature (.signatures.json) is
	// missing while keys are configured, does not verify against them,
	// or does not cover its files as they are; or the bundle is signed
	// and no keys are configured.
	ErrBundleSignature = errors.New("policy: bundle signature does not verify")
	// ErrBundleUnavailable: the bundle could not be read or downloaded
	// (the server is down, or answered other than 200 or 304).
	ErrBundleUnavailable = errors.New("policy: bundle unavailable")
)

// errNotModified is a poll's answer when the bundle is the one read last.
var errNotModified = errors.New("policy: bundle not modified")

// BundleSource is an OPA bundle (a .tar.gz in OPA's bundle format, as
// `opa build -b` writes it) to load the policy set from: a file, re-read
// on every poll, or an http(s) URL, downloaded with If-None-Match so that
// an unchanged bundle is neither downloaded nor loaded again. The
// bundle's Rego modules (with their *_test.rego tests) are the set's Rego
// files, the data document at [BundleCedarPath] its Cedar files and
// cases, its .manifest's revision the set's revision.
type BundleSource struct {
	// Location is an http:// or https:// URL, or a file.
	Location string
	// Verification verifies the bundle's signature with OPA's own
	// verifier (see [LoadBundleKeys]); nil accepts only unsigned bundles.
	Verification *bundle.VerificationConfig
	// Client downloads a URL; nil means a client with a 30-second timeout.
	Client *http.Client
	// MinDelay and MaxDelay bound the random wait between polls; zero
	// means DefaultBundleMinDelay and DefaultBundleMaxDelay.
	MinDelay, MaxDelay time.Duration
	// SizeLimit bounds the bundle in bytes; zero means
	// DefaultBundleSizeLimit.
	SizeLimit int64
}

// isURL reports whether the location is downloaded rather than read.
func (b *BundleSource) isURL() bool {
	return strings.HasPrefix(b.Location, "http://") || strings.HasPrefix(b.Location, "https://")
}

// String names the bundle in logs and status: a URL without its user
// information and query (which may hold credentials), or the file.
func (b *BundleSource) String() string {
	if !b.isURL() {
		return b.Location
	}
	u, err := url.Parse(b.Location)
	if err != nil {
		return "bundle"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

func (b *BundleSource) delays() (time.Duration, time.Duration) {
	lo, hi := cmp.Or(b.MinDelay, DefaultBundleMinDelay), cmp.Or(b.MaxDelay, DefaultBundleMaxDelay)
	return lo, max(lo, hi)
}

// bundleLoader reads a bundle source. It keeps the ETag and the digest of
// the bundle read last, good or bad, so that a poll loads a bundle once:
// a broken one is reported once and retried when it changes.
type bundleLoader struct {
	src    *BundleSource
	client *http.Client
	etag   string
	sum    string
}

func newBundleLoader(src *BundleSource) *bundleLoader {
	c := src.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	return &bundleLoader{src: src, client: c}
}

// load reads the bundle and decodes it; errNotModified when poll is set
// and the bundle is the one read last (a 304, or the same bytes).
func (l *bundleLoader) load(ctx context.Context, poll bool) (*policyFiles, error) {
	limit := cmp.Or(l.src.SizeLimit, DefaultBundleSizeLimit)
	var data []byte
	var err error
	if l.src.isURL() {
		data, err = l.download(ctx, poll, limit)
	} else {
		data, err = readLimited(l.src.Location, limit)
	}
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	if poll && sum == l.sum {
		return nil, errNotModified
	}
	l.sum = sum
	return readBundle(data, l.src.Verification, limit)
}

func readLimited(file string, limit int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBundleUnavailable, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBundleUnavailable, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalidPolicy, file, limit)
	}
	return data, nil
}

func (l *bundleLoader) download(ctx context.Context, poll bool, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.src.Location, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBundleUnavailable, err)
	}
	if poll && l.etag != "" {
		req.Header.Set("If-None-Match", l.etag)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		// The error names the URL, query and all: say only why.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("%w: GET %s: %v", ErrBundleUnavailable, l.src, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotModified:
		if poll {
			return nil, errNotModified
		}
		return nil, fmt.Errorf("%w: GET %s: 304 Not Modified to a request without If-None-Match", ErrBundleUnavailable, l.src)
	default:
		return nil, fmt.Errorf("%w: GET %s: %s", ErrBundleUnavailable, l.src, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s: %v", ErrBundleUnavailable, l.src, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: the bundle at %s is larger than %d bytes", ErrInvalidPolicy, l.src, limit)
	}
	l.etag = resp.Header.Get("ETag")
	return data, nil
}

// readBundle decodes and verifies a bundle with OPA's reader and takes
// its policy and test files. A reader error is a signature error when the
// same bundle reads without verification, else the bundle is invalid.
func readBundle(data []byte, vc *bundle.VerificationConfig, limit int64) (*policyFiles, error) {
	read := func(verify bool) (bundle.Bundle, error) {
		r := bundle.NewReader(bytes.NewReader(data)).WithSizeLimitBytes(limit).WithRegoVersion(ast.RegoV1)
		if verify {
			r = r.WithBundleVerificationConfig(vc)
		} else {
			r = r.WithSkipBundleVerification(true)
		}
		return r.Read()
	}
	b, err := read(true)
	if err != nil {
		if _, uerr := read(false); uerr == nil {
			if vc == nil {
				return nil, fmt.Errorf("%w: the bundle is signed and no bundle keys are configured (%v)", ErrBundleSignature, err)
			}
			return nil, fmt.Errorf("%w: %v", ErrBundleSignature, err)
		}
		return nil, fmt.Errorf("%w: bundle: %v", ErrInvalidPolicy, err)
	}
	if b.Type() != bundle.SnapshotBundleType {
		return nil, fmt.Errorf("%w: bundle: a %s bundle; only snapshot bundles carry a policy set", ErrInvalidPolicy, b.Type())
	}
	if len(b.WasmModules) > 0 || len(b.PlanModules) > 0 || len(b.Wasm) > 0 {
		return nil, fmt.Errorf("%w: bundle: Wasm modules and plans are not supported: fcd compiles the Rego source", ErrInvalidPolicy)
	}
	pf := newPolicyFiles()
	pf.revision = b.Manifest.Revision
	for _, m := range b.Modules {
		// By base name, as a directory's files: the module's path in the
		// bundle is where it was built from (opa build -b DIR keeps DIR).
		name := path.Base(m.Path)
		into := pf.rego
		if strings.HasSuffix(name, suffixRegoTest) {
			into = pf.regoTests
		}
		if err := pf.add(into, name, m.Raw); err != nil {
			return nil, err
		}
	}
	if err := pf.addBundleData(b.Data); err != nil {
		return nil, err
	}
	if err := pf.seal(); err != nil {
		return nil, err
	}
	return pf, nil
}

// addBundleData takes the Cedar files of the bundle's data document, the
// only data a bundle may hold: fcd's Rego reads no data documents (facts
// go in the input), so other data would be silently ignored.
func (pf *policyFiles) addBundleData(data map[string]any) error {
	where := "data." + strings.Join(BundleCedarPath, ".")
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: bundle: %s; a bundle's data may hold only %s, the Cedar files (Rego data documents are not supported)",
			ErrInvalidPolicy, fmt.Sprintf(format, args...), where)
	}
	var node any = data
	for i, seg := range BundleCedarPath {
		obj, ok := node.(map[string]any)
		if !ok {
			return refuse("data.%s is not an object", strings.Join(BundleCedarPath[:i], "."))
		}
		for k := range obj {
			if k != seg {
				return refuse("it holds data.%s", strings.Join(append(slices.Clone(BundleCedarPath[:i]), k), "."))
			}
		}
		if node = obj[seg]; node == nil {
			return nil // no Cedar: compileSet says so
		}
	}
	files, ok := node.(map[string]any)
	if !ok {
		return refuse("%s is not an object of file names", where)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		text, ok := files[name].(string)
		if !ok {
			return refuse("%s[%q] is not a string (the file's contents)", where, name)
		}
		into := pf.cedar
		if strings.HasSuffix(name, suffixCases) {
			into = pf.cases
		} else if !strings.HasSuffix(name, suffixCedar) {
			return refuse("%s[%q] is not a *%s or *%s file", where, name, suffixCedar, suffixCases)
		}
		if err := pf.add(into, name, []byte(text)); err != nil {
			return err
		}
	}
	return nil
}

// LoadBundleKeys reads the keys that verify bundle signatures, as OPA's
// keys configuration gives them, from a file holding either
//
//   - one key: a PEM public key or certificate (RSA or ECDSA), or an HMAC
//     secret (the file's bytes, exactly as `opa build --signing-key`
//     reads them), named keyID or [DefaultBundleKeyID]; alg is its
//     algorithm, empty meaning RS256 for RSA, ES256/ES384/ES512 by curve,
//     HS256 for a secret; or
//   - OPA's keys object in JSON or YAML, {"<kid>": {"key": "...",
//     "algorithm": "RS256", "scope": "..."}, ...}; keyID, if not empty,
//     picks the one to verify with, else the signature's kid does.
//
// The result is OPA's bundle.VerificationConfig.
func LoadBundleKeys(file, keyID, alg string) (*bundle.VerificationConfig, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("policy: bundle keys: %w", err)
	}
	if block, _ := pem.Decode(data); block == nil && bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		ks, err := keys.ParseKeysConfig(data)
		if err != nil {
			return nil, fmt.Errorf("policy: bundle keys %s: %w", file, err)
		}
		vc := bundle.NewVerificationConfig(nil, keyID, "", nil)
		if err := vc.ValidateAndInjectDefaults(ks); err != nil {
			return nil, fmt.Errorf("policy: bundle keys %s: %w", file, err)
		}
		return vc, nil
	} else if block != nil {
		if block.Type == "PRIVATE KEY" || strings.HasSuffix(block.Type, " PRIVATE KEY") {
			return nil, fmt.Errorf("policy: bundle keys %s holds a private key: give the public key", file)
		}
		inferred, err := pemAlgorithm(block)
		if err != nil {
			return nil, fmt.Errorf("policy: bundle keys %s: %w", file, err)
		}
		alg = cmp.Or(alg, inferred)
	} else {
		alg = cmp.Or(alg, "HS256")
	}
	if !keys.IsSupportedAlgorithm(alg) {
		return nil, fmt.Errorf("policy: bundle keys %s: unsupported algorithm %q", file, alg)
	}
	id := cmp.Or(keyID, DefaultBundleKeyID)
	kc := &keys.Config{Key: string(data), Algorithm: alg}
	return bundle.NewVerificationConfig(map[string]*keys.Config{id: kc}, id, "", nil), nil
}

// pemAlgorithm is the default algorithm of a PEM public key.
func pemAlgorithm(block *pem.Block) (string, error) {
	var pub any
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			pub = cert.PublicKey
		}
	default:
		return "", fmt.Errorf("a PEM %q block: want a PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", block.Type)
	}
	if err != nil {
		return "", err
	}
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return "RS256", nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ES256", nil
		case elliptic.P384():
			return "ES384", nil
		case elliptic.P521():
			return "ES512", nil
		}
	}
	return "", fmt.Errorf("a %T key: OPA verifies RSA and ECDSA (P-256, P-384, P-521) signatures", pub)
}

// BundleCedarData is the data document that carries the Cedar files and
// cases at the top level of fsys (a policy directory) in a bundle: the
// JSON of a data.json to put at fcd/cedar/ in the bundle's tree (e.g.
// DIR/fcd/cedar/data.json before `opa build -b DIR`), each file's
// contents as a string. A directory's loader reads only its top level,
// so the file does not change the directory as a policy set.
func BundleCedarData(fsys fs.FS) ([]byte, error) {
	pf, err := readPolicyFiles(fsys)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, m := range []map[string][]byte{pf.cedar, pf.cases} {
		for name, data := range m {
			if !utf8.Valid(data) {
				return nil, fmt.Errorf("%w: %s is not UTF-8 text", ErrInvalidPolicy, name)
			}
			files[name] = string(data)
		}
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // Cedar compares with < and >
	enc.SetIndent("", "  ")
	if err := enc.Encode(files); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
