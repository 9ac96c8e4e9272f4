package front

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// session is one client session: its own MCP server, holding the tools of
// the snapshot it was shown, and its upstream sessions.
type session struct {
	front  *Front
	server *mcp.Server
	// principal is the stdio session's; an HTTP session's comes with each
	// request (the SDK binds a session to the user that opened it).
	principal Principal
	// fallbackID names a session whose transport has no id (stdio).
	fallbackID string
	ctx        context.Context // the session's life: upstream sessions
	cancel     context.CancelFunc

	mu sync.Mutex
	// current is the catalog the server lists; shown the one the client
	// was last given by tools/list (calls are formed against it), nil
	// until it listed.
	current, shown *catalog
	upstreams      map[string]*upstream // by endpoint
	// pending holds, by call, a formation still waiting for approval when
	// its request gave up: the same call made again waits for it.
	pending map[callKey]string
	// failed holds, by tool, the last call of the session that failed:
	// the next call of the tool (or of its declared fallback) recovers it.
	failed map[string]failedCall
	closed bool
}

// callKey is one call: a tool and its arguments' digest.
type callKey struct{ tool, args string }

// failedCall is a call whose result was an error.
type failedCall struct {
	formation string
	entry     *entry
	args      string // the arguments' digest
}

// open opens a client session on the current catalog.
func (f *Front) open(ctx context.Context, p Principal) (*session, error) {
	c, err := f.current(ctx)
	if err != nil {
		return nil, err
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &session{front: f, principal: p, fallbackID: "front-" + hex.EncodeToString(b[:]), ctx: sctx, cancel: cancel,
		upstreams: map[string]*upstream{}, pending: map[callKey]string{}, failed: map[string]failedCall{}}
	s.server = mcp.NewServer(&mcp.Implementation{Name: "fcd-front", Title: "fcd MCP front", Version: "1"}, &mcp.ServerOptions{
		Instructions: "Tools are called through fcd: a call that writes or deletes waits for a human approval, " +
			"and a refused call answers with an error that says why and what to do.",
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) {
			go func() {
				_ = req.Session.Wait()
				s.close()
			}()
		},
		HasTools: true,
	})
	s.server.AddReceivingMiddleware(s.noteListing)
	s.apply(c)
	f.mu.Lock()
	f.sessions[s] = struct{}{}
	f.mu.Unlock()
	return s, nil
}

// noteListing records the catalog a tools/list answered with: from then
// on the session's calls are formed against it.
func (s *session) noteListing(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/list" {
			return next(ctx, method, req)
		}
		s.mu.Lock()
		listing := s.current
		s.mu.Unlock()
		res, err := next(ctx, method, req)
		if err == nil {
			s.mu.Lock()
			if s.current == listing {
				s.shown = listing
			}
			s.mu.Unlock()
		}
		return res, err
	}
}

// offer gives the session a new catalog: the server lists it (and the SDK
// sends notifications/tools/list_changed); calls formed before keep
// their snapshot, and calls go on being formed against the catalog the
// client was shown until it lists again.
func (s *session) offer(c *catalog) {
	s.mu.Lock()
	if s.closed || s.current == c {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.apply(c)
}

// apply makes c the catalog the server lists.
func (s *session) apply(c *catalog) {
	s.mu.Lock()
	old := s.current
	s.current = c
	s.mu.Unlock()
	if old != nil {
		var gone []string
		for name := range old.tools {
			if _, ok := c.tools[name]; !ok {
				gone = append(gone, name)
			}
		}
		if len(gone) > 0 {
			s.server.RemoveTools(gone...)
		}
	}
	for _, name := range c.names() {
		e := c.tools[name]
		if old != nil && old.tools[name] != nil && old.tools[name].listed == e.listed {
			continue
		}
		s.server.AddTool(e.listed, s.callTool)
	}
}

// formedAgainst is the catalog a call is formed against: the one the
// client was shown, or the one listed if it never listed.
func (s *session) formedAgainst() *catalog {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shown != nil {
		return s.shown
	}
	return s.current
}

// close ends the session's upstream sessions and forgets it.
func (s *session) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	ups := make([]*upstream, 0, len(s.upstreams))
	for _, u := range s.upstreams {
		ups = append(ups, u)
	}
	s.mu.Unlock()
	s.cancel()
	for _, u := range ups {
		u.close()
	}
	s.front.mu.Lock()
	delete(s.front.sessions, s)
	s.front.mu.Unlock()
}
