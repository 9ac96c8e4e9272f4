package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// TypCertificate is the JWS "typ" of a signed compatibility certificate.
// A verifier expecting a manifest refuses it, and the other way round.
const TypCertificate = "fcd-certificate+jws"

// Certificate is a compatibility certificate: a signed statement by a
// compatibility issuer that calls of Tool whose arguments satisfy Envelope
// have, on the Target epoch, the modeled Effects — so a call formed on
// Source may run on Target after Source retires.
//
// Issuers are a trust set of their own: certificates are verified by a
// [Verifier] built from the issuer JWKS, never from the registrar keys.
type Certificate struct {
	// Source is the epoch id (sha256:…) the calls are formed on.
	Source string `json:"source"`
	// Target is the epoch id the calls may run on once Source retires.
	Target string `json:"target"`
	// Tool names the tool within the server (e.g. "create_repository").
	Tool string `json:"tool"`
	// Envelope is a JSON Schema (top-level type "object") the concrete
	// arguments of a call must satisfy to be covered.
	Envelope json.RawMessage `json:"envelope"`
	// Effects are the modeled effects of Target for calls inside the
	// envelope, e.g. {"visibility":"private"}.
	Effects map[string]any `json:"effects"`
	// Profile names the profile that produced the certificate.
	Profile ProfileRef `json:"profile"`
	// IssuedAt and ExpiresAt bound the validity: IssuedAt < ExpiresAt.
	IssuedAt  time.Time `json:"issuedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// ProfileRef names a compatibility profile by id and content digest.
type ProfileRef struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
}

// DecodeCertificate strictly decodes ([DecodeStrict]) and validates a
// certificate. Errors wrap [ErrMalformed] or [ErrInvalid].
func DecodeCertificate(data []byte) (*Certificate, error) {
	var c Certificate
	if err := DecodeStrict(data, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the structure of the certificate: both epochs are
// digests and differ, the tool name has manifest tool syntax, the envelope
// is a JSON object with top-level type "object" that compiles with
// [CompileSchema], the effects are non-empty, the profile has an id and a
// valid digest, and IssuedAt is before ExpiresAt. It does not look at the
// clock, and it cannot know whether the epochs are registered or whether
// the target declares the tool; the registry checks those. Errors wrap
// [ErrInvalid].
func (c *Certificate) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, &DecodeError{Pointer: path, Offset: -1, Reason: fmt.Sprintf(format, args...)})
	}
	if !ValidDigest(c.Source) {
		bad("/source", "must be sha256:<64 hex>")
	}
	if !ValidDigest(c.Target) {
		bad("/target", "must be sha256:<64 hex>")
	}
	if c.Source != "" && c.Source == c.Target {
		bad("/target", "must differ from the source epoch")
	}
	if !toolNamePattern.MatchString(c.Tool) {
		bad("/tool", "must match %s", toolNamePattern)
	}
	if env := bytes.TrimSpace(c.Envelope); len(env) == 0 || env[0] != '{' {
		bad("/envelope", "must be a JSON object")
	} else {
		var top struct {
			Type any `json:"type"`
		}
		if err := json.Unmarshal(env, &top); err != nil || top.Type != "object" {
			bad("/envelope/type", `must be "object"`)
		}
		if _, err := CompileSchema(env); err != nil {
			bad("/envelope", "does not compile: %v", err)
		}
	}
	if len(c.Effects) == 0 {
		bad("/effects", "must name at least one effect")
	}
	for k := range c.Effects {
		if k == "" {
			bad("/effects", "has an empty effect name")
		}
	}
	if c.Profile.ID == "" {
		bad("/profile/id", "is required")
	}
	if !ValidDigest(c.Profile.Digest) {
		bad("/profile/digest", "must be sha256:<64 hex>")
	}
	if c.IssuedAt.IsZero() {
		bad("/issuedAt", "is required")
	}
	if c.ExpiresAt.IsZero() {
		bad("/expiresAt", "is required")
	}
	if !c.IssuedAt.IsZero() && !c.ExpiresAt.IsZero() && !c.IssuedAt.Before(c.ExpiresAt) {
		bad("/expiresAt", "must be after issuedAt")
	}
	if len(errs) > 0 {
		return invalid(errs)
	}
	return nil
}

// ID returns the certificate id: the digest of its canonical JSON.
func (c *Certificate) ID() (string, error) { return Digest(c) }

// Fits reports whether args satisfy the certificate's envelope. It
// compiles the envelope on every call (certificates are few and calls are
// formed rarely; cache the compiled schema if that ever matters). A
// misfit is (false, nil); an error means the envelope does not compile or
// args are not I-JSON (wrapping [ErrMalformed]).
func (c *Certificate) Fits(args json.RawMessage) (bool, error) {
	s, err := CompileSchema(c.Envelope)
	if err != nil {
		return false, err
	}
	err = ValidateArguments(s, args)
	var ae *ArgumentError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ae):
		return false, nil
	default:
		return false, err
	}
}

// SignedCertificate is a verified, decoded and structurally valid
// certificate.
type SignedCertificate struct {
	Certificate *Certificate
	// ID is the certificate id ([Certificate.ID]).
	ID string
	// KeyID names the issuer key that signed it.
	KeyID string
	// JWS is the document as received, kept for audit.
	JWS string
}

// VerifyCertificate verifies a signed certificate (typ [TypCertificate];
// a signed manifest is refused), then decodes it strictly and validates
// it. Build v from the issuer keys, not the registrar keys.
func (v *Verifier) VerifyCertificate(data []byte) (*SignedCertificate, error) {
	ver, err := v.Verify(data, TypCertificate)
	if err != nil {
		return nil, err
	}
	c, err := DecodeCertificate(ver.Payload)
	if err != nil {
		return nil, err
	}
	id, err := c.ID()
	if err != nil {
		return nil, err
	}
	return &SignedCertificate{Certificate: c, ID: id, KeyID: ver.KeyID, JWS: string(bytes.TrimSpace(data))}, nil
}
