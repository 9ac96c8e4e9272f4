package authz

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/prometheus/client_golang/prometheus"
)

// Notification events: the values of a webhook's "event" member and of
// its Fcd-Event header.
const (
	// NotifyPending: a formation was recorded waiting for approval.
	NotifyPending = "formation.pending"
	// NotifyApproval: an approval was recorded and more are needed.
	NotifyApproval = "formation.approval"
	// NotifyApproved: the last approval needed was recorded.
	NotifyApproved = "formation.approved"
	// NotifyDenied: an approver denied the formation.
	NotifyDenied = "formation.denied"
	// NotifyExpired: the formation expired waiting for approval.
	NotifyExpired = "formation.expired"
)

// SignatureHeader is the header a webhook's signature travels in:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">".
const SignatureHeader = "Fcd-Signature"

// Notifier formats the webhook body: FormatJSON (the documented
// Notification) or FormatSlack ({"text": …}, for a Slack incoming webhook
// or anything that speaks its format).
const (
	FormatJSON  = "json"
	FormatSlack = "slack"
)

// Defaults of a zero NotifierConfig.
const (
	DefaultNotifyQueue       = 1024
	DefaultNotifyAttempts    = 8
	DefaultNotifyMinBackoff  = time.Second
	DefaultNotifyMaxBackoff  = time.Minute
	DefaultNotifyTimeout     = 10 * time.Second
	DefaultNotifyMaxAge      = time.Hour
	notifyShards             = 4
	notifyExpiryCheckDefault = time.Second
)

// WebhookSecret is the key webhooks are signed with; it never reaches a
// log whole.
type WebhookSecret []byte

// LogValue shows that a secret is set, never what it is.
func (WebhookSecret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// NotifierConfig configures a [Notifier]. URL and Secret are required;
// zero values of the other fields mean their defaults.
type NotifierConfig struct {
	// URL receives every notification as a POST. Required.
	URL string
	// Secret signs each body (SignatureHeader). Required.
	Secret WebhookSecret
	// Format is FormatJSON (the zero value) or FormatSlack.
	Format string
	// PageURL is the approval page's address (https://fcd.example/ui/);
	// a notification links "<PageURL>#<formation>". Empty sends no link.
	PageURL string
	// Store fills in what a decision's committed change does not carry
	// (tool, principal, approvals needed) for a formation this notifier
	// did not see created, and seeds the expiry of those pending at start;
	// nil leaves them out.
	Store *lease.Store
	// Queue bounds the notifications waiting for delivery; when full a
	// new one is dropped (fcd_notifications_dropped_total). Zero means
	// DefaultNotifyQueue.
	Queue int
	// Attempts bounds the deliveries of one notification; zero means
	// DefaultNotifyAttempts.
	Attempts int
	// MinBackoff and MaxBackoff bound the wait before a retry, doubling
	// from the one to the other; zero means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// Timeout bounds one delivery; zero means DefaultNotifyTimeout.
	Timeout time.Duration
	// MaxAge: a change older than this when it is read (history replayed
	// after a long outage, or a new trail reading the store from its
	// start) notifies nobody. Zero means DefaultNotifyMaxAge.
	MaxAge time.Duration
	// Client sends the requests; nil means a client of its own.
	Client *http.Client
	Logger *slog.Logger
	Now    func() time.Time
}

// Notification is a webhook's JSON body (docs/approvals.md).
type Notification struct {
	// ID names this notification: "<formation>/<revision>/<event>". A
	// retry repeats it; receivers deduplicate by it.
	ID        string              `json:"id"`
	Event     string              `json:"event"`
	Formation string              `json:"formation"`
	Tool      string              `json:"tool,omitempty"`
	Principal string              `json:"principal,omitempty"`
	Side      manifest.SideEffect `json:"sideEffects,omitempty"`
	Approvals NotificationCount   `json:"approvals"`
	// Approver and Reason are the decision's (approval, approved, denied).
	Approver string `json:"approver,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Revision is the etcd revision of the change (of the formation, for
	// an expiry).
	Revision  int64     `json:"revision"`
	At        time.Time `json:"at"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// Page links the formation's card on the approval page.
	Page string `json:"page,omitempty"`
}

// NotificationCount is how many approvals a formation needs and has.
type NotificationCount struct {
	Required int `json:"required"`
	Given    int `json:"given"`
}

// Notifier sends a signed webhook when a formation starts waiting for
// approval, is approved, denied, or expires. It is fed the store's
// committed changes, in revision order (Observe: the audit trail's
// Follower calls it once a revision is recorded, or Follow reads them
// itself), so that what it announces is what etcd committed, whatever
// became of the request that made it. Delivery never blocks or fails
// the commit it reports: notifications wait in a bounded queue, in order
// per formation, and are retried on 5xx, 408, 429 and transport errors
// with exponential backoff, not on other 4xx answers. Run delivers them.
type Notifier struct {
	cfg    NotifierConfig
	log    *slog.Logger
	shards []chan Notification

	mu      sync.Mutex
	pending map[string]*pendingNote

	sent    *prometheus.CounterVec
	dropped prometheus.Counter
}

type pendingNote struct {
	tool, principal string
	side            manifest.SideEffect
	required, given int
	expires         time.Time
	revision        int64
}

// NewNotifier returns the notifier cfg configures.
func NewNotifier(cfg NotifierConfig) (*Notifier, error) {
	if cfg.URL == "" || len(cfg.Secret) == 0 {
		return nil, errors.New("authz: NotifierConfig.URL and Secret are required")
	}
	switch cfg.Format {
	case "":
		cfg.Format = FormatJSON
	case FormatJSON, FormatSlack:
	default:
		return nil, fmt.Errorf("authz: notification format %q is neither %s nor %s", cfg.Format, FormatJSON, FormatSlack)
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultNotifyQueue
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultNotifyAttempts
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultNotifyMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultNotifyMaxBackoff, cfg.MinBackoff)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultNotifyTimeout
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultNotifyMaxAge
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	n := &Notifier{cfg: cfg, log: cfg.Logger, pending: map[string]*pendingNote{},
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_notifications_total",
			Help: "Approval webhooks by result: delivered (2xx), refused (a 4xx answer, not retried), failed (attempts exhausted).",
		}, []string{"result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fcd_notifications_dropped_total",
			Help: "Approval webhooks dropped because the delivery queue was full.",
		}),
	}
	for range notifyShards {
		n.shards = append(n.shards, make(chan Notification, max(cfg.Queue/notifyShards, 1)))
	}
	return n, nil
}

// Collectors are the notifier's metrics.
func (n *Notifier) Collectors() []prometheus.Collector {
	return []prometheus.Collector{n.sent, n.dropped}
}

// Observe reads one committed revision's changes and queues what they
// announce. It never blocks; call it in revision order.
func (n *Notifier) Observe(ctx context.Context, c lease.Commit) {
	now := n.cfg.Now()
	for _, ch := range c.Changes {
		switch ch := ch.(type) {
		case lease.FormationCreated:
			f := ch.Formation
			if f.Status != record.StatusPendingApproval || now.Sub(f.CreatedAt) > n.cfg.MaxAge || !now.Before(f.ExpiresAt) {
				continue
			}
			p := &pendingNote{tool: f.Tool, principal: f.Principal.ID, side: f.Metadata.SideEffects, required: f.ApprovalsRequired,
				expires: f.ExpiresAt, revision: c.Revision}
			n.mu.Lock()
			n.pending[f.ID] = p
			n.mu.Unlock()
			n.enqueue(p.note(NotifyPending, f.ID, c.Revision, f.CreatedAt))
		case lease.FormationApproved:
			n.mu.Lock()
			p := n.pending[ch.Formation]
			if p != nil {
				if ch.Approval.Decision == record.Approve {
					p.given++
				}
				if ch.Status != record.StatusPendingApproval {
					delete(n.pending, ch.Formation)
				}
			}
			n.mu.Unlock()
			if now.Sub(ch.Approval.At) > n.cfg.MaxAge {
				continue
			}
			if p == nil {
				p = n.lookup(ctx, ch.Formation)
			}
			event := NotifyApproval
			switch ch.Status {
			case record.StatusDenied:
				event = NotifyDenied
			case record.StatusReady:
				event = NotifyApproved
			}
			note := p.note(event, ch.Formation, c.Revision, ch.Approval.At)
			note.Approver, note.Reason = ch.Approval.Approver, ch.Approval.Reason
			n.enqueue(note)
		}
	}
}

// lookup reads a formation this notifier did not see created, for what
// its notification says; an empty note when it cannot.
func (n *Notifier) lookup(ctx context.Context, id string) *pendingNote {
	p := &pendingNote{}
	if n.cfg.Store == nil {
		return p
	}
	f, err := n.cfg.Store.GetFormation(ctx, id)
	if err != nil {
		n.log.Warn("notification: formation not read", "formation", id, "err", err)
		return p
	}
	return &pendingNote{tool: f.Tool, principal: f.Principal.ID, side: f.Metadata.SideEffects, required: f.ApprovalsRequired,
		given: approvedBy(f), expires: f.ExpiresAt}
}

func (p *pendingNote) note(event, id string, rev int64, at time.Time) Notification {
	return Notification{ID: fmt.Sprintf("%s/%d/%s", id, rev, event), Event: event, Formation: id, Tool: p.tool, Principal: p.principal,
		Side: p.side, Approvals: NotificationCount{Required: p.required, Given: p.given}, Revision: rev, At: at.UTC(), ExpiresAt: p.expires}
}

// enqueue queues note on its formation's shard, or drops it.
func (n *Notifier) enqueue(note Notification) {
	if n.cfg.PageURL != "" {
		note.Page = n.cfg.PageURL + "#" + note.Formation
	}
	h := fnv.New32a()
	h.Write([]byte(note.Formation))
	select {
	case n.shards[h.Sum32()%uint32(len(n.shards))] <- note:
	default:
		n.dropped.Inc()
		n.log.Warn("notification dropped: the queue is full", "formation", note.Formation, "event", note.Event)
	}
}

// expire queues an expiry for every pending formation past its expiry.
func (n *Notifier) expire() {
	now := n.cfg.Now()
	var due []Notification
	n.mu.Lock()
	for id, p := range n.pending {
		if !now.Before(p.expires) {
			delete(n.pending, id)
			due = append(due, p.note(NotifyExpired, id, p.revision, p.expires))
		}
	}
	n.mu.Unlock()
	for _, note := range due {
		n.enqueue(note)
	}
}

// seed remembers the formations pending approval now, so that their
// expiry is announced though their creation was before this process.
func (n *Notifier) seed(ctx context.Context) {
	if n.cfg.Store == nil {
		return
	}
	page := lease.FormationPage{Limit: MaxListLimit}
	for {
		recs, next, err := n.cfg.Store.PendingApproval(ctx, page)
		if err != nil {
			n.log.Warn("notification: pending formations not read; their expiry may go unannounced", "err", err)
			return
		}
		n.mu.Lock()
		for _, f := range recs {
			if _, ok := n.pending[f.ID]; !ok && f.Status == record.StatusPendingApproval {
				n.pending[f.ID] = &pendingNote{tool: f.Tool, principal: f.Principal.ID, side: f.Metadata.SideEffects,
					required: f.ApprovalsRequired, given: approvedBy(f), expires: f.ExpiresAt}
			}
		}
		n.mu.Unlock()
		if next == "" {
			return
		}
		page.After = next
	}
}

// Follow feeds the notifier the store's changes committed from now on,
// until ctx ends: for a replica that keeps no audit trail (whose Follower
// would call Observe).
func (n *Notifier) Follow(ctx context.Context) error {
	if n.cfg.Store == nil {
		return errors.New("authz: Notifier.Follow needs NotifierConfig.Store")
	}
	var from int64
	for {
		rev, err := n.cfg.Store.Revision(ctx)
		if err == nil {
			from = rev + 1
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	for {
		err := n.cfg.Store.Follow(ctx, from, func(c lease.Commit) error {
			n.Observe(ctx, c)
			from = c.Revision + 1
			return nil
		}, nil)
		var hc *lease.HistoryCompactedError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &hc):
			from = hc.Compacted
		default:
			return fmt.Errorf("authz: notifications: follow the store: %w", err)
		}
	}
}

// Run delivers queued notifications and announces expiries until ctx
// ends; what is queued then is not sent.
func (n *Notifier) Run(ctx context.Context) {
	n.seed(ctx)
	var wg sync.WaitGroup
	for _, q := range n.shards {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case note := <-q:
					n.deliver(ctx, note)
				}
			}
		})
	}
	t := time.NewTicker(notifyExpiryCheckDefault)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
			n.expire()
		}
	}
}

// body is note in the configured format.
func (n *Notifier) body(note Notification) []byte {
	var v any = note
	if n.cfg.Format == FormatSlack {
		v = map[string]string{"text": slackText(note)}
	}
	b, _ := json.Marshal(v)
	return b
}

func slackText(n Notification) string {
	var what string
	switch n.Event {
	case NotifyPending:
		what = "is waiting for approval"
	case NotifyApproval:
		what = "was approved by " + n.Approver + ", more approvals needed"
	case NotifyApproved:
		what = "was approved by " + n.Approver
	case NotifyDenied:
		what = "was denied by " + n.Approver
	case NotifyExpired:
		what = "expired waiting for approval"
	}
	s := fmt.Sprintf("fcd: %s (%s) for %s %s — approvals %d/%d", n.Tool, n.Side, n.Principal, what, n.Approvals.Given, n.Approvals.Required)
	if n.Page != "" {
		s += " " + n.Page
	}
	return s
}

// Sign is the SignatureHeader value of body at t: what a receiver
// computes to verify a notification.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// deliver sends note until it is answered 2xx or another 4xx, or the
// attempts run out; each attempt is signed afresh.
func (n *Notifier) deliver(ctx context.Context, note Notification) {
	body := n.body(note)
	wait := n.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		status, err := n.post(ctx, note, body)
		switch {
		case err == nil && status/100 == 2:
			n.sent.WithLabelValues("delivered").Inc()
			return
		case err == nil && status/100 == 4 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests,
			err == nil && status/100 == 3:
			n.sent.WithLabelValues("refused").Inc()
			n.log.Warn("notification refused; not retried", "id", note.ID, "status", status)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if attempt >= n.cfg.Attempts {
			n.sent.WithLabelValues("failed").Inc()
			n.log.Warn("notification not delivered; giving up", "id", note.ID, "attempts", attempt, "status", status, "err", err)
			return
		}
		n.log.Debug("notification not delivered; retrying", "id", note.ID, "attempt", attempt, "status", status, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, n.cfg.MaxBackoff)
	}
}

func (n *Notifier) post(ctx context.Context, note Notification, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fcd-authzd")
	req.Header.Set("Fcd-Event", note.Event)
	req.Header.Set("Fcd-Delivery", note.ID)
	req.Header.Set(SignatureHeader, Sign(n.cfg.Secret, n.cfg.Now(), body))
	resp, err := n.cfg.Client.Do(req)
	if err != nil {
		// The URL may carry a token (Slack's do): never log it.
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) && ue.Unwrap() != nil {
			err = ue.Unwrap()
		}
		return 0, errors.New(strings.ReplaceAll(err.Error(), n.cfg.URL, "[webhook]"))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode, nil
}
