package client

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProblemTypeBase is what every problem `type` of authzd starts with; the
// rest is the problem's slug (docs/problems.md lists them).
const ProblemTypeBase = "https://github.com/fcd-authz/fcd/blob/main/docs/problems.md#"

// maxProblemBody bounds how much of an error answer is read: authzd's
// problems are small, and a proxy's error page need not be read whole.
const maxProblemBody = 1 << 20

// Problem is an error answer of authzd (RFC 9457 problem details), or of
// whatever answered in its place, as the clients of New return it.
// Callers match it with errors.As and tell causes apart by Slug, which is
// stable; Title and Detail are for people.
type Problem struct {
	// Type is the problem type URI, ProblemTypeBase followed by the slug.
	// It is empty when the answer was not a problem document (a proxy's
	// error page, for one).
	Type string
	// Title is the problem type's short summary; for an answer that was
	// not a problem document, the HTTP status text.
	Title string
	// Status is the HTTP status of the answer.
	Status int
	// Detail explains this occurrence, in one sentence; for an answer that
	// was not a problem document, the start of its body.
	Detail string
	// Instance is the request path the problem is about.
	Instance string
	// RetryAfter is how long the server asked the caller to wait before
	// trying again (the Retry-After header); zero when it did not ask.
	RetryAfter time.Duration
	// Details is the whole problem document, with the extension members
	// its type carries (lint findings, argument violations, an epoch's
	// state, ...); zero for an answer that was not one.
	Details ProblemDetails
	// Header is the answer's header: Fcd-Problem, WWW-Authenticate, and a
	// gateway route's Fcd-Formation.
	Header http.Header
}

// Error says what the server answered, by status, slug and detail.
func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "authzd answered %d", p.Status)
	if slug := p.Slug(); slug != "" {
		fmt.Fprintf(&b, " %s", slug)
	} else if p.Title != "" {
		fmt.Fprintf(&b, " %s", p.Title)
	}
	if p.Detail != "" {
		fmt.Fprintf(&b, ": %s", p.Detail)
	}
	return b.String()
}

// Slug is the stable name of the problem's cause ("formation-not-found",
// "lease-claimed", ...): the fragment of Type, or the Fcd-Problem header
// when the body did not say. It is empty for an answer that was neither.
func (p *Problem) Slug() string {
	if _, slug, ok := strings.Cut(p.Type, "#"); ok && slug != "" {
		return slug
	}
	return p.Header.Get("Fcd-Problem")
}

// ReadProblem reads resp's body (at most 1 MiB of it) as a problem; it
// does not close the body. It is what the clients of New do with a
// problem answer, for callers that send requests on their own (through
// NewClient, or an HttpRequestDoer of theirs) and still want a *Problem.
func ReadProblem(resp *http.Response) *Problem {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBody))
	return problemOf(resp.StatusCode, resp.Header, body)
}

// problemOf builds the Problem of an answer of status with header and body.
func problemOf(status int, header http.Header, body []byte) *Problem {
	p := &Problem{Status: status, Header: header, RetryAfter: retryAfter(header.Get("Retry-After"), time.Now())}
	media, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if media == "application/problem+json" {
		var d ProblemDetails
		if err := json.Unmarshal(body, &d); err == nil && d.Type != "" {
			p.Details = d
			p.Type, p.Title = d.Type, d.Title
			if d.Detail != nil {
				p.Detail = *d.Detail
			}
			if d.Instance != nil {
				p.Instance = *d.Instance
			}
			return p
		}
	}
	p.Title = http.StatusText(status)
	p.Detail = firstLine(body)
	return p
}

// firstLine is the first line of an answer that is not a problem
// document, cut to 200 bytes, for Detail.
func firstLine(body []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}

// retryAfter reads a Retry-After value, delay-seconds or an HTTP-date
// (RFC 9110 §10.2.3), as a wait from now; zero when absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(max(n, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
