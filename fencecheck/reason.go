package fencecheck

import (
	"errors"
	"fmt"
)

// Reason names why a dispatch token was refused. Every refusal has exactly
// one reason; the values are stable and appear in logs, in the JSON-RPC
// error the middleware answers (error.data.reason), and in the table of
// fencecheck/README.md.
type Reason string

// Reasons of [Verifier.Verify], in the order the checks run. The first
// failing check decides the reason.
const (
	// ReasonMisconfigured: the Verifier lacks Pool, Artifact, Config or a
	// key source (or has both a static set and a JWKS URL); every token is
	// refused until it is configured.
	ReasonMisconfigured Reason = "misconfigured"
	// ReasonMissing: no token at all.
	ReasonMissing Reason = "missing"
	// ReasonMalformed: not a JWS compact serialization (three base64url
	// parts), too long, or a protected header that is not a JSON object
	// of exactly the members alg, typ and kid (strings, each once). A JWS
	// JSON serialization is refused with this reason, and so are two
	// token headers on one request (middleware).
	ReasonMalformed Reason = "malformed"
	// ReasonAlgorithm: the header alg is not on the allow-list (EdDSA,
	// ES256) — "none" and every HMAC algorithm included — or it does not
	// fit the kind of the key the kid names.
	ReasonAlgorithm Reason = "algorithm"
	// ReasonType: the header typ is not [TokenType].
	ReasonType Reason = "type"
	// ReasonKeyID: the header has no kid.
	ReasonKeyID Reason = "key_id"
	// ReasonUnknownKey: no trusted key has the kid, after at most one
	// refresh of the JWKS.
	ReasonUnknownKey Reason = "unknown_key"
	// ReasonKeySource: the keys could not be obtained (JWKS unreachable,
	// an error status, an unusable document, or keys older than
	// MaxKeyAge that could not be refreshed). Fail closed.
	ReasonKeySource Reason = "key_source"
	// ReasonSignature: the signature does not verify.
	ReasonSignature Reason = "signature"
	// ReasonClaims: the payload is not a JSON object of exactly the claims
	// of [Claims] (unknown claim, duplicate member, wrong type, missing or
	// empty claim).
	ReasonClaims Reason = "claims"
	// ReasonIssuer: iss is not the configured Issuer.
	ReasonIssuer Reason = "issuer"
	// ReasonAudience: aud is not this backend's Pool.
	ReasonAudience Reason = "audience"
	// ReasonExpired: now is at or after exp plus the skew.
	ReasonExpired Reason = "expired"
	// ReasonNotYetValid: now plus the skew is before nbf.
	ReasonNotYetValid Reason = "not_yet_valid"
	// ReasonIssuedInFuture: iat is later than now plus the skew.
	ReasonIssuedInFuture Reason = "issued_in_future"
	// ReasonLifetime: exp is not after iat, or exp-iat exceeds MaxLifetime.
	ReasonLifetime Reason = "lifetime"
	// ReasonArtifact: fcd_artifact is not this backend's Artifact.
	ReasonArtifact Reason = "artifact"
	// ReasonConfig: fcd_config is not this backend's Config.
	ReasonConfig Reason = "config"
	// ReasonGeneration: fcd_generation is not this backend's Generation.
	ReasonGeneration Reason = "generation"
	// ReasonTool: the call's tool is not fcd_tool.
	ReasonTool Reason = "tool"
	// ReasonArguments: the digest of the call's arguments is not fcd_args,
	// or the arguments cannot be digested (not one JSON object, duplicate
	// member, a number the canonical form cannot carry exactly).
	ReasonArguments Reason = "arguments"
	// ReasonAdmittedBeforeStart: offline mode only (no Claimer): the
	// token's lease was admitted before this process started (plus the
	// skew), so an earlier process may have run it.
	ReasonAdmittedBeforeStart Reason = "admitted_before_start"
	// ReasonReplay: the jti was accepted before by this process, or
	// (online mode) another call claimed the lease in authzd.
	ReasonReplay Reason = "replay"
	// ReasonReplayStore: the replay store could not record the jti (full
	// of live entries, or failing). Fail closed.
	ReasonReplayStore Reason = "replay_store"
	// ReasonLeaseClosed: online mode: authzd says the lease is closed
	// (completed, rejected, released), uncertain, or unknown.
	ReasonLeaseClosed Reason = "lease_closed"
	// ReasonClaimUnavailable: online mode: the lease could not be claimed
	// (authzd unreachable, failing, or refusing the credential). Fail
	// closed: nothing runs without its claim.
	ReasonClaimUnavailable Reason = "claim_unavailable"
	// ReasonBatch: a JSON-RPC batch holds a tools/call. Only the
	// middleware uses it: a batch cannot carry one token per call.
	ReasonBatch Reason = "batch"
)

// Reasons of [ReadMessage]: the request body, read before any token. A
// body refused with one of them never reaches an admission or an effect.
const (
	// ReasonParse: the body is not JSON (HTTP 400, JSON-RPC -32700).
	ReasonParse Reason = "parse"
	// ReasonInvalidRequest: JSON, but not a request fcd can read: neither
	// an object nor a batch, a method that is not a string, a tools/call
	// whose params is not an object, whose params.name is not a string,
	// whose arguments or _meta is not an object (HTTP 400, -32600).
	ReasonInvalidRequest Reason = "invalid_request"
	// ReasonEncoding: invalid UTF-8, or a \u escape of a lone surrogate;
	// parsers replace, keep or refuse them differently.
	ReasonEncoding Reason = "encoding"
	// ReasonDuplicateMember: an object, anywhere in the body, has a member
	// name twice; parsers keep the first, the last, or refuse.
	ReasonDuplicateMember Reason = "duplicate_member"
	// ReasonMemberCase: a member equals a name fcd reads only under case
	// folding ("Arguments", "argumentſ"), or the method equals tools/call
	// only under folding; a case-insensitive parser would read it, the MCP
	// SDKs would not.
	ReasonMemberCase Reason = "member_case"
	// ReasonNameCollision: two member names of the arguments, at any
	// depth, fold alike ("visibility", "viſibility").
	ReasonNameCollision Reason = "name_collision"
	// ReasonHeaders: the Mcp-Method or Mcp-Name header disagrees with the
	// body; a server dispatching on the headers would run another call.
	ReasonHeaders Reason = "mcp_headers"
)

// RejectError is the error of every refusal by [Verifier.Verify] and the
// middleware. Match it with errors.As; Reason is stable, Detail is for
// people and logs (it never holds the token).
type RejectError struct {
	Reason Reason
	Detail string
	// Formation is the token's fcd_formation when its signature verified
	// (the reasons from issuer on): which call was refused, for the host.
	// Empty otherwise — nothing unverified is repeated back.
	Formation string
}

func (e *RejectError) Error() string {
	if e.Detail == "" {
		return "fencecheck: token rejected: " + string(e.Reason)
	}
	return "fencecheck: token rejected: " + string(e.Reason) + ": " + e.Detail
}

// ReasonOf returns the reason of a [RejectError] in err's chain, or "" if
// there is none.
func ReasonOf(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

func reject(r Reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// retryAfter is the seconds after which the same request may pass, for
// the reasons that are transient (the fence failed closed for want of its
// keys, its replay store or authzd); 0 for the others, which no retry of
// the same request cures.
func (r Reason) retryAfter() int {
	switch r {
	case ReasonKeySource, ReasonReplayStore, ReasonClaimUnavailable:
		return 1
	}
	return 0
}
