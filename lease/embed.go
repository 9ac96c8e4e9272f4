package lease

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// EmbedConfig configures the embedded single-node etcd that authzd starts
// when no external endpoints are given.
type EmbedConfig struct {
	// Dir is the etcd data directory. Required.
	Dir string
	// ClientURL is where the member serves clients; empty means
	// http://127.0.0.1:2379. Only loopback addresses are accepted: the
	// embedded member is a private detail of one authzd.
	ClientURL string
	// PeerURL is the member's peer address; empty means
	// http://127.0.0.1:2380 (loopback only, as above).
	PeerURL string
	// CompactionRetention is the periodic auto-compaction window; empty
	// means "1h". etcd's own default is no compaction at all, under which
	// every revision of every record is kept and the database only grows.
	// Compaction frees the space of revisions older than the window; the
	// freed pages are reused (DBSizeInUse falls), the file does not shrink.
	CompactionRetention string
	// QuotaBytes is the member's backend quota: once its database file
	// reaches it, etcd raises the NOSPACE alarm and refuses every write
	// until space is freed and the alarm disarmed. Zero means
	// DefaultQuotaBytes (2 GiB, etcd's own default, written explicitly so
	// that it is reported and sized against: docs/capacity.md).
	QuotaBytes int64
	// LogLevel is etcd's zap log level; empty means "warn".
	LogLevel string
	// LogFile receives etcd's own (zap, JSON) log; empty means stderr.
	// etcd logs at error level on every clean shutdown, so a server
	// usually sends these lines to a file beside the data.
	LogFile string
	// StartTimeout bounds the wait for the member to be ready; zero means
	// one minute.
	StartTimeout time.Duration
	// Name and InitialCluster ("name=peerURL,...") make the member one of
	// a cluster of embedded members, for tests of quorum loss; empty means
	// a single-member cluster named "fcd". The members of a new cluster
	// must be started together: each is ready only once a quorum is.
	Name           string
	InitialCluster string
	// ClientTLS, when set, makes the member serve its clients over TLS
	// (an https ClientURL), e.g. with client certificate authentication:
	// for tests of an external cluster that requires TLS.
	ClientTLS *transport.TLSInfo
}

// DefaultQuotaBytes is the embedded member's backend quota when
// EmbedConfig.QuotaBytes is zero: 2 GiB.
const DefaultQuotaBytes = 2 << 30

// DefaultCompactionRetention is the embedded member's periodic
// auto-compaction window when EmbedConfig.CompactionRetention is empty.
const DefaultCompactionRetention = "1h"

// Embedded is a running embedded etcd member.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
	quota     int64
}

// StartEmbedded starts a single-node etcd in cfg.Dir and waits until it
// serves clients. A second start on the same directory resumes its data.
func StartEmbedded(ctx context.Context, cfg EmbedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("lease: embedded etcd needs a data directory")
	}
	client, err := loopbackURL(cfg.ClientURL, "http://127.0.0.1:2379", cfg.ClientTLS != nil)
	if err != nil {
		return nil, fmt.Errorf("lease: embedded etcd client URL: %w", err)
	}
	peer, err := loopbackURL(cfg.PeerURL, "http://127.0.0.1:2380", false)
	if err != nil {
		return nil, fmt.Errorf("lease: embedded etcd peer URL: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: embedded etcd dir: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = orDefault(cfg.Name, "fcd")
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*client}
	ec.AdvertiseClientUrls = []url.URL{*client}
	ec.ListenPeerUrls = []url.URL{*peer}
	if cfg.ClientTLS != nil {
		ec.ClientTLSInfo = *cfg.ClientTLS
	}
	ec.AdvertisePeerUrls = []url.URL{*peer}
	ec.InitialCluster = orDefault(cfg.InitialCluster, ec.InitialClusterFromName(ec.Name))
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = orDefault(cfg.CompactionRetention, DefaultCompactionRetention)
	ec.QuotaBackendBytes = cfg.QuotaBytes
	if ec.QuotaBackendBytes <= 0 {
		ec.QuotaBackendBytes = DefaultQuotaBytes
	}
	ec.LogLevel = orDefault(cfg.LogLevel, "warn")
	ec.LogOutputs = []string{orDefault(cfg.LogFile, "stderr")}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("lease: start embedded etcd: %w", err)
	}
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("lease: embedded etcd failed: %w", err)
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("lease: embedded etcd not ready after %s", timeout)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	return &Embedded{etcd: e, endpoints: []string{client.String()}, quota: ec.QuotaBackendBytes}, nil
}

// Quota returns the backend quota the member runs with, in bytes: what to
// pass as Config.Quota.
func (e *Embedded) Quota() int64 { return e.quota }

// Endpoints returns the client URLs to pass to [Open].
func (e *Embedded) Endpoints() []string { return e.endpoints }

// Close stops the member; its data stays in the directory.
func (e *Embedded) Close() { e.etcd.Close() }

func loopbackURL(s, def string, secure bool) (*url.URL, error) {
	u, err := url.Parse(orDefault(s, def))
	if err != nil {
		return nil, err
	}
	switch u.Hostname() {
	case "127.0.0.1", "::1", "localhost":
	default:
		return nil, fmt.Errorf("%s is not a loopback address", u.Host)
	}
	switch {
	case secure && u.Scheme != "https":
		return nil, fmt.Errorf("scheme %q: a member serving TLS needs an https URL", u.Scheme)
	case !secure && u.Scheme != "http":
		return nil, fmt.Errorf("scheme %q: the embedded member speaks plain http on loopback", u.Scheme)
	}
	return u, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
