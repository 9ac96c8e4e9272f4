package fencecheck

import "fmt"

// Token format constants shared by the issuer (authzd) and the verifier.
const (
	// TokenType is the JWS "typ" header of every dispatch token. A token
	// with another typ is refused, so no other JWT can pass as one.
	TokenType = "fcd-dispatch+jwt"
	// Header carries the dispatch token on the HTTP request to the backend.
	Header = "Fcd-Dispatch-Token"
	// TargetHeader names the admitted pool, for gateways that route on it.
	TargetHeader = "Fcd-Target"
)

// Claims are the claims of a dispatch token. Every field is required; a
// token with a claim missing, empty, or not listed here is refused.
type Claims struct {
	// Issuer is authzd's issuer name.
	Issuer string `json:"iss"`
	// Audience is the admitted backend pool.
	Audience string `json:"aud"`
	// Subject is the fcd session the call was formed in.
	Subject string `json:"sub"`
	// ID is the lease id; a backend accepts each id once (replay).
	ID        string `json:"jti"`
	IssuedAt  int64  `json:"iat"`
	NotBefore int64  `json:"nbf"`
	Expiry    int64  `json:"exp"`

	// Formation is the formation id.
	Formation string `json:"fcd_formation"`
	// Tool is "server/tool".
	Tool string `json:"fcd_tool"`
	// ArgumentDigest is [ArgumentDigest] of the formed call.
	ArgumentDigest string `json:"fcd_args"`
	// Epoch is the admitted target epoch.
	Epoch string `json:"fcd_epoch"`
	// Artifact identifies the admitted code: its digest when pinned, else
	// its image reference.
	Artifact string `json:"fcd_artifact"`
	// Config is the admitted configuration digest.
	Config string `json:"fcd_config"`
	// Generation is the pool's backend generation at admission.
	Generation int64 `json:"fcd_generation"`
	// Revision and Cluster are the etcd revision of the admission and the
	// etcd cluster id: the fencing token of the admission.
	Revision int64  `json:"fcd_revision"`
	Cluster  string `json:"fcd_cluster"`
	// Admitted is when the lease was admitted (Unix milliseconds). Every token
	// of one lease carries the same value, also one re-issued later: a
	// fence without authzd refuses tokens of leases admitted before its
	// process started.
	Admitted int64 `json:"fcd_admitted"`
	// RecoveryOf is set on the token of a recovery only (the one claim a
	// token may lack): the first formation of the recovery chain, the same
	// on every attempt's token. A backend deduplicates on it — on
	// Formation when it is empty — so a recovered effect that did run
	// once is not run again ([Claims.IdempotencyKey]).
	RecoveryOf string `json:"fcd_recovery_of,omitempty"`

	// ClaimID is not a claim of the token: [Verifier.Verify] sets it when
	// it claimed the lease in authzd for this call (a [Verifier.Claimer]
	// is set). Report the call's outcome under it.
	ClaimID string `json:"-"`
}

// IdempotencyKey is the key a backend deduplicates a call's effect on
// across recovery attempts: RecoveryOf for a recovery, else Formation.
// The upstream of `fencecheck proxy` receives it as the RecoveryHeader
// (only for a recovery).
func (c *Claims) IdempotencyKey() string {
	if c.RecoveryOf != "" {
		return c.RecoveryOf
	}
	return c.Formation
}

// Validate reports the first required claim that is missing or empty,
// checking in the order the fields are declared, so the same claims always
// give the same error.
func (c *Claims) Validate() error {
	for _, f := range []struct {
		name string
		v    string
	}{
		{"iss", c.Issuer}, {"aud", c.Audience}, {"sub", c.Subject}, {"jti", c.ID},
	} {
		if f.v == "" {
			return fmt.Errorf("claim %s is missing", f.name)
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"iat", c.IssuedAt}, {"nbf", c.NotBefore}, {"exp", c.Expiry},
	} {
		if f.v <= 0 {
			return fmt.Errorf("claim %s is missing", f.name)
		}
	}
	for _, f := range []struct {
		name string
		v    string
	}{
		{"fcd_formation", c.Formation}, {"fcd_tool", c.Tool}, {"fcd_args", c.ArgumentDigest},
		{"fcd_epoch", c.Epoch}, {"fcd_artifact", c.Artifact}, {"fcd_config", c.Config},
	} {
		if f.v == "" {
			return fmt.Errorf("claim %s is missing", f.name)
		}
	}
	if c.Generation < 0 {
		return fmt.Errorf("claim fcd_generation is negative")
	}
	if c.Revision <= 0 {
		return fmt.Errorf("claim fcd_revision is missing")
	}
	if c.Cluster == "" {
		return fmt.Errorf("claim fcd_cluster is missing")
	}
	if c.Admitted <= 0 {
		return fmt.Errorf("claim fcd_admitted is missing")
	}
	return nil
}
