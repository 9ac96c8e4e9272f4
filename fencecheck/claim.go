package fencecheck

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Claimer claims a verified token's lease in fcd's ordered store (etcd,
// through authzd) immediately before the effect. Of all the calls that
// present one lease's token — on any instance of the pool, after a
// restart, after a re-admission, during a call longer than the token's
// life — exactly one claim succeeds. [*LeaseClient] implements it.
//
// Claim must return nil only when the lease is claimed under claimID now
// (also when a retry of the same claimID finds its own claim); an error
// wrapping [ErrAlreadyClaimed] when another call claimed it; one wrapping
// [ErrLeaseGone] when the lease is closed, uncertain or unknown; any other
// error when it cannot tell (authzd unreachable): the verifier then
// refuses the call (fail closed).
type Claimer interface {
	Claim(ctx context.Context, c *Claims, claimID string) error
}

// Errors of a [Claimer].
var (
	// ErrAlreadyClaimed: another call claimed the lease first.
	ErrAlreadyClaimed = errors.New("fencecheck: the lease was claimed by another call")
	// ErrLeaseGone: the lease is closed, uncertain or unknown to authzd.
	ErrLeaseGone = errors.New("fencecheck: the lease is closed, uncertain or unknown")
)

// newClaimID returns a fresh random claim id ("cl_" and 26 base32
// characters): the id of one call's claim, under which it reports.
func newClaimID() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails
	return "cl_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Defaults of [LeaseClientOptions].
const (
	DefaultClaimTimeout  = 5 * time.Second
	DefaultClaimAttempts = 3
	DefaultClaimBackoff  = 50 * time.Millisecond
)

// LeaseClientOptions configure a [LeaseClient]. Zero values mean the
// defaults.
type LeaseClientOptions struct {
	// AuthzdURL is authzd's base URL. Required.
	AuthzdURL string
	// Credential is the bearer credential of role backend. Required.
	Credential string
	// HTTPClient sends the claims; nil means a client of its own with
	// keep-alive connections.
	HTTPClient *http.Client
	// Timeout bounds one Claim, retries included; zero means
	// [DefaultClaimTimeout].
	Timeout time.Duration
	// Attempts bounds the tries of one claim (transport errors, 408, 429
	// and 5xx are retried with the same claim id, so a claim whose answer
	// was lost is found, not taken twice); zero means
	// [DefaultClaimAttempts].
	Attempts int
	// Backoff is the wait before the first retry, doubled after each;
	// zero means [DefaultClaimBackoff].
	Backoff time.Duration
}

// LogValue keeps the credential out of logs.
func (o LeaseClientOptions) LogValue() slog.Value {
	return slog.GroupValue(slog.String("authzdURL", o.AuthzdURL), slog.String("credential", "REDACTED"))
}

// LeaseClient claims leases at authzd's POST /v1/leases/{lease}/claim with
// a backend credential. It is safe for concurrent use.
type LeaseClient struct {
	opts LeaseClientOptions
	base string
}

// NewLeaseClient returns a client for authzd's lease claims.
func NewLeaseClient(opts LeaseClientOptions) (*LeaseClient, error) {
	u, err := url.Parse(opts.AuthzdURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fencecheck: lease client: AuthzdURL %q is not an http(s) URL", opts.AuthzdURL)
	}
	if opts.Credential == "" {
		return nil, errors.New("fencecheck: lease client: a backend credential is required")
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
			ForceAttemptHTTP2: true,
		}}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultClaimTimeout
	}
	if opts.Attempts <= 0 {
		opts.Attempts = DefaultClaimAttempts
	}
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultClaimBackoff
	}
	return &LeaseClient{opts: opts, base: strings.TrimRight(opts.AuthzdURL, "/")}, nil
}

// Claim implements [Claimer].
func (lc *LeaseClient) Claim(ctx context.Context, c *Claims, claimID string) error {
	ctx, cancel := context.WithTimeout(ctx, lc.opts.Timeout)
	defer cancel()
	body, err := json.Marshal(struct {
		Claim    string `json:"claim"`
		Epoch    string `json:"epoch"`
		Revision int64  `json:"revision"`
	}{claimID, c.Epoch, c.Revision})
	if err != nil {
		return fmt.Errorf("fencecheck: claim: %w", err)
	}
	target := lc.base + "/v1/leases/" + url.PathEscape(c.ID) + "/claim"
	wait := lc.opts.Backoff
	var last error
	for attempt := 1; ; attempt++ {
		retry, err := lc.post(ctx, target, body)
		if err == nil || !retry {
			return err
		}
		last = err
		if attempt == lc.opts.Attempts {
			break
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fencecheck: claim %s: %w (last: %v)", c.ID, ctx.Err(), last)
		}
		wait *= 2
	}
	return fmt.Errorf("fencecheck: claim %s: %w", c.ID, last)
}

// post sends one claim; retry tells whether a failure is transient.
func (lc *LeaseClient) post(ctx context.Context, target string, body []byte) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+lc.opts.Credential)
	resp, err := lc.opts.HTTPClient.Do(req)
	if err != nil {
		return ctx.Err() == nil, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return false, nil
	}
	var problem struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(msg, &problem)
	slug := problem.Type[strings.LastIndexByte(problem.Type, '#')+1:]
	switch {
	case slug == "lease-claimed":
		return false, ErrAlreadyClaimed
	case slug == "lease-closed", slug == "lease-uncertain", slug == "lease-not-found":
		return false, fmt.Errorf("%w: authzd answered %s", ErrLeaseGone, slug)
	case resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests,
		resp.StatusCode >= 500:
		return true, fmt.Errorf("authzd answered %s", resp.Status)
	}
	return false, fmt.Errorf("authzd answered %s: %s", resp.Status, bytes.TrimSpace(msg))
}
