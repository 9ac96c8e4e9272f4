// Package gateways holds fcd's example gateway configurations: Go
// text/templates that `authzd gateway config` renders (the renderer is
// internal/gatewayconf; README.md describes the templating scheme). They
// are embedded here, beside the files users read, so that the command and
// the end-to-end tests (through internal/gatewaytest) use the very files
// the examples show.
package gateways

import "embed"

// Files are the example templates, by file name.
//
//go:embed nginx.conf Caddyfile envoy.yaml traefik.yml traefik-dynamic.yml
var Files embed.FS
