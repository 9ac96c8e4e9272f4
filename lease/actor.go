package lease

import (
	"context"
	"encoding/json"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// actorKey carries the credential id of the caller a change is made for.
type actorKey struct{}

// WithActor returns ctx carrying the credential id of the caller on whose
// behalf the store changes something (an operator's drain, retire,
// revocation or generation change). The store writes it into the change's
// own transaction (a note, below), so the audit trail, which follows the
// store's history, records who made the change even when the request that
// made it never got its answer.
func WithActor(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, actorKey{}, id)
}

func actorOf(ctx context.Context) string {
	id, _ := ctx.Value(actorKey{}).(string)
	return id
}

// noteOp is the put of a note about subject (of kind: "epochs",
// "certificates", "generations") in the transaction that makes the change.
func (s *Store) noteOp(ctx context.Context, kind, subject string, n storedNote) clientv3.Op {
	n.ver, n.By = current, actorOf(ctx)
	b, _ := json.Marshal(&n)
	return clientv3.OpPut(s.k.note(kind, subject), string(b))
}
