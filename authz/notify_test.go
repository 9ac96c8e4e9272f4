package authz_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// verifySignature is the receiver's check of docs/approvals.md: the
// header's HMAC over "<t>.<body>" with the shared secret, and t recent.
func verifySignature(secret []byte, header string, body []byte, now time.Time) bool {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(t, 0)).Abs() > 5*time.Minute {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "." + string(body)))
	want := hex.EncodeToString(m.Sum(nil))
	return hmac.Equal([]byte(sig), []byte(want))
}

type delivery struct {
	event, formation string
	status           int
	note             authz.Notification
}

// TestNotifierDelivers runs a notifier against a real HTTP receiver: each
// body's signature verifies; a 500 is retried and the formation's next
// notification waits for it (order per formation); a 400 is not retried;
// a formation left pending is announced expired; and a secret never
// reaches the log.
func TestNotifierDelivers(t *testing.T) {
	secret := []byte("s3cr3t-webhook-key")
	var mu sync.Mutex
	var got []delivery
	answers := map[string][]int{"fm_a/" + authz.NotifyPending: {500, 200}, "fm_b/" + authz.NotifyPending: {400}}
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !verifySignature(secret, r.Header.Get(authz.SignatureHeader), body, time.Now()) {
			t.Errorf("signature %q does not verify over %s", r.Header.Get(authz.SignatureHeader), body)
		}
		var n authz.Notification
		if err := json.Unmarshal(body, &n); err != nil {
			t.Errorf("body: %v", err)
		}
		if r.Header.Get("Fcd-Event") != n.Event || r.Header.Get("Fcd-Delivery") != n.ID {
			t.Errorf("headers %v for %s", r.Header, body)
		}
		mu.Lock()
		defer mu.Unlock()
		status := 200
		if q := answers[n.Formation+"/"+n.Event]; len(q) > 0 {
			status, answers[n.Formation+"/"+n.Event] = q[0], q[1:]
		}
		got = append(got, delivery{event: n.Event, formation: n.Formation, status: status, note: n})
		w.WriteHeader(status)
	}))
	defer recv.Close()

	var logs strings.Builder
	var logMu sync.Mutex
	n, err := authz.NewNotifier(authz.NotifierConfig{URL: recv.URL, Secret: secret, PageURL: "https://fcd.example/ui/",
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	now := time.Now().UTC()
	pending := func(id string, expires time.Time) lease.Change {
		return lease.FormationCreated{Formation: &record.Formation{Call: record.Call{ID: id, Tool: "github/create_repository",
			Principal: record.Principal{ID: "alice"}, Metadata: record.Metadata{SideEffects: manifest.SideEffectWrite},
			CreatedAt: now, ExpiresAt: expires}, Status: record.StatusPendingApproval, ApprovalsRequired: 1}}
	}
	later := now.Add(time.Hour)
	n.Observe(ctx, lease.Commit{Revision: 10, Changes: []lease.Change{pending("fm_a", later)}})
	n.Observe(ctx, lease.Commit{Revision: 11, Changes: []lease.Change{lease.FormationApproved{Formation: "fm_a",
		Approval: record.Approval{Approver: "bob", Decision: record.Approve, Reason: "ok", At: now}, Status: record.StatusReady}}})
	n.Observe(ctx, lease.Commit{Revision: 12, Changes: []lease.Change{pending("fm_b", later)}})
	n.Observe(ctx, lease.Commit{Revision: 13, Changes: []lease.Change{pending("fm_c", now.Add(300*time.Millisecond))}})
	// A formation that needs no approval, and history too old to announce.
	n.Observe(ctx, lease.Commit{Revision: 14, Changes: []lease.Change{lease.FormationCreated{Formation: &record.Formation{
		Call: record.Call{ID: "fm_d", CreatedAt: now, ExpiresAt: later}, Status: record.StatusReady}}}})
	n.Observe(ctx, lease.Commit{Revision: 15, Changes: []lease.Change{lease.FormationApproved{Formation: "fm_e",
		Approval: record.Approval{Approver: "bob", Decision: record.Deny, At: now.Add(-2 * time.Hour)}, Status: record.StatusDenied}}})

	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // nothing more arrives
	mu.Lock()
	defer mu.Unlock()
	per := map[string][]string{}
	for _, d := range got {
		per[d.formation] = append(per[d.formation], d.event+"="+strconv.Itoa(d.status))
	}
	want := map[string]string{
		"fm_a": "formation.pending=500 formation.pending=200 formation.approved=200",
		"fm_b": "formation.pending=400",
		"fm_c": "formation.pending=200 formation.expired=200",
	}
	for id, w := range want {
		if g := strings.Join(per[id], " "); g != w {
			t.Errorf("%s: deliveries %q, want %q", id, g, w)
		}
	}
	if len(per) != len(want) {
		t.Errorf("deliveries for %v, want only fm_a, fm_b, fm_c", per)
	}
	for _, d := range got {
		if d.formation == "fm_a" && d.event == authz.NotifyApproved {
			if d.note.Approver != "bob" || d.note.Approvals != (authz.NotificationCount{Required: 1, Given: 1}) ||
				d.note.Page != "https://fcd.example/ui/#fm_a" || d.note.Tool != "github/create_repository" || d.note.Principal != "alice" {
				t.Errorf("approved notification: %+v", d.note)
			}
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), string(secret)) {
		t.Errorf("the secret reached the log:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
