package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
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
	// a private detail of one authzd. Unless OpenLoopback or ClientTLS is
	// set, the member serves https whatever the URL's scheme says (an
	// http URL, as earlier versions recorded, keeps its port): see
	// EmbeddedAccess.
	ClientURL string
	// PeerURL is the member's peer address; empty means as for ClientURL
	// (loopback only, as above; https unless OpenLoopback or ClientTLS).
	PeerURL string
	// OpenLoopback serves clients and peers plain http on loopback, open
	// to every local process, as a test's stand-in for an external
	// cluster (and for its faults, through proxies) or a cluster of
	// embedded members needs. authzd never sets it: by default the member
	// accepts only the client certificate it generates in Dir/TLSDir
	// (mutual TLS on its client and its peer listener), which only the
	// owner of Dir can read.
	OpenLoopback bool
	// Logger receives what a start changed in the directory (new
	// credentials, a move from plain http); nil means slog.Default().
	Logger *slog.Logger
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
	// of the caller's own (an https ClientURL), e.g. with client
	// certificate authentication, and its peers plain http: for tests of
	// an external cluster that requires TLS.
	ClientTLS *transport.TLSInfo
}

// Validate reports a configuration StartEmbedded refuses.
func (c *EmbedConfig) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("lease: embedded etcd needs a data directory"))
	}
	if c.OpenLoopback && c.ClientTLS != nil {
		errs = append(errs, errors.New("lease: embedded etcd: OpenLoopback and ClientTLS exclude each other"))
	}
	if c.InitialCluster != "" && !c.OpenLoopback && c.ClientTLS == nil {
		// Each member would generate a CA of its own, trusted by no
		// other member.
		errs = append(errs, errors.New("lease: a cluster of embedded members (InitialCluster) needs OpenLoopback or ClientTLS"))
	}
	return errors.Join(errs...)
}

// generated reports whether the member serves with the credentials it
// generates in its directory.
func (c *EmbedConfig) generated() bool { return !c.OpenLoopback && c.ClientTLS == nil }

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
	etcd   *embed.Etcd
	dir    string
	access ClientAccess
	quota  int64
	lock   *dirLock
	// failed receives why the member stopped serving by itself; closing
	// ends the goroutine that watches for it (watched), before Close
	// stops the member on purpose.
	failed  chan error
	closing chan struct{}
	watched chan struct{}
}

// EndpointsFile is the file in an embedded member's directory that
// records the URLs it listens on ({"clientURL", "peerURL"}), chosen on its
// first start when not given, and kept for the next ones, and the client
// credential's files ({"ca", "cert", "key"}, relative to the directory)
// when the member generated them. [EmbeddedAccess] reads it.
const EndpointsFile = "fcd-embedded.json"

// recordedURLs are the contents of EndpointsFile.
type recordedURLs struct {
	ClientURL string `json:"clientURL"`
	PeerURL   string `json:"peerURL"`
	CA        string `json:"ca,omitempty"`
	Cert      string `json:"cert,omitempty"`
	Key       string `json:"key,omitempty"`
}

// StartEmbedded starts a single-node etcd in cfg.Dir and waits until it
// serves clients. A second start on the same directory resumes its data.
func StartEmbedded(ctx context.Context, cfg EmbedConfig) (*Embedded, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
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
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// The directory holds the member's data and its credentials: its
	// owner alone may enter it (an earlier version left it as created).
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: embedded etcd dir: %w", err)
	}
	clientScheme, peerScheme := "http", "http"
	switch {
	case cfg.generated():
		clientScheme, peerScheme = "https", "https"
	case cfg.ClientTLS != nil:
		clientScheme = "https"
	}
	urls, recorded, err := embeddedURLs(cfg, clientScheme, peerScheme)
	if err != nil {
		return nil, err
	}
	client, err := loopbackURL(urls.ClientURL, clientScheme, cfg.generated())
	if err != nil {
		return nil, fmt.Errorf("lease: embedded etcd client URL: %w", err)
	}
	peer, err := loopbackURL(urls.PeerURL, peerScheme, cfg.generated())
	if err != nil {
		return nil, fmt.Errorf("lease: embedded etcd peer URL: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = orDefault(cfg.Name, "fcd")
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*client}
	ec.AdvertiseClientUrls = []url.URL{*client}
	ec.ListenPeerUrls = []url.URL{*peer}
	ec.AdvertisePeerUrls = []url.URL{*peer}
	rec := recordedURLs{ClientURL: client.String(), PeerURL: peer.String()}
	switch {
	case cfg.ClientTLS != nil:
		ec.ClientTLSInfo = *cfg.ClientTLS
	case cfg.generated():
		creds, created, err := ensureCredentials(cfg.Dir, time.Now())
		if err != nil {
			return nil, err
		}
		if created {
			log.Info("embedded etcd: new credentials", "dir", creds.dir, "validFor", credentialLifetime.String())
		}
		ec.ClientTLSInfo, ec.PeerTLSInfo = creds.clientInfo(), creds.peerInfo()
		rec.CA, rec.Cert, rec.Key = filepath.Join(TLSDir, tlsCAFile), filepath.Join(TLSDir, tlsClientCert), filepath.Join(TLSDir, tlsClientKey)
		if recorded.ClientURL != "" && recorded.CA == "" {
			// A directory of an earlier version: the member listened
			// on plain http, open to every local process. Same ports,
			// now mutual TLS.
			log.Warn("embedded etcd: moved from plain http to mutual TLS", "dir", cfg.Dir,
				"was", recorded.ClientURL, "now", rec.ClientURL, "credentials", creds.dir)
		}
	}
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
	if err := recordURLs(cfg.Dir, rec); err != nil {
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
	m := &Embedded{etcd: e, dir: cfg.Dir, access: ClientAccess{Endpoints: []string{client.String()}}, quota: ec.QuotaBackendBytes}
	if cfg.generated() {
		if m.access, err = EmbeddedAccess(cfg.Dir); err != nil {
			e.Close()
			return nil, err
		}
		if err := m.advertisePeer(ctx, peer.String(), log); err != nil {
			e.Close()
			return nil, err
		}
	}
	return m, nil
}

// advertisePeer makes the peer URL the cluster's membership records for
// the member the one it listens on: a directory of an earlier version
// recorded a plain http one. It goes through the member's client listener
// with the credential every client uses, so that a start also proves the
// credential works.
func (e *Embedded) advertisePeer(ctx context.Context, peer string, log *slog.Logger) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.access.Endpoints, TLS: e.access.TLS, DialTimeout: 5 * time.Second,
		Context: ctx, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("lease: embedded etcd client: %w", err)
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	id := uint64(e.etcd.Server.MemberID())
	list, err := cli.MemberList(cctx)
	if err != nil {
		return fmt.Errorf("lease: the embedded etcd does not answer its own credential: %w", err)
	}
	for _, mem := range list.Members {
		if mem.ID != id || slices.Equal(mem.PeerURLs, []string{peer}) {
			continue
		}
		if _, err := cli.MemberUpdate(cctx, id, []string{peer}); err != nil {
			return fmt.Errorf("lease: embedded etcd: advertise peer URL %s: %w", peer, err)
		}
		log.Info("embedded etcd: peer URL updated", "was", mem.PeerURLs, "now", peer)
	}
	return nil
}

// Quota returns the backend quota the member runs with, in bytes: what to
// pass as Config.Quota.
func (e *Embedded) Quota() int64 { return e.quota }

// Endpoints returns the client URLs to pass to [Open].
func (e *Embedded) Endpoints() []string { return slices.Clone(e.access.Endpoints) }

// Access returns how clients reach the member: its endpoints and, unless
// it was started with OpenLoopback or ClientTLS, the client credential it
// generated; the same as [EmbeddedAccess] of its directory.
func (e *Embedded) Access() ClientAccess { return e.access }

// Close stops the member and releases its directory; its data stays.
func (e *Embedded) Close() {
	if e.closing != nil {
		close(e.closing)
		<-e.watched
	}
	e.etcd.Close()
	e.lock.unlock()
}

// embeddedURLs are the URLs the member listens on: those configured, else
// those an earlier start recorded, else free loopback ports; and what the
// earlier start recorded (empty on a first start). Free ports get the
// schemes given.
func embeddedURLs(cfg EmbedConfig, clientScheme, peerScheme string) (urls, recorded recordedURLs, err error) {
	switch b, err := os.ReadFile(filepath.Join(cfg.Dir, EndpointsFile)); {
	case err == nil:
		if err := json.Unmarshal(b, &recorded); err != nil {
			return urls, recorded, fmt.Errorf("lease: %s: %w", filepath.Join(cfg.Dir, EndpointsFile), err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return urls, recorded, fmt.Errorf("lease: %w", err)
	}
	urls = recordedURLs{ClientURL: cmp.Or(cfg.ClientURL, recorded.ClientURL), PeerURL: cmp.Or(cfg.PeerURL, recorded.PeerURL)}
	if urls.ClientURL == "" {
		urls.ClientURL, err = freeLoopbackURL(clientScheme)
	}
	if urls.PeerURL == "" && err == nil {
		urls.PeerURL, err = freeLoopbackURL(peerScheme)
	}
	return urls, recorded, err
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

// recordURLs writes EndpointsFile, replacing it at once: a client reading
// it meanwhile (EmbeddedAccess) sees the old contents or the new.
func recordURLs(dir string, u recordedURLs) error {
	b, _ := json.Marshal(u)
	if err := writePrivate(filepath.Join(dir, EndpointsFile), append(b, '\n')); err != nil {
		return fmt.Errorf("lease: record the embedded etcd's URLs: %w", err)
	}
	return nil
}

// loopbackURL parses s, a loopback URL, for a listener serving scheme.
// With upgrade an http URL is taken for its address (earlier versions
// recorded http URLs for a member that now serves https); otherwise its
// scheme must be scheme.
func loopbackURL(s, scheme string, upgrade bool) (*url.URL, error) {
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
	case u.Scheme == scheme:
	case upgrade && u.Scheme == "http":
		u.Scheme = scheme
	case scheme == "https":
		return nil, fmt.Errorf("scheme %q: a member serving TLS needs an https URL", u.Scheme)
	default:
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
