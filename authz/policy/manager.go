package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fcd-authz/fcd/internal/tracing"
	"github.com/fcd-authz/fcd/record"
	"go.opentelemetry.io/otel/attribute"
)

// Source is where a [Manager] loads its policy set from: an operating
// system directory (Dir), which can be reloaded and watched, or a fixed
// fs.FS (FS, e.g. the embedded defaults policies.FS) when Dir is empty.
type Source struct {
	// Dir is a policy directory on disk.
	Dir string
	// FS is read when Dir is empty. Reload re-reads it; Watch does not
	// poll it, because an embedded FS never changes.
	FS fs.FS
}

func (s Source) fsys() (fs.FS, error) {
	switch {
	case s.Dir != "":
		return os.DirFS(s.Dir), nil
	case s.FS != nil:
		return s.FS, nil
	}
	return nil, errors.New("policy: source has neither Dir nor FS")
}

// String names the source in logs and status.
func (s Source) String() string {
	if s.Dir != "" {
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
	Source   string    `json:"source"`
	Digest   string    `json:"digest"`
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
	fsys  fs.FS
	log   *slog.Logger
	now   func() time.Time
	trail Recorder

	cur atomic.Pointer[Set]

	// mu serializes reloads and guards seen: the fingerprint of the files
	// of the last load attempt, good or bad, so Watch retries a broken
	// directory only when it changes.
	mu   sync.Mutex
	seen string

	// smu guards status on its own, so /readyz never waits for a reload
	// that is compiling and testing a set.
	smu    sync.Mutex
	status Status
}

// NewManager loads the initial set from src; it fails if that load fails,
// because authzd must not start without a working policy.
func NewManager(ctx context.Context, src Source, opts ManagerConfig) (*Manager, error) {
	fsys, err := src.fsys()
	if err != nil {
		return nil, err
	}
	m := &Manager{src: src, fsys: fsys, log: opts.Logger, now: opts.Now, trail: opts.Trail}
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
	pf, err := readPolicyFiles(m.fsys)
	return m.applyLocked(ctx, pf, err)
}

// applyLocked loads files already read (or records the error reading
// them) and swaps the new set in on success.
func (m *Manager) applyLocked(ctx context.Context, pf *policyFiles, readErr error) error {
	err := readErr
	if err == nil {
		m.seen = pf.digest
		var s *Set
		if s, err = loadFiles(ctx, pf); err == nil {
			old := m.cur.Swap(s.WithClock(m.now))
			at := m.now().UTC()
			m.updateStatus(func(st *Status) {
				st.Digest, st.LoadedAt = s.digest, at
				st.LastError, st.LastErrorAt = "", time.Time{}
			})
			if old == nil || old.digest != s.digest {
				m.log.Info("policy set loaded", "source", m.src.String(), "digest", s.digest, "files", s.files)
				m.record(ctx, EventLoaded, map[string]any{"source": m.src.String(), "digest": s.digest, "files": s.files})
			}
			return nil
		}
	} else {
		m.seen = fingerprintOf(nil, err)
	}
	at := m.now().UTC()
	m.updateStatus(func(st *Status) { st.LastError, st.LastErrorAt = err.Error(), at })
	if cur := m.cur.Load(); cur != nil {
		m.log.Error("policy reload failed; keeping the set in force",
			"source", m.src.String(), "digest", cur.digest, "err", err)
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
// files, or the read error (so an unreadable directory is reported once).
func fingerprintOf(pf *policyFiles, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return pf.digest
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
// files' names and contents; no file-system notification dependency) and
// reloads when it changes. It returns when ctx is done, or at once for an
// FS source. A change that fails to load is logged and reported by Status
// once, then retried only when the files change again.
func (m *Manager) Watch(ctx context.Context, interval time.Duration) {
	if m.src.Dir == "" {
		return
	}
	if interval <= 0 {
		interval = 2 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.poll(ctx)
	}
}

func (m *Manager) poll(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pf, err := readPolicyFiles(m.fsys)
	if fingerprintOf(pf, err) == m.seen {
		return
	}
	_ = m.applyLocked(ctx, pf, err) // logged and kept in Status
}
