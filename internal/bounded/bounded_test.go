package bounded

import "testing"

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
