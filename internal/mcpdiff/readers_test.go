package mcpdiff_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	sjson "github.com/segmentio/encoding/json"

	"github.com/fcd-authz/fcd/fencecheck"
)

// This file holds the readers the fence's reading is compared with, and the
// comparison itself.

const (
	// protocolVersion is the MCP protocol version the requests carry: the
	// last whose streamable transport still takes JSON-RPC batches, so the
	// SDK's server reads batches as well as single messages.
	protocolVersion = "2025-03-26"
	// inputHeader tells the SDK server's recorders which request a
	// dispatched call belongs to.
	inputHeader = "X-Mcpdiff-Input"
	// digestTool is the tool name arguments are digested under: names are
	// compared on their own.
	digestTool = "mcpdiff/tool"
)

// registeredTools are the tools the SDK server has handlers for. Its
// receiving middleware sees every tools/call it dispatches, whatever the
// name; the tool handlers show that what the middleware saw is what a tool
// gets.
var registeredTools = []string{"echo", "github/create_repository"}

// sdkCall is a tools/call as the MCP Go SDK read it.
type sdkCall struct {
	Name      string
	Arguments json.RawMessage
	Meta      map[string]any
}

func (c sdkCall) same(d sdkCall) bool {
	return c.Name == d.Name && bytes.Equal(c.Arguments, d.Arguments) && reflect.DeepEqual(c.Meta, d.Meta)
}

func (c sdkCall) String() string {
	return fmt.Sprintf("tools/call %q arguments %s _meta %v", c.Name, c.Arguments, c.Meta)
}

// sdkServer is the MCP Go SDK's own streamable HTTP server, stateless and
// answering plain JSON, served in process. It records, per request, the
// tools/call requests it dispatched (receiving middleware) and the ones its
// tool handlers ran.
type sdkServer struct {
	handler http.Handler
	next    atomic.Uint64

	mu         sync.Mutex
	dispatched map[string][]sdkCall
	ran        map[string][]sdkCall
}

func newSDKServer() *sdkServer {
	s := &sdkServer{dispatched: map[string][]sdkCall{}, ran: map[string][]sdkCall{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "mcpdiff", Version: "v0.0.1"}, nil)
	for _, name := range registeredTools {
		tool := &mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}
		server.AddTool(tool, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.record(s.ran, req)
			return &mcp.CallToolResult{}, nil
		})
	}
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.CallToolRequest); ok {
				s.record(s.dispatched, r)
			}
			return next(ctx, method, req)
		}
	})
	s.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	return s
}

func (s *sdkServer) record(into map[string][]sdkCall, req *mcp.CallToolRequest) {
	var key string
	if req.Extra != nil {
		key = req.Extra.Header.Get(inputHeader)
	}
	c := sdkCall{Name: req.Params.Name, Arguments: bytes.Clone(req.Params.Arguments), Meta: req.Params.Meta}
	s.mu.Lock()
	defer s.mu.Unlock()
	into[key] = append(into[key], c)
}

// served is what the SDK server did with one body.
type served struct {
	status     int
	answer     []byte
	dispatched []sdkCall // tools/call requests dispatched, any name
	ran        []sdkCall // tool handler runs
}

// serve posts body to the SDK server as a client would.
func (s *sdkServer) serve(body []byte) served {
	key := strconv.FormatUint(s.next.Add(1), 10)
	req := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", protocolVersion)
	req.Header.Set(inputHeader, key)
	rec := httptest.NewRecorder()
	s.handler.ServeHTTP(rec, req)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := served{status: rec.Code, answer: rec.Body.Bytes(), dispatched: s.dispatched[key], ran: s.ran[key]}
	delete(s.dispatched, key)
	delete(s.ran, key)
	return out
}

// sdkUnmarshal decodes as the SDK's internal/json.Unmarshal does:
// segmentio/encoding/json matching struct fields exactly, after a nesting
// depth check.
func sdkUnmarshal(data []byte, v any) error {
	if err := sdkCheckMaxDepth(data, 1000); err != nil {
		return err
	}
	dec := sjson.NewDecoder(bytes.NewReader(data))
	dec.DontMatchCaseInsensitiveStructFields()
	return dec.Decode(v)
}

// sdkCheckMaxDepth is internal/json.checkMaxDepth of the SDK.
func sdkCheckMaxDepth(data []byte, maxDepth int) error {
	var depth int
	var inString, escaped bool
	for _, b := range data {
		if inString {
			switch {
			case escaped:
				escaped = false
			case b == '\\':
				escaped = true
			case b == '"':
				inString = false
			}
			continue
		}
		switch b {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > maxDepth {
				return fmt.Errorf("nested deeper than %d", maxDepth)
			}
		case '}', ']':
			if depth > 0 {
				depth--
			}
		}
	}
	return nil
}

// sdkRead reads a POST body as the SDK's streamable server does
// (mcp/transport.go readBatch): an array of messages if it decodes as one,
// else one message, each by jsonrpc.DecodeMessage.
func sdkRead(body []byte) (msgs []jsonrpc.Message, batch bool, err error) {
	var raw []json.RawMessage
	if err := sdkUnmarshal(body, &raw); err == nil {
		if len(raw) == 0 {
			return nil, true, fmt.Errorf("empty batch")
		}
		for _, r := range raw {
			msg, err := jsonrpc.DecodeMessage(r)
			if err != nil {
				return nil, true, err
			}
			msgs = append(msgs, msg)
		}
		return msgs, true, nil
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return nil, false, err
	}
	return []jsonrpc.Message{msg}, false, nil
}

// sdkToolCall returns the call the SDK's server hands its tools/call
// handler for request r (mcp/shared.go checkRequest and newMethodInfo's
// unmarshalParams into mcp.CallToolParamsRaw), or false when it dispatches
// none.
func sdkToolCall(r *jsonrpc.Request) (sdkCall, bool) {
	if r.Method != fencecheck.MethodCall || !r.IsCall() || len(r.Params) == 0 {
		return sdkCall{}, false
	}
	var p *mcp.CallToolParamsRaw
	if err := sdkUnmarshal(r.Params, &p); err != nil || p == nil {
		return sdkCall{}, false
	}
	return sdkCall{Name: p.Name, Arguments: p.Arguments, Meta: p.Meta}, true
}

// envelope is a JSON-RPC request as a backend decoding it into a struct
// with encoding/json reads it: member names match case-insensitively, the
// last duplicate wins.
type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Meta      map[string]any  `json:"_meta"`
	} `json:"params"`
}

// vocabulary is a fixed argument struct, decoded with the SDK's decoder
// (exact names) to see that it finds members under the names the fence
// read them (escapes included).
type vocabulary struct {
	Visibility  json.RawMessage `json:"visibility"`
	Name        json.RawMessage `json:"name"`
	Private     json.RawMessage `json:"private"`
	Repo        json.RawMessage `json:"repo"`
	Owner       json.RawMessage `json:"owner"`
	Description json.RawMessage `json:"description"`
	A           json.RawMessage `json:"a"`
	B           json.RawMessage `json:"b"`
	K           json.RawMessage `json:"k"`
	S           json.RawMessage `json:"s"`
	X           json.RawMessage `json:"x"`
	Arguments   json.RawMessage `json:"arguments"`
	Meta        json.RawMessage `json:"_meta"`
}

var vocabularyType = reflect.TypeFor[vocabulary]()

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// fieldTypes caches the one-field struct types of argument names: reflect
// and encoding/json keep every type they see, so the cache is bounded and
// names beyond it are not decoded into structs (the other checks still
// run).
var fieldTypes = struct {
	sync.Mutex
	m map[string]reflect.Type
}{m: map[string]reflect.Type{}}

const maxFieldTypes = 1 << 18

// fieldType returns struct{ F json.RawMessage `json:"<name>"` }, or nil
// when name cannot be a json tag (encoding/json would then match the field
// by its Go name) or the cache is full.
func fieldType(name string) reflect.Type {
	if !validTag(name) {
		return nil
	}
	fieldTypes.Lock()
	defer fieldTypes.Unlock()
	if t, ok := fieldTypes.m[name]; ok {
		return t
	}
	if len(fieldTypes.m) >= maxFieldTypes {
		return nil
	}
	t := reflect.StructOf([]reflect.StructField{{
		Name: "F",
		Type: rawMessageType,
		Tag:  reflect.StructTag(`json:` + strconv.Quote(name)),
	}})
	fieldTypes.m[name] = t
	return t
}

// validTag is encoding/json's isValidTag, less "-" (which drops the
// field).
func validTag(s string) bool {
	if s == "" || s == "-" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}

// problems collects the ways backends read a body otherwise than the
// fence.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// sameArguments reports whether a backend's arguments are the fence's by
// the token's digest. Arguments the digest refuses are never run on a
// token, so they count as the same.
func sameArguments(fence, backend json.RawMessage) (bool, string) {
	want, err := fencecheck.ArgumentDigest(digestTool, fence)
	if err != nil {
		return true, ""
	}
	got, err := fencecheck.ArgumentDigest(digestTool, backend)
	if err != nil {
		return false, fmt.Sprintf("the digest refuses the backend's arguments %s: %v", backend, err)
	}
	if got != want {
		return false, fmt.Sprintf("arguments %s digest %s, the fence's %s digest %s", backend, got, fence, want)
	}
	return true, ""
}

// compare returns how the backends read body otherwise than the fence,
// which read it as fence (and accepted it). srv may be nil to skip the
// SDK's server (its replica still runs).
func compare(body []byte, fence fencecheck.Message, srv *sdkServer) problems {
	var p problems
	calls := compareSDK(&p, body, fence)
	if srv != nil {
		compareServer(&p, body, calls, srv)
	}
	compareEncodingJSON(&p, body, fence)
	if fence.Call {
		budget := 64
		compareArgumentNames(&p, fence.Arguments, "params.arguments", 0, &budget)
	}
	return p
}

// compareSDK compares the SDK's reading (its replica) with the fence's and
// returns the tool calls the SDK would dispatch.
func compareSDK(p *problems, body []byte, fence fencecheck.Message) []sdkCall {
	msgs, batch, err := sdkRead(body)
	if err != nil {
		return nil // the SDK answers 400 and runs nothing
	}
	if batch != fence.Batch {
		p.add("the SDK reads batch=%v, the fence batch=%v", batch, fence.Batch)
	}
	var calls []sdkCall
	for _, msg := range msgs {
		r, isRequest := msg.(*jsonrpc.Request)
		if !batch {
			var method string
			if isRequest {
				method = r.Method
			}
			if method != fence.Method {
				p.add("the SDK reads method %q, the fence %q", method, fence.Method)
			}
		}
		if !isRequest {
			continue
		}
		c, ok := sdkToolCall(r)
		if !ok {
			continue
		}
		calls = append(calls, c)
		switch {
		case !fence.Call:
			p.add("the SDK runs %v; the fence read no call (method %q, batch %v)", c, fence.Method, fence.Batch)
		default:
			compareCall(p, "the SDK", fence, c.Name, c.Arguments, c.Meta)
		}
	}
	return calls
}

// compareCall compares a backend's reading of a tools/call with the
// fence's.
func compareCall(p *problems, who string, fence fencecheck.Message, name string, args json.RawMessage, meta map[string]any) {
	if name != fence.Name {
		p.add("%s runs tool %q, the fence read %q", who, name, fence.Name)
	}
	if ok, why := sameArguments(fence.Arguments, args); !ok {
		p.add("%s reads other arguments: %s", who, why)
	}
	formation, _ := meta[fencecheck.MetaFormation].(string)
	if formation != fence.Formation {
		p.add("%s reads formation %q, the fence %q", who, formation, fence.Formation)
	}
}

// compareServer checks that the SDK's own server dispatched nothing its
// replica did not read: the replica is then what the server does. (Which
// calls of an odd batch the server gets to before it closes its stateless
// session depends on timing; that it runs no call its replica missed does
// not.)
func compareServer(p *problems, body []byte, calls []sdkCall, srv *sdkServer) {
	got := srv.serve(body)
	for _, c := range got.dispatched {
		if !slices.ContainsFunc(calls, c.same) {
			p.add("the SDK server dispatched %v, which the replica of its reading did not (HTTP %d %s)", c, got.status, got.answer)
		}
	}
	for _, c := range got.ran {
		if !slices.ContainsFunc(got.dispatched, c.same) {
			p.add("an SDK tool ran %v, which its server did not dispatch", c)
		}
	}
}

// compareEncodingJSON compares encoding/json's struct reading of the
// envelope with the fence's.
func compareEncodingJSON(p *problems, body []byte, fence fencecheck.Message) {
	if fence.Batch {
		var elems []json.RawMessage
		if json.Unmarshal(body, &elems) != nil {
			return
		}
		for i, el := range elems {
			var env envelope
			if json.Unmarshal(el, &env) == nil && env.Method == fencecheck.MethodCall {
				p.add("encoding/json reads a tools/call in batch element %d; the fence read none", i)
			}
		}
		return
	}
	var env envelope
	if json.Unmarshal(body, &env) != nil {
		return // the backend refuses the body
	}
	if env.Method != fence.Method {
		p.add("encoding/json reads method %q, the fence %q", env.Method, fence.Method)
	}
	if fence.Call {
		compareCall(p, "encoding/json", fence, env.Params.Name, env.Params.Arguments, env.Params.Meta)
	}
}

// compareArgumentNames decodes the object raw (the arguments or an object
// within them) into a struct for each member name the fence read, with
// encoding/json, and into a fixed struct with the SDK's decoder: every
// field must get exactly the member of its name — not another member that
// folds alike, not nothing.
func compareArgumentNames(p *problems, raw json.RawMessage, path string, depth int, budget *int) {
	raw = bytes.TrimSpace(raw)
	if depth > 16 || len(raw) == 0 {
		return
	}
	switch raw[0] {
	case '[':
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return
		}
		for i, el := range elems {
			compareArgumentNames(p, el, fmt.Sprintf("%s[%d]", path, i), depth+1, budget)
		}
		return
	case '{':
	default:
		return
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(raw, &members) != nil {
		return
	}
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if *budget <= 0 {
			return
		}
		*budget--
		t := fieldType(name)
		if t == nil {
			continue
		}
		v := reflect.New(t)
		if json.Unmarshal(raw, v.Interface()) != nil {
			continue
		}
		if got := v.Elem().Field(0).Bytes(); !bytes.Equal(got, members[name]) {
			p.add("encoding/json decodes %s into a field %q as %s, the fence read %s", path, name, got, members[name])
		}
	}
	v := reflect.New(vocabularyType)
	if sdkUnmarshal(raw, v.Interface()) == nil {
		for i := range vocabularyType.NumField() {
			tag := vocabularyType.Field(i).Tag.Get("json")
			if got := v.Elem().Field(i).Bytes(); !bytes.Equal(got, members[tag]) {
				p.add("the SDK's decoder decodes %s into a field %q as %s, the fence read %s", path, tag, got, members[tag])
			}
		}
	}
	for _, name := range names {
		compareArgumentNames(p, members[name], path+"."+name, depth+1, budget)
	}
}
