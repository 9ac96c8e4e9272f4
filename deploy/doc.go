// Package deploy holds the tests of fcd's deployment artefacts: the
// image's Dockerfile (at the repository's root), the Helm chart in
// helm/fcd and the systemd unit in systemd (docs/deploy.md).
//
// It is a module of its own, outside go.work, so that Helm's and
// BuildKit's dependencies stay out of the server's module graph. Run its
// tests from this directory without the workspace:
//
//	cd deploy && GOWORK=off go test ./...
//
// They build authzd and fencecheck from the repository with the
// Dockerfile's own build command and run the command lines the chart
// renders through the binaries' --check.
package deploy
