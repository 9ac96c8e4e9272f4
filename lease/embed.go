package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// EmbedConfig configures the embedded single-node etcd that authzd starts
// when no external endpoints are given.
type EmbedConfig struct {
	// Dir is the etcd data directory. Required.
	Dir string
	// ClientURL is where the member serves clients; empty means the URL
	// recorded in the directory by an earlier start (EndpointsFile), else
	// a free loopback port, recorded for the next start and for tools that
	// need it. Only loopback addresses are accepted: the embedded member is
	// a private detail of one authzd.
	ClientURL string
	// PeerURL is the member's peer address; empty means as for ClientURL
	// (loopback only, as above).
	PeerURL string
	// LockTimeout bounds the wait for the data directory's lock, held by
	// another process that runs a member on it; zero means 5 seconds.
	// Past it StartEmbedded fails with ErrDataDirLocked naming the owner.
	LockTimeout time.Duration
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

// CompactionOff as EmbedConfig.CompactionRetention turns the member's
// auto-compaction off: its owner compacts through Store.Compact (as authzd
// does with Store.RunCompactor), which never removes history an audit
// trail has not recorded.
const CompactionOff = "off"

// DefaultCompactionRetention is the embedded member's periodic
// auto-compaction window when EmbedConfig.CompactionRetention is empty.
const DefaultCompactionRetention = "1h"

// Embedded is a running embedded etcd member.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
	quota     int64
	lock      *dirLock
	// failed receives why the member stopped serving by itself; closing
	// ends the goroutine that watches for it (watched), before Close
	// stops the member on purpose.
	failed  chan error
	closing chan struct{}
	watched chan struct{}
}

// EndpointsFile is the file in an embedded member's directory that
// records the URLs it listens on ({"clientURL", "peerURL"}), chosen on its
// first start when not given, and kept for the next ones.
const EndpointsFile = "fcd-embedded.json"

// recordedURLs are the contents of EndpointsFile.
type recordedURLs struct {
	ClientURL string `json:"clientURL"`
	PeerURL   string `json:"peerURL"`
}

// StartEmbedded starts a single-node etcd in cfg.Dir and waits until it
// serves clients. A second start on the same directory resumes its data.
func StartEmbedded(ctx context.Context, cfg EmbedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("lease: embedded etcd needs a data directory")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: embedded etcd dir: %w", err)
	}
	lock, err := lockDir(ctx, cfg.Dir, cmp.Or(cfg.LockTimeout, 5*time.Second))
	if err != nil {
		return nil, err
	}
	e, err := startEmbedded(ctx, cfg)
	if err != nil {
		lock.unlock()
		return nil, err
	}
	e.lock = lock
	e.watch()
	return e, nil
}

// watch starts the goroutine that turns the member's failure into
// Failed's value: an error on etcd's Err channel (a listener that failed
// while serving), or its server stopping by itself (a fatal error of its
// raft loop or its disk, a corruption check). Close ends it first.
func (e *Embedded) watch() {
	e.failed, e.closing, e.watched = make(chan error, 1), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.watched)
		select {
		case <-e.closing:
		case err := <-e.etcd.Err():
			e.failed <- fmt.Errorf("lease: embedded etcd failed: %w", err)
		case <-e.etcd.Server.StopNotify():
			err := errors.New("lease: embedded etcd stopped by itself")
			select { // a listener's error may say why
			case eerr := <-e.etcd.Err():
				err = fmt.Errorf("%w: %w", err, eerr)
			case <-time.After(100 * time.Millisecond):
			}
			e.failed <- err
		}
	}()
}

// Failed delivers, once, why the member stopped serving while it was
// meant to run; nothing is delivered after Close. A server selects on it
// beside its work and exits with the cause: every request would fail
// from then on. etcd's own log (EmbedConfig.LogFile) may say more.
func (e *Embedded) Failed() <-chan error { return e.failed }

// startEmbedded is StartEmbedded once the directory is locked.
func startEmbedded(ctx context.Context, cfg EmbedConfig) (*Embedded, error) {
	urls, err := embeddedURLs(cfg)
	if err != nil {
		return nil, err
	}
	client, err := loopbackURL(urls.ClientURL, cfg.ClientTLS != nil)
	if err != nil {
		return nil, fmt.Errorf("lease: embedded etcd client URL: %w", err)
	}
	peer, err := loopbackURL(urls.PeerURL, false)
	if err != nil {
		return nil, fmt.Errorf("lease: embedded etcd peer URL: %w", err)
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
	if cfg.CompactionRetention == CompactionOff {
		ec.AutoCompactionRetention = "0" // etcd's "no auto-compaction"
	}
	ec.QuotaBackendBytes = cfg.QuotaBytes
	if ec.QuotaBackendBytes <= 0 {
		ec.QuotaBackendBytes = DefaultQuotaBytes
	}
	ec.LogLevel = orDefault(cfg.LogLevel, "warn")
	ec.LogOutputs = []string{orDefault(cfg.LogFile, "stderr")}

	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	// etcd's start takes no context and may wait (for its database's
	// lock, held by a process that is not fcd's): wait for it here, so
	// that ctx (a signal) and the timeout still end the wait.
	type started struct {
		e   *embed.Etcd
		err error
	}
	startc := make(chan started, 1)
	go func() {
		e, err := embed.StartEtcd(ec)
		startc <- started{e, err}
	}()
	var e *embed.Etcd
	select {
	case s := <-startc:
		if s.err != nil {
			return nil, fmt.Errorf("lease: start embedded etcd (client %s, peer %s): %w", client, peer, s.err)
		}
		e = s.e
	case <-timer.C:
		return nil, fmt.Errorf("lease: embedded etcd did not start within %s (is %s in use by a process outside fcd?)", timeout, cfg.Dir)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := recordURLs(cfg.Dir, recordedURLs{ClientURL: client.String(), PeerURL: peer.String()}); err != nil {
		e.Close()
		return nil, err
	}
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

// Close stops the member and releases its directory; its data stays.
func (e *Embedded) Close() {
	if e.closing != nil {
		close(e.closing)
		<-e.watched
	}
	e.etcd.Close()
	e.lock.unlock()
}

// RecordedClientURL returns the client URL the embedded member of dir
// recorded (EndpointsFile): where a running member serves, for a process
// other than the one that runs it.
func RecordedClientURL(dir string) (string, error) {
	path := filepath.Join(dir, EndpointsFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("lease: the embedded etcd's endpoint: %w", err)
	}
	var rec recordedURLs
	if err := json.Unmarshal(b, &rec); err != nil || rec.ClientURL == "" {
		return "", fmt.Errorf("lease: %s records no client URL (%v)", path, err)
	}
	return rec.ClientURL, nil
}

// embeddedURLs are the URLs the member listens on: those configured, else
// those an earlier start recorded, else free loopback ports.
func embeddedURLs(cfg EmbedConfig) (recordedURLs, error) {
	u := recordedURLs{ClientURL: cfg.ClientURL, PeerURL: cfg.PeerURL}
	if u.ClientURL != "" && u.PeerURL != "" {
		return u, nil
	}
	var rec recordedURLs
	switch b, err := os.ReadFile(filepath.Join(cfg.Dir, EndpointsFile)); {
	case err == nil:
		if err := json.Unmarshal(b, &rec); err != nil {
			return u, fmt.Errorf("lease: %s: %w", filepath.Join(cfg.Dir, EndpointsFile), err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return u, fmt.Errorf("lease: %w", err)
	}
	scheme := "http"
	if cfg.ClientTLS != nil {
		scheme = "https"
	}
	var err error
	if u.ClientURL == "" {
		if u.ClientURL = rec.ClientURL; u.ClientURL == "" {
			u.ClientURL, err = freeLoopbackURL(scheme)
		}
	}
	if u.PeerURL == "" && err == nil {
		if u.PeerURL = rec.PeerURL; u.PeerURL == "" {
			u.PeerURL, err = freeLoopbackURL("http")
		}
	}
	return u, err
}

// freeLoopbackURL is a URL of a loopback port free at the time of asking.
func freeLoopbackURL(scheme string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("lease: find a free port: %w", err)
	}
	defer ln.Close()
	return scheme + "://" + ln.Addr().String(), nil
}

// recordURLs writes EndpointsFile.
func recordURLs(dir string, u recordedURLs) error {
	b, _ := json.Marshal(u)
	if err := os.WriteFile(filepath.Join(dir, EndpointsFile), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("lease: record the embedded etcd's URLs: %w", err)
	}
	return nil
}

func loopbackURL(s string, secure bool) (*url.URL, error) {
	u, err := url.Parse(s)
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
