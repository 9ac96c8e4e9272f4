// Package server assembles fcd's authorization server — the store on the
// embedded etcd member or an external cluster, the audit trail, the
// policies, the use cases, the decision-log exporter, and the HTTP and
// Envoy ext_authz gRPC listeners — from one [Config], in the manner of
// etcd's embed package:
//
//	s, err := server.New(ctx, server.Config{DataDir: dir, RegistrarKeys: ..., Credentials: ...})
//	if err != nil { ... }
//	defer s.Close()
//	err = s.Run(ctx) // serves until ctx ends, then shuts down gracefully
//
// It exists so that the server is built in one place: `authzd serve`
// maps its flags and configuration file onto a Config (its flag defaults
// are this package's Default… values), and the benchmarks, the
// end-to-end stacks, the fault suite and the api tests build the same
// server through New instead of wiring the parts by hand, so that what
// they test and measure is what ships. A zero Config field means its
// default; a benchmark or test that turns a part off (the rate limit,
// the trail) says so in its Config and why.
//
// The settings are documented on [Config] and, for operators, by
// `authzd serve -h` and docs/configuration.md; the parts and the
// direction of imports in docs/packages.md (checked by
// internal/layout), the capacity defaults in docs/capacity.md, the store's
// operation and who may change what fcd trusts in docs/operations.md and
// docs/trust.md, decision logs in docs/decision-logs.md and the trail in
// docs/audit.md.
package server
