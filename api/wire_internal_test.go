package api

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/record"
)

var update = flag.Bool("update", false, "rewrite testdata/wire from the REST types' encoding")

// notOnWire are the record fields no REST answer shows, deliberately:
// the store's bookkeeping (etcd revisions and the cluster id), filled on
// read for the use cases; and the policy bundle's revision a decision was
// made under, which goes to the decision logs and the trail (the REST
// answer names the policy set by its digest).
var notOnWire = map[string]bool{
	"Epoch.StateRevision": true, "Epoch.Revision": true, "Snapshot.Revision": true, "Certificate.Revision": true,
	"Lease.Cluster": true, "Lease.Closed": true, "Lease.Claim.Revision": true,
	"Formation.Decision.PolicyRevision": true, "FormationPage.Formations.Decision.PolicyRevision": true,
}

// wireCases are the records a REST answer is made of, each with its
// converter to the REST type.
var wireCases = []struct {
	name    string
	record  any // a pointer to a zero value of the record type
	convert func(any) any
}{
	{"formation", &record.Formation{}, func(v any) any { return newWireFormation(v.(*record.Formation)) }},
	{"formation-page", &authz.FormationPage{}, func(v any) any { return newWireFormationPage(v.(*authz.FormationPage)) }},
	{"epoch", &record.Epoch{}, func(v any) any { return newWireEpoch(v.(*record.Epoch)) }},
	{"lease", &record.Lease{}, func(v any) any { return newWireLease(v.(*record.Lease)) }},
	{"snapshot", &record.Snapshot{}, func(v any) any { return newWireSnapshot(v.(*record.Snapshot)) }},
	{"full-tool", &record.FullTool{}, func(v any) any { return newWireFullTool(*v.(*record.FullTool)) }},
	{"certificate", &record.Certificate{}, func(v any) any { return newWireCertificate(v.(*record.Certificate)) }},
	{"grant", &authz.Grant{}, func(v any) any { return newWireGrant(v.(*authz.Grant)) }},
	{"comparison", &authz.Comparison{}, func(v any) any { return newWireComparison(v.(*authz.Comparison)) }},
}

// TestWireMapsEveryRecordField: every field of every record a REST answer
// is made of — at any depth, but for notOnWire's — reaches the answer:
// the record is filled with a distinct value in every field, and changing
// any one field alone changes the answer's bytes. A field added to a
// record (or an embedded one) and not mapped by its converter in wire.go
// fails here, by name, instead of silently staying off the API (or, were
// the record encoded, silently joining it).
func TestWireMapsEveryRecordField(t *testing.T) {
	for _, tc := range wireCases {
		t.Run(tc.name, func(t *testing.T) {
			typ := reflect.TypeOf(tc.record).Elem()
			encode := func(perturb int) ([]byte, []string) {
				v := reflect.New(typ)
				f := filler{perturb: perturb}
				f.fill(v.Elem(), typ.Name())
				b, err := json.Marshal(tc.convert(v.Interface()))
				if err != nil {
					t.Fatal(err)
				}
				return b, f.paths
			}
			base, paths := encode(-1)
			if len(paths) == 0 {
				t.Fatal("no field filled")
			}
			for i, path := range paths {
				changed, _ := encode(i)
				switch reached := !bytes.Equal(changed, base); {
				case !reached && !notOnWire[path]:
					t.Errorf("%s does not reach the REST answer: map it in api/wire.go (and api/openapi.yaml), or list it in notOnWire", path)
				case reached && notOnWire[path]:
					t.Errorf("%s reaches the REST answer but is listed in notOnWire", path)
				}
			}
		})
	}
}

// TestWireRequestsReachTheRecords: every member of a report's admission
// facts and failure reaches the record the use case gets, and each
// record field is set by one member (the request types have exactly as
// many fields as the records, and each changes the record).
func TestWireRequestsReachTheRecords(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wire    any
		record  any
		convert func(any) any
	}{
		{"admission facts", &wireAdmissionFacts{}, &record.Admission{}, func(v any) any { return v.(*wireAdmissionFacts).admission() }},
		{"failure", &wireFailure{}, &record.Failure{}, func(v any) any { return v.(*wireFailure).failure() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			typ := reflect.TypeOf(tc.wire).Elem()
			convert := func(perturb int) (any, []string) {
				v := reflect.New(typ)
				f := filler{perturb: perturb}
				f.fill(v.Elem(), typ.Name())
				return tc.convert(v.Interface()), f.paths
			}
			base, paths := convert(-1)
			for i, path := range paths {
				if changed, _ := convert(i); reflect.DeepEqual(changed, base) {
					t.Errorf("%s does not reach the record", path)
				}
			}
			var rf filler
			rf.fill(reflect.ValueOf(tc.record).Elem(), "")
			if len(rf.paths) != len(paths) {
				t.Errorf("the record has %d fields %v, the request %d %v: map each", len(rf.paths), rf.paths, len(paths), paths)
			}
		})
	}
}

// TestWireGolden: the REST encoding of every fully filled record (as
// TestWireMapsEveryRecordField fills it) is byte for byte
// testdata/wire/<name>.json: the members, their order, what is omitted
// and what is null change only on purpose (-update rewrites them, and
// the diff shows the change a client sees).
func TestWireGolden(t *testing.T) {
	for _, tc := range wireCases {
		t.Run(tc.name, func(t *testing.T) {
			typ := reflect.TypeOf(tc.record).Elem()
			v := reflect.New(typ)
			(&filler{perturb: -1}).fill(v.Elem(), typ.Name())
			got, err := json.MarshalIndent(tc.convert(v.Interface()), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", "wire", tc.name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./api -run WireGolden -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the REST encoding of %s changed:\n got %s\nwant %s", tc.name, got, want)
			}
		})
	}
}

// filler fills a value's every exported field, at any depth, with a
// distinct value, recording each leaf's path (Type.Field.Field); the
// leaf numbered perturb gets another value than its usual one.
type filler struct {
	n       int
	perturb int
	paths   []string
}

var (
	timeType = reflect.TypeOf(time.Time{})
	rawType  = reflect.TypeOf(json.RawMessage(nil))
)

func (f *filler) next(path string) int {
	f.paths = append(f.paths, path)
	n := f.n
	f.n++
	if n == f.perturb {
		return n + 1000
	}
	return n + 1
}

func (f *filler) fill(v reflect.Value, path string) {
	switch t := v.Type(); {
	case t == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 1, 1, 0, 0, f.next(path), 0, time.UTC)))
	case t == rawType:
		v.Set(reflect.ValueOf(json.RawMessage(fmt.Sprintf(`{"k":%d}`, f.next(path)))))
	case t.Kind() == reflect.String:
		v.SetString(fmt.Sprintf("s%d", f.next(path)))
	case t.Kind() == reflect.Bool:
		v.SetBool(f.next(path) < 1000)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		v.SetInt(int64(f.next(path)))
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		v.SetUint(uint64(f.next(path)))
	case t.Kind() == reflect.Pointer:
		v.Set(reflect.New(t.Elem()))
		f.fill(v.Elem(), path)
	case t.Kind() == reflect.Slice:
		v.Set(reflect.MakeSlice(t, 1, 1))
		f.fill(v.Index(0), path)
	case t.Kind() == reflect.Map:
		m := reflect.MakeMap(t)
		key := reflect.ValueOf(fmt.Sprintf("k%d", f.n)).Convert(t.Key())
		val := reflect.New(t.Elem()).Elem()
		if t.Elem().Kind() == reflect.Interface {
			val.Set(reflect.ValueOf(fmt.Sprintf("v%d", f.next(path))))
		} else {
			f.fill(val, path)
		}
		m.SetMapIndex(key, val)
		v.Set(m)
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			sf := t.Field(i)
			if !sf.IsExported() {
				continue
			}
			p := path + "." + sf.Name
			if sf.Anonymous {
				p = path // an embedded record's fields are its embedder's
			}
			f.fill(v.Field(i), strings.TrimPrefix(p, "."))
		}
	}
}
