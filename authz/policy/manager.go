package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fcd-authz/fcd/internal/tracing"
	"github.com/fcd-authz/fcd/record"
	"go.opentelemetry.io/otel/attribute"
)

// Source is where a [Manager] loads its policy set from: an operating
// system directory (Dir), which can be reloaded and watched; an OPA
// bundle (Bundle), a file or a URL, reloaded and polled; or a fixed fs.FS
// (FS, e.g. the embedded defaults policies.FS) when neither is set.
type Source struct {
	// Dir is a policy directory on disk.
	Dir string
	// Bundle is an OPA bundle; it excludes Dir.
	Bundle *BundleSource
	// FS is read when Dir and Bundle are empty. Reload re-reads it; Watch
	// does not poll it, because an embedded FS never changes.
	FS fs.FS
}

// loader reads a source's files. With poll set it may answer
// errNotModified: the source is what the last read saw.
type loader func(ctx context.Context, poll bool) (*policyFiles, error)

func (s Source) loader() (loader, error) {
	var fsys fs.FS
	switch {
	case s.Dir != "" && s.Bundle != nil:
		return nil, errors.New("policy: a source is a directory or a bundle, not both")
	case s.Bundle != nil:
		if s.Bundle.Location == "" {
			return nil, errors.New("policy: bundle source without a location")
		}
		return newBundleLoader(s.Bundle).load, nil
	case s.Dir != "":
		fsys = os.DirFS(s.Dir)
	case s.FS != nil:
		fsys = s.FS
	default:
		return nil, errors.New("policy: source has neither Dir, Bundle nor FS")
	}
	return func(context.Context, bool) (*policyFiles, error) { return readPolicyFiles(fsys) }, nil
}

// watched reports whether Watch polls the source.
func (s Source) watched() bool { return s.Dir != "" || s.Bundle != nil }

// String names the source in logs and status.
func (s Source) String() string {
	switch {
	case s.Bundle != nil:
		return s.Bundle.String()
	case s.Dir != "":
		return s.Dir
	}
	return "embedded"
}

// ManagerConfig configures a [Manager]. The zero value is the defaults.
type ManagerConfig struct {
	// Logger receives reload outcomes; nil means slog.Default().
	Logger *slog.Logger
	// Now stamps decisions and status; nil means time.Now.
	Now func() time.Time
	// Trail, if set, records every set put in force (EventLoaded) and
	// every set refused (EventRefused) to the audit trail, so that the
	// trail shows which set decided each call.
	Trail Recorder
}

// Recorder appends an event to the audit trail (an *audit.Trail; the
// same method as authz.Recorder). Policy sets are local to a replica, so
// their events carry no etcd revision.
type Recorder interface {
	Record(ctx context.Context, kind string, revision int64, data any) error
}

// Event kinds a Manager records.
const (
	EventLoaded  = "policy"
	EventRefused = "policy-refused"
)

// Status is what /readyz shows about policies: the set in force and the
// last reload failure, if the most recent attempt failed.
type Status struct {
	Source string `json:"source"`
	Digest string `json:"digest"`
	// Revision is the revision of the bundle the set in force came from
	// (its .manifest's); empty for a directory or the embedded set.
	Revision string    `json:"revision,omitempty"`
	LoadedAt time.Time `json:"loadedAt"`
	// LastError is the error of the last reload attempt when it failed;
	// the set in force is then the older one named by Digest. Empty after
	// a successful reload.
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
}

// Manager holds the policy set in force and replaces it atomically on
// reload. Decisions read the current set lock-free; a set that fails to
// load or fails its tests never replaces the working one. All methods are
// safe for concurrent use.
type Manager struct {
	src   Source
	load  loader
	log   *slog.Logger
	now   func() time.Time
	trail Recorder

	cur atomic.Pointer[Set]

	// mu serializes reloads and guards seen: the fingerprint of the files
	// of the last load attempt, good or bad, so Watch retries a broken
	// directory or bundle only when it changes.
	mu   sync.Mutex
	seen string

	// reloads counts load attempts by result (fcd_policy_reloads_total).
	reloads reloadCounts

	// smu guards status on its own, so /readyz never waits for a reload
	// that is compiling and testing a set.
	smu    sync.Mutex
	status Status
}

// NewManager loads the initial set from src; it fails if that load fails,
// because authzd must not start without a working policy.
func NewManager(ctx context.Context, src Source, opts ManagerConfig) (*Manager, error) {
	load, err := src.loader()
	if err != nil {
		return nil, err
	}
	m := &Manager{src: src, load: load, log: opts.Logger, now: opts.Now, trail: opts.Trail}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.now == nil {
		m.now = time.Now
	}
	m.status.Source = src.String() // not shared yet
	if err := m.Reload(ctx); err != nil {
		return nil, fmt.Errorf("policy: initial load from %s: %w", src, err)
	}
	return m, nil
}

// Current returns the policy set in force. It never returns nil.
func (m *Manager) Current() *Set { return m.cur.Load() }

// Digest is the digest of the set in force.
func (m *Manager) Digest() string { return m.Current().Digest() }

// Decide decides with the set in force; it makes a Manager an
// authz.Decider whose decisions follow reloads.
func (m *Manager) Decide(ctx context.Context, in *Input) record.Decision {
	ctx, span := tracing.Start(ctx, "github.com/fcd-authz/fcd/authz/policy", "policy.decide")
	d := m.Current().Decide(ctx, in)
	span.SetAttributes(attribute.String("fcd.verdict", string(d.Verdict)), attribute.String("fcd.policy_digest", d.PolicyDigest),
		attribute.Int("fcd.approvals", d.Approvals))
	span.End()
	return d
}

// Status returns the set in force and the last reload error.
func (m *Manager) Status() Status {
	m.smu.Lock()
	defer m.smu.Unlock()
	return m.status
}

func (m *Manager) updateStatus(f func(*Status)) {
	m.smu.Lock()
	defer m.smu.Unlock()
	f(&m.status)
}

// Reload loads the source again and, if the new set loads and passes its
// tests, swaps it in. On failure the old set stays in force, the error is
// logged and kept in Status until a later reload succeeds, and returned.
// SIGHUP handlers call it.
func (m *Manager) Reload(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reloadLocked(ctx)
}

func (m *Manager) reloadLocked(ctx context.Context) error {
	pf, err := m.load(ctx, false)
	return m.applyLocked(ctx, pf, err)
}

// applyLocked loads files already read (or records the error reading
// them) and swaps the new set in on success.
func (m *Manager) applyLocked(ctx context.Context, pf *policyFiles, readErr error) error {
	m.seen = fingerprintOf(pf, readErr)
	err := readErr
	if err == nil {
		var s *Set
		if s, err = loadFiles(ctx, pf); err == nil {
			old := m.cur.Swap(s.WithClock(m.now))
			at := m.now().UTC()
			m.updateStatus(func(st *Status) {
				st.Digest, st.Revision, st.LoadedAt = s.digest, s.revision, at
				st.LastError, st.LastErrorAt = "", time.Time{}
			})
			m.reloads.add(reloadLoaded)
			if old == nil || old.digest != s.digest || old.revision != s.revision {
				ev := map[string]any{"source": m.src.String(), "digest": s.digest, "files": s.files}
				args := []any{"source", m.src.String(), "digest", s.digest, "files", s.files}
				if s.revision != "" {
					ev["revision"] = s.revision
					args = append(args, "revision", s.revision)
				}
				m.log.Info("policy set loaded", args...)
				m.record(ctx, EventLoaded, ev)
			}
			return nil
		}
	}
	at := m.now().UTC()
	m.updateStatus(func(st *Status) { st.LastError, st.LastErrorAt = err.Error(), at })
	m.reloads.add(refusal(err))
	if cur := m.cur.Load(); cur != nil {
		args := []any{"source", m.src.String(), "reason", refusal(err), "digest", cur.digest}
		if cur.revision != "" {
			args = append(args, "revision", cur.revision)
		}
		m.log.Error("policy reload refused; keeping the set in force", append(args, "err", err)...)
		m.record(ctx, EventRefused, map[string]any{"source": m.src.String(), "inForce": cur.digest, "error": err.Error()})
	}
	return err
}

// record appends an event to the trail, if there is one; a failure is
// logged and changes nothing.
func (m *Manager) record(ctx context.Context, kind string, data any) {
	if m.trail == nil {
		return
	}
	if err := m.trail.Record(context.WithoutCancel(ctx), kind, 0, data); err != nil {
		m.log.Error("audit trail: event not recorded", "kind", kind, "err", err)
	}
}

// fingerprintOf is what Watch compares between polls: the digest of the
// files and the bundle's revision, or the read error (so an unreadable
// directory or a bundle server that is down is reported once).
func fingerprintOf(pf *policyFiles, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return pf.digest + " " + pf.revision
}

// loadFiles is Load over files already read.
func loadFiles(ctx context.Context, pf *policyFiles) (*Set, error) {
	s, err := compileSet(ctx, pf)
	if err != nil {
		return nil, err
	}
	rep, err := runSetTests(ctx, s, pf)
	if err != nil {
		return nil, err
	}
	if !rep.Passed() {
		return nil, fmt.Errorf("%w: %s", ErrTestsFailed, rep.summary())
	}
	return s, nil
}

// Watch polls a directory source every interval (a digest of the policy
// files' names and contents; no file-system notification dependency), or
// a bundle source after a random wait between its MinDelay and MaxDelay
// (interval is then unused), and reloads when the source changed. It
// returns when ctx is done, or at once for an FS source. A change that
// fails to load is logged and reported by Status once, then retried only
// when the source changes again.
func (m *Manager) Watch(ctx context.Context, interval time.Duration) {
	if !m.src.watched() {
		return
	}
	if interval <= 0 {
		interval = 2 * time.Second
	}
	wait := func() time.Duration { return interval }
	if b := m.src.Bundle; b != nil {
		lo, hi := b.delays()
		wait = func() time.Duration { return lo + rand.N(hi-lo+1) }
	}
	t := time.NewTimer(wait())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.poll(ctx)
		t.Reset(wait())
	}
}

func (m *Manager) poll(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pf, err := m.load(ctx, true)
	if errors.Is(err, errNotModified) || fingerprintOf(pf, err) == m.seen {
		return
	}
	_ = m.applyLocked(ctx, pf, err) // logged and kept in Status
}
