package api_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/manifest"
)

// TestComparisonOverHTTP: a drifted call (github formed on v1.4.0, with
// the v1.4 → v1.3 certificate registered) shows its successor with the
// certificate's modeled effects, and, once v1.4 drains, the active v1.3
// beside it — the descriptors identical, the configured default for the
// omitted `private` not.
func TestComparisonOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.3"), nil)), http.StatusCreated, "")
	v14 := f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil))
	f.expect(v14, http.StatusCreated, "")
	cert, err := manifest.Sign(exampleCertificate(t), f.issuerKey, manifest.TypCertificate)
	if err != nil {
		t.Fatal(err)
	}
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, cert), http.StatusCreated, "")
	snap := f.do("POST", "/v1/snapshots", api.RoleHost, nil)
	f.expect(snap, http.StatusCreated, "")
	sid := snap.Body["id"].(string)

	covered := f.do("POST", "/v1/formations", api.RoleHost, formationBody(sid, "s1", "github/create_repository", `{"name":"payroll","private":true}`, "alice"))
	f.expect(covered, http.StatusCreated, "")
	if covered.Body["successor"] == nil {
		t.Fatalf("the certificate gives the covered call no successor: %s", covered.Raw)
	}
	c := f.do("GET", "/v1/formations/"+covered.Body["id"].(string)+"/comparison", api.RoleApprover, nil)
	f.expect(c, http.StatusOK, "")
	succ, _ := c.Body["successor"].(map[string]any)
	if succ["release"] != "v1.3.0" || c.Body["active"] != nil || c.Body["source"].(map[string]any)["release"] != "v1.4.0" {
		t.Fatalf("covered call's columns: %s", c.Raw)
	}
	if fx := succ["certificate"].(map[string]any)["effects"].(map[string]any); fx["visibility"] != "private" {
		t.Fatalf("successor's certificate effects: %v", fx)
	}
	if d := diff(c, "successor", "/config/values/repository.defaultVisibility"); d == nil || d["source"] != "private" || d["other"] != "public" {
		t.Fatalf("default visibility difference: %v in %s", d, c.Raw)
	}

	drifted := f.do("POST", "/v1/formations", api.RoleHost, formationBody(sid, "s2", "github/create_repository", `{"name":"payroll-exports"}`, "alice"))
	f.expect(drifted, http.StatusCreated, "")
	if drifted.Body["successor"] != nil {
		t.Fatalf("the envelope does not cover an omitted private: %s", drifted.Raw)
	}
	id := drifted.Body["id"].(string)
	// Before the rollback the source is what the server shows: one column.
	c = f.do("GET", "/v1/formations/"+id+"/comparison", api.RoleHost, nil)
	f.expect(c, http.StatusOK, "")
	if c.Body["successor"] != nil || c.Body["active"] != nil || len(c.Body["differences"].([]any)) != 0 {
		t.Fatalf("before the rollback: %s", c.Raw)
	}
	// The rollback: v1.4 drains, v1.3 is the server's active epoch.
	f.expect(f.do("POST", "/v1/epochs/"+v14.Body["epoch"].(string)+"/drain", api.RoleOperator, nil), http.StatusOK, "")
	c = f.do("GET", "/v1/formations/"+id+"/comparison", api.RoleOperator, nil)
	f.expect(c, http.StatusOK, "")
	active, _ := c.Body["active"].(map[string]any)
	if active["release"] != "v1.3.0" || active["state"] != "ACTIVE" || c.Body["source"].(map[string]any)["state"] != "DRAINING" {
		t.Fatalf("after the rollback: %s", c.Raw)
	}
	omitted, _ := c.Body["omitted"].([]any)
	if !slices.Contains(omitted, any("private")) {
		t.Fatalf("omitted %v, want private among them", omitted)
	}
	if d := diff(c, "active", "/config/values/repository.defaultVisibility"); d == nil || d["source"] != "private" || d["other"] != "public" {
		t.Fatalf("the omitted private's default: %v in %s", d, c.Raw)
	}
	for _, d := range c.Body["differences"].([]any) {
		d := d.(map[string]any)
		if p := d["pointer"].(string); len(p) >= 5 && p[:5] == "/tool" {
			t.Errorf("the descriptors are identical, yet %s differs", p)
		}
		if d["column"] != "active" {
			t.Errorf("difference in column %v", d["column"])
		}
	}
	if diff(c, "active", "/release") == nil || diff(c, "active", "/config/digest") == nil {
		t.Errorf("release and config digest differences missing: %s", c.Raw)
	}

	f.expect(f.do("GET", "/v1/formations/"+id+"/comparison", api.RoleBackend, nil), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("GET", "/v1/formations/fm_nope/comparison", api.RoleApprover, nil), http.StatusNotFound, "formation-not-found")
}

// diff is the difference of column at pointer in a comparison, or nil.
func diff(c reply, column, pointer string) map[string]any {
	ds, _ := c.Body["differences"].([]any)
	for _, d := range ds {
		if d := d.(map[string]any); d["column"] == column && d["pointer"] == pointer {
			return d
		}
	}
	return nil
}
