// Package manifest defines the documents fcd trusts: Tool+ descriptors (MCP
// tools extended with MCP+ metadata) and the registrar-signed registration
// manifests that bind a server's tools to everything that can change the
// meaning of a call.
//
// The package owns three things every other layer relies on:
//
//   - canonical JSON (RFC 8785) and the "sha256:<hex>" digests computed over
//     it, so that an epoch id or descriptor digest is the same wherever it is
//     computed;
//   - strict decoding: an unknown, duplicated or case-folded member is an
//     error, never silently ignored, because a signed document must mean
//     exactly what its signer saw;
//   - JWS signing and verification against a configured set of trusted
//     public keys, and the MCP+ lint that judges whether a manifest describes
//     its tools well enough to be registered.
//
// It imports only the standard library and small libraries; it knows
// nothing of etcd, HTTP or policy engines.
package manifest
