package lease_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestStoreFullRecoversThroughItsMethods: on a member filled to its quota
// a store write fails with record.ErrStoreFull (not ErrUnavailable), and
// the store's own maintenance — Compact, Defrag, then DisarmAlarms —
// frees the space and makes writes work again; Status shows the alarm
// and the quota, SnapshotSave a non-empty snapshot.
func TestStoreFullRecoversThroughItsMethods(t *testing.T) {
	const quota = 4 << 20
	m := etcdtest.StartWith(t, func(c *lease.EmbedConfig) { c.QuotaBytes = quota })
	s := m.Store(t, "/maint/")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	m.FillToQuota(t)
	// The filler's history is what compaction frees: drop the keys (a
	// delete is allowed while NOSPACE is raised).
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Delete(ctx, "/fill/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.RegisterEpoch(ctx, testManifest(t, "full", "1", "public"))
	if !errors.Is(err, record.ErrStoreFull) || errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("a write to a full store: %v, want ErrStoreFull alone", err)
	}
	st, err := s.Status(ctx)
	if err != nil || len(st.Members) != 1 || st.Members[0].Quota != quota || len(st.Alarms) != 1 || st.Alarms[0].Alarm != lease.AlarmNoSpace {
		t.Fatalf("status of a full store: %+v, %v", st, err)
	}
	var snap bytes.Buffer
	if info, err := s.SnapshotSave(ctx, &snap); err != nil || info.Bytes != int64(snap.Len()) || info.Bytes == 0 {
		t.Fatalf("snapshot of a full store: %+v, %v", info, err)
	}

	if _, err := s.Compact(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Compact(ctx, 0); err != nil {
		t.Fatalf("compacting again at the same revision: %v", err)
	}
	res, err := s.Defrag(ctx)
	if err != nil || len(res) != 1 || res[0].After >= res[0].Before {
		t.Fatalf("defrag: %+v, %v", res, err)
	}
	disarmed, err := s.DisarmAlarms(ctx)
	if err != nil || len(disarmed) != 1 || disarmed[0].Alarm != lease.AlarmNoSpace {
		t.Fatalf("disarm: %+v, %v", disarmed, err)
	}
	if alarms, err := s.Alarms(ctx); err != nil || len(alarms) != 0 {
		t.Fatalf("alarms after the recovery: %+v, %v", alarms, err)
	}
	if _, _, err := s.RegisterEpoch(ctx, testManifest(t, "full", "1", "public")); err != nil {
		t.Fatalf("a write after the recovery: %v", err)
	}
	t.Logf("defrag %d -> %d bytes", res[0].Before, res[0].After)
}

// TestStoreDeniedByEtcd: a store whose etcd requires authentication and
// is given no credentials fails closed with record.ErrStoreDenied — not
// ErrUnavailable, which would invite retries that cannot succeed.
func TestStoreDeniedByEtcd(t *testing.T) {
	m := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "secret"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enable etcd auth: %v", err)
		}
	}
	s := m.Store(t, "/denied/")
	if err := s.Ping(ctx); !errors.Is(err, record.ErrStoreDenied) || errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("ping without credentials: %v, want ErrStoreDenied", err)
	}
	if _, _, err := s.RegisterEpoch(ctx, testManifest(t, "denied", "1", "public")); !errors.Is(err, record.ErrStoreDenied) {
		t.Fatalf("write without credentials: %v, want ErrStoreDenied", err)
	}
}
