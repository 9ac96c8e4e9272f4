package fencecheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
)

// newLeaseClient is a LeaseClient of the authzd at url with the backend
// credential; retries wait a millisecond.
func newLeaseClient(t *testing.T, url string, opts fencecheck.LeaseClientConfig) *fencecheck.LeaseClient {
	t.Helper()
	opts.AuthzdURL = url
	if opts.Credential == "" {
		opts.Credential = backendCredential
	}
	if opts.Backoff == 0 {
		opts.Backoff = time.Millisecond
	}
	lc, err := fencecheck.NewLeaseClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	return lc
}

// claimRequest is one POST /v1/leases/{lease}/claim as the server saw it.
type claimRequest struct {
	path, auth, contentType string
	body                    claimBody
	err                     error // the body was not exactly {claim, epoch, revision}
}

// claimServer is a real HTTP server speaking the claim endpoint's
// contract, answering the nth request (from 1) with answer(n, w); it
// records every request.
type claimServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []claimRequest
}

func newClaimServer(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *claimServer {
	t.Helper()
	s := &claimServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := claimRequest{path: r.URL.EscapedPath(), auth: r.Header.Get("Authorization"), contentType: r.Header.Get("Content-Type")}
		raw, _ := io.ReadAll(r.Body)
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		req.err = dec.Decode(&req.body)
		r.Body = io.NopCloser(bytes.NewReader(raw)) // for the answer
		s.mu.Lock()
		s.reqs = append(s.reqs, req)
		n := len(s.reqs)
		s.mu.Unlock()
		answer(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *claimServer) requests() []claimRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]claimRequest(nil), s.reqs...)
}

// claimOK confirms the claim it was sent, as authzd does.
func claimOK(w http.ResponseWriter, r *http.Request) {
	var body struct{ Claim string }
	_ = json.NewDecoder(r.Body).Decode(&body)
	lease, _ := url.PathUnescape(strings.TrimSuffix(strings.TrimPrefix(r.URL.EscapedPath(), "/v1/leases/"), "/claim"))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"lease": lease, "claim": body.Claim, "claimedAt": "2027-01-15T08:00:00Z"})
}

// TestLeaseClientContract: what the client sends to authzd's claim
// endpoint, and how it reads each answer of the contract.
func TestLeaseClientContract(t *testing.T) {
	answer := func(status int, slug string) func(int, http.ResponseWriter, *http.Request) {
		return func(_ int, w http.ResponseWriter, _ *http.Request) { problem(w, status, slug) }
	}
	cases := []struct {
		note     string
		answer   func(n int, w http.ResponseWriter, r *http.Request)
		attempts int
		want     error // a sentinel the error must wrap; nil: success
		fails    bool  // an error that wraps neither sentinel
		requests int   // how many the server must receive
	}{
		{note: "claimed", answer: func(_ int, w http.ResponseWriter, r *http.Request) { claimOK(w, r) }, requests: 1},
		{note: "a 200 that confirms another claim", answer: func(_ int, w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"lease":"x","claim":"someone-else","claimedAt":"2027-01-15T08:00:00Z"}`)
		}, fails: true, requests: 1},
		{note: "a 200 that is not authzd's answer", answer: func(_ int, w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `<html>welcome</html>`)
		}, fails: true, requests: 1},
		{note: "claimed by another call", answer: answer(409, "lease-claimed"), want: fencecheck.ErrAlreadyClaimed, requests: 1},
		{note: "lease closed", answer: answer(409, "lease-closed"), want: fencecheck.ErrLeaseGone, requests: 1},
		{note: "lease uncertain", answer: answer(409, "lease-uncertain"), want: fencecheck.ErrLeaseGone, requests: 1},
		{note: "lease not found", answer: answer(404, "lease-not-found"), want: fencecheck.ErrLeaseGone, requests: 1},
		{note: "503 then 200: retried", requests: 2, answer: func(n int, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				http.Error(w, "etcd unavailable", http.StatusServiceUnavailable)
				return
			}
			claimOK(w, r)
		}},
		{note: "a lost answer retried finds its own claim", requests: 2, answer: func(n int, w http.ResponseWriter, r *http.Request) {
			// The first claim was taken but its answer lost in transit.
			if n == 1 {
				if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
					conn.Close() // no answer at all
				}
				return
			}
			claimOK(w, r)
		}},
		{note: "429 then lease-claimed", requests: 2, want: fencecheck.ErrAlreadyClaimed,
			answer: func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					problem(w, http.StatusTooManyRequests, "rate-limited")
					return
				}
				problem(w, http.StatusConflict, "lease-claimed")
			}},
		{note: "503 every time: gives up after Attempts", attempts: 3, fails: true, requests: 3,
			answer: func(_ int, w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "etcd unavailable", http.StatusServiceUnavailable)
			}},
		{note: "credential refused: not retried", answer: answer(401, "unauthenticated"), fails: true, requests: 1},
		{note: "forbidden pool: not retried", answer: answer(403, "forbidden"), fails: true, requests: 1},
		{note: "409 of another kind is not a replay", answer: answer(409, "lease-not-claimed"), fails: true, requests: 1},
		{note: "a plain-text 409 is no claim", fails: true, requests: 1, answer: func(_ int, w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "lease-claimed", http.StatusConflict)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			srv := newClaimServer(t, tc.answer)
			lc := newLeaseClient(t, srv.URL+"/", fencecheck.LeaseClientConfig{Attempts: tc.attempts})
			c := validClaims(t)
			c.ID = "ls_a/b " + newJTI() // escaped in the path
			err := lc.Claim(context.Background(), &c, "cl_test1")
			switch {
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("Claim = %v, want %v", err, tc.want)
			case tc.fails && (err == nil || errors.Is(err, fencecheck.ErrAlreadyClaimed) || errors.Is(err, fencecheck.ErrLeaseGone)):
				t.Fatalf("Claim = %v, want an error that is neither claimed nor gone", err)
			case tc.want == nil && !tc.fails && err != nil:
				t.Fatalf("Claim = %v, want success", err)
			}
			reqs := srv.requests()
			if len(reqs) != tc.requests {
				t.Fatalf("authzd received %d claims, want %d", len(reqs), tc.requests)
			}
			want := claimBody{Claim: "cl_test1", Epoch: c.Epoch, Revision: c.Revision}
			for i, r := range reqs {
				if r.err != nil || r.body != want {
					t.Fatalf("request %d body %+v (%v), want exactly %+v: every retry carries the same claim id", i, r.body, r.err, want)
				}
				if wantPath := "/v1/leases/ls_a%2Fb%20" + strings.TrimPrefix(c.ID, "ls_a/b ") + "/claim"; r.path != wantPath {
					t.Fatalf("path %q, want %q", r.path, wantPath)
				}
				if r.auth != "Bearer "+backendCredential || r.contentType != "application/json" {
					t.Fatalf("Authorization %q, Content-Type %q", r.auth, r.contentType)
				}
			}
		})
	}
}

// TestLeaseClientTimeoutFailsClosed: an authzd that does not answer makes
// the claim fail — neither claimed nor gone — within the client's Timeout,
// and the verifier then refuses the call (claim_unavailable).
func TestLeaseClientTimeoutFailsClosed(t *testing.T) {
	release := make(chan struct{})
	srv := newClaimServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	lc := newLeaseClient(t, srv.URL, fencecheck.LeaseClientConfig{Timeout: 100 * time.Millisecond, Attempts: 1})
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	v := newVerifier(fencechecktest.Keys(key))
	v.Claimer = lc
	c := validClaims(t)
	start := time.Now()
	_, err := v.Verify(context.Background(), key.Issue(c), testTool, json.RawMessage(testArgs))
	if got := fencecheck.ReasonOf(err); got != fencecheck.ReasonClaimUnavailable {
		t.Fatalf("reason = %q (%v), want %s", got, err, fencecheck.ReasonClaimUnavailable)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the claim took %s, its Timeout is 100ms", d)
	}
	err = lc.Claim(context.Background(), &c, "cl_x")
	if err == nil || errors.Is(err, fencecheck.ErrAlreadyClaimed) || errors.Is(err, fencecheck.ErrLeaseGone) {
		t.Fatalf("Claim = %v, want a failure", err)
	}
}

func TestNewLeaseClientValidates(t *testing.T) {
	for _, o := range []fencecheck.LeaseClientConfig{
		{AuthzdURL: "", Credential: "x"},
		{AuthzdURL: "ftp://authzd", Credential: "x"},
		{AuthzdURL: "http://", Credential: "x"},
		{AuthzdURL: "http://authzd"},
	} {
		if _, err := fencecheck.NewLeaseClient(o); err == nil {
			t.Errorf("NewLeaseClient(%+v) accepted", o)
		}
	}
	var buf strings.Builder
	slog.New(slog.NewTextHandler(&buf, nil)).Info("opts", "o", fencecheck.LeaseClientConfig{AuthzdURL: "http://a", Credential: "s3cret"})
	if strings.Contains(buf.String(), "s3cret") {
		t.Fatalf("the credential reached a log: %s", buf.String())
	}
}

// stubClaimer is a stand-in Claimer, used only to test how the Verifier
// maps a Claimer's answers to reasons and what it does with its replay
// memory. The real claim path (LeaseClient → authzd → etcd) is tested
// above against the endpoint's contract, and in api/ and authz/ against
// a real etcd.
type stubClaimer struct {
	mu    sync.Mutex
	err   error // answered to every claim
	calls []stubClaim
}

type stubClaim struct {
	lease, claimID string
}

func (s *stubClaimer) Claim(_ context.Context, c *fencecheck.Claims, claimID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, stubClaim{c.ID, claimID})
	return s.err
}

func (s *stubClaimer) answer(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *stubClaimer) claims() []stubClaim {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stubClaim(nil), s.calls...)
}

// TestVerifyClaimerMapping: in online mode the claim decides, after
// every local check: its errors map to replay, lease_closed or
// claim_unavailable; a success sets Claims.ClaimID.
func TestVerifyClaimerMapping(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	ctx := context.Background()
	args := json.RawMessage(testArgs)
	cases := []struct {
		note string
		err  error
		want fencecheck.Reason
	}{
		{"claimed", nil, ""},
		{"claimed by another call", fmt.Errorf("fencecheck: claim: %w", fencecheck.ErrAlreadyClaimed), fencecheck.ReasonReplay},
		{"lease closed", fmt.Errorf("%w: authzd answered lease-closed", fencecheck.ErrLeaseGone), fencecheck.ReasonLeaseClosed},
		{"authzd unreachable", errors.New("dial tcp: connection refused"), fencecheck.ReasonClaimUnavailable},
		{"timed out", context.DeadlineExceeded, fencecheck.ReasonClaimUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			claimer := &stubClaimer{err: tc.err}
			v := newVerifier(fencechecktest.Keys(key))
			v.Claimer = claimer
			c := validClaims(t)
			got, err := v.Verify(ctx, key.Issue(c), testTool, args)
			if r := fencecheck.ReasonOf(err); r != tc.want {
				t.Fatalf("reason = %q (%v), want %q", r, err, tc.want)
			}
			calls := claimer.claims()
			if len(calls) != 1 || calls[0].lease != c.ID || !strings.HasPrefix(calls[0].claimID, "cl_") {
				t.Fatalf("claims made: %+v, want one for %s", calls, c.ID)
			}
			if tc.want != "" {
				if got != nil {
					t.Fatal("claims returned with an error")
				}
				return
			}
			if got.ClaimID != calls[0].claimID {
				t.Fatalf("ClaimID = %q, claimed under %q", got.ClaimID, calls[0].claimID)
			}
		})
	}
}

// TestVerifyClaimRetryAfterUnavailable: a claim that could not be made
// leaves no trace in the local replay memory, so the same token retried
// reaches the claimer again — and once it is claimed, the local memory
// refuses it without asking authzd.
func TestVerifyClaimRetryAfterUnavailable(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	ctx := context.Background()
	args := json.RawMessage(testArgs)
	claimer := &stubClaimer{err: errors.New("authzd answered 503 Service Unavailable")}
	v := newVerifier(fencechecktest.Keys(key))
	v.Claimer = claimer
	token := key.Issue(validClaims(t))

	for range 2 {
		if _, err := v.Verify(ctx, token, testTool, args); fencecheck.ReasonOf(err) != fencecheck.ReasonClaimUnavailable {
			t.Fatalf("Verify = %v, want claim_unavailable", err)
		}
	}
	claimer.answer(nil)
	c, err := v.Verify(ctx, token, testTool, args)
	if err != nil {
		t.Fatalf("retry after authzd came back: %v", err)
	}
	if _, err := v.Verify(ctx, token, testTool, args); fencecheck.ReasonOf(err) != fencecheck.ReasonReplay {
		t.Fatalf("after the claim: %v, want replay", err)
	}
	calls := claimer.claims()
	if len(calls) != 3 {
		t.Fatalf("the claimer was asked %d times, want 3 (two failures, one claim; the replay is local)", len(calls))
	}
	if calls[0].claimID == calls[1].claimID || calls[2].claimID != c.ClaimID {
		t.Fatalf("claim ids %+v, ClaimID %q: each call claims under its own id", calls, c.ClaimID)
	}
}

// TestVerifyClaimOnlyForGenuineCalls: a token refused by any local check
// — forged, for other arguments, replayed locally — never reaches
// authzd, so it cannot consume the lease of the genuine call.
func TestVerifyClaimOnlyForGenuineCalls(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	forger := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	ctx := context.Background()
	claimer := &stubClaimer{}
	v := newVerifier(fencechecktest.Keys(key))
	v.Claimer = claimer
	c := validClaims(t)
	other := validClaims(t)
	other.Audience = "github-canary"
	for _, attempt := range []struct {
		token, args string
		want        fencecheck.Reason
	}{
		{forger.Issue(c), testArgs, fencecheck.ReasonSignature},
		{key.Issue(other), testArgs, fencecheck.ReasonAudience},
		{key.Issue(c), `{"name":"x"}`, fencecheck.ReasonArguments},
	} {
		if _, err := v.Verify(ctx, attempt.token, testTool, json.RawMessage(attempt.args)); fencecheck.ReasonOf(err) != attempt.want {
			t.Fatalf("Verify = %v, want %s", err, attempt.want)
		}
	}
	if calls := claimer.claims(); len(calls) != 0 {
		t.Fatalf("refused tokens reached the claimer: %+v", calls)
	}
}

// TestVerifyOnlineIgnoresStarted: in online mode the claim decides, so a
// lease admitted before this process started is accepted (offline it is
// refused: TestVerifyOffline).
func TestVerifyOnlineIgnoresStarted(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	v := newVerifier(fencechecktest.Keys(key))
	v.Started = testEpoch
	v.Claimer = &stubClaimer{}
	c := validClaims(t)
	c.Admitted = testEpoch.Add(-time.Hour).UnixMilli()
	if _, err := v.Verify(context.Background(), key.Issue(c), testTool, json.RawMessage(testArgs)); err != nil {
		t.Fatalf("online verifier refused a lease admitted before it started: %v", err)
	}
}

// TestLeaseClientAgainstAuthzdStub: two verifiers of one pool (two
// instances, or one instance before and after a restart) claim through
// the same authzd: one call wins, the other is refused as a replay.
func TestLeaseClientAgainstAuthzdStub(t *testing.T) {
	authzd := newAuthzdStub(t)
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	token := key.Issue(validClaims(t))
	var accepted atomic.Int64
	var reasons sync.Map
	var wg sync.WaitGroup
	for i := range 2 {
		v := newVerifier(fencechecktest.Keys(key))
		v.Claimer = newLeaseClient(t, authzd.URL, fencecheck.LeaseClientConfig{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := v.Verify(context.Background(), token, testTool, json.RawMessage(testArgs))
			if err == nil {
				accepted.Add(1)
			}
			reasons.Store(i, fencecheck.ReasonOf(err))
		}()
	}
	wg.Wait()
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d instances accepted the token, want 1", n)
	}
	for i := range 2 {
		if r, _ := reasons.Load(i); r != fencecheck.Reason("") && r != fencecheck.ReasonReplay {
			t.Fatalf("instance %d: reason %v, want replay", i, r)
		}
	}
}
