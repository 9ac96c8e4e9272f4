package host

import (
	"bytes"
	"encoding/json"
)

// toolCall is the part of a tools/call request the transport forms.
type toolCall struct {
	Name string
	// Arguments are params.arguments as the body holds them (nil when
	// absent).
	Arguments json.RawMessage
}

// toolCallOf returns the tools/call a POST body holds, nil when it holds
// none (another request, a notification, a response, or no JSON-RPC at
// all: those pass untouched). A batch that holds a call is ErrBatchedCall.
func toolCallOf(body []byte) (*toolCall, error) {
	type message struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"params"`
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var batch []struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(trimmed, &batch) != nil {
			return nil, nil
		}
		for _, m := range batch {
			if m.Method == "tools/call" {
				return nil, ErrBatchedCall
			}
		}
		return nil, nil
	}
	var m message
	if json.Unmarshal(trimmed, &m) != nil || m.Method != "tools/call" {
		return nil, nil
	}
	return &toolCall{Name: m.Params.Name, Arguments: m.Params.Arguments}, nil
}
