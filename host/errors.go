package host

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors a tools/call can end with before anything is sent, matched with
// errors.Is.
var (
	// ErrUnknownTool: the snapshot does not list the tool the call names.
	// The model chose a tool it was not shown, or the catalog was relisted
	// without a new snapshot.
	ErrUnknownTool = errors.New("the tool is not in the snapshot")
	// ErrAmbiguousTool: without [Config.Server], more than one server of
	// the snapshot has a tool of the call's name.
	ErrAmbiguousTool = errors.New("the tool name is on more than one server of the snapshot; set Config.Server")
	// ErrBatchedCall: a JSON-RPC batch holds a tools/call; each call must
	// be a request of its own, with its own formation.
	ErrBatchedCall = errors.New("a tools/call inside a JSON-RPC batch cannot carry a formation; send each call on its own")
)

// Formation is what the host is told of a formed call.
type Formation struct {
	// ID is the formation id the call is sent with (Fcd-Formation).
	ID string
	// Tool is the call's tool, server/tool; Session the session it was
	// formed in.
	Tool, Session string
	// Status is its place in its lifecycle: pending_approval, ready,
	// denied, expired, ... (api/openapi.yaml, FormationStatus).
	Status string
	// Digest is what approvers approve.
	Digest string
	// ApprovalsRequired is how many distinct approvers must approve it;
	// Approvals are the decisions recorded so far.
	ApprovalsRequired int
	Approvals         []Approval
	// Rules and Reasons are the policy engines' deciding rules and their
	// reasons, engine after engine.
	Rules, Reasons []string
	// ExpiresAt is when it expires unless admitted.
	ExpiresAt time.Time
}

// Approval is one approver's decision on a formation.
type Approval struct {
	Approver, Decision, Reason string
}

// approved is the number of approvals (not denials) recorded.
func (f Formation) approved() int {
	n := 0
	for _, a := range f.Approvals {
		if a.Decision == "approve" {
			n++
		}
	}
	return n
}

// PendingError ends a call whose formation waits for approval, when the
// transport does not wait ([Config.WaitForApproval] false). Once approvers
// approved it, the host sends the call again with [WithFormation] and this
// formation's ID (without it, the transport forms the call anew).
type PendingError struct {
	Formation Formation
	// ApprovalURL is authzd's approval page, where approvers find the
	// formation among those pending.
	ApprovalURL string
}

func (e *PendingError) Error() string {
	f := e.Formation
	return fmt.Sprintf("the call of %s waits for approval (%d of %d approvals): formation %s, approvers decide at %s",
		f.Tool, f.approved(), f.ApprovalsRequired, f.ID, e.ApprovalURL)
}

// DeniedError ends a call the policies denied at formation, or an approver
// denied while the transport waited.
type DeniedError struct {
	Formation Formation
	// Reasons say why: the policy engines' reasons, then each denying
	// approver's.
	Reasons []string
}

func (e *DeniedError) Error() string {
	why := "no reason given"
	if len(e.Reasons) > 0 {
		why = strings.Join(e.Reasons, "; ")
	}
	return fmt.Sprintf("the call of %s is denied (formation %s): %s", e.Formation.Tool, e.Formation.ID, why)
}

// ExpiredError ends a call whose formation expired before approvers
// approved it.
type ExpiredError struct {
	Formation Formation
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("the call of %s expired unapproved (formation %s, %d of %d approvals)",
		e.Formation.Tool, e.Formation.ID, e.Formation.approved(), e.Formation.ApprovalsRequired)
}

// RefusedError is a refusal of a formed tools/call by the gateway (authzd
// deciding its admission) or by the backend's fencecheck: an answer with
// an Fcd-Problem header. Its body was read and closed.
type RefusedError struct {
	// Formation is the formation the call was sent with.
	Formation string
	// Status is the HTTP status of the answer.
	Status int
	// Problem is the Fcd-Problem header: authzd's problem type slug
	// (docs/problems.md) or fencecheck's reason (fencecheck/README.md).
	Problem string
	// Type is the problem type URI, when the body names one.
	Type string
	// Detail is the problem's detail (or title), or the JSON-RPC error's
	// message.
	Detail string
	// Fence is true when fencecheck refused (a JSON-RPC error), false
	// when the gateway did (a problem+json answer).
	Fence bool
	// RetryAfter is when a retry may pass (Retry-After); zero when none
	// can. A retry needs a new formation unless the problem says
	// otherwise.
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string {
	who := "the gateway"
	if e.Fence {
		who = "the backend's fence"
	}
	msg := fmt.Sprintf("%s refused the call of formation %s (%d %s)", who, e.Formation, e.Status, e.Problem)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf("; retry after %s", e.RetryAfter)
	}
	return msg
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
