package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RecordReissue records, before a token is issued again for the open
// admission l (a retried admission of an admitted formation), that it is:
// a re-admission hands out authority as an admission does, so it is a
// committed change the audit trail records like any other, and a token
// the store did not record is never answered. It fails with
// ErrLeaseClosed once the lease is no longer admitted at its revision.
// The key goes with the lease's release.
func (s *Store) RecordReissue(ctx context.Context, l *record.Lease, expires time.Time) error {
	b, err := encodeStored("reissue", &storedReissue{ver: current, Formation: l.Formation, At: s.now().UTC(), Expires: expires.UTC()})
	if err != nil {
		return err
	}
	mkey := s.k.marker(l.Target.Epoch, l.ID)
	resp, err := s.txn(ctx, txn{
		cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mkey), "=", l.Revision)},
		then: []clientv3.Op{clientv3.OpPut(s.k.reissue(l.ID), b)},
	})
	if err != nil {
		return s.wrap(ctx, "record reissue", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s", record.ErrLeaseClosed, l.ID)
	}
	return nil
}
