// Package audit keeps fcd's tamper-evident trail: every state change a
// replica makes (a formation and its decision, an approval, an admission,
// a claim, an outcome, a drain, ...) appended as one event to the
// replica's own hash chain, with signed checkpoints of the chain's head.
//
// The trail is for after the fact: an auditor's `authzd audit verify`
// proves that no event was edited, removed or reordered since it was
// written (Verify), and, merged across replicas by etcd revision, what
// happened in which order. It is not a source of truth for fcd itself —
// the ordered store (etcd) is — so writing it never decides anything.
//
// Files: one directory per replica under the trail's root, holding
// trail-<first seq>.jsonl files. Each line is one JSON object in RFC 8785
// canonical form: an event, or a checkpoint ({"checkpoint": JWS}). An
// event holds its sequence number, the hash of the event before it, and
// its own hash, the SHA-256 of its canonical form without "hash". Because
// a line must be canonical, any byte edited anywhere fails verification:
// either the line is no longer canonical, or its hash (and the next
// event's link to it) no longer holds. A checkpoint is the chain's head
// (sequence and hash) and the time, signed with the replica's signing key
// (the dispatch-token key, published in authzd's JWKS; signed and checked
// as the registry's documents are, manifest.Sign and manifest.Verifier):
// a trail rewritten
// from some event on cannot be signed again without that key.
//
// Durability: a line is written with one write(2) and the file is synced
// at each checkpoint, so a process crash loses nothing written and a
// machine crash at most the events after the last checkpoint. A line cut
// short by a crash is dropped when the trail is opened again.
package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/gowebpki/jcs"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// CheckpointType is the "typ" of a checkpoint's JWS header.
const CheckpointType = "fcd-audit-checkpoint+jws"

// Defaults of [Config].
const (
	DefaultCheckpointEvery    = 256
	DefaultCheckpointInterval = 10 * time.Second
	DefaultMaxFileBytes       = 64 << 20
)

// Event is one line of the trail.
type Event struct {
	Replica string `json:"replica"`
	// Seq numbers the replica's events from 1, without gaps.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Kind names the state change ("formation", "admission", ...).
	Kind string `json:"kind"`
	// Schema is the version of Data's members for its kind, as the
	// writer states it (authz.TrailSchema); 0, the member absent, in an
	// event written before versions were kept, whose data is version 1's
	// (SchemaOf).
	Schema int `json:"schema,omitempty"`
	// Revision is the etcd revision that ordered the change, 0 where the
	// store does not tell it.
	Revision int64           `json:"revision"`
	Data     json.RawMessage `json:"data"`
	// Prev is the hash of the event before this one ("" for the first).
	Prev string `json:"prev"`
	// Hash is the SHA-256 (hex) of the event's canonical form without it.
	Hash string `json:"hash"`
}

// SchemaV1 is the version of an event's data written before events kept
// one, and the newest this package reads (LatestSchema): Verify reports an
// event of a newer one (ProblemSchema), whose members its properties
// might misread.
const (
	SchemaV1     = 1
	LatestSchema = SchemaV1
)

// SchemaOf is the version of e's data: its Schema, or SchemaV1 for an
// event written before versions were kept.
func SchemaOf(e Event) int {
	if e.Schema == 0 {
		return SchemaV1
	}
	return e.Schema
}

// Checkpoint is what a checkpoint signs: the chain's head.
type Checkpoint struct {
	Replica string    `json:"replica"`
	Seq     uint64    `json:"seq"`
	Head    string    `json:"head"`
	Time    time.Time `json:"time"`
}

// Config configures a [Trail].
type Config struct {
	// Root is the trail's directory; the replica writes to Root/Replica.
	// Required.
	Root string
	// Replica names this replica's chain: stable across its restarts,
	// distinct between replicas. Required; letters, digits, '.', '_', '-'.
	Replica string
	// Key is the private JWK (Ed25519 or P-256, with a kid) that signs
	// checkpoints. Required.
	Key jwk.Key
	// CheckpointEvery and CheckpointInterval: a checkpoint is written
	// after this many events, and at least this often while events come;
	// zero means the defaults.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// MaxFileBytes starts a new file past this size; zero means 64 MiB.
	MaxFileBytes int64
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Writer, when set, wraps each trail file for writing: a test's
	// injection of a failing disk (ENOSPC, EIO, short writes). Nil means
	// the file itself.
	Writer func(*os.File) io.Writer
}

var replicaName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Trail is one replica's writer. It is safe for concurrent use.
type Trail struct {
	cfg Config
	dir string
	log *slog.Logger

	mu       sync.Mutex
	f        *os.File
	size     int64
	seq      uint64
	head     string
	pending  int // events since the last checkpoint
	lastMark time.Time
	closed   bool
	unsynced bool // a checkpoint was written since the last sync
	// tailRev is the revision of the chain's last event and tailN how
	// many events at the end of the last file carry it (Tail).
	tailRev int64
	tailN   int
	// durErr is the last checkpoint's or sync's failure (Err).
	durErr error
}

// Entry is an event to append: its kind, the version of its data's
// schema (zero writes no version), the etcd revision that ordered it,
// when it happened (zero means now) and its data (encoded as JSON).
type Entry struct {
	Kind     string
	Schema   int
	Revision int64
	Time     time.Time
	Data     any
}

// Open opens (or creates) the replica's chain and continues it where it
// ended.
func Open(cfg Config) (*Trail, error) {
	if cfg.Root == "" {
		return nil, errors.New("audit: no trail directory")
	}
	if !replicaName.MatchString(cfg.Replica) {
		return nil, fmt.Errorf("audit: replica name %q: letters, digits, '.', '_' and '-' only", cfg.Replica)
	}
	if cfg.Key == nil || cfg.Key.KeyID() == "" {
		return nil, errors.New("audit: checkpoints need a signing key with a kid")
	}
	if ok, err := jwk.IsPrivateKey(cfg.Key); err != nil || !ok {
		return nil, errors.New("audit: the checkpoint key is not a private key")
	}
	// A key manifest.Sign refuses (another kind, another curve) is refused
	// now, not at the first checkpoint.
	if _, err := manifest.Sign([]byte("{}"), cfg.Key, CheckpointType); err != nil {
		return nil, fmt.Errorf("audit: checkpoint key: %w", err)
	}
	cfg.CheckpointEvery = orDefault(cfg.CheckpointEvery, DefaultCheckpointEvery)
	cfg.CheckpointInterval = orDefault(cfg.CheckpointInterval, DefaultCheckpointInterval)
	cfg.MaxFileBytes = orDefault(cfg.MaxFileBytes, DefaultMaxFileBytes)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Trail{cfg: cfg, dir: filepath.Join(cfg.Root, cfg.Replica), log: cfg.Logger}
	if t.log == nil {
		t.log = slog.Default()
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if err := t.resume(); err != nil {
		return nil, err
	}
	t.lastMark = cfg.Now()
	return t, nil
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// resume finds the chain's last event in the newest file, drops a line cut
// short by a crash, and opens that file for appending.
func (t *Trail) resume() error {
	files, err := trailFiles(t.dir)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return t.startFile(1)
	}
	last := files[len(files)-1]
	data, err := os.ReadFile(last)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	keep := len(data)
	if i := bytes.LastIndexByte(data, '\n'); i+1 != len(data) {
		keep = i + 1 // a line cut short: never acknowledged, dropped
		t.log.Warn("audit: dropping a trail line cut short", "file", last, "bytes", len(data)-keep)
	}
	for line := range bytes.SplitSeq(data[:keep], []byte{'\n'}) {
		var l struct {
			Event
			Checkpoint string `json:"checkpoint"`
		}
		if len(line) == 0 || json.Unmarshal(line, &l) != nil || l.Checkpoint != "" {
			continue
		}
		t.seq, t.head = l.Seq, l.Hash
		if l.Revision != t.tailRev {
			t.tailRev, t.tailN = l.Revision, 0
		}
		t.tailN++
	}
	if t.seq == 0 && len(files) > 1 {
		return fmt.Errorf("audit: %s holds no event; the chain cannot be continued", last)
	}
	f, err := os.OpenFile(last, os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if err := f.Truncate(int64(keep)); err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	if _, err := f.Seek(int64(keep), io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	t.f, t.size = f, int64(keep)
	return nil
}

// startFile opens a new file whose first event is seq.
func (t *Trail) startFile(seq uint64) error {
	f, err := os.OpenFile(filepath.Join(t.dir, fmt.Sprintf("trail-%020d.jsonl", seq)), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	t.f, t.size = f, 0
	return nil
}

// Record appends one event. data is encoded as JSON. An error means the
// event is not in the trail: nothing of it was kept, and the sequence did
// not advance.
func (t *Trail) Record(ctx context.Context, kind string, revision int64, data any) error {
	return t.Append(ctx, []Entry{{Kind: kind, Revision: revision, Data: data}})
}

// Append appends entries as consecutive events, in one write: all of them
// or, on an error, none (a short or failed write is truncated back before
// the next, so the file never keeps part of an event, and the sequence
// advances only over what was written). A checkpoint follows when one is
// due, and then the file is synced.
func (t *Trail) Append(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	raws := make([][]byte, len(entries))
	for i, e := range entries {
		raw, err := json.Marshal(e.Data)
		if err != nil {
			return fmt.Errorf("audit: encode %s: %w", e.Kind, err)
		}
		raws[i] = raw
	}
	if err := t.append(entries, raws); err != nil {
		return err
	}
	// The events are written; a failed sync does not unwrite them (a
	// retry would write them twice): it is kept for Err.
	t.durable(t.sync())
	return nil
}

// durable keeps err (nil clears it) for Err.
func (t *Trail) durable(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil && t.durErr == nil {
		t.log.Error("audit: trail not durable", "err", err)
	}
	t.durErr = err
}

// Err returns why the last checkpoint or sync failed, nil once one
// succeeded since: the trail's events are written but not all signed or
// synced. A failed write is Append's error instead.
func (t *Trail) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.durErr
}

func (t *Trail) append(entries []Entry, raws [][]byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("audit: trail closed")
	}
	now := t.cfg.Now().UTC()
	seq, head := t.seq, t.head
	tailRev, tailN := t.tailRev, t.tailN
	var buf []byte
	for i, en := range entries {
		at := en.Time.UTC()
		if en.Time.IsZero() {
			at = now
		}
		e := Event{Replica: t.cfg.Replica, Seq: seq + 1, Time: at, Kind: en.Kind, Schema: en.Schema, Revision: en.Revision,
			Data: raws[i], Prev: head}
		line, err := encodeEvent(&e)
		if err != nil {
			return err
		}
		buf = append(buf, line...)
		seq, head = e.Seq, e.Hash
		if en.Revision != tailRev {
			tailRev, tailN = en.Revision, 0
		}
		tailN++
	}
	// A new file starts between batches, never inside one, so that the
	// events of one revision are in one file (Tail).
	if t.size > 0 && t.size+int64(len(buf)) > t.cfg.MaxFileBytes {
		if err := t.checkpointLocked(); err != nil {
			return err
		}
		if err := t.f.Sync(); err != nil {
			return fmt.Errorf("audit: sync: %w", err)
		}
		t.unsynced = false
		if err := t.f.Close(); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		if err := t.startFile(t.seq + 1); err != nil {
			return err
		}
		tailRev, tailN = 0, 0
		for _, en := range entries {
			if en.Revision != tailRev {
				tailRev, tailN = en.Revision, 0
			}
			tailN++
		}
	}
	if err := t.write(buf); err != nil {
		return err
	}
	t.seq, t.head, t.tailRev, t.tailN = seq, head, tailRev, tailN
	t.pending += len(entries)
	if t.pending >= t.cfg.CheckpointEvery || now.Sub(t.lastMark) >= t.cfg.CheckpointInterval {
		if err := t.checkpointLocked(); err != nil {
			// The events stand; the checkpoint is tried again with the
			// next ones (pending stays).
			if t.durErr == nil {
				t.log.Error("audit: checkpoint not written", "err", err)
			}
			t.durErr = err
		}
	}
	return nil
}

// write appends b with one write, or nothing: what a failed or short
// write left is truncated away.
func (t *Trail) write(b []byte) error {
	var w io.Writer = t.f
	if t.cfg.Writer != nil {
		w = t.cfg.Writer(t.f)
	}
	n, err := w.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err == nil {
		t.size += int64(n)
		return nil
	}
	if n > 0 {
		if terr := t.truncate(); terr != nil {
			return fmt.Errorf("audit: write: %w (and the partial write could not be undone: %v)", err, terr)
		}
	}
	return fmt.Errorf("audit: write: %w", err)
}

// truncate cuts the file back to what was fully written.
func (t *Trail) truncate() error {
	if err := t.f.Truncate(t.size); err != nil {
		return err
	}
	_, err := t.f.Seek(t.size, io.SeekStart)
	return err
}

// Tail returns the revision of the chain's last event and how many events
// at its end carry that revision: where a follower of the store resumes
// (the events of one revision are appended together, but a crash may cut
// a batch after any complete line). 0, 0 for an empty chain.
func (t *Trail) Tail() (revision int64, events int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tailRev, t.tailN
}

// Checkpoint signs the chain's head now, if events came since the last.
func (t *Trail) Checkpoint() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	err := t.checkpointLocked()
	t.mu.Unlock()
	err = errors.Join(err, t.sync())
	t.durable(err)
	return err
}

func (t *Trail) checkpointLocked() error {
	t.lastMark = t.cfg.Now()
	if t.pending == 0 {
		return nil
	}
	payload, err := json.Marshal(Checkpoint{Replica: t.cfg.Replica, Seq: t.seq, Head: t.head, Time: t.lastMark.UTC()})
	if err != nil {
		return fmt.Errorf("audit: checkpoint: %w", err)
	}
	sig, err := manifest.Sign(payload, t.cfg.Key, CheckpointType)
	if err != nil {
		return fmt.Errorf("audit: sign checkpoint: %w", err)
	}
	line, err := canonicalLine(map[string]string{"checkpoint": string(sig)})
	if err != nil {
		return err
	}
	if err := t.write(line); err != nil {
		return err
	}
	t.pending = 0
	t.unsynced = true
	return nil
}

// sync makes what was written durable, outside the lock, so that writers
// go on appending meanwhile; it is called after a checkpoint.
func (t *Trail) sync() error {
	t.mu.Lock()
	f, need := t.f, t.unsynced
	t.unsynced = false
	t.mu.Unlock()
	if !need || f == nil {
		return nil
	}
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("audit: sync: %w", err)
	}
	return nil
}

// Run checkpoints every CheckpointInterval until ctx ends, so a chain's
// last events are signed even when no more come.
func (t *Trail) Run(ctx context.Context) {
	tick := time.NewTicker(t.cfg.CheckpointInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := t.Checkpoint(); err != nil {
				t.log.Error("audit: checkpoint failed", "err", err)
			}
		}
	}
}

// Head returns the chain's last sequence number and hash.
func (t *Trail) Head() (uint64, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq, t.head
}

// Close signs the head and closes the file.
func (t *Trail) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	err := t.checkpointLocked()
	if t.unsynced {
		err = errors.Join(err, t.f.Sync())
	}
	return errors.Join(err, t.f.Close())
}

// encodeEvent sets e.Hash and returns its canonical line. The data is
// canonicalized (RFC 8785) once; the event's other members are a fixed
// set of plain values written in RFC 8785's key order, so the line is the
// event's canonical form without transforming it whole (Verify checks it
// is: TestTrailLinesAreCanonical fails otherwise).
func encodeEvent(e *Event) ([]byte, error) {
	data, err := jcs.Transform(orNull(e.Data))
	if err != nil {
		return nil, fmt.Errorf("audit: canonical data: %w", err)
	}
	w := wireEvent{Data: data, Kind: e.Kind, Prev: e.Prev, Replica: e.Replica, Revision: e.Revision, Schema: e.Schema, Seq: e.Seq,
		Time: e.Time.UTC().Format(time.RFC3339Nano)}
	unhashed, err := w.encode()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(unhashed)
	w.Hash = hex.EncodeToString(sum[:])
	e.Data, e.Hash = data, w.Hash
	line, err := w.encode()
	if err != nil {
		return nil, err
	}
	return append(line, '\n'), nil
}

// wireEvent is an event's members in RFC 8785 key order.
type wireEvent struct {
	Data     json.RawMessage `json:"data"`
	Hash     string          `json:"hash,omitempty"`
	Kind     string          `json:"kind"`
	Prev     string          `json:"prev"`
	Replica  string          `json:"replica"`
	Revision int64           `json:"revision"`
	Schema   int             `json:"schema,omitempty"`
	Seq      uint64          `json:"seq"`
	Time     string          `json:"time"`
}

func (w *wireEvent) encode() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // RFC 8785 escapes no HTML characters
	if err := enc.Encode(w); err != nil {
		return nil, fmt.Errorf("audit: encode event: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}

func orNull(raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return []byte("null")
	}
	return raw
}

func hashCanonical(m map[string]json.RawMessage) (string, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("audit: encode event: %w", err)
	}
	c, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("audit: canonical event: %w", err)
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// canonicalLine is v's RFC 8785 form and a newline.
func canonicalLine(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("audit: encode: %w", err)
	}
	c, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("audit: canonical form: %w", err)
	}
	return append(c, '\n'), nil
}

// trailFiles lists a replica directory's trail files in chain order.
func trailFiles(dir string) ([]string, error) {
	matches, err := filepath.Glob(filepath.Join(dir, "trail-*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	slices.Sort(matches) // zero-padded first sequence numbers
	return matches, nil
}

// readLines returns a file's lines (without their newlines) and whether
// the last one ended with a newline.
func readLines(path string) ([][]byte, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	var lines [][]byte
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			lines = append(lines, line[:len(line)-1])
		} else if len(line) > 0 {
			lines = append(lines, line)
			return lines, false, nil
		}
		if errors.Is(err, io.EOF) {
			return lines, true, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("audit: read %s: %w", path, err)
		}
	}
}

// Replica is the name of this trail's chain.
func (t *Trail) Replica() string { return t.cfg.Replica }

// Page returns up to limit of this chain's events after sequence number
// after, in order, and next: the after of the following page, 0 when no
// event follows yet. It reads the files as they are; a line being
// written at that moment is left for the next page.
func (t *Trail) Page(after uint64, limit int) ([]Event, uint64, error) {
	files, err := trailFiles(t.dir)
	if err != nil {
		return nil, 0, err
	}
	// The first file that can hold event after+1: files are named by
	// their first sequence number.
	start := 0
	for i, path := range files {
		var first uint64
		if _, err := fmt.Sscanf(filepath.Base(path), "trail-%020d.jsonl", &first); err == nil && first <= after+1 {
			start = i
		}
	}
	events := []Event{}
	for _, path := range files[start:] {
		lines, _, err := readLines(path)
		if err != nil {
			return nil, 0, err
		}
		for _, line := range lines {
			var e Event
			if json.Unmarshal(line, &e) != nil || e.Kind == "" || e.Seq <= after {
				continue // a checkpoint, a line being written, or before the page
			}
			if len(events) == limit {
				return events, events[len(events)-1].Seq, nil
			}
			events = append(events, e)
		}
	}
	return events, 0, nil
}
