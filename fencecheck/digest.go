package fencecheck

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gowebpki/jcs"
)

// ErrArguments is returned for arguments that are not a JSON object.
var ErrArguments = errors.New("fencecheck: arguments must be a JSON object")

// ArgumentDigest returns "sha256:<hex>" over the RFC 8785 canonical JSON of
// {"arguments": arguments, "tool": tool}, where tool is "server/tool" and
// arguments is the call's JSON object (empty or null means {}). Key order
// and insignificant whitespace do not change it; any value or member
// change does.
func ArgumentDigest(tool string, arguments json.RawMessage) (string, error) {
	args := bytes.TrimSpace(arguments)
	if len(args) == 0 || bytes.Equal(args, []byte("null")) {
		args = []byte("{}")
	}
	if args[0] != '{' {
		return "", ErrArguments
	}
	name, err := json.Marshal(tool)
	if err != nil {
		return "", fmt.Errorf("fencecheck: tool name: %w", err)
	}
	doc := make([]byte, 0, len(args)+len(name)+26)
	doc = append(doc, `{"arguments":`...)
	doc = append(doc, args...)
	doc = append(doc, `,"tool":`...)
	doc = append(doc, name...)
	doc = append(doc, '}')
	canon, err := jcs.Transform(doc)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrArguments, err)
	}
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
