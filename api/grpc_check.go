package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// checkMethod is the full gRPC method name of the Check service, the
// instance of its problems.
const checkMethod = "/envoy.service.auth.v3.Authorization/Check"

// grpcHeaderAllowance is what a CheckRequest may carry beside the body:
// the original request's headers and attributes.
const grpcHeaderAllowance = 256 << 10

// NewCheckServer returns a gRPC server that answers Envoy's (and Istio's)
// external authorization, envoy.service.auth.v3.Authorization/Check, with
// the same decision as /v1/forward_auth and /v1/ext_authz/*. It needs
// cfg.UseCases and cfg.Auth; cfg.BodyLimit bounds the forwarded body
// (larger CheckRequests are refused by gRPC itself) and cfg.Logger logs.
// The caller serves it on its own listener and stops it (GracefulStop).
//
// Envoy authenticates with a gateway credential in the "authorization"
// metadata ("Bearer <credential>", grpc_service.initial_metadata). Every
// answer is a CheckResponse, never a gRPC error, so that Envoy's
// failure_mode_allow cannot turn a refusal into a pass: OK with the
// headers to set upstream (Fcd-Dispatch-Token and Fcd-Target for an
// admitted call; for session traffic, none, and any the client sent are
// removed); UNAUTHENTICATED (HTTP 401) without a valid credential;
// PERMISSION_DENIED otherwise, with a denied HTTP response whose status is
// the problem's (as on /v1/ext_authz/*), with problem+json body and the
// Fcd-Problem header.
func NewCheckServer(cfg Config, opts ...grpc.ServerOption) (*grpc.Server, error) {
	if cfg.UseCases == nil || cfg.Auth == nil {
		return nil, errors.New("api: UseCases and Auth are required")
	}
	s := &server{uc: cfg.UseCases, auth: cfg.Auth, limit: cfg.BodyLimit, log: cfg.Logger}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerScope)
	}
	if s.limit <= 0 {
		s.limit = DefaultBodyLimit
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	opts = append([]grpc.ServerOption{grpc.MaxRecvMsgSize(int(s.limit) + grpcHeaderAllowance)}, opts...)
	gs := grpc.NewServer(opts...)
	authv3.RegisterAuthorizationServer(gs, &checkService{s: s})
	return gs, nil
}

// checkService adapts Check to the gateway decision.
type checkService struct {
	authv3.UnimplementedAuthorizationServer
	s *server
}

// Check implements envoy.service.auth.v3.Authorization.
func (c *checkService) Check(ctx context.Context, req *authv3.CheckRequest) (_ *authv3.CheckResponse, err error) {
	start := time.Now()
	h := req.GetAttributes().GetRequest().GetHttp()
	if c.s.tracer != nil {
		var span trace.Span
		ctx, span = c.s.tracer.Start(checkTraceContext(ctx, h), checkMethod[1:], trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", checkMethod[1:])))
		defer func() {
			if err != nil {
				span.SetStatus(otelcodes.Error, err.Error())
			}
			span.End()
		}()
	}
	var authorization string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authorization = v[0]
		}
	}
	cred, err := c.s.authenticate(authorization, RoleGateway)
	if err != nil {
		return c.deny(ctx, err, "")
	}
	if h == nil {
		// Envoy's network (L4) ext_authz filter: there is no request to
		// tell a call from session traffic by. Fail closed.
		return c.deny(ctx, fmt.Errorf("%w: the CheckRequest has no HTTP request attributes", authz.ErrBadRequest), "")
	}
	body := h.GetRawBody()
	if len(body) == 0 {
		body = []byte(h.GetBody())
	}
	if int64(len(body)) > c.s.limit {
		return c.deny(ctx, &http.MaxBytesError{Limit: c.s.limit}, "")
	}
	in, err := gatewayInput(checkHeaders(h), cred, body)
	if err != nil {
		return c.deny(ctx, err, "")
	}
	d, err := c.s.gate(ctx, gatewayCall{transport: "ext_authz_grpc", method: h.GetMethod(), uri: h.GetPath(), in: in})
	if err != nil {
		return c.deny(ctx, err, d.Formation)
	}
	ok := &authv3.OkHttpResponse{}
	if d.Grant != nil {
		ok.Headers = []*corev3.HeaderValueOption{
			setHeader(headerToken, d.Grant.Token),
			setHeader(headerTarget, d.Grant.Target.Pool),
		}
	} else {
		// Session traffic goes on without a token, and without any the
		// client sent itself.
		ok.HeadersToRemove = []string{strings.ToLower(headerToken), strings.ToLower(headerTarget)}
	}
	c.s.log.DebugContext(ctx, "check", "status", "OK", "duration", time.Since(start))
	return &authv3.CheckResponse{
		Status:       &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok},
	}, nil
}

// deny answers a refusal: UNAUTHENTICATED for a credential problem,
// PERMISSION_DENIED for anything else, with the HTTP answer Envoy sends the
// client.
func (c *checkService) deny(ctx context.Context, err error, formation string) (*authv3.CheckResponse, error) {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		// Envoy gave up on the check; nobody reads an answer.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	var extra map[string]any
	if formation != "" {
		extra = map[string]any{"formation": formation}
	}
	code, header, body := c.s.renderProblem(ctx, err, "gRPC", checkMethod, extra, false)
	if formation != "" {
		header.Set(headerFormation, formation)
	}
	names := make([]string, 0, len(header))
	for k := range header {
		names = append(names, k)
	}
	slices.Sort(names)
	headers := make([]*corev3.HeaderValueOption, 0, len(names))
	for _, k := range names {
		headers = append(headers, setHeader(k, header.Get(k)))
	}
	grpcCode := codes.PermissionDenied
	if code == http.StatusUnauthorized && errors.Is(err, errUnauthenticated) {
		grpcCode = codes.Unauthenticated
	}
	slug := problemSlug(err)
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(grpcCode), Message: slug},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: headers,
			Body:    string(body),
		}},
	}, nil
}

// checkTraceContext is ctx with the trace a Check continues: the one of
// the gRPC metadata's traceparent when Envoy traces itself, else the one
// of the checked request's traceparent (the client's), else none.
func checkTraceContext(ctx context.Context, h *authv3.AttributeContext_HttpRequest) context.Context {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if tctx := telemetry.Propagator.Extract(ctx, metadataCarrier(md)); trace.SpanContextFromContext(tctx).IsValid() {
			return tctx
		}
	}
	if h == nil {
		return ctx
	}
	get := checkHeaders(h)
	carrier := propagation.MapCarrier{}
	for _, name := range telemetry.Propagator.Fields() {
		if vs := get(name); len(vs) == 1 {
			carrier[name] = vs[0]
		}
	}
	return telemetry.Propagator.Extract(ctx, carrier)
}

// metadataCarrier reads gRPC metadata as a propagation carrier.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if vs := metadata.MD(m).Get(key); len(vs) > 0 {
		return vs[0]
	}
	return ""
}
func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }
func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// setHeader is a header Envoy sets, replacing any of the same name.
func setHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: strings.ToLower(name), Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// checkHeaders returns the original request's headers of a CheckRequest by
// name: from header_map when Envoy sends raw headers (encode_raw_headers;
// repeated headers stay apart), else from the headers map (lower-cased
// keys, repeated headers joined by commas).
func checkHeaders(h *authv3.AttributeContext_HttpRequest) func(string) []string {
	if hm := h.GetHeaderMap().GetHeaders(); len(hm) > 0 {
		return func(name string) []string {
			var out []string
			for _, hv := range hm {
				if strings.EqualFold(hv.GetKey(), name) {
					v := hv.GetValue()
					if raw := hv.GetRawValue(); len(raw) > 0 {
						v = string(raw)
					}
					out = append(out, v)
				}
			}
			return out
		}
	}
	m := h.GetHeaders()
	return func(name string) []string {
		if v, ok := m[strings.ToLower(name)]; ok {
			return []string{v}
		}
		return nil
	}
}
