package server

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/decisionlog"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/policies"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of the zero Config, and of `authzd serve`'s flags: this is the
// one place each is written.
const (
	// DefaultListen is the HTTP listen address.
	DefaultListen = "127.0.0.1:8080"
	// DefaultDataDir is the data directory (relative to the working
	// directory).
	DefaultDataDir = "fcd-data"
	// DefaultEtcdPrefix is prepended to every key fcd writes.
	DefaultEtcdPrefix = "/fcd/"
	// DefaultFormationRate is how many formations a second each host
	// credential may record on one replica: one host at its limit does not
	// fill the default quota within a formation's retention
	// (docs/capacity.md).
	DefaultFormationRate = 2.0
	// DefaultFormationBurst is how many formations a host credential may
	// record at once.
	DefaultFormationBurst = 40
	// DefaultBodyLimit bounds request bodies in bytes.
	DefaultBodyLimit = 1 << 20
	// DefaultPolicyPoll is how often a policy directory is checked for
	// changes.
	DefaultPolicyPoll = 2 * time.Second
	// DefaultPolicyBundleMinDelay and DefaultPolicyBundleMaxDelay bound
	// the random wait between two polls of a policy bundle (OPA's bundle
	// plugin's defaults).
	DefaultPolicyBundleMinDelay = policy.DefaultBundleMinDelay
	DefaultPolicyBundleMaxDelay = policy.DefaultBundleMaxDelay
	// DefaultFormationTTL is how long a formation may wait for approval and
	// admission.
	DefaultFormationTTL = authz.DefaultTTL
	// DefaultFormationRetention is how long etcd keeps a formation after
	// its lease closed or it expired.
	DefaultFormationRetention = authz.DefaultRetention
	// DefaultReportGrace is how long after an admission its token may be
	// issued again and its outcome report is awaited.
	DefaultReportGrace = authz.DefaultReportGrace
	// DefaultTokenLifetime is how long a dispatch token is valid.
	DefaultTokenLifetime = authz.DefaultTokenLifetime
	// DefaultIssuer is the iss claim of dispatch tokens.
	DefaultIssuer = "fcd"
	// DefaultGatewayCaller binds gateway admissions to the formation's
	// principal.
	DefaultGatewayCaller = string(authz.CallerPrincipal)
	// DefaultAuditArguments keeps none of a call's arguments in the trail,
	// only their digest.
	DefaultAuditArguments = string(authz.TrailArgumentsNone)
	// DefaultAuditMaxLag is how long a committed change may wait
	// unrecorded by the trail before admissions and claims are refused.
	DefaultAuditMaxLag = authz.DefaultMaxTrailLag
	// DefaultDecisionLogResource is the path decision logs are posted to.
	DefaultDecisionLogResource = decisionlog.DefaultResource
	// DefaultDecisionLogMask is the one JSON pointer the default mask
	// erases from decision-log events: the call's arguments (no
	// descriptor says which are secret; their digest stays).
	DefaultDecisionLogMask = "/input/formation/arguments"
	// DefaultDecisionLogBuffer bounds the events held for upload.
	DefaultDecisionLogBuffer = decisionlog.DefaultBufferSize
	// DefaultDecisionLogUploadLimit bounds one upload's compressed body.
	DefaultDecisionLogUploadLimit = decisionlog.DefaultUploadSizeLimit
	// DefaultDecisionLogMinDelay and DefaultDecisionLogMaxDelay bound the
	// wait between uploads.
	DefaultDecisionLogMinDelay = decisionlog.DefaultMinDelay
	DefaultDecisionLogMaxDelay = decisionlog.DefaultMaxDelay
	// AuditOff as Config.AuditDir keeps no audit trail.
	AuditOff = "off"
	// NoFormationLimit as Config.FormationRate sets no formation rate
	// limit.
	NoFormationLimit = -1.0
)

// Config configures a [Server]. A zero field means its default (the
// Default… constants); the zero Config serves on DefaultListen from
// DefaultDataDir but lacks what only the operator can give: the
// registrar keys and the bearer credentials. Where a setting can be
// given as a file (what `authzd serve` does) or as a value (what an
// embedding test does), the value wins.
type Config struct {
	// Listen is the HTTP listen address; "127.0.0.1:0" picks a free port
	// ([Server.URL] tells which).
	Listen string
	// TLSCert and TLSKey are PEM files of the certificate (chain) and key
	// the server serves HTTPS (and the gRPC service TLS) with; both or
	// neither. Bearer credentials cross this listener: terminate TLS here
	// or in front of the server, never leave it plain beyond loopback.
	TLSCert, TLSKey string
	// GRPCListen is the listen address of the Envoy ext_authz gRPC service
	// (envoy.service.auth.v3.Authorization/Check); empty serves none.
	GRPCListen string

	// DataDir holds the embedded etcd member's data (DataDir/etcd, its log
	// DataDir/etcd.log) and, by default, the audit trail (DataDir/audit).
	DataDir string
	// EtcdEndpoints selects an external etcd cluster; empty starts the
	// embedded single-node etcd member in DataDir.
	EtcdEndpoints []string
	// EtcdPrefix is prepended to every key fcd writes.
	EtcdPrefix string
	// EtcdCA, EtcdCert and EtcdKey are PEM files for an external cluster
	// served over TLS: the CA that signed the members' certificates, and
	// this client's certificate and key where the cluster authenticates
	// clients (cert and key go together).
	EtcdCA, EtcdCert, EtcdKey string
	// EmbeddedEtcdClientURL and EmbeddedEtcdPeerURL place the embedded
	// member; loopback only, served over TLS with the credential the member
	// generates in its directory (lease.TLSDir), which only fcd's clients
	// present. Empty means the ones the data directory recorded, else free
	// ports.
	EmbeddedEtcdClientURL, EmbeddedEtcdPeerURL string
	// EtcdQuota is etcd's backend quota in bytes: the embedded member is
	// started with it (0: 2 GiB), and for an external cluster it is what
	// its members run with (0: unknown), shown by /readyz and the metrics.
	EtcdQuota int64
	// Store, when set, is an open store to serve on instead of opening one
	// from the settings above (tests sharing one etcd member); the server
	// does not close it.
	Store *lease.Store

	// FormationRate is how many formations a second each host credential
	// may record on this replica (a token bucket); a negative rate
	// (NoFormationLimit) sets no limit.
	FormationRate float64
	// FormationBurst is how many formations a host credential may record
	// at once after an idle while (the bucket's size).
	FormationBurst int64
	// BodyLimit bounds request bodies in bytes.
	BodyLimit int64

	// RegistrarKeys is a JWKS file of trusted registrar public keys;
	// Registrars, when set, is used instead. One of them is required.
	RegistrarKeys string
	Registrars    *manifest.Verifier
	// IssuerKeys is a JWKS file of trusted compatibility-certificate issuer
	// public keys; Issuers, when set, is used instead. Neither refuses
	// certificates.
	IssuerKeys string
	Issuers    *manifest.Verifier
	// OperatorKeys is a JWKS file of operators' public keys; Operators,
	// when set, is used instead. With either, an uncertain lease is
	// resolved only by a resolution signed by an operator; with neither an
	// operator's bearer credential alone resolves, which is for tests.
	OperatorKeys string
	Operators    *manifest.Verifier
	// Credentials is a JSON file: a list of {id, role, hash} bearer
	// credentials; Auth, when set, is used instead. One of them is
	// required.
	Credentials string
	Auth        *api.Authenticator

	// PolicyDir is a directory of Rego and Cedar policies with their
	// tests; empty (and no PolicyBundle) uses the embedded default
	// policies. A directory is watched (every PolicyPoll) and reloaded on
	// change and on Reload.
	PolicyDir  string
	PolicyPoll time.Duration
	// PolicyBundle is an OPA bundle of the policies instead of PolicyDir
	// (policies/README.md): an http(s) URL, polled after a random wait
	// between PolicyBundleMinDelay and PolicyBundleMaxDelay with
	// If-None-Match, or a .tar.gz file, re-read as often. It is reloaded
	// on change and on Reload, as a directory is.
	PolicyBundle string
	// PolicyBundleKeys is a file of the key that verifies the bundle's
	// signature (policy.LoadBundleKeys: a PEM public key, an HMAC secret,
	// or OPA's keys object); PolicyBundleKeyID names the key (with one
	// key, its name; in a keys object, the one to use, else the
	// signature's kid picks), PolicyBundleKeyAlg its algorithm (empty:
	// from the key). Required for a URL; without it a bundle file must be
	// unsigned.
	PolicyBundleKeys, PolicyBundleKeyID, PolicyBundleKeyAlg string
	// PolicyBundleMinDelay and PolicyBundleMaxDelay bound the random wait
	// between two polls of PolicyBundle.
	PolicyBundleMinDelay, PolicyBundleMaxDelay time.Duration
	// Reload, when set, reloads the policies on every value received
	// (authzd serve notifies it of SIGHUP); nil reloads only on change.
	Reload <-chan os.Signal

	// FormationTTL is how long a formation may wait for approval and
	// admission.
	FormationTTL time.Duration
	// FormationRetention is how long etcd keeps a formation after its
	// lease closed (or it expired unadmitted); the audit trail keeps it
	// after that.
	FormationRetention time.Duration
	// ReportGrace is how long after an admission its token may be issued
	// again and its outcome report is awaited; a lease still unreported
	// 2×ReportGrace + TokenLifetime after admission is marked uncertain.
	ReportGrace time.Duration
	// GatewayCaller binds gateway admissions to the caller the gateway
	// authenticated (its Fcd-Caller header): "principal" or "off".
	GatewayCaller string

	// SigningKey is a file holding the private JWK (Ed25519 or P-256, with
	// a kid) that signs dispatch tokens and the trail's checkpoints;
	// Signer, when set, is used instead. Without either the server
	// registers and forms but does not admit, and keeps no trail.
	SigningKey string
	Signer     jwk.Key
	// Issuer is the iss claim of dispatch tokens.
	Issuer string
	// TokenLifetime is how long a dispatch token is valid.
	TokenLifetime time.Duration

	// AuditDir is the audit trail's directory; empty means
	// DataDir/audit, AuditOff keeps no trail.
	AuditDir string
	// Replica names this replica's chain in the trail: stable across its
	// restarts, distinct between replicas; empty means the host name.
	Replica string
	// AuditArguments is what the trail keeps of a call's arguments beside
	// their digest: none, redacted, digested or all (authz.TrailArguments).
	AuditArguments string
	// AuditMaxLag bounds how long a committed change may wait unrecorded
	// by this replica's trail (which follows the store's history) before
	// admissions and claims are refused.
	AuditMaxLag time.Duration

	// DecisionLogURL is the service decision logs are exported to in
	// OPA's format (docs/decision-logs.md); empty exports none.
	DecisionLogURL string
	// DecisionLogResource is the path under DecisionLogURL uploads are
	// posted to.
	DecisionLogResource string
	// DecisionLogCredentialFile holds the decision-log service's bearer
	// credential; empty reads FCD_DECISION_LOG_CREDENTIAL, and without
	// either uploads carry none. Never logged.
	DecisionLogCredentialFile string
	// DecisionLogMask lists JSON pointers erased from every event before
	// it leaves the server; nil means [DefaultDecisionLogMask], an empty
	// non-nil list erases nothing.
	DecisionLogMask []string
	// DecisionLogLabels are key=value labels added to every event.
	DecisionLogLabels []string
	// DecisionLogBuffer bounds the events held for upload; when full the
	// oldest is dropped.
	DecisionLogBuffer int64
	// DecisionLogUploadLimit bounds one upload's compressed body in bytes.
	DecisionLogUploadLimit int64
	// DecisionLogMinDelay and DecisionLogMaxDelay bound the random wait
	// between uploads; the max also caps the retry backoff.
	DecisionLogMinDelay, DecisionLogMaxDelay time.Duration

	// OTLPEndpoint is the OpenTelemetry collector the server exports its
	// traces to over OTLP (http://collector:4318 for OTLP/HTTP, /v1/traces
	// appended to a URL without a path); empty means the standard
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// and without either nothing is traced (a no-op tracer). The
	// exporter's other standard variables (headers, TLS, timeout) apply.
	OTLPEndpoint string
	// OTLPProtocol is http/protobuf or grpc; empty means
	// OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, else http/protobuf.
	OTLPProtocol string
	// TracerProvider, when set, makes the server's spans instead of an
	// exporter of its own (an embedding test's, an application's); the
	// server does not shut it down.
	TracerProvider trace.TracerProvider

	// NotifyURL receives a signed webhook when a formation starts waiting
	// for approval, is approved, denied or expires (docs/approvals.md);
	// empty sends none.
	NotifyURL string
	// NotifySecretFile holds the key webhooks are signed with
	// (HMAC-SHA256, header Fcd-Signature); required with NotifyURL.
	// Never logged.
	NotifySecretFile string
	// NotifyFormat is the body's format: json (the documented payload,
	// the zero value) or slack ({"text": …}).
	NotifyFormat string
	// NotifyPageURL is the approval page's public address
	// (https://fcd.example/ui/), which each notification links; empty
	// sends no link.
	NotifyPageURL string
	// NotifyQueue bounds the notifications waiting for delivery; when
	// full a new one is dropped (counted). Zero means the default.
	NotifyQueue int64

	// Logger receives the server's logs; nil means slog.Default(). Log
	// with a handler wrapped by telemetry.LogHandler (authzd serve does)
	// for each line of a traced request to carry its trace and span ids.
	Logger *slog.Logger
	// Serving, when set, is called once by Run when every loop and server
	// has started (authzd serve prints there the lines scripts wait for).
	Serving func()
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.Listen, DefaultListen)
	def(&c.DataDir, DefaultDataDir)
	def(&c.EtcdPrefix, DefaultEtcdPrefix)
	def(&c.Issuer, DefaultIssuer)
	def(&c.GatewayCaller, DefaultGatewayCaller)
	def(&c.AuditArguments, DefaultAuditArguments)
	def(&c.DecisionLogResource, DefaultDecisionLogResource)
	if c.FormationRate == 0 {
		c.FormationRate = DefaultFormationRate
	}
	if c.FormationBurst == 0 {
		c.FormationBurst = DefaultFormationBurst
	}
	if c.BodyLimit == 0 {
		c.BodyLimit = DefaultBodyLimit
	}
	dur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	dur(&c.PolicyPoll, DefaultPolicyPoll)
	dur(&c.PolicyBundleMinDelay, DefaultPolicyBundleMinDelay)
	dur(&c.PolicyBundleMaxDelay, DefaultPolicyBundleMaxDelay)
	dur(&c.FormationTTL, DefaultFormationTTL)
	dur(&c.FormationRetention, DefaultFormationRetention)
	dur(&c.ReportGrace, DefaultReportGrace)
	dur(&c.TokenLifetime, DefaultTokenLifetime)
	dur(&c.AuditMaxLag, DefaultAuditMaxLag)
	dur(&c.DecisionLogMinDelay, DefaultDecisionLogMinDelay)
	dur(&c.DecisionLogMaxDelay, DefaultDecisionLogMaxDelay)
	if c.DecisionLogMask == nil {
		c.DecisionLogMask = []string{DefaultDecisionLogMask}
	}
	if c.DecisionLogBuffer == 0 {
		c.DecisionLogBuffer = DefaultDecisionLogBuffer
	}
	if c.DecisionLogUploadLimit == 0 {
		c.DecisionLogUploadLimit = DefaultDecisionLogUploadLimit
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a configuration the server cannot run with. Zero
// fields are valid: they mean their defaults.
func (c Config) Validate() error {
	var errs []error
	if c.EtcdQuota < 0 || c.FormationBurst < 0 || c.BodyLimit < 0 {
		errs = append(errs, errors.New("server: EtcdQuota, FormationBurst and BodyLimit may not be negative"))
	}
	if c.PolicyPoll < 0 || c.FormationTTL < 0 || c.ReportGrace < 0 || c.FormationRetention < 0 || c.TokenLifetime < 0 || c.AuditMaxLag < 0 {
		errs = append(errs, errors.New("server: PolicyPoll, FormationTTL, FormationRetention, ReportGrace, TokenLifetime and AuditMaxLag may not be negative"))
	}
	if c.PolicyDir != "" && c.PolicyBundle != "" {
		errs = append(errs, errors.New("server: PolicyDir and PolicyBundle exclude each other"))
	}
	if c.PolicyBundle == "" && (c.PolicyBundleKeys != "" || c.PolicyBundleKeyID != "" || c.PolicyBundleKeyAlg != "") {
		errs = append(errs, errors.New("server: PolicyBundleKeys, PolicyBundleKeyID and PolicyBundleKeyAlg are for a PolicyBundle"))
	}
	if c.PolicyBundle != "" && c.PolicyBundleKeys == "" && policyBundleURL(c.PolicyBundle) {
		errs = append(errs, errors.New("server: a PolicyBundle URL needs PolicyBundleKeys: a bundle from the network must be signed"))
	}
	if d := c.withDefaults(); c.PolicyBundleMinDelay < 0 || d.PolicyBundleMinDelay > d.PolicyBundleMaxDelay {
		errs = append(errs, errors.New("server: 0 <= PolicyBundleMinDelay <= PolicyBundleMaxDelay"))
	}
	if _, err := authz.ParseTrailArguments(c.AuditArguments); err != nil {
		errs = append(errs, fmt.Errorf("server: AuditArguments %q: want none, redacted, digested or all", c.AuditArguments))
	}
	if c.NotifyURL != "" && c.NotifySecretFile == "" {
		errs = append(errs, errors.New("server: NotifyURL needs NotifySecretFile (the webhooks' signing key)"))
	}
	if c.NotifyFormat != "" && c.NotifyFormat != authz.FormatJSON && c.NotifyFormat != authz.FormatSlack {
		errs = append(errs, fmt.Errorf("server: NotifyFormat %q: want json or slack", c.NotifyFormat))
	}
	if c.NotifyQueue < 0 {
		errs = append(errs, errors.New("server: NotifyQueue may not be negative"))
	}
	if (c.EtcdCert == "") != (c.EtcdKey == "") {
		errs = append(errs, errors.New("server: EtcdCert and EtcdKey go together"))
	}
	if (c.EtcdCA != "" || c.EtcdCert != "") && len(c.EtcdEndpoints) == 0 {
		errs = append(errs, errors.New("server: EtcdCA, EtcdCert and EtcdKey are for an external cluster (EtcdEndpoints)"))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("server: TLSCert and TLSKey go together"))
	}
	if c.GatewayCaller != "" && c.GatewayCaller != string(authz.CallerPrincipal) && c.GatewayCaller != string(authz.CallerOff) {
		errs = append(errs, errors.New("server: GatewayCaller must be principal or off"))
	}
	if c.RegistrarKeys == "" && c.Registrars == nil {
		errs = append(errs, errors.New("server: RegistrarKeys (a JWKS file of trusted registrar keys) or Registrars is required"))
	}
	if c.Credentials == "" && c.Auth == nil {
		errs = append(errs, errors.New("server: Credentials (a file of hashed bearer credentials) or Auth is required"))
	}
	d := c.withDefaults()
	if d.DecisionLogBuffer < 1 || d.DecisionLogUploadLimit < 1 || d.DecisionLogMinDelay <= 0 || d.DecisionLogMinDelay > d.DecisionLogMaxDelay {
		errs = append(errs, errors.New("server: DecisionLogBuffer and DecisionLogUploadLimit must be positive, and 0 < DecisionLogMinDelay <= DecisionLogMaxDelay"))
	}
	if _, err := c.decisionLogLabels(); err != nil {
		errs = append(errs, err)
	}
	if err := c.telemetry().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("server: %w", err))
	}
	return errors.Join(errs...)
}

// policyBundleURL reports whether a PolicyBundle is downloaded rather
// than read from a file.
func policyBundleURL(loc string) bool {
	return strings.HasPrefix(loc, "http://") || strings.HasPrefix(loc, "https://")
}

// policySource is where the policies are loaded from: PolicyBundle,
// PolicyDir, or the embedded defaults.
func (c Config) policySource() (policy.Source, error) {
	if c.PolicyBundle == "" {
		return policy.Source{Dir: c.PolicyDir, FS: policies.FS}, nil
	}
	b := &policy.BundleSource{Location: c.PolicyBundle, MinDelay: c.PolicyBundleMinDelay, MaxDelay: c.PolicyBundleMaxDelay}
	if c.PolicyBundleKeys != "" {
		vc, err := policy.LoadBundleKeys(c.PolicyBundleKeys, c.PolicyBundleKeyID, c.PolicyBundleKeyAlg)
		if err != nil {
			return policy.Source{}, err
		}
		b.Verification = vc
	}
	return policy.Source{Bundle: b}, nil
}

// telemetry is the trace exporter's configuration.
func (c Config) telemetry() telemetry.Config {
	return telemetry.Config{Endpoint: c.OTLPEndpoint, Protocol: c.OTLPProtocol, Service: "authzd",
		Version: telemetry.Build().Version, Instance: c.Replica}
}

// EtcdDir is the embedded member's data directory.
func (c Config) EtcdDir() string { return filepath.Join(c.withDefaults().DataDir, "etcd") }

// EmbedConfig is the embedded member of DataDir: what New starts, and
// what `authzd store` starts when no authzd runs on the directory.
func (c Config) EmbedConfig() lease.EmbedConfig {
	c = c.withDefaults()
	return lease.EmbedConfig{
		Dir:        c.EtcdDir(),
		ClientURL:  c.EmbeddedEtcdClientURL,
		PeerURL:    c.EmbeddedEtcdPeerURL,
		LogFile:    filepath.Join(c.DataDir, "etcd.log"),
		QuotaBytes: c.EtcdQuota,
		// The server compacts itself (lease.Store.RunCompactor), never
		// past what an audit trail has not recorded.
		CompactionRetention: lease.CompactionOff,
	}
}

// StoreConfig is how the server reaches its etcd — endpoints, client TLS,
// prefix and quota — for New and for `authzd store` alike, so that how
// the store is reached (and with which credentials) is decided in one
// place (StoreAccess): an external cluster's EtcdEndpoints and
// EtcdCA/Cert/Key; or the embedded member's endpoints and the credential
// it generated, read back from its directory as every other client of
// the member reads them.
func (c Config) StoreConfig(member *lease.Embedded) (lease.Config, error) {
	c = c.withDefaults()
	acc, err := c.StoreAccess()
	if err != nil {
		if len(c.EtcdEndpoints) == 0 {
			return lease.Config{}, fmt.Errorf("%w (is --data-dir %s an authzd data directory?)", err, c.DataDir)
		}
		return lease.Config{}, err
	}
	sc := lease.Config{Endpoints: acc.Endpoints, TLS: acc.TLS, Prefix: c.EtcdPrefix, Logger: c.Logger, Quota: c.EtcdQuota}
	switch {
	case member != nil:
		sc.Quota = member.Quota()
	case len(c.EtcdEndpoints) == 0:
		sc.Quota = cmp.Or(c.EtcdQuota, lease.DefaultQuotaBytes)
	}
	return sc, nil
}

// decisionLogLabels are the key=value DecisionLogLabels as a map.
func (c *Config) decisionLogLabels() (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range c.DecisionLogLabels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || k == "id" || k == "version" {
			return nil, fmt.Errorf("decisionLogLabels: %q is not key=value with a key other than id and version", kv)
		}
		labels[k] = v
	}
	return labels, nil
}
