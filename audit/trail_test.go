package audit_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

func newKey(t *testing.T, kid string) (jwk.Key, jwk.Set) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := jwk.FromRaw(priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Set(jwk.KeyIDKey, kid); err != nil {
		t.Fatal(err)
	}
	pub, err := k.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	set := jwk.NewSet()
	if err := set.AddKey(pub); err != nil {
		t.Fatal(err)
	}
	return k, set
}

// writeTrail writes n events to a fresh trail (a checkpoint every 4, and
// at Close) and returns its root.
func writeTrail(t *testing.T, key jwk.Key, n int, opts ...func(*audit.Config)) string {
	t.Helper()
	root := t.TempDir()
	cfg := audit.Config{Root: root, Replica: "r1", Key: key, CheckpointEvery: 4, CheckpointInterval: time.Hour}
	for _, o := range opts {
		o(&cfg)
	}
	tr, err := audit.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := tr.Record(context.Background(), "formation", int64(100+i), map[string]any{"id": fmt.Sprintf("fm_%d", i), "note": "a call"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	return root
}

func mustVerify(t *testing.T, root string, keys jwk.Set) *audit.Report {
	t.Helper()
	r, err := audit.Verify(root, keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTrailVerifies: a trail written and closed verifies clean, every
// event signed by a checkpoint; reopened, the chain continues where it
// ended.
func TestTrailVerifies(t *testing.T) {
	key, keys := newKey(t, "k1")
	root := writeTrail(t, key, 10)
	r := mustVerify(t, root, keys)
	if !r.OK || len(r.Chains) != 1 || r.Chains[0].Events != 10 || r.Chains[0].Signed != 10 || r.Chains[0].Checkpoints != 3 {
		t.Fatalf("report %+v\n%s", r, r.Summary())
	}
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if seq, head := tr.Head(); seq != 10 || head != r.Chains[0].Head {
		t.Fatalf("reopened at %d %s, want 10 %s", seq, head, r.Chains[0].Head)
	}
	if err := tr.Record(context.Background(), "drain", 200, map[string]string{"epoch": "e"}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if r := mustVerify(t, root, keys); !r.OK || r.Chains[0].Events != 11 {
		t.Fatalf("after reopening: %s", r.Summary())
	}
}

// TestTrailDetectsEdits: whatever byte of a trail is edited, removed or
// reordered, and however a forger re-signs, verify fails naming the
// check and the line.
func TestTrailDetectsEdits(t *testing.T) {
	key, keys := newKey(t, "k1")
	forger, _ := newKey(t, "k1") // the same kid, another key
	for _, tc := range []struct {
		name string
		edit func(lines []string) []string
		want string // problem id
		line int    // 1-based line the problem names (0: not checked)
	}{
		{"a letter in an event's data", func(l []string) []string {
			l[1] = strings.Replace(l[1], `"a call"`, `"a cell"`, 1)
			return l
		}, audit.ProblemHash, 2},
		{"a space added", func(l []string) []string { l[2] = strings.Replace(l[2], `:`, `: `, 1); return l }, audit.ProblemLine, 3},
		{"an event removed", func(l []string) []string { return append(l[:1], l[2:]...) }, audit.ProblemGap, 2},
		{"two events swapped", func(l []string) []string { l[0], l[1] = l[1], l[0]; return l }, audit.ProblemGap, 1},
		{"a revision changed", func(l []string) []string {
			l[0] = strings.Replace(l[0], `"revision":100`, `"revision":99`, 1)
			return l
		}, audit.ProblemHash, 1},
		{"a checkpoint removed, the tail unsigned", func(l []string) []string { return l[:len(l)-1] }, audit.ProblemUnsigned, 0},
		{"a checkpoint forged with another key", func(l []string) []string {
			l[4] = forgedCheckpoint(t, forger, l)
			return l
		}, audit.ProblemSignature, 5},
		{"a line cut short", func(l []string) []string { l[len(l)-1] = l[len(l)-1][:10]; return l }, audit.ProblemLine, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := writeTrail(t, key, 6)
			file := onlyFile(t, root)
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			edited := strings.Join(tc.edit(lines), "\n") + "\n"
			if err := os.WriteFile(file, []byte(edited), 0o600); err != nil {
				t.Fatal(err)
			}
			r := mustVerify(t, root, keys)
			if r.OK {
				t.Fatalf("verify passed an edited trail")
			}
			found := false
			for _, p := range r.Problems {
				if p.ID == tc.want && (tc.line == 0 || p.Line == tc.line) {
					found = true
				}
			}
			if !found {
				t.Fatalf("want %s at line %d, got:\n%s", tc.want, tc.line, r.Summary())
			}
		})
	}
}

// forgedCheckpoint re-signs the checkpoint of lines[4] (after event 4)
// with key.
func forgedCheckpoint(t *testing.T, key jwk.Key, lines []string) string {
	t.Helper()
	root := t.TempDir()
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key, CheckpointEvery: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Record(context.Background(), "x", 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(onlyFile(t, root))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(data), "\n") {
		if strings.HasPrefix(l, `{"checkpoint"`) {
			return l
		}
	}
	t.Fatal("no checkpoint written")
	return ""
}

func onlyFile(t *testing.T, root string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "r1", "trail-*.jsonl"))
	if err != nil || len(files) != 1 {
		t.Fatalf("trail files %v %v", files, err)
	}
	return files[0]
}

// TestTrailCrashAndRotation: a line cut short by a crash is dropped when
// the trail reopens, and the chain continues; a chain spread over files
// verifies, and a file removed from its middle is a gap.
func TestTrailCrashAndRotation(t *testing.T) {
	key, keys := newKey(t, "k1")
	root := writeTrail(t, key, 3)
	f, err := os.OpenFile(onlyFile(t, root), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"data":{"id":"fm_lost"`)
	f.Close()
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Record(context.Background(), "formation", 7, map[string]string{"id": "fm_next"}); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	if r := mustVerify(t, root, keys); !r.OK || r.Chains[0].Events != 4 {
		t.Fatalf("after a crash: %s", r.Summary())
	}

	rotated := writeTrail(t, key, 40, func(c *audit.Config) { c.MaxFileBytes = 1500 })
	files, _ := filepath.Glob(filepath.Join(rotated, "r1", "trail-*.jsonl"))
	if len(files) < 3 {
		t.Fatalf("%d files, want the chain spread over several", len(files))
	}
	if r := mustVerify(t, rotated, keys); !r.OK || r.Chains[0].Events != 40 || r.Chains[0].Files != len(files) {
		t.Fatalf("rotated: %s", r.Summary())
	}
	if err := os.Remove(files[1]); err != nil {
		t.Fatal(err)
	}
	r := mustVerify(t, rotated, keys)
	if r.OK || !hasProblem(r, audit.ProblemGap) {
		t.Fatalf("a removed file: %s", r.Summary())
	}
}

func hasProblem(r *audit.Report, id string) bool {
	for _, p := range r.Problems {
		if p.ID == id {
			return true
		}
	}
	return false
}

// TestOpenRefuses: a trail needs a root, a replica name that is a plain
// file name, and a private signing key with a kid.
func TestOpenRefuses(t *testing.T) {
	key, keys := newKey(t, "k1")
	pub, _ := keys.Key(0)
	noKid, _ := newKey(t, "")
	for name, cfg := range map[string]audit.Config{
		"no root":         {Replica: "r1", Key: key},
		"a path":          {Root: t.TempDir(), Replica: "../r1", Key: key},
		"no key":          {Root: t.TempDir(), Replica: "r1"},
		"a public key":    {Root: t.TempDir(), Replica: "r1", Key: pub},
		"a key, no kid":   {Root: t.TempDir(), Replica: "r1", Key: noKid},
		"an empty name":   {Root: t.TempDir(), Replica: "", Key: key},
		"a name too long": {Root: t.TempDir(), Replica: strings.Repeat("r", 129), Key: key},
	} {
		if _, err := audit.Open(cfg); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
	if _, err := audit.Verify(t.TempDir(), keys); err == nil {
		t.Error("verify of an empty directory passed")
	}
	if !bytes.Contains([]byte(mustVerify(t, writeTrail(t, key, 1), keys).Summary()), []byte("ok: ")) {
		t.Error("a clean summary does not say ok")
	}
}

// TestTrailLinesAreCanonical: whatever an event's data holds — HTML
// characters, escapes, control characters, line separators, numbers in
// every notation, nested and unordered members — its line is in RFC 8785
// form and the trail verifies.
func TestTrailLinesAreCanonical(t *testing.T) {
	key, keys := newKey(t, "k1")
	root := t.TempDir()
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range []any{
		map[string]any{"z": 1, "a": "<b>&amp;</b>", "m": map[string]any{"y": []any{1.5, 1e21, 0.000001, -0.0}, "x": nil}},
		map[string]string{"ctl": "\b\f\n\r\t\x01\x1f", "sep": "\u2028\u2029", "uni": "é€😀", "quote": `"\`},
		json.RawMessage(`{"b":1.0,"a":[true,false,null],"c":"\u00e9"}`),
		nil,
		"a bare string",
	} {
		if err := tr.Record(context.Background(), "k", 1, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if r := mustVerify(t, root, keys); !r.OK || r.Chains[0].Events != 5 {
		t.Fatalf("%s", r.Summary())
	}
}

// TestTrailPages: a chain read in pages gives every event once, in order,
// across files, and says when none follows.
func TestTrailPages(t *testing.T) {
	key, _ := newKey(t, "k1")
	root := writeTrail(t, key, 30, func(c *audit.Config) { c.MaxFileBytes = 1500 })
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, limit := range []int{1, 7, 30, 100} {
		var seqs []uint64
		after, pages := uint64(0), 0
		for {
			page, next, err := tr.Page(after, limit)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(page) > limit {
				t.Fatalf("a page of %d holds %d", limit, len(page))
			}
			for _, e := range page {
				seqs = append(seqs, e.Seq)
			}
			if next == 0 {
				break
			}
			after = next
		}
		if len(seqs) != 30 || seqs[0] != 1 || seqs[29] != 30 || !slices.IsSorted(seqs) {
			t.Fatalf("limit %d: %v", limit, seqs)
		}
	}
	if page, next, err := tr.Page(30, 10); err != nil || len(page) != 0 || next != 0 {
		t.Fatalf("after the last event: %v %d %v", page, next, err)
	}
}

// TestOpenRefusesABrokenChain: a chain whose newest file holds no event
// after older ones cannot be continued (its head is unknown), and Open
// says so rather than starting the chain over.
func TestOpenRefusesABrokenChain(t *testing.T) {
	key, _ := newKey(t, "k1")
	root := writeTrail(t, key, 40, func(c *audit.Config) { c.MaxFileBytes = 1500 })
	files, _ := filepath.Glob(filepath.Join(root, "r1", "trail-*.jsonl"))
	if len(files) < 2 {
		t.Fatalf("%d files", len(files))
	}
	if err := os.WriteFile(files[len(files)-1], nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key}); err == nil || !strings.Contains(err.Error(), "cannot be continued") {
		t.Fatalf("opened a chain without its head: %v", err)
	}
}
