package fencecheck

import (
	"bytes"
	"encoding/json"
	"mime"
	"strconv"
	"unicode/utf8"
)

// answer is what the backend answered a call, as its response shows.
type answer int

const (
	// answeredNone: no JSON-RPC answer to the call was seen.
	answeredNone answer = iota
	// answeredResult: a result — the tool ran.
	answeredResult
	// answeredToolError: a result with isError true — the tool ran and
	// failed.
	answeredToolError
	// answeredError: a JSON-RPC error — the server refused the request
	// before any tool ran (unknown tool, invalid params, no session).
	answeredError
)

// maxAnswerScan bounds how much of a response is kept while looking for
// the answer: the answer to a call comes early in its stream, and a larger
// plain-JSON answer is read as unknown (uncertain).
const maxAnswerScan = 1 << 20

// answerScanner finds the JSON-RPC answer to one call in a response,
// whether the body is one JSON message (application/json) or a stream of
// server-sent events (text/event-stream) carrying notifications and
// requests before the answer. It parses what it reads — no substring
// guesses — so tool output cannot fake an answer.
type answerScanner struct {
	id       json.RawMessage // the call's id
	sse      bool
	buf      []byte // unconsumed bytes (SSE: the incomplete line; JSON: the body)
	data     []byte // SSE: the data of the event being read
	overflow bool
	got      answer
	// failure is what a JSON-RPC error or a tool error said.
	failure *Failure
}

// failureFor is what the answer said of a failure, for an outcome that
// is one (failed, rejected); nil otherwise.
func (a *answerScanner) failureFor(o Outcome) *Failure {
	if o != OutcomeFailed && o != OutcomeRejected {
		return nil
	}
	return a.failure
}

// start is called with the response's Content-Type before the body.
func (a *answerScanner) start(contentType string) {
	mt, _, _ := mime.ParseMediaType(contentType)
	a.sse = mt == "text/event-stream"
}

// write consumes a chunk of the response body.
func (a *answerScanner) write(b []byte) {
	if a.got != answeredNone || a.overflow {
		return
	}
	if len(a.buf)+len(a.data)+len(b) > maxAnswerScan {
		a.overflow = true
		a.buf, a.data = nil, nil
		return
	}
	a.buf = append(a.buf, b...)
	if !a.sse {
		return // a single JSON message is judged whole, at the end
	}
	for a.got == answeredNone {
		i := bytes.IndexAny(a.buf, "\r\n")
		if i < 0 {
			return
		}
		line := a.buf[:i]
		next := i + 1
		if a.buf[i] == '\r' && next < len(a.buf) && a.buf[next] == '\n' {
			next++
		} else if a.buf[i] == '\r' && next == len(a.buf) {
			return // a CR at the end of a chunk may be half of a CRLF
		}
		a.line(line)
		a.buf = a.buf[next:]
	}
}

// line handles one line of an event stream (WHATWG server-sent events).
func (a *answerScanner) line(l []byte) {
	if len(l) == 0 { // dispatch the event
		if len(a.data) > 0 {
			a.message(a.data[:len(a.data)-1]) // without the last LF
		}
		a.data = a.data[:0]
		return
	}
	field, value, _ := bytes.Cut(l, []byte(":"))
	if string(field) != "data" {
		return // comments, event, id, retry
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	a.data = append(append(a.data, value...), '\n')
}

// finish judges a plain-JSON body once it is complete, and ends the last
// line of an event stream that ended with a CR (no LF can follow it).
func (a *answerScanner) finish() answer {
	if a.got != answeredNone || a.overflow {
		return a.got
	}
	if !a.sse {
		a.message(a.buf)
	} else if n := len(a.buf); n > 0 && a.buf[n-1] == '\r' {
		a.line(a.buf[:n-1])
		a.buf = a.buf[:0]
	}
	return a.got
}

// message looks at one JSON-RPC message (or batch) for the call's answer.
func (a *answerScanner) message(b []byte) {
	b = bytes.Trim(b, jsonSpace)
	if len(b) > 0 && b[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(b, &batch) == nil {
			for _, el := range batch {
				if a.message(el); a.got != answeredNone {
					return
				}
			}
		}
		return
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	// Strict enough: the message must be JSON that ReadMessage-style
	// readers read one way (no duplicates), and an answer is a response.
	if _, err := ReadMessage(b); err != nil || json.Unmarshal(b, &m) != nil || m.Method != nil || !sameID(m.ID, a.id) {
		return
	}
	switch {
	case len(m.Error) > 0 && !bytes.Equal(m.Error, []byte("null")):
		a.got = answeredError
		var e struct {
			Code    int64           `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		}
		if json.Unmarshal(m.Error, &e) == nil {
			a.failure = &Failure{Code: e.Code, Error: errorName(e.Data), Message: cut(e.Message)}
		}
	case len(m.Result) > 0:
		var r struct {
			IsError           bool `json:"isError"`
			Content           []struct{ Type, Text string }
			StructuredContent json.RawMessage `json:"structuredContent"`
		}
		if json.Unmarshal(m.Result, &r) == nil && r.IsError {
			a.got = answeredToolError
			f := &Failure{Error: errorName(r.StructuredContent)}
			for _, c := range r.Content {
				if c.Type == "text" {
					f.Message = cut(c.Text)
					break
				}
			}
			a.failure = f
		} else {
			a.got = answeredResult
		}
	}
}

// errorName is the "error" member of an object, when it is a string.
func errorName(obj json.RawMessage) string {
	var o struct {
		Error any `json:"error"`
	}
	if json.Unmarshal(obj, &o) != nil {
		return ""
	}
	s, _ := o.Error.(string)
	return cut(s)
}

// cut shortens s to MaxFailureMessage bytes, on a rune boundary.
func cut(s string) string {
	if len(s) <= MaxFailureMessage {
		return s
	}
	s = s[:MaxFailureMessage]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// sameID reports whether two JSON-RPC ids are the same value: equal
// strings, or equal numbers however spelled (1, 1.0, 1e0).
func sameID(a, b json.RawMessage) bool {
	a, b = bytes.Trim(a, jsonSpace), bytes.Trim(b, jsonSpace)
	if len(a) == 0 || len(b) == 0 || bytes.Equal(a, []byte("null")) {
		return false
	}
	if a[0] == '"' || b[0] == '"' {
		var sa, sb string
		return json.Unmarshal(a, &sa) == nil && json.Unmarshal(b, &sb) == nil && a[0] == b[0] && sa == sb
	}
	fa, errA := strconv.ParseFloat(string(a), 64)
	fb, errB := strconv.ParseFloat(string(b), 64)
	return errA == nil && errB == nil && fa == fb
}
