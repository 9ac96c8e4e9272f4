package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/gowebpki/jcs"
)

// DigestPrefix is the algorithm prefix of every digest fcd computes.
const DigestPrefix = "sha256:"

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ValidDigest reports whether s has the form "sha256:<64 lowercase hex>".
func ValidDigest(s string) bool { return digestPattern.MatchString(s) }

// Canonical returns the RFC 8785 (JCS) canonical JSON of v, which is first
// encoded with encoding/json. Equal values always give equal bytes.
func Canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("manifest: encode for canonical form: %w", err)
	}
	return CanonicalJSON(raw)
}

// CanonicalJSON returns the RFC 8785 canonical form of a JSON text. It
// rejects invalid JSON and duplicate object members.
func CanonicalJSON(raw []byte) ([]byte, error) {
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("manifest: canonical JSON: %w", err)
	}
	return out, nil
}

// Digest returns "sha256:<hex>" over the canonical JSON of v.
func Digest(v any) (string, error) {
	c, err := Canonical(v)
	if err != nil {
		return "", err
	}
	return DigestBytes(c), nil
}

// DigestBytes returns "sha256:<hex>" over b as given.
func DigestBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return DigestPrefix + hex.EncodeToString(sum[:])
}
