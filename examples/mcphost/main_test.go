package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestFlags: a bad command line is refused before anything is contacted,
// with a message naming what is missing.
func TestFlags(t *testing.T) {
	t.Setenv("FCD_HOST", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--gateway"},
		{[]string{"--gateway", "http://127.0.0.1:1/mcp"}, "--server and --tool"},
		{[]string{"--gateway", "http://127.0.0.1:1/mcp", "--server", "s", "--tool", "t", "--args", "{"}, "--args is not JSON"},
		{[]string{"--gateway", "http://127.0.0.1:1/mcp", "--server", "s", "--tool", "t"}, "$FCD_HOST"},
		{[]string{"--gateway", "http://127.0.0.1:1/mcp", "--server", "s", "--tool", "t", "--credential-file", "/nonexistent/cred"}, "/nonexistent/cred"},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), c.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("mcphost %v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
