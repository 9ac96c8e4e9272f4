package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// ProblemBase prefixes every problem type; the fragment is the stable slug
// of one cause, documented in docs/problems.md.
const ProblemBase = "https://github.com/fcd-authz/fcd/blob/main/docs/problems.md#"

// Errors of the HTTP layer itself.
var (
	errUnauthenticated  = errors.New("a valid bearer credential is required")
	errForbiddenRole    = errors.New("credential not allowed")
	errMalformedJSON    = errors.New("malformed JSON body")
	errBadParameter     = errors.New("invalid parameter")
	errRouteNotFound    = errors.New("no such route")
	errMethodNotAllowed = errors.New("method not allowed on this route")
)

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type     string
	Title    string
	Status   int
	Detail   string
	Instance string
	// Extensions are extra members, e.g. lint findings or lease counts.
	Extensions map[string]any
	// retryAfter is the Retry-After header to send, if any.
	retryAfter string
}

// MarshalJSON writes the standard members and the extensions side by side.
func (p Problem) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(p.Extensions)+5)
	for k, v := range p.Extensions {
		m[k] = v
	}
	m["type"], m["title"], m["status"] = p.Type, p.Title, p.Status
	if p.Detail != "" {
		m["detail"] = p.Detail
	}
	if p.Instance != "" {
		m["instance"] = p.Instance
	}
	return json.Marshal(m)
}

// noRetry marks a problem that retrying cannot cure: no Retry-After.
const noRetry = "-"

// problemRule maps errors matching match to a problem.
type problemRule struct {
	match  func(error) bool
	status int
	slug   string
	title  string
	// detail replaces err.Error() when the error's text must not reach the
	// client (store internals).
	detail string
	// retryAfter, when set, is sent as the Retry-After header.
	retryAfter string
	// retryAfterOf, when set, computes the Retry-After header from the
	// error (a rate limit's wait).
	retryAfterOf func(error) string
	ext          func(error) map[string]any
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func as[T error]() func(error) bool {
	return func(err error) bool { var t T; return errors.As(err, &t) }
}

// problemRules is the one error map of fcd, first match wins. Order
// matters only where one error could match two rules.
func problemRules() []problemRule {
	return []problemRule{
		{match: is(errUnauthenticated), status: 401, slug: "unauthenticated", title: "Authentication required"},
		{match: is(errForbiddenRole), status: 403, slug: "forbidden-role", title: "Role not allowed"},
		{match: as[*http.MaxBytesError](), status: 413, slug: "body-too-large", title: "Request body too large"},
		{match: is(errMalformedJSON), status: 400, slug: "malformed-json", title: "Malformed JSON"},
		{match: is(errBadParameter), status: 400, slug: "invalid-parameter", title: "Invalid parameter"},
		{match: is(authz.ErrMalformedMCP), status: 400, slug: "malformed-mcp", title: "MCP request body cannot be read safely",
			ext: func(err error) map[string]any {
				if r := fencecheck.ReasonOf(err); r != "" {
					return map[string]any{"reason": r}
				}
				return nil
			}},
		{match: is(authz.ErrWaitTooLong), status: 400, slug: "invalid-parameter", title: "Invalid parameter"},
		{match: is(authz.ErrBadPage), status: 400, slug: "invalid-parameter", title: "Invalid parameter"},
		// Before the manifest rules: a refused resolution wraps the
		// signature check's error beside its own.
		{match: is(authz.ErrResolutionUnsigned), status: 403, slug: "resolution-unsigned", title: "A signed resolution is required"},
		{match: is(authz.ErrResolutionInvalid), status: 403, slug: "resolution-invalid", title: "The signed resolution is not valid for this lease"},
		{match: is(authz.ErrResolutionNotFound), status: 404, slug: "resolution-not-found", title: "No signed resolution is kept for this lease"},
		{match: is(manifest.ErrMalformed), status: 400, slug: "malformed-document", title: "Malformed document"},
		{match: is(manifest.ErrInvalid), status: 400, slug: "invalid-manifest", title: "Invalid manifest"},
		{match: as[*manifest.LintError](), status: 422, slug: "lint-failed", title: "Manifest fails MCP+ lint",
			ext: func(err error) map[string]any {
				var le *manifest.LintError
				errors.As(err, &le)
				return map[string]any{"findings": le.Findings}
			}},
		{match: is(authz.ErrBadRequest), status: 400, slug: "invalid-request", title: "Invalid request"},
		{match: is(authz.ErrBadReference), status: 422, slug: "unknown-reference", title: "Unknown snapshot or tool"},
		{match: as[*manifest.ArgumentError](), status: 422, slug: "invalid-arguments", title: "Arguments do not satisfy the tool's input schema",
			ext: func(err error) map[string]any {
				var ae *manifest.ArgumentError
				errors.As(err, &ae)
				return map[string]any{"violations": ae.Violations}
			}},
		{match: is(manifest.ErrBadSignature), status: 401, slug: "bad-signature", title: "Signature invalid"},
		{match: is(manifest.ErrUntrustedSigner), status: 403, slug: "untrusted-signer", title: "Signer not trusted"},
		{match: is(authz.ErrCertificateMismatch), status: 422, slug: "certificate-mismatch", title: "Certificate does not fit the registered epochs"},
		{match: is(authz.ErrCertificateExpired), status: 422, slug: "certificate-expired", title: "Certificate has expired"},
		{match: is(record.ErrCertificateNotFound), status: 404, slug: "certificate-not-found", title: "Certificate not found"},
		{match: is(record.ErrCertificateRevoked), status: 409, slug: "certificate-revoked", title: "Certificate already revoked"},
		{match: is(authz.ErrCertificatesDisabled), status: 503, slug: "certificates-disabled", title: "No compatibility issuer keys are configured",
			retryAfter: noRetry},
		{match: is(record.ErrEpochNotFound), status: 404, slug: "epoch-not-found", title: "Epoch not found"},
		{match: is(record.ErrSnapshotNotFound), status: 404, slug: "snapshot-not-found", title: "Snapshot not found"},
		{match: is(record.ErrToolNotFound), status: 404, slug: "tool-not-found", title: "Tool not in snapshot"},
		{match: is(record.ErrFormationNotFound), status: 404, slug: "formation-not-found", title: "Formation not found"},
		{match: is(authz.ErrSelfApproval), status: 403, slug: "self-approval", title: "Self-approval is not allowed"},
		{match: is(authz.ErrDigestMismatch), status: 409, slug: "digest-mismatch", title: "Digest does not match the formation"},
		{match: is(authz.ErrNotPending), status: 409, slug: "not-pending", title: "Formation is not pending approval"},
		{match: is(authz.ErrExpired), status: 409, slug: "formation-expired", title: "Formation expired"},
		{match: is(authz.ErrDuplicateApprover), status: 409, slug: "duplicate-approver", title: "Approver already decided"},
		{match: is(authz.ErrNotApproved), status: 403, slug: "not-approved", title: "Formation lacks its approvals"},
		{match: is(authz.ErrFormationDenied), status: 403, slug: "formation-denied", title: "Formation was denied"},
		{match: is(authz.ErrCallerMismatch), status: 403, slug: "caller-mismatch", title: "The gateway's caller is not the formation's principal"},
		{match: is(authz.ErrFormationRequired), status: 403, slug: "formation-required", title: "A tools/call needs a formation"},
		{match: is(authz.ErrPolicyNowDenies), status: 403, slug: "policy-denies", title: "The policy in force now denies the call"},
		{match: func(err error) bool { var de *record.DependencyError; return errors.As(err, &de) && !de.Exclusive },
			status: 403, slug: "dependency-unmet", title: "A required tool has not completed in the session",
			ext: func(err error) map[string]any {
				var de *record.DependencyError
				errors.As(err, &de)
				return map[string]any{"tool": de.Tool}
			}},
		{match: func(err error) bool { var de *record.DependencyError; return errors.As(err, &de) && de.Exclusive },
			status: 403, slug: "exclusive-conflict", title: "An exclusive tool was already admitted or completed in the session",
			ext: func(err error) map[string]any {
				var de *record.DependencyError
				errors.As(err, &de)
				return map[string]any{"tool": de.Tool}
			}},
		{match: is(authz.ErrSourceDraining), status: 409, slug: "source-draining", title: "Source epoch is draining", retryAfter: "5"},
		{match: is(authz.ErrSourceStale), status: 410, slug: "source-stale", title: "Source epoch is stale and no successor is eligible"},
		{match: is(record.ErrLeaseNotFound), status: 404, slug: "lease-not-found", title: "Lease not found"},
		{match: is(record.ErrLeaseClosed), status: 409, slug: "lease-closed", title: "Lease already closed"},
		{match: is(authz.ErrLeaseOutOfScope), status: 403, slug: "lease-out-of-scope", title: "Lease is of a pool this credential may not report for"},
		{match: is(record.ErrLeaseUncertain), status: 409, slug: "lease-uncertain", title: "Lease outcome is uncertain"},
		{match: is(record.ErrLeaseNotUncertain), status: 409, slug: "lease-not-uncertain", title: "Lease is not uncertain"},
		{match: is(record.ErrLeaseClaimed), status: 409, slug: "lease-claimed", title: "Lease already claimed by another call"},
		{match: is(record.ErrLeaseNotClaimed), status: 409, slug: "lease-not-claimed", title: "Lease was not claimed"},
		{match: is(record.ErrStaleGeneration), status: 409, slug: "stale-generation", title: "Generation is not newer"},
		{match: is(authz.ErrRecoveryNotAllowed), status: 409, slug: "recovery-not-allowed", title: "The formation may not be recovered"},
		{match: is(authz.ErrRecoveryBlocked), status: 409, slug: "recovery-blocked", title: "The formation's outcome is not known yet", retryAfter: "5"},
		{match: is(record.ErrRecoveryExists), status: 409, slug: "recovery-exists", title: "The formation already has a live recovery"},
		{match: is(errRouteNotFound), status: 404, slug: "not-found", title: "Not found"},
		{match: is(errMethodNotAllowed), status: 405, slug: "method-not-allowed", title: "Method not allowed"},
		{match: is(errRateLimited), status: 429, slug: "rate-limited", title: "Too many formations for this credential",
			retryAfterOf: func(err error) string {
				var rl *rateLimitedError
				if errors.As(err, &rl) {
					return rl.retryAfter()
				}
				return "1"
			}},
		{match: as[*record.StateError](), status: 409, slug: "epoch-state-conflict", title: "Epoch is not in the required state",
			ext: func(err error) map[string]any {
				var se *record.StateError
				errors.As(err, &se)
				return map[string]any{"epoch": se.Epoch, "state": se.State, "requiredState": se.Want}
			}},
		{match: as[*record.RetireBlockedError](), status: 409, slug: "leases-outstanding", title: "Lease markers remain under the epoch",
			ext: func(err error) map[string]any {
				var rb *record.RetireBlockedError
				errors.As(err, &rb)
				return map[string]any{"epoch": rb.Epoch, "activeLeases": rb.Active, "uncertainLeases": rb.Uncertain}
			}},
		{match: is(record.ErrNoActiveEpochs), status: 409, slug: "no-active-epochs", title: "No ACTIVE epoch to snapshot"},
		{match: is(record.ErrTooLarge), status: 413, slug: "record-too-large", title: "Record too large for the store"},
		{match: is(record.ErrConflict), status: 503, slug: "contention", title: "Too many concurrent updates",
			detail: "the record was updated concurrently too many times in a row; retry"},
		{match: is(authz.ErrSigningKeyUnpublished), status: 503, slug: "signing-key-unpublished", title: "Signing key not published",
			retryAfter: "1"},
		{match: is(authz.ErrAdmissionDisabled), status: 503, slug: "admission-disabled", title: "Admission is not configured",
			retryAfter: noRetry},
		{match: is(record.ErrUnavailable), status: 503, slug: "store-unavailable", title: "Store unavailable",
			detail: "the registry store did not answer in time; a write may or may not have been applied and is safe to retry; nothing may be dispatched meanwhile (fail closed)",
			ext:    generationProgress},
	}
}

// generationProgress is what a generation change that stopped did: the
// leases it released and how many are left (setting the generation again
// releases them). Nil for any other error.
func generationProgress(err error) map[string]any {
	var ge *authz.GenerationIncompleteError
	if !errors.As(err, &ge) {
		return nil
	}
	released := ge.Released
	if released == nil {
		released = []string{}
	}
	return map[string]any{"released": released, "pending": ge.Pending}
}

// toProblem maps err to its problem. An unknown error is a 500 whose text
// stays in the log.
func toProblem(err error) Problem {
	for _, r := range problemRules() {
		if r.match(err) {
			p := Problem{Type: ProblemBase + r.slug, Title: r.title, Status: r.status, Detail: r.detail, retryAfter: r.retryAfter}
			if r.retryAfterOf != nil {
				p.retryAfter = r.retryAfterOf(err)
			}
			if p.Detail == "" {
				p.Detail = err.Error()
			}
			if r.ext != nil {
				p.Extensions = r.ext(err)
			}
			return p
		}
	}
	return Problem{Type: ProblemBase + "internal", Title: "Internal error", Status: http.StatusInternalServerError,
		Detail: "the server failed to handle the request; see its log"}
}

// problem writes err as problem+json, and logs what the client does not
// see.
func (s *server) problem(w http.ResponseWriter, r *http.Request, err error) {
	s.problemWith(w, r, err, nil)
}

// problemWith writes err as problem+json with extra extension members.
// On forward-auth the status is folded to 401 or 403 (see
// forwardAuthStatus); the type keeps the cause.
func (s *server) problemWith(w http.ResponseWriter, r *http.Request, err error, extra map[string]any) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away (or gave up waiting on a retire); nobody
		// reads an answer.
		s.log.Debug("request canceled by the client", "method", r.Method, "path", r.URL.Path)
		return
	}
	status, header, body := s.renderProblem(err, r.Method, r.URL.Path, extra, r.URL.Path == forwardAuthPath)
	for k, v := range header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	if _, err := w.Write(body); err != nil {
		s.log.Debug("write problem", "err", err, slog.String("path", r.URL.Path))
	}
}

// problemHeader carries the problem type's slug on every problem answer,
// for gateways and clients that do not read bodies (nginx auth_request,
// Envoy's denied responses).
const problemHeader = "Fcd-Problem"

// renderProblem returns the answer to err: its status, headers and
// problem+json body, with extra extension members. It logs what the client
// does not see. fold folds the status for forward-auth gateways.
func (s *server) renderProblem(err error, method, instance string, extra map[string]any, fold bool) (int, http.Header, []byte) {
	p := toProblem(err)
	p.Instance = instance
	if p.Status >= 500 {
		s.log.Error("request failed", "method", method, "path", instance, "status", p.Status, "err", err)
	}
	if len(extra) > 0 && p.Extensions == nil {
		p.Extensions = make(map[string]any, len(extra))
	}
	for k, v := range extra {
		p.Extensions[k] = v
	}
	h := http.Header{}
	if errors.Is(err, errUnauthenticated) {
		// Only a missing or unknown bearer credential is a challenge; a bad
		// manifest signature (also 401) is not about the caller's credential.
		h.Set("WWW-Authenticate", `Bearer realm="fcd"`)
	}
	switch {
	case p.retryAfter == noRetry:
	case p.retryAfter != "":
		h.Set("Retry-After", p.retryAfter)
	case p.Status == http.StatusServiceUnavailable:
		h.Set("Retry-After", "1")
	}
	if fold {
		p.Status = forwardAuthStatus(p.Status)
	}
	body, merr := json.Marshal(p)
	if merr != nil {
		s.log.Error("encode problem", "err", merr)
		body = []byte(`{"type":"` + ProblemBase + `internal","status":500}`)
	}
	h.Set(problemHeader, strings.TrimPrefix(p.Type, ProblemBase))
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	return p.Status, h, body
}

// forwardAuthStatus folds a problem's status for forward-auth gateways:
// nginx auth_request understands only 2xx, 401 and 403 from the auth
// server and turns anything else into a 500 of its own, so every refusal
// there is 401 (a credential problem) or 403. The problem's type, the
// Fcd-Problem header and Retry-After keep the real cause.
func forwardAuthStatus(status int) int {
	if status == http.StatusUnauthorized {
		return http.StatusUnauthorized
	}
	return http.StatusForbidden
}
