package front

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAnswerDiscoverAsLegacy: a sessionless server/discover is answered
// method not found (400), whatever version it asks for; every other
// request reaches the SDK's handler with its body whole.
func TestAnswerDiscoverAsLegacy(t *testing.T) {
	var got string
	h := answerDiscoverAsLegacy(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.WriteHeader(http.StatusAccepted)
	}))
	long := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":{"s":"` + strings.Repeat("a", 2*maxProbeBody) + `"}}}`
	for _, tc := range []struct {
		name, method, session, body string
		passes                      bool
	}{
		{"discover", http.MethodPost, "", `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}`, false},
		{"initialize", http.MethodPost, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, true},
		{"a session's discover", http.MethodPost, "s1", `{"jsonrpc":"2.0","id":1,"method":"server/discover"}`, true},
		{"a notification", http.MethodPost, "", `{"jsonrpc":"2.0","method":"server/discover"}`, true},
		{"a batch", http.MethodPost, "", `[{"jsonrpc":"2.0","id":1,"method":"server/discover"}]`, true},
		{"a long body", http.MethodPost, "", long, true},
		{"GET", http.MethodGet, "", "", true},
	} {
		got = ""
		req := httptest.NewRequest(tc.method, "/mcp", strings.NewReader(tc.body))
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		if tc.session != "" {
			req.Header.Set("Mcp-Session-Id", tc.session)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if tc.passes {
			if rec.Code != http.StatusAccepted || got != tc.body {
				t.Errorf("%s: %d, body passed %d of %d bytes", tc.name, rec.Code, len(got), len(tc.body))
			}
			continue
		}
		var res struct {
			ID    int
			Error struct{ Code int }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || rec.Code != http.StatusBadRequest || res.ID != 1 || res.Error.Code != -32601 {
			t.Errorf("%s: %d %s, want 400 and method not found", tc.name, rec.Code, rec.Body)
		}
	}
}
