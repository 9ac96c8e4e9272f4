// Package decisionlog exports fcd's policy decisions to an HTTP sink in
// the wire format of OPA's decision_logs plugin, so that a pipeline built
// for OPA's decision logs ingests fcd's decisions unchanged: each upload
// is a POST of a gzip-compressed JSON array of events (OPA's EventV1:
// decision_id, labels, timestamp, path, input, result,
// bundles.fcd.revision, erased, custom) to the service's /logs resource.
//
// Like OPA's plugin, the exporter buffers events in memory (bounded: when
// full, the oldest event is dropped and counted), uploads them in batches
// of at most UploadSizeLimit compressed bytes every MinDelay–MaxDelay,
// retries a failed batch with jittered exponential backoff, and erases
// the JSON pointers it is configured to mask before an event leaves
// the caller, recording them in the event's erased list. It does not run
// OPA's plugin manager: it imports no OPA package.
package decisionlog

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// Defaults of the zero Config, OPA's where fcd has no reason to differ.
const (
	// DefaultResource is where events are posted under the service URL,
	// OPA's default decision_logs resource.
	DefaultResource = "/logs"
	// DefaultBufferSize is OPA's default buffer_size_limit_events.
	DefaultBufferSize = 10000
	// DefaultUploadSizeLimit is OPA's default upload_size_limit_bytes
	// (32 KiB, compressed).
	DefaultUploadSizeLimit = 32 << 10
	// DefaultMinDelay and DefaultMaxDelay bound the wait between uploads.
	// OPA waits 300–600 s; fcd's decisions are audit records an operator
	// may look for minutes after a call, so it uploads within seconds.
	DefaultMinDelay = time.Second
	DefaultMaxDelay = 10 * time.Second
	// DefaultRetryDelay is the first retry's delay, OPA's (100 ms); each
	// retry waits 1.6 times longer, ±20 %, up to MaxDelay.
	DefaultRetryDelay = 100 * time.Millisecond
)

// Credential is a bearer credential of the decision-log service. It never
// reaches a log whole: its LogValue and String are redacted.
type Credential string

// LogValue implements slog.LogValuer.
func (c Credential) LogValue() slog.Value { return slog.StringValue(c.String()) }

// String redacts the credential, so that %v and %s never print it.
func (c Credential) String() string {
	if c == "" {
		return ""
	}
	return "REDACTED"
}

// Config configures an [Exporter]. URL is required; a zero value of any
// other field means its default.
type Config struct {
	// URL is the decision-log service's base URL (http or https), OPA's
	// services[_].url.
	URL string
	// Resource is the path under URL events are posted to; empty means
	// DefaultResource ("/logs").
	Resource string
	// Credential, if set, is sent as "Authorization: Bearer ...".
	Credential Credential
	// HTTPClient sends the uploads; nil means a client with a 30 s
	// timeout.
	HTTPClient *http.Client
	// BufferSize bounds the events held in memory, the batch being sent
	// included; when full, the oldest is dropped (OPA's event buffer);
	// zero means DefaultBufferSize.
	BufferSize int
	// UploadSizeLimit bounds one upload's compressed body in bytes; an
	// event that alone exceeds it is dropped. Zero means
	// DefaultUploadSizeLimit.
	UploadSizeLimit int
	// MinDelay and MaxDelay bound the random wait between uploads (OPA's
	// min_delay_seconds and max_delay_seconds); MaxDelay also caps the
	// retry backoff. Zero means DefaultMinDelay, DefaultMaxDelay. A
	// buffer half full is uploaded at once.
	MinDelay, MaxDelay time.Duration
	// RetryDelay is the first retry's delay; zero means
	// DefaultRetryDelay.
	RetryDelay time.Duration
	// Mask lists JSON pointers (RFC 6901) rooted at /input or /result to
	// erase from every event before it is buffered, as OPA's erase masks
	// do; each one erased is listed in the event's "erased" member.
	Mask []string
	// ID is the replica's id, labels.id; empty means a random UUID, as
	// OPA makes one per instance.
	ID string
	// Version is fcd's version, labels.version; empty means the main
	// module's version in the build information.
	Version string
	// Labels are further labels of every event; id and version are set
	// by ID and Version and cannot be given here.
	Labels map[string]string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// LogValue implements slog.LogValuer: the configuration as an operator
// checks it, the credential only as whether there is one.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", c.URL), slog.String("resource", c.Resource),
		slog.Bool("credential", c.Credential != ""),
		slog.Int("bufferSize", c.BufferSize), slog.Int("uploadSizeLimit", c.UploadSizeLimit),
		slog.Duration("minDelay", c.MinDelay), slog.Duration("maxDelay", c.MaxDelay),
		slog.Any("mask", c.Mask), slog.String("id", c.ID), slog.String("version", c.Version),
	)
}

// Stats counts what an exporter did with the events it was given.
// Logged = Sent + Dropped + Pending, once no upload is in flight.
type Stats struct {
	// Sent is the number of events a receiver accepted (2xx).
	Sent int64
	// Dropped is the number of events that will never be sent: evicted
	// from a full buffer, larger than the upload limit, refused by the
	// receiver for good (a 4xx but 408 and 429), logged after Close, or
	// still buffered when Close gave up.
	Dropped int64
	// Batches is the number of uploads accepted; FailedBatches the number
	// that failed (each retried, unless refused for good).
	Batches, FailedBatches int64
	// Pending is the number of events buffered now.
	Pending int64
}

// Exporter buffers decision events and uploads them to one service. Its
// methods are safe for concurrent use. New starts its one uploading
// goroutine; Close stops it.
type Exporter struct {
	client   *http.Client
	endpoint string
	auth     string // "Bearer ..."; never logged
	bufSize  int
	limit    int
	minDelay time.Duration
	maxDelay time.Duration
	retry    time.Duration
	masks    []pointer
	labels   map[string]string
	log      *slog.Logger

	mu    sync.Mutex
	queue []entry // oldest first; the batch in flight is at its front
	seq   uint64
	// inflight is the seq range of the batch being uploaded; evicted
	// counts its events the buffer bound pushed out meanwhile (sent if
	// the upload succeeds, dropped if not).
	inflight        bool
	inflightHi      uint64
	inflightLo      uint64
	evictedInflight int64
	closed          bool
	stats           Stats
	reportedDrops   int64

	ratio   float64 // uncompressed/compressed bytes of the last batch; the uploader's alone
	wake    chan struct{}
	closing chan struct{}
	abort   context.Context // uploads' context, cancelled when Close gives up
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

type entry struct {
	seq  uint64
	id   string
	data []byte
}

// New validates cfg and returns an exporter with its uploader running.
func New(cfg Config) (*Exporter, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("decisionlog: URL %q: an http or https URL is required", cfg.URL)
	}
	if u.User != nil {
		return nil, errors.New("decisionlog: URL: credentials in the URL would be logged; use Credential")
	}
	if cfg.BufferSize < 0 || cfg.UploadSizeLimit < 0 || cfg.MinDelay < 0 || cfg.MaxDelay < 0 || cfg.RetryDelay < 0 {
		return nil, errors.New("decisionlog: sizes and delays may not be negative")
	}
	x := &Exporter{
		client:   cmp.Or(cfg.HTTPClient, &http.Client{Timeout: 30 * time.Second}),
		endpoint: strings.TrimSuffix(cfg.URL, "/") + "/" + strings.TrimPrefix(cmp.Or(cfg.Resource, DefaultResource), "/"),
		bufSize:  cmp.Or(cfg.BufferSize, DefaultBufferSize),
		limit:    cmp.Or(cfg.UploadSizeLimit, DefaultUploadSizeLimit),
		minDelay: cmp.Or(cfg.MinDelay, DefaultMinDelay),
		maxDelay: cmp.Or(cfg.MaxDelay, DefaultMaxDelay),
		retry:    cmp.Or(cfg.RetryDelay, DefaultRetryDelay),
		log:      cmp.Or(cfg.Logger, slog.Default()),
		ratio:    8,
		wake:     make(chan struct{}, 1),
		closing:  make(chan struct{}),
		done:     make(chan struct{}),
	}
	if x.minDelay > x.maxDelay {
		return nil, fmt.Errorf("decisionlog: MinDelay %v exceeds MaxDelay %v", x.minDelay, x.maxDelay)
	}
	if cfg.Credential != "" {
		x.auth = "Bearer " + string(cfg.Credential)
	}
	for _, m := range cfg.Mask {
		p, err := parsePointer(m)
		if err != nil {
			return nil, fmt.Errorf("decisionlog: %w", err)
		}
		x.masks = append(x.masks, p)
	}
	x.labels = map[string]string{}
	for k, v := range cfg.Labels {
		if k == "id" || k == "version" {
			return nil, fmt.Errorf("decisionlog: label %q is set by ID or Version", k)
		}
		x.labels[k] = v
	}
	x.labels["id"] = cmp.Or(cfg.ID, newUUID())
	x.labels["version"] = cmp.Or(cfg.Version, buildVersion())
	x.abort, x.cancel = context.WithCancel(context.Background())
	go x.run()
	return x, nil
}

// buildVersion is the main module's version as the build recorded it.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// ID is the replica id every event carries as labels.id.
func (x *Exporter) ID() string { return x.labels["id"] }

// Log encodes e, erases the masked pointers and buffers it for upload. It
// never blocks on the network: a full buffer drops its oldest event, and
// an event that cannot be encoded is dropped and logged. After Close the
// event is dropped.
func (x *Exporter) Log(ctx context.Context, e Event) {
	data, id, err := x.encode(e)
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil || x.closed {
		x.stats.Dropped++
		if err != nil {
			x.log.WarnContext(ctx, "decision log: event dropped", "decision_id", id, "err", err)
		}
		return
	}
	if len(x.queue) >= x.bufSize {
		x.evictOldest()
	}
	x.seq++
	x.queue = append(x.queue, entry{seq: x.seq, id: id, data: data})
	if len(x.queue) >= max(1, x.bufSize/2) {
		select {
		case x.wake <- struct{}{}:
		default:
		}
	}
}

// evictOldest drops the oldest buffered event. x.mu is held.
func (x *Exporter) evictOldest() {
	old := x.queue[0]
	x.queue[0] = entry{}
	x.queue = x.queue[1:]
	if x.inflight && old.seq >= x.inflightLo && old.seq <= x.inflightHi {
		x.evictedInflight++ // counted once its upload's outcome is known
		return
	}
	x.stats.Dropped++
}

// Stats returns the counts so far.
func (x *Exporter) Stats() Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.stats
	s.Pending = int64(len(x.queue))
	return s
}

// Close stops accepting events and uploads what is buffered, retrying
// until ctx ends; then it stops the uploader. It returns an error naming
// how many events were not delivered (counted as dropped). Calling it
// again waits for the first call's uploads and reports what is left.
func (x *Exporter) Close(ctx context.Context) error {
	x.once.Do(func() {
		x.mu.Lock()
		x.closed = true
		x.mu.Unlock()
		close(x.closing)
	})
	select {
	case <-x.done:
	case <-ctx.Done():
		x.cancel()
		<-x.done
	}
	x.cancel()
	x.mu.Lock()
	defer x.mu.Unlock()
	if n := int64(len(x.queue)); n > 0 {
		x.stats.Dropped += n
		x.queue = nil
		return fmt.Errorf("decisionlog: close: %d events not delivered: %w", n, cmp.Or(ctx.Err(), context.Canceled))
	}
	return nil
}

// run is the uploader: it uploads the buffer every MinDelay–MaxDelay (at
// once when the buffer is half full), backs off after a failure, and on
// Close uploads until the buffer is empty or Close gives up.
func (x *Exporter) run() {
	defer close(x.done)
	retries := 0
	for {
		wake := x.wake
		delay := x.minDelay + rand.N(x.maxDelay-x.minDelay+1)
		if retries > 0 {
			// A failing receiver is not hammered because the buffer fills.
			delay, wake = x.backoff(retries), nil
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-wake:
			timer.Stop()
		case <-x.closing:
			timer.Stop()
			x.drain(retries)
			return
		}
		if err := x.upload(x.abort); err != nil {
			retries++
			x.log.Warn("decision log: upload failed, will retry", "err", err, "retry", retries)
		} else {
			retries = 0
		}
		x.reportDrops()
	}
}

// drain uploads what is buffered at Close, retrying, until the buffer is
// empty or Close gives up (x.abort ends).
func (x *Exporter) drain(retries int) {
	for {
		err := x.upload(x.abort)
		x.reportDrops()
		if err == nil || x.abort.Err() != nil {
			return
		}
		retries++
		x.log.Warn("decision log: upload failed while closing, will retry", "err", err, "retry", retries)
		timer := time.NewTimer(x.backoff(retries))
		select {
		case <-timer.C:
		case <-x.abort.Done():
			timer.Stop()
			return
		}
	}
}

// backoff is OPA's retry delay (util.DefaultBackoff): RetryDelay grown
// 1.6 times a retry, capped at MaxDelay, ±20 % jitter so replicas that
// failed together do not retry in lockstep.
func (x *Exporter) backoff(retries int) time.Duration {
	d := float64(x.retry)
	for ; retries > 1 && d < float64(x.maxDelay); retries-- {
		d *= 1.6
	}
	d = min(d, float64(x.maxDelay))
	return time.Duration(d * (1 + 0.2*(rand.Float64()*2-1)))
}

// reportDrops logs the events dropped since the last report, once per
// upload round rather than once per event.
func (x *Exporter) reportDrops() {
	x.mu.Lock()
	n := x.stats.Dropped - x.reportedDrops
	x.reportedDrops = x.stats.Dropped
	x.mu.Unlock()
	if n > 0 {
		x.log.Warn("decision log: events dropped", "dropped", n)
	}
}

// upload sends the buffer in batches, oldest first, until it is empty or
// an upload fails with a status worth retrying (the batch stays at the
// buffer's front).
func (x *Exporter) upload(ctx context.Context) error {
	for {
		x.mu.Lock()
		if len(x.queue) == 0 {
			x.mu.Unlock()
			return nil
		}
		candidates := x.candidates()
		x.mu.Unlock()

		body, n, err := x.pack(candidates)
		if errors.Is(err, errOversize) {
			x.mu.Lock()
			x.stats.Dropped += int64(x.removeThrough(candidates[0].seq))
			x.mu.Unlock()
			x.log.Error("decision log: event dropped", "decision_id", candidates[0].id, "err", err)
			continue
		}
		if err != nil {
			return err
		}
		x.mu.Lock()
		x.inflight, x.inflightLo, x.inflightHi = true, candidates[0].seq, candidates[n-1].seq
		x.mu.Unlock()

		err = x.post(ctx, body)

		x.mu.Lock()
		var permanent *permanentError
		switch {
		case err == nil:
			x.stats.Sent += int64(n)
			x.stats.Batches++
			x.removeThrough(x.inflightHi)
		case errors.As(err, &permanent):
			x.stats.FailedBatches++
			x.stats.Dropped += int64(x.removeThrough(x.inflightHi)) + x.evictedInflight
		default:
			x.stats.FailedBatches++
			x.stats.Dropped += x.evictedInflight
		}
		x.inflight, x.evictedInflight = false, 0
		x.mu.Unlock()
		if permanent != nil {
			x.log.Error("decision log: batch refused for good, dropped", "events", n, "err", err)
			continue
		}
		if err != nil {
			return err
		}
	}
}

// candidates returns the oldest events that may fit one upload: as many
// as the last batch's compression ratio says fit the limit, at least
// one. x.mu is held.
func (x *Exporter) candidates() []entry {
	budget := int(float64(x.limit) * x.ratio)
	size, n := 2, 0
	for n < len(x.queue) && (n == 0 || size+len(x.queue[n].data)+1 <= budget) {
		size += len(x.queue[n].data) + 1
		n++
	}
	return append([]entry(nil), x.queue[:n]...)
}

// removeThrough removes the events up to seq from the buffer's front and
// returns how many it removed. x.mu is held.
func (x *Exporter) removeThrough(seq uint64) int {
	n := 0
	for len(x.queue) > 0 && x.queue[0].seq <= seq {
		x.queue[0] = entry{}
		x.queue = x.queue[1:]
		n++
	}
	return n
}

// pack compresses the longest prefix of es whose gzip-compressed JSON
// array fits the upload limit, halving the prefix until it does, and
// returns the body and the number of events in it. errOversize: the
// first event alone does not fit.
func (x *Exporter) pack(es []entry) ([]byte, int, error) {
	for n := len(es); ; n = max(1, n/2) {
		var raw bytes.Buffer
		raw.WriteByte('[')
		for i, e := range es[:n] {
			if i > 0 {
				raw.WriteByte(',')
			}
			raw.Write(e.data)
		}
		raw.WriteByte(']')
		var body bytes.Buffer
		zw := gzip.NewWriter(&body)
		if _, err := zw.Write(raw.Bytes()); err != nil {
			return nil, 0, fmt.Errorf("decisionlog: gzip: %w", err)
		}
		if err := zw.Close(); err != nil {
			return nil, 0, fmt.Errorf("decisionlog: gzip: %w", err)
		}
		if body.Len() <= x.limit {
			// Aim the next batch at 90 % of the limit at this ratio.
			x.ratio = max(1, 0.9*float64(raw.Len())/float64(body.Len()))
			return body.Bytes(), n, nil
		}
		if n == 1 {
			return nil, 0, errOversize
		}
		x.ratio = max(1, 0.9*float64(raw.Len())/float64(body.Len()))
	}
}

// permanentError is a receiver's answer that retrying will not change (a
// 4xx but 408 and 429): the batch is dropped rather than retried forever
// in front of every newer event.
type permanentError struct{ status int }

func (e *permanentError) Error() string {
	return fmt.Sprintf("decisionlog: upload refused: HTTP %d", e.status)
}

// post uploads one body as OPA does: gzip-compressed JSON, POST.
func (x *Exporter) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.endpoint, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("decisionlog: upload: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	if x.auth != "" {
		req.Header.Set("Authorization", x.auth)
	}
	resp, err := x.client.Do(req)
	if err != nil {
		return fmt.Errorf("decisionlog: upload: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // reuse the connection
	resp.Body.Close()
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return nil
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		return fmt.Errorf("decisionlog: upload: HTTP %d", s)
	default:
		return &permanentError{status: s}
	}
}
