package api

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"

	"github.com/go-chi/chi/v5"
)

// uiFiles is the approval UI: a static page, its script and its style,
// served under /ui/ with no build step.
//
//go:embed ui
var uiFiles embed.FS

// uiContentSecurityPolicy lets the page load only its own script, style and
// images and talk only to this server; no inline script or style, no
// framing, no form submission (the script sends every request itself).
const uiContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiType is the media type of a UI file, by its extension; false for any
// other kind of file.
func uiType(name string) (string, bool) {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8", true
	case ".js":
		return "text/javascript; charset=utf-8", true
	case ".css":
		return "text/css; charset=utf-8", true
	case ".svg":
		return "image/svg+xml", true
	}
	return "", false
}

// uiHeaders sets the security headers of every /ui answer, errors and
// redirects included.
func uiHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", uiContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// uiRedirect sends /ui to /ui/, where the page's relative references
// resolve.
func (s *server) uiRedirect(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/ui/", http.StatusFound)
}

// uiAsset serves one file of the UI: /ui/ is the page, /ui/app.js its
// script. Anything else is route-not-found; directories are never listed.
func (s *server) uiAsset(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "*")
	if name == "" {
		name = "index.html"
	}
	ctype, known := uiType(name)
	if !known || !fs.ValidPath(name) || strings.Contains(name, "/") {
		s.problem(w, r, errRouteNotFound)
		return
	}
	data, err := uiFiles.ReadFile("ui/" + name)
	if err != nil {
		s.problem(w, r, errRouteNotFound)
		return
	}
	w.Header().Set("Content-Type", ctype)
	_, _ = w.Write(data)
}

// showCaller answers the id and role of the credential the request
// carries, on a route of one role: /v1/approvers/me and /v1/operators/me.
// The approval UI calls them at sign-in: hosts may list formations too,
// so only these answers (403 forbidden-role for another role) tell an
// approver's credential, or an operator's, from theirs before the queue
// (or the uncertain leases) is shown.
func (s *server) showCaller(w http.ResponseWriter, r *http.Request) {
	caller, _ := CallerFrom(r.Context())
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]string{"id": caller.ID, "role": string(caller.Role)})
}
