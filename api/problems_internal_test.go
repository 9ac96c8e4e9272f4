package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"sigs.k8s.io/yaml"
)

// extraSlugs are problem types written outside problemRules: readyz's
// not-ready and toProblem's fallback.
var extraSlugs = map[string]int{"not-ready": http.StatusServiceUnavailable, "internal": http.StatusInternalServerError}

// slugStatus maps every problem slug fcd can answer to its status.
func slugStatus(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range problemRules {
		if prev, ok := out[r.slug]; ok && prev != r.status {
			t.Errorf("slug %s has two statuses: %d and %d", r.slug, prev, r.status)
		}
		out[r.slug] = r.status
	}
	for s, st := range extraSlugs {
		out[s] = st
	}
	return out
}

// TestProblemsDocumented checks that docs/problems.md has one "## <slug>"
// section per problem type, stating its status, and no section for a
// slug fcd does not answer.
func TestProblemsDocumented(t *testing.T) {
	raw, err := os.ReadFile("../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	parts := regexp.MustCompile(`(?m)^## `).Split(string(raw), -1)
	for _, part := range parts[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		slug := strings.TrimSpace(heading)
		if _, dup := sections[slug]; dup {
			t.Errorf("docs/problems.md: two sections ## %s", slug)
		}
		sections[slug] = body
	}
	known := slugStatus(t)
	for slug, status := range known {
		body, ok := sections[slug]
		if !ok {
			t.Errorf("docs/problems.md lacks a section \"## %s\"", slug)
			continue
		}
		if !strings.Contains(body, fmt.Sprintf("**%d**", status)) {
			t.Errorf("docs/problems.md ## %s does not state its status **%d**", slug, status)
		}
	}
	for slug := range sections {
		if _, ok := known[slug]; !ok {
			t.Errorf("docs/problems.md has a section \"## %s\" for a problem type fcd never answers", slug)
		}
	}
}

// TestToProblem maps a representative error of every rule, wrapped as
// handlers and use cases wrap them.
func TestToProblem(t *testing.T) {
	findings := []manifest.Finding{{Rule: "approval-required", Severity: "error", Path: "/tools/0/requiresApproval", Message: "m"}}
	violations := []manifest.Violation{{InstancePath: "/name", Message: "missing property"}, {InstancePath: "/private", Message: "got string, want boolean"}}
	cases := []struct {
		name   string
		err    error
		status int
		slug   string
		ext    map[string]any
	}{
		{"unauthenticated", errUnauthenticated, 401, "unauthenticated", nil},
		{"forbidden role", fmt.Errorf("%w: role host may not call this route", errForbiddenRole), 403, "forbidden-role", nil},
		{"body too large", &http.MaxBytesError{Limit: 10}, 413, "body-too-large", nil},
		{"malformed json", fmt.Errorf("%w: %w", errMalformedJSON, &manifest.DecodeError{Pointer: "/arguments", Offset: 14, Reason: "must be an object, not a string"}),
			400, "malformed-json", map[string]any{"errors": []map[string]any{{"pointer": "/arguments", "offset": 14, "detail": "must be an object, not a string"}}}},
		{"empty body", fmt.Errorf("%w: %w", errMalformedJSON, &manifest.DecodeError{Offset: -1, Reason: "is empty; a JSON value is required"}),
			400, "malformed-json", map[string]any{"errors": []map[string]any{{"pointer": "", "detail": "is empty; a JSON value is required"}}}},
		{"bad parameter", fmt.Errorf("%w: view=%q", errBadParameter, "x"), 400, "invalid-parameter", nil},
		{"wait too long", fmt.Errorf("%w: 10m0s (at most 5m0s)", authz.ErrWaitTooLong), 400, "invalid-parameter", nil},
		{"bad page", fmt.Errorf("%w: limit must be 1 to 1000, not 0", authz.ErrBadPage), 400, "invalid-parameter", nil},
		{"rate limited", &rateLimitedError{wait: 1500 * time.Millisecond, limit: RateLimit{Rate: 1, Burst: 2}}, 429, "rate-limited", nil},
		{"malformed document", fmt.Errorf("%w: the manifest is not signed", manifest.ErrMalformed), 400, "malformed-document", nil},
		{"unknown manifest member", fmt.Errorf("authz: register: %w", fmt.Errorf("%w: %w", manifest.ErrMalformed, &manifest.DecodeError{Pointer: "/tools/0/nmae", Offset: 40, Reason: `is not a known member (did you mean "name"?)`})),
			400, "malformed-document", map[string]any{"errors": []map[string]any{{"pointer": "/tools/0/nmae", "offset": 40, "detail": `is not a known member (did you mean "name"?)`}}}},
		{"invalid manifest", fmt.Errorf("authz: register: %w", fmt.Errorf("%w: %w", manifest.ErrInvalid, &manifest.DecodeError{Pointer: "/pool", Offset: -1, Reason: "is required"})),
			400, "invalid-manifest", map[string]any{"errors": []map[string]any{{"pointer": "/pool", "detail": "is required"}}}},
		{"lint", &manifest.LintError{Findings: findings}, 422, "lint-failed", map[string]any{"findings": findings}},
		{"bad signature", fmt.Errorf("%w: typ", manifest.ErrBadSignature), 401, "bad-signature", nil},
		{"untrusted signer", fmt.Errorf("%w: kid %q", manifest.ErrUntrustedSigner, "k"), 403, "untrusted-signer", nil},
		{"epoch not found", fmt.Errorf("%w: e", record.ErrEpochNotFound), 404, "epoch-not-found", nil},
		{"snapshot not found", fmt.Errorf("%w: s", record.ErrSnapshotNotFound), 404, "snapshot-not-found", nil},
		{"tool not found", fmt.Errorf("%w: a/b in s", record.ErrToolNotFound), 404, "tool-not-found", nil},
		{"route not found", errRouteNotFound, 404, "not-found", nil},
		{"method not allowed", errMethodNotAllowed, 405, "method-not-allowed", nil},
		{"state", &record.StateError{Epoch: "e", State: "DRAINING", Want: "ACTIVE"}, 409, "epoch-state-conflict",
			map[string]any{"epoch": "e", "state": record.State("DRAINING"), "requiredState": record.State("ACTIVE")}},
		{"retire blocked", &record.RetireBlockedError{Epoch: "e", Active: 2, Uncertain: 1}, 409, "leases-outstanding",
			map[string]any{"epoch": "e", "activeLeases": 2, "uncertainLeases": 1}},
		{"invalid request", fmt.Errorf("%w: session must be 1-256 characters without control characters", authz.ErrBadRequest), 400, "invalid-request", nil},
		{"unknown status", fmt.Errorf("%w: unknown status %q", authz.ErrBadRequest, "bogus"), 400, "invalid-request", nil},
		{"unknown snapshot", fmt.Errorf("%w: %w", authz.ErrBadReference, fmt.Errorf("%w: s", record.ErrSnapshotNotFound)), 422, "unknown-reference", nil},
		{"unknown tool", fmt.Errorf("%w: %w", authz.ErrBadReference, fmt.Errorf("%w: a/b in s", record.ErrToolNotFound)), 422, "unknown-reference", nil},
		{"invalid arguments", fmt.Errorf("authz: form: %w", &manifest.ArgumentError{Violations: violations}), 422, "invalid-arguments",
			map[string]any{"violations": violations}},
		{"formation not found", fmt.Errorf("authz: approve fm_x: %w", fmt.Errorf("%w: fm_x", record.ErrFormationNotFound)), 404, "formation-not-found", nil},
		{"self approval", fmt.Errorf("authz: approve fm_x: %w", authz.ErrSelfApproval), 403, "self-approval", nil},
		{"digest mismatch", fmt.Errorf("authz: approve fm_x: %w", authz.ErrDigestMismatch), 409, "digest-mismatch", nil},
		{"not pending", fmt.Errorf("authz: approve fm_x: %w", fmt.Errorf("%w: status is %s", authz.ErrNotPending, record.StatusReady)), 409, "not-pending", nil},
		{"formation expired", fmt.Errorf("authz: approve fm_x: %w", authz.ErrExpired), 409, "formation-expired", nil},
		{"duplicate approver", fmt.Errorf("authz: approve fm_x: %w", authz.ErrDuplicateApprover), 409, "duplicate-approver", nil},
		{"admit expired", fmt.Errorf("authz: admit fm_x: %w", authz.ErrExpired), 409, "formation-expired", nil},
		{"not approved", fmt.Errorf("authz: admit fm_x: %w", fmt.Errorf("%w: %d of %d approvals", authz.ErrNotApproved, 0, 1)), 403, "not-approved", nil},
		{"formation denied", fmt.Errorf("authz: admit fm_x: %w", authz.ErrFormationDenied), 403, "formation-denied", nil},
		{"formation required", fmt.Errorf("%w: send its formation id", authz.ErrFormationRequired), 403, "formation-required", nil},
		{"malformed mcp", fmt.Errorf("%w: a batch holds a tools/call", authz.ErrMalformedMCP), 400, "malformed-mcp", nil},
		{"policy now denies", fmt.Errorf("authz: admit fm_x: %w", fmt.Errorf("%w: [rego: [deny_after_hours] [outside business hours] ]", authz.ErrPolicyNowDenies)), 403, "policy-denies", nil},
		{"policy now needs more approvals", fmt.Errorf("authz: admit fm_x: %w", fmt.Errorf("%w: it now needs %d approvals, the formation has %d", authz.ErrPolicyNowDenies, 2, 1)), 403, "policy-denies", nil},
		{"dependency unmet", fmt.Errorf("authz: admit fm_x: %w", &record.DependencyError{Tool: "github/get_repository"}), 403, "dependency-unmet",
			map[string]any{"tool": "github/get_repository"}},
		{"exclusive conflict", fmt.Errorf("authz: admit fm_x: %w", &record.DependencyError{Tool: "github/delete_repository", Exclusive: true}), 403, "exclusive-conflict",
			map[string]any{"tool": "github/delete_repository"}},
		{"source draining", fmt.Errorf("authz: admit fm_x: %w", authz.ErrSourceDraining), 409, "source-draining", nil},
		{"source stale", fmt.Errorf("authz: admit fm_x: %w", authz.ErrSourceStale), 410, "source-stale", nil},
		{"admit uncertain", fmt.Errorf("authz: admit fm_x: %w", record.ErrLeaseUncertain), 409, "lease-uncertain", nil},
		{"admit claimed", fmt.Errorf("authz: admit fm_x: %w: the call is running", record.ErrLeaseClaimed), 409, "lease-claimed", nil},
		{"complete not claimed", fmt.Errorf("authz: complete ls_x: %w", record.ErrLeaseNotClaimed), 409, "lease-not-claimed", nil},
		{"caller mismatch", fmt.Errorf("authz: admit fm_x: %w: caller %q, principal %q", authz.ErrCallerMismatch, "bob", "alice"), 403, "caller-mismatch", nil},
		{"malformed mcp with the reader's reason", fmt.Errorf("%w: %w", authz.ErrMalformedMCP, &fencecheck.RejectError{Reason: fencecheck.ReasonMemberCase}), 400, "malformed-mcp",
			map[string]any{"reason": fencecheck.ReasonMemberCase}},
		{"admit closed", fmt.Errorf("authz: admit fm_x: %w", fmt.Errorf("%w: formation is %s", record.ErrLeaseClosed, "completed")), 409, "lease-closed", nil},
		{"admit contention", fmt.Errorf("authz: admit fm_x: %w", record.ErrConflict), 503, "contention", nil},
		{"signing key unpublished", fmt.Errorf("authz: admit fm_x: %w", authz.ErrSigningKeyUnpublished), 503, "signing-key-unpublished", nil},
		{"admission disabled", authz.ErrAdmissionDisabled, 503, "admission-disabled", nil},
		{"audit trail behind", fmt.Errorf("authz: claim ls_x: %w: it cannot be written", authz.ErrTrailBehind), 503, "audit-trail-behind", nil},
		{"certificate mismatch", fmt.Errorf("x: %w", authz.ErrCertificateMismatch), 422, "certificate-mismatch", nil},
		{"certificate expired", fmt.Errorf("x: %w", authz.ErrCertificateExpired), 422, "certificate-expired", nil},
		{"lease out of scope", fmt.Errorf("x: %w", authz.ErrLeaseOutOfScope), 403, "lease-out-of-scope", nil},
		{"certificate not found", fmt.Errorf("x: %w", record.ErrCertificateNotFound), 404, "certificate-not-found", nil},
		{"certificate revoked", fmt.Errorf("x: %w", record.ErrCertificateRevoked), 409, "certificate-revoked", nil},
		{"certificates disabled", fmt.Errorf("x: %w", authz.ErrCertificatesDisabled), 503, "certificates-disabled", nil},
		{"invalid outcome", fmt.Errorf("%w: outcome must be effect, rejected or uncertain", authz.ErrBadRequest), 400, "invalid-request", nil},
		{"lease not found", fmt.Errorf("authz: complete ls_x: %w", fmt.Errorf("%w: ls_x", record.ErrLeaseNotFound)), 404, "lease-not-found", nil},
		{"lease closed", fmt.Errorf("authz: complete ls_x: %w", fmt.Errorf("%w: ls_x", record.ErrLeaseClosed)), 409, "lease-closed", nil},
		{"lease uncertain", fmt.Errorf("authz: complete ls_x: %w", fmt.Errorf("%w: ls_x", record.ErrLeaseUncertain)), 409, "lease-uncertain", nil},
		{"lease not uncertain", fmt.Errorf("authz: resolve ls_x: %w", fmt.Errorf("%w: ls_x", record.ErrLeaseNotUncertain)), 409, "lease-not-uncertain", nil},
		{"resolution unsigned", fmt.Errorf("%w: send it signed", authz.ErrResolutionUnsigned), 403, "resolution-unsigned", nil},
		// A refused resolution wraps the signature check's error: the
		// resolution's type wins over the manifest's.
		{"resolution untrusted", fmt.Errorf("%w: %w", authz.ErrResolutionInvalid, fmt.Errorf("%w: kid %q", manifest.ErrUntrustedSigner, "k")), 403, "resolution-invalid", nil},
		{"resolution malformed", fmt.Errorf("%w: %w", authz.ErrResolutionInvalid, fmt.Errorf("%w: not a JWS", manifest.ErrMalformed)), 403, "resolution-invalid", nil},
		{"resolution forged", fmt.Errorf("%w: %w", authz.ErrResolutionInvalid, manifest.ErrBadSignature), 403, "resolution-invalid", nil},
		{"resolution of another lease", fmt.Errorf("%w: it resolves lease ls_a, not ls_b", authz.ErrResolutionInvalid), 403, "resolution-invalid", nil},
		{"resolution not found", fmt.Errorf("%w: ls_x", authz.ErrResolutionNotFound), 404, "resolution-not-found", nil},
		{"lease contention", fmt.Errorf("authz: complete ls_x: %w", fmt.Errorf("%w: lease ls_x", record.ErrConflict)), 503, "contention", nil},
		{"recovery not allowed", fmt.Errorf("authz: %w: failure mode %q of %s declares abort", authz.ErrRecoveryNotAllowed, "gone", "github/x"), 409, "recovery-not-allowed", nil},
		{"recovery blocked", fmt.Errorf("%w: its lease is open: fm_x", authz.ErrRecoveryBlocked), 409, "recovery-blocked", nil},
		{"recovery exists", fmt.Errorf("authz: recover: %w", fmt.Errorf("%w: fm_x is recovered by fm_y", record.ErrRecoveryExists)), 409, "recovery-exists", nil},
		{"stale generation", fmt.Errorf("authz: generation of p: %w", fmt.Errorf("%w: pool %s is at %s", record.ErrStaleGeneration, "p", "4")), 409, "stale-generation", nil},
		{"contention", fmt.Errorf("authz: approve fm_x: %w", fmt.Errorf("%w: formation fm_x at /fcd/formations/fm_x", record.ErrConflict)), 503, "contention", nil},
		{"no active epochs", fmt.Errorf("%w: server %q", record.ErrNoActiveEpochs, "github"), 409, "no-active-epochs", nil},
		{"record too large", fmt.Errorf("lease: register epoch: %w", record.ErrTooLarge), 413, "record-too-large", nil},
		{"generation incomplete", fmt.Errorf("authz: generation of p: %w", &authz.GenerationIncompleteError{Released: []string{"ls_a"}, Pending: 3,
			Err: fmt.Errorf("%w: etcd 10.0.0.7:2379 leader lost", record.ErrUnavailable)}), 503, "store-unavailable",
			map[string]any{"released": []string{"ls_a"}, "pending": 3}},
		{"store unavailable", fmt.Errorf("lease: get epoch: %w: %v", record.ErrUnavailable, "etcd 10.0.0.7:2379 leader lost"), 503, "store-unavailable", nil},
		{"store full", fmt.Errorf("lease: create formation: %w: %v", record.ErrStoreFull, "etcdserver: mvcc: database space exceeded"), 507, "store-full", nil},
		{"store denied", fmt.Errorf("lease: get epoch: %w: %v", record.ErrStoreDenied, "etcdserver: permission denied"), 503, "store-denied", nil},
		{"store corrupt", fmt.Errorf("lease: get epoch: %w: %v", record.ErrStoreCorrupt, "etcdserver: corrupt cluster"), 503, "store-corrupt", nil},
		{"compacted", fmt.Errorf("%w: retire watch: %w: %v", record.ErrUnavailable, record.ErrCompacted, "etcdserver: mvcc: required revision has been compacted"), 503, "store-unavailable", nil},
		{"corrupt record", fmt.Errorf("%w: epoch record /fcd/e/x", record.ErrCorrupt), 500, "internal", nil},
		{"unknown", errors.New("etcd 10.0.0.7:2379 said SECRET-INTERNAL"), 500, "internal", nil},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := fmt.Errorf("handler: %w", tc.err)
			p := toProblem(err)
			if p.Status != tc.status || p.Type != ProblemBase+tc.slug {
				t.Fatalf("toProblem(%v) = %d %s, want %d %s", err, p.Status, p.Type, tc.status, ProblemBase+tc.slug)
			}
			covered[tc.slug] = true
			if p.Title == "" || p.Detail == "" {
				t.Errorf("title %q, detail %q: want both", p.Title, p.Detail)
			}
			if tc.ext != nil || p.Extensions != nil {
				got, _ := json.Marshal(p.Extensions)
				want, _ := json.Marshal(tc.ext)
				if string(got) != string(want) {
					t.Errorf("extensions %s, want %s", got, want)
				}
			}
			switch {
			case tc.status >= 500:
				// Store and internal errors never reach the client.
				if strings.Contains(p.Detail, "10.0.0.7") || strings.Contains(p.Detail, "SECRET") || strings.Contains(p.Detail, "/fcd/") {
					t.Errorf("detail %q leaks the error text", p.Detail)
				}
			case tc.slug == "body-too-large":
				if p.Detail != "the request body is larger than the limit of 10 bytes" {
					t.Errorf("detail %q", p.Detail)
				}
			default:
				// The detail is the error's own words, from its cause on.
				if !strings.Contains(stripLayers(err.Error()), p.Detail) {
					t.Errorf("detail %q is not the error text %q", p.Detail, err.Error())
				}
			}
			checkUserText(t, p.Detail)
		})
	}
	for slug := range slugStatus(t) {
		if slug != "not-ready" && !covered[slug] {
			t.Errorf("no toProblem case for slug %s", slug)
		}
	}
}

// TestProblemWriter checks the headers and body problem() writes.
func TestProblemWriter(t *testing.T) {
	s := &server{log: slog.New(slog.DiscardHandler)}
	// An empty value with a header name asserts that the header is absent.
	cases := []struct {
		err    error
		status int
		header string
		value  string
		ext    map[string]any
	}{
		{errUnauthenticated, 401, "WWW-Authenticate", `Bearer realm="fcd"`, nil},
		{fmt.Errorf("x: %w", record.ErrUnavailable), 503, "Retry-After", "1", nil},
		{fmt.Errorf("x: %w", record.ErrConflict), 503, "Retry-After", "1", nil},
		// A full store, refused credentials or a corrupt cluster: retrying
		// at once cannot help, so nothing invites it.
		{fmt.Errorf("x: %w", record.ErrStoreFull), 507, "Retry-After", "", nil},
		{fmt.Errorf("x: %w", record.ErrStoreDenied), 503, "Retry-After", "", nil},
		{fmt.Errorf("x: %w", record.ErrStoreCorrupt), 503, "Retry-After", "", nil},
		{&record.StateError{Epoch: "e", State: "STALE", Want: "ACTIVE"}, 409, "Retry-After", "",
			map[string]any{"epoch": "e", "state": "STALE", "requiredState": "ACTIVE"}},
		{fmt.Errorf("x: %w", authz.ErrSourceDraining), 409, "Retry-After", "5", nil},
		{fmt.Errorf("x: %w", authz.ErrSourceStale), 410, "Retry-After", "", nil},
		{fmt.Errorf("x: %w", record.ErrLeaseUncertain), 409, "Retry-After", "", nil},
		{fmt.Errorf("x: %w", authz.ErrSigningKeyUnpublished), 503, "Retry-After", "1", nil},
		{&rateLimitedError{wait: 1500 * time.Millisecond}, 429, "Retry-After", "2", nil},
		{&rateLimitedError{wait: time.Millisecond}, 429, "Retry-After", "1", nil},
		{&rateLimitedError{wait: 3 * time.Second}, 429, "Retry-After", "3", nil},
		{fmt.Errorf("x: %w", &record.DependencyError{Tool: "github/get_repository"}), 403, "Retry-After", "",
			map[string]any{"tool": "github/get_repository"}},
		{fmt.Errorf("x: %w", &record.DependencyError{Tool: "github/delete_repository", Exclusive: true}), 403, "Retry-After", "",
			map[string]any{"tool": "github/delete_repository"}},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		s.problem(rec, httptest.NewRequest(http.MethodPost, "/v1/epochs/e/drain", nil), tc.err)
		if got, want := rec.Header().Get("Fcd-Problem"), strings.TrimPrefix(toProblem(tc.err).Type, ProblemBase); got != want {
			t.Errorf("%v: Fcd-Problem %q, want %q", tc.err, got, want)
		}
		if rec.Code != tc.status {
			t.Errorf("%v: status %d, want %d", tc.err, rec.Code, tc.status)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%v: Content-Type %q", tc.err, ct)
		}
		if tc.header != "" && rec.Header().Get(tc.header) != tc.value {
			t.Errorf("%v: %s %q, want %q", tc.err, tc.header, rec.Header().Get(tc.header), tc.value)
		}
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", tc.err, rec.Body, err)
		}
		if body["instance"] != "/v1/epochs/e/drain" || body["status"] != float64(tc.status) || body["title"] == "" {
			t.Errorf("%v: body %v", tc.err, body)
		}
		for k, want := range tc.ext {
			if body[k] != want {
				t.Errorf("%v: extension member %s = %v, want %v beside the standard ones: %v", tc.err, k, body[k], want, body)
			}
		}
	}
}

// TestOpenAPIProblemTypes checks every x-fcd-problem-types list of the
// OpenAPI document: each slug is one fcd answers, under the status the
// error map gives it.
func TestOpenAPIProblemTypes(t *testing.T) {
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"components"`
	}
	if err := yaml.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatal(err)
	}
	type response struct {
		Ref   string   `json:"$ref"`
		Slugs []string `json:"x-fcd-problem-types"`
		// Folded answers every listed type with the response's status,
		// as forwardAuthStatus folds them.
		Folded bool `json:"x-fcd-status-folded"`
	}
	known := slugStatus(t)
	seen := map[string]bool{}
	for path, item := range doc.Paths {
		for method, raw := range item {
			var op struct {
				Responses map[string]response `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				continue // not an operation (parameters, summary, ...)
			}
			for code, r := range op.Responses {
				where := fmt.Sprintf("%s %s %s", strings.ToUpper(method), path, code)
				if name, ok := strings.CutPrefix(r.Ref, "#/components/responses/"); ok {
					if err := json.Unmarshal(doc.Components.Responses[name], &r); err != nil {
						t.Errorf("%s: %s: %v", where, r.Ref, err)
						continue
					}
				}
				if code[0] >= '4' && len(r.Slugs) == 0 {
					t.Errorf("%s: error response without x-fcd-problem-types", where)
				}
				for _, slug := range r.Slugs {
					seen[slug] = true
					st, ok := known[slug]
					switch {
					case !ok:
						t.Errorf("%s: unknown problem type %q", where, slug)
					case r.Folded:
						if fmt.Sprint(forwardAuthStatus(st)) != code {
							t.Errorf("%s: problem type %s (status %d) is folded to %d", where, slug, st, forwardAuthStatus(st))
						}
					case fmt.Sprint(st) != code:
						t.Errorf("%s: problem type %s has status %d", where, slug, st)
					}
				}
			}
		}
	}
	// Every problem type an operation can answer appears somewhere, except
	// those the router itself answers for paths and methods it lacks.
	for slug := range known {
		if !seen[slug] && !slices.Contains([]string{"not-found", "method-not-allowed"}, slug) {
			t.Errorf("problem type %s appears in no response of openapi.yaml", slug)
		}
	}
}

// TestForwardAuthProblems checks the problems of /v1/forward_auth: every
// refusal is 401 or 403, nginx auth_request passing nothing else, while
// the type, Fcd-Problem and Retry-After keep the cause.
func TestForwardAuthProblems(t *testing.T) {
	s := &server{log: slog.New(slog.DiscardHandler)}
	cases := []struct {
		err        error
		status     int
		slug       string
		retryAfter string
	}{
		{errUnauthenticated, 401, "unauthenticated", ""},
		{fmt.Errorf("%w: role host", errForbiddenRole), 403, "forbidden-role", ""},
		{authz.ErrFormationRequired, 403, "formation-required", ""},
		{fmt.Errorf("x: %w", authz.ErrNotApproved), 403, "not-approved", ""},
		{fmt.Errorf("x: %w", record.ErrFormationNotFound), 403, "formation-not-found", ""},
		{fmt.Errorf("x: %w", authz.ErrSourceDraining), 403, "source-draining", "5"},
		{fmt.Errorf("x: %w", authz.ErrSourceStale), 403, "source-stale", ""},
		{fmt.Errorf("x: %w", record.ErrUnavailable), 403, "store-unavailable", "1"},
		{authz.ErrAdmissionDisabled, 403, "admission-disabled", ""},
		{errMethodNotAllowed, 403, "method-not-allowed", ""},
		{&http.MaxBytesError{Limit: 1}, 403, "body-too-large", ""},
		{errors.New("boom"), 403, "internal", ""},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		s.problemWith(rec, httptest.NewRequest(http.MethodGet, forwardAuthPath, nil), tc.err, map[string]any{"formation": "fm_x"})
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tc.status || body["status"] != float64(tc.status) || body["type"] != ProblemBase+tc.slug || body["formation"] != "fm_x" {
			t.Errorf("%v: %d %v, want %d %s", tc.err, rec.Code, body, tc.status, tc.slug)
		}
		if rec.Header().Get("Fcd-Problem") != tc.slug || rec.Header().Get("Retry-After") != tc.retryAfter {
			t.Errorf("%v: Fcd-Problem %q, Retry-After %q", tc.err, rec.Header().Get("Fcd-Problem"), rec.Header().Get("Retry-After"))
		}
	}
}

func TestAuthenticatorRefusesBadPools(t *testing.T) {
	_, cred, err := NewCredential("x", RoleBackend)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		role  Role
		pools []string
		ok    bool
	}{
		{"backend, one pool", RoleBackend, []string{"github-v1-4"}, true},
		{"gateway, two pools", RoleGateway, []string{"a", "b"}, true},
		{"backend, any pool", RoleBackend, nil, true},
		{"approver with pools", RoleApprover, []string{"a"}, false},
		{"operator with pools", RoleOperator, []string{"a"}, false},
		{"empty pool name", RoleBackend, []string{""}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cred
			c.Role, c.Pools = tc.role, tc.pools
			if _, err := NewAuthenticator([]Credential{c}); (err == nil) != tc.ok {
				t.Fatalf("NewAuthenticator: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestCausesCarryPublicText checks that every cause of the error map
// outside the HTTP layer carries the sentence a client reads (package
// public): the detail is never cut out of an error's log text.
func TestCausesCarryPublicText(t *testing.T) {
	own := []error{errUnauthenticated, errForbiddenRole, errMalformedJSON, errBadParameter, errRouteNotFound, errMethodNotAllowed, errRateLimited}
	for _, r := range problemRules {
		if r.cause == nil || slices.Contains(own, r.cause) {
			continue
		}
		text, ok := publicText(r.cause)
		if !ok || text == "" {
			t.Errorf("rule %s: cause %q carries no public text", r.slug, r.cause)
			continue
		}
		checkUserText(t, text)
	}
}

// TestClientDetailHidesWhatComesFirst checks that the wrappers before a
// cause stay in the log, and that a wrapped error after it shows its
// public text.
func TestClientDetailHidesWhatComesFirst(t *testing.T) {
	inner := fmt.Errorf("%w: kid %q", manifest.ErrUntrustedSigner, "k")
	err := fmt.Errorf("authz: resolve ls_SECRET: %w", fmt.Errorf("%w: %w", authz.ErrResolutionInvalid, inner))
	got := clientDetail(err, authz.ErrResolutionInvalid, false)
	if want := `the signed resolution is not valid for this lease: signer not trusted: kid "k"`; got != want {
		t.Errorf("clientDetail = %q, want %q", got, want)
	}
}
