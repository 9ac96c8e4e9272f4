package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// storeCLI runs `authzd store ARGS...` and fails t unless it exits with
// code; it returns what the command printed on stdout and stderr.
func storeCLI(t *testing.T, code int, args ...string) (string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if got := run(t.Context(), append([]string{"store"}, args...), nil, &stdout, &stderr); got != code {
		t.Fatalf("authzd store %s exited %d, want %d:\n%s%s", strings.Join(args, " "), got, code, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String()
}

// getAs GETs path with the credential of role and returns the body of a
// 200 answer.
func (c *devClient) getAs(role api.Role, path string) []byte {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(c.t.Context(), http.MethodGet, c.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+string(c.dc.Credentials[role]))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return body
}

// registerExample registers the github v1.4 example and returns a
// snapshot of it.
func (c *devClient) registerExample() string {
	c.t.Helper()
	key, err := manifest.LoadPrivateKey(c.dc.Keys["registrar"])
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := os.ReadFile("../../examples/github/manifest-v1.4.json")
	if err != nil {
		c.t.Fatal(err)
	}
	jws, err := manifest.Sign(bytes.TrimSpace(m), key, manifest.TypManifest)
	if err != nil {
		c.t.Fatal(err)
	}
	_, err = c.as(api.RoleRegistrar).RegisterManifestWithBodyWithResponse(c.t.Context(), "application/jose", bytes.NewReader(jws))
	c.must("register", err)
	snap, err := c.as(api.RoleHost).CreateSnapshotWithResponse(c.t.Context(), client.SnapshotRequest{Servers: &[]string{"github"}})
	c.must("snapshot", err)
	return snap.JSON201.Id
}

// form forms a read of the example in session and returns the formation
// or the error.
func (c *devClient) form(snapshot, session string) (string, error) {
	args := map[string]any{"owner": "octo", "repo": session}
	formed, err := c.as(api.RoleHost).CreateFormationWithResponse(c.t.Context(),
		client.FormationRequest{Snapshot: snapshot, Session: session, Tool: "github/get_repository", Arguments: &args})
	if err != nil {
		return "", err
	}
	return formed.JSON201.Id, nil
}

// tokenRevision is a dispatch token's fcd_revision.
func tokenRevision(t *testing.T, token string) int64 {
	t.Helper()
	payload, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	var claims struct {
		Revision int64 `json:"fcd_revision"`
	}
	if err == nil {
		err = json.Unmarshal(payload, &claims)
	}
	if err != nil {
		t.Fatal(err)
	}
	return claims.Revision
}

// storeStatus is `authzd store status` of dataDir, decoded.
func storeStatus(t *testing.T, dataDir string) lease.Status {
	t.Helper()
	out, _ := storeCLI(t, 0, "status", "--data-dir", dataDir)
	var st lease.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Members) != 1 || st.Members[0].Error != "" {
		t.Fatalf("store status: %v\n%s", err, out)
	}
	return st
}

// TestStoreSnapshotRoundTrip: a snapshot saved while authzd serves,
// restored into a wiped etcd directory, brings back the same epochs,
// formations and leases; the restored store's revisions start above any
// it had before (bump and mark-compacted), a new write works, and the
// audit trail of both runs still verifies. Restore refuses while authzd
// runs and, without --force, over a directory that holds data, which it
// then keeps aside.
func TestStoreSnapshotRoundTrip(t *testing.T) {
	dir := t.TempDir()
	clientURL, peerURL := "http://"+etcdtest.FreeAddr(t), "http://"+etcdtest.FreeAddr(t)
	urls := []string{"--embedded-etcd-client-url", clientURL, "--embedded-etcd-peer-url", peerURL}
	url, stop := startServer(t, dir, append([]string{"--dev"}, urls...)...)
	c := newDevClient(t, url, dir)
	uncertain, formation := c.uncertainLease("rt-1")
	snapID := c.registerExample()
	open, err := c.form(snapID, "rt-2")
	c.must("form", err)
	admitted, err := c.as(api.RoleHost).AdmitFormationWithResponse(t.Context(), open)
	c.must("admit", err)
	epoch := string(admitted.JSON200.Target.Epoch)

	state := func() map[string]string {
		return map[string]string{
			"epochs":     string(c.getAs(api.RoleOperator, "/v1/epochs")),
			"leases":     string(c.getAs(api.RoleOperator, "/v1/epochs/"+epoch+"/leases")),
			"formation1": string(c.getAs(api.RoleOperator, "/v1/formations/"+formation)),
			"formation2": string(c.getAs(api.RoleOperator, "/v1/formations/"+open)),
		}
	}
	before := state()
	if !strings.Contains(before["leases"], uncertain) || !strings.Contains(before["leases"], admitted.JSON200.Lease) {
		t.Fatalf("leases before the snapshot: %s", before["leases"])
	}
	revBefore := storeStatus(t, dir).Members[0].Revision

	snap := filepath.Join(t.TempDir(), "fcd.snapshot")
	start := time.Now()
	out, _ := storeCLI(t, 0, "snapshot", "save", "--data-dir", dir, snap)
	t.Logf("snapshot save: %s in %s", strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))
	// Restoring under a running authzd is refused.
	if _, errOut := storeCLI(t, 1, "snapshot", "restore", "--data-dir", dir, "--force", snap); !strings.Contains(errOut, "stop authzd") {
		t.Fatalf("restore under a running authzd: %s", errOut)
	}
	stop()

	// Over a directory that holds data: refused, then kept aside.
	if _, errOut := storeCLI(t, 1, "snapshot", "restore", "--data-dir", dir, snap); !strings.Contains(errOut, "--force") {
		t.Fatalf("restore over data without --force: %s", errOut)
	}
	out, _ = storeCLI(t, 0, "snapshot", "restore", "--data-dir", dir, "--force", snap)
	var forced struct{ Aside string }
	if err := json.Unmarshal([]byte(out), &forced); err != nil || forced.Aside == "" {
		t.Fatalf("forced restore: %v %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(forced.Aside, "member")); err != nil {
		t.Fatalf("the replaced directory is not kept aside: %v", err)
	}

	// The round trip the guide describes: wipe, restore, serve.
	if err := os.RemoveAll(filepath.Join(dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	out, _ = storeCLI(t, 0, append([]string{"snapshot", "restore", "--data-dir", dir}, append(urls, snap)...)...)
	t.Logf("snapshot restore: %s in %s", strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))

	url, stop = startServer(t, dir, append([]string{"--dev"}, urls...)...)
	c = newDevClient(t, url, dir)
	after := state()
	for k := range before {
		if before[k] != after[k] {
			t.Errorf("%s after the restore:\n%s\nbefore:\n%s", k, after[k], before[k])
		}
	}
	revAfter := storeStatus(t, dir).Members[0].Revision
	if revAfter < revBefore+lease.DefaultRevisionBump {
		t.Errorf("revision after the restore %d, before %d: want it bumped by %d", revAfter, revBefore, lease.DefaultRevisionBump)
	}
	// Writes work, at revisions above every one before.
	next, err := c.form(snapID, "rt-3")
	c.must("form after the restore", err)
	readmitted, err := c.as(api.RoleHost).AdmitFormationWithResponse(t.Context(), next)
	c.must("admit after the restore", err)
	rev := tokenRevision(t, readmitted.JSON200.Token)
	t.Logf("revision before %d, after the restore %d; an admission after it at %d", revBefore, revAfter, rev)
	if rev <= revBefore+lease.DefaultRevisionBump {
		t.Errorf("admission after the restore at revision %d, not above %d", rev, revBefore+lease.DefaultRevisionBump)
	}
	stop()

	var report bytes.Buffer
	if code := run(t.Context(), []string{"audit", "verify", filepath.Join(dir, "audit")}, nil, &report, &report); code != 0 || !strings.Contains(report.String(), "ok: ") {
		t.Fatalf("audit verify after the restore exited %d:\n%s", code, report.String())
	}
}

// TestStoreFullAndRecovery fills a real embedded member with a small quota
// until etcd raises NOSPACE: a formation is then answered 507 store-full
// without Retry-After, /readyz names NOSPACE, and disarming before space
// is freed is refused; the documented recovery — compact, defrag, then
// disarm, through the store commands against the running authzd — makes
// writes work again and /readyz ready.
func TestStoreFullAndRecovery(t *testing.T) {
	const quota = 4 << 20
	dir := t.TempDir()
	url, stop := startServer(t, dir, "--dev", "--etcd-quota", strconv.Itoa(quota))
	defer stop()
	c := newDevClient(t, url, dir)
	snapID := c.registerExample()
	if _, err := c.form(snapID, "full-0"); err != nil {
		t.Fatal(err)
	}

	// Fill etcd as history does: one key rewritten, each old value kept
	// until a compaction.
	acc, err := lease.EmbeddedAccess(filepath.Join(dir, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: acc.Endpoints, TLS: acc.TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// The trail has recorded full-0 and said so in its cursor (within a
	// second of a call): a store fills over minutes, not in the instant
	// after a call, and a full store refuses the cursor's write, so
	// compaction can pass only the revisions after the last cursor that
	// changed nothing a trail records (lease/compact.go).
	head, err := cli.Get(t.Context(), "/fcd/ping", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	var cursors []string
	testutil.EventuallyState(t, 30*time.Second, fmt.Sprintf("the trail's cursor to reach revision %d", head.Header.Revision), func() bool {
		cur, err := cli.Get(t.Context(), "/fcd/trail-cursors/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		cursors = cursors[:0]
		for _, kv := range cur.Kvs {
			cursors = append(cursors, string(kv.Value))
		}
		var c struct{ Revision int64 }
		return len(cur.Kvs) == 1 && json.Unmarshal(cur.Kvs[0].Value, &c) == nil && c.Revision >= head.Header.Revision
	}, func() string { return fmt.Sprintf("cursors %q", cursors) })
	value := strings.Repeat("x", 256<<10)
	puts := 0
	start := time.Now()
	for ; ; puts++ {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := cli.Put(ctx, "/filler", value)
		cancel()
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil || puts > 1000 {
			t.Fatalf("put %d: %v (no NOSPACE)", puts, err)
		}
	}
	full := storeStatus(t, dir)
	t.Logf("NOSPACE after %d puts of 256 KiB in %s: dbSize %d, quota %d", puts, time.Since(start).Round(time.Millisecond),
		full.Members[0].DBSize, full.Members[0].Quota)
	if len(full.Alarms) != 1 || full.Alarms[0].Alarm != lease.AlarmNoSpace {
		t.Fatalf("alarms %+v", full.Alarms)
	}

	_, err = c.form(snapID, "full-1")
	p, ok := errors.AsType[*client.Problem](err)
	if !ok || p.Status != http.StatusInsufficientStorage || p.Slug() != "store-full" || p.RetryAfter != 0 ||
		!strings.Contains(p.Detail, "docs/operations.md") {
		t.Fatalf("a formation on a full store: %v (%+v)", err, p)
	}
	if body := readyz(t, url, http.StatusServiceUnavailable); !strings.Contains(string(body), "NOSPACE") {
		t.Fatalf("readyz on a full store: %s", body)
	}
	out, _ := storeCLI(t, 0, "alarm", "list", "--data-dir", dir)
	if !strings.Contains(out, lease.AlarmNoSpace) {
		t.Fatalf("alarm list: %s", out)
	}
	// Disarming first would re-trip at the next write: refused.
	if _, errOut := storeCLI(t, 1, "alarm", "disarm", "--data-dir", dir); !strings.Contains(errOut, "compact") {
		t.Fatalf("disarm before freeing space: %s", errOut)
	}

	start = time.Now()
	storeCLI(t, 0, "compact", "--data-dir", dir)
	out, _ = storeCLI(t, 0, "defrag", "--data-dir", dir)
	var defrag []lease.DefragResult
	if err := json.Unmarshal([]byte(out), &defrag); err != nil || len(defrag) != 1 || defrag[0].After >= defrag[0].Before {
		t.Fatalf("defrag: %v %s", err, out)
	}
	out, _ = storeCLI(t, 0, "alarm", "disarm", "--data-dir", dir)
	t.Logf("recovery in %s: defrag %d -> %d bytes; %s", time.Since(start).Round(time.Millisecond), defrag[0].Before, defrag[0].After, strings.TrimSpace(out))
	if !strings.Contains(out, lease.AlarmNoSpace) {
		t.Fatalf("disarm: %s", out)
	}

	for i := range 5 {
		if _, err := c.form(snapID, "full-after-"+strconv.Itoa(i)); err != nil {
			t.Fatalf("formation %d after the recovery: %v", i, err)
		}
	}
	readyz(t, url, http.StatusOK) // after the recovery
	if st := storeStatus(t, dir); len(st.Alarms) != 0 {
		t.Fatalf("alarms after the recovery: %+v", st.Alarms)
	}
}
