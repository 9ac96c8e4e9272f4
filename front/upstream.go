package front

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Headers the front sets on a call it sends upstream.
const (
	tokenHeader     = "Fcd-Dispatch-Token"
	targetHeader    = "Fcd-Target"
	formationHeader = "Fcd-Formation"
	methodHeader    = "Mcp-Method"
	nameHeader      = "Mcp-Name"
	problemHeader   = "Fcd-Problem"
)

// upstream is one MCP client session of a client session to one endpoint
// (a pool's fence, or the gateway). Calls are sent on it with the headers
// their admission gives; everything else the SDK sends (initialize, the
// GET stream, DELETE) carries none.
type upstream struct {
	cs *mcp.ClientSession

	mu       sync.Mutex
	progress map[string]func(*mcp.ProgressNotificationParams) // by the upstream progress token
	next     int
}

// callHeaders are the headers of one call, passed to the round tripper in
// the call's context; refusal is where the round tripper puts a refusal
// answer of the gateway or the fence.
type callHeaders struct {
	header  http.Header
	refusal *upstreamRefusal
}

type callHeadersKey struct{}

// upstreamRefusal is an HTTP answer with Fcd-Problem to a call: the
// gateway's refusal (authzd's problem) or the fence's.
type upstreamRefusal struct {
	Status     int
	Problem    string
	Type       string
	Detail     string
	RetryAfter int
}

func (r *upstreamRefusal) Error() string {
	return fmt.Sprintf("the call was refused upstream (%d %s): %s", r.Status, r.Problem, r.Detail)
}

// headerTransport adds a call's headers, and the gateway's, to the
// requests of the call; it turns an answer with Fcd-Problem into an
// *upstreamRefusal, so that the SDK hands it to the caller as an error
// and the upstream session lives on.
type headerTransport struct {
	base   http.RoundTripper
	static map[string]string
}

func (t headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ch, _ := req.Context().Value(callHeadersKey{}).(*callHeaders)
	if len(t.static) > 0 || ch != nil {
		req = req.Clone(req.Context())
		for k, v := range t.static {
			req.Header.Set(k, v)
		}
		if ch != nil && req.Method == http.MethodPost {
			for k, v := range ch.header {
				req.Header[k] = v
			}
		}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil || ch == nil || resp.StatusCode < 400 || resp.Header.Get(problemHeader) == "" {
		return resp, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	r := &upstreamRefusal{Status: resp.StatusCode, Problem: resp.Header.Get(problemHeader)}
	if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s >= 0 {
		r.RetryAfter = s
	}
	var body struct {
		Type, Title, Detail string
		Error               *struct {
			Message string
			Data    struct{ Type string }
		}
	}
	if json.Unmarshal(raw, &body) == nil {
		if body.Error != nil {
			r.Type, r.Detail = body.Error.Data.Type, body.Error.Message
		} else {
			r.Type, r.Detail = body.Type, body.Detail
			if r.Detail == "" {
				r.Detail = body.Title
			}
		}
	}
	ch.refusal = r
	return nil, r
}

// upstreamFor returns the session's upstream session to endpoint,
// connecting it on first use.
func (s *session) upstreamFor(ctx context.Context, endpoint string) (*upstream, error) {
	s.mu.Lock()
	if u := s.upstreams[endpoint]; u != nil {
		s.mu.Unlock()
		return u, nil
	}
	s.mu.Unlock()
	u := &upstream{progress: map[string]func(*mcp.ProgressNotificationParams){}}
	c := mcp.NewClient(&mcp.Implementation{Name: "fcd-front", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			tok := fmt.Sprint(req.Params.ProgressToken)
			u.mu.Lock()
			forward := u.progress[tok]
			u.mu.Unlock()
			if forward != nil {
				forward(req.Params)
			}
		},
	})
	base := s.front.hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	var static map[string]string
	if s.front.cfg.Gateway != "" {
		static = s.front.cfg.GatewayHeaders
	}
	tr := &mcp.StreamableClientTransport{Endpoint: endpoint,
		HTTPClient: &http.Client{Transport: headerTransport{base: base, static: static}}}
	// The upstream session lives as long as the client session, not as
	// the call that opened it; connecting takes at most a minute.
	cctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	stopCall := context.AfterFunc(ctx, cancel)
	defer stopCall()
	cs, err := c.Connect(cctx, tr, nil)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	u.cs = cs
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = cs.Close()
		return nil, fmt.Errorf("connect to %s: the session is closed", endpoint)
	}
	if prev := s.upstreams[endpoint]; prev != nil { // a concurrent call connected first
		s.mu.Unlock()
		_ = cs.Close()
		return prev, nil
	}
	s.upstreams[endpoint] = u
	s.mu.Unlock()
	return u, nil
}

// call sends one tools/call with its headers, forwarding the upstream's
// progress notifications to forward.
func (u *upstream) call(ctx context.Context, h http.Header, params *mcp.CallToolParams, forward func(*mcp.ProgressNotificationParams)) (*mcp.CallToolResult, *upstreamRefusal, error) {
	ch := &callHeaders{header: h}
	ctx = context.WithValue(ctx, callHeadersKey{}, ch)
	if forward != nil {
		u.mu.Lock()
		u.next++
		tok := "fcd-front-" + strconv.Itoa(u.next)
		u.progress[tok] = forward
		u.mu.Unlock()
		defer func() {
			u.mu.Lock()
			delete(u.progress, tok)
			u.mu.Unlock()
		}()
		params.SetProgressToken(tok)
	}
	res, err := u.cs.CallTool(ctx, params)
	if ch.refusal != nil {
		return nil, ch.refusal, nil
	}
	return res, nil, err
}

func (u *upstream) close() {
	if u.cs != nil {
		_ = u.cs.Close()
	}
}
