package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/manifest"
)

func TestCertificatesOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	example := exampleCertificate(t)
	signCert := func(doc []byte, useRegistrar bool) []byte {
		t.Helper()
		key := f.issuerKey
		if useRegistrar {
			key = f.key
		}
		jws, err := manifest.Sign(doc, key, manifest.TypCertificate)
		if err != nil {
			t.Fatal(err)
		}
		return jws
	}
	// Before the epochs exist the certificate does not fit the registry.
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(example, false)), http.StatusUnprocessableEntity, "certificate-mismatch")

	f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.3"), nil)), http.StatusCreated, "")
	f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil)), http.StatusCreated, "")

	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(example, true)), http.StatusForbidden, "untrusted-signer")
	// A signed manifest is not a certificate (its typ differs).
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil)), http.StatusUnauthorized, "bad-signature")
	f.expect(f.do("POST", "/v1/certificates", api.RoleHost, signCert(example, false)), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(mutate(t, example, func(m map[string]any) { m["note"] = "x" }), false)), http.StatusBadRequest, "malformed-document")
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(mutate(t, example, func(m map[string]any) { m["tool"] = "fork_repository" }), false)), http.StatusUnprocessableEntity, "certificate-mismatch")

	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(mutate(t, example, func(m map[string]any) {
		m["issuedAt"], m["expiresAt"] = "2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"
	}), false)), http.StatusUnprocessableEntity, "certificate-expired")

	reg := f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(example, false))
	f.expect(reg, http.StatusCreated, "")
	id, _ := reg.Body["id"].(string)
	var c manifest.Certificate
	json.Unmarshal(example, &c)
	if want, _ := c.ID(); id != want || reg.Body["revoked"] != false {
		t.Fatalf("registered certificate: %s (want id %s)", reg.Raw, want)
	}
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, signCert(example, false)), http.StatusOK, "")

	// Where Location points; listed by source and tool; not for hosts.
	if loc := reg.Header.Get("Location"); loc != "/v1/certificates/"+id {
		t.Fatalf("Location %q", loc)
	}
	shown := f.do("GET", "/v1/certificates/"+id, api.RoleOperator, nil)
	f.expect(shown, http.StatusOK, "")
	if shown.Body["id"] != id || shown.Body["revoked"] != false {
		t.Fatalf("shown: %s", shown.Raw)
	}
	f.expect(f.do("GET", "/v1/certificates/"+id, api.RoleHost, nil), http.StatusForbidden, "forbidden-role")
	listed := func(query string) []any {
		t.Helper()
		r := f.do("GET", "/v1/certificates"+query, api.RoleRegistrar, nil)
		f.expect(r, http.StatusOK, "")
		cs, _ := r.Body["certificates"].([]any)
		return cs
	}
	for query, n := range map[string]int{
		"": 1, "?source=" + c.Source: 1, "?source=" + c.Source + "&tool=create_repository": 1,
		"?source=" + c.Source + "&tool=delete_repository": 0, "?source=" + c.Target: 0,
	} {
		if cs := listed(query); len(cs) != n {
			t.Fatalf("list %q: %d certificates, want %d", query, len(cs), n)
		}
	}
	f.expect(f.do("GET", "/v1/certificates?tool=create_repository", api.RoleOperator, nil), http.StatusBadRequest, "invalid-request")

	rev := f.do("DELETE", "/v1/certificates/"+id, api.RoleRegistrar, nil)
	f.expect(rev, http.StatusOK, "")
	if rev.Body["revoked"] != true {
		t.Fatalf("revoke: %s", rev.Raw)
	}
	f.expect(f.do("DELETE", "/v1/certificates/"+id, api.RoleRegistrar, nil), http.StatusConflict, "certificate-revoked")
	if r := f.do("GET", "/v1/certificates/"+id, api.RoleOperator, nil); r.Body["revoked"] != true {
		t.Fatalf("after revocation: %s", r.Raw)
	}
	f.expect(f.do("GET", "/v1/certificates/sha256:nope", api.RoleOperator, nil), http.StatusNotFound, "certificate-not-found")
	f.expect(f.do("DELETE", "/v1/certificates/sha256:nope", api.RoleRegistrar, nil), http.StatusNotFound, "certificate-not-found")
}
