package lease

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFootprintConflicts: two writes conflict when one writes a key the
// other reads or writes, single keys and ranges alike; reads never
// conflict with reads.
func TestFootprintConflicts(t *testing.T) {
	put := func(k string) txn { return txn{then: []clientv3.Op{clientv3.OpPut(k, "v")}} }
	for _, tc := range []struct {
		name     string
		in, next txn
		want     bool
	}{
		{"distinct puts", put("/a"), put("/b"), false},
		{"same put", put("/a"), put("/a"), true},
		{"put then delete", put("/a"), txn{then: []clientv3.Op{clientv3.OpDelete("/a")}}, true},
		{"compare reads a put key", put("/a"),
			txn{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("/a"), "=", 1)}, then: []clientv3.Op{clientv3.OpPut("/z", "")}}, true},
		{"prefix compare covers a put key", put("/s/admitted/t/ls_1"),
			txn{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("/s/admitted/t/"), "=", 0).WithPrefix()}}, true},
		{"prefix compare beside a put key", put("/s/admitted/u/ls_1"),
			txn{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("/s/admitted/t/"), "=", 0).WithPrefix()}}, false},
		{"put key in a batch's prefix read", txn{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("/p/"), "=", 0).WithPrefix()}},
			put("/p/x"), true},
		{"else-branch get reads a put key", put("/c"), txn{els: []clientv3.Op{clientv3.OpGet("/c")}}, true},
		{"reads only", txn{els: []clientv3.Op{clientv3.OpGet("/c")}}, txn{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("/c"), "=", 1)}}, false},
		{"from-key delete covers everything after", txn{then: []clientv3.Op{clientv3.OpDelete("/m", clientv3.WithFromKey())}}, put("/n"), true},
		{"a key and its prefix extension are distinct", put("/a"), put("/ab"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f footprint
			f.add(newPending(t.Context(), tc.in))
			if got := f.conflicts(newPending(t.Context(), tc.next)); got != tc.want {
				t.Errorf("conflicts = %v, want %v", got, tc.want)
			}
		})
	}
}
