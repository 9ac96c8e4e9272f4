package api_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/manifest"
	fcdserver "github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// uncertainLease forms and admits a read call in session, claims its
// lease as a fence does and reports it uncertain; it returns the lease,
// the formation and the source epoch.
func (f *fixture) uncertainLease(snap, session string) (leaseID, formation, epoch string) {
	f.t.Helper()
	r := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, session, "github/get_repository", `{"owner":"octo","repo":"`+session+`"}`, ""))
	f.expect(r, http.StatusCreated, "")
	formation = r.Body["id"].(string)
	epoch = r.Body["source"].(map[string]any)["epoch"].(string)
	a := f.do("POST", "/v1/formations/"+formation+"/admit", api.RoleGateway, nil)
	f.expect(a, http.StatusOK, "")
	parts := strings.Split(a.Body["token"].(string), ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		f.t.Fatal(err)
	}
	var claims struct {
		Lease    string `json:"jti"`
		Epoch    string `json:"fcd_epoch"`
		Revision int64  `json:"fcd_revision"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		f.t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"claim": "cl_" + session, "epoch": claims.Epoch, "revision": claims.Revision})
	f.expect(f.do("POST", "/v1/leases/"+claims.Lease+"/claim", api.RoleBackend, body), http.StatusOK, "")
	f.expect(f.do("POST", "/v1/leases/"+claims.Lease+"/complete", api.RoleBackend,
		[]byte(`{"outcome":"uncertain","claim":"cl_`+session+`"}`)), http.StatusOK, "")
	return claims.Lease, formation, epoch
}

// signedServer is a second replica beside the fixture's, on the same
// store (so the fixture's leases are this server's), whose use cases
// verify resolutions against operators; it returns its URL.
func (f *fixture) signedServer(operators *manifesttest.Signer) string {
	f.t.Helper()
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		f.t.Fatal(err)
	}
	srv := servertest.Start(f.t, fcdserver.Config{
		EtcdEndpoints: f.member.Endpoints(), EtcdPrefix: testPrefix, EtcdQuota: f.member.Quota(),
		Registrars: manifesttest.NewSigner(f.t).Verifier, Issuers: f.certificates, Operators: operators.Verifier,
		Auth: f.cfg.Auth, Signer: key, Issuer: "fcd-test", GatewayCaller: string(f.binding),
		FormationRate: fcdserver.NoFormationLimit, AuditDir: fcdserver.AuditOff, Logger: f.cfg.Logger,
	})
	oasWatch(f.t, srv.URL(), f.t)
	return srv.URL()
}

// resolutionBody is {"resolution": JWS} of a resolution of lease signed
// with key, issued now plus at.
func resolutionBody(t *testing.T, key jwk.Key, lease, outcome string, at time.Duration) ([]byte, string) {
	t.Helper()
	jws, err := manifest.SignResolution(&manifest.Resolution{Lease: lease, Outcome: outcome, Reason: "checked the GitHub audit log",
		Operator: "dana@example.com", IssuedAt: time.Now().UTC().Add(at).Truncate(time.Second)}, key)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]string{"resolution": string(jws)})
	return body, string(jws)
}

// TestSignedResolutionOverHTTP: on a server with operator keys an
// uncertain lease is resolved only by a signed resolution of that lease:
// an unsigned body, a forged, untrusted, mistyped, expired or other
// lease's document, a document replayed for another lease are refused and
// the lease stays uncertain; a good one closes it, is kept with it and
// shown, and another good one still resolves the other lease. A server
// without operator keys refuses signed documents.
func TestSignedResolutionOverHTTP(t *testing.T) {
	f, snap := newReadyFixture(t)
	operators, stranger := manifesttest.NewSigner(t), manifesttest.NewSigner(t)
	url := f.signedServer(operators)
	call := func(method, path string, role api.Role, body []byte) reply {
		t.Helper()
		return apitest.Do(t, method, url+path, string(f.creds[role]), nil, body)
	}
	leaseA, formationA, epoch := f.uncertainLease(snap, "res-a")
	leaseB, formationB, _ := f.uncertainLease(snap, "res-b")
	resolveA := "/v1/leases/" + leaseA + "/resolve"

	state := func(lease string) string {
		t.Helper()
		r := call("GET", "/v1/epochs/"+epoch+"/leases", api.RoleOperator, nil)
		f.expect(r, http.StatusOK, "")
		for _, l := range r.Body["leases"].([]any) {
			if l := l.(map[string]any); l["id"] == lease {
				return l["state"].(string)
			}
		}
		return "closed"
	}
	status := func(formation string) string {
		t.Helper()
		r := call("GET", "/v1/formations/"+formation, api.RoleOperator, nil)
		f.expect(r, http.StatusOK, "")
		return r.Body["status"].(string)
	}
	stillUncertain := func(what, lease, formation string) {
		t.Helper()
		if st, fs := state(lease), status(formation); st != "uncertain" || fs != "uncertain" {
			t.Fatalf("after %s: lease %s, formation %s; want both uncertain", what, st, fs)
		}
		f.expect(call("GET", "/v1/leases/"+lease+"/resolution", api.RoleOperator, nil), http.StatusNotFound, "resolution-not-found")
	}

	good, goodJWS := resolutionBody(t, operators.Key, leaseA, "no_effect", -time.Minute)
	parts := strings.Split(goodJWS, ".")
	forgedPayload, _ := json.Marshal(map[string]any{"lease": leaseA, "outcome": "effect", "reason": "checked the GitHub audit log",
		"operator": "dana@example.com", "issuedAt": time.Now().UTC().Format(time.RFC3339)})
	wrap := func(jws string) []byte { b, _ := json.Marshal(map[string]string{"resolution": jws}); return b }
	manifestTyp := func() []byte {
		payload := []byte(strings.TrimSpace(string(mustDecode(t, parts[1]))))
		jws, err := manifest.Sign(payload, operators.Key, manifest.TypManifest)
		if err != nil {
			t.Fatal(err)
		}
		return wrap(string(jws))
	}()
	forB, _ := resolutionBody(t, operators.Key, leaseB, "effect", 0)
	for _, tc := range []struct {
		note   string
		role   api.Role
		body   []byte
		status int
		slug   string
	}{
		{"an unsigned resolution", api.RoleOperator, []byte(`{"outcome":"no_effect","reason":"checked"}`), 403, "resolution-unsigned"},
		{"an empty resolution", api.RoleOperator, []byte(`{}`), 403, "resolution-unsigned"},
		{"a host credential", api.RoleHost, good, 403, "forbidden-role"},
		{"a forged payload", api.RoleOperator, wrap(parts[0] + "." + base64.RawURLEncoding.EncodeToString(forgedPayload) + "." + parts[2]), 403, "resolution-invalid"},
		{"another key", api.RoleOperator, func() []byte { b, _ := resolutionBody(t, stranger.Key, leaseA, "no_effect", 0); return b }(), 403, "resolution-invalid"},
		{"a manifest's typ", api.RoleOperator, manifestTyp, 403, "resolution-invalid"},
		{"issued two hours ago", api.RoleOperator, func() []byte { b, _ := resolutionBody(t, operators.Key, leaseA, "no_effect", -2*time.Hour); return b }(), 403, "resolution-invalid"},
		{"issued ahead", api.RoleOperator, func() []byte { b, _ := resolutionBody(t, operators.Key, leaseA, "no_effect", 10*time.Minute); return b }(), 403, "resolution-invalid"},
		{"another lease's document", api.RoleOperator, forB, 403, "resolution-invalid"},
		{"not a JWS", api.RoleOperator, []byte(`{"resolution":"no_effect"}`), 403, "resolution-invalid"},
		{"a document and an outcome", api.RoleOperator, []byte(fmt.Sprintf(`{"resolution":%q,"outcome":"effect"}`, goodJWS)), 400, "invalid-request"},
		{"an unknown member", api.RoleOperator, []byte(fmt.Sprintf(`{"resolution":%q,"by":"me"}`, goodJWS)), 400, "malformed-json"},
	} {
		f.expect(call("POST", resolveA, tc.role, tc.body), tc.status, tc.slug)
		stillUncertain(tc.note, leaseA, formationA)
	}

	r := call("POST", resolveA, api.RoleOperator, good)
	f.expect(r, http.StatusOK, "")
	if r.Body["lease"] != leaseA || r.Body["outcome"] != "no_effect" || r.Body["formation"] != formationA ||
		r.Body["signer"] != operators.Key.KeyID() || r.Body["operator"] != "dana@example.com" || !manifest.ValidDigest(fmt.Sprint(r.Body["digest"])) {
		t.Fatalf("resolved: %s", r.Raw)
	}
	if st, fs := state(leaseA), status(formationA); st != "closed" || fs != "rejected" {
		t.Fatalf("after the signed resolution: lease %s, formation %s", st, fs)
	}
	kept := call("GET", "/v1/leases/"+leaseA+"/resolution", api.RoleOperator, nil)
	f.expect(kept, http.StatusOK, "")
	if kept.Body["resolution"] != goodJWS || kept.Body["signer"] != operators.Key.KeyID() || kept.Body["digest"] != r.Body["digest"] ||
		kept.Body["lease"] != leaseA || kept.Body["outcome"] != "no_effect" || kept.Body["operator"] != "dana@example.com" ||
		kept.Body["reason"] != "checked the GitHub audit log" {
		t.Fatalf("kept resolution: %s", kept.Raw)
	}
	if _, err := operators.Verifier.VerifyResolution([]byte(kept.Body["resolution"].(string)), time.Now()); err != nil {
		t.Fatalf("the kept document does not verify: %v", err)
	}
	f.expect(call("GET", "/v1/leases/"+leaseA+"/resolution", api.RoleHost, nil), http.StatusForbidden, "forbidden-role")
	// The fixture's server reads the same store.
	f.expect(f.do("GET", "/v1/leases/"+leaseA+"/resolution", api.RoleOperator, nil), http.StatusOK, "")

	// Replayed: on its lease, closed; for another lease, refused.
	f.expect(call("POST", resolveA, api.RoleOperator, good), http.StatusConflict, "lease-closed")
	f.expect(call("POST", "/v1/leases/"+leaseB+"/resolve", api.RoleOperator, good), http.StatusForbidden, "resolution-invalid")
	stillUncertain("a replay for another lease", leaseB, formationB)
	// A server without operator keys cannot verify a signed resolution.
	f.expect(f.do("POST", "/v1/leases/"+leaseB+"/resolve", api.RoleOperator, forB), http.StatusForbidden, "resolution-invalid")
	stillUncertain("a signed resolution without operator keys", leaseB, formationB)

	// A good document still resolves the other lease.
	r = call("POST", "/v1/leases/"+leaseB+"/resolve", api.RoleOperator, forB)
	f.expect(r, http.StatusOK, "")
	if r.Body["outcome"] != "effect" || status(formationB) != "completed" || state(leaseB) != "closed" {
		t.Fatalf("resolving the other lease: %s", r.Raw)
	}
}

func mustDecode(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
