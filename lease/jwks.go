package lease

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// KeepPublished publishes value (a public JWK) under kid and keeps it
// published while ctx lives, bound to an etcd lease of ttl that this
// replica keeps alive. If the replica stops or dies, the key stays for ttl
// and then goes: ttl must exceed the longest token lifetime, so every
// token signed with the key can still be verified. A lost etcd lease (etcd
// away for longer than ttl) is granted again. published is called with
// true each time the key is (re)published and with false when it is lost.
func (s *Store) KeepPublished(ctx context.Context, kid string, value []byte, ttl time.Duration, published func(bool)) {
	key := s.k.jwk(kid)
	for ctx.Err() == nil {
		if err := s.publishOnce(ctx, key, value, ttl, published); err != nil && ctx.Err() == nil {
			s.log.Warn("publishing signing key", "kid", kid, "err", err)
		}
		published(false)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *Store) publishOnce(ctx context.Context, key string, value []byte, ttl time.Duration, published func(bool)) error {
	octx, cancel := s.op(ctx)
	g, err := s.cli.Grant(octx, int64(ttl.Seconds())+1)
	cancel()
	if err != nil {
		return s.wrap(ctx, "grant key lease", err)
	}
	octx, cancel = s.op(ctx)
	_, err = s.cli.Put(octx, key, string(value), clientv3.WithLease(g.ID))
	cancel()
	if err != nil {
		return s.wrap(ctx, "publish key", err)
	}
	ch, err := s.cli.KeepAlive(ctx, g.ID)
	if err != nil {
		return s.wrap(ctx, "keep key alive", err)
	}
	published(true)
	for range ch {
	}
	return nil
}

// PublishedKeys returns every published public JWK, as stored.
func (s *Store) PublishedKeys(ctx context.Context) ([][]byte, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.jwks(), clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(ctx, "published keys", err)
	}
	out := make([][]byte, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, kv.Value)
	}
	return out, nil
}
