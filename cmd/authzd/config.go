package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/server"
)

// Config is authzd's server configuration. Every field can be set in the
// YAML (or JSON) file given by --config and by the flag of the same name;
// a flag given on the command line wins over the file, and the file over
// the defaults.
type Config struct {
	// Listen is the HTTP listen address.
	Listen string `json:"listen"`
	// TLSCert and TLSKey are PEM files of the certificate (chain) and key
	// authzd serves HTTPS (and the gRPC service TLS) with; both or
	// neither. Bearer credentials cross this listener: terminate TLS here
	// or in front of authzd, never leave it plain beyond loopback.
	TLSCert string `json:"tlsCert"`
	TLSKey  string `json:"tlsKey"`
	// GRPCListen is the listen address of the Envoy ext_authz gRPC service
	// (envoy.service.auth.v3.Authorization/Check); empty serves none.
	GRPCListen string `json:"grpcListen"`
	// DataDir holds the embedded etcd data and, with --dev, generated keys
	// and credentials.
	DataDir string `json:"dataDir"`
	// EtcdEndpoints selects an external etcd cluster; empty starts the
	// embedded single-node etcd in DataDir.
	EtcdEndpoints []string `json:"etcdEndpoints"`
	// EtcdPrefix is prepended to every key fcd writes.
	EtcdPrefix string `json:"etcdPrefix"`
	// EtcdCA, EtcdCert and EtcdKey are PEM files for an external cluster
	// served over TLS (https endpoints): the CA that signed the members'
	// certificates, and this client's certificate and key where the
	// cluster authenticates clients (cert and key go together).
	EtcdCA   string `json:"etcdCA"`
	EtcdCert string `json:"etcdCert"`
	EtcdKey  string `json:"etcdKey"`
	// EmbeddedEtcdClientURL and EmbeddedEtcdPeerURL place the embedded
	// member; loopback only.
	EmbeddedEtcdClientURL string `json:"embeddedEtcdClientURL"`
	EmbeddedEtcdPeerURL   string `json:"embeddedEtcdPeerURL"`
	// EtcdQuota is etcd's backend quota in bytes: the embedded member is
	// started with it (0: 2 GiB), and for an external cluster it is what
	// its members run with (--quota-backend-bytes; 0: unknown), which
	// etcd does not tell clients. /readyz and the metrics show it beside
	// the database size (docs/capacity.md).
	EtcdQuota int64 `json:"etcdQuota"`
	// FormationRate is how many formations a second each host credential
	// may record on this replica (a token bucket); 0 turns the limit off.
	// The default keeps one host at its limit from filling the default
	// quota within a formation's retention (docs/capacity.md).
	FormationRate float64 `json:"formationRate"`
	// FormationBurst is how many formations a host credential may record
	// at once after an idle while (the bucket's size).
	FormationBurst int64 `json:"formationBurst"`
	// RegistrarKeys is a JWKS file of trusted registrar public keys.
	RegistrarKeys string `json:"registrarKeys"`
	// IssuerKeys is a JWKS file of trusted compatibility-certificate issuer
	// public keys; empty refuses certificates. --dev generates one.
	IssuerKeys string `json:"issuerKeys"`
	// OperatorKeys is a JWKS file of operators' public keys: with it an
	// uncertain lease is resolved only by a resolution signed with one of
	// them (`authzd lease resolve`), kept with the lease and in the audit
	// trail; empty lets an operator's bearer credential alone resolve,
	// which is for tests. --dev generates one.
	OperatorKeys string `json:"operatorKeys"`
	// Credentials is a JSON file: a list of {id, role, hash} bearer
	// credentials (see `authzd credential new`).
	Credentials string `json:"credentials"`
	// BodyLimit bounds request bodies in bytes.
	BodyLimit int64 `json:"bodyLimit"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"logLevel"`
	// LogFormat is text (logfmt) or json; a line logged for a traced
	// request carries its trace_id and span_id either way.
	LogFormat string `json:"logFormat"`
	// OTLPEndpoint is the OpenTelemetry collector traces are exported to
	// over OTLP; empty means OTEL_EXPORTER_OTLP_ENDPOINT, else none.
	OTLPEndpoint string `json:"otlpEndpoint"`
	// OTLPProtocol is http/protobuf or grpc.
	OTLPProtocol string `json:"otlpProtocol"`
	// PolicyDir is a directory of Rego and Cedar policies with their
	// tests; empty uses the embedded default policies. A directory is
	// watched and reloaded on change and on SIGHUP.
	PolicyDir string `json:"policyDir"`
	// PolicyPoll is how often the policy directory is checked for changes.
	PolicyPoll Duration `json:"policyPoll"`
	// PolicyBundle is an OPA bundle of the policies instead of PolicyDir
	// (policies/README.md, "Bundles"): an http(s) URL, polled with
	// If-None-Match, or a .tar.gz file. A bundle that does not verify,
	// compile or pass its tests never replaces the set in force.
	PolicyBundle string `json:"policyBundle"`
	// PolicyBundleKeys is a file of the key that verifies the bundle's
	// signature: a PEM public key (RSA or ECDSA), an HMAC secret, or
	// OPA's keys object ({"kid": {"key": ..., "algorithm": ...}}).
	// Required for a URL; without it a bundle file must be unsigned.
	PolicyBundleKeys string `json:"policyBundleKeys"`
	// PolicyBundleKeyID names the key: with a single key, its name; in a
	// keys object, the one to verify with (empty: the signature's kid).
	PolicyBundleKeyID string `json:"policyBundleKeyID"`
	// PolicyBundleKeyAlg is the key's algorithm (RS256, PS256, ES256,
	// HS256, ...); empty infers it from the key.
	PolicyBundleKeyAlg string `json:"policyBundleKeyAlg"`
	// PolicyBundleMinDelay and PolicyBundleMaxDelay bound the random wait
	// between two polls of the bundle, as OPA's bundle plugin's
	// min_delay_seconds and max_delay_seconds do.
	PolicyBundleMinDelay Duration `json:"policyBundleMinDelay"`
	PolicyBundleMaxDelay Duration `json:"policyBundleMaxDelay"`
	// FormationTTL is how long a formation may wait for approval and
	// admission.
	FormationTTL Duration `json:"formationTTL"`
	// FormationRetention is how long etcd keeps a formation after its
	// lease closed (or it expired unadmitted); the audit trail keeps it
	// after that.
	FormationRetention Duration `json:"formationRetention"`
	// SigningKey is the private JWK (Ed25519 or P-256, with a kid) that
	// signs dispatch tokens; --dev generates one. Without it the server
	// registers and forms but does not admit.
	SigningKey string `json:"signingKey"`
	// SigningAlg is the algorithm of the key --dev generates: EdDSA or
	// ES256.
	SigningAlg string `json:"signingAlg"`
	// Issuer is the iss claim of dispatch tokens.
	Issuer string `json:"issuer"`
	// AuditDir is the audit trail's directory; empty means the data
	// directory's audit/, "off" keeps no trail. The trail's checkpoints are
	// signed with the signing key: without one there is no trail.
	AuditDir string `json:"auditDir"`
	// Replica names this replica's chain in the trail: stable across its
	// restarts, distinct between replicas; empty means the host name.
	Replica string `json:"replica"`
	// AuditArguments is what the trail keeps of a call's arguments beside
	// their digest: none, redacted, digested or all (authz.TrailArguments).
	AuditArguments string `json:"auditArguments"`
	// AuditMaxLag bounds how long a committed change may wait unrecorded
	// by this replica's trail before admissions and claims are refused;
	// zero means authz.DefaultMaxTrailLag (5s).
	AuditMaxLag Duration `json:"auditMaxLag"`
	// TokenLifetime is how long a dispatch token is valid.
	TokenLifetime Duration `json:"tokenLifetime"`
	// ReportGrace is how long after an admission its token may be issued
	// again and its outcome report is awaited; a lease still unreported
	// 2×ReportGrace + TokenLifetime after admission is marked uncertain.
	ReportGrace Duration `json:"reportGrace"`
	// GatewayCaller binds gateway admissions to the caller the gateway
	// authenticated (the Fcd-Caller header it sets): "principal" (a call
	// runs only for its formation's principal) or "off".
	GatewayCaller string `json:"gatewayCaller"`
	// DecisionLogURL is the service decision logs are exported to in
	// OPA's format (docs/decision-logs.md); empty exports none.
	DecisionLogURL string `json:"decisionLogURL"`
	// DecisionLogResource is the path under DecisionLogURL uploads are
	// posted to (OPA's decision_logs.resource).
	DecisionLogResource string `json:"decisionLogResource"`
	// DecisionLogCredentialFile holds the bearer credential of the
	// decision-log service; empty reads FCD_DECISION_LOG_CREDENTIAL, and
	// without either uploads carry none. Never logged.
	DecisionLogCredentialFile string `json:"decisionLogCredentialFile"`
	// DecisionLogMask lists JSON pointers (/input/..., /result/...)
	// erased from every event before it leaves authzd. The default erases
	// the call's arguments: no descriptor says which arguments are
	// secret, and their digest stays in the input. An empty list erases
	// nothing.
	DecisionLogMask []string `json:"decisionLogMask"`
	// DecisionLogLabels are key=value labels added to every event's
	// labels besides id (this replica's, random at start) and version.
	DecisionLogLabels []string `json:"decisionLogLabels"`
	// DecisionLogBuffer bounds the events held for upload; when full the
	// oldest is dropped.
	DecisionLogBuffer int64 `json:"decisionLogBuffer"`
	// DecisionLogUploadLimit bounds one upload's gzip-compressed body in
	// bytes (OPA's upload_size_limit_bytes).
	DecisionLogUploadLimit int64 `json:"decisionLogUploadLimit"`
	// DecisionLogMinDelay and DecisionLogMaxDelay bound the random wait
	// between uploads; the max also caps the retry backoff.
	DecisionLogMinDelay Duration `json:"decisionLogMinDelay"`
	DecisionLogMaxDelay Duration `json:"decisionLogMaxDelay"`
	// NotifyURL receives a signed webhook when a formation starts waiting
	// for approval, is approved, denied or expires (docs/approvals.md);
	// empty sends none.
	NotifyURL string `json:"notifyURL"`
	// NotifySecretFile holds the key the webhooks are signed with
	// (HMAC-SHA256 in Fcd-Signature); required with NotifyURL. Never
	// logged.
	NotifySecretFile string `json:"notifySecretFile"`
	// NotifyFormat is the webhook body: json (the documented payload) or
	// slack ({"text": …} for a Slack incoming webhook).
	NotifyFormat string `json:"notifyFormat"`
	// NotifyPageURL is the approval page's public address, which each
	// webhook links; empty links nothing.
	NotifyPageURL string `json:"notifyPageURL"`
	// NotifyQueue bounds the webhooks waiting for delivery; when full a
	// new one is dropped (fcd_notifications_dropped_total).
	NotifyQueue int64 `json:"notifyQueue"`
	// Dev creates the data directory, a registrar key pair and one
	// credential per role, and writes DataDir/dev-credentials.json.
	Dev bool `json:"dev"`
}

// Validate reports a configuration authzd cannot run with.
func (c *Config) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen is required"))
	}
	if c.DataDir == "" && len(c.EtcdEndpoints) == 0 {
		errs = append(errs, errors.New("dataDir is required for the embedded etcd"))
	}
	if c.EtcdQuota < 0 || c.FormationRate < 0 || c.FormationBurst < 0 {
		errs = append(errs, errors.New("etcdQuota, formationRate and formationBurst may not be negative"))
	}
	if c.FormationRate > 0 && c.FormationBurst < 1 {
		errs = append(errs, errors.New("formationBurst must be at least 1 while formationRate limits formations"))
	}
	if c.BodyLimit <= 0 {
		errs = append(errs, errors.New("bodyLimit must be positive"))
	}
	if c.PolicyPoll <= 0 || c.FormationTTL <= 0 || c.ReportGrace <= 0 || c.FormationRetention <= 0 {
		errs = append(errs, errors.New("policyPoll, formationTTL, formationRetention and reportGrace must be positive"))
	}
	if c.PolicyDir != "" && c.PolicyBundle != "" {
		errs = append(errs, errors.New("policyDir and policyBundle exclude each other: give one source of policies"))
	}
	if c.PolicyBundle == "" && (c.PolicyBundleKeys != "" || c.PolicyBundleKeyID != "" || c.PolicyBundleKeyAlg != "") {
		errs = append(errs, errors.New("policyBundleKeys, policyBundleKeyID and policyBundleKeyAlg are for a policyBundle"))
	}
	if c.PolicyBundleKeys == "" && (strings.HasPrefix(c.PolicyBundle, "http://") || strings.HasPrefix(c.PolicyBundle, "https://")) {
		errs = append(errs, errors.New("policyBundle is a URL: policyBundleKeys is required (a bundle from the network must be signed)"))
	}
	if c.PolicyBundleMinDelay <= 0 || c.PolicyBundleMinDelay > c.PolicyBundleMaxDelay {
		errs = append(errs, errors.New("policyBundleMinDelay must be positive and at most policyBundleMaxDelay"))
	}
	if _, err := authz.ParseTrailArguments(c.AuditArguments); err != nil {
		errs = append(errs, fmt.Errorf("auditArguments %q: want none, redacted, digested or all", c.AuditArguments))
	}
	if (c.EtcdCert == "") != (c.EtcdKey == "") {
		errs = append(errs, errors.New("etcdCert and etcdKey go together"))
	}
	if (c.EtcdCA != "" || c.EtcdCert != "") && len(c.EtcdEndpoints) == 0 {
		errs = append(errs, errors.New("etcdCA, etcdCert and etcdKey are for an external cluster (etcdEndpoints)"))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("tlsCert and tlsKey go together"))
	}
	if c.GatewayCaller != string(authz.CallerPrincipal) && c.GatewayCaller != string(authz.CallerOff) {
		errs = append(errs, errors.New("gatewayCaller must be principal or off"))
	}
	if c.SigningAlg != "EdDSA" && c.SigningAlg != "ES256" {
		errs = append(errs, errors.New("signingAlg must be EdDSA or ES256"))
	}
	if c.RegistrarKeys == "" {
		errs = append(errs, errors.New("registrarKeys (a JWKS file of trusted registrar keys) is required; --dev generates one"))
	}
	if c.Credentials == "" {
		errs = append(errs, errors.New("credentials (a file of hashed bearer credentials) is required; --dev generates one"))
	}
	if c.DecisionLogBuffer < 1 || c.DecisionLogUploadLimit < 1 || c.DecisionLogMinDelay <= 0 || c.DecisionLogMinDelay > c.DecisionLogMaxDelay {
		errs = append(errs, errors.New("decisionLogBuffer and decisionLogUploadLimit must be positive, and 0 < decisionLogMinDelay <= decisionLogMaxDelay"))
	}
	if _, err := c.decisionLogLabels(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// parseServeFlags builds the configuration from defaults, the --config
// file and the flags, in that order of precedence (last wins). Each flag
// is bound once to its Config field, which registration sets to the
// default: the command line is parsed once to find --config, the file is
// decoded into the same Config, and the command line is parsed again so
// that the flags given there win.
func parseServeFlags(args []string) (Config, error) {
	cfg, _, err := parseServe(args)
	return cfg, err
}

// parseServe is parseServeFlags that also reports --check.
func parseServe(args []string) (Config, bool, error) {
	var cfg Config
	fl := bindServeFlags(&cfg)
	if err := fl.parse(args); err != nil {
		return Config{}, false, err
	}
	if fl.configFile == "" {
		return cfg, fl.check, nil
	}
	if err := cfg.decodeFile(fl.configFile, fl.paths); err != nil {
		return Config{}, false, err
	}
	if err := fl.parse(args); err != nil {
		return Config{}, false, err
	}
	return cfg, fl.check, nil
}

// serveFlags is serve's flag set, bound to a Config.
type serveFlags struct {
	fs         *flag.FlagSet
	cfg        *Config
	configFile string
	// check is --check: validate the settings, then exit without starting.
	check bool
	// endpoints is --etcd-endpoints as given, a comma-separated list that
	// parse splits into cfg.EtcdEndpoints: a string flag, so that -h shows
	// it as one.
	endpoints string
	// paths are the fields that name files or directories: relative in the
	// configuration file, they are relative to the file.
	paths []*string
	// lists are the list flags, which a new parse starts afresh.
	lists []*listFlag
}

// listFlag is a list setting's flag: each use adds its comma-separated
// items, and the first use on a command line replaces what the default
// or the configuration file gave (an empty value leaves the list empty).
type listFlag struct {
	p     *[]string
	given bool
}

func (l *listFlag) String() string {
	if l == nil || l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l *listFlag) Set(v string) error {
	if !l.given {
		*l.p, l.given = []string{}, true
	}
	*l.p = append(*l.p, splitList(v)...)
	return nil
}

// bindServeFlags registers every flag of serve bound to its field of cfg,
// setting the field to the flag's default. This is the one place a
// setting's flag name, default and help are written.
func bindServeFlags(cfg *Config) *serveFlags {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fl := &serveFlags{fs: fs, cfg: cfg}
	path := func(p *string, name, value, usage string) {
		fs.StringVar(p, name, value, usage)
		fl.paths = append(fl.paths, p)
	}
	fs.StringVar(&fl.configFile, "config", "", "YAML or JSON configuration file; flags override it")
	fs.BoolVar(&fl.check, "check", false, "check the command line and the configuration file, then exit without starting: 0 if authzd would start with them (the files they name are not read)")
	fs.StringVar(&cfg.Listen, "listen", server.DefaultListen, "HTTP listen address")
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", "", "listen address of the Envoy ext_authz gRPC service (empty: off)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate (chain) to serve HTTPS and gRPC over TLS with (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	path(&cfg.DataDir, "data-dir", server.DefaultDataDir, "data directory (embedded etcd, dev keys and credentials)")
	fs.StringVar(&fl.endpoints, "etcd-endpoints", "", "comma-separated etcd client URLs of an external cluster; empty starts the embedded etcd")
	fs.StringVar(&cfg.EtcdPrefix, "etcd-prefix", server.DefaultEtcdPrefix, "key prefix in etcd")
	path(&cfg.EtcdCA, "etcd-ca", "", "PEM CA of an external etcd cluster served over TLS")
	path(&cfg.EtcdCert, "etcd-cert", "", "PEM client certificate for an external etcd cluster that authenticates clients (with --etcd-key)")
	path(&cfg.EtcdKey, "etcd-key", "", "PEM private key of --etcd-cert")
	fs.StringVar(&cfg.EmbeddedEtcdClientURL, "embedded-etcd-client-url", "", "client URL of the embedded etcd (loopback, served https with the credential in DATA-DIR/etcd/"+lease.TLSDir+"; default: the one DATA-DIR/etcd/"+lease.EndpointsFile+" recorded, else a free port)")
	fs.StringVar(&cfg.EmbeddedEtcdPeerURL, "embedded-etcd-peer-url", "", "peer URL of the embedded etcd (loopback; default: as for the client URL)")
	fs.Int64Var(&cfg.EtcdQuota, "etcd-quota", 0, "etcd backend quota in bytes: the embedded member's (0: 2 GiB), or what an external cluster runs with (0: unknown); shown in /readyz and metrics")
	fs.Float64Var(&cfg.FormationRate, "formation-rate", server.DefaultFormationRate, "formations a second each host credential may record on this replica (0: no limit)")
	fs.Int64Var(&cfg.FormationBurst, "formation-burst", server.DefaultFormationBurst, "formations a host credential may record at once (the rate limit's burst)")
	path(&cfg.RegistrarKeys, "registrar-keys", "", "JWKS file of trusted registrar public keys")
	path(&cfg.IssuerKeys, "issuer-keys", "", "JWKS file of trusted compatibility-certificate issuer keys")
	path(&cfg.OperatorKeys, "operator-keys", "", "JWKS file of operators' public keys: an uncertain lease is then resolved only by a resolution signed with one of them (authzd lease resolve; --dev generates one); empty: the operator's bearer credential alone resolves, for tests")
	path(&cfg.Credentials, "credentials", "", "JSON file of hashed bearer credentials")
	fs.Int64Var(&cfg.BodyLimit, "body-limit", server.DefaultBodyLimit, "request body limit in bytes")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&cfg.LogFormat, "log-format", telemetry.LogText, "log format: text or json (lines of a traced request carry trace_id and span_id)")
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "OpenTelemetry collector to export traces to over OTLP, e.g. http://collector:4318 (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing)")
	fs.StringVar(&cfg.OTLPProtocol, "otlp-protocol", "", "OTLP protocol of --otlp-endpoint: http/protobuf or grpc (default: $OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)")
	path(&cfg.PolicyDir, "policy-dir", "", "directory of Rego and Cedar policies (default: the embedded defaults)")
	fs.TextVar(&cfg.PolicyPoll, "policy-poll", Duration(server.DefaultPolicyPoll), "how often to check the policy directory for changes")
	path(&cfg.PolicyBundle, "policy-bundle", "", "`URL` (or file) of an OPA bundle of the policies, instead of --policy-dir: an http(s) URL polled with If-None-Match, or a .tar.gz file re-read as often (policies/README.md, Bundles)")
	path(&cfg.PolicyBundleKeys, "policy-bundle-keys", "", "file of the key that verifies the bundle's signature: a PEM public key, an HMAC secret, or OPA's keys object (required for a URL; without it only an unsigned bundle file is accepted)")
	fs.StringVar(&cfg.PolicyBundleKeyID, "policy-bundle-key-id", "", "name of the verification key: with one key in --policy-bundle-keys, its name (empty: "+policy.DefaultBundleKeyID+", as opa build names it); in a keys object, the one to use (empty: the signature's kid picks)")
	fs.StringVar(&cfg.PolicyBundleKeyAlg, "policy-bundle-key-alg", "", "algorithm of a single verification key: RS256, PS256, ES256, HS256, ... (default: from the key; HS256 for a secret)")
	fs.TextVar(&cfg.PolicyBundleMinDelay, "policy-bundle-min-delay", Duration(server.DefaultPolicyBundleMinDelay), "shortest wait between two polls of --policy-bundle")
	fs.TextVar(&cfg.PolicyBundleMaxDelay, "policy-bundle-max-delay", Duration(server.DefaultPolicyBundleMaxDelay), "longest wait between two polls of --policy-bundle (each wait is random between the two)")
	fs.TextVar(&cfg.FormationTTL, "formation-ttl", Duration(server.DefaultFormationTTL), "how long a formation may wait for approval and admission")
	fs.TextVar(&cfg.FormationRetention, "formation-retention", Duration(server.DefaultFormationRetention), "how long etcd keeps a formation after its lease closed or it expired; the audit trail keeps it after (authzd audit formation)")
	fs.TextVar(&cfg.ReportGrace, "report-grace", Duration(server.DefaultReportGrace), "how long after admission a token may be issued again and an outcome report is awaited (unreported leases are marked uncertain after twice this plus the token lifetime)")
	fs.StringVar(&cfg.GatewayCaller, "gateway-caller", server.DefaultGatewayCaller, "bind gateway admissions to the caller the gateway authenticated (its Fcd-Caller header): principal (a formation runs only for its principal) or off")
	path(&cfg.SigningKey, "signing-key", "", "private JWK that signs dispatch tokens (--dev generates one)")
	fs.StringVar(&cfg.SigningAlg, "signing-alg", "EdDSA", "algorithm of the key --dev generates: EdDSA or ES256")
	fs.StringVar(&cfg.Issuer, "issuer", server.DefaultIssuer, "iss claim of dispatch tokens")
	fs.StringVar(&cfg.AuditDir, "audit-dir", "", "audit trail directory (default: DATA-DIR/audit; off: none); checkpoints are signed with --signing-key")
	fs.TextVar(&cfg.AuditMaxLag, "audit-max-lag", Duration(server.DefaultAuditMaxLag), "how long a change committed to the store may wait unrecorded by this replica's audit trail before admissions and claims are refused (audit-trail-behind)")
	fs.StringVar(&cfg.AuditArguments, "audit-arguments", server.DefaultAuditArguments, "what the audit trail keeps of a call's arguments beside their digest: none, redacted or digested (sensitive members — writeOnly in the input schema, or named like a secret — replaced by [redacted] or their digest), or all")
	fs.StringVar(&cfg.Replica, "replica", "", "this replica's name in the audit trail, stable across restarts and distinct between replicas (default: the host name)")
	fs.TextVar(&cfg.TokenLifetime, "token-lifetime", Duration(server.DefaultTokenLifetime), "dispatch token lifetime")
	fs.StringVar(&cfg.DecisionLogURL, "decision-log-url", "", "URL of a service to export decision logs to in OPA's format (empty: none)")
	fs.StringVar(&cfg.DecisionLogResource, "decision-log-resource", server.DefaultDecisionLogResource, "path under --decision-log-url that decision logs are posted to")
	path(&cfg.DecisionLogCredentialFile, "decision-log-credential-file", "", "file holding the decision-log service's bearer credential (default: $FCD_DECISION_LOG_CREDENTIAL, else none)")
	cfg.DecisionLogMask = []string{server.DefaultDecisionLogMask}
	fl.lists = append(fl.lists, &listFlag{p: &cfg.DecisionLogMask}, &listFlag{p: &cfg.DecisionLogLabels})
	fs.Var(fl.lists[0], "decision-log-mask", "JSON `pointers` (/input/..., /result/...) to erase from decision-log events, comma-separated or repeated; empty: none")
	fs.Var(fl.lists[1], "decision-log-labels", "`key=value` labels of every decision-log event, comma-separated or repeated")
	fs.Int64Var(&cfg.DecisionLogBuffer, "decision-log-buffer", server.DefaultDecisionLogBuffer, "decision-log events held for upload; when full, the oldest is dropped")
	fs.Int64Var(&cfg.DecisionLogUploadLimit, "decision-log-upload-limit", server.DefaultDecisionLogUploadLimit, "largest decision-log upload in bytes, gzip-compressed")
	fs.TextVar(&cfg.DecisionLogMinDelay, "decision-log-min-delay", Duration(server.DefaultDecisionLogMinDelay), "shortest wait between decision-log uploads")
	fs.TextVar(&cfg.DecisionLogMaxDelay, "decision-log-max-delay", Duration(server.DefaultDecisionLogMaxDelay), "longest wait between decision-log uploads (and longest retry backoff)")
	fs.StringVar(&cfg.NotifyURL, "notify-url", "", "URL that receives a signed webhook when a formation starts waiting for approval, is approved, denied or expires (empty: none; docs/approvals.md)")
	path(&cfg.NotifySecretFile, "notify-secret-file", "", "file holding the key webhooks are signed with (HMAC-SHA256, header Fcd-Signature); required with --notify-url")
	fs.StringVar(&cfg.NotifyFormat, "notify-format", authz.FormatJSON, "webhook body: json (the documented payload) or slack ({\"text\": ...})")
	fs.StringVar(&cfg.NotifyPageURL, "notify-page-url", "", "the approval page's public address (https://HOST/ui/), linked from each webhook (empty: no link)")
	fs.Int64Var(&cfg.NotifyQueue, "notify-queue", authz.DefaultNotifyQueue, "webhooks held for delivery; when full, a new one is dropped and counted")
	fs.BoolVar(&cfg.Dev, "dev", false, "development mode: generate keys and one credential per role in the data directory")
	return fl
}

// parse parses args into the bound Config; flags not given keep what the
// Config holds.
func (fl *serveFlags) parse(args []string) error {
	for _, l := range fl.lists {
		l.given = false
	}
	if err := cli.Parse(fl.fs, args); err != nil {
		return err
	}
	fl.parsed()
	return nil
}

// parsed sets the fields a flag fills only once the command line is read.
func (fl *serveFlags) parsed() {
	fl.fs.Visit(func(f *flag.Flag) {
		if f.Name == "etcd-endpoints" {
			fl.cfg.EtcdEndpoints = splitList(fl.endpoints)
		}
	})
}

// parseConnectionFlags parses the command line of a command that reaches
// the store as serve does (`authzd store ...`): serve's flags and --config
// file, with the same precedence, and at most one positional argument,
// which it returns ("" when none). more registers the command's own
// flags. Only the store's settings matter to such a command; the others
// are accepted, so that the one configuration file serves both.
func parseConnectionFlags(name string, args []string, more func(*flag.FlagSet)) (Config, string, error) {
	var cfg Config
	fl := bindServeFlags(&cfg)
	fl.fs.Init(name, flag.ContinueOnError)
	if more != nil {
		more(fl.fs)
	}
	parse := func() (string, error) {
		for _, l := range fl.lists {
			l.given = false
		}
		pos, err := parseInterspersed(fl.fs, args)
		if err != nil {
			return "", err
		}
		fl.parsed()
		return pos, nil
	}
	pos, err := parse()
	if err != nil || fl.configFile == "" {
		return cfg, pos, err
	}
	if err := cfg.decodeFile(fl.configFile, fl.paths); err != nil {
		return Config{}, "", err
	}
	pos, err = parse()
	return cfg, pos, err
}

// etcdDir is the embedded member's data directory (server.Config.EtcdDir).
func (c *Config) etcdDir() string { return c.server(nil, nil).EtcdDir() }

// embedConfig is the embedded member of DataDir: what serve starts, and
// what a store command starts when no authzd runs on the directory
// (server.Config.EmbedConfig).
func (c *Config) embedConfig() lease.EmbedConfig { return c.server(nil, nil).EmbedConfig() }

// storeConfig is how authzd reaches its etcd, for serve and for the store
// commands alike (server.Config.StoreConfig, the one place it is decided).
func (c *Config) storeConfig(member *lease.Embedded, log *slog.Logger) (lease.Config, error) {
	return c.server(log, nil).StoreConfig(member)
}

// decodeFile decodes the configuration file over c: the keys it has
// replace c's fields, unknown keys are refused, and relative paths in
// the fields paths points to are made relative to the file.
func (c *Config) decodeFile(file string, paths []*string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := decodeConfig(data, c); err != nil {
		return fmt.Errorf("config %s: %w", file, err)
	}
	base := filepath.Dir(file)
	for _, p := range paths {
		if *p != "" && !filepath.IsAbs(*p) && !strings.Contains(*p, "://") { // a URL is no path
			*p = filepath.Join(base, *p)
		}
	}
	return nil
}

// Duration is a time.Duration written as text ("15m", "2s") in flags and
// in the configuration file.
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration like 30s or 15m", b)
	}
	*d = Duration(v)
	return nil
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

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
