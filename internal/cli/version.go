package cli

import (
	"runtime/debug"
	"strings"
)

// Version describes the running binary for --version: the module version
// (a release tag when installed with go install …@vX, "(devel)" when built
// from a checkout), the VCS revision it was built from (with "+dirty" for
// uncommitted changes) when the build recorded one, and the Go version.
func Version(name string) string {
	parts := []string{name}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return name + " (unknown build)"
	}
	parts = append(parts, bi.Main.Version)
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		parts = append(parts, "rev "+rev+dirty)
	}
	return strings.Join(append(parts, bi.GoVersion), " ")
}
