// Package fencecheck is the guard at a backend's effect path: it verifies
// fcd dispatch tokens before the effect runs. Backends embed it, so it
// depends only on the standard library, jwx and the canonical-JSON
// library; it never pulls OPA, Cedar or etcd.
//
// The argument digest ([ArgumentDigest]) lives here because the issuer
// (authzd) and the verifier must compute it with the very same function:
// a call is admitted with the digest of what the model formed, and the
// backend recomputes it from what it actually received.
package fencecheck
