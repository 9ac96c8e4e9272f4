package audit

import (
	"encoding/json"
	"fmt"

	"github.com/fcd-authz/fcd/manifest"
)

// Problem ids of the resolution checks, made when the operator keys are
// given ([VerifyConfig.OperatorKeys]).
const (
	// ProblemResolutionUnsigned: a resolution event carries no signed
	// document, though the operator keys say the deployment required one.
	ProblemResolutionUnsigned = "resolution.unsigned"
	// ProblemResolutionSignature: the signed document a resolution event
	// keeps does not verify against the operator keys (forged, signed by
	// an untrusted key, malformed), or was issued outside the accepted
	// window around the time the event was recorded.
	ProblemResolutionSignature = "resolution.signature"
	// ProblemResolutionMismatch: the document verifies but says something
	// else than the event it is kept with: another lease or outcome,
	// another operator, key or digest.
	ProblemResolutionMismatch = "resolution.mismatch"
)

var resolutionChecks = []string{
	ProblemResolutionUnsigned + ": every resolution keeps the operator's signed document",
	ProblemResolutionSignature + ": every kept resolution verifies against the operator keys, issued within the accepted window of its recording",
	ProblemResolutionMismatch + ": every kept resolution states the lease, outcome, operator, key and digest its event records",
}

// resolutionData is what a resolution event records of its signed
// document (authz/trail.go's outcomeEvent and signedResolutionEvent).
type resolutionData struct {
	Lease   string `json:"lease"`
	Outcome string `json:"outcome"`
	Signed  *struct {
		KeyID    string `json:"kid"`
		Operator string `json:"operator"`
		Digest   string `json:"digest"`
		JWS      string `json:"jws"`
	} `json:"signed"`
}

// checkResolutions verifies again, against the operator keys, the signed
// document every resolution event keeps: a trail cannot be made to show a
// resolution no operator signed, nor one that closed another lease or
// with another outcome than it says. The time window is the one authzd
// applied, around the time the event was recorded.
func checkResolutions(events []placed, operators *manifest.Verifier) []Problem {
	var problems []Problem
	bad := func(ev placed, id, format string, args ...any) {
		problems = append(problems, Problem{ID: id, Replica: ev.Replica, File: ev.file, Line: ev.line, Seq: ev.Seq,
			Detail: fmt.Sprintf(format, args...)})
	}
	for _, ev := range events {
		if ev.Kind != "resolution" {
			continue
		}
		var d resolutionData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			bad(ev, ProblemLine, "the resolution event's data does not decode: %v", err)
			continue
		}
		if d.Signed == nil {
			bad(ev, ProblemResolutionUnsigned, "lease %s was resolved %s without a signed document", d.Lease, d.Outcome)
			continue
		}
		sr, err := operators.VerifyResolution([]byte(d.Signed.JWS), ev.Time)
		if err != nil {
			bad(ev, ProblemResolutionSignature, "the resolution of lease %s: %v", d.Lease, err)
			continue
		}
		r := sr.Resolution
		for _, c := range []struct{ what, doc, event string }{
			{"lease", r.Lease, d.Lease}, {"outcome", r.Outcome, d.Outcome}, {"operator", r.Operator, d.Signed.Operator},
			{"key", sr.KeyID, d.Signed.KeyID}, {"digest", sr.Digest, d.Signed.Digest},
		} {
			if c.doc != c.event {
				bad(ev, ProblemResolutionMismatch, "the resolution of lease %s: the document's %s is %q, the event's %q", d.Lease, c.what, c.doc, c.event)
			}
		}
	}
	return problems
}
