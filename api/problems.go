package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"strings"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
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

// problemRule maps the errors of one cause to a problem.
type problemRule struct {
	// cause is the sentinel the rule stands for (errors.Is); its public
	// text starts the problem's detail (see clientDetail).
	cause error
	// match, set instead of cause for a typed error, returns the error of
	// err's chain that the rule stands for.
	match  func(err error) (error, bool)
	status int
	slug   string
	title  string
	// detail replaces the error's text when none of it may reach the
	// client (store internals).
	detail string
	// contextOnly marks a cause that only names a kind of failure, which
	// the title already says: the detail is the context that follows it
	// ("malformed JSON body: /arguments must be an object …" →
	// "/arguments must be an object …").
	contextOnly bool
	// detailOf, when set, words the detail from the matched error.
	detailOf func(error) string
	// retryAfter, when set, is sent as the Retry-After header.
	retryAfter string
	// retryAfterOf, when set, computes the Retry-After header from the
	// error (a rate limit's wait).
	retryAfterOf func(error) string
	ext          func(error) map[string]any
}

// as matches the first error of type T in err's chain.
func as[T error](err error) (error, bool) {
	var t T
	if errors.As(err, &t) {
		return t, true
	}
	return nil, false
}

// problemRules is the one error map of fcd, first match wins. Order
// matters only where one error could match two rules. It is built once,
// at init, and never changed.
var problemRules = []problemRule{
	{cause: errUnauthenticated, status: 401, slug: "unauthenticated", title: "Authentication required"},
	{cause: errForbiddenRole, status: 403, slug: "forbidden-role", title: "Role not allowed"},
	{match: as[*http.MaxBytesError], status: 413, slug: "body-too-large", title: "Request body too large", detailOf: bodyLimit},
	{cause: errMalformedJSON, status: 400, slug: "malformed-json", title: "Malformed JSON", contextOnly: true, ext: decodeErrors},
	{cause: errBadParameter, status: 400, slug: "invalid-parameter", title: "Invalid parameter", contextOnly: true},
	{cause: authz.ErrMalformedMCP, status: 400, slug: "malformed-mcp", title: "MCP request body cannot be read safely", ext: mcpReason},
	{cause: authz.ErrWaitTooLong, status: 400, slug: "invalid-parameter", title: "Invalid parameter"},
	{cause: authz.ErrBadPage, status: 400, slug: "invalid-parameter", title: "Invalid parameter"},
	// Before the manifest rules: a refused resolution wraps the
	// signature check's error beside its own.
	{cause: authz.ErrResolutionUnsigned, status: 403, slug: "resolution-unsigned", title: "A signed resolution is required"},
	{cause: authz.ErrResolutionInvalid, status: 403, slug: "resolution-invalid", title: "The signed resolution is not valid for this lease"},
	{cause: authz.ErrResolutionNotFound, status: 404, slug: "resolution-not-found", title: "No signed resolution is kept for this lease"},
	{cause: manifest.ErrMalformed, status: 400, slug: "malformed-document", title: "Malformed document", contextOnly: true, ext: decodeErrors},
	{cause: manifest.ErrInvalid, status: 400, slug: "invalid-manifest", title: "Invalid manifest", contextOnly: true, ext: decodeErrors},
	{match: as[*manifest.LintError], status: 422, slug: "lint-failed", title: "Manifest fails MCP+ lint", ext: lintFindings},
	{cause: authz.ErrBadRequest, status: 400, slug: "invalid-request", title: "Invalid request", contextOnly: true},
	{cause: authz.ErrBadReference, status: 422, slug: "unknown-reference", title: "Unknown snapshot or tool"},
	{match: as[*manifest.ArgumentError], status: 422, slug: "invalid-arguments", title: "Arguments do not satisfy the tool's input schema",
		ext: argumentViolations},
	{cause: manifest.ErrBadSignature, status: 401, slug: "bad-signature", title: "Signature invalid"},
	{cause: manifest.ErrUntrustedSigner, status: 403, slug: "untrusted-signer", title: "Signer not trusted"},
	{cause: authz.ErrCertificateMismatch, status: 422, slug: "certificate-mismatch", title: "Certificate does not fit the registered epochs"},
	{cause: authz.ErrCertificateExpired, status: 422, slug: "certificate-expired", title: "Certificate has expired"},
	{cause: record.ErrCertificateNotFound, status: 404, slug: "certificate-not-found", title: "Certificate not found"},
	{cause: record.ErrCertificateRevoked, status: 409, slug: "certificate-revoked", title: "Certificate already revoked"},
	{cause: authz.ErrCertificatesDisabled, status: 503, slug: "certificates-disabled", title: "No compatibility issuer keys are configured",
		retryAfter: noRetry},
	{cause: record.ErrEpochNotFound, status: 404, slug: "epoch-not-found", title: "Epoch not found"},
	{cause: record.ErrSnapshotNotFound, status: 404, slug: "snapshot-not-found", title: "Snapshot not found"},
	{cause: record.ErrToolNotFound, status: 404, slug: "tool-not-found", title: "Tool not in snapshot"},
	{cause: record.ErrFormationNotFound, status: 404, slug: "formation-not-found", title: "Formation not found"},
	{cause: authz.ErrSelfApproval, status: 403, slug: "self-approval", title: "Self-approval is not allowed"},
	{cause: authz.ErrDigestMismatch, status: 409, slug: "digest-mismatch", title: "Digest does not match the formation"},
	{cause: authz.ErrNotPending, status: 409, slug: "not-pending", title: "Formation is not pending approval"},
	{cause: authz.ErrExpired, status: 409, slug: "formation-expired", title: "Formation expired"},
	{cause: authz.ErrDuplicateApprover, status: 409, slug: "duplicate-approver", title: "Approver already decided"},
	{cause: authz.ErrNotApproved, status: 403, slug: "not-approved", title: "Formation lacks its approvals"},
	{cause: authz.ErrFormationDenied, status: 403, slug: "formation-denied", title: "Formation was denied"},
	{cause: authz.ErrCallerMismatch, status: 403, slug: "caller-mismatch", title: "The gateway's caller is not the formation's principal"},
	{cause: authz.ErrFormationRequired, status: 403, slug: "formation-required", title: "A tools/call needs a formation"},
	{cause: authz.ErrPolicyNowDenies, status: 403, slug: "policy-denies", title: "The policy in force now denies the call"},
	{match: dependency(false), status: 403, slug: "dependency-unmet", title: "A required tool has not completed in the session",
		ext: dependencyTool},
	{match: dependency(true), status: 403, slug: "exclusive-conflict", title: "An exclusive tool was already admitted or completed in the session",
		ext: dependencyTool},
	{cause: authz.ErrSourceDraining, status: 409, slug: "source-draining", title: "Source epoch is draining", retryAfter: "5"},
	{cause: authz.ErrSourceStale, status: 410, slug: "source-stale", title: "Source epoch is stale and no successor is eligible"},
	{cause: record.ErrLeaseNotFound, status: 404, slug: "lease-not-found", title: "Lease not found"},
	{cause: record.ErrLeaseClosed, status: 409, slug: "lease-closed", title: "Lease already closed"},
	{cause: authz.ErrLeaseOutOfScope, status: 403, slug: "lease-out-of-scope", title: "Lease is of a pool this credential may not report for"},
	{cause: record.ErrLeaseUncertain, status: 409, slug: "lease-uncertain", title: "Lease outcome is uncertain"},
	{cause: record.ErrLeaseNotUncertain, status: 409, slug: "lease-not-uncertain", title: "Lease is not uncertain"},
	{cause: record.ErrLeaseClaimed, status: 409, slug: "lease-claimed", title: "Lease already claimed by another call"},
	{cause: record.ErrLeaseNotClaimed, status: 409, slug: "lease-not-claimed", title: "Lease was not claimed"},
	{cause: record.ErrStaleGeneration, status: 409, slug: "stale-generation", title: "Generation is not newer"},
	{cause: authz.ErrRecoveryNotAllowed, status: 409, slug: "recovery-not-allowed", title: "The formation may not be recovered"},
	{cause: authz.ErrRecoveryBlocked, status: 409, slug: "recovery-blocked", title: "The formation's outcome is not known yet", retryAfter: "5"},
	{cause: record.ErrRecoveryExists, status: 409, slug: "recovery-exists", title: "The formation already has a live recovery"},
	{cause: errRouteNotFound, status: 404, slug: "not-found", title: "Not found"},
	{cause: errMethodNotAllowed, status: 405, slug: "method-not-allowed", title: "Method not allowed"},
	{cause: errRateLimited, status: 429, slug: "rate-limited", title: "Too many formations for this credential",
		retryAfterOf: rateLimitRetry},
	{match: as[*record.StateError], status: 409, slug: "epoch-state-conflict", title: "Epoch is not in the required state", ext: epochState},
	{match: as[*record.RetireBlockedError], status: 409, slug: "leases-outstanding", title: "Lease markers remain under the epoch",
		ext: leasesOutstanding},
	{cause: record.ErrNoActiveEpochs, status: 409, slug: "no-active-epochs", title: "No ACTIVE epoch to snapshot"},
	{cause: record.ErrTooLarge, status: 413, slug: "record-too-large", title: "Record too large for the store"},
	{cause: record.ErrConflict, status: 503, slug: "contention", title: "Too many concurrent updates",
		detail: "the record was updated concurrently too many times in a row; retry"},
	{cause: authz.ErrSigningKeyUnpublished, status: 503, slug: "signing-key-unpublished", title: "Signing key not published",
		retryAfter: "1"},
	{cause: authz.ErrTrailBehind, status: 503, slug: "audit-trail-behind", title: "Audit trail behind the store",
		detail:     "this replica's audit trail cannot record what the store commits (it cannot be written, or it fell behind by more than its bound); nothing is admitted or claimed until it has caught up",
		retryAfter: "1"},
	{cause: authz.ErrAdmissionDisabled, status: 503, slug: "admission-disabled", title: "Admission is not configured",
		retryAfter: noRetry},
	// etcd's typed refusals before ErrUnavailable: none is cured by
	// retrying at once, so none invites a retry (no Retry-After).
	{cause: record.ErrStoreFull, status: 507, slug: "store-full", title: "Store full",
		detail: "the registry store (etcd) is full: its database reached the backend quota and it refuses every write (NOSPACE alarm); " +
			"nothing was recorded and nothing may be dispatched. Retrying does not help until an operator frees space: " +
			"authzd store compact, authzd store defrag, then authzd store alarm disarm (docs/operations.md, section NOSPACE)",
		retryAfter: noRetry},
	{cause: record.ErrStoreDenied, status: 503, slug: "store-denied", title: "Store refused fcd's credentials",
		detail: "the registry store (etcd) refused authzd's credentials; nothing was read or written and nothing may be dispatched (fail closed). " +
			"An operator must fix authzd's etcd client certificate or role; the server log names the store's error",
		retryAfter: noRetry},
	{cause: record.ErrStoreCorrupt, status: 503, slug: "store-corrupt", title: "Store reports corruption",
		detail: "the registry store (etcd) raised its CORRUPT alarm and refuses requests; nothing may be trusted or dispatched. " +
			"An operator must restore the member from a snapshot (docs/operations.md, section Restore)",
		retryAfter: noRetry},
	{cause: record.ErrUnavailable, status: 503, slug: "store-unavailable", title: "Store unavailable",
		detail: "the registry store did not answer in time; a write may or may not have been applied and is safe to retry; nothing may be dispatched meanwhile (fail closed)",
		ext:    generationProgress},
}

// bodyLimit is the detail of a body over the limit.
func bodyLimit(err error) string {
	return fmt.Sprintf("the request body is larger than the limit of %d bytes", err.(*http.MaxBytesError).Limit)
}

// mcpReason is the fence reader's reason for refusing an MCP body, when
// it gave one.
func mcpReason(err error) map[string]any {
	if r := fencecheck.ReasonOf(err); r != "" {
		return map[string]any{"reason": r}
	}
	return nil
}

func lintFindings(err error) map[string]any {
	var le *manifest.LintError
	errors.As(err, &le)
	return map[string]any{"findings": le.Findings}
}

func argumentViolations(err error) map[string]any {
	var ae *manifest.ArgumentError
	errors.As(err, &ae)
	return map[string]any{"violations": ae.Violations}
}

// dependency matches a session ledger's refusal: an exclusive conflict
// or an unmet requires.
func dependency(exclusive bool) func(error) (error, bool) {
	return func(err error) (error, bool) {
		var de *record.DependencyError
		if errors.As(err, &de) && de.Exclusive == exclusive {
			return de, true
		}
		return nil, false
	}
}

func dependencyTool(err error) map[string]any {
	var de *record.DependencyError
	errors.As(err, &de)
	return map[string]any{"tool": de.Tool}
}

func epochState(err error) map[string]any {
	var se *record.StateError
	errors.As(err, &se)
	return map[string]any{"epoch": se.Epoch, "state": se.State, "requiredState": se.Want}
}

func leasesOutstanding(err error) map[string]any {
	var rb *record.RetireBlockedError
	errors.As(err, &rb)
	return map[string]any{"epoch": rb.Epoch, "activeLeases": rb.Active, "uncertainLeases": rb.Uncertain}
}

func rateLimitRetry(err error) string {
	var rl *rateLimitedError
	if errors.As(err, &rl) {
		return rl.retryAfter()
	}
	return "1"
}

// decodeErrors is the "errors" extension of a body or document that does
// not decode or validate: each member at fault, {pointer, detail}, with
// the byte offset where it was found when known. Nil when err names no
// member.
func decodeErrors(err error) map[string]any {
	var list []map[string]any
	for _, e := range manifest.DecodeErrors(err) {
		m := map[string]any{"pointer": e.Pointer, "detail": e.Reason}
		if e.Offset >= 0 {
			m["offset"] = e.Offset
		}
		list = append(list, m)
	}
	if len(list) == 0 {
		return nil
	}
	return map[string]any{"errors": list}
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

// matches returns the error of err's chain that the rule stands for.
func (r *problemRule) matches(err error) (error, bool) {
	if r.match != nil {
		return r.match(err)
	}
	if errors.Is(err, r.cause) {
		return r.cause, true
	}
	return nil, false
}

// publicText is the text err carries for a client (see package public),
// and whether it carries one. fencecheck, which imports no fcd package,
// words its refusals for a backend's log: its reader's refusal is shown
// without its package's name.
func publicText(err error) (string, bool) {
	if t, ok := public.Text(err); ok {
		return t, true
	}
	if re, ok := err.(*fencecheck.RejectError); ok {
		return strings.TrimPrefix(re.Error(), "fencecheck: "), true
	}
	return "", false
}

// clientDetail is a problem's detail: one sentence for the person who
// sent the request. It is the public text of cause, the error of err's
// chain the rule matched, followed by the context that wrappers put after
// it (fmt.Errorf("%w: status is %s", …)), in which every error that
// carries a public text shows that text. What wrappers put before the
// cause (a use case's name, the formation id the instance already shows:
// fmt.Errorf("admit %s: %w", …)) is for the log only, so that
// "authz: admit fm_1: authz: source epoch is stale …" reads "source epoch
// is stale …". The error itself is unchanged: errors.Is and errors.As
// still see every layer.
func clientDetail(err, cause error, contextOnly bool) string {
	head, ok := publicText(cause)
	if !ok {
		head = cause.Error() // api's own errors: their text is for clients
	}
	var tail string
	if msg, own := err.Error(), cause.Error(); own != "" {
		if i := strings.Index(msg, own); i >= 0 {
			tail = publicContext(msg[i+len(own):], err)
		}
	}
	if rest, ok := strings.CutPrefix(tail, ": "); ok && contextOnly && rest != "" {
		return oneLine(rest)
	}
	return oneLine(head + tail)
}

// publicContext is text with the Error text of every error in err's tree
// that carries a public text replaced by that text.
func publicContext(text string, err error) string {
	if text == "" {
		return ""
	}
	for e := range chain(err) {
		if pub, ok := publicText(e); ok {
			text = strings.ReplaceAll(text, e.Error(), pub)
		}
	}
	return text
}

// chain yields err and every error it wraps, depth first, through both
// forms of Unwrap.
func chain(err error) iter.Seq[error] {
	return func(yield func(error) bool) {
		var walk func(error) bool
		walk = func(e error) bool {
			if e == nil {
				return true
			}
			if !yield(e) {
				return false
			}
			switch u := e.(type) {
			case interface{ Unwrap() error }:
				return walk(u.Unwrap())
			case interface{ Unwrap() []error }:
				for _, w := range u.Unwrap() {
					if !walk(w) {
						return false
					}
				}
			}
			return true
		}
		walk(err)
	}
}

// oneLine is s on one line, its runs of spaces made one.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// toProblem maps err to its problem. An unknown error is a 500 whose text
// stays in the log.
func toProblem(err error) Problem {
	for i := range problemRules {
		r := &problemRules[i]
		cause, ok := r.matches(err)
		if !ok {
			continue
		}
		p := Problem{Type: ProblemBase + r.slug, Title: r.title, Status: r.status, Detail: r.detail, retryAfter: r.retryAfter}
		if r.retryAfterOf != nil {
			p.retryAfter = r.retryAfterOf(err)
		}
		switch {
		case p.Detail != "":
		case r.detailOf != nil:
			p.Detail = r.detailOf(cause)
		default:
			p.Detail = clientDetail(err, cause, r.contextOnly)
		}
		if r.ext != nil {
			p.Extensions = r.ext(err)
		}
		return p
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
		s.log.DebugContext(r.Context(), "request canceled by the client", "method", r.Method, "path", r.URL.Path)
		return
	}
	status, header, body := s.renderProblem(r.Context(), err, r.Method, r.URL.Path, extra, r.URL.Path == forwardAuthPath)
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
func (s *server) renderProblem(ctx context.Context, err error, method, instance string, extra map[string]any, fold bool) (int, http.Header, []byte) {
	p := toProblem(err)
	p.Instance = instance
	// The request's span names the problem (it stays unset on an answer
	// that is no refusal).
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("fcd.problem", strings.TrimPrefix(p.Type, ProblemBase)))
	if p.Status >= 500 {
		s.log.ErrorContext(ctx, "request failed", "method", method, "path", instance, "status", p.Status, "err", err)
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
