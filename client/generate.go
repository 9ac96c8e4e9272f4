package client

// The generated code is written by the tool version pinned in go.mod;
// TestGeneratedIsCurrent runs this same line into a temporary directory.
//go:generate go tool oapi-codegen -config oapi-codegen.yaml -o client.gen.go ../api/openapi.yaml
