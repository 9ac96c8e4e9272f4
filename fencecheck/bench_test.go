// Verification benchmarks. Run:
//
//	go test -run '^$' -bench Verify -benchmem ./fencecheck/
//
// Each algorithm is measured side by side with the bare signature check of
// the same token (jwx's verifier over the signing input), so the cost of
// everything else Verify does (parsing, strict claims, the argument
// digest, the replay store) reads as a ratio, not as a lone time.
// BenchmarkVerifyOnline adds the claim: one HTTP round trip over loopback
// to a stand-in that answers at once, so it shows the client's share of
// the claim; authzd's own (one etcd transaction) is measured by
// bench/gateway.
package fencecheck_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// acceptAll is a replay store that has never seen anything, so one token
// can be verified b.N times.
type acceptAll struct{}

func (acceptAll) Seen(context.Context, string, time.Time) (bool, error) { return false, nil }

func BenchmarkVerify(b *testing.B) {
	ctx := context.Background()
	args := json.RawMessage(testArgs)
	for _, alg := range []jwa.SignatureAlgorithm{jwa.EdDSA, jwa.ES256} {
		key := fencechecktest.NewKey(alg.String(), "authzd-1")
		set := fencechecktest.Keys(key)

		b.Run(alg.String()+"/verify", func(b *testing.B) {
			v := newVerifier(set)
			v.Replay = acceptAll{}
			token := key.Issue(validClaims(b))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, token, testTool, args); err != nil {
					b.Fatal(err)
				}
			}
		})

		b.Run(alg.String()+"/verify-fresh-jti", func(b *testing.B) {
			// The default in-memory replay store, a new token each time.
			v := newVerifier(set)
			tokens := make([]string, b.N)
			for i := range tokens {
				tokens[i] = key.Issue(validClaims(b))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := v.Verify(ctx, tokens[i], testTool, args); err != nil {
					b.Fatal(err)
				}
			}
		})

		b.Run(alg.String()+"/signature-only", func(b *testing.B) {
			token := key.Issue(validClaims(b))
			i := strings.LastIndexByte(token, '.')
			input := []byte(token[:i])
			sig, _ := base64.RawURLEncoding.DecodeString(token[i+1:])
			raw := key.Public()
			verifier, err := jws.NewVerifier(alg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := verifier.Verify(input, sig, raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}

	b.Run("refused/alg-none", func(b *testing.B) {
		// What a flood of junk tokens costs: refused before any crypto.
		v := newVerifier(fencechecktest.Keys(fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")))
		enc := base64.RawURLEncoding.EncodeToString
		payload, _ := json.Marshal(validClaims(b))
		token := enc([]byte(`{"alg":"none","typ":"fcd-dispatch+jwt","kid":"authzd-1"}`)) + "." + enc(payload) + "."
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.Verify(ctx, token, testTool, args); fencecheck.ReasonOf(err) != fencecheck.ReasonAlgorithm {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkVerifyOnline(b *testing.B) {
	ctx := context.Background()
	args := json.RawMessage(testArgs)
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"lease":"x","claim":"y","claimedAt":"2027-01-15T08:00:00Z"}`))
	}))
	defer srv.Close()
	lc, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: srv.URL, Credential: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct {
		name    string
		claimer fencecheck.Claimer
	}{{"offline", nil}, {"claim-loopback", lc}} {
		b.Run("EdDSA/"+mode.name, func(b *testing.B) {
			v := newVerifier(fencechecktest.Keys(key))
			v.Replay = acceptAll{}
			v.Claimer = mode.claimer
			token := key.Issue(validClaims(b))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, token, testTool, args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
