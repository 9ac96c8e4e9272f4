package lease_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
)

func TestConfigValidate(t *testing.T) {
	one := []string{"http://127.0.0.1:2379"}
	for _, tc := range []struct {
		note string
		cfg  lease.Config
		// want lists what the error must say, one substring per problem;
		// none means valid.
		want []string
	}{
		{"one endpoint, every default", lease.Config{Endpoints: one}, nil},
		{"everything set", lease.Config{Endpoints: []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"},
			Prefix: "/prod/", DialTimeout: time.Second, OpTimeout: 3 * time.Second, Now: time.Now}, nil},
		{"a prefix without its trailing slash", lease.Config{Endpoints: one, Prefix: "/fcd"}, nil},
		{"no endpoints", lease.Config{}, []string{"lease: no etcd endpoints"}},
		{"empty endpoint list", lease.Config{Endpoints: []string{}}, []string{"lease: no etcd endpoints"}},
		{"an empty endpoint", lease.Config{Endpoints: []string{"http://127.0.0.1:2379", " "}}, []string{"etcd endpoint 1 is empty"}},
		{"negative dial timeout", lease.Config{Endpoints: one, DialTimeout: -time.Second}, []string{"negative dial timeout -1s"}},
		{"negative operation timeout", lease.Config{Endpoints: one, OpTimeout: -time.Millisecond}, []string{"negative operation timeout -1ms"}},
		{"every problem at once", lease.Config{Endpoints: nil, DialTimeout: -1, OpTimeout: -1},
			[]string{"no etcd endpoints", "negative dial timeout", "negative operation timeout"}},
	} {
		t.Run(tc.note, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: nil, want an error saying %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %q does not say %q", err, w)
				}
			}
			// Open refuses what Validate refuses, before dialling anything.
			if s, err := lease.Open(context.Background(), tc.cfg); err == nil || err.Error() != tc.cfg.Validate().Error() {
				if s != nil {
					s.Close()
				}
				t.Errorf("Open: %v, want the Validate error", err)
			}
		})
	}
}

// TestConfigNow: the store reads the time from Config.Now.
func TestConfigNow(t *testing.T) {
	m := etcdtest.Start(t)
	at := time.Date(2031, 2, 3, 4, 5, 6, 0, time.FixedZone("X", 3600))
	s, err := lease.Open(context.Background(), lease.Config{
		Endpoints: m.Endpoints(), Prefix: "/clock/", Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return at },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ep := register(t, s, testManifest(t, "github", "v1.4.0", "private"))
	if !ep.RegisteredAt.Equal(at) || ep.RegisteredAt.Location() != time.UTC {
		t.Fatalf("registered at %v, want %v in UTC from the injected clock", ep.RegisteredAt, at)
	}
}
