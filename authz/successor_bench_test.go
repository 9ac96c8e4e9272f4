package authz_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/fcd-authz/fcd/authz"
)

// BenchmarkForm measures what capturing a successor adds to a formation,
// side by side on one embedded etcd member (each formation is an etcd
// commit):
//
//   - no-issuers: certificates disabled, no lookup at all;
//   - no-certificate: issuer keys configured, no certificate for the tool
//     (one extra etcd range per formation);
//   - misfit: a certificate whose envelope the arguments do not fit;
//   - successor: a certificate that fits; the successor is captured and
//     decided by both engines (re-verified signature, target epoch read).
//
// Run: go test -run '^$' -bench Form -benchmem -count 3 ./authz/
// and compare the sub-benchmarks' ns/op as ratios to no-issuers.
func BenchmarkForm(b *testing.B) {
	s := newSuccEnv(b)
	ctx := context.Background()
	s.certify(b, cert{})
	cases := []struct {
		name    string
		forms   *authz.UseCases
		tool    string
		args    string
		capture bool
	}{
		{"no-issuers", s.formations(nil), "github/create_repository", `{"name":"r%d","private":true}`, false},
		{"no-certificate", s.forms, "github/get_repository", `{"owner":"o","repo":"r%d"}`, false},
		{"misfit", s.forms, "github/create_repository", `{"name":"r%d"}`, false},
		{"successor", s.forms, "github/create_repository", `{"name":"r%d","private":true}`, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				f, err := c.forms.Formations.Form(ctx, authz.FormRequest{
					Snapshot: s.snapshot, Session: "bench", Tool: c.tool,
					Arguments: json.RawMessage(fmt.Sprintf(c.args, i)), PrincipalID: "alice", Host: "host-1",
				})
				if err != nil {
					b.Fatal(err)
				}
				if (f.Successor != nil) != c.capture {
					b.Fatalf("successor %+v, want captured=%v", f.Successor, c.capture)
				}
			}
		})
	}
}
