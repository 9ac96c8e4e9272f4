// Package fencecheck is the guard at a backend's effect path: it verifies
// fcd dispatch tokens before the effect runs. Backends embed it: it is a
// module of its own that depends only on the standard library, jwx and the
// canonical-JSON library, and never pulls OPA, Cedar, etcd or gRPC. Its
// API holds standard-library types only (keys are crypto.PublicKey
// values); package fencechecktest signs tokens for a backend's tests.
//
// A [Verifier] knows what this backend is (pool, artifact, configuration
// digest, generation) and whom it trusts (a static key set, which
// [ParseJWKS] reads from a JWKS document, or authzd's JWKS URL). [Verifier.Verify] accepts a token only if it is a compact JWS
// with an allowed algorithm, typ "fcd-dispatch+jwt" and a trusted kid,
// carries exactly the [Claims], names this backend, is within its
// lifetime, was issued for the very call received (tool and
// [ArgumentDigest]), and was not used before. Every refusal is a
// [*RejectError] with a stable [Reason].
//
// [Verifier.Middleware] applies the verifier to an MCP streamable-HTTP
// server: each JSON-RPC tools/call must carry its token in the
// Fcd-Dispatch-Token header or is answered 403 before the handler runs;
// the outcome of each verified call is sent to authzd by a [Reporter].
// The fencecheck command runs the same middleware as a sidecar proxy.
//
// The argument digest ([ArgumentDigest]) lives here because the issuer
// (authzd) and the verifier must compute it with the very same function:
// a call is admitted with the digest of what the model formed, and the
// backend recomputes it from what it actually received.
//
// fencecheck/README.md documents every reason and the reporting rules.
package fencecheck
