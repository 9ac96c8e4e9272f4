package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// baseManifest returns a fresh manifest that lints with no findings.
func baseManifest() *Manifest {
	ownerRepo := `{
		"type": "object",
		"properties": {
			"owner": {"type": "string", "description": "Account that owns the repository."},
			"repo": {"type": "string", "description": "Name of the repository, without the owner."}
		},
		"required": ["owner", "repo"],
		"additionalProperties": false
	}`
	return &Manifest{
		Server:     Server{Name: "github", Release: "v1.4.0"},
		Pool:       "github-v1-4",
		Artifact:   Artifact{Image: "ghcr.io/github/github-mcp-server:v1.4.0", Digest: "sha256:" + strings.Repeat("ab", 32)},
		Deployment: Deployment{Platform: "kubernetes", Namespace: "mcp", Name: "github-mcp-v1-4", Revision: "14"},
		Config: Config{
			Digest: "sha256:" + strings.Repeat("cd", 32),
			Values: map[string]any{"repository.defaultVisibility": "private"},
		},
		FeatureFlags: &FeatureFlags{Snapshot: "flags-2025-06-01", Values: map[string]bool{"repos.delete": true}},
		Downstream:   []Downstream{{Service: "api.github.com", Revision: "2022-11-28"}},
		Secrets:      []Secret{{Name: "github-app-key", Version: "7"}},
		Policy:       &PolicyRef{ID: "github-mcp-default", Digest: "sha256:" + strings.Repeat("ef", 32)},
		Tools: []Tool{
			{
				Name:        "get_repository",
				Title:       "Get repository",
				Description: "Fetch the metadata of one repository by owner and name, to confirm it is the intended one.",
				InputSchema: json.RawMessage(ownerRepo),
				Annotations: &Annotations{ReadOnlyHint: ptr(true)},
				Summary:     "Read one repository's metadata.",
				SideEffects: SideEffectRead,
				FailureModes: []FailureMode{
					{Error: "not_found", Recovery: RecoveryPromptUser},
					{Error: "rate_limited", Recovery: RecoveryRetry, MaxAttempts: 3},
				},
			},
			{
				Name:        "list_repositories",
				Title:       "List repositories",
				Description: "List the repositories the installation can access, to find the owner and name of one.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"owner":{"type":"string","description":"Only list repositories of this owner."}}}`),
				Annotations: &Annotations{ReadOnlyHint: ptr(true)},
				Summary:     "List accessible repositories.",
				SideEffects: SideEffectRead,
				Dependencies: &Dependencies{
					ProducesInputFor: []string{"get_repository"},
				},
			},
			{
				Name:        "create_repository",
				Title:       "Create repository",
				Description: "Create a new repository owned by the authenticated account; needs human approval.",
				InputSchema: json.RawMessage(`{
					"type": "object",
					"properties": {
						"name": {"type": "string", "description": "Name of the new repository."},
						"description": {"type": "string", "description": "Short description of the repository."},
						"private": {"type": "boolean", "description": "Whether the repository is private; omitted means the configured default."},
						"auto_init": {"type": "boolean", "description": "Create an initial commit with a README."}
					},
					"required": ["name"],
					"additionalProperties": false
				}`),
				Annotations:      &Annotations{ReadOnlyHint: ptr(false), DestructiveHint: ptr(false)},
				Summary:          "Create a new repository (needs approval).",
				SideEffects:      SideEffectWrite,
				RequiresApproval: true,
				FailureModes: []FailureMode{
					{Error: "name_taken", Recovery: RecoveryPromptUser},
					{Error: "rate_limited", Recovery: RecoveryRetry},
				},
			},
			{
				Name:             "delete_repository",
				Title:            "Delete repository",
				Description:      "Permanently delete a repository with its issues and releases; this cannot be undone.",
				InputSchema:      json.RawMessage(ownerRepo),
				Annotations:      &Annotations{ReadOnlyHint: ptr(false), DestructiveHint: ptr(true)},
				Summary:          "Permanently delete a repository (needs approval).",
				SideEffects:      SideEffectDelete,
				RequiresApproval: true,
				FailureModes:     []FailureMode{{Error: "not_found", Recovery: RecoveryAbort}},
				Dependencies: &Dependencies{
					Requires:      []string{"get_repository"},
					ExclusiveWith: []string{"create_repository"},
				},
			},
		},
	}
}

// extraTool returns a well-described tool named name.
func extraTool(name string) Tool {
	return Tool{
		Name:        name,
		Description: "Return the topics of one repository, to help classify it for the user.",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Summary:     "Read a repository's topics.",
		SideEffects: SideEffectRead,
	}
}

type fk struct {
	Rule string
	Sev  Severity
	Path string
}

func keys(fs []Finding) []fk {
	out := make([]fk, len(fs))
	for i, f := range fs {
		out[i] = fk{f.Rule, f.Severity, f.Path}
	}
	return out
}

func E(rule, path string) fk { return fk{rule, SeverityError, path} }
func W(rule, path string) fk { return fk{rule, SeverityWarning, path} }

func TestBaseManifestIsClean(t *testing.T) {
	m := baseManifest()
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if fs := Lint(m); len(fs) != 0 {
		t.Fatalf("Lint(base) = %v, want none", fs)
	}
}

func TestLintRules(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Manifest)
		want   []fk // exactly these findings (order-insensitive)
	}{
		// approval-required
		{"write without approval", func(m *Manifest) { m.Tools[2].RequiresApproval = false },
			[]fk{E(RuleApprovalRequired, "/tools/2/requiresApproval")}},
		{"delete without approval", func(m *Manifest) { m.Tools[3].RequiresApproval = false },
			[]fk{E(RuleApprovalRequired, "/tools/3/requiresApproval")}},
		{"read and none need no approval", func(m *Manifest) {
			m.Tools[0].SideEffects = SideEffectNone
			m.Tools[1].RequiresApproval = true // asking for more is allowed
		}, nil},

		// annotation-conflict
		{"readOnlyHint on write", func(m *Manifest) { m.Tools[2].Annotations.ReadOnlyHint = ptr(true) },
			[]fk{E(RuleAnnotationConflict, "/tools/2/annotations/readOnlyHint")}},
		{"readOnlyHint on delete", func(m *Manifest) { m.Tools[3].Annotations.ReadOnlyHint = ptr(true) },
			[]fk{E(RuleAnnotationConflict, "/tools/3/annotations/readOnlyHint")}},
		{"destructiveHint false on delete", func(m *Manifest) { m.Tools[3].Annotations.DestructiveHint = ptr(false) },
			[]fk{E(RuleAnnotationConflict, "/tools/3/annotations/destructiveHint")}},
		{"annotations consistent or absent", func(m *Manifest) {
			m.Tools[2].Annotations.DestructiveHint = ptr(false) // write may be non-destructive
			m.Tools[3].Annotations = nil
			m.Tools[0].Annotations.DestructiveHint = ptr(false)
		}, nil},

		// duplicate-tool-name
		{"duplicate tool name", func(m *Manifest) { m.Tools = append(m.Tools, m.Tools[0], m.Tools[0]) },
			[]fk{E(RuleDuplicateToolName, "/tools/4/name"), E(RuleDuplicateToolName, "/tools/5/name")}},
		{"distinct tool names", func(m *Manifest) { m.Tools = append(m.Tools, extraTool("get_repository_topics")) }, nil},

		// unknown-dependency
		{"requires unknown tool", func(m *Manifest) {
			m.Tools[3].Dependencies.Requires = append(m.Tools[3].Dependencies.Requires, "get_repo")
		}, []fk{E(RuleUnknownDependency, "/tools/3/dependencies/requires/1")}},
		{"producesInputFor unknown tool", func(m *Manifest) {
			m.Tools[1].Dependencies.ProducesInputFor = []string{"list_branches", "get_repository"}
		}, []fk{E(RuleUnknownDependency, "/tools/1/dependencies/producesInputFor/0")}},
		{"exclusiveWith unknown tool", func(m *Manifest) {
			m.Tools[3].Dependencies.ExclusiveWith = []string{"create_repository", "transfer_repository"}
		}, []fk{E(RuleUnknownDependency, "/tools/3/dependencies/exclusiveWith/1")}},
		{"fallback unknown tool", func(m *Manifest) {
			m.Tools[0].FailureModes[0] = FailureMode{Error: "not_found", Recovery: RecoveryFallback, Fallback: "search_repositories"}
		}, []fk{E(RuleUnknownDependency, "/tools/0/failureModes/0/fallback")}},
		{"dependencies all known", func(m *Manifest) {
			m.Tools[1].Dependencies.ProducesInputFor = []string{"get_repository", "delete_repository"}
			m.Tools[0].FailureModes[0] = FailureMode{Error: "not_found", Recovery: RecoveryFallback, Fallback: "list_repositories"}
		}, nil},

		// requires-cycle
		{"self require", func(m *Manifest) {
			m.Tools[0].Dependencies = &Dependencies{Requires: []string{"get_repository"}}
		}, []fk{E(RuleRequiresCycle, "/tools/0/dependencies/requires/0")}},
		{"two-tool cycle reported once", func(m *Manifest) {
			m.Tools[0].Dependencies = &Dependencies{Requires: []string{"delete_repository"}}
		}, []fk{E(RuleRequiresCycle, "/tools/0/dependencies/requires/0")}},
		{"three-tool cycle reported once at lowest tool", func(m *Manifest) {
			m.Tools[2].Dependencies = &Dependencies{Requires: []string{"list_repositories"}}
			m.Tools[1].Dependencies.Requires = []string{"get_repository"}
			m.Tools[0].Dependencies = &Dependencies{Requires: []string{"list_repositories", "create_repository"}}
		}, []fk{E(RuleRequiresCycle, "/tools/0/dependencies/requires/0")}},
		{"two disjoint cycles", func(m *Manifest) {
			m.Tools[0].Dependencies = &Dependencies{Requires: []string{"list_repositories"}}
			m.Tools[1].Dependencies.Requires = []string{"get_repository"}
			m.Tools[2].Dependencies = &Dependencies{Requires: []string{"create_repository"}}
		}, []fk{
			E(RuleRequiresCycle, "/tools/0/dependencies/requires/0"),
			E(RuleRequiresCycle, "/tools/2/dependencies/requires/0"),
		}},
		{"acyclic chain and diamond", func(m *Manifest) {
			m.Tools[1].Dependencies.Requires = []string{"get_repository"}
			m.Tools[2].Dependencies = &Dependencies{Requires: []string{"list_repositories", "get_repository"}}
			m.Tools[3].Dependencies.Requires = []string{"get_repository", "list_repositories"}
		}, nil},

		// requires-exclusive-conflict
		{"requires and exclusive with the same tool", func(m *Manifest) {
			m.Tools[3].Dependencies.ExclusiveWith = append(m.Tools[3].Dependencies.ExclusiveWith, "get_repository")
		}, []fk{E(RuleRequiresExclusiveConflict, "/tools/3/dependencies/exclusiveWith/1")}},
		{"requires one, exclusive with another", func(m *Manifest) {
			m.Tools[2].Dependencies = &Dependencies{Requires: []string{"list_repositories"}, ExclusiveWith: []string{"delete_repository"}}
		}, nil},

		// invalid-input-schema
		{"schema does not compile", func(m *Manifest) {
			m.Tools[0].InputSchema = json.RawMessage(`{"type":"object","properties":{"owner":{"type":"strin","description":"x"}}}`)
		}, []fk{E(RuleInvalidInputSchema, "/tools/0/inputSchema")}},
		{"schema refers to a remote document", func(m *Manifest) {
			m.Tools[0].InputSchema = json.RawMessage(`{"type":"object","properties":{"owner":{"$ref":"https://schemas.example.com/owner.json"}}}`)
		}, []fk{E(RuleInvalidInputSchema, "/tools/0/inputSchema")}},
		{"schema with duplicate member", func(m *Manifest) {
			m.Tools[0].InputSchema = json.RawMessage(`{"type":"object","type":"string"}`)
		}, []fk{E(RuleInvalidInputSchema, "/tools/0/inputSchema")}},
		{"schema missing", func(m *Manifest) { m.Tools[0].InputSchema = nil },
			[]fk{E(RuleInvalidInputSchema, "/tools/0/inputSchema")}},
		{"schema with local refs and an explicit draft", func(m *Manifest) {
			m.Tools[0].InputSchema = json.RawMessage(`{
				"$schema": "http://json-schema.org/draft-07/schema#",
				"type": "object",
				"properties": {"owner": {"$ref": "#/definitions/owner"}},
				"definitions": {"owner": {"type": "string", "description": "Account that owns the repository."}}
			}`)
		}, nil},

		// input-schema-not-object
		{"schema of a string", func(m *Manifest) { m.Tools[0].InputSchema = json.RawMessage(`{"type":"string"}`) },
			[]fk{E(RuleInputSchemaNotObject, "/tools/0/inputSchema/type")}},
		{"schema without type", func(m *Manifest) { m.Tools[1].InputSchema = json.RawMessage(`{"properties":{}}`) },
			[]fk{E(RuleInputSchemaNotObject, "/tools/1/inputSchema/type")}},
		{"boolean schema", func(m *Manifest) { m.Tools[1].InputSchema = json.RawMessage(`true`) },
			[]fk{E(RuleInputSchemaNotObject, "/tools/1/inputSchema")}},
		{"schema of an object without properties", func(m *Manifest) {
			m.Tools[1].InputSchema = json.RawMessage(`{"type":"object","additionalProperties":false}`)
		}, nil},

		// secret-value, secret-unversioned
		{"secret by value", func(m *Manifest) { m.Secrets[0].Value = "-----BEGIN PRIVATE KEY-----" },
			[]fk{E(RuleSecretValue, "/secrets/0/value")}},
		{"secret by value only", func(m *Manifest) {
			m.Secrets = append(m.Secrets, Secret{Name: "webhook-secret", Value: "hunter2"})
		}, []fk{E(RuleSecretValue, "/secrets/1/value"), E(RuleSecretUnversioned, "/secrets/1/version")}},
		{"secret without version", func(m *Manifest) { m.Secrets[0].Version = "" },
			[]fk{E(RuleSecretUnversioned, "/secrets/0/version")}},
		{"secrets by version", func(m *Manifest) {
			m.Secrets = append(m.Secrets, Secret{Name: "webhook-secret", Version: "projects/p/secrets/webhook/versions/3"})
		}, nil},

		// secret-in-config
		{"token in config", func(m *Manifest) { m.Config.Values["github.token"] = "ghp_0123456789" },
			[]fk{E(RuleSecretInConfig, "/config/values/github.token")}},
		{"secret-looking keys, any case, nested and in arrays", func(m *Manifest) {
			m.Config.Values["DB_PASSWORD"] = "pw"
			m.Config.Values["auth"] = map[string]any{"apiKey": "k", "user": "bob", "Private-Key": "pem"}
			m.Config.Values["client_credentials"] = []any{"c1", 7}
			m.Config.Values["webhookSecret"] = "s"
			m.Config.Values["passwd"] = "p"
			m.Config.Values["typed"] = map[string]string{"refresh_token": "r"}
			m.Config.Values["API-KEYS"] = []string{"", "k2"}
		}, []fk{
			E(RuleSecretInConfig, "/config/values/API-KEYS/1"),
			E(RuleSecretInConfig, "/config/values/typed/refresh_token"),
			E(RuleSecretInConfig, "/config/values/DB_PASSWORD"),
			E(RuleSecretInConfig, "/config/values/auth/apiKey"),
			E(RuleSecretInConfig, "/config/values/auth/Private-Key"),
			E(RuleSecretInConfig, "/config/values/client_credentials/0"),
			E(RuleSecretInConfig, "/config/values/passwd"),
			E(RuleSecretInConfig, "/config/values/webhookSecret"),
		}},
		{"secret-looking keys without string values", func(m *Manifest) {
			m.Config.Values["token.ttlSeconds"] = 300.0
			m.Config.Values["password"] = ""
			m.Config.Values["credentials"] = map[string]any{"source": "vault"}
			m.Config.Values["apiKeyRequired"] = true
		}, nil},

		// summary-missing, summary-too-long
		{"no summary", func(m *Manifest) { m.Tools[1].Summary = "  " },
			[]fk{W(RuleSummaryMissing, "/tools/1/summary")}},
		{"summary too long", func(m *Manifest) { m.Tools[1].Summary = strings.Repeat("é", MaxSummaryLength+1) },
			[]fk{W(RuleSummaryTooLong, "/tools/1/summary")}},
		{"summary at the limit", func(m *Manifest) { m.Tools[1].Summary = strings.Repeat("é", MaxSummaryLength) }, nil},

		// description-missing, description-restates-name, description-too-thin
		{"no description", func(m *Manifest) { m.Tools[2].Description = "" },
			[]fk{W(RuleDescriptionMissing, "/tools/2/description")}},
		{"description restates name", func(m *Manifest) { m.Tools[2].Description = "Create repository." },
			[]fk{W(RuleDescriptionRestatesName, "/tools/2/description")}},
		{"description restates name with odd punctuation", func(m *Manifest) { m.Tools[2].Description = "  CREATE-Repository!! " },
			[]fk{W(RuleDescriptionRestatesName, "/tools/2/description")}},
		{"description restates title", func(m *Manifest) {
			m.Tools[2].Title = "New repo"
			m.Tools[2].Description = "New repo"
		}, []fk{W(RuleDescriptionRestatesName, "/tools/2/description")}},
		{"description too thin", func(m *Manifest) { m.Tools[2].Description = "Creates a new GitHub repository." },
			[]fk{W(RuleDescriptionTooThin, "/tools/2/description")}},
		{"description long enough", func(m *Manifest) {
			m.Tools[2].Description = "Creates a new GitHub repository for the authenticated user account."
		}, nil},

		// parameter-undocumented
		{"top-level parameter undocumented", func(m *Manifest) {
			m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string","description":"Name."},"private":{"type":"boolean"},"auto_init":{"type":"boolean","description":"  "}}}`)
		}, []fk{
			W(RuleParameterUndocumented, "/tools/2/inputSchema/properties/auto_init/description"),
			W(RuleParameterUndocumented, "/tools/2/inputSchema/properties/private/description"),
		}},
		{"nested parameters undocumented", func(m *Manifest) {
			m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{
				"template": {"type":"object","description":"Template to start from.","properties":{"owner":{"type":"string"},"repo":{"type":"string","description":"Template repository."}}},
				"topics": {"type":"array","description":"Topics to set.","items":{"type":"object","properties":{"name":{"type":"string"}}}},
				"odd name": true
			}}`)
		}, []fk{
			W(RuleParameterUndocumented, "/tools/2/inputSchema/properties/odd name/description"),
			W(RuleParameterUndocumented, "/tools/2/inputSchema/properties/template/properties/owner/description"),
			W(RuleParameterUndocumented, "/tools/2/inputSchema/properties/topics/items/properties/name/description"),
		}},
		{"parameter documented through a local ref", func(m *Manifest) {
			m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"$ref":"#/$defs/name"}},"$defs":{"name":{"type":"string","description":"Name of the repository."}}}`)
		}, nil},
		{"parameter documented through an encoded local ref", func(m *Manifest) {
			m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"$ref":"#/$defs/repo%20name"}},"$defs":{"repo name":{"type":"string","description":"Name of the repository."}}}`)
		}, nil},
		{"parameter through a ref without a description", func(m *Manifest) {
			m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"$ref":"#/$defs/name"}},"$defs":{"name":{"type":"string"}}}`)
		}, []fk{W(RuleParameterUndocumented, "/tools/2/inputSchema/properties/name/description")}},

		// recovery-missing
		{"failure mode without recovery", func(m *Manifest) { m.Tools[2].FailureModes[1].Recovery = "" },
			[]fk{W(RuleRecoveryMissing, "/tools/2/failureModes/1/recovery")}},
		{"fallback without a fallback tool", func(m *Manifest) { m.Tools[2].FailureModes[1].Recovery = RecoveryFallback },
			[]fk{W(RuleRecoveryMissing, "/tools/2/failureModes/1/fallback")}},
		{"every recovery strategy", func(m *Manifest) {
			m.Tools[2].FailureModes = []FailureMode{
				{Error: "a", Recovery: RecoveryRetry, MaxAttempts: 2},
				{Error: "b", Recovery: RecoveryPromptUser},
				{Error: "c", Recovery: RecoveryAbort},
				{Error: "d", Recovery: RecoveryFallback, Fallback: "get_repository"},
			}
		}, nil},

		// artifact-not-pinned
		{"artifact by tag only", func(m *Manifest) { m.Artifact.Digest = "" },
			[]fk{W(RuleArtifactNotPinned, "/artifact/digest")}},
		{"artifact by digest only", func(m *Manifest) { m.Artifact.Image = "" }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := baseManifest()
			tt.mutate(m)
			got := keys(Lint(m))
			want := slices.Clone(tt.want)
			cmpKey := func(a, b fk) int { return strings.Compare(a.Path+" "+a.Rule, b.Path+" "+b.Rule) }
			slices.SortFunc(got, cmpKey)
			slices.SortFunc(want, cmpKey)
			if !slices.Equal(got, want) {
				t.Errorf("findings:\n got %v\nwant %v\nfull: %v", got, want, Lint(m))
			}
		})
	}
}

func TestLintCycleMessage(t *testing.T) {
	m := baseManifest()
	m.Tools[2].Dependencies = &Dependencies{Requires: []string{"get_repository"}}
	m.Tools[1].Dependencies.Requires = []string{"create_repository"}
	m.Tools[0].Dependencies = &Dependencies{Requires: []string{"delete_repository", "list_repositories"}}
	fs := Lint(m)
	if len(fs) != 1 {
		t.Fatalf("want one finding, got %v", fs)
	}
	// Shortest cycle through get_repository: delete_repository requires it
	// directly.
	want := "requires cycle: get_repository → delete_repository → get_repository"
	if fs[0].Rule != RuleRequiresCycle || fs[0].Message != want || fs[0].Path != "/tools/0/dependencies/requires/0" {
		t.Fatalf("got %+v, want %q at requires[0]", fs[0], want)
	}
}

func TestLintNeverEchoesSecrets(t *testing.T) {
	const secret1, secret2, secret3 = "s3cr3t-VALUE-0001", "ghp_LEAKEDTOKEN0002", "pw-0003"
	m := baseManifest()
	m.Secrets = append(m.Secrets, Secret{Name: "db", Value: secret1})
	m.Config.Values["github.token"] = secret2
	m.Config.Values["nested"] = map[string]any{"password": secret3}
	fs := Lint(m)
	if !HasErrors(fs) {
		t.Fatal("want errors")
	}
	out, _ := json.Marshal(fs)
	le := &LintError{Findings: fs}
	for _, s := range []string{secret1, secret2, secret3} {
		if strings.Contains(string(out), s) || strings.Contains(le.Error(), s) {
			t.Errorf("a finding echoes secret %q: %s", s, out)
		}
	}
}

func TestLintOrderIsDeterministic(t *testing.T) {
	m := baseManifest()
	for i := range 11 {
		tool := extraTool(fmt.Sprintf("t%d", i))
		tool.Summary = ""
		m.Tools = append(m.Tools, tool)
	}
	m.Artifact.Digest = ""
	m.Tools[2].RequiresApproval = false
	m.Tools[2].Summary = ""
	m.Config.Values["b_token"] = "x"
	m.Config.Values["a_token"] = "x"
	first := Lint(m)
	for range 20 {
		if got := Lint(m); !slices.Equal(got, first) {
			t.Fatalf("Lint is not deterministic:\n%v\n%v", first, got)
		}
	}
	var paths []string
	for _, f := range first {
		paths = append(paths, f.Path)
	}
	want := []string{
		"/artifact/digest",
		"/config/values/a_token",
		"/config/values/b_token",
		"/tools/2/requiresApproval",
		"/tools/2/summary",
	}
	for i := range 11 {
		want = append(want, fmt.Sprintf("/tools/%d/summary", i+4))
	}
	if !slices.Equal(paths, want) {
		t.Fatalf("paths:\n got %q\nwant %q", paths, want)
	}
	// Same path: ordered by rule.
	m = baseManifest()
	m.Tools[2].Annotations = &Annotations{ReadOnlyHint: ptr(true)}
	m.Tools[2].Dependencies = &Dependencies{Requires: []string{"ghost"}, ExclusiveWith: []string{"ghost"}}
	got := keys(Lint(m))
	wantKeys := []fk{
		E(RuleAnnotationConflict, "/tools/2/annotations/readOnlyHint"),
		E(RuleRequiresExclusiveConflict, "/tools/2/dependencies/exclusiveWith/0"),
		E(RuleUnknownDependency, "/tools/2/dependencies/exclusiveWith/0"),
		E(RuleUnknownDependency, "/tools/2/dependencies/requires/0"),
	}
	if !slices.Equal(got, wantKeys) {
		t.Fatalf("got %v\nwant %v", got, wantKeys)
	}
}

func TestLintNilAndEmpty(t *testing.T) {
	if fs := Lint(nil); fs != nil {
		t.Fatalf("Lint(nil) = %v", fs)
	}
	// A zero manifest must not panic; it draws only the pinning warning.
	fs := Lint(&Manifest{})
	if got := keys(fs); !slices.Equal(got, []fk{W(RuleArtifactNotPinned, "/artifact/digest")}) {
		t.Fatalf("Lint(zero) = %v", fs)
	}
	// A tool with nothing in it must not panic either.
	fs = Lint(&Manifest{Tools: []Tool{{}}})
	if !HasErrors(fs) {
		t.Fatalf("Lint(empty tool) = %v, want errors", fs)
	}
}

func TestRulesTable(t *testing.T) {
	ids := map[string]bool{}
	for _, r := range Rules() {
		if ids[r.ID] {
			t.Errorf("duplicate rule %s", r.ID)
		}
		ids[r.ID] = true
		if r.Severity != SeverityError && r.Severity != SeverityWarning {
			t.Errorf("rule %s: severity %q", r.ID, r.Severity)
		}
		if r.Principle == "" || r.Description == "" {
			t.Errorf("rule %s is not documented", r.ID)
		}
	}
	all := []string{
		RuleApprovalRequired, RuleAnnotationConflict, RuleDuplicateToolName, RuleUnknownDependency,
		RuleRequiresCycle, RuleRequiresExclusiveConflict, RuleInvalidInputSchema, RuleInputSchemaNotObject,
		RuleSecretValue, RuleSecretUnversioned, RuleSecretInConfig, RuleSummaryMissing, RuleSummaryTooLong,
		RuleDescriptionMissing, RuleDescriptionRestatesName, RuleDescriptionTooThin, RuleParameterUndocumented,
		RuleRecoveryMissing, RuleArtifactNotPinned,
	}
	if len(all) != len(ids) {
		t.Errorf("table has %d rules, constants %d", len(ids), len(all))
	}
	for _, id := range all {
		if !ids[id] {
			t.Errorf("rule %s missing from Rules()", id)
		}
	}
	// Rules returns a copy.
	r := Rules()
	r[0].ID = "changed"
	if Rules()[0].ID == "changed" {
		t.Error("Rules exposes its table")
	}
}

func TestHasErrorsAndLintError(t *testing.T) {
	warn := Finding{Rule: RuleSummaryMissing, Severity: SeverityWarning, Path: "/tools/0/summary", Message: "no summary"}
	bad := Finding{Rule: RuleApprovalRequired, Severity: SeverityError, Path: "/tools/1/requiresApproval", Message: "needs approval"}
	if HasErrors(nil) || HasErrors([]Finding{warn}) {
		t.Error("HasErrors true without errors")
	}
	if !HasErrors([]Finding{warn, bad}) {
		t.Error("HasErrors false with an error")
	}
	var err error = &LintError{Findings: []Finding{warn, bad}}
	msg := err.Error()
	for _, s := range []string{"1 error(s)", "1 warning(s)", RuleApprovalRequired, "/tools/1/requiresApproval"} {
		if !strings.Contains(msg, s) {
			t.Errorf("LintError %q lacks %q", msg, s)
		}
	}
	if strings.Contains(msg, "no summary") {
		t.Errorf("LintError lists warnings: %q", msg)
	}
	var le *LintError
	if !errors.As(fmt.Errorf("register: %w", err), &le) || len(le.Findings) != 2 {
		t.Error("errors.As LintError")
	}
}

func TestNaturalCompare(t *testing.T) {
	in := []string{"/tools/10/name", "/tools/2/name", "/tools/1", "/artifact", "/tools/02/a", "/tools/2"}
	slices.SortFunc(in, naturalCompare)
	want := []string{"/artifact", "/tools/1", "/tools/2", "/tools/2/name", "/tools/02/a", "/tools/10/name"}
	if !slices.Equal(in, want) {
		t.Fatalf("got %q\nwant %q", in, want)
	}
}

// The example manifests in examples/github must be clean, and the two
// releases must be different epochs although their descriptors are
// identical (schema-epoch drift).
func TestExampleManifests(t *testing.T) {
	files, err := filepath.Glob("../examples/github/manifest-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("want at least two example manifests, found %v", files)
	}
	epochs := map[string]string{}
	byFile := map[string]*Manifest{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if fs := Lint(m); len(fs) != 0 {
			t.Errorf("%s: findings:\n%v", f, fs)
		}
		epoch, err := m.EpochID()
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := epochs[epoch]; dup {
			t.Errorf("%s and %s have the same epoch %s", prev, f, epoch)
		}
		epochs[epoch] = f
		byFile[filepath.Base(f)] = m
	}
	v13, v14 := byFile["manifest-v1.3.json"], byFile["manifest-v1.4.json"]
	if v13 == nil || v14 == nil {
		t.Fatalf("missing manifest-v1.3.json or manifest-v1.4.json in %v", files)
	}
	if len(v13.Tools) != len(v14.Tools) {
		t.Fatal("the releases serve different tool sets")
	}
	for i := range v14.Tools {
		d13, _ := v13.Tools[i].Digest()
		d14, _ := v14.Tools[i].Digest()
		if d13 != d14 {
			t.Errorf("descriptor %s differs between releases; the example is about identical descriptors", v14.Tools[i].Name)
		}
	}
	if v13.Config.Values["repository.defaultVisibility"] != "public" || v14.Config.Values["repository.defaultVisibility"] != "private" {
		t.Error("the releases must differ in repository.defaultVisibility (public in v1.3, private in v1.4)")
	}
}
