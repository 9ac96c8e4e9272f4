package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// This file turns etcd's revision history of fcd's keyspace into the
// changes the audit trail records (authz's Follower). The trail follows the
// store instead of the requests: whatever etcd committed is in its history,
// whether or not the request that made the commit got its answer (a commit
// that outlived its deadline, an answer lost on the way, a replica that
// died between the commit and the answer). What only the request knew —
// who asked, why, under which claim — is written into the values of the
// change itself (closure, storedNote, storedClaim, storedMarker, the formation's
// decision), so the history alone tells the whole story.

// Commit is what one etcd revision changed in fcd's keyspace, as far as
// the audit trail speaks of it: zero or more changes, in the order of the
// transaction's operations.
type Commit struct {
	Revision int64
	Changes  []Change
}

// Change is one state change of a Commit: one of the *Change types below.
type Change interface{ change() }

type (
	// EpochRegistered: a signed manifest registered a new epoch.
	EpochRegistered struct{ Epoch *record.Epoch }
	// EpochChanged: an epoch drained (StateDraining) or retired
	// (StateStale), by the credential id in By.
	EpochChanged struct {
		Epoch string
		State record.State
		By    string
	}
	// SnapshotCreated: a new catalog snapshot.
	SnapshotCreated struct{ Snapshot *record.Snapshot }
	// FormationCreated: a call formed and decided, as first stored.
	FormationCreated struct{ Formation *record.Formation }
	// FormationApproved: an approval or denial added to a formation; Status
	// is the status it led to.
	FormationApproved struct {
		Formation string
		Approval  record.Approval
		Status    record.Status
	}
	// LeaseAdmitted: a lease opened, with the session dependencies its
	// admission checked.
	LeaseAdmitted struct {
		Lease              *record.Lease
		Requires, Excludes []string
	}
	// LeaseClaimed: a backend claimed a lease before the effect.
	LeaseClaimed struct {
		Lease, Claim, Epoch string
		Admission           int64
		At                  time.Time
	}
	// LeaseClosed: a lease closed or turned uncertain. Resolution is the
	// operator's signed resolution kept with it, if any.
	LeaseClosed struct {
		Formation  string
		Outcome    record.Outcome
		Lease      string
		Claim      string
		By         string
		Operator   string
		Reason     string
		Generation int64
		Resolution string
		At         time.Time
	}
	// LeaseReadmitted: a dispatch token issued again for an open lease
	// (a retried admission), expiring at Expires.
	LeaseReadmitted struct {
		Lease, Formation string
		At, Expires      time.Time
	}
	// GenerationSet: a newer backend generation of a pool.
	GenerationSet struct {
		Pool       string
		Generation int64
		By         string
	}
	// CertificateRegistered: a compatibility certificate registered.
	CertificateRegistered struct{ Certificate *record.Certificate }
	// CertificateRevoked: a certificate revoked by By.
	CertificateRevoked struct{ Certificate, By string }
	// PolicyRecorded: a replica put a policy set in force, or refused one
	// (Kind is the policy manager's event kind; Data its event).
	PolicyRecorded struct {
		Replica, Kind string
		Data          json.RawMessage
	}
)

func (EpochRegistered) change()       {}
func (EpochChanged) change()          {}
func (SnapshotCreated) change()       {}
func (FormationCreated) change()      {}
func (FormationApproved) change()     {}
func (LeaseAdmitted) change()         {}
func (LeaseClaimed) change()          {}
func (LeaseClosed) change()           {}
func (LeaseReadmitted) change()       {}
func (GenerationSet) change()         {}
func (CertificateRegistered) change() {}
func (CertificateRevoked) change()    {}
func (PolicyRecorded) change()        {}

// HistoryCompactedError is returned by Follow when the revisions it was to
// start from were compacted away: the changes between From and Compacted
// are lost to whoever follows. Follow resumes from Compacted when called
// again with it.
type HistoryCompactedError struct{ From, Compacted int64 }

func (e *HistoryCompactedError) Error() string {
	return fmt.Sprintf("lease: etcd history from revision %d compacted up to %d", e.From, e.Compacted)
}

// Follow calls apply with every commit to fcd's keyspace from revision
// from on, in revision order, each once, until ctx ends or apply fails
// (its error is returned). A revision that changed nothing the trail
// speaks of still reaches apply, with no changes, so that the caller's
// position advances. Transient watch failures are retried from the next
// revision; history compacted before from is a *HistoryCompactedError.
//
// progress, if not nil, is called with the store's revision each time the
// watch reports one: synced is true for a progress notification, which
// says every commit up to rev reached apply (Follow asks for one every
// second); false for the header of a response with events, which says
// only that the store is at rev (etcd sends a long catch-up in batches,
// each headed by the store's revision).
func (s *Store) Follow(ctx context.Context, from int64, apply func(Commit) error, progress func(rev int64, synced bool)) error {
	if from < 1 {
		from = 1
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := s.cli.Watch(wctx, s.k.p, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV(),
			clientv3.WithProgressNotify())
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case <-tick.C:
					_ = s.cli.RequestProgress(wctx)
				}
			}
		}()
		err := s.follow(wctx, wch, &from, apply, progress)
		cancel()
		var hc *HistoryCompactedError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &hc), errors.Is(err, errApply):
			return err
		case err != nil:
			s.log.Warn("store history: watch interrupted; resuming", "revision", from, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return ctx.Err()
}

// errApply marks an error of apply, which ends Follow.
var errApply = errors.New("lease: follow")

func (s *Store) follow(ctx context.Context, wch clientv3.WatchChan, from *int64, apply func(Commit) error, progress func(int64, bool)) error {
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return &HistoryCompactedError{From: *from, Compacted: resp.CompactRevision}
		}
		if err := resp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return &HistoryCompactedError{From: *from, Compacted: resp.CompactRevision}
			}
			return err
		}
		for evs := range byRevision(resp.Events) {
			rev := evs[0].Kv.ModRevision
			c := Commit{Revision: rev, Changes: s.changes(rev, evs)}
			if err := apply(c); err != nil {
				return fmt.Errorf("%w: revision %d: %w", errApply, rev, err)
			}
			*from = rev + 1
		}
		if resp.Header.Revision <= 0 {
			continue
		}
		synced := resp.IsProgressNotify()
		if synced {
			*from = max(*from, resp.Header.Revision+1)
		}
		if progress != nil {
			progress(resp.Header.Revision, synced)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("watch closed")
}

// byRevision yields the events of one revision at a time (etcd never
// splits a revision across watch responses).
func byRevision(evs []*clientv3.Event) func(func([]*clientv3.Event) bool) {
	return func(yield func([]*clientv3.Event) bool) {
		for i := 0; i < len(evs); {
			j := i + 1
			for j < len(evs) && evs[j].Kv.ModRevision == evs[i].Kv.ModRevision {
				j++
			}
			if !yield(evs[i:j]) {
				return
			}
			i = j
		}
	}
}

// changes decodes one revision's events. A value that does not decode is
// logged and left out: the store wrote it, so it is a bug or an edit of
// etcd by someone else, which the trail cannot describe.
func (s *Store) changes(rev int64, evs []*clientv3.Event) []Change {
	puts := map[string]*mvccpb.KeyValue{}
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypePut {
			puts[string(ev.Kv.Key)] = ev.Kv
		}
	}
	var out []Change
	add := func(c Change, err error) {
		switch {
		case err != nil:
			s.log.Error("store history: a change does not decode", "revision", rev, "err", err)
		case c != nil:
			out = append(out, c)
		}
	}
	for _, ev := range evs {
		if ev.Type != clientv3.EventTypePut {
			continue
		}
		kv := ev.Kv
		kind, id, ok := s.k.kind(string(kv.Key))
		if !ok {
			continue
		}
		switch kind {
		case segEpochs:
			if kv.Version == 1 {
				add(s.epochRegistered(kv))
			}
		case segNotes:
			if !strings.HasPrefix(id, noteRestores+"/") {
				add(s.noted(id, kv, puts))
			}
		case segSnapshots:
			if kv.Version == 1 {
				var snap storedSnapshot
				err := decodeStored(kv.Key, kv.Value, &snap)
				add(SnapshotCreated{Snapshot: snap.snapshot()}, err)
			}
		case segFormations:
			if kv.Version == 1 {
				add(s.formationCreated(id, kv, puts))
			}
		case segFormationStates:
			if kv.Version > 1 && ev.PrevKv != nil {
				cs, err := approvals(id, ev.PrevKv, kv)
				add(nil, err)
				for _, c := range cs {
					add(c, nil)
				}
			}
		case segFormationOutcomes:
			add(s.leaseClosed(id, kv, puts))
		case segMarkers:
			if kv.Version == 1 {
				m, err := decodeMarker(kv.Key, kv.Value)
				if err != nil {
					add(nil, err)
					continue
				}
				l := m.lease()
				l.Revision = kv.ModRevision
				add(LeaseAdmitted{Lease: l, Requires: m.Requires, Excludes: m.Exclusive}, nil)
			}
		case segClaims:
			if kv.Version == 1 {
				lid, _, _ := strings.Cut(id, "/")
				c, err := decodeClaim(kv.Key, kv.Value)
				if err != nil {
					add(nil, err)
					continue
				}
				add(LeaseClaimed{Lease: lid, Claim: c.ID, Epoch: c.Epoch, Admission: c.Admission, At: c.At}, nil)
			}
		case segCertificates:
			if kv.Version == 1 {
				var c storedCertificate
				err := decodeStored(kv.Key, kv.Value, &c)
				add(CertificateRegistered{Certificate: c.certificate(kv.ModRevision)}, err)
			}
		case segReissues:
			var r storedReissue
			err := decodeStored(kv.Key, kv.Value, &r)
			add(LeaseReadmitted{Lease: id, Formation: r.Formation, At: r.At, Expires: r.Expires}, err)
		case segPolicyEvents:
			var p storedPolicyEvent
			err := decodeStored(kv.Key, kv.Value, &p)
			add(PolicyRecorded{Replica: id, Kind: p.Kind, Data: p.Data}, err)
		}
	}
	return out
}

func (s *Store) epochRegistered(kv *mvccpb.KeyValue) (Change, error) {
	r, err := decodeRecord(kv)
	if err != nil {
		return nil, err
	}
	ep, err := r.epoch(kv.ModRevision, record.StateActive, false)
	if err != nil {
		return nil, err
	}
	return EpochRegistered{Epoch: ep}, nil
}

// noted turns a note into the change it was written with: a drain or
// retire, a revocation, a generation.
func (s *Store) noted(id string, kv *mvccpb.KeyValue, puts map[string]*mvccpb.KeyValue) (Change, error) {
	var n storedNote
	if err := decodeStored(kv.Key, kv.Value, &n); err != nil {
		return nil, err
	}
	kind, subject, _ := strings.Cut(id, "/")
	switch kind {
	case noteEpochs:
		// Written with the state's put; a note is never rewritten alone.
		if _, ok := puts[s.k.state(subject)]; ok {
			return EpochChanged{Epoch: subject, State: record.State(n.State), By: n.By}, nil
		}
	case noteCertificates:
		return CertificateRevoked{Certificate: subject, By: n.By}, nil
	case noteGenerations:
		return GenerationSet{Pool: subject, Generation: n.Generation, By: n.By}, nil
	}
	return nil, nil
}

func (s *Store) formationCreated(id string, kv *mvccpb.KeyValue, puts map[string]*mvccpb.KeyValue) (Change, error) {
	state := puts[s.k.formationState(id)]
	if state == nil {
		return nil, fmt.Errorf("formation %s: created without its state", id)
	}
	f, err := storedFormation{call: kv, state: state}.decode()
	if err != nil {
		return nil, err
	}
	return FormationCreated{Formation: f}, nil
}

// approvals are the approvals a state write added.
func approvals(id string, prev, cur *mvccpb.KeyValue) ([]Change, error) {
	var before, after storedFormationState
	if err := decodeStored(prev.Key, prev.Value, &before); err != nil {
		return nil, err
	}
	if err := decodeStored(cur.Key, cur.Value, &after); err != nil {
		return nil, err
	}
	var out []Change
	for _, a := range after.Approvals {
		if !slices.ContainsFunc(before.Approvals, func(b storedApproval) bool {
			return b.Approver == a.Approver && b.Decision == a.Decision && b.Digest == a.Digest
		}) {
			out = append(out, FormationApproved{Formation: id, Approval: record.Approval(a), Status: after.Status})
		}
	}
	return out, nil
}

func (s *Store) leaseClosed(fid string, kv *mvccpb.KeyValue, puts map[string]*mvccpb.KeyValue) (Change, error) {
	var o storedOutcome
	if err := decodeStored(kv.Key, kv.Value, &o); err != nil {
		return nil, err
	}
	c := LeaseClosed{Formation: fid, Outcome: o.Outcome, At: o.UpdatedAt}
	if o.Closure != nil {
		c.Lease, c.Claim, c.By, c.Operator, c.Reason, c.Generation = o.Closure.Lease, o.Closure.Claim, o.Closure.By,
			o.Closure.Operator, o.Closure.Reason, o.Closure.Generation
	}
	if c.Lease != "" {
		if r := puts[s.k.resolution(c.Lease)]; r != nil {
			c.Resolution = string(r.Value)
		}
	}
	return c, nil
}

// RecordPolicy writes the policy event of a replica (a policy set put in
// force or refused) into the store, for the audit trail: which set a
// replica decides with is part of the history every replica's trail
// follows. The key is the replica's: each write replaces its last one.
func (s *Store) RecordPolicy(ctx context.Context, replica, kind string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("lease: encode policy event: %w", err)
	}
	v, err := encodeStored("policy event", &storedPolicyEvent{ver: current, Kind: kind, Data: b})
	if err != nil {
		return err
	}
	octx, cancel := s.writeOp(ctx)
	defer cancel()
	_, err = s.cli.Put(octx, s.k.policyEvent(replica), v)
	return s.wrap(ctx, "record policy", err)
}

// Revision returns the store's current revision (a linearizable read).
func (s *Store) Revision(ctx context.Context) (int64, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.ping(), clientv3.WithCountOnly())
	if err != nil {
		return 0, s.wrap(ctx, "revision", err)
	}
	return resp.Header.Revision, nil
}
