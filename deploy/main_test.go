package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The version and revision the tests' build injects.
const (
	testVersion  = "0.0.0-test"
	testRevision = "0123456789ab"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binaries builds authzd and fencecheck once, with the Dockerfile's own
// RUN command (its /out/ moved to a temporary directory, its build
// arguments in the environment), and returns the directory holding them.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
		if err != nil {
			buildErr = err
			return
		}
		stages, _, err := dockerfileStages(data)
		if err != nil {
			buildErr = err
			return
		}
		var run string
		for _, s := range stages {
			for _, in := range s.body {
				if in.name == "run" && strings.Contains(strings.Join(in.args, " "), "go build") {
					run = strings.Join(in.args, " ")
				}
			}
		}
		if buildDir, buildErr = os.MkdirTemp("", "fcd-image-"); buildErr != nil {
			return
		}
		cmd := exec.Command("sh", "-c", strings.ReplaceAll(run, "/out/", buildDir+"/out/"))
		cmd.Dir = root
		// The repository's workspace (this module's tests run with
		// GOWORK=off), the build arguments as the Dockerfile's ARGs.
		cmd.Env = append(os.Environ(), "GOWORK=", "VERSION="+testVersion, "REVISION="+testRevision)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = &buildError{run, out, err}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "out", "bin")
}

type buildError struct {
	cmd string
	out []byte
	err error
}

func (e *buildError) Error() string {
	return "the Dockerfile's build command: " + e.err.Error() + "\n" + e.cmd + "\n" + string(e.out)
}
