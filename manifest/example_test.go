package manifest_test

import (
	"encoding/json"
	"fmt"

	"github.com/fcd-authz/fcd/manifest"
)

func ExampleLint() {
	m := &manifest.Manifest{
		Server:     manifest.Server{Name: "github", Release: "v1.4.0"},
		Pool:       "github-v1-4",
		Artifact:   manifest.Artifact{Image: "ghcr.io/github/github-mcp-server:v1.4.0"},
		Deployment: manifest.Deployment{Name: "github-mcp-v1-4"},
		Config: manifest.Config{
			Digest: "sha256:a4d99889e06509b8f538753e82667b35bf391669d9fc139a6f940f833dff8bf6",
			Values: map[string]any{"github.token": "ghp_not-in-a-manifest"},
		},
		Tools: []manifest.Tool{{
			Name:        "create_repository",
			Description: "Create repository.",
			Summary:     "Create a new repository.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"private":{"type":"boolean","description":"Whether the repository is private."}}}`),
			SideEffects: manifest.SideEffectWrite,
		}},
	}
	findings := manifest.Lint(m)
	for _, f := range findings {
		fmt.Printf("%-7s %-26s %s\n", f.Severity, f.Rule, f.Path)
	}
	fmt.Println("registrable:", !manifest.HasErrors(findings))
	// Output:
	// warning artifact-not-pinned        /artifact/digest
	// error   secret-in-config           /config/values/github.token
	// warning description-restates-name  /tools/0/description
	// warning parameter-undocumented     /tools/0/inputSchema/properties/name/description
	// error   approval-required          /tools/0/requiresApproval
	// registrable: false
}
