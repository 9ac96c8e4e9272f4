package fencecheck

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// Defaults of [LeaseClientConfig].
const (
	DefaultClaimTimeout  = 5 * time.Second
	DefaultClaimAttempts = 3
	DefaultClaimBackoff  = 50 * time.Millisecond
)

// LeaseClientConfig configure a [LeaseClient]. Zero values mean the
// defaults.
type LeaseClientConfig struct {
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
func (o LeaseClientConfig) LogValue() slog.Value {
	return slog.GroupValue(slog.String("authzdURL", o.AuthzdURL), slog.String("credential", "REDACTED"))
}

// LeaseClient claims leases at authzd's POST /v1/leases/{lease}/claim with
// a backend credential. It is safe for concurrent use.
type LeaseClient struct {
	opts   LeaseClientConfig
	authzd *authzdClient
}

// NewLeaseClient returns a client for authzd's lease claims.
func NewLeaseClient(opts LeaseClientConfig) (*LeaseClient, error) {
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
			ForceAttemptHTTP2: true,
		}}
	}
	c, err := newAuthzdClient("lease client", opts.AuthzdURL, opts.Credential, opts.HTTPClient)
	if err != nil {
		return nil, err
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
	return &LeaseClient{opts: opts, authzd: c}, nil
}

// Claim implements [Claimer].
func (lc *LeaseClient) Claim(ctx context.Context, c *Claims, claimID string) error {
	ctx, cancel := context.WithTimeout(ctx, lc.opts.Timeout)
	defer cancel()
	body := struct {
		Claim    string `json:"claim"`
		Epoch    string `json:"epoch"`
		Revision int64  `json:"revision"`
	}{claimID, c.Epoch, c.Revision}
	err := retry(ctx, lc.opts.Attempts, lc.opts.Backoff, lc.opts.Timeout, func() error {
		a, err := lc.authzd.leasePost(ctx, c.ID, "claim", body)
		switch {
		case err != nil && ctx.Err() != nil:
			return errGiveUp{err}
		case err != nil:
			return err // the claim may have landed: the same claim id finds it
		case a.status == http.StatusOK:
			// Only authzd's confirmation of this very claim counts: any
			// other 200 (a misrouted URL, something that answers every
			// POST) would let the call run unclaimed.
			var got struct{ Lease, Claim string }
			if json.Unmarshal(a.msg, &got) != nil || got.Lease != c.ID || got.Claim != claimID {
				return errGiveUp{fmt.Errorf("authzd's 200 does not confirm claim %q of lease %s: %s", claimID, c.ID, bytes.TrimSpace(a.msg))}
			}
			return nil
		case a.slug == "lease-claimed":
			return errGiveUp{ErrAlreadyClaimed}
		case a.slug == "lease-closed", a.slug == "lease-uncertain", a.slug == "lease-not-found":
			return errGiveUp{fmt.Errorf("%w: authzd answered %s", ErrLeaseGone, a.slug)}
		case a.transient():
			return fmt.Errorf("authzd answered %s", a)
		}
		return errGiveUp{fmt.Errorf("authzd answered %s", a)}
	})
	if err != nil {
		return fmt.Errorf("fencecheck: claim %s: %w", c.ID, err)
	}
	return nil
}
