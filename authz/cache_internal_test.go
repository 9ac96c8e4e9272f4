package authz

import "testing"

func TestBoundedMapStartsOverWhenFull(t *testing.T) {
	b := boundedMap[int]{max: 2}
	b.put("a", 1)
	b.put("b", 2)
	if v, ok := b.get("a"); !ok || v != 1 {
		t.Fatalf("a = %d %v", v, ok)
	}
	b.put("c", 3) // full: starts over with c alone
	if _, ok := b.get("a"); ok {
		t.Fatal("a survived the reset")
	}
	if v, ok := b.get("c"); !ok || v != 3 {
		t.Fatalf("c = %d %v", v, ok)
	}
	b.delete("c")
	if _, ok := b.get("c"); ok {
		t.Fatal("c survived delete")
	}
}
