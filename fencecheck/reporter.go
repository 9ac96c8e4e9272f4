package fencecheck

import (
	"context"
	"encoding/json"
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
	// Failure is what the backend answered a failed or refused call (a
	// tool error, a JSON-RPC error), for authzd to match against the
	// tool's declared failure modes when the call is recovered.
	Failure *Failure

	// ctx is the context of the call the middleware reports, for its
	// trace (the Tracer and the call's span); its cancellation is not
	// used: a report is sent after the call ended.
	ctx context.Context
}

// Failure is what a backend answered when a call failed or was refused:
// a JSON-RPC error's code (none for a tool error: a result with
// isError); the error name the answer states (the error's data.error, or
// the result's structuredContent.error); and its message (the error's
// message, or the result's first text content), cut to
// MaxFailureMessage bytes.
type Failure struct {
	Code    int64  `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

// MaxFailureMessage bounds a reported failure's error name and message.
const MaxFailureMessage = 256

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
	DefaultReportBatch       = 64
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
	// MaxBatch bounds the reports a worker sends in one request (POST
	// /v1/leases/outcomes): a worker takes what is queued when it is free,
	// up to MaxBatch, so reports wait for no batch to fill, and under load
	// one request — and one etcd transaction in authzd — carries many.
	// Zero means [DefaultReportBatch]; 1 sends each report alone. An
	// authzd without the batch route is sent single reports.
	MaxBatch int
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
	// Requests is the number of requests posted to authzd (each report's
	// attempts, or one a batch); Batched the reports sent in a batch of
	// more than one.
	Requests, Batched uint64
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

	sent, dropped, failed, notReleased, requests, batched atomic.Uint64
	// noBatch is set once authzd answered that it has no batch route.
	noBatch atomic.Bool
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
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultReportBatch
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
	return ReporterStats{Sent: r.sent.Load(), Dropped: r.dropped.Load(), Failed: r.failed.Load(), NotReleased: r.notReleased.Load(),
		Requests: r.requests.Load(), Batched: r.batched.Load()}
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
		batch := []OutcomeReport{rep}
	more:
		for len(batch) < r.opts.MaxBatch && !r.noBatch.Load() {
			select {
			case next, ok := <-r.queue:
				if !ok {
					break more
				}
				batch = append(batch, next)
			default:
				break more
			}
		}
		if len(batch) == 1 {
			r.deliver(rep)
			continue
		}
		r.deliverBatch(batch)
	}
}

// errNotReleased: authzd refused a release, as there was nothing to
// release.
var errNotReleased = errors.New("the lease was not released")

// reportBody is one report as authzd reads it.
type reportBody struct {
	Lease     string     `json:"lease,omitempty"` // in a batch only
	Outcome   Outcome    `json:"outcome"`
	Detail    string     `json:"detail"`
	Claim     string     `json:"claim,omitempty"`
	Admission *Admission `json:"admission,omitempty"`
	Failure   *Failure   `json:"failure,omitempty"`
}

// sending is a report on its way: the context its requests are sent
// with (the reporter's, carrying the call's trace) and its span.
type sending struct {
	OutcomeReport
	ctx  context.Context
	span Span
	stop func()
}

// send starts the delivery of rep: its span, a child of the call's, and
// the context of its requests, which ends when the reporter gives up.
func (r *Reporter) send(rep OutcomeReport) *sending {
	if rep.ctx == nil {
		return &sending{OutcomeReport: rep, ctx: r.stop, span: noSpan{}, stop: func() {}}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(rep.ctx))
	stopAfter := context.AfterFunc(r.stop, cancel)
	ctx, span := startSpan(ctx, SpanReport)
	span.SetAttribute("fcd.lease", rep.Lease)
	span.SetAttribute("fcd.outcome", string(rep.Outcome))
	return &sending{OutcomeReport: rep, ctx: ctx, span: span, stop: func() { stopAfter(); cancel() }}
}

// deliver posts one report, retrying transient failures.
func (r *Reporter) deliver(rep OutcomeReport) { r.deliverSending(r.send(rep)) }

func (r *Reporter) deliverSending(s *sending) {
	rep := s.OutcomeReport
	body := reportBody{Outcome: rep.Outcome, Detail: rep.Detail, Claim: rep.Claim, Admission: rep.Admission, Failure: rep.Failure}
	err := retry(r.stop, r.opts.MaxAttempts, r.opts.Backoff, r.opts.MaxBackoff, func() error {
		if r.stop.Err() != nil {
			return errGiveUp{errors.New("abandoned at close")}
		}
		r.requests.Add(1)
		a, err := r.authzd.leasePost(s.ctx, rep.Lease, "complete", body)
		if err != nil {
			return err
		}
		return r.judge(rep, a)
	})
	r.settle(s, err)
}

// deliverBatch posts reports in one request to POST /v1/leases/outcomes,
// where authzd answers each as alone. A report answered with a transient
// status, and every report of a batch that got no per-report answer
// (transport error, authzd failing or without the route), go on alone
// with their own retries.
//
// Each report has its span, in its call's trace; the batch's request
// carries the first report's trace context (a request has one parent).
func (r *Reporter) deliverBatch(batch []OutcomeReport) {
	body := struct {
		Reports []reportBody `json:"reports"`
	}{make([]reportBody, len(batch))}
	sends := make([]*sending, len(batch))
	for i, rep := range batch {
		body.Reports[i] = reportBody{Lease: rep.Lease, Outcome: rep.Outcome, Detail: rep.Detail, Claim: rep.Claim, Admission: rep.Admission, Failure: rep.Failure}
		sends[i] = r.send(rep)
	}
	r.requests.Add(1)
	a, err := r.authzd.post(sends[0].ctx, "/v1/leases/outcomes", body, 1<<20)
	var answer struct {
		Results []struct {
			Status  int `json:"status"`
			Problem *struct {
				Type string `json:"type"`
			} `json:"problem"`
		} `json:"results"`
	}
	if err == nil && a.status == http.StatusOK && json.Unmarshal(a.msg, &answer) == nil && len(answer.Results) == len(batch) {
		r.batched.Add(uint64(len(batch)))
		for i, rep := range batch {
			res := reply{status: answer.Results[i].Status}
			if p := answer.Results[i].Problem; p != nil {
				res.slug = problemSlug(p.Type)
			}
			if err := r.judge(rep, res); err != nil && !errors.As(err, new(errGiveUp)) {
				r.deliverSending(sends[i]) // transient: try alone
			} else {
				r.settle(sends[i], unwrapGiveUp(err))
			}
		}
		return
	}
	if err == nil && (a.status == http.StatusNotFound || a.status == http.StatusMethodNotAllowed) {
		r.log.Warn("fencecheck: authzd has no batch route (POST /v1/leases/outcomes); reporting one by one", "authzd", a)
		r.noBatch.Store(true)
	}
	for _, s := range sends {
		r.deliverSending(s)
	}
}

// judge reads authzd's answer to one report: nil when it was recorded; a
// plain error when it may be sent again (408, 429, 5xx); errGiveUp
// otherwise, wrapping errNotReleased for a release there was nothing to
// release.
func (r *Reporter) judge(rep OutcomeReport, a reply) error {
	release := rep.Claim == "" && rep.Outcome == OutcomeRejected
	switch {
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
}

func unwrapGiveUp(err error) error {
	if g, ok := err.(errGiveUp); ok {
		return g.err
	}
	return err
}

// settle counts a report's end: err is nil (sent), errNotReleased, or
// why it failed.
func (r *Reporter) settle(s *sending, err error) {
	defer s.stop()
	switch {
	case err == nil:
		r.sent.Add(1)
		s.span.End(nil)
		return
	case errors.Is(err, errNotReleased):
		r.notReleased.Add(1)
		s.span.SetAttribute("fcd.released", "false")
		s.span.End(nil)
		return
	}
	r.failed.Add(1)
	s.span.End(err)
	r.log.ErrorContext(s.ctx, "fencecheck: outcome report failed; the lease stays open in authzd",
		"jti", s.Lease, "outcome", s.Outcome, "err", err)
}
