package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// TestAdmissionOnAClusterFailsClosedWithoutQuorum runs two authzd
// replicas on a real three-member etcd cluster, each talking to a
// different member only. Replica A admits; when two members stop, the
// member A talks to is up but has no quorum, and A admits nothing (and
// forms nothing) — fail closed, never open; when one member comes back the
// pending call is admitted exactly once. A drain committed through replica
// B's member then refuses A's next admission: the order is the cluster's,
// not a member's.
func TestAdmissionOnAClusterFailsClosedWithoutQuorum(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx := context.Background()
	storeA := c.Members[0].Store(t, prefix)
	storeB := c.Members[2].Store(t, prefix)

	epoch := registerExample(t, storeB, "v1.4", nil)
	snap, _, err := storeA.CreateSnapshot(ctx, nil) // sees B's registration
	if err != nil || len(snap.Tools) == 0 {
		t.Fatalf("snapshot through another member: %+v %v", snap, err)
	}

	_, iss := newIssuer(t, storeA, jwa.EdDSA)
	forms := authztest.New(t, authz.Config{Store: storeA, Decider: defaultSet(t), Issuer: iss, Logger: quiet})
	form := func(repo string) (*record.Formation, error) {
		return forms.Formations.Form(ctx, authz.FormRequest{Snapshot: snap.ID, Session: "s-" + repo, Tool: "github/get_repository",
			Arguments: json.RawMessage(`{"owner":"o","repo":"` + repo + `"}`), Host: "host-1"})
	}
	// admit retries while the cluster settles (a leader election, the
	// signing key published again after the outage).
	// A draining source is an answer: it is returned, not retried.
	admit := func(id string) (*authz.Grant, error) {
		t.Helper()
		var answer error
		a := testutil.Await(t, 2*time.Minute, "the admission of "+id+" while the cluster settles", func() (*authz.Grant, error) {
			a, err := forms.Admissions.Admit(ctx, id)
			if answer = err; errors.Is(err, authz.ErrSourceDraining) {
				return nil, nil
			}
			return a, err
		})
		return a, answer
	}

	first, err := form("first")
	if err != nil {
		t.Fatal(err)
	}
	pending, err := form("pending")
	if err != nil {
		t.Fatal(err)
	}
	late, err := form("late")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admit(first.ID); err != nil {
		t.Fatalf("admission with the whole cluster: %v", err)
	}

	c.Members[1].Stop()
	c.Members[2].Stop()
	if _, err := forms.Admissions.Admit(ctx, pending.ID); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("admission without quorum: %v, want ErrUnavailable", err)
	}
	if _, err := form("no-quorum"); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("formation without quorum: %v, want ErrUnavailable", err)
	}
	if err := authztest.Registry(t, authz.RegistryConfig{Store: storeA, Manifests: nil, Logger: quiet}).Ready(ctx); err == nil {
		t.Fatal("ready (/readyz) without quorum")
	}

	c.Members[1].Restart()
	a, err := admit(pending.ID)
	if err != nil {
		t.Fatalf("admission after quorum came back: %v", err)
	}
	again, err := forms.Admissions.Admit(ctx, pending.ID)
	if err != nil || again.Lease != a.Lease {
		t.Fatalf("the pending call was admitted twice: %v / %v (%v)", a.Lease, again, err)
	}
	ep, err := storeA.GetEpoch(ctx, epoch)
	if err != nil || ep.ActiveLeases != 2 {
		t.Fatalf("markers after the outage: %+v %v, want 2", ep, err)
	}

	c.Members[2].Restart()
	drained := testutil.Await(t, 2*time.Minute, "the drain through member 2", func() (record.State, error) { return storeB.Drain(ctx, epoch) })
	if drained != record.StateDraining {
		t.Fatalf("drain through member 2: %s", drained)
	}
	if _, err := admit(late.ID); !errors.Is(err, authz.ErrSourceDraining) {
		t.Fatalf("admission through member 0 after a drain through member 2: %v, want ErrSourceDraining", err)
	}
}
