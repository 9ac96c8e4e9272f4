package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		usage bool
		help  bool
	}{
		{args: nil},
		{args: []string{"-n", "3"}},
		{args: []string{"-n", "x"}, usage: true},
		{args: []string{"-unknown"}, usage: true},
		{args: []string{"-n", "3", "stray"}, usage: true},
		{args: []string{"-h"}, help: true},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("n", 0, "")
		err := Parse(fs, tc.args)
		if got := errors.Is(err, ErrUsage); got != tc.usage {
			t.Errorf("%q: usage error %v, want %v (%v)", tc.args, got, tc.usage, err)
		}
		if got := errors.Is(err, flag.ErrHelp); got != tc.help {
			t.Errorf("%q: help %v, want %v", tc.args, got, tc.help)
		}
		if !tc.usage && !tc.help && err != nil {
			t.Errorf("%q: %v", tc.args, err)
		}
	}
}

func TestExitStatus(t *testing.T) {
	verdict := errors.New("verdict printed")
	for _, tc := range []struct {
		err        error
		status     int
		out, notIn string
	}{
		{err: nil, status: 0},
		{err: flag.ErrHelp, status: 0},
		{err: fmt.Errorf("%w: no command", ErrUsage), status: 2, out: "cmd: usage: no command\nUSAGE"},
		{err: fmt.Errorf("wrapped: %w", verdict), status: 1, notIn: "verdict"},
		{err: errors.New("boom"), status: 1, out: "cmd: boom\n"},
	} {
		var b bytes.Buffer
		if got := ExitStatus(&b, "cmd", "USAGE", tc.err, verdict); got != tc.status {
			t.Errorf("%v: status %d, want %d", tc.err, got, tc.status)
		}
		if tc.out != "" && !strings.Contains(b.String(), tc.out) {
			t.Errorf("%v: printed %q, want %q", tc.err, b.String(), tc.out)
		}
		if tc.notIn != "" && strings.Contains(b.String(), tc.notIn) {
			t.Errorf("%v: printed %q", tc.err, b.String())
		}
		if tc.status == 0 && b.Len() > 0 {
			t.Errorf("%v: printed %q", tc.err, b.String())
		}
	}
}

// TestVersion: the version line names the binary and the Go version it was
// built with (the module version and revision depend on how it was built).
func TestVersion(t *testing.T) {
	v := Version("authzd")
	if !strings.HasPrefix(v, "authzd ") || !strings.Contains(v, "go1.") {
		t.Fatalf("Version = %q", v)
	}
}

// TestSemVer: the version is semantic whichever way it was set — by the
// linker (a leading v dropped), by the build info, or the default — and
// --version's line carries it with the link-time revision.
func TestSemVer(t *testing.T) {
	semver := regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	if !semver.MatchString(DevVersion) {
		t.Errorf("DevVersion %q is no semantic version", DevVersion)
	}
	if v := SemVer(); !semver.MatchString(v) {
		t.Errorf("SemVer() = %q, no semantic version", v)
	}
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "v1.2.3", "0123456789abcdef"
	if v := SemVer(); v != "1.2.3" {
		t.Errorf("SemVer() with -X version=v1.2.3 = %q", v)
	}
	if v := Version("fencecheck"); !strings.HasPrefix(v, "fencecheck 1.2.3 rev 0123456789ab") {
		t.Errorf("Version = %q", v)
	}
}
