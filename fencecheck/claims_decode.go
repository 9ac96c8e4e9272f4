package fencecheck

import "fmt"

// claimNames lists every claim of [Claims] in declaration order; the index
// is the bit of the claim in decodeClaims' presence mask.
var claimNames = [...]string{
	"iss", "aud", "sub", "jti", "iat", "nbf", "exp",
	"fcd_formation", "fcd_tool", "fcd_args", "fcd_epoch", "fcd_artifact", "fcd_config",
	"fcd_generation", "fcd_revision", "fcd_cluster", "fcd_admitted",
	"fcd_recovery_of",
}

// optionalClaims is the presence mask of the claims a token may lack.
const optionalClaims = 1 << 17

// decodeClaims decodes a token payload strictly: one JSON object whose
// members are exactly the claims of Claims, each present once, names
// matched case-sensitively (encoding/json alone would match "ISS" to iss
// and keep the last of two duplicates), strings where Claims has strings
// and integers where it has int64. Nothing may follow the object.
func decodeClaims(payload []byte) (*Claims, error) {
	var c Claims
	var seen uint32
	err := decodeFlat(payload, func(name []byte, v flatValue) error {
		i, sp, ip := c.field(name)
		if i < 0 {
			return fmt.Errorf("unknown claim %q", name)
		}
		if seen&(1<<i) != 0 {
			return fmt.Errorf("claim %s appears twice", name)
		}
		seen |= 1 << i
		switch {
		case sp != nil && v.isString:
			*sp = string(v.str)
		case ip != nil && !v.isString:
			*ip = v.num
		case sp != nil:
			return fmt.Errorf("claim %s must be a string", name)
		default:
			return fmt.Errorf("claim %s must be an integer", name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	for i, n := range claimNames {
		if seen&(1<<i) == 0 && optionalClaims&(1<<i) == 0 {
			return nil, fmt.Errorf("claim %s is missing", n)
		}
	}
	if seen&optionalClaims != 0 && c.RecoveryOf == "" {
		return nil, fmt.Errorf("claim fcd_recovery_of is empty")
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// field returns the index in claimNames of the claim name and the field it
// decodes into, or -1 for a name that is not a claim.
func (c *Claims) field(name []byte) (int, *string, *int64) {
	switch string(name) { // no allocation: the compiler compares in place
	case "iss":
		return 0, &c.Issuer, nil
	case "aud":
		return 1, &c.Audience, nil
	case "sub":
		return 2, &c.Subject, nil
	case "jti":
		return 3, &c.ID, nil
	case "iat":
		return 4, nil, &c.IssuedAt
	case "nbf":
		return 5, nil, &c.NotBefore
	case "exp":
		return 6, nil, &c.Expiry
	case "fcd_formation":
		return 7, &c.Formation, nil
	case "fcd_tool":
		return 8, &c.Tool, nil
	case "fcd_args":
		return 9, &c.ArgumentDigest, nil
	case "fcd_epoch":
		return 10, &c.Epoch, nil
	case "fcd_artifact":
		return 11, &c.Artifact, nil
	case "fcd_config":
		return 12, &c.Config, nil
	case "fcd_generation":
		return 13, nil, &c.Generation
	case "fcd_revision":
		return 14, nil, &c.Revision
	case "fcd_cluster":
		return 15, &c.Cluster, nil
	case "fcd_admitted":
		return 16, nil, &c.Admitted
	case "fcd_recovery_of":
		return 17, &c.RecoveryOf, nil
	}
	return -1, nil, nil
}

// header is the protected header of a dispatch token.
type header struct {
	alg, typ, kid string
}

// decodeHeader decodes a protected header strictly: a JSON object of
// string members alg, typ and kid, each at most once, and nothing else.
// An unknown member (crit, b64, jku, jwk, x5u, …) could change how the
// token must be processed; fcd's issuer never writes one.
func decodeHeader(data []byte) (header, error) {
	var h header
	var seen [3]bool
	err := decodeFlat(data, func(name []byte, v flatValue) error {
		var i int
		var dst *string
		switch string(name) {
		case "alg":
			i, dst = 0, &h.alg
		case "typ":
			i, dst = 1, &h.typ
		case "kid":
			i, dst = 2, &h.kid
		default:
			return fmt.Errorf("member %q is not allowed", name)
		}
		if seen[i] {
			return fmt.Errorf("member %s appears twice", name)
		}
		seen[i] = true
		if !v.isString {
			return fmt.Errorf("member %s must be a string", name)
		}
		*dst = string(v.str)
		return nil
	})
	if err != nil {
		return header{}, err
	}
	return h, nil
}
