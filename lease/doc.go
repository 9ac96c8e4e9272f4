// Package lease is fcd's whole store on etcd, not only its leases: epochs
// and their lifecycle, immutable catalog snapshots, formations, leases
// (their markers, claims and outcomes), session ledgers, pool
// generations, compatibility certificates, the published signing keys,
// the audit trail's cursors and the history the trail follows; and the
// embedded etcd member. The name is the one that stuck: the lease
// lifecycle is the part every other one is ordered against.
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
// What etcd holds is the store's own: keys.go builds and documents every
// key (what it holds, who writes it, how long it lives); stored.go defines
// the value of each, a private type with a format version ("v"), converted
// from and to package record's types at this package's edge, so that the
// REST API's and the trail's JSON (record's) can change without a data
// migration. A value of an unknown version is refused, never guessed at.
//
// The files, by concern: store.go (Open, errors), keys.go, stored.go;
// epoch.go (register, drain, retire), snapshot.go, formation.go (and the
// retention of records), certificate.go; admission.go (the admission
// transaction), claim.go, close.go (outcomes and releases), reissue.go,
// resolution.go, generation.go (pool generations and their releases),
// sweep.go (leases never reported); actor.go (who made a change), follow.go
// (the history as changes, for the trail), compact.go (compaction held
// back by the trails' cursors), jwks.go; commit.go (group commit);
// embed*.go, restore.go, maintenance.go, health.go, endpoints.go, reach.go,
// exposure.go, rbac.go (the embedded member and operating etcd).
//
// Nothing above this package builds etcd keys or sees clientv3 types. When
// etcd cannot answer (unreachable, no quorum, timeout), operations fail
// with [record.ErrUnavailable]: callers must fail closed.
package lease
