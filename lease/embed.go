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
	// means "1h". etcd's own default is no compaction at all.
	CompactionRetention string
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

// Embedded is a running embedded etcd member.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
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
	ec.AutoCompactionRetention = orDefault(cfg.CompactionRetention, "1h")
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
	return &Embedded{etcd: e, endpoints: []string{client.String()}}, nil
}

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
