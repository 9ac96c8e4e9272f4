package authz

import (
	"cmp"
	"context"

	"github.com/fcd-authz/fcd/authz/decisionlog"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/record"
)

// DecisionLogger receives one event per policy decision the use cases
// make: each formation's, and each re-decision at admission under a
// policy set that changed since. Log is called on the request's
// goroutine, after the decision and before its record is stored: it must
// not block, and it may read the event's documents only until it returns
// (they are shared, immutable inputs). [decisionlog.Exporter] is one.
type DecisionLogger interface {
	Log(ctx context.Context, e decisionlog.Event)
}

// logDecision hands d, decided over in for rec, to l (nil: none). The
// event's input is the document the engines saw, its result the combined
// decision (verdict, approvals, each engine's verdict, rules and reasons,
// the successor's verdict), its revision the revision of the bundle the
// policy set came from, or the set's digest when it has none; fcd's ids
// go under custom.fcd, which masks do not touch, so a consumer can find
// the formation even when the input is masked.
func logDecision(ctx context.Context, l DecisionLogger, in *policy.Input, d record.Decision, rec *record.Formation) {
	if l == nil {
		return
	}
	ids := map[string]any{"formation": rec.ID, "digest": rec.Digest, "phase": in.Phase}
	if in.Phase == policy.PhaseFormation {
		ids["status"], ids["approvalsRequired"] = rec.Status, rec.ApprovalsRequired
	}
	l.Log(ctx, decisionlog.Event{
		Path: decisionlog.DefaultPath, Input: in, Result: d, Revision: cmp.Or(d.PolicyRevision, d.PolicyDigest),
		Timestamp: d.DecidedAt, Custom: map[string]any{"fcd": ids},
	})
}
