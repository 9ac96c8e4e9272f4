package lease

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config configures a [Store]. The zero value of each field means its
// default.
type Config struct {
	// Endpoints are the etcd client URLs: an external cluster, or the
	// embedded member's [Embedded.Endpoints]. Required.
	Endpoints []string
	// Prefix is prepended to every key; empty means "/fcd/". Two fcd
	// deployments sharing one etcd cluster must use different prefixes.
	Prefix string
	// DialTimeout bounds establishing the first connection; zero means 5s.
	DialTimeout time.Duration
	// OpTimeout bounds every single etcd read; zero means 2s. When it
	// expires the operation fails with ErrUnavailable.
	OpTimeout time.Duration
	// WriteTimeout bounds every write transaction of a call's life (a
	// group commit, the grant of a record's retention lease); zero means
	// 900ms, so that without a quorum a write fails closed
	// (ErrUnavailable) within a second: etcd commits in milliseconds, and
	// a caller can retry or read back what a timed-out write did.
	WriteTimeout time.Duration
	// ProbeInterval and ProbeTimeout drive the endpoint guard (see
	// endpoints.go) when there are several endpoints: each member is
	// probed every ProbeInterval and left out of the endpoints requests go
	// to while it does not answer within ProbeTimeout. Zero means
	// DefaultProbeInterval, DefaultProbeTimeout; a negative interval turns
	// the guard off.
	ProbeInterval, ProbeTimeout time.Duration
	// Logger receives store events; nil means slog.Default().
	Logger *slog.Logger
	// TLS, when set, is the client TLS configuration for https endpoints:
	// the CA that signed the members' certificates and, for a cluster that
	// authenticates clients, this client's certificate.
	TLS *tls.Config
	// Quota is the backend quota (bytes) the etcd members run with, shown
	// by [Store.Health]: etcd does not tell its clients, so it is what the
	// embedded member was started with ([Embedded.Quota]) or what the
	// operator says an external cluster runs with. Zero means unknown.
	Quota int64
	// Now is the store's clock: every time it records (registration,
	// update and expiry times, retirement deadlines) is read from it. Nil
	// means time.Now.
	Now func() time.Time
	// MaxBatch bounds the writes group-committed in one etcd transaction
	// (see commit.go); zero means [DefaultMaxBatch], 1 sends every write
	// alone.
	MaxBatch int
	// MaxInFlight bounds the write transactions under way at once; zero
	// means [DefaultMaxInFlight]. Writes that find every slot busy queue
	// and go in the next batch.
	MaxInFlight int
}

// Validate reports a configuration [Open] refuses: no endpoints, an empty
// endpoint, or a negative timeout.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("lease: no etcd endpoints"))
	}
	for i, e := range c.Endpoints {
		if strings.TrimSpace(e) == "" {
			errs = append(errs, fmt.Errorf("lease: etcd endpoint %d is empty", i))
		}
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("lease: negative dial timeout %s", c.DialTimeout))
	}
	if c.Quota < 0 {
		errs = append(errs, fmt.Errorf("lease: negative quota %d", c.Quota))
	}
	if c.OpTimeout < 0 || c.WriteTimeout < 0 || c.ProbeTimeout < 0 {
		errs = append(errs, fmt.Errorf("lease: negative operation timeout %s", min(c.OpTimeout, c.WriteTimeout, c.ProbeTimeout)))
	}
	if c.MaxBatch < 0 || c.MaxBatch > maxTxnOps/2 {
		errs = append(errs, fmt.Errorf("lease: batch size %d is not within 0-%d", c.MaxBatch, maxTxnOps/2))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("lease: negative in-flight bound %d", c.MaxInFlight))
	}
	return errors.Join(errs...)
}

// Store is the etcd-backed store. It is safe for concurrent use; replicas
// of authzd share state only through it.
type Store struct {
	cli       *clientv3.Client
	k         keys
	opTimeout time.Duration
	// writeTimeout bounds the writes of a call's life (writeOp).
	writeTimeout time.Duration
	quota        int64
	// tls is the client TLS configuration (nil: plain), which the
	// exposure probe dials without the certificate.
	tls       *tls.Config
	log       *slog.Logger
	now       func() time.Time
	retention retention
	cache     immutableCache
	commits   *committer
	guard     *endpointGuard // nil with one endpoint
	// reach explains, for the log, why etcd does not answer.
	reach     *reachability
	stopGuard context.CancelFunc
	guardDone chan struct{}
}

// Open connects to etcd. It does not wait for etcd to be reachable: a
// store whose etcd is down opens, and every operation fails closed with
// ErrUnavailable until etcd answers.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	prefix := orDefault(cfg.Prefix, "/fcd/")
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = 5 * time.Second
	}
	op := cfg.OpTimeout
	if op <= 0 {
		op = 2 * time.Second
	}
	write := cfg.WriteTimeout
	if write <= 0 {
		write = 900 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	ccfg := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		TLS:         cfg.TLS,
		DialTimeout: dial,
		Context:     ctx,
		Logger:      zap.NewNop(),
		// Keepalives notice a dead connection without waiting for a
		// request (gRPC allows no less than 10 s; the endpoint guard
		// notices a member that stopped answering much sooner).
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, fmt.Errorf("lease: etcd client: %w", err)
	}
	commits := &committer{
		cli: cli, timeout: write,
		maxBatch: orDefaultInt(cfg.MaxBatch, DefaultMaxBatch),
		maxSlots: orDefaultInt(cfg.MaxInFlight, DefaultMaxInFlight),
	}
	s := &Store{cli: cli, k: keys{prefix}, opTimeout: op, writeTimeout: write, quota: cfg.Quota, tls: cfg.TLS, log: log, now: now, commits: commits,
		reach: &reachability{endpoints: slices.Clone(cfg.Endpoints)}}
	if len(cfg.Endpoints) > 1 && cfg.ProbeInterval >= 0 {
		g, err := newEndpointGuard(cli, ccfg, keys{prefix}.ping(), cmp.Or(cfg.ProbeInterval, DefaultProbeInterval), cmp.Or(cfg.ProbeTimeout, DefaultProbeTimeout), log)
		if err != nil {
			cli.Close()
			return nil, fmt.Errorf("lease: etcd probe client: %w", err)
		}
		gctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		s.guard, s.stopGuard, s.guardDone = g, stop, make(chan struct{})
		go func() {
			defer close(s.guardDone)
			g.run(gctx)
		}()
	}
	return s, nil
}

// Endpoints returns the etcd endpoints requests go to now and all those
// configured: they differ while the endpoint guard keeps a member that
// does not answer out.
func (s *Store) Endpoints() (answering, all []string) {
	if s.guard == nil {
		eps := s.cli.Endpoints()
		return eps, eps
	}
	return s.guard.status()
}

func orDefaultInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// CommitStats reports the group committer's work (see commit.go).
func (s *Store) CommitStats() CommitStats { return s.commits.stats() }

// txn commits one conditional write through the group committer.
func (s *Store) txn(ctx context.Context, t txn) (*clientv3.TxnResponse, error) {
	return s.commits.commit(ctx, t)
}

// Close releases the connection to etcd. The writes of a group commit
// under way get etcd's answer first; those still queued, and any write
// after Close, fail with [ErrClosed]. No goroutine of the store is left
// when Close returns.
func (s *Store) Close() error {
	s.commits.close()
	if s.guard != nil {
		s.stopGuard()
		<-s.guardDone
		s.guard.close()
	}
	return s.cli.Close()
}

// Ping reports whether etcd answers a linearizable read, which needs a
// quorum. It is what /readyz asks.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.Revision(ctx)
	return err
}

func (s *Store) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(clientv3.WithRequireLeader(ctx), s.opTimeout)
}

// writeOp is op for a write outside the committer on a call's path.
func (s *Store) writeOp(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(clientv3.WithRequireLeader(ctx), s.writeTimeout)
}

// wrap turns an etcd error into the store's vocabulary. ctx is the
// caller's context: if it ended, the caller gave up and gets ctx.Err().
// Otherwise the error is classified by etcd's own type (rpctypes, see
// classify): a full store, refused credentials, a corrupt cluster, a
// request too large and a compacted revision each have their sentinel in
// package record; anything else means etcd did not answer (in time, or
// with a leader) and the caller gets ErrUnavailable.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("lease: %s: %w", op, cerr)
	}
	if errors.Is(err, ErrClosed) {
		return fmt.Errorf("lease: %s: %w", op, err)
	}
	switch kind := classify(err); kind {
	case record.ErrTooLarge:
		return fmt.Errorf("lease: %s: %w", op, record.ErrTooLarge)
	case record.ErrStoreFull:
		// Not a reachability problem: say so, and what to do, in the
		// log (the API answers store-full without the store's text).
		s.log.Error("etcd refused a write: its database reached the backend quota (NOSPACE alarm); free space with authzd store compact, defrag, then alarm disarm (docs/operations.md)",
			"op", op, "quota", s.quota, "err", err)
		return fmt.Errorf("lease: %s: %w: %v", op, record.ErrStoreFull, err)
	case record.ErrStoreDenied:
		s.log.Error("etcd refused fcd's credentials: check the client certificate (--etcd-cert) and the etcd role of fcd's user on its prefix; failing closed",
			"op", op, "endpoints", s.reach.endpoints, "err", err)
		return fmt.Errorf("lease: %s: %w: %v", op, record.ErrStoreDenied, err)
	case record.ErrStoreCorrupt:
		s.log.Error("etcd reports a corrupt cluster (CORRUPT alarm): nothing it answers can be trusted; restore the member from a snapshot (docs/operations.md)",
			"op", op, "endpoints", s.reach.endpoints, "err", err)
		return fmt.Errorf("lease: %s: %w: %v", op, record.ErrStoreCorrupt, err)
	case record.ErrCompacted:
		return fmt.Errorf("%w: %s: %w: %v", record.ErrUnavailable, op, record.ErrCompacted, err)
	}
	// The client's own error is most often "context deadline exceeded":
	// say which endpoints and why.
	reason := s.reach.explain(ctx)
	s.log.Warn("etcd operation failed", "op", op, "endpoints", s.reach.endpoints, "reason", reason, "err", err)
	return fmt.Errorf("%w: %s: %v: %s", record.ErrUnavailable, op, err, reason)
}

// classify names the kind of an etcd error by its type: the record
// sentinel it stands for, or nil when it only says that etcd did not
// answer (a timeout, no leader, a lost connection). The client hands over
// an rpctypes.EtcdError for errors it knows and the gRPC status for
// others; both are matched, and so are the codes of errors the client
// does not name (a proxy's or a newer server's), which carry no text to
// rely on.
func classify(err error) error {
	oneOf := func(targets ...error) bool {
		return slices.ContainsFunc(targets, func(t error) bool { return errors.Is(err, t) })
	}
	switch {
	case oneOf(rpctypes.ErrRequestTooLarge, rpctypes.ErrGRPCRequestTooLarge):
		return record.ErrTooLarge
	case oneOf(rpctypes.ErrNoSpace, rpctypes.ErrGRPCNoSpace):
		return record.ErrStoreFull
	case oneOf(rpctypes.ErrCorrupt, rpctypes.ErrGRPCCorrupt):
		return record.ErrStoreCorrupt
	case oneOf(rpctypes.ErrCompacted, rpctypes.ErrGRPCCompacted):
		return record.ErrCompacted
	case oneOf(rpctypes.ErrPermissionDenied, rpctypes.ErrGRPCPermissionDenied,
		rpctypes.ErrAuthFailed, rpctypes.ErrGRPCAuthFailed,
		rpctypes.ErrInvalidAuthToken, rpctypes.ErrGRPCInvalidAuthToken,
		rpctypes.ErrUserEmpty, rpctypes.ErrGRPCUserEmpty,
		rpctypes.ErrUserNotFound, rpctypes.ErrGRPCUserNotFound):
		return record.ErrStoreDenied
	}
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated:
		return record.ErrStoreDenied
	case codes.DataLoss:
		return record.ErrStoreCorrupt
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.PermissionDenied, codes.Unauthenticated:
			return record.ErrStoreDenied
		case codes.DataLoss:
			return record.ErrStoreCorrupt
		}
	}
	return nil
}
