package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// DefaultRevisionBump is how much RestoreEmbedded raises the revision
// above the snapshot's when RestoreConfig.RevisionBump is zero: a billion,
// the figure etcd's own restore guides use. It must exceed the number of
// revisions committed between the snapshot and the restore (one a write
// transaction: at fcd's group-commit rates, days of full load).
const DefaultRevisionBump = 1_000_000_000

// ErrRestoreTargetExists: the embedded member's directory already holds
// data; a restore replaces it only when told to (RestoreConfig.Force),
// and then keeps it aside.
var ErrRestoreTargetExists = errors.New("lease: the embedded etcd data directory already holds data")

// RestoreConfig configures [RestoreEmbedded].
type RestoreConfig struct {
	// Dir is the embedded member's data directory (EmbedConfig.Dir).
	// Required.
	Dir string
	// Snapshot is the file SnapshotSave wrote. Required.
	Snapshot string
	// Force replaces a Dir that holds data; the old directory is renamed
	// to Dir.before-restore-TIME, never deleted.
	Force bool
	// RevisionBump raises the restored revision by this much; zero means
	// DefaultRevisionBump.
	RevisionBump uint64
	// ClientURL and PeerURL are those the restored member will listen on,
	// as in EmbedConfig; empty means those Dir recorded (EndpointsFile),
	// else free loopback ports, recorded in the new directory.
	ClientURL, PeerURL string
	// Name is the member's name; empty means "fcd", as EmbedConfig.
	Name string
}

// RestoreResult says what RestoreEmbedded did.
type RestoreResult struct {
	// Revision is the snapshot's revision; the restored member starts at
	// Revision + Bump, compacted there.
	Revision int64  `json:"snapshotRevision"`
	Bump     uint64 `json:"revisionBump"`
	// Aside is where the directory that was replaced now is; empty when
	// there was none.
	Aside string `json:"aside,omitempty"`
}

// SnapshotFile is what a snapshot file holds, as etcd's own tools read it.
type SnapshotFile struct {
	// Revision is the key-value revision the snapshot was taken at.
	Revision int64 `json:"revision"`
	// Keys is the number of keys, every bucket's, etcd's own included.
	Keys int `json:"keys"`
	// Hash is the CRC-32 of its contents, as etcdutl snapshot status
	// prints it.
	Hash uint32 `json:"hash"`
}

// InspectSnapshot reads a snapshot file SnapshotSave wrote: it fails if
// the file is not an etcd database.
func InspectSnapshot(path string) (SnapshotFile, error) {
	st, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return SnapshotFile{}, fmt.Errorf("lease: %s is not an etcd snapshot: %w", path, err)
	}
	return SnapshotFile{Revision: st.Revision, Keys: st.TotalKey, Hash: st.Hash}, nil
}

// RestoreEmbedded makes Dir a new single-member data directory holding
// the state of the snapshot, with etcd's own restore (etcdutl). It
// refuses while a process runs a member on Dir (ErrDataDirLocked: stop
// authzd first), and when Dir holds data unless cfg.Force
// (ErrRestoreTargetExists); a replaced directory is kept aside. The new
// directory is built beside Dir and renamed into place only once complete,
// so a restore that fails leaves Dir as it was.
//
// The restored revision is raised by RevisionBump above the snapshot's
// and marked compacted there. etcd's revisions are what fcd orders by:
// the audit trail records each change's revision and resumes from the
// last it recorded, watchers resume from a revision, and dispatch tokens
// and leases carry the revision they were admitted at. Restored as it was,
// the store would count again from the snapshot's revision, reusing
// numbers that already named other changes (those made after the
// snapshot) — a resumed watch would silently skip or misread them.
// Bumped, every revision after the restore is higher than any seen
// before; marked compacted, a watch or read at an older revision fails
// loudly (compacted) instead of reading a history that never was.
func RestoreEmbedded(ctx context.Context, cfg RestoreConfig) (RestoreResult, error) {
	if cfg.Dir == "" || cfg.Snapshot == "" {
		return RestoreResult{}, errors.New("lease: restore needs a data directory and a snapshot file")
	}
	if _, err := os.Stat(cfg.Snapshot); err != nil {
		return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
	}
	dir := filepath.Clean(cfg.Dir)
	exists, hasData := false, false
	switch _, err := os.Stat(dir); {
	case err == nil:
		exists = true
		_, err := os.Stat(filepath.Join(dir, "member"))
		hasData = err == nil
	case !errors.Is(err, fs.ErrNotExist):
		return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
	}
	if exists {
		// Held for the restore: no member starts on the directory meanwhile.
		lock, err := lockDir(ctx, dir, 100*time.Millisecond)
		if err != nil {
			return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
		}
		defer lock.unlock()
	}
	if hasData && !cfg.Force {
		return RestoreResult{}, fmt.Errorf("%w: %s; to replace it (it is kept aside, not deleted), restore with force", ErrRestoreTargetExists, dir)
	}
	// The member serves mutual TLS (embedtls.go); its next start
	// generates the credential the restored directory lacks.
	urls, _, err := embeddedURLs(EmbedConfig{Dir: dir, ClientURL: cfg.ClientURL, PeerURL: cfg.PeerURL}, "https", "https")
	if err != nil {
		return RestoreResult{}, err
	}
	st, err := InspectSnapshot(cfg.Snapshot)
	if err != nil {
		return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
	}
	mgr := snapshot.NewV3(zap.NewNop())
	res := RestoreResult{Revision: st.Revision, Bump: cmp.Or(cfg.RevisionBump, DefaultRevisionBump)}
	name := orDefault(cfg.Name, "fcd")
	tmp := dir + ".restoring"
	// A directory left by a restore that failed half way is ours to
	// remove: it never was a member's directory.
	if err := os.RemoveAll(tmp); err != nil {
		return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
	}
	if err := mgr.Restore(snapshot.RestoreConfig{
		SnapshotPath:        cfg.Snapshot,
		Name:                name,
		OutputDataDir:       tmp,
		PeerURLs:            []string{urls.PeerURL},
		InitialCluster:      name + "=" + urls.PeerURL,
		InitialClusterToken: embed.NewConfig().InitialClusterToken, // the embedded member's
		RevisionBump:        res.Bump,
		MarkCompacted:       true,
	}); err != nil {
		_ = os.RemoveAll(tmp)
		return RestoreResult{}, fmt.Errorf("lease: restore %s: %w", cfg.Snapshot, err)
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
	}
	if err := recordURLs(tmp, urls); err != nil {
		return RestoreResult{}, err
	}
	// The next start tells the store (Embedded.Restored, Store.RecordRestore)
	// so that the audit trails know the revisions the bump skipped never
	// existed: no history was lost there.
	b, _ := json.Marshal(res)
	if err := os.WriteFile(filepath.Join(tmp, RestoredFile), b, 0o600); err != nil {
		return RestoreResult{}, fmt.Errorf("lease: restore: %w", err)
	}
	if exists {
		res.Aside = dir + ".before-restore-" + time.Now().UTC().Format("20060102T150405Z")
		if err := os.Rename(dir, res.Aside); err != nil {
			return RestoreResult{}, fmt.Errorf("lease: restore: keep %s aside: %w", dir, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return res, fmt.Errorf("lease: restore: move the restored directory %s into place: %w", tmp, err)
	}
	return res, nil
}

// RestoredFile is the file RestoreEmbedded leaves in the directory it
// restored, until the member's owner recorded the restore in the store.
const RestoredFile = "fcd-restored.json"

// Restored returns what RestoreEmbedded did to the member's directory, if
// the directory was restored and the restore not recorded yet: its owner
// records it (Store.RecordRestore), then calls ClearRestored.
func (e *Embedded) Restored() (RestoreResult, bool) {
	if e == nil {
		return RestoreResult{}, false
	}
	b, err := os.ReadFile(filepath.Join(e.dir, RestoredFile))
	if err != nil {
		return RestoreResult{}, false
	}
	var r RestoreResult
	if json.Unmarshal(b, &r) != nil || r.Revision <= 0 {
		return RestoreResult{}, false
	}
	return r, true
}

// ClearRestored forgets a restore that is recorded.
func (e *Embedded) ClearRestored() error {
	if err := os.Remove(filepath.Join(e.dir, RestoredFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("lease: %w", err)
	}
	return nil
}

// RecordRestore records in the store that its history was restored from
// a snapshot of revision r.Revision, the revisions raised by r.Bump: the
// revisions in between never existed, and a trail that finds them
// compacted has lost nothing there (Restores).
func (s *Store) RecordRestore(ctx context.Context, r RestoreResult) error {
	b, _ := json.Marshal(&storedRestore{ver: current, Revision: r.Revision, Bump: r.Bump})
	octx, cancel := s.writeOp(ctx)
	defer cancel()
	_, err := s.cli.Put(octx, s.k.note(noteRestores, fmt.Sprintf("%020d", r.Revision)), string(b))
	return s.wrap(ctx, "record restore", err)
}

// Restores returns the restores RecordRestore recorded, oldest first.
func (s *Store) Restores(ctx context.Context) ([]RestoreResult, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.note(noteRestores, ""), clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(ctx, "restores", err)
	}
	var out []RestoreResult
	for _, kv := range resp.Kvs {
		var r storedRestore
		if err := decodeStored(kv.Key, kv.Value, &r); err != nil {
			return nil, err
		}
		out = append(out, RestoreResult{Revision: r.Revision, Bump: r.Bump})
	}
	return out, nil
}
