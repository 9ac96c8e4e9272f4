package fencecheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// authzdClient posts a backend's requests about a lease (its claim, its
// outcome) to authzd with the backend's bearer credential, and reads
// authzd's reply: the status and, for a problem, its type's slug.
type authzdClient struct {
	base       string
	credential string
	http       *http.Client
}

// newAuthzdClient checks authzd's base URL and the credential; what names
// the caller in errors.
func newAuthzdClient(what, authzdURL, credential string, hc *http.Client) (*authzdClient, error) {
	u, err := url.Parse(authzdURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fencecheck: %s: AuthzdURL %q is not an http(s) URL", what, authzdURL)
	}
	if credential == "" {
		return nil, fmt.Errorf("fencecheck: %s: a backend credential is required", what)
	}
	return &authzdClient{base: strings.TrimRight(authzdURL, "/"), credential: credential, http: hc}, nil
}

// reply is authzd's reply to one request.
type reply struct {
	status int
	// slug is the problem type's fragment (docs/problems.md), e.g.
	// "lease-claimed"; empty when the reply is not a problem.
	slug string
	msg  []byte
}

// transient reports whether the request may be sent again: authzd timed
// out, was overloaded or failed (408, 429, 5xx).
func (a reply) transient() bool {
	return a.status == http.StatusRequestTimeout || a.status == http.StatusTooManyRequests || a.status >= 500
}

func (a reply) String() string {
	if a.slug != "" {
		return fmt.Sprintf("%d %s", a.status, a.slug)
	}
	return fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.msg))
}

// leasePost posts body as JSON to /v1/leases/{lease}/{action}. A
// transport error is returned as is (the caller decides whether to send
// again); any HTTP reply is returned without error.
func (c *authzdClient) leasePost(ctx context.Context, lease, action string, body any) (reply, error) {
	return c.post(ctx, "/v1/leases/"+url.PathEscape(lease)+"/"+action, body, 4096)
}

// post posts body as JSON to path and reads at most limit bytes of the
// reply.
func (c *authzdClient) post(ctx context.Context, path string, body any, limit int64) (reply, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(raw))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.credential)
	inject(ctx, req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	a := reply{status: resp.StatusCode}
	a.msg, _ = io.ReadAll(io.LimitReader(resp.Body, limit))
	if resp.StatusCode >= 400 {
		var problem struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(a.msg, &problem) == nil {
			a.slug = problemSlug(problem.Type)
		}
	}
	return a, nil
}

// problemSlug is a problem type's fragment.
func problemSlug(typ string) string { return typ[strings.LastIndexByte(typ, '#')+1:] }

// errGiveUp ends a retry loop early with the error it wraps.
type errGiveUp struct{ err error }

func (e errGiveUp) Error() string { return e.err.Error() }

// retry calls try up to attempts times while it returns an error, waiting
// a jittered backoff (doubling from backoff up to maxBackoff) between
// tries, until ctx ends. try stops the loop at once by returning an
// errGiveUp. It returns nil, or the last error (unwrapped from errGiveUp),
// or ctx's error with the last one.
func retry(ctx context.Context, attempts int, backoff, maxBackoff time.Duration, try func() error) error {
	wait := backoff
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil {
			return nil
		}
		var stop errGiveUp
		if errors.As(err, &stop) {
			return stop.err
		}
		if attempt >= attempts {
			return err
		}
		// Full jitter around the current step, so instances that lost
		// authzd together do not retry together.
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		}
		wait = min(2*wait, maxBackoff)
	}
}
