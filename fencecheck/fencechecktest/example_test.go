package fencechecktest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
)

// A backend's test runs its verifier against tokens signed here, with the
// keys served as authzd serves them.
func Example() {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	jwks := fencechecktest.NewJWKSServer(key)
	defer jwks.Close()

	v := &fencecheck.Verifier{
		Pool: "github-prod", Artifact: "sha256:a1", Config: "sha256:c1", Generation: 3,
		JWKSURL: jwks.JWKSURL(), Started: time.Now().Add(-time.Minute),
	}
	args := json.RawMessage(`{"name":"demo"}`)
	digest, _ := fencecheck.ArgumentDigest("github/create_repository", args)
	now := time.Now()
	claims := fencecheck.Claims{
		Issuer: "fcd", Audience: "github-prod", Subject: "session-1", ID: "lease-1",
		IssuedAt: now.Unix(), NotBefore: now.Unix(), Expiry: now.Unix() + 30,
		Formation: "fm-1", Tool: "github/create_repository", ArgumentDigest: digest, Epoch: "sha256:e1",
		Artifact: "sha256:a1", Config: "sha256:c1", Generation: 3, Revision: 7, Cluster: "c1",
		Admitted: now.UnixMilli(),
	}
	c, err := v.Verify(context.Background(), key.Issue(claims), "github/create_repository", args)
	fmt.Println(c.ID, err)

	// A token the fence must refuse: another typ.
	claims.ID = "lease-2"
	_, err = v.Verify(context.Background(), key.Sign(map[string]any{"typ": "JWT", "kid": "authzd-1"}, claims), "github/create_repository", args)
	fmt.Println(fencecheck.ReasonOf(err), jwks.Fetches())
	// Output:
	// lease-1 <nil>
	// type 1
}
