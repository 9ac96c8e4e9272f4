package lease

import (
	"context"
	"errors"

	"github.com/fcd-authz/fcd/record"
)

// keptPut is a key a lease's close writes besides its own, in the same
// transaction and kept as long as the outcome.
type keptPut struct{ key, value string }

// errResolutionWithoutResolve: a CloseRequest carried a Resolution but is
// not a resolution.
var errResolutionWithoutResolve = errors.New("lease: a signed resolution closes a lease only with Resolve")

// resolutionPut is the write of req's signed resolution, none without one.
func (s *Store) resolutionPut(req CloseRequest) ([]keptPut, error) {
	switch {
	case req.Resolution == "":
		return nil, nil
	case !req.Resolve:
		return nil, errResolutionWithoutResolve
	case req.Outcome == record.OutcomeUncertain:
		return nil, errResolutionWithoutResolve
	}
	return []keptPut{{key: s.k.resolution(req.Lease), value: req.Resolution}}, nil
}

// Resolution returns the signed resolution (the verified JWS) kept with
// the lease that it closed, "" when none is kept: the lease is open,
// was closed otherwise or resolved without a signed document, its keep
// passed, or there is no such lease.
func (s *Store) Resolution(ctx context.Context, leaseID string) (string, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.resolution(leaseID))
	if err != nil {
		return "", s.wrap(ctx, "get resolution", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
