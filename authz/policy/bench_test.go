// Benchmarks of the decision path over the default policies (policies/).
//
// Run them side by side, in one run, so the ratios are meaningful:
//
//	go test -run '^$' -bench Decide -benchmem ./authz/policy/
//
// combined is one decision from an input converted whole (one Document,
// both engines); combined-cached is what authz pays per formation: the
// same input with its tool and epoch, and the call's metadata and source,
// from an InputCache, converted once;
// combined-successor is the same call with a candidate successor, which
// both engines also answer on (Rego in the same evaluation, Cedar with a
// second request); rego and cedar are each engine alone from the same Input (Document
// included); document and document-cached are the Input conversion alone
// (whole, and with the cached parts); bare-opa-prepared is
// the floor: a bare OPA PreparedEvalQuery of the same default Rego, with
// the same three-set query, given the same *Input through rego.EvalInput;
// bare-opa-prepared-ast-input is the same query given an already converted
// input, i.e. OPA's evaluation alone; bare-opa-prepared-package queries the
// whole package (data.fcd.authz) instead of the three sets, the alternative
// query shape. Report combined-cached/bare-opa-prepared.
package policy

import (
	"context"
	"runtime"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/fcd-authz/fcd/policies"
	"github.com/fcd-authz/fcd/record"
)

func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	s := loadDefaults(b)
	// A write by a developer after reads in the session: every rule of both
	// engines is evaluated and the call is allowed with one approval.
	in := githubInput(b, githubManifest(b), call{
		tool: "create_repository", args: `{"name":"payroll-exports","private":true}`,
		completed: []string{"github/get_repository", "github/list_repositories"},
	})
	if d := s.Decide(ctx, in); !d.Allowed() || d.Approvals != 1 {
		b.Fatalf("benchmark input decided %+v", d)
	}
	withSuccessor := githubInput(b, githubManifest(b), call{
		tool: "create_repository", args: `{"name":"payroll-exports","private":true}`,
		completed: []string{"github/get_repository", "github/list_repositories"},
		successor: &successor{},
	})
	if d := s.Decide(ctx, withSuccessor); !d.Allowed() || d.Successor == nil || d.Successor.Verdict != "allow" {
		b.Fatalf("benchmark input with a successor decided %+v", d)
	}
	var cache InputCache
	cached := *in
	desc := in.Tool.Tool
	cached.Tool = cache.Tool(in.Formation.DescriptorDigest, in.Tool.Server, &desc)
	cached.Epoch = cache.Epoch(&record.Epoch{
		ID: in.Epoch.ID, Server: in.Epoch.Server, Release: in.Epoch.Release, Pool: in.Epoch.Pool,
		State: in.Epoch.State, Artifact: in.Epoch.Artifact, ConfigDigest: in.Epoch.ConfigDigest,
		SignerKeyID: in.Epoch.SignerKid, Manifest: githubManifest(b),
	})
	cached.Formation = cache.Formation(in.Formation.Call, in.Formation.Digest)
	if d := s.Decide(ctx, &cached); !d.Allowed() || d.Approvals != 1 {
		b.Fatalf("cached benchmark input decided %+v", d)
	}
	src, err := policies.FS.ReadFile("fcd.rego")
	if err != nil {
		b.Fatal(err)
	}
	bare := func(b *testing.B, query string) rego.PreparedEvalQuery {
		pq, err := rego.New(rego.Query(query), rego.Module("fcd.rego", string(src))).PrepareForEval(ctx)
		if err != nil {
			b.Fatal(err)
		}
		rs, err := pq.Eval(ctx, rego.EvalInput(in))
		if err != nil || len(rs) != 1 {
			b.Fatalf("bare query: %v %v", rs, err)
		}
		return pq
	}

	// Each sub-benchmark starts from a collected heap, so none pays for the
	// garbage of the one before (or of Load): on a small machine that alone
	// moved results by a quarter.
	b.Run("combined", func(b *testing.B) {
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if d := s.Decide(ctx, in); !d.Allowed() {
				b.Fatal(d)
			}
		}
	})
	b.Run("combined-cached", func(b *testing.B) {
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if d := s.Decide(ctx, &cached); !d.Allowed() {
				b.Fatal(d)
			}
		}
	})
	b.Run("combined-successor", func(b *testing.B) {
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if d := s.Decide(ctx, withSuccessor); !d.Allowed() || d.Successor.Verdict != "allow" {
				b.Fatal(d)
			}
		}
	})
	for _, e := range s.Engines() {
		b.Run(e.Name(), func(b *testing.B) {
			b.ReportAllocs()
			runtime.GC()
			for b.Loop() {
				doc, err := NewDocument(in)
				if err != nil {
					b.Fatal(err)
				}
				if d := e.Decide(ctx, doc); d.Verdict != "allow" {
					b.Fatal(d)
				}
			}
		})
	}
	b.Run("document", func(b *testing.B) {
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if _, err := NewDocument(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("document-cached", func(b *testing.B) {
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if _, err := NewDocument(&cached); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare-opa-prepared", func(b *testing.B) {
		pq := bare(b, "allow := data.fcd.authz.allow; deny := data.fcd.authz.deny; approvals := data.fcd.authz.approvals")
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if rs, err := pq.Eval(ctx, rego.EvalInput(in)); err != nil || len(rs) != 1 {
				b.Fatal(rs, err)
			}
		}
	})
	b.Run("bare-opa-prepared-ast-input", func(b *testing.B) {
		pq := bare(b, "allow := data.fcd.authz.allow; deny := data.fcd.authz.deny; approvals := data.fcd.authz.approvals")
		doc, err := NewDocument(in)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if rs, err := pq.Eval(ctx, rego.EvalParsedInput(doc.value)); err != nil || len(rs) != 1 {
				b.Fatal(rs, err)
			}
		}
	})
	b.Run("bare-opa-prepared-package", func(b *testing.B) {
		pq := bare(b, "data.fcd.authz")
		b.ReportAllocs()
		runtime.GC()
		for b.Loop() {
			if rs, err := pq.Eval(ctx, rego.EvalInput(in)); err != nil || len(rs) != 1 {
				b.Fatal(rs, err)
			}
		}
	})
}
