package front

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// maxProbeBody bounds what answerDiscoverAsLegacy reads of a sessionless
// request to see whether it is a server/discover.
const maxProbeBody = 64 << 10

// answerDiscoverAsLegacy answers a server/discover — the probe of the
// 2026-07-28 revision (SEP-2575) — as a server of the earlier revisions
// does: method not found, so that the client falls back to initialize.
// The front is one: its sessions each hold a snapshot, so its handler is
// stateful, and the SDK serves the sessionless revision only on stateless
// handlers. Everything else passes untouched.
//
// The SDK itself answers the probe with a result that lists only the
// versions served, without the one asked for, and clients disagree on
// what that means: mcp-go v1.2.1 takes any result as its version
// accepted and then has every request refused for it; given instead the
// UnsupportedProtocolVersion error the SDK answers other such requests
// with, the AI SDK's client (@ai-sdk/mcp 2.0.99) stops rather than fall
// back. Method not found is what each client (these two, the official Go
// and TypeScript SDKs, the MCP Inspector) reads as "initialize".
func answerDiscoverAsLegacy(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			next.ServeHTTP(w, r)
			return
		}
		head, err := io.ReadAll(io.LimitReader(r.Body, maxProbeBody))
		if err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(head, &req) != nil || req.Method != "server/discover" || len(req.ID) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{
			"code":    jsonrpc.CodeMethodNotFound,
			"message": "server/discover is not served: sessions with this server begin with initialize",
		}})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write(body)
	})
}
