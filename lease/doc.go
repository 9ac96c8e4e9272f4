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
// Nothing above this package builds etcd keys or sees clientv3 types. When
// etcd cannot answer (unreachable, no quorum, timeout), operations fail
// with [record.ErrUnavailable]: callers must fail closed.
package lease
