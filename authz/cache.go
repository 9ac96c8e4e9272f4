package authz

import "sync"

// boundedMap is a mutex-guarded map that starts over when it holds max
// entries. It backs the use cases' caches, each of which is safe to lose
// whole (an entry is refilled from etcd on the next miss) and says why a
// stale entry cannot give a wrong answer.
type boundedMap[V any] struct {
	mu  sync.Mutex
	m   map[string]V
	max int
}

func (b *boundedMap[V]) get(k string) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[k]
	return v, ok
}

func (b *boundedMap[V]) put(k string, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil || len(b.m) >= b.max {
		b.m = make(map[string]V)
	}
	b.m[k] = v
}

func (b *boundedMap[V]) delete(k string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, k)
}
