package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/bounded"
)

// sessionHeader is the MCP streamable-HTTP session header.
const sessionHeader = "Mcp-Session-Id"

// maxAdopted bounds the sessions a proxy remembers, issued and adopted
// each; past it the least recently used is forgotten. A forgotten session
// the upstream issued is adopted anew on its next call; an adopted one
// gets a new upstream session.
const maxAdopted = 1 << 16

// sessionAdopter lets a verified call reach an upstream that never saw its
// MCP session. A host's session lives on the pool its session traffic is
// routed to; a call admitted to another pool — the successor it captured,
// after its source retired — arrives here with a Mcp-Session-Id this
// upstream did not issue, and an MCP server answers such a request 400 or
// 404 without running it. For a verified call (the fence checked its token;
// nothing unverified can make the proxy open sessions) with a session id
// it does not know, the adopter opens a session of its own with the
// upstream (initialize, then notifications/initialized, as a client does),
// remembers which it is, and sends the call in it; later requests of the
// host's session through this proxy (another call, the GET stream, DELETE)
// go to the same upstream session, and answers carry the host's id back.
// DELETE of an adopted session closes the upstream one, and so does the
// proxy once the session is idle for its idle time — a host may send its
// DELETE to the pool its session began on, and the adopted session must
// not stay open on this one. Unmodified MCP clients see one session.
type sessionAdopter struct {
	next   http.Handler
	target *url.URL
	client *http.Client
	log    *slog.Logger

	idle time.Duration
	now  func() time.Time

	// mu makes a lookup and what follows it (an adopted session's last
	// request, closeIdle's choice) one step.
	mu      sync.Mutex
	issued  bounded.Cache[string, struct{}]     // ids the upstream issued through this proxy
	adopted bounded.Cache[string, *adoptedSess] // by the host's id
}

// adoptedSess is an upstream session opened for a host's session.
type adoptedSess struct {
	upstream string
	path     string // the MCP endpoint's path, where DELETE goes
	version  string
	last     time.Time // the last request of the host's session
}

// defaultAdoptedIdle is how long an adopted session may go without a
// request before the proxy closes it.
const defaultAdoptedIdle = 10 * time.Minute

func newSessionAdopter(next http.Handler, target *url.URL, log *slog.Logger) *sessionAdopter {
	a := &sessionAdopter{next: next, target: target, log: log, client: &http.Client{Timeout: 30 * time.Second},
		idle: defaultAdoptedIdle, now: time.Now}
	a.issued.Max, a.adopted.Max = maxAdopted, maxAdopted
	return a
}

// run closes adopted sessions idle for longer than the idle time, every
// tenth of it, until ctx ends; then it closes them all.
func (a *sessionAdopter) run(ctx context.Context) {
	t := time.NewTicker(max(a.idle/10, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			a.closeIdle(context.WithoutCancel(ctx), -1)
			return
		case <-t.C:
			a.closeIdle(ctx, a.idle)
		}
	}
}

// closeIdle closes (DELETE upstream) the adopted sessions idle for longer
// than idle; every one for a negative idle.
func (a *sessionAdopter) closeIdle(ctx context.Context, idle time.Duration) {
	now := a.now()
	var gone []*adoptedSess
	a.mu.Lock()
	for host, s := range a.adopted.All() {
		if idle < 0 || now.Sub(s.last) > idle {
			gone = append(gone, s)
			a.adopted.Delete(host)
		}
	}
	a.mu.Unlock()
	for _, s := range gone {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := a.closeUpstream(dctx, s)
		cancel()
		if err != nil {
			a.log.Warn("fencecheck: closing an adopted session", "upstream", s.upstream, "err", err)
		} else {
			a.log.Info("fencecheck: closed an idle adopted session", "upstream", s.upstream)
		}
	}
}

// closeUpstream ends an adopted session with the upstream.
func (a *sessionAdopter) closeUpstream(ctx context.Context, s *adoptedSess) error {
	u := *a.target
	u.Path = s.path
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set(sessionHeader, s.upstream)
	req.Header.Set("Mcp-Protocol-Version", s.version)
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (a *sessionAdopter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host := r.Header.Get(sessionHeader)
	if host == "" {
		// An initialize (or a sessionless server): note the id the
		// upstream issues, if any.
		a.next.ServeHTTP(&sessionWriter{ResponseWriter: w, issued: a.noteIssued}, r)
		return
	}
	a.mu.Lock()
	s, adopted := a.adopted.Get(host)
	if adopted {
		s.last = a.now()
	}
	_, issued := a.issued.Get(host)
	a.mu.Unlock()
	if !adopted && !issued {
		if _, verified := fencecheck.ClaimsFromContext(r.Context()); !verified {
			a.next.ServeHTTP(w, r) // the upstream answers what it knows
			return
		}
		var err error
		if s, err = a.open(r.Context(), r); err != nil {
			a.log.Warn("fencecheck: could not open an upstream session for a call", "session", host, "err", err)
			// Nothing ran: say so, or the fence would count the call
			// uncertain.
			w.Header().Set(fencecheck.OutcomeHeader, string(fencecheck.OutcomeRejected))
			http.Error(w, "the upstream refused a session for this call", http.StatusBadGateway)
			return
		}
		a.mu.Lock()
		a.adopted.Put(host, s)
		a.mu.Unlock()
		a.log.Info("fencecheck: adopted the host's session for a call", "session", host, "upstream", s.upstream)
		adopted = true
	}
	if !adopted {
		a.next.ServeHTTP(w, r)
		return
	}
	r.Header.Set(sessionHeader, s.upstream)
	sw := &sessionWriter{ResponseWriter: w, from: s.upstream, to: host}
	a.next.ServeHTTP(sw, r)
	if r.Method == http.MethodDelete && sw.status/100 == 2 {
		a.mu.Lock()
		a.adopted.Delete(host)
		a.mu.Unlock()
	}
}

func (a *sessionAdopter) noteIssued(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.issued.Put(id, struct{}{})
}

// open initializes an upstream session for the call r, speaking the
// protocol version r names.
func (a *sessionAdopter) open(ctx context.Context, r *http.Request) (*adoptedSess, error) {
	u := *a.target
	u.Path, u.RawQuery = singleJoin(a.target.Path, r.URL.Path), r.URL.RawQuery
	version := r.Header.Get("Mcp-Protocol-Version")
	if version == "" {
		version = "2025-06-18"
	}
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":"fcd-adopt","method":"initialize","params":{"protocolVersion":%s,"capabilities":{},"clientInfo":{"name":"fencecheck-proxy","version":"1"}}}`,
		strconv.Quote(version))
	resp, err := a.post(ctx, u.String(), "", version, init)
	if err != nil {
		return nil, err
	}
	id := resp.Header.Get(sessionHeader)
	if resp.StatusCode/100 != 2 || id == "" {
		return nil, fmt.Errorf("initialize answered %d, session %q", resp.StatusCode, id)
	}
	resp, err = a.post(ctx, u.String(), id, version, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("notifications/initialized answered %d", resp.StatusCode)
	}
	return &adoptedSess{upstream: id, path: u.Path, version: version, last: a.now()}, nil
}

// post sends one JSON-RPC message and reads its answer to the end.
func (a *sessionAdopter) post(ctx context.Context, url, session, version, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	if session != "" {
		req.Header.Set(sessionHeader, session)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, nil
}

// singleJoin joins a base path and a request path as the reverse proxy
// does (one slash between).
func singleJoin(a, b string) string {
	switch {
	case a == "" || a == "/":
		return b
	case b == "":
		return a
	case a[len(a)-1] == '/' && b[0] == '/':
		return a + b[1:]
	case a[len(a)-1] != '/' && b[0] != '/':
		return a + "/" + b
	}
	return a + b
}

// sessionWriter rewrites the session header of an answer (the upstream's
// id back to the host's) and notes the id an upstream issues.
type sessionWriter struct {
	http.ResponseWriter
	from, to string
	issued   func(string)
	status   int
}

func (w *sessionWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		h := w.Header()
		if id := h.Get(sessionHeader); id != "" {
			switch {
			case w.from != "" && id == w.from:
				h.Set(sessionHeader, w.to)
			case w.issued != nil:
				w.issued(id)
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *sessionWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes streamed (SSE) answers on as they come.
func (w *sessionWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *sessionWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
