package manifest

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// Outcomes a [Resolution] may state: the uncertain call's effect happened,
// or it did not.
const (
	ResolutionEffect   = "effect"
	ResolutionNoEffect = "no_effect"
)

// The window a resolution's issuedAt must fall in when it is verified
// ([Verifier.VerifyResolution]): at most ResolutionMaxSkew ahead of the
// verifier's clock (clocks differ a little), and at most ResolutionMaxAge
// behind it. An operator decides on what they know when they sign; a
// document signed long before it is presented was decided on what may no
// longer be so, and one that was signed but never sent should not stay
// usable for long. Sign again when it is refused.
const (
	ResolutionMaxSkew = time.Minute
	ResolutionMaxAge  = time.Hour
)

// Limits of a resolution's text members, in bytes.
const (
	MaxResolutionReason   = 4096
	MaxResolutionOperator = 256
)

// ErrResolutionTime: the resolution's issuedAt is outside the window
// around the verifier's clock (too far ahead, or too old).
var ErrResolutionTime = public.New("manifest", "resolution issued outside the accepted window")

// Resolution is an operator's signed statement of what happened to the
// call of one uncertain lease, whose backend could not tell: the only
// document that closes such a lease besides a newer pool generation. It
// is signed (typ [TypResolution]) with a key of the person deciding,
// trusted through the operator keys, so a resolution is attributable to
// that person and not only to the bearer credential that posted it.
type Resolution struct {
	// Lease is the id of the lease resolved (the dispatch token's jti): a
	// document resolves that lease only.
	Lease string `json:"lease"`
	// Outcome is ResolutionEffect or ResolutionNoEffect.
	Outcome string `json:"outcome"`
	// Reason says how the operator found out; required.
	Reason string `json:"reason"`
	// Operator names the person who decided, in the organisation's own
	// terms (a login, an e-mail address); fcd does not interpret it.
	Operator string `json:"operator"`
	// IssuedAt is when it was signed (RFC 3339).
	IssuedAt time.Time `json:"issuedAt"`
}

var leaseIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,256}$`)

// Validate checks the structure of the resolution: a lease id, an
// outcome of effect or no_effect, a reason and an operator (not blank,
// within their limits, without control characters in the operator) and
// an issuedAt. It does not look at the clock. Errors wrap [ErrInvalid].
func (r *Resolution) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, &DecodeError{Pointer: path, Offset: -1, Reason: fmt.Sprintf(format, args...)})
	}
	if !leaseIDPattern.MatchString(r.Lease) {
		bad("/lease", "must match %s", leaseIDPattern)
	}
	if r.Outcome != ResolutionEffect && r.Outcome != ResolutionNoEffect {
		bad("/outcome", "must be %s or %s", ResolutionEffect, ResolutionNoEffect)
	}
	if strings.TrimSpace(r.Reason) == "" {
		bad("/reason", "is required")
	} else if len(r.Reason) > MaxResolutionReason {
		bad("/reason", "is longer than %d bytes", MaxResolutionReason)
	}
	switch {
	case strings.TrimSpace(r.Operator) == "":
		bad("/operator", "is required")
	case len(r.Operator) > MaxResolutionOperator:
		bad("/operator", "is longer than %d bytes", MaxResolutionOperator)
	case strings.IndexFunc(r.Operator, unicode.IsControl) >= 0:
		bad("/operator", "has a control character")
	}
	if r.IssuedAt.IsZero() {
		bad("/issuedAt", "is required")
	}
	if len(errs) > 0 {
		return invalid(errs)
	}
	return nil
}

// DecodeResolution strictly decodes ([DecodeStrict]: an unknown,
// duplicated or case-folded member is refused) and validates a
// resolution. Errors wrap [ErrMalformed] or [ErrInvalid].
func DecodeResolution(data []byte) (*Resolution, error) {
	var r Resolution
	if err := DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// SignResolution validates r and signs its canonical JSON as a compact
// JWS of typ [TypResolution] with key (Ed25519 or P-256, with a kid).
func SignResolution(r *Resolution, key jwk.Key) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	payload, err := Canonical(r)
	if err != nil {
		return nil, err
	}
	return Sign(payload, key, TypResolution)
}

// SignedResolution is a decoded resolution with what identifies its
// signed form.
type SignedResolution struct {
	Resolution *Resolution
	// KeyID names the operator key that signed it.
	KeyID string
	// Digest is "sha256:<hex>" over the RFC 8785 form of the payload as
	// signed: the document's identity, whatever its signature.
	Digest string
	// JWS is the document as received (surrounding space trimmed).
	JWS string
}

// VerifyResolution verifies a signed resolution against the verifier's
// keys (build it from the operator keys, never the registrar or issuer
// keys), decodes it strictly and validates it, and checks that its
// issuedAt lies within [ResolutionMaxSkew] ahead of now and
// [ResolutionMaxAge] behind it ([ErrResolutionTime] otherwise). Whether
// it names the lease being resolved is the caller's to check. Errors
// wrap ErrMalformed, ErrBadSignature, ErrUntrustedSigner, ErrInvalid or
// ErrResolutionTime.
func (v *Verifier) VerifyResolution(data []byte, now time.Time) (*SignedResolution, error) {
	ver, err := v.Verify(data, TypResolution)
	if err != nil {
		return nil, err
	}
	sr, err := signedResolution(ver.Payload, ver.KeyID, data)
	if err != nil {
		return nil, err
	}
	at := sr.Resolution.IssuedAt
	switch {
	case at.After(now.Add(ResolutionMaxSkew)):
		return nil, fmt.Errorf("%w: issued at %s, more than %s ahead of %s", ErrResolutionTime,
			at.UTC().Format(time.RFC3339), ResolutionMaxSkew, now.UTC().Format(time.RFC3339))
	case now.Sub(at) > ResolutionMaxAge:
		return nil, fmt.Errorf("%w: issued at %s, more than %s before %s; sign it again", ErrResolutionTime,
			at.UTC().Format(time.RFC3339), ResolutionMaxAge, now.UTC().Format(time.RFC3339))
	}
	return sr, nil
}

// ReadVerifiedResolution decodes a resolution that was verified before
// (the JWS fcd keeps with the lease it closed) to show it: it checks
// neither the signature nor the time, so it must never be used to trust a
// document that was just received — use [Verifier.VerifyResolution].
func ReadVerifiedResolution(data []byte) (*SignedResolution, error) {
	msg, err := jws.Parse(bytes.TrimSpace(data))
	if err != nil {
		return nil, notSigned(data, TypResolution)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 || sigs[0].ProtectedHeaders().Type() != TypResolution {
		return nil, fmt.Errorf("%w: not a signed resolution", ErrMalformed)
	}
	return signedResolution(msg.Payload(), sigs[0].ProtectedHeaders().KeyID(), data)
}

func signedResolution(payload []byte, kid string, data []byte) (*SignedResolution, error) {
	r, err := DecodeResolution(payload)
	if err != nil {
		return nil, err
	}
	canon, err := CanonicalJSON(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return &SignedResolution{Resolution: r, KeyID: kid, Digest: DigestBytes(canon), JWS: string(bytes.TrimSpace(data))}, nil
}
