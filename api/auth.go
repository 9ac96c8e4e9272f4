package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/fcd-authz/fcd/manifest"
)

// Role is what a caller may do. Every /v1 route names the roles it
// accepts.
type Role string

// The roles of fcd's callers.
const (
	RoleRegistrar Role = "registrar"
	RoleHost      Role = "host"
	RoleGateway   Role = "gateway"
	RoleApprover  Role = "approver"
	RoleOperator  Role = "operator"
	RoleBackend   Role = "backend"
)

// Roles lists every role, in a stable order.
func Roles() []Role {
	return []Role{RoleRegistrar, RoleHost, RoleGateway, RoleApprover, RoleOperator, RoleBackend}
}

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return slices.Contains(Roles(), r) }

// Credential is a stored bearer credential: its role, an id safe to log,
// and the SHA-256 of the secret. The secret itself is never stored.
// Credentials are high-entropy random strings, so a plain SHA-256 is the
// right hash (no password stretching is needed).
type Credential struct {
	ID   string `json:"id"`
	Role Role   `json:"role"`
	// Hash is "sha256:<hex>" of the secret.
	Hash string `json:"hash"`
	// Pools, for a backend or gateway credential, limits the leases whose
	// outcome it may report to those of these pools; empty means any.
	// Give each backend pool its own credential: a backend that could
	// close another pool's leases could let that pool's epoch retire
	// while an effect still runs there.
	Pools []string `json:"pools,omitempty"`
}

// Secret is a bearer credential in clear, as handed to a caller once.
// It never reaches a log whole.
type Secret string

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue("REDACTED") }

// NewCredential creates a random secret for role and its stored form.
func NewCredential(id string, role Role) (Secret, Credential, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", Credential{}, fmt.Errorf("api: credential: %w", err)
	}
	s := Secret("fcd_" + string(role) + "_" + base64.RawURLEncoding.EncodeToString(b[:]))
	return s, Credential{ID: id, Role: role, Hash: HashSecret(s)}, nil
}

// HashSecret returns the stored form of a secret.
func HashSecret(s Secret) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Authenticator checks bearer credentials against the stored hashes.
type Authenticator struct {
	creds  []Credential
	hashes [][]byte
}

// NewAuthenticator returns an authenticator over creds; each needs a
// valid role and hash.
func NewAuthenticator(creds []Credential) (*Authenticator, error) {
	a := &Authenticator{}
	for i, c := range creds {
		if !c.Role.Valid() {
			return nil, fmt.Errorf("api: credential %d (%s): unknown role %q", i, c.ID, c.Role)
		}
		if len(c.Pools) > 0 && c.Role != RoleBackend && c.Role != RoleGateway {
			return nil, fmt.Errorf("api: credential %d (%s): pools limit only backend and gateway credentials", i, c.ID)
		}
		for _, p := range c.Pools {
			if p == "" || len(p) > 256 {
				return nil, fmt.Errorf("api: credential %d (%s): pool names must be 1-256 characters", i, c.ID)
			}
		}
		h, ok := strings.CutPrefix(c.Hash, "sha256:")
		raw, err := hex.DecodeString(h)
		if !ok || err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("api: credential %d (%s): hash must be sha256:<64 hex>", i, c.ID)
		}
		a.creds = append(a.creds, c)
		a.hashes = append(a.hashes, raw)
	}
	return a, nil
}

// Lookup returns the credential matching secret. It compares against every
// stored hash in constant time, so the time taken tells nothing of which
// credential, if any, nearly matched.
func (a *Authenticator) Lookup(secret Secret) (Credential, bool) {
	sum := sha256.Sum256([]byte(secret))
	found := -1
	for i, h := range a.hashes {
		if subtle.ConstantTimeCompare(sum[:], h) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Credential{}, false
	}
	return a.creds[found], true
}

type callerKey struct{}

// CallerFrom returns the authenticated credential of a request.
func CallerFrom(ctx context.Context) (Credential, bool) {
	c, ok := ctx.Value(callerKey{}).(Credential)
	return c, ok
}

// require returns middleware admitting only callers with one of roles:
// 401 without a valid credential, 403 with a credential of another role.
func (s *server) require(roles ...Role) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cred, err := s.authenticate(r.Header.Get("Authorization"), roles...)
			if err != nil {
				s.problem(w, r, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, cred)))
		})
	}
}

// authenticate returns the credential of an Authorization value
// ("Bearer <secret>") if it has one of roles: errUnauthenticated without a
// valid credential, errForbiddenRole with a credential of another role.
// HTTP routes and the gRPC Check service share it.
func (s *server) authenticate(authorization string, roles ...Role) (Credential, error) {
	scheme, tok, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return Credential{}, errUnauthenticated
	}
	cred, ok := s.auth.Lookup(Secret(strings.TrimSpace(tok)))
	if !ok {
		return Credential{}, errUnauthenticated
	}
	if !slices.Contains(roles, cred.Role) {
		return Credential{}, fmt.Errorf("%w: role %s may not call this route", errForbiddenRole, cred.Role)
	}
	return cred, nil
}

// LoadCredentials reads a credentials file — a JSON list of {id, role,
// hash}, members checked as in every signed or stored document
// (manifest.Unmarshal: unknown members refused, named by JSON Pointer) —
// and returns its Authenticator. An empty list is refused: a server
// without credentials would refuse every call.
func LoadCredentials(path string) (*Authenticator, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	var creds []Credential
	if err := manifest.Unmarshal(bytes.TrimSpace(data), &creds); err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	if len(creds) == 0 {
		return nil, fmt.Errorf("credentials %s: no credentials", path)
	}
	return NewAuthenticator(creds)
}
