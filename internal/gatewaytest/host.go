package gatewaytest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// FormationMetaKey is where an MCP call may carry its formation id:
// params._meta["dev.fcd/formation"] (docs/mcp-sessions.md).
const FormationMetaKey = "dev.fcd/formation"

// FormationHeader is the header a forward-auth gateway reads the formation
// id from.
const FormationHeader = "Fcd-Formation"

// FormationTransport wraps base (nil: http.DefaultTransport) for an MCP
// client talking to a forward-auth gateway, which sees headers but no
// body: for each POST whose JSON-RPC body is a tools/call carrying
// params._meta["dev.fcd/formation"] (or a batch with exactly one such
// call), it sets the Fcd-Formation header to that id, unless the request
// already has one. Everything else passes unchanged. This is what an MCP
// host does in front of such a gateway; give it to the official SDK's
// client as StreamableClientTransport.HTTPClient's Transport.
func FormationTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &formationTransport{base: base}
}

type formationTransport struct{ base http.RoundTripper }

func (f *formationTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || req.Header.Get(FormationHeader) != "" {
		return f.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	// A RoundTripper must not change the caller's request: send a copy.
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if id := formationOf(body); id != "" {
		out.Header.Set(FormationHeader, id)
	}
	return f.base.RoundTrip(out)
}

// formationOf returns the formation id of the one tools/call in a JSON-RPC
// message or batch, or "".
func formationOf(body []byte) string {
	type message struct {
		Method string `json:"method"`
		Params struct {
			Meta map[string]any `json:"_meta"`
		} `json:"params"`
	}
	var msgs []message
	if err := json.Unmarshal(body, &msgs); err != nil {
		var m message
		if err := json.Unmarshal(body, &m); err != nil {
			return ""
		}
		msgs = []message{m}
	}
	id := ""
	for _, m := range msgs {
		if m.Method != "tools/call" {
			continue
		}
		s, _ := m.Params.Meta[FormationMetaKey].(string)
		if s == "" {
			continue
		}
		if id != "" {
			return "" // two calls, one header: name none
		}
		id = s
	}
	return id
}

// BasicAuth wraps base (nil: http.DefaultTransport) to send every request
// with HTTP basic credentials, as an MCP host authenticates to a gateway
// that authenticates its clients (the examples do). It never modifies the
// caller's request.
func BasicAuth(base http.RoundTripper, user, password string) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return basicAuth{base, user, password}
}

type basicAuth struct {
	base           http.RoundTripper
	user, password string
}

func (b basicAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	out.SetBasicAuth(b.user, b.password)
	return b.base.RoundTrip(out)
}
