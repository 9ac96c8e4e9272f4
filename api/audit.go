package api

import (
	"fmt"
	"net/http"
	"strconv"
)

// Page bounds of GET /v1/audit.
const (
	defaultAuditLimit = 100
	maxAuditLimit     = 1000
)

// auditPage answers a page of this replica's audit trail: its events
// after the sequence number `after`, at most `limit`, and `next` while
// more follow. Each replica serves its own chain; an auditor verifies the
// files (authzd audit verify), this route is for reading them.
func (s *server) auditPage(w http.ResponseWriter, r *http.Request) {
	if s.trail == nil {
		s.problem(w, r, fmt.Errorf("%w: this replica keeps no audit trail", errRouteNotFound))
		return
	}
	q := r.URL.Query()
	after, limit := uint64(0), defaultAuditLimit
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			s.problem(w, r, fmt.Errorf("%w: after=%q is not a sequence number", errBadParameter, v))
			return
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAuditLimit {
			s.problem(w, r, fmt.Errorf("%w: limit=%q is not an integer from 1 to %d", errBadParameter, v, maxAuditLimit))
			return
		}
		limit = n
	}
	events, next, err := s.trail.Page(after, limit)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	out := map[string]any{"replica": s.trail.Replica(), "events": events}
	if next != 0 {
		out["next"] = next
	}
	writeJSON(w, http.StatusOK, out)
}
