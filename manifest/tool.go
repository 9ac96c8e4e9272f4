package manifest

import "encoding/json"

// SideEffect classifies what calling a tool does to the world. It decides
// which approvals a call needs and which Cedar action it maps to.
type SideEffect string

// The side-effect classes of MCP+.
const (
	SideEffectNone   SideEffect = "none"
	SideEffectRead   SideEffect = "read"
	SideEffectWrite  SideEffect = "write"
	SideEffectDelete SideEffect = "delete"
)

// Valid reports whether s is one of the declared side-effect classes.
func (s SideEffect) Valid() bool {
	switch s {
	case SideEffectNone, SideEffectRead, SideEffectWrite, SideEffectDelete:
		return true
	}
	return false
}

// Mutating reports whether a call with this side effect changes state and
// therefore always needs a human approval, whatever a policy says.
func (s SideEffect) Mutating() bool { return s == SideEffectWrite || s == SideEffectDelete }

// Recovery is the strategy a caller should follow after a failure mode.
type Recovery string

// The recovery strategies of MCP+.
const (
	RecoveryRetry      Recovery = "retry"
	RecoveryFallback   Recovery = "fallback"
	RecoveryPromptUser Recovery = "prompt_user"
	RecoveryAbort      Recovery = "abort"
)

// Valid reports whether r is a known recovery strategy. The empty value is
// not valid; lint reports it as a missing strategy.
func (r Recovery) Valid() bool {
	switch r {
	case RecoveryRetry, RecoveryFallback, RecoveryPromptUser, RecoveryAbort:
		return true
	}
	return false
}

// Tool is a Tool+ descriptor: an MCP tool definition extended with the MCP+
// metadata (summary, side effects, approval, failure modes, dependencies).
// Its digest (see [Tool.Digest]) covers every field, never only the
// description.
type Tool struct {
	// Name is the tool's name within its server ("create_repository").
	// Elsewhere in fcd tools are named "server/tool".
	Name        string `json:"name"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	// InputSchema is the JSON Schema the arguments of a call must satisfy.
	InputSchema  json.RawMessage `json:"inputSchema"`
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
	Annotations  *Annotations    `json:"annotations,omitempty"`

	// Summary is the short text shown in a snapshot's summary view
	// (progressive disclosure).
	Summary          string        `json:"summary,omitempty"`
	SideEffects      SideEffect    `json:"sideEffects"`
	RequiresApproval bool          `json:"requiresApproval"`
	FailureModes     []FailureMode `json:"failureModes,omitempty"`
	Dependencies     *Dependencies `json:"dependencies,omitempty"`
}

// Annotations are the MCP tool annotations. They are hints from the server;
// fcd only checks that they do not contradict the declared side effects.
type Annotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    *bool  `json:"readOnlyHint,omitempty"`
	DestructiveHint *bool  `json:"destructiveHint,omitempty"`
	IdempotentHint  *bool  `json:"idempotentHint,omitempty"`
	OpenWorldHint   *bool  `json:"openWorldHint,omitempty"`
}

// FailureMode declares one way a tool can fail and how to recover.
type FailureMode struct {
	Error       string   `json:"error"`
	Description string   `json:"description,omitempty"`
	Recovery    Recovery `json:"recovery,omitempty"`
	// MaxAttempts bounds a retry strategy; zero means the caller decides.
	MaxAttempts int `json:"maxAttempts,omitempty"`
	// Fallback names the tool to use for a fallback strategy.
	Fallback string `json:"fallback,omitempty"`
}

// Dependencies are the declared relationships between tools of the same
// server, by tool name.
type Dependencies struct {
	// Requires lists tools whose effect must have completed in the session
	// before this tool is admitted.
	Requires []string `json:"requires,omitempty"`
	// ProducesInputFor lists tools that consume this tool's output.
	ProducesInputFor []string `json:"producesInputFor,omitempty"`
	// ExclusiveWith lists tools that may never both be admitted in one
	// session with this one.
	ExclusiveWith []string `json:"exclusiveWith,omitempty"`
}

// Digest returns the "sha256:<hex>" digest of the descriptor's canonical
// JSON.
func (t *Tool) Digest() (string, error) { return Digest(t) }
