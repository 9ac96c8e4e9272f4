package fencecheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome is what a backend tells authzd about an admitted call, at
// POST /v1/leases/{jti}/complete.
type Outcome string

// Outcomes of a call, from the evidence of the backend's answer (see the
// package README's table). effect, failed and rejected release the call's
// lease marker; uncertain keeps it, so the epoch cannot retire and the
// call is neither replayed nor substituted until an operator resolves it
// or a newer backend generation releases it.
const (
	// OutcomeEffect: the tool ran and answered a result. Only this meets
	// another tool's requires.
	OutcomeEffect Outcome = "effect"
	// OutcomeFailed: the tool ran and answered a result with isError.
	OutcomeFailed Outcome = "failed"
	// OutcomeRejected: nothing ran: a JSON-RPC error, or a transport
	// answer (4xx) given before any handler; also the release of a lease
	// whose call the fence refused.
	OutcomeRejected Outcome = "rejected"
	// OutcomeUncertain: nobody knows whether the effect happened (the
	// handler panicked, timed out, answered 5xx, or the stream ended
	// before the answer).
	OutcomeUncertain Outcome = "uncertain"
)

// OutcomeReport is one outcome for authzd.
type OutcomeReport struct {
	// Lease is the token's jti.
	Lease string
	// Claim is the id the lease was claimed under ([Claims].ClaimID);
	// empty for a release of an unclaimed lease (outcome rejected) or in
	// offline mode.
	Claim   string
	Outcome Outcome
	Detail  string
	// Admission, when set, repeats what the verified token states of the
	// admission ([Claims.Admission]): authzd then applies the report
	// without reading the lease first. It proves each fact, so wrong ones
	// cost only that read.
	Admission *Admission
}

// Admission is what a dispatch token states of its lease's admission.
type Admission struct {
	Epoch     string `json:"epoch"`
	Revision  int64  `json:"revision"`
	Formation string `json:"formation"`
	Session   string `json:"session"`
	Tool      string `json:"tool"`
}

// Admission returns what the token states of its lease's admission, for
// an [OutcomeReport].
func (c *Claims) Admission() *Admission {
	return &Admission{Epoch: c.Epoch, Revision: c.Revision, Formation: c.Formation, Session: c.Subject, Tool: c.Tool}
}

// Defaults of [ReporterConfig].
const (
	DefaultReportQueue       = 1024
	DefaultReportWorkers     = 8
	DefaultReportAttempts    = 8
	DefaultReportBackoff     = 200 * time.Millisecond
	DefaultReportMaxBackoff  = 10 * time.Second
	defaultReportHTTPTimeout = 10 * time.Second
)

// ReporterConfig configure a [Reporter]. Zero values mean the defaults.
type ReporterConfig struct {
	// AuthzdURL is authzd's base URL, e.g. "https://authzd.example:8443".
	// Required.
	AuthzdURL string
	// Credential is the bearer credential of role backend. Required.
	Credential string
	// HTTPClient posts the outcomes; nil means a client with a 10 s
	// timeout.
	HTTPClient *http.Client
	// QueueSize bounds the outcomes waiting to be sent; zero means
	// [DefaultReportQueue]. A report that finds the queue full is dropped
	// (logged and counted), never waited for.
	QueueSize int
	// Workers is the number of goroutines sending; zero means
	// [DefaultReportWorkers].
	Workers int
	// MaxAttempts bounds the tries of one report; zero means
	// [DefaultReportAttempts]. Transport errors, 408, 429 and 5xx are
	// retried; other statuses are final.
	MaxAttempts int
	// Backoff is the wait before the first retry, doubled after each
	// (with jitter) up to MaxBackoff; zeros mean [DefaultReportBackoff]
	// and [DefaultReportMaxBackoff].
	Backoff, MaxBackoff time.Duration
	// Logger receives drops and failures; nil means slog.Default().
	Logger *slog.Logger
}

// LogValue keeps the credential out of logs.
func (o ReporterConfig) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("authzdURL", o.AuthzdURL),
		slog.String("credential", "REDACTED"),
		slog.Int("queueSize", o.QueueSize),
		slog.Int("workers", o.Workers),
		slog.Int("maxAttempts", o.MaxAttempts),
	)
}

// ReporterStats counts what a [Reporter] did.
type ReporterStats struct {
	// Sent reports were answered 2xx by authzd.
	Sent uint64
	// Dropped reports found the queue full, or the reporter closed.
	Dropped uint64
	// Failed reports were given up after a final status or the last
	// attempt, or abandoned by Close.
	Failed uint64
	// NotReleased releases (rejected, no claim) were refused by authzd
	// because the lease was claimed by another call, closed or
	// uncertain: there was nothing to release, which is as intended.
	NotReleased uint64
}

// Reporter sends call outcomes to authzd asynchronously: [Reporter.Report]
// only enqueues, worker goroutines post with retries and backoff. It is
// safe for concurrent use. Close it to drain the queue and stop the
// workers.
type Reporter struct {
	opts    ReporterConfig
	authzd  *authzdClient
	log     *slog.Logger
	queue   chan OutcomeReport
	stop    context.Context // cancelled when Close gives up draining
	abandon context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.RWMutex
	closed bool

	sent, dropped, failed, notReleased atomic.Uint64
}

// NewReporter starts a reporter's workers.
func NewReporter(opts ReporterConfig) (*Reporter, error) {
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: defaultReportHTTPTimeout}
	}
	c, err := newAuthzdClient("reporter", opts.AuthzdURL, opts.Credential, opts.HTTPClient)
	if err != nil {
		return nil, err
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultReportQueue
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultReportWorkers
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultReportAttempts
	}
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultReportBackoff
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultReportMaxBackoff
	}
	r := &Reporter{
		opts:   opts,
		authzd: c,
		log:    opts.Logger,
		queue:  make(chan OutcomeReport, opts.QueueSize),
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.stop, r.abandon = context.WithCancel(context.Background())
	for range opts.Workers {
		r.wg.Add(1)
		go r.work()
	}
	return r, nil
}

// Report enqueues an outcome and returns at once. It reports false if the
// report was dropped: the queue was full or the reporter is closed.
// Dropping keeps the lease marker in authzd, which is the safe side: the
// epoch cannot retire until the lease is resolved.
func (r *Reporter) Report(rep OutcomeReport) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.closed {
		select {
		case r.queue <- rep:
			return true
		default:
		}
	}
	r.dropped.Add(1)
	r.log.Warn("fencecheck: outcome report dropped", "jti", rep.Lease, "outcome", rep.Outcome,
		"closed", r.closed, "dropped", r.dropped.Load())
	return false
}

// Stats returns the counters so far.
func (r *Reporter) Stats() ReporterStats {
	return ReporterStats{Sent: r.sent.Load(), Dropped: r.dropped.Load(), Failed: r.failed.Load(), NotReleased: r.notReleased.Load()}
}

// Close stops accepting reports and waits until the queue is drained. If
// ctx ends first it abandons the reports still queued or being retried
// (counted as failed) and returns ctx's error once the workers stopped.
func (r *Reporter) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		r.abandon()
		return nil
	case <-ctx.Done():
		r.abandon()
		<-done
		return ctx.Err()
	}
}

func (r *Reporter) work() {
	defer r.wg.Done()
	for rep := range r.queue {
		r.deliver(rep)
	}
}

// errNotReleased: authzd refused a release, as there was nothing to
// release.
var errNotReleased = errors.New("the lease was not released")

// deliver posts one report, retrying transient failures.
func (r *Reporter) deliver(rep OutcomeReport) {
	body := struct {
		Outcome   Outcome    `json:"outcome"`
		Detail    string     `json:"detail"`
		Claim     string     `json:"claim,omitempty"`
		Admission *Admission `json:"admission,omitempty"`
	}{rep.Outcome, rep.Detail, rep.Claim, rep.Admission}
	release := rep.Claim == "" && rep.Outcome == OutcomeRejected
	err := retry(r.stop, r.opts.MaxAttempts, r.opts.Backoff, r.opts.MaxBackoff, func() error {
		if r.stop.Err() != nil {
			return errGiveUp{errors.New("abandoned at close")}
		}
		a, err := r.authzd.leasePost(r.stop, rep.Lease, "complete", body)
		switch {
		case err != nil:
			return err
		case a.status >= 200 && a.status < 300:
			return nil
		case a.transient():
			return fmt.Errorf("authzd answered %s", a)
		case release && a.status == http.StatusConflict &&
			(a.slug == "lease-claimed" || a.slug == "lease-closed" || a.slug == "lease-uncertain"):
			// A release of a lease another call claimed (it runs there) or
			// that is closed already: nothing to release, as intended.
			r.log.Debug("fencecheck: lease not released", "jti", rep.Lease, "authzd", a.slug)
			return errGiveUp{errNotReleased}
		}
		return errGiveUp{fmt.Errorf("authzd answered %s", a)}
	})
	switch {
	case err == nil:
		r.sent.Add(1)
		return
	case errors.Is(err, errNotReleased):
		r.notReleased.Add(1)
		return
	}
	r.failed.Add(1)
	r.log.Error("fencecheck: outcome report failed; the lease stays open in authzd",
		"jti", rep.Lease, "outcome", rep.Outcome, "err", err)
}
