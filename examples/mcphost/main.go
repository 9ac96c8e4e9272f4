// Command mcphost is the smallest MCP host that calls a tool through a
// gateway guarded by fcd: the official MCP Go SDK client, with the host
// library (package host) as its HTTP transport, so each tools/call is formed
// with authzd, waits for its approvals, and is sent with its formation.
// docs/protect.md runs it as the last step of protecting an MCP server.
//
//	mcphost --gateway URL --server NAME --tool TOOL [--args JSON] [--user USER]
//
// authzd is $FCD_URL (or --authzd), the host's credential $FCD_HOST (or
// --credential-file), the gateway user's password $GATEWAY_PASSWORD (or
// --password-file). It prints the tool's text answer; while the call waits
// for approval it says so on standard error, naming the formation.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fcd-authz/fcd/host"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mcphost:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcphost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gateway := fs.String("gateway", "", "the MCP endpoint of the server, through the gateway (http://HOST:PORT/mcp)")
	authzd := fs.String("authzd", os.Getenv("FCD_URL"), "authzd's base URL (default $FCD_URL)")
	credFile := fs.String("credential-file", "", "file holding the host's bearer credential (default $FCD_HOST)")
	server := fs.String("server", "", "the registered server behind --gateway")
	tool := fs.String("tool", "", "the tool to call")
	argsJSON := fs.String("args", "{}", "the call's arguments, a JSON object")
	user := fs.String("user", "", "the user the gateway authenticates (HTTP basic); calls are formed for them")
	passFile := fs.String("password-file", "", "file holding --user's password (default $GATEWAY_PASSWORD)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for approval and the answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *gateway == "":
		return errors.New("--gateway URL is required")
	case *server == "" || *tool == "":
		return errors.New("--server and --tool are required")
	case !json.Valid([]byte(*argsJSON)):
		return fmt.Errorf("--args is not JSON: %s", *argsJSON)
	}
	credential, err := secret(*credFile, "FCD_HOST")
	if err != nil {
		return fmt.Errorf("the host's credential: %w", err)
	}
	var base http.RoundTripper = http.DefaultTransport
	if *user != "" {
		password, err := secret(*passFile, "GATEWAY_PASSWORD")
		if err != nil {
			return fmt.Errorf("the password of %s: %w", *user, err)
		}
		base = basicAuth{next: base, user: *user, password: password}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	tr, err := host.New(ctx, host.Config{
		AuthzdURL:       *authzd,
		Credential:      host.Credential(credential),
		Servers:         []string{*server},
		Server:          *server,
		Principal:       host.Principal{ID: *user},
		WaitForApproval: true,
		OnPending: func(_ context.Context, p *host.PendingError) {
			fmt.Fprintf(stderr, "mcphost: waiting for approval of formation %s (%d required; approvers decide at %s)\n",
				p.Formation.ID, p.Formation.ApprovalsRequired, p.ApprovalURL)
		},
		Base:   base,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "fcd-mcphost", Version: "1"}, nil)
	cs, err := client.Connect(ctx, tr.MCPTransport(*gateway), nil)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *gateway, err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: *tool, Arguments: json.RawMessage(*argsJSON)})
	if err != nil {
		return fmt.Errorf("call %s: %w", *tool, err)
	}
	var text []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			text = append(text, t.Text)
		}
	}
	fmt.Fprintln(stdout, strings.Join(text, "\n"))
	if res.IsError {
		return fmt.Errorf("%s answered an error", *tool)
	}
	return nil
}

// secret reads a secret from file, else from the environment variable.
func secret(file, env string) (string, error) {
	v := os.Getenv(env)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		v = string(b)
	}
	if v = strings.TrimSpace(v); v == "" {
		return "", fmt.Errorf("none given (a file, or $%s)", env)
	}
	return v, nil
}

// basicAuth authenticates each request to the gateway as one user.
type basicAuth struct {
	next           http.RoundTripper
	user, password string
}

func (b basicAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.SetBasicAuth(b.user, b.password)
	return b.next.RoundTrip(req)
}
