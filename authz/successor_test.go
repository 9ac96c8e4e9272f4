package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// succEnv is admitEnv with successors: the github v1.3 release registered
// beside v1.4 (and a v1.2 on demand), a compatibility issuer key trusted
// by both the registry and the formations, and certificates registered
// through the registry (real signatures, real verification).
type succEnv struct {
	*admitEnv
	t         testing.TB
	registry  *authz.Registry
	issuerKey jwk.Key
	issuers   *manifest.Verifier
	decider   authz.Decider
	// epochs maps a release ("v1.4", "v1.3", "v1.2") to its epoch id.
	epochs map[string]string
}

func newSuccEnv(t testing.TB) *succEnv {
	t.Helper()
	return newSuccEnvWith(t, defaultSet(t))
}

func newSuccEnvWith(t testing.TB, decider authz.Decider) *succEnv {
	t.Helper()
	e := newAdmitEnv(t, decider)
	issuer := manifesttest.NewSigner(t)
	s := &succEnv{admitEnv: e, t: t, issuerKey: issuer.Key, issuers: issuer.Verifier, decider: decider, epochs: map[string]string{"v1.4": e.snapshotEpoch(t)},
		registry: authztest.Registry(t, authz.RegistryConfig{Store: e.store, Manifests: nil, Logger: quiet, Certificates: issuer.Verifier, Now: e.clock.Now})}
	s.forms = s.formations(issuer.Verifier)
	s.register(t, "v1.3", nil)
	return s
}

// formations returns a replica of the formations use case trusting the
// given issuer keys.
func (s *succEnv) formations(issuers *manifest.Verifier) *authz.UseCases {
	return authztest.New(s.t, authz.Config{Store: s.store, Decider: s.decider, Now: s.clock.Now, Issuer: s.iss, Logger: quiet, Certificates: issuers})
}

// register registers the example v1.3 manifest, edited, as release.
func (s *succEnv) register(t testing.TB, release string, edit func(m *manifest.Manifest)) string {
	t.Helper()
	id := registerExample(t, s.store, "v1.3", edit)
	s.epochs[release] = id
	return id
}

// cert describes a certificate from v1.4 for create_repository.
type cert struct {
	target   string // release
	envelope string
	effects  map[string]any
	profile  string
	issued   time.Duration // relative to the test clock
	expires  time.Duration
	key      jwk.Key // nil: the trusted issuer key
}

// privateOnly covers calls that say private: true explicitly.
const privateOnly = `{"type":"object","required":["private"],"properties":{"private":{"const":true}}}`

// certify signs and registers c, and returns its id.
func (s *succEnv) certify(t testing.TB, c cert) string {
	t.Helper()
	now := s.clock.Now()
	if c.target == "" {
		c.target = "v1.3"
	}
	if c.envelope == "" {
		c.envelope = privateOnly
	}
	if c.effects == nil {
		c.effects = map[string]any{"visibility": "private"}
	}
	if c.profile == "" {
		c.profile = "github-create-repository/1"
	}
	if c.issued == 0 {
		c.issued = -time.Hour
	}
	if c.expires == 0 {
		c.expires = 24 * time.Hour
	}
	doc, err := json.Marshal(manifest.Certificate{
		Source: s.epochs["v1.4"], Target: s.epochs[c.target], Tool: "create_repository",
		Envelope: json.RawMessage(c.envelope), Effects: c.effects,
		Profile:  manifest.ProfileRef{ID: c.profile, Digest: manifest.DigestBytes([]byte(c.profile))},
		IssuedAt: now.Add(c.issued), ExpiresAt: now.Add(c.expires),
	})
	if err != nil {
		t.Fatal(err)
	}
	key := c.key
	if key == nil {
		key = s.issuerKey
	}
	jws, err := manifest.Sign(doc, key, manifest.TypCertificate)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := s.registry.Certificates.Register(context.Background(), jws)
	if err != nil {
		t.Fatal(err)
	}
	return rec.ID
}

// create forms a create_repository call approved by bob.
func (s *succEnv) create(t *testing.T, name string, private *bool) *record.Formation {
	t.Helper()
	args := map[string]any{"name": name}
	if private != nil {
		args["private"] = *private
	}
	b, _ := json.Marshal(args)
	return s.ready(t, "sess-"+name, "github/create_repository", string(b), nil, "bob")
}

func (s *succEnv) retire(t *testing.T, release string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.store.Drain(ctx, s.epochs[release]); err != nil {
		t.Fatal(err)
	}
	if st, err := s.store.Retire(ctx, s.epochs[release], 0); err != nil || st != record.StateStale {
		t.Fatalf("retire %s: %s %v", release, st, err)
	}
}

var yes = func() *bool { b := true; return &b }()

// checkRecord checks that the record's digest covers what it holds.
func checkRecord(t *testing.T, f *record.Formation) {
	t.Helper()
	d, err := f.Call.Digest()
	if err != nil || d != f.Digest {
		t.Fatalf("digest %s, recomputed %s (%v)", f.Digest, d, err)
	}
	if f.Successor != nil {
		without := f.Call
		without.Successor = nil
		if d2, _ := without.Digest(); d2 == f.Digest {
			t.Fatal("the digest does not cover the successor")
		}
	}
}

func TestSuccessorCapture(t *testing.T) {
	other := manifesttest.NewSigner(t) // an issuer authzd does not trust
	tests := []struct {
		name string
		// setup registers certificates and may change the env; it returns
		// the id of the certificate expected to be captured, or "".
		setup   func(t *testing.T, s *succEnv) string
		private *bool
	}{
		{"envelope fits", func(t *testing.T, s *succEnv) string { return s.certify(t, cert{}) }, yes},
		{"envelope misfit (private omitted)", func(t *testing.T, s *succEnv) string { s.certify(t, cert{}); return "" }, nil},
		{"no certificate", func(t *testing.T, s *succEnv) string { return "" }, yes},
		{"revoked before formation", func(t *testing.T, s *succEnv) string {
			id := s.certify(t, cert{})
			if _, err := s.registry.Certificates.Revoke(context.Background(), "ops", id); err != nil {
				t.Fatal(err)
			}
			return ""
		}, yes},
		{"expired", func(t *testing.T, s *succEnv) string {
			s.certify(t, cert{expires: time.Minute})
			s.clock.Advance(2 * time.Minute)
			return ""
		}, yes},
		{"not valid yet", func(t *testing.T, s *succEnv) string {
			s.certify(t, cert{issued: time.Hour, expires: 2 * time.Hour})
			return ""
		}, yes},
		{"target draining", func(t *testing.T, s *succEnv) string {
			s.certify(t, cert{})
			if _, err := s.store.Drain(context.Background(), s.epochs["v1.3"]); err != nil {
				t.Fatal(err)
			}
			return ""
		}, yes},
		{"issuer no longer trusted", func(t *testing.T, s *succEnv) string {
			s.certify(t, cert{})
			s.forms = s.formations(other.Verifier)
			return ""
		}, yes},
		{"no issuer keys configured", func(t *testing.T, s *succEnv) string {
			s.certify(t, cert{})
			s.forms = s.formations(nil)
			return ""
		}, yes},
		{"envelope the target's schema refuses", func(t *testing.T, s *succEnv) string {
			s.register(t, "v1.2", func(m *manifest.Manifest) {
				m.Server.Release, m.Pool = "v1.2.0", "github-v1-2"
				tool := m.Tool("create_repository")
				tool.InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}},"additionalProperties":false}`)
			})
			s.certify(t, cert{target: "v1.2"})
			return ""
		}, yes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuccEnv(t)
			want := tc.setup(t, s)
			f := s.create(t, "repo", tc.private)
			checkRecord(t, f)
			if want == "" {
				if f.Successor != nil {
					t.Fatalf("captured %+v, want no successor", f.Successor)
				}
				return
			}
			sc := f.Successor
			if sc == nil || sc.Certificate != want || sc.Epoch != s.epochs["v1.3"] || sc.Pool != "github-v1-3" ||
				sc.Release != "v1.3.0" || sc.Effects["visibility"] != "private" || sc.Issuer != s.issuerKey.KeyID() {
				t.Fatalf("successor %+v, want v1.3 through %s", sc, want)
			}
			if d := f.Decision.Successor; d == nil || d.Verdict != record.VerdictAllow || d.Certificate != want {
				t.Fatalf("decision on the successor: %+v", d)
			}
			// The approval was bound to the digest that covers the successor.
			if f.Approvals[0].Digest != f.Digest {
				t.Fatalf("approval bound to %s, record %s", f.Approvals[0].Digest, f.Digest)
			}
		})
	}
}

// TestPolicyRefusesSuccessor: the default policies refuse a successor
// whose modeled effect is a public repository. The call keeps its own
// decision and has no successor; the refusal is recorded; once the source
// is STALE the call cannot run anywhere.
func TestPolicyRefusesSuccessor(t *testing.T) {
	s := newSuccEnv(t)
	id := s.certify(t, cert{effects: map[string]any{"visibility": "public"}})
	f := s.create(t, "public-successor", yes)
	checkRecord(t, f)
	if f.Successor != nil {
		t.Fatalf("captured %+v, want the successor refused", f.Successor)
	}
	if d := f.Decision.Successor; d == nil || d.Verdict != record.VerdictDeny || d.Certificate != id || d.Epoch != s.epochs["v1.3"] {
		t.Fatalf("decision on the successor: %+v", d)
	}
	for _, e := range f.Decision.Engines {
		if e.Successor == nil || e.Successor.Verdict != record.VerdictDeny || !slices.Contains(e.Successor.Rules, "deny-successor-public") {
			t.Fatalf("%s on the successor: %+v", e.Engine, e.Successor)
		}
	}
	if !f.Decision.Allowed() || f.ApprovalsRequired != 1 {
		t.Fatalf("the call's own decision changed: %+v", f.Decision)
	}
	s.retire(t, "v1.4")
	if _, err := s.forms.Admissions.Admit(context.Background(), f.ID); !errors.Is(err, authz.ErrSourceStale) {
		t.Fatalf("admission: %v, want ErrSourceStale", err)
	}
}

// TestPolicyChangeRefusesSuccessorAtAdmission: a policy set that changed
// since formation and now refuses the successor takes it away at
// admission (410); it never adds one.
func TestPolicyChangeRefusesSuccessorAtAdmission(t *testing.T) {
	dir, write := policyDir(t)
	allowRego, allowCedar := allowAllRego, allowAllCedar
	refuseRego := allowRego + "\ndeny_successor contains {\"rule\": \"no-successors\", \"reason\": \"off\"}\n"
	refuseCedar := allowCedar + "\n@id(\"no-successors\")\nforbid (principal, action == Action::\"substitute\", resource);\n"
	write(allowRego, allowCedar)
	pm, err := policy.NewManager(context.Background(), policy.Source{Dir: dir}, policy.ManagerConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s := newSuccEnvWith(t, pm)
	ctx := context.Background()
	s.certify(t, cert{})
	f := s.create(t, "r", yes)
	if f.Successor == nil {
		t.Fatal("no successor captured")
	}
	// A call formed under the refusing policy gets none.
	write(refuseRego, refuseCedar)
	if err := pm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if g := s.create(t, "g", yes); g.Successor != nil || g.Decision.Successor == nil || g.Decision.Successor.Verdict != record.VerdictDeny {
		t.Fatalf("formed under the refusing policy: successor %+v, decision %+v", g.Successor, g.Decision.Successor)
	}
	s.retire(t, "v1.4")
	if _, err := s.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, authz.ErrSourceStale) {
		t.Fatalf("admission under a policy that now refuses the successor: %v, want ErrSourceStale", err)
	}
	// The policy allows successors again: the one captured at formation
	// is used.
	write(allowRego, allowCedar)
	if err := pm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := s.forms.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.claims(t, a.Token); c.Epoch != s.epochs["v1.3"] {
		t.Fatalf("admitted to %s, want the successor", c.Epoch)
	}
}

// TestSuccessorChoiceIsDeterministic: among several eligible certificates
// the one issued last wins, then the one expiring last, then the smallest
// id — whichever replica forms the call.
func TestExpiredCertificateIsRefused(t *testing.T) {
	s := newSuccEnv(t)
	doc, _ := json.Marshal(manifest.Certificate{
		Source: s.epochs["v1.4"], Target: s.epochs["v1.3"], Tool: "create_repository",
		Envelope: json.RawMessage(privateOnly), Effects: map[string]any{"visibility": "private"},
		Profile:  manifest.ProfileRef{ID: "p", Digest: manifest.DigestBytes([]byte("p"))},
		IssuedAt: s.clock.Now().Add(-2 * time.Hour), ExpiresAt: s.clock.Now().Add(-time.Second),
	})
	jws, err := manifest.Sign(doc, s.issuerKey, manifest.TypCertificate)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.registry.Certificates.Register(context.Background(), jws); !errors.Is(err, authz.ErrCertificateExpired) {
		t.Fatalf("registering an expired certificate: %v", err)
	}
	if recs, err := s.store.CertificatesFor(context.Background(), s.epochs["v1.4"], "create_repository"); err != nil || len(recs) != 0 {
		t.Fatalf("stored: %v %v", recs, err)
	}
}

func TestSuccessorChoiceIsDeterministic(t *testing.T) {
	s := newSuccEnv(t)
	s.register(t, "v1.2", func(m *manifest.Manifest) { m.Server.Release, m.Pool = "v1.2.0", "github-v1-2" })
	s.certify(t, cert{target: "v1.3", profile: "oldest", issued: -3 * time.Hour})
	s.certify(t, cert{target: "v1.2", profile: "later-shorter", issued: -time.Hour, expires: time.Hour})
	c1 := s.certify(t, cert{target: "v1.2", profile: "later-longer-a", issued: -time.Hour, expires: 48 * time.Hour})
	c2 := s.certify(t, cert{target: "v1.3", profile: "later-longer-b", issued: -time.Hour, expires: 48 * time.Hour})
	// Not eligible, though issued last: the arguments do not fit.
	s.certify(t, cert{target: "v1.3", profile: "newest-misfit", issued: -time.Minute,
		envelope: `{"type":"object","required":["description"]}`})
	want := min(c1, c2)

	replica := s.formations(s.issuers)
	for i := range 4 {
		forms := s.forms
		if i%2 == 1 {
			forms = replica
		}
		f, err := forms.Formations.Form(context.Background(), authz.FormRequest{
			Snapshot: s.snapshot, Session: fmt.Sprintf("sess-%d", i), Tool: "github/create_repository",
			Arguments: json.RawMessage(fmt.Sprintf(`{"name":"r%d","private":true}`, i)), PrincipalID: "alice", Host: "host-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		if f.Successor == nil || f.Successor.Certificate != want {
			t.Fatalf("formation %d captured %+v, want certificate %s", i, f.Successor, want)
		}
	}
}

// TestSuccessorAdmission: the source wins while ACTIVE; a DRAINING source
// never substitutes (409); a STALE source sends the call to its successor
// (a token for the successor's pool, epoch, artifact and config); a call
// without a successor gets 410, as does one whose successor is not ACTIVE.
func TestSuccessorAdmission(t *testing.T) {
	s := newSuccEnv(t)
	ctx := context.Background()
	id := s.certify(t, cert{})
	early := s.create(t, "early", yes)
	pending := s.create(t, "pending", yes)
	later := s.create(t, "later", yes)
	omitted := s.create(t, "omitted", nil)
	for _, f := range []*record.Formation{early, pending, later} {
		if f.Successor == nil {
			t.Fatalf("%s has no successor", f.ID)
		}
	}

	a, err := s.forms.Admissions.Admit(ctx, early.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.claims(t, a.Token); c.Epoch != s.epochs["v1.4"] || c.Audience != "github-v1-4" {
		t.Fatalf("admitted while the source is ACTIVE to %s/%s, want the source", c.Audience, c.Epoch)
	}
	s.report(t, a, record.OutcomeEffect)

	if _, err := s.store.Drain(ctx, s.epochs["v1.4"]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.forms.Admissions.Admit(ctx, pending.ID); !errors.Is(err, authz.ErrSourceDraining) {
		t.Fatalf("admission with a DRAINING source: %v, want ErrSourceDraining", err)
	}
	if f, _ := s.forms.Formations.Get(ctx, pending.ID); f.Status != record.StatusReady {
		t.Fatalf("after the refusal the call is %s", f.Status)
	}

	if st, err := s.store.Retire(ctx, s.epochs["v1.4"], 0); err != nil || st != record.StateStale {
		t.Fatalf("retire: %s %v", st, err)
	}
	a, err = s.forms.Admissions.Admit(ctx, pending.ID)
	if err != nil {
		t.Fatalf("admission to the successor: %v", err)
	}
	v13, err := s.store.GetEpoch(ctx, s.epochs["v1.3"])
	if err != nil {
		t.Fatal(err)
	}
	c := s.claims(t, a.Token)
	if c.Epoch != v13.ID || c.Audience != "github-v1-3" || c.Artifact != v13.Artifact.Digest || c.Config != v13.ConfigDigest ||
		c.ArgumentDigest != pending.ArgumentDigest || a.Target.Pool != "github-v1-3" {
		t.Fatalf("successor token %+v (target %+v)", c, a.Target)
	}
	l, err := s.store.OpenLease(ctx, a.Lease)
	if err != nil || l.Certificate != id || l.Target.Epoch != v13.ID {
		t.Fatalf("successor lease %+v %v", l, err)
	}
	again, err := s.forms.Admissions.Admit(ctx, pending.ID)
	if err != nil || s.claims(t, again.Token).ID != c.ID {
		t.Fatalf("re-admission: %v, want the same lease", err)
	}

	if _, err := s.forms.Admissions.Admit(ctx, omitted.ID); !errors.Is(err, authz.ErrSourceStale) {
		t.Fatalf("admission without a successor: %v, want ErrSourceStale", err)
	}
	if _, err := s.store.Drain(ctx, s.epochs["v1.3"]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.forms.Admissions.Admit(ctx, later.ID); !errors.Is(err, authz.ErrSourceStale) {
		t.Fatalf("admission to a DRAINING successor: %v, want ErrSourceStale", err)
	}
}

// TestSuccessorAuthorityOnlyNarrows: what happens between formation and
// admission can take a successor away, never give one: a revocation or an
// expiry removes it, and a certificate registered after formation does not
// apply to calls formed before it.
func TestSuccessorAuthorityOnlyNarrows(t *testing.T) {
	s := newSuccEnv(t)
	ctx := context.Background()
	prefixed := func(p string) string {
		return fmt.Sprintf(`{"type":"object","required":["private","name"],"properties":{"private":{"const":true},"name":{"pattern":"^%s-"}}}`, p)
	}
	revoked := s.certify(t, cert{envelope: prefixed("r"), profile: "r"})
	s.certify(t, cert{envelope: prefixed("e"), profile: "e", expires: 10 * time.Minute})
	fr := s.create(t, "r-1", yes)
	fe := s.create(t, "e-1", yes)
	fl := s.create(t, "l-1", yes)
	if fr.Successor == nil || fe.Successor == nil || fl.Successor != nil {
		t.Fatalf("successors at formation: %v %v %v", fr.Successor, fe.Successor, fl.Successor)
	}
	late := s.certify(t, cert{envelope: prefixed("l"), profile: "l"})
	if _, err := s.registry.Certificates.Revoke(ctx, "ops", revoked); err != nil {
		t.Fatal(err)
	}
	s.clock.Advance(11 * time.Minute) // past the "e" certificate, not the formations
	s.retire(t, "v1.4")

	for name, f := range map[string]*record.Formation{"revoked": fr, "expired": fe, "certificate after formation": fl} {
		if _, err := s.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, authz.ErrSourceStale) {
			t.Errorf("%s: admission %v, want ErrSourceStale", name, err)
		}
	}
	// The late certificate does apply to a call formed after it.
	f := s.create(t, "l-2", yes)
	if f.Successor == nil || f.Successor.Certificate != late {
		t.Fatalf("formed after the certificate: successor %+v", f.Successor)
	}
	if _, err := s.forms.Admissions.Admit(ctx, f.ID); err != nil {
		t.Fatalf("admission through the late certificate: %v", err)
	}
}

// TestRevocationRacesAdmission: a revocation and an admission that relies
// on the certificate are ordered by etcd: the admission either committed
// before the revocation (its lease's revision is lower) or is refused.
func TestRevocationRacesAdmission(t *testing.T) {
	s := newSuccEnv(t)
	ctx := context.Background()
	s.retire(t, "v1.4")
	var admitted, refused int
	for i := range 12 {
		envelope := fmt.Sprintf(`{"type":"object","required":["private","name"],"properties":{"private":{"const":true},"name":{"const":"race-%d"}}}`, i)
		id := s.certify(t, cert{envelope: envelope, profile: fmt.Sprint("race-", i)})
		f := s.create(t, fmt.Sprint("race-", i), yes)
		if f.Successor == nil || f.Successor.Certificate != id {
			t.Fatalf("round %d: successor %+v", i, f.Successor)
		}
		var (
			wg     sync.WaitGroup
			a      *authz.Grant
			aerr   error
			revRev int64
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			// A delay that varies the interleaving from round to round on
			// purpose: the race is what is under test, and nothing relies
			// on it to order the two calls.
			time.Sleep(time.Duration(i%4) * time.Millisecond)
			rec, err := s.registry.Certificates.Revoke(ctx, "ops", id)
			if err != nil {
				t.Error(err)
				return
			}
			revRev = rec.Revision
		}()
		go func() {
			defer wg.Done()
			a, aerr = s.forms.Admissions.Admit(ctx, f.ID)
		}()
		wg.Wait()
		switch {
		case aerr == nil:
			admitted++
			if c := s.claims(t, a.Token); c.Revision >= revRev {
				t.Fatalf("round %d: admitted at revision %d, after the revocation at %d", i, c.Revision, revRev)
			}
		case errors.Is(aerr, authz.ErrSourceStale):
			refused++
		default:
			t.Fatalf("round %d: %v", i, aerr)
		}
	}
	t.Logf("%d admitted before the revocation, %d refused after it", admitted, refused)
}
