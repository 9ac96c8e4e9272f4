// Package apitest calls authzd's HTTP API (or another fcd server, such as
// a fixture's MCP endpoint) for tests, over real HTTP, and gives its
// answer as tests read it. It imports no fcd package, so that api's own
// tests can use it.
package apitest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// Reply is an answer of the API.
type Reply struct {
	Status int
	Header http.Header
	// Body is the answer's JSON object; nil when it is not one.
	Body map[string]any
	Raw  []byte
}

// Do sends a request to url with the bearer credential secret ("" for
// none), the headers and body (nil for none), and reads the whole answer.
// A request that gets no answer fails t.
func Do(t testing.TB, method, url, secret string, headers map[string]string, body []byte) Reply {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := Reply{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}
