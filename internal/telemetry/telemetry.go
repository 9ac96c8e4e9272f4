// Package telemetry sets up what authzd and the fencecheck sidecar share
// of OpenTelemetry: the tracer provider that exports spans over OTLP when
// an endpoint is configured (a no-op one otherwise), the W3C trace-context
// propagator, and the slog handler that adds a record's trace and span ids.
// Only the main module's commands and server import it: the nested
// modules stay free of OpenTelemetry (fencecheck has a hook of its own,
// fencecheck.Tracer, which [FenceTracer] implements).
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/fcd-authz/fcd/internal/cli"
	"net/url"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Protocols of the OTLP exporter.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Propagator is the one propagator of fcd's processes: W3C traceparent
// and tracestate (https://www.w3.org/TR/trace-context/).
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Config says where spans go. The zero Config exports nothing unless the
// standard environment variables name an endpoint.
type Config struct {
	// Endpoint is the OTLP collector's base URL, e.g.
	// http://collector:4318 (OTLP/HTTP; /v1/traces is appended to a URL
	// without a path) or http://collector:4317 with Protocol grpc. Empty
	// means OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
	// OTEL_EXPORTER_OTLP_ENDPOINT, else no export: a no-op tracer.
	Endpoint string
	// Protocol is http/protobuf or grpc; empty means
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
	// else http/protobuf.
	Protocol string
	// Service is the resource's service.name unless OTEL_SERVICE_NAME
	// sets it; Version its service.version; Instance its
	// service.instance.id (authzd's replica).
	Service, Version, Instance string
}

// Enabled reports whether c exports spans: an endpoint is configured, by
// c or by the environment.
func (c Config) Enabled() bool { return c.endpoint() != "" }

func (c Config) endpoint() string {
	return cmp.Or(c.Endpoint, os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

func (c Config) protocol() string {
	return cmp.Or(c.Protocol, os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), ProtocolHTTP)
}

// Validate reports an endpoint or protocol the exporter cannot use.
func (c Config) Validate() error {
	switch p := c.protocol(); p {
	case ProtocolHTTP, ProtocolGRPC:
	default:
		return fmt.Errorf("telemetry: OTLP protocol %q: want %s or %s", p, ProtocolHTTP, ProtocolGRPC)
	}
	if c.Endpoint == "" {
		return nil // the environment's: the exporter reads it itself
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("telemetry: OTLP endpoint %q is not an http(s) URL", c.Endpoint)
	}
	return nil
}

// Provider is a tracer provider and what ends it.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil when nothing is exported
}

// Shutdown exports the spans still buffered and stops the exporter; a
// no-op provider has nothing to do.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// New returns the tracer provider c configures: one exporting every span
// whose parent is sampled (or that has no parent) in batches over OTLP,
// or, when no endpoint is configured, a no-op provider that costs a
// context value per span. Creating the exporter does not connect.
func New(ctx context.Context, c Config) (*Provider, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	switch c.protocol() {
	case ProtocolGRPC:
		var opts []otlptracegrpc.Option
		if c.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.Endpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		var opts []otlptracehttp.Option
		if c.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(tracesURL(c.Endpoint)))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(c.Service))}
	if c.Version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(c.Version)))
	}
	if c.Instance != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceInstanceID(c.Instance)))
	}
	// The environment's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
	res, err := resource.New(ctx, append(attrs, resource.WithFromEnv(), resource.WithTelemetrySDK())...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
	)
	return &Provider{TracerProvider: sdk, sdk: sdk}, nil
}

// tracesURL is the OTLP/HTTP traces URL of a collector's base URL, as
// OTEL_EXPORTER_OTLP_ENDPOINT is read: /v1/traces is appended to a URL
// without a path; a URL with one is used as given.
func tracesURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || strings.Trim(u.Path, "/") != "" {
		return endpoint
	}
	u.Path = "/v1/traces"
	return u.String()
}

// BuildInfo is what the running binary's build recorded of itself.
type BuildInfo struct {
	// Version is the main module's version: a release tag when installed
	// with go install …@vX, "(devel)" when built from a checkout.
	Version string
	// Revision is the VCS revision it was built from, with "+dirty" for
	// uncommitted changes; empty when the build recorded none.
	Revision string
	// GoVersion is the Go toolchain that built it.
	GoVersion string
}

// Build returns what the running binary's build recorded.
func Build() BuildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return BuildInfo{Version: cli.SemVer(), GoVersion: runtime.Version()}
	}
	// The version --version prints (link-time, else the module's, else
	// the next release's -dev), so that fcd_build_info and the traces'
	// service.version agree with it.
	b := BuildInfo{Version: cli.SemVer(), GoVersion: bi.GoVersion}
	var dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if b.Revision != "" {
		b.Revision += dirty
	}
	return b
}
