package bounded

import (
	"strings"
	"testing"
)

func TestCacheForgetsTheLeastRecentlyUsed(t *testing.T) {
	c := Cache[string, int]{Max: 2}
	c.Put("a", 1)
	c.Put("b", 2)
	if v, ok := c.Get("a"); !ok || v != 1 { // a is now the most recent
		t.Fatalf("a = %d %v", v, ok)
	}
	c.Put("c", 3) // full: b goes
	if _, ok := c.Get("b"); ok {
		t.Fatal("b survived; the least recently used entry should go")
	}
	if v, ok := c.Get("a"); !ok || v != 1 {
		t.Fatalf("a = %d %v", v, ok)
	}
	if v, ok := c.Get("c"); !ok || v != 3 {
		t.Fatalf("c = %d %v", v, ok)
	}
	c.Delete("c")
	if _, ok := c.Get("c"); ok {
		t.Fatal("c survived delete")
	}
	if c.Len() != 1 {
		t.Fatalf("Len = %d, want 1", c.Len())
	}
}

func TestZeroCacheHasTheDefaultSize(t *testing.T) {
	var c Cache[int, int]
	for i := range DefaultMax + 10 {
		c.Put(i, i)
	}
	if c.Len() != DefaultMax {
		t.Fatalf("Len = %d, want %d", c.Len(), DefaultMax)
	}
}

// TestAllYieldsOldestFirst: All yields every entry, least recently used
// first, does not change which is forgotten next, and allows Delete.
func TestAllYieldsOldestFirst(t *testing.T) {
	c := Cache[string, int]{Max: 3}
	c.Put("a", 1)
	c.Put("b", 2)
	c.Put("c", 3)
	c.Get("a") // order now b, c, a
	var keys []string
	sum := 0
	for k, v := range c.All() {
		keys = append(keys, k)
		sum += v
		if k == "c" {
			c.Delete("c")
		}
	}
	if got := strings.Join(keys, ","); got != "b,c,a" || sum != 6 {
		t.Fatalf("All yielded %s (sum %d), want b,c,a (6)", got, sum)
	}
	c.Put("c", 3)
	c.Put("d", 4) // full: b, still the least recently used, goes
	if _, ok := c.Get("b"); ok {
		t.Fatal("b survived: All made it recent")
	}
	for range c.All() {
		break // stopping early is allowed
	}
	if c.Len() != 3 {
		t.Fatalf("Len = %d, want 3", c.Len())
	}
}
