// Package bounded is the one bounded cache of fcd's in-memory caches: a
// least-recently-used map (hashicorp/golang-lru) that is ready at its
// zero value. Each cache that uses it is safe to lose an entry of (it is
// computed or read again on the next miss) and says why a kept entry
// cannot give a wrong answer.
package bounded

import (
	"iter"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
)

// DefaultMax is the number of entries of a Cache whose Max is zero.
const DefaultMax = 4096

// Cache is a map of at most Max entries that forgets the least recently
// used one when full. The zero value is ready to use, with DefaultMax
// entries; set Max before the first call. It is safe for concurrent use.
type Cache[K comparable, V any] struct {
	// Max is how many entries the cache keeps; zero means DefaultMax.
	Max int

	once sync.Once
	lru  *lru.Cache[K, V]
}

func (c *Cache[K, V]) entries() *lru.Cache[K, V] {
	c.once.Do(func() {
		n := c.Max
		if n <= 0 {
			n = DefaultMax
		}
		c.lru, _ = lru.New[K, V](n) // fails only for n <= 0
	})
	return c.lru
}

// Get returns the value kept under k, if any.
func (c *Cache[K, V]) Get(k K) (V, bool) { return c.entries().Get(k) }

// Put keeps v under k, forgetting the least recently used entry when the
// cache is full.
func (c *Cache[K, V]) Put(k K, v V) { c.entries().Add(k, v) }

// Delete forgets k.
func (c *Cache[K, V]) Delete(k K) { c.entries().Remove(k) }

// Len is the number of entries kept.
func (c *Cache[K, V]) Len() int { return c.entries().Len() }

// All yields the entries kept when it is called, least recently used
// first, without making them more recent. An entry deleted or forgotten
// meanwhile is skipped; the loop may Delete entries as it goes.
func (c *Cache[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for _, k := range c.entries().Keys() {
			if v, ok := c.entries().Peek(k); ok && !yield(k, v) {
				return
			}
		}
	}
}
