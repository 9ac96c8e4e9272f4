package cli

import (
	"runtime/debug"
	"strings"
)

// version and revision are the release version of fcd's commands and the
// commit it was built from, set at link time by a build that has no VCS
// information to record (the Dockerfile, whose context holds no .git):
//
//	go build -buildvcs=false -ldflags "-X github.com/fcd-authz/fcd/internal/cli.version=0.1.0 \
//	  -X github.com/fcd-authz/fcd/internal/cli.revision=$(git rev-parse HEAD)" ./cmd/authzd
//
// Empty, the version is the main module's from the build info — a release
// tag when installed with go install …@vX, or the version go build stamps
// from the checkout's tags (a pseudo-version between tags) — else
// DevVersion; the revision is the build info's vcs.revision.
var version, revision string

// DevVersion is the version of a build that names none and records no
// VCS information: the next release's, with "-dev". Raise it when a
// release is tagged (CHANGELOG.md).
const DevVersion = "0.1.0-dev"

// SemVer is the running binary's semantic version, without a leading "v":
// the link-time version, else the module's, else DevVersion.
func SemVer() string {
	if version != "" {
		return strings.TrimPrefix(version, "v")
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return strings.TrimPrefix(bi.Main.Version, "v")
	}
	return DevVersion
}

// Version describes the running binary for --version: its name, its
// semantic version (SemVer), the VCS revision it was built from (with
// "+dirty" for uncommitted changes) when the build recorded one, and the
// Go version, e.g. "authzd 0.1.0 rev 5d140e3a1b2c go1.26.8".
func Version(name string) string {
	parts := []string{name, SemVer()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return strings.Join(append(parts, "(unknown build)"), " ")
	}
	rev, dirty := revision, ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if rev == "" {
				rev = s.Value
			}
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
