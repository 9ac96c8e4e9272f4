package lease_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// TestHealthReportsSizeQuotaAndAlarms fills a member with a small quota
// until etcd refuses writes, and checks that Health shows the sizes, the
// configured quota and the NOSPACE alarm while it is active, and no alarm
// once an operator freed the space and disarmed it.
func TestHealthReportsSizeQuotaAndAlarms(t *testing.T) {
	const quota = 4 << 20
	m := etcdtest.StartWith(t, func(c *lease.EmbedConfig) { c.QuotaBytes = quota })
	s := m.Store(t, "/health/")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	steps := []struct {
		note   string
		do     func(t testing.TB)
		alarms []string
		// minSize is the least DBSize expected.
		minSize int64
	}{
		{note: "fresh", alarms: []string{}},
		{note: "full", do: m.FillToQuota, alarms: []string{lease.AlarmNoSpace}, minSize: quota / 2},
		{note: "freed and disarmed", do: m.Disarm, alarms: []string{}},
	}
	for _, st := range steps {
		t.Run(st.note, func(t *testing.T) {
			if st.do != nil {
				st.do(t)
			}
			h, err := s.Health(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h.Quota != quota || h.DBSize < st.minSize || h.DBSize <= 0 || h.DBSizeInUse <= 0 || h.DBSizeInUse > h.DBSize {
				t.Fatalf("health %+v: want quota %d, 0 < in use <= size, size >= %d", h, quota, st.minSize)
			}
			if !slices.Equal(h.Alarms, st.alarms) {
				t.Fatalf("alarms %v, want %v", h.Alarms, st.alarms)
			}
			if h.HasAlarm(lease.AlarmNoSpace) != (len(st.alarms) > 0) {
				t.Fatalf("HasAlarm(NOSPACE) disagrees with %v", h.Alarms)
			}
		})
	}

	m.Stop()
	if _, err := s.Health(ctx); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("health of a stopped member: %v, want ErrUnavailable", err)
	}
}
