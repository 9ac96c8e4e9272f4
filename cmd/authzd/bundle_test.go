package main

import (
	"bytes"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/bundletest"
	"github.com/fcd-authz/fcd/internal/decisionlogtest"
	tu "github.com/fcd-authz/fcd/internal/testutil"
)

// readDenyingSet is a policy set that allows every call but reads of
// github/get_repository, in both languages, with tests; failing breaks
// its Rego test.
func readDenyingSet(failing bool) fstest.MapFS {
	expect := "count(authz.deny) == 1"
	if failing {
		expect = "count(authz.deny) == 0"
	}
	return fstest.MapFS{
		"p.rego": {Data: []byte(`package fcd.authz

allow contains {"rule": "allow-all", "reason": "from the bundle"}

deny contains {"rule": "deny-get-repository", "reason": "the bundle denies it"} if input.tool.qualifiedName == "github/get_repository"
`)},
		"p_test.rego": {Data: []byte(`package fcd.authz_test

import data.fcd.authz

test_get_repository_denied if {
	` + expect + ` with input as {"tool": {"qualifiedName": "github/get_repository"}}
}
`)},
		"p.cedar": {Data: []byte(`@id("allow-all") permit (principal, action, resource);
@id("deny-get-repository") @reason("the bundle denies it")
forbid (principal, action, resource == Tool::"github/get_repository");
`)},
		"p.cases.json": {Data: []byte(`[
  {"name": "get_repository is denied", "input": {"tool": {"name": "get_repository", "server": "github",
     "qualifiedName": "github/get_repository", "sideEffects": "read", "requiresApproval": false,
     "requires": [], "producesInputFor": [], "exclusiveWith": []}},
   "expect": {"verdict": "deny", "rules": ["deny-get-repository"]}}
]`)},
	}
}

// TestServePolicyBundle: `serve --policy-bundle URL` decides with a
// signed bundle built by OPA's own build and served over HTTP: a call the
// bundle denies is denied; the bundle's revision is in /readyz, the
// decision log (bundles.fcd.revision) and the trail's policy event; a
// bundle with a bad signature and one whose tests fail are refused
// (logged, counted, in /readyz) while the set in force keeps deciding; a
// new good revision is taken.
func TestServePolicyBundle(t *testing.T) {
	key, other := bundletest.NewKey(t), bundletest.NewKey(t)
	srv := bundletest.NewServer(t, bundletest.Build(t, readDenyingSet(false), "rev-1", key))
	r := decisionlogtest.New(t, nil)
	dir := filepath.Join(t.TempDir(), "data")
	url, stop := startServer(t, dir, "--dev", "--replica", "r1",
		"--policy-bundle", srv.BundleURL(), "--policy-bundle-keys", key.Public,
		"--policy-bundle-min-delay", "20ms", "--policy-bundle-max-delay", "40ms",
		"--decision-log-url", r.URL(), "--decision-log-min-delay", "10ms", "--decision-log-max-delay", "50ms")
	defer stop()
	c := newDevClient(t, url, dir)

	policies := func() client.PolicyStatus {
		t.Helper()
		resp, err := c.as("").GetReadinessWithResponse(t.Context())
		c.must("readyz", err)
		if resp.JSON200 == nil || resp.JSON200.Checks.Policies == nil {
			return client.PolicyStatus{}
		}
		return *resp.JSON200.Checks.Policies
	}
	revision := func(st client.PolicyStatus) string {
		if st.Revision == nil {
			return ""
		}
		return *st.Revision
	}
	tu.Eventually(t, 10*time.Second, "ready", func() bool { return policies().Source != "" })
	st := policies()
	if revision(st) != "rev-1" || st.Source != srv.BundleURL() || st.LastError != nil {
		t.Fatalf("readyz policies %+v", st)
	}

	// A call the bundle's policy denies is denied, and the decision log
	// names the bundle's revision.
	snap := c.registerExample()
	denied := func(session string) {
		t.Helper()
		args := map[string]any{"owner": "octo", "repo": session}
		formed, err := c.as(api.RoleHost).CreateFormationWithResponse(t.Context(),
			client.FormationRequest{Snapshot: snap, Session: session, Tool: "github/get_repository", Arguments: &args})
		c.must("form", err)
		// Denied: 403 with the record, both engines naming the bundle's rule.
		if formed.StatusCode() != http.StatusForbidden || !bytes.Contains(formed.Body, []byte(`"status":"denied"`)) ||
			bytes.Count(formed.Body, []byte(`"rules":["deny-get-repository"]`)) != 2 {
			t.Fatalf("a call the bundle denies: %d %s", formed.StatusCode(), formed.Body)
		}
	}
	denied("s1")
	tu.Eventually(t, 10*time.Second, "a decision logged", func() bool { return len(r.Events()) > 0 })
	if ev := r.Events()[0]; ev.Bundles["fcd"].Revision != "rev-1" {
		t.Errorf("decision log bundles %v, want fcd's revision rev-1", ev.Bundles)
	}
	tu.Eventually(t, 10*time.Second, "the trail's policy event", func() bool {
		return trailHas(t, filepath.Join(dir, "audit"), `"kind":"policy"`, `"revision":"rev-1"`)
	})

	// Refused bundles: the set in force stays and keeps deciding.
	for _, tc := range []struct {
		note, result string
		bundle       []byte
	}{
		{"signed with another key", "signature", bundletest.Build(t, readDenyingSet(false), "rev-forged", other)},
		{"its tests fail", "tests_failed", bundletest.Build(t, readDenyingSet(true), "rev-failing", key)},
	} {
		srv.Set(tc.bundle)
		want := `fcd_policy_reloads_total{result="` + tc.result + `"} 1`
		tu.Eventually(t, 10*time.Second, tc.note+": refused", func() bool {
			resp, err := c.as("").GetMetricsWithResponse(t.Context())
			c.must("metrics", err)
			return strings.Contains(string(resp.Body), want)
		})
		st := policies()
		if revision(st) != "rev-1" || st.LastError == nil || *st.LastError == "" {
			t.Errorf("%s: readyz policies %+v", tc.note, st)
		}
		denied("s-" + tc.result)
	}

	// A new good revision is taken.
	srv.Set(bundletest.Build(t, readDenyingSet(false), "rev-2", key))
	tu.Eventually(t, 10*time.Second, "rev-2 in force", func() bool { return revision(policies()) == "rev-2" })
	if st := policies(); st.LastError != nil {
		t.Errorf("readyz policies after rev-2: %+v", st)
	}
	tu.Eventually(t, 10*time.Second, "rev-2 in the trail", func() bool {
		return trailHas(t, filepath.Join(dir, "audit"), `"kind":"policy"`, `"revision":"rev-2"`)
	})
}

// trailHas reports whether a line of a trail file under root holds every
// one of parts.
func trailHas(t *testing.T, root string, parts ...string) bool {
	t.Helper()
	found := false
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for line := range bytes.Lines(data) {
			all := true
			for _, part := range parts {
				all = all && bytes.Contains(line, []byte(part))
			}
			found = found || all
		}
		return nil
	})
	return found
}
