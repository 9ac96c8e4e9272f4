package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWrapClassifiesByType: wrap names an etcd error by its type — as the
// client hands it over (an rpctypes.EtcdError), as a raw gRPC status, or
// wrapped — and only what says etcd did not answer is ErrUnavailable.
func TestWrapClassifiesByType(t *testing.T) {
	s := &Store{log: slog.New(slog.DiscardHandler), reach: &reachability{endpoints: []string{"http://127.0.0.1:1"}}}
	// The reachability probe is not what this test is about: answer from
	// its cache.
	s.reach.text = "etcd did not answer in time (test)"
	s.reach.looking = true
	for _, tc := range []struct {
		name string
		err  error
		want []error
		not  []error
	}{
		{"no space", rpctypes.ErrNoSpace, []error{record.ErrStoreFull}, []error{record.ErrUnavailable}},
		{"no space, gRPC status", rpctypes.ErrGRPCNoSpace, []error{record.ErrStoreFull}, []error{record.ErrUnavailable}},
		{"no space, wrapped", fmt.Errorf("commit: %w", rpctypes.ErrNoSpace), []error{record.ErrStoreFull}, nil},
		{"too large", rpctypes.ErrRequestTooLarge, []error{record.ErrTooLarge}, []error{record.ErrUnavailable}},
		{"permission denied", rpctypes.ErrPermissionDenied, []error{record.ErrStoreDenied}, []error{record.ErrUnavailable}},
		{"auth failed", rpctypes.ErrGRPCAuthFailed, []error{record.ErrStoreDenied}, nil},
		{"invalid auth token", rpctypes.ErrInvalidAuthToken, []error{record.ErrStoreDenied}, nil},
		{"unauthenticated code", status.Error(codes.Unauthenticated, "a proxy said no"), []error{record.ErrStoreDenied}, nil},
		{"corrupt", rpctypes.ErrCorrupt, []error{record.ErrStoreCorrupt}, []error{record.ErrUnavailable}},
		{"compacted", rpctypes.ErrCompacted, []error{record.ErrCompacted, record.ErrUnavailable}, nil},
		{"no leader", rpctypes.ErrNoLeader, []error{record.ErrUnavailable}, []error{record.ErrStoreFull, record.ErrStoreDenied}},
		{"timeout", rpctypes.ErrTimeout, []error{record.ErrUnavailable}, nil},
		{"deadline", context.DeadlineExceeded, []error{record.ErrUnavailable}, nil},
		{"unavailable code", status.Error(codes.Unavailable, "connection refused"), []error{record.ErrUnavailable}, nil},
		{"too many requests", rpctypes.ErrTooManyRequests, []error{record.ErrUnavailable}, []error{record.ErrStoreFull}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s.wrap(context.Background(), "op", tc.err)
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Errorf("wrap(%v) = %v, not %v", tc.err, got, w)
				}
			}
			for _, n := range tc.not {
				if errors.Is(got, n) {
					t.Errorf("wrap(%v) = %v, is %v", tc.err, got, n)
				}
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := s.wrap(ctx, "op", rpctypes.ErrNoSpace); !errors.Is(got, context.Canceled) {
		t.Errorf("a caller that gave up gets %v", got)
	}
}
