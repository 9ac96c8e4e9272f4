package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
)

// Errors of admission and the lease lifecycle.
var (
	// ErrFormationChanged: the formation changed between read and admission
	// (a concurrent admission or approval); read it again.
	ErrFormationChanged = errors.New("lease: formation changed concurrently")
	// ErrGenerationChanged: the pool's generation changed during admission.
	ErrGenerationChanged = errors.New("lease: pool generation changed concurrently")
	// ErrCertificateChanged: the certificate a successor admission relies
	// on changed (was revoked) during admission; read it again.
	ErrCertificateChanged = errors.New("lease: certificate changed concurrently")
)

// NewLeaseID returns a fresh random lease id ("ls_" and 26 base32
// characters).
func NewLeaseID() (string, error) { return randomID("ls_") }

// GetFormationRevision returns a formation and the etcd revision it was
// last written at, for a later compare-and-swap.
func (s *Store) GetFormationRevision(ctx context.Context, id string) (*record.Formation, int64, error) {
	return s.getFormation(ctx, id)
}

// AdmitRequest is one admission: the formation as read (and its
// revision), the lease to open, and the session-ledger conditions.
type AdmitRequest struct {
	Formation    *record.Formation
	FormationRev int64
	Lease        *record.Lease
	// Requires must all have completed in the session; Exclusive must be
	// neither admitted nor completed there ("server/tool" names).
	Requires  []string
	Exclusive []string
	// StaleSource and Certificate are set for an admission to the
	// formation's successor only: the source epoch must be STALE and the
	// certificate record unchanged since it was read (Revision), both in
	// the same transaction as everything else.
	StaleSource string
	Certificate *record.Certificate
}

// Admit opens a lease in one etcd transaction that checks, against
// everything written before it in etcd's order: the formation is as read
// (ready, not yet admitted), the target epoch is ACTIVE, every required
// tool has completed in the session, no exclusive tool is admitted or
// completed there, and the pool generation is the one in the lease. It
// writes the lease marker under the target epoch, the lease index, the
// session ledger entry and the formation (status admitted, lease id), so a
// drain either commits before it (and it fails) or after it (and the
// marker holds retirement back).
//
// On success the lease's Revision and Cluster are set. A compare that
// fails is reported as *StateError (epoch not ACTIVE), *DependencyError,
// ErrFormationChanged or ErrGenerationChanged. ErrUnavailable means the
// outcome is unknown: read the formation back before answering.
func (s *Store) Admit(ctx context.Context, req AdmitRequest) (err error) {
	ctx, span := startTxnSpan(ctx, "lease.admit", attribute.String("fcd.lease", req.Lease.ID), attribute.String("fcd.epoch", req.Lease.Target.Epoch))
	defer func() { endTxnSpan(span, req.Lease.Revision, err) }()
	f, l := req.Formation, req.Lease
	l.State = record.LeaseAdmitted
	skey, ekey := s.k.formationState(f.ID), s.k.state(l.Target.Epoch)
	gkey := s.k.generation(l.Target.Pool)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(skey), "=", req.FormationRev),
		clientv3.Compare(clientv3.CreateRevision(s.k.formationOutcome(f.ID)), "=", 0),
		clientv3.Compare(clientv3.Value(ekey), "=", string(record.StateActive)),
	}
	if l.Generation == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(gkey), "=", 0))
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(gkey), "=", formatGeneration(l.Generation)))
	}
	for _, t := range req.Requires {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.k.completed(l.Session, t)), ">", 0))
	}
	for _, t := range req.Exclusive {
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(s.k.completed(l.Session, t)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.failed(l.Session, t)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.admittedTool(l.Session, t)), "=", 0).WithPrefix())
	}
	if req.StaleSource != "" {
		if req.Certificate == nil {
			return fmt.Errorf("lease: a successor admission needs its certificate")
		}
		cmps = append(cmps,
			clientv3.Compare(clientv3.Value(s.k.state(req.StaleSource)), "=", string(record.StateStale)),
			clientv3.Compare(clientv3.ModRevision(s.certificateKey(req.Certificate)), "=", req.Certificate.Revision))
	}
	lval, err := encodeStored("lease", toStoredMarker(l, req.Requires, req.Exclusive))
	if err != nil {
		return err
	}
	f.Status, f.Lease, f.UpdatedAt = record.StatusAdmitted, l.ID, l.AdmittedAt
	state, err := encodeState(f)
	if err != nil {
		return err
	}
	resp, err := s.txn(ctx, txn{cmps: cmps, then: []clientv3.Op{
		clientv3.OpPut(s.k.marker(l.Target.Epoch, l.ID), lval),
		// No lease option: the marker, the lease index and the ledger
		// entry live until the lease closes.
		clientv3.OpPut(s.k.lease(l.ID), indexValue(l.Target.Epoch, f.ID)),
		clientv3.OpPut(s.k.admitted(l.Session, l.Tool, l.ID), l.Tool),
		// Only the small state changes; the call record stays as formed.
		// (A ready formation has no pending-approval entry: the approval
		// that made it ready removed it.)
		clientv3.OpPut(skey, state, clientv3.WithIgnoreLease()),
	}})
	if err != nil {
		return s.wrap(ctx, "admit", err)
	}
	if resp.Succeeded {
		l.Revision, l.Cluster = resp.Header.Revision, clusterID(resp.Header.ClusterId)
		return nil
	}
	return s.diagnoseAdmit(ctx, req)
}

// diagnoseAdmit tells which condition of a failed admission did not hold.
func (s *Store) diagnoseAdmit(ctx context.Context, req AdmitRequest) error {
	l := req.Lease
	ops := []clientv3.Op{
		clientv3.OpGet(s.k.formationState(req.Formation.ID), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.k.state(l.Target.Epoch)),
		clientv3.OpGet(s.k.generation(l.Target.Pool)),
	}
	for _, t := range req.Requires {
		ops = append(ops, clientv3.OpGet(s.k.completed(l.Session, t), clientv3.WithKeysOnly()))
	}
	for _, t := range req.Exclusive {
		ops = append(ops, clientv3.OpGet(s.k.completed(l.Session, t), clientv3.WithKeysOnly()),
			clientv3.OpGet(s.k.failed(l.Session, t), clientv3.WithKeysOnly()),
			clientv3.OpGet(s.k.admittedTool(l.Session, t), clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	if req.StaleSource != "" {
		ops = append(ops, clientv3.OpGet(s.k.state(req.StaleSource)),
			clientv3.OpGet(s.certificateKey(req.Certificate), clientv3.WithKeysOnly()))
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(ops...).Commit()
	if err != nil {
		return s.wrap(ctx, "diagnose admission", err)
	}
	r := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	if f := r(0); len(f) == 0 || f[0].ModRevision != req.FormationRev {
		return ErrFormationChanged
	}
	if st := r(1); len(st) == 0 {
		return fmt.Errorf("%w: %s", record.ErrEpochNotFound, l.Target.Epoch)
	} else if record.State(st[0].Value) != record.StateActive {
		return &record.StateError{Epoch: l.Target.Epoch, State: record.State(st[0].Value), Want: record.StateActive}
	}
	g := r(2)
	if (l.Generation == 0 && len(g) > 0) || (l.Generation != 0 && (len(g) == 0 || string(g[0].Value) != formatGeneration(l.Generation))) {
		return ErrGenerationChanged
	}
	i := 3
	for _, t := range req.Requires {
		if len(r(i)) == 0 {
			return &record.DependencyError{Tool: t}
		}
		i++
	}
	for _, t := range req.Exclusive {
		if len(r(i)) > 0 || len(r(i+1)) > 0 || len(r(i+2)) > 0 {
			return &record.DependencyError{Tool: t, Exclusive: true}
		}
		i += 3
	}
	if req.StaleSource != "" {
		if st := r(i); len(st) == 0 || record.State(st[0].Value) != record.StateStale {
			got := record.State("")
			if len(st) > 0 {
				got = record.State(st[0].Value)
			}
			return &record.StateError{Epoch: req.StaleSource, State: got, Want: record.StateStale}
		}
		if c := r(i + 1); len(c) == 0 || c[0].ModRevision != req.Certificate.Revision {
			return ErrCertificateChanged
		}
	}
	// Every condition holds now: something changed and changed back.
	return ErrFormationChanged
}

// indexValue is the value of a lease's index key: its epoch and formation,
// in one fixed encoding, so that a compare of the value proves both.
func indexValue(epoch, formation string) string {
	b, _ := json.Marshal(&storedIndex{ver: current, Epoch: epoch, Formation: formation})
	return string(b)
}

// indexEpoch reads a lease index value's epoch: a stored index, or the
// bare epoch id fcd wrote before the index held the formation.
func indexEpoch(key, v []byte) (string, error) {
	if len(v) == 0 || v[0] != '{' {
		return string(v), nil
	}
	var ix storedIndex
	if err := decodeStored(key, v, &ix); err != nil {
		return "", err
	}
	return ix.Epoch, nil
}

func clusterID(id uint64) string { return strconv.FormatUint(id, 16) }
