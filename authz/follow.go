package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrTrailBehind is returned for an admission or a claim while this
// replica's audit trail cannot keep the record: it cannot be written (a
// full disk, an I/O error), or it has fallen further behind the store than
// FollowerConfig.MaxLag. Nothing runs that the trail could not record; the
// call may be retried once it has caught up.
var ErrTrailBehind = public.New("authz", "the audit trail is behind the store")

// TrailEvent is one event the Follower appends.
type TrailEvent struct {
	Kind string
	// Schema is the version of Data's members (TrailSchema).
	Schema   int
	Revision int64
	// Time is when the store made the change where its value says, zero
	// where it does not (the trail then uses the time it writes it).
	Time time.Time
	Data any
}

// TrailWriter is the audit trail a Follower keeps (an *audit.Trail behind
// a small adapter): Append writes a revision's events together or not at
// all; Tail tells where the chain ends (the last event's revision and how
// many events at the end carry it); Err is a failure to sign or sync what
// was written.
type TrailWriter interface {
	Append(ctx context.Context, events []TrailEvent) error
	Tail() (revision int64, events int)
	Err() error
}

// DefaultMaxTrailLag is FollowerConfig.MaxLag's default.
const DefaultMaxTrailLag = 5 * time.Second

// FollowerConfig configures a [Follower].
type FollowerConfig struct {
	Store *lease.Store
	Trail TrailWriter
	// Replica names the trail's cursor in the store, which holds
	// compaction back to what the trail has recorded; empty writes none.
	Replica string
	// CursorInterval is how often the follower looks at its cursor; zero
	// means 100ms. It writes it once the trail pauses, and at most every
	// ten intervals while it advances (keepCursor).
	CursorInterval time.Duration
	// Arguments says what formation events keep of a call's arguments.
	Arguments TrailArguments
	// MaxLag bounds how long a commit may stay unrecorded before
	// admissions and claims are refused (ErrTrailBehind); zero means
	// DefaultMaxTrailLag.
	MaxLag time.Duration
	// Observe, when set, is called with each commit once its events are
	// written, in revision order (a Notifier's Observe): it sees every
	// committed change, also after a crash, since the follower resumes
	// from what the trail recorded. It must not block.
	Observe func(context.Context, lease.Commit)
	Logger  *slog.Logger
	Now     func() time.Time
}

// Follower keeps a replica's audit trail as a projection of the store's
// history: it follows etcd's revisions of fcd's keyspace from the one its
// trail recorded last (lease.Store.Follow) and appends every change the
// trail speaks of, in revision order, once, with its revision. It cannot
// miss a commit: a commit is in etcd's history whether or not the request
// that made it got its answer, and the follower moves past a revision only
// once its events are written (docs/audit.md). Every replica's follower
// records the whole history, so each replica's chain is complete alone.
type Follower struct {
	cfg FollowerConfig
	log *slog.Logger
	now func() time.Time

	mu sync.Mutex
	// recorded is the last revision whose events are all written; head
	// the store's revision last reported by the watch.
	recorded, head int64
	// since is when the store last got ahead of the trail (recorded <
	// head since then): how long a commit can have waited unrecorded.
	since time.Time
	// err is why the last append failed (nil once one succeeded).
	err     error
	started bool
}

// NewFollower returns a follower of cfg.Store into cfg.Trail; Run runs it.
func NewFollower(cfg FollowerConfig) *Follower {
	if cfg.MaxLag <= 0 {
		cfg.MaxLag = DefaultMaxTrailLag
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Follower{cfg: cfg, log: log, now: cfg.Now, since: cfg.Now()}
}

// Run follows the store until ctx ends. A failed append is retried (the
// follower does not move past it) until it succeeds; compacted history is
// recorded as a gap and followed from where it resumes.
func (f *Follower) Run(ctx context.Context) error {
	rev, n := f.cfg.Trail.Tail()
	from, skip := rev, n // the last revision again, without what is written of it
	if rev == 0 {
		from, skip = 1, 0
	} else if f.cfg.Replica != "" {
		// The revisions after the last event that changed nothing the
		// trail records, and were recorded as far as the cursor says,
		// may be compacted (the cursor is what holds compaction back):
		// resume after the cursor. (A trail with no event at all starts
		// from the beginning whatever a cursor says: it is a new trail.)
		for {
			cur, ok, err := f.cfg.Store.TrailCursor(ctx, f.cfg.Replica)
			if err == nil {
				if ok && cur >= rev {
					from, skip = cur+1, 0
				}
				break
			}
			f.log.Warn("audit trail: cursor not read; retrying", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
	f.mu.Lock()
	f.recorded, f.started = max(from-1, 0), true
	f.mu.Unlock()
	if f.cfg.Replica != "" {
		go f.keepCursor(ctx)
	}
	for {
		err := f.cfg.Store.Follow(ctx, from, func(c lease.Commit) error {
			f.mu.Lock()
			f.ahead(c.Revision) // until it is written, it waits unrecorded
			f.mu.Unlock()
			evs := f.events(ctx, c)
			if c.Revision == from && skip > 0 {
				evs = evs[min(skip, len(evs)):]
				skip = 0
			}
			for {
				err := f.cfg.Trail.Append(ctx, evs)
				f.written(c.Revision, err)
				if err == nil {
					if f.cfg.Observe != nil {
						f.cfg.Observe(ctx, c)
					}
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(250 * time.Millisecond):
				}
			}
		}, f.progress)
		var hc *lease.HistoryCompactedError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &hc):
			evs, err := f.compacted(ctx, hc)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				f.log.Warn("audit trail: restores not read; retrying", "err", err)
				time.Sleep(time.Second)
				continue
			}
			for f.cfg.Trail.Append(ctx, evs) != nil && ctx.Err() == nil {
				time.Sleep(250 * time.Millisecond)
			}
			// etcd keeps the compaction's revision itself and what follows.
			from, skip = hc.Compacted, 0
		default:
			return fmt.Errorf("authz: follow the store: %w", err)
		}
	}
}

// keepCursor writes the trail's cursor into the store at start and then
// whenever the trail advanced past the cursor's own write, until ctx ends.
func (f *Follower) keepCursor(ctx context.Context) {
	every := f.cfg.CursorInterval
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	// value is the cursor written last, at revision self (when): a trail
	// that recorded nothing since but that write itself (value is the
	// revision just before it) has no reason to write again. While the
	// trail advances, the cursor is written at most every 10 intervals
	// (a second): each write is a raft write; once it pauses (nothing new
	// since the last look), at once, so that a store that fills up (and
	// then refuses the write) keeps a cursor close to where the trail is.
	var value, self, seen int64 = -1, -1, -1
	var when time.Time
	for {
		rec := f.Recorded()
		quiet := rec == seen
		seen = rec
		if rec > value && !(rec == self && value == self-1) && (quiet || time.Since(when) >= 10*every) {
			if rev, err := f.cfg.Store.SetTrailCursor(ctx, f.cfg.Replica, rec); err == nil {
				value, self, when = rec, rev, time.Now()
			} else if ctx.Err() == nil {
				f.log.Warn("audit trail: cursor not written; compaction may not wait for this trail", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// EventGap records history the trail could not follow: etcd compacted
// revisions from..to (inclusive) before the follower read them.
const EventGap = "gap"

// EventRestore records that the store was restored from a snapshot of
// revision snapshotRevision, its revisions raised past the trail's: the
// revisions from..to never existed in the restored store. Events the
// trail recorded after snapshotRevision (before the restore) were undone
// by it.
const EventRestore = "restore"

// compacted are the events that record a compaction the follower found
// before its next revision: a gap, unless a restore the store recorded
// explains it (the revisions its bump skipped never existed), and then a
// restore event, and a gap only for what was compacted before the
// snapshot's revision.
func (f *Follower) compacted(ctx context.Context, hc *lease.HistoryCompactedError) ([]TrailEvent, error) {
	restores, err := f.cfg.Store.Restores(ctx)
	if err != nil {
		return nil, err
	}
	var evs []TrailEvent
	for _, r := range restores {
		if r.Revision >= hc.Compacted || hc.Compacted > r.Revision+int64(r.Bump)+1 {
			continue
		}
		// The trail's last revision is recorded (but for a batch a crash
		// cut at that very revision): only what precedes the snapshot's
		// revision and was never read is lost.
		if hc.From < r.Revision {
			f.log.Error("audit trail: store history compacted before it was recorded; recording the gap",
				"from", hc.From, "to", r.Revision)
			evs = append(evs, TrailEvent{Kind: EventGap, Schema: TrailSchema, Revision: r.Revision, Data: gapEvent{From: hc.From, To: r.Revision}})
		}
		f.log.Warn("audit trail: the store was restored from a snapshot", "snapshotRevision", r.Revision, "resumes", hc.Compacted)
		return append(evs, TrailEvent{Kind: EventRestore, Schema: TrailSchema, Revision: hc.Compacted - 1, Data: restoreEvent{
			SnapshotRevision: r.Revision, RevisionBump: r.Bump, From: r.Revision + 1, To: hc.Compacted - 1}}), nil
	}
	f.log.Error("audit trail: store history compacted before it was recorded; recording the gap",
		"from", hc.From, "compacted", hc.Compacted)
	return []TrailEvent{{Kind: EventGap, Schema: TrailSchema, Revision: hc.Compacted - 1, Data: gapEvent{From: hc.From, To: hc.Compacted - 1}}}, nil
}

func (f *Follower) written(rev int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.err == nil {
			f.log.Error("audit trail: cannot write; admissions and claims are refused until it can", "revision", rev, "err", err)
		}
		f.err = err
		return
	}
	if f.err != nil {
		f.log.Info("audit trail: writing again", "revision", rev)
	}
	f.err = nil
	f.recorded = max(f.recorded, rev)
}

func (f *Follower) progress(rev int64, synced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ahead(rev)
	if synced {
		// A progress notification follows the events before it: the
		// follower has applied them all.
		f.recorded = max(f.recorded, rev)
	}
}

// Committed tells the follower that this replica's store committed rev (an
// admission, a claim): the store is at least there, whatever the watch has
// said. A watch that stalls (on a member that stopped answering while the
// others commit) or a write that hangs then shows as lag, and Ready refuses
// once it exceeds the bound, as for a write that fails.
func (f *Follower) Committed(rev int64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ahead(rev)
}

// ahead records that the store reached rev (f.mu held). The wait of the
// oldest unrecorded commit starts when the store first gets ahead of the
// trail.
func (f *Follower) ahead(rev int64) {
	if rev <= f.head {
		return
	}
	if f.recorded >= f.head {
		f.since = f.now()
	}
	f.head = rev
}

// Ready reports whether the trail keeps up with the store: nil, or an
// error wrapping ErrTrailBehind that says why (it cannot write, or a
// commit waited unrecorded longer than the bound).
func (f *Follower) Ready() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.started:
		return fmt.Errorf("%w: not started", ErrTrailBehind)
	case f.err != nil:
		return fmt.Errorf("%w: it cannot be written: %v", ErrTrailBehind, f.err)
	}
	if err := f.cfg.Trail.Err(); err != nil {
		return fmt.Errorf("%w: it cannot be synced or signed: %v", ErrTrailBehind, err)
	}
	if lag := f.now().Sub(f.since); f.recorded < f.head && lag > f.cfg.MaxLag {
		return fmt.Errorf("%w: %d revisions unrecorded for %s (bound %s)", ErrTrailBehind, f.head-f.recorded,
			lag.Round(time.Millisecond), f.cfg.MaxLag)
	}
	return nil
}

// Lag returns how many revisions the store is ahead of the trail, as far
// as the follower knows, and for how long the trail has not been caught up.
func (f *Follower) Lag() (revisions int64, behind time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.recorded >= f.head {
		return 0, 0
	}
	return f.head - f.recorded, f.now().Sub(f.since)
}

// Recorded returns the last revision the trail holds every event of.
func (f *Follower) Recorded() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recorded
}

// WaitRecorded waits until the trail holds every event up to rev, or ctx
// ends: for tests and tools that compare the trail with the store.
func (f *Follower) WaitRecorded(ctx context.Context, rev int64) error {
	for f.Recorded() < rev {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// collectors are the follower's gauges: how far the trail is behind the
// store, and whether it keeps up (docs/audit.md).
func (f *Follower) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fcd_audit_trail_lag_revisions",
			Help: "Store revisions committed and not yet in this replica's audit trail, as far as the watch has told.",
		}, func() float64 { n, _ := f.Lag(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fcd_audit_trail_lag_seconds",
			Help: "How long this replica's audit trail has not been caught up with the store (0 when it is).",
		}, func() float64 { _, d := f.Lag(); return d.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fcd_audit_trail_ready",
			Help: "1 while the audit trail keeps up with the store; 0 while admissions and claims are refused for it.",
		}, func() float64 {
			if f.Ready() != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fcd_audit_trail_revision",
			Help: "The last store revision this replica's audit trail holds every event of.",
		}, func() float64 { return float64(f.Recorded()) }),
	}
}

// TrailReady reports whether this replica's audit trail keeps up with
// the store (Follower.Ready); nil without a trail.
func (u *UseCases) TrailReady() error { return u.Admissions.trail.Ready() }

// events are the trail events of one commit.
func (f *Follower) events(ctx context.Context, c lease.Commit) []TrailEvent {
	var out []TrailEvent
	add := func(kind string, at time.Time, data any) {
		out = append(out, TrailEvent{Kind: kind, Schema: TrailSchema, Revision: c.Revision, Time: at, Data: data})
	}
	for _, ch := range c.Changes {
		switch ch := ch.(type) {
		case lease.EpochRegistered:
			add(EventManifest, ch.Epoch.RegisteredAt, newManifestEvent(ch.Epoch))
		case lease.EpochChanged:
			kind := EventDrain
			if ch.State == record.StateStale {
				kind = EventRetire
			}
			add(kind, time.Time{}, epochEvent{Epoch: ch.Epoch, State: string(ch.State), By: ch.By})
		case lease.SnapshotCreated:
			add(EventSnapshot, time.Time{}, snapshotEvent{Snapshot: ch.Snapshot.ID, Servers: snapshotServers(ch.Snapshot)})
		case lease.FormationCreated:
			rec := ch.Formation
			ev := newFormationEvent(rec)
			if f.cfg.Arguments != TrailArgumentsNone {
				ev.Arguments = f.arguments(ctx, rec)
			}
			add(EventFormation, rec.CreatedAt, ev)
		case lease.FormationApproved:
			add(EventApproval, ch.Approval.At, newApprovalEvent(ch))
		case lease.LeaseAdmitted:
			add(EventAdmission, ch.Lease.AdmittedAt, newAdmissionEvent(ch))
		case lease.LeaseClaimed:
			add(EventClaim, ch.At, claimEvent{Lease: ch.Lease, Claim: ch.Claim, Epoch: ch.Epoch, Admission: ch.Admission})
		case lease.LeaseClosed:
			kind, ev := newOutcomeEvent(ch)
			if kind == EventResolution {
				ev.Signed = f.signed(ch)
			}
			add(kind, ch.At, ev)
		case lease.LeaseReadmitted:
			add(EventReadmission, ch.At, readmissionEvent{Lease: ch.Lease, Formation: ch.Formation, TokenExpires: ch.Expires})
		case lease.GenerationSet:
			add(EventGeneration, time.Time{}, generationEvent{Pool: ch.Pool, Generation: ch.Generation, By: ch.By})
		case lease.CertificateRegistered:
			add(EventCertificate, ch.Certificate.RegisteredAt, newCertificateEvent(ch.Certificate))
		case lease.CertificateRevoked:
			add(EventRevocation, time.Time{}, revocationEvent{Certificate: ch.Certificate, By: ch.By})
		case lease.PolicyRecorded:
			data, err := newPolicyEvent(ch)
			if err != nil {
				f.log.Error("audit trail: a policy event does not decode", "replica", ch.Replica, "err", err)
			}
			add(ch.Kind, time.Time{}, data)
		}
	}
	return out
}

// signed is what the trail keeps of a close's signed resolution.
func (f *Follower) signed(ch lease.LeaseClosed) *signedResolutionEvent {
	if ch.Resolution == "" {
		return nil
	}
	sr, err := manifest.ReadVerifiedResolution([]byte(ch.Resolution))
	if err != nil {
		f.log.Error("audit trail: the signed resolution kept does not read", "lease", ch.Lease, "err", err)
		return &signedResolutionEvent{JWS: ch.Resolution}
	}
	return newSignedResolutionEvent(sr)
}

// StorePolicyRecorder returns the policy manager's recorder for a
// replica: it writes the replica's policy events (a set put in force or
// refused) into the store, where every replica's Follower records them.
func StorePolicyRecorder(store *lease.Store, replica string) policy.Recorder {
	return policyRecorder{store, replica}
}

type policyRecorder struct {
	store   *lease.Store
	replica string
}

func (r policyRecorder) Record(ctx context.Context, kind string, _ int64, data any) error {
	return r.store.RecordPolicy(ctx, r.replica, kind, data)
}

// snapshotServers are the servers a snapshot's tools are of.
func snapshotServers(s *record.Snapshot) []string {
	var out []string
	for _, t := range s.Tools {
		if srv, _, ok := strings.Cut(t.Name, "/"); ok && !slices.Contains(out, srv) {
			out = append(out, srv)
		}
	}
	slices.Sort(out)
	return out
}

// arguments are what the formation event keeps of rec's arguments.
func (f *Follower) arguments(ctx context.Context, rec *record.Formation) []byte {
	tool, _, err := f.cfg.Store.ResolveTool(ctx, rec.Snapshot, rec.Tool)
	if err != nil {
		f.log.Error("audit trail: arguments not kept", "formation", rec.ID, "err", err)
		return nil
	}
	var schema []byte
	if tool.Descriptor != nil {
		schema = tool.Descriptor.InputSchema
	}
	args, err := trailArguments(f.cfg.Arguments, rec.Arguments, schema)
	if err != nil {
		f.log.Error("audit trail: arguments not kept", "formation", rec.ID, "err", err)
		return nil
	}
	return args
}
