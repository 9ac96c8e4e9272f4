package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/fcd-authz/fcd/client"
)

// A host snapshots the catalog its model is shown and records a call the
// model formed; a refusal is a *client.Problem, told apart by its slug.
// (Not run: it needs an authzd at the address.)
func Example() {
	ctx := context.Background()
	host, err := client.New("http://127.0.0.1:8080", "HOST-CREDENTIAL")
	if err != nil {
		log.Fatal(err)
	}
	snap, err := host.CreateSnapshotWithResponse(ctx, client.SnapshotRequest{})
	if err != nil {
		log.Fatal(err)
	}
	args := map[string]any{"name": "demo"}
	formed, err := host.CreateFormationWithResponse(ctx, client.FormationRequest{
		Snapshot: snap.JSON201.Id, Session: "mcp-session-1", Tool: "github/create_repository", Arguments: &args,
	})
	if p, ok := errors.AsType[*client.Problem](err); ok {
		if p.Slug() == "rate-limited" {
			time.Sleep(p.RetryAfter)
		}
		log.Fatalf("%s (%s)", p.Detail, p.Slug())
	} else if err != nil {
		log.Fatal(err)
	}
	if formed.JSON403 != nil {
		log.Fatalf("denied by policy: %+v", formed.JSON403.Decision)
	}
	fmt.Println(formed.JSON201.Id, formed.JSON201.Status) // fm_… pending_approval
}
