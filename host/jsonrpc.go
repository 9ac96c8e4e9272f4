package host

import (
	"encoding/json"

	"github.com/fcd-authz/fcd/fencecheck"
)

// toolCall is the part of a tools/call request the transport forms.
type toolCall struct {
	Name string
	// Arguments are params.arguments as the body holds them (nil when
	// absent).
	Arguments json.RawMessage
}

// toolCallOf returns the tools/call a POST body holds, nil when it holds
// none: another request, a notification, a response, a batch without a
// call, or no JSON at all — those pass untouched. It reads the body with
// [fencecheck.ReadMessage], the reader authzd's gateway check and the fence
// read it with, so the call formed is the call they verify. A batch that
// holds a call is [ErrBatchedCall]; any other body that reader refuses (a
// member twice, a name fcd reads spelled in another case, invalid UTF-8,
// names in the arguments that fold alike, …) is its *fencecheck.RejectError:
// the gateway and the fence would refuse it, so it is not sent.
func toolCallOf(body []byte) (*toolCall, error) {
	m, err := fencecheck.ReadMessage(body)
	switch fencecheck.ReasonOf(err) {
	case "":
	case fencecheck.ReasonParse:
		return nil, nil
	case fencecheck.ReasonBatch:
		return nil, ErrBatchedCall
	default:
		return nil, err
	}
	if !m.Call {
		return nil, nil
	}
	return &toolCall{Name: m.Name, Arguments: m.Arguments}, nil
}
