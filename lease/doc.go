// Package lease is fcd's ordered store on etcd: epochs and their lifecycle,
// immutable catalog snapshots, formations, leases (their markers, claims
// and outcomes), session ledgers, pool generations, compatibility
// certificates and the published signing keys. The records it stores are
// package record's.
//
// Every state change that another change must be ordered against is one
// etcd transaction (If/Then/Else), so that etcd's serial order is fcd's
// order: a drain that commits before an admission stops it, and an epoch
// becomes STALE only in a transaction that proves no lease marker exists
// under it. Lease markers are one key per admission under their epoch,
// never a shared per-epoch record, so admissions do not contend on a key.
//
// Writes carry the bytes of what changed: a formation's immutable call is
// written once, its approvals and admission rewrite a small state key, and
// its lease's outcome lands on a key of its own (formation.go). Concurrent
// writes are group-committed: one etcd transaction of nested per-item
// transactions, each with its own compares, without delaying a lone write
// (commit.go). The common outcome report is one such transaction with no
// read before it, its token's facts proven by its compares (CloseLease).
//
// Nothing above this package builds etcd keys or sees clientv3 types. When
// etcd cannot answer (unreachable, no quorum, timeout), operations fail
// with [record.ErrUnavailable]: callers must fail closed.
package lease
