package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/fcd-authz/fcd/host"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A host calls a tool of the github MCP server behind a gateway: the
// transport snapshots the github catalog, forms the call for alice, waits
// while approvers decide, and sends it with its formation. The gateway's
// URL and both credentials are the deployment's, so the example is not run;
// TestTransportThroughTheGateway runs the same flow against real authzd,
// nginx and fencecheck.
func Example() {
	ctx := context.Background()
	tr, err := host.New(ctx, host.Config{
		AuthzdURL:       os.Getenv("FCD_URL"),
		Credential:      host.Credential(os.Getenv("FCD_HOST")),
		Servers:         []string{"github"}, // snapshot the catalog the model is shown
		Server:          "github",           // the server behind this endpoint
		Principal:       host.Principal{ID: "alice"},
		WaitForApproval: true,
		OnPending: func(_ context.Context, p *host.PendingError) {
			log.Printf("waiting for approval of %s at %s", p.Formation.ID, p.ApprovalURL)
		},
		// Base: how the host reaches the gateway (its TLS, its credentials).
	})
	if err != nil {
		log.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "my-host", Version: "1.0"}, nil)
	cs, err := client.Connect(ctx, tr.MCPTransport("https://gateway.example/mcp"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{
		Name: "create_repository", Arguments: json.RawMessage(`{"name":"payroll-exports","private":true}`),
	})
	var denied *host.DeniedError
	var refused *host.RefusedError
	switch {
	case errors.As(err, &denied):
		log.Fatalf("not allowed: %v", denied.Reasons)
	case errors.As(err, &refused) && refused.RetryAfter > 0:
		log.Fatalf("refused for now (%s); form it again after %s", refused.Problem, refused.RetryAfter)
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println(res.IsError)
}
