package front

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fcd-authz/fcd/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Refusal is why a call was not run, as a refused call's result carries
// it for programs: in structuredContent (when the tool declares no output
// schema, which a refusal would not satisfy) and always in
// _meta[MetaKey].
type Refusal struct {
	// Problem is the stable name of the cause: authzd's problem slug
	// (docs/problems.md), the fence's reason (fencecheck/README.md), or
	// the front's own (docs/front.md): approval-pending, no-route,
	// upstream-unavailable, authzd-unavailable, authzd-unexpected,
	// invalid-arguments.
	Problem string `json:"problem"`
	// Detail says what happened, in one sentence.
	Detail string `json:"detail,omitempty"`
	// Formation is the call's formation, if it was formed.
	Formation string `json:"formation,omitempty"`
	// Reasons are the policies' and approvers' reasons of a denial.
	Reasons []string `json:"reasons,omitempty"`
	// RetryAfter is how many seconds to wait before calling again, when
	// waiting helps.
	RetryAfter int `json:"retryAfter,omitempty"`
	// ApprovalURL is where approvers decide a call waiting for approval.
	ApprovalURL string `json:"approvalUrl,omitempty"`
	// Status is the HTTP status of the refusal, when one was answered.
	Status int `json:"status,omitempty"`
	// Advice tells the model what it may do.
	Advice string `json:"advice,omitempty"`

	// admitted says the call was admitted (its lease opened) before it
	// was stopped.
	admitted bool
}

func (r *Refusal) with(formation string) *Refusal {
	r.Formation = formation
	return r
}

// advice for the causes a model can act on.
var advice = map[string]string{
	"formation-denied":       "Do not retry this call; tell the user why it was denied.",
	"policy-denies":          "Do not retry this call; tell the user it is not allowed now.",
	"not-approved":           "The call waits for approval; call the tool again with the same arguments once it is approved.",
	"source-draining":        "The server is being updated; call the tool again after the wait.",
	"source-stale":           "The tool's release was retired; list the tools again and form the call anew.",
	"dependency-unmet":       "Call the tools it requires first, in this session.",
	"exclusive-conflict":     "This tool cannot be used in a session that used the tool it excludes.",
	"recovery-not-allowed":   "The tool's declared failure modes do not allow calling it again; tell the user.",
	"recovery-blocked":       "Whether the failed call ran is not known yet; try again shortly.",
	"lease-closed":           "This call already ran; do not repeat it.",
	"formation-expired":      "Call the tool again if the user still wants it.",
	"store-unavailable":      "fcd could not decide now; try again shortly.",
	"authzd-unavailable":     "fcd could not be reached; nothing was run. Try again shortly.",
	"upstream-unavailable":   "Try again later.",
	"missing":                "The server refused a call without its dispatch token; tell the operator.",
	"invalid-arguments":      "Correct the arguments to match the tool's input schema and call again.",
	"arguments-invalid":      "Correct the arguments to match the tool's input schema and call again.",
	"tool-not-in-snapshot":   "List the tools again and call one of them.",
	"approval-pending":       "Tell the user the call waits for approval; call the tool again with the same arguments once it is approved.",
	"deny-recovery-attempts": "The call failed too many times; tell the user.",
}

// advised fills Advice from the cause, if it has none.
func (r *Refusal) advised() *Refusal {
	if r.Advice == "" {
		r.Advice = advice[r.Problem]
	}
	return r
}

// problemRefusal is the refusal of an authzd call that failed: its
// problem, or authzd-unavailable when it did not answer (fail closed).
func problemRefusal(doing string, err error) *Refusal {
	var p *client.Problem
	if errors.As(err, &p) {
		r := &Refusal{Problem: p.Slug(), Detail: p.Detail, Status: p.Status, RetryAfter: int(p.RetryAfter.Seconds())}
		if r.Problem == "" {
			r.Problem = "authzd-unexpected"
		}
		if r.Detail == "" {
			r.Detail = p.Title
		}
		if p.Details.Formation != nil {
			r.Formation = *p.Details.Formation
		}
		return r.advised()
	}
	return (&Refusal{Problem: "authzd-unavailable", Detail: "fcd's authorization server did not answer while " + doing}).advised()
}

// refusal is the result a refused call answers: an error the model reads
// (what happened, what it may do) carrying the refusal for programs.
func refusal(e *entry, r *Refusal) *mcp.CallToolResult {
	r.advised()
	var b strings.Builder
	fmt.Fprintf(&b, "fcd did not run this call of %s (%s)", e.name, r.Problem)
	if r.Detail != "" {
		fmt.Fprintf(&b, ": %s", strings.TrimSuffix(r.Detail, "."))
	}
	b.WriteString(".")
	for _, reason := range r.Reasons {
		fmt.Fprintf(&b, "\nReason: %s", reason)
	}
	if r.RetryAfter > 0 {
		fmt.Fprintf(&b, "\nWait %d s before calling again.", r.RetryAfter)
	}
	if r.Advice != "" {
		fmt.Fprintf(&b, "\n%s", r.Advice)
	}
	res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: b.String()}},
		Meta: mcp.Meta{MetaKey: r}}
	if !e.hasOutputSchema {
		res.StructuredContent = map[string]any{"fcd": r}
	}
	return res
}
