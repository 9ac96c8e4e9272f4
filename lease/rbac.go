package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// AccessGrant is what [GrantPrefix] set up on a cluster.
type AccessGrant struct {
	// User and Role are the etcd user fcd connects as (its client
	// certificate's common name) and the role it holds.
	User string `json:"user"`
	Role string `json:"role"`
	// Prefix is the key range the role may read and write, [Prefix,
	// the prefix's end): fcd's keys, and nothing else.
	Prefix string `json:"prefix"`
	// AuthEnabled reports whether etcd's authentication is on after the
	// setup; while it is off, every client the cluster lets in may write
	// every key, the role notwithstanding.
	AuthEnabled bool `json:"authEnabled"`
}

// GrantPrefix sets up, through admin (a client of the cluster's root
// user), an etcd user that may read and write the keys under prefix and
// nothing else: a role of the user's name granted readwrite on the prefix
// range, and the user, without a password (it authenticates by the common
// name of its client certificate), holding it. What exists already is
// kept. With enableAuth it also turns etcd's authentication on, first
// making sure of the user root with the role root that etcd requires —
// after that every client needs a user, so enable it once the cluster's
// other clients have theirs.
func GrantPrefix(ctx context.Context, admin ClientAccess, user, prefix string, enableAuth bool) (AccessGrant, error) {
	if user == "" || !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") {
		return AccessGrant{}, fmt.Errorf("lease: grant: a user and a prefix between slashes are needed (got %q, %q)", user, prefix)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: admin.Endpoints, TLS: admin.TLS, DialTimeout: 5 * time.Second, Context: ctx, Logger: zap.NewNop()})
	if err != nil {
		return AccessGrant{}, fmt.Errorf("lease: grant: etcd client: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	g := AccessGrant{User: user, Role: user, Prefix: prefix}
	noPassword := &clientv3.UserAddOptions{NoPassword: true}
	steps := []struct {
		what string
		do   func() error
	}{
		{"add role " + g.Role, func() error { _, err := cli.RoleAdd(ctx, g.Role); return err }},
		{"grant readwrite on " + prefix, func() error {
			_, err := cli.RoleGrantPermission(ctx, g.Role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"add user " + user, func() error { _, err := cli.UserAddWithOptions(ctx, user, "", noPassword); return err }},
		{"grant role " + g.Role + " to " + user, func() error { _, err := cli.UserGrantRole(ctx, user, g.Role); return err }},
	}
	if enableAuth {
		steps = append(steps, []struct {
			what string
			do   func() error
		}{
			{"add role root", func() error { _, err := cli.RoleAdd(ctx, "root"); return err }},
			{"add user root", func() error { _, err := cli.UserAddWithOptions(ctx, "root", "", noPassword); return err }},
			{"grant role root to root", func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err }},
			{"enable authentication", func() error { _, err := cli.AuthEnable(ctx); return err }},
		}...)
	}
	for _, s := range steps {
		if err := s.do(); err != nil && !alreadyDone(err) {
			return g, fmt.Errorf("lease: grant: %s: %w", s.what, err)
		}
	}
	status, err := cli.AuthStatus(ctx)
	if err != nil {
		return g, fmt.Errorf("lease: grant: auth status: %w", err)
	}
	g.AuthEnabled = status.Enabled
	return g, nil
}

// alreadyDone reports an error that says a step's effect is there.
func alreadyDone(err error) bool {
	return errors.Is(err, rpctypes.ErrRoleAlreadyExist) || errors.Is(err, rpctypes.ErrUserAlreadyExist)
}
