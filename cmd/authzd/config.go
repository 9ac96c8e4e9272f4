package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fcd-authz/fcd/authz"
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
	// RegistrarKeys is a JWKS file of trusted registrar public keys.
	RegistrarKeys string `json:"registrarKeys"`
	// IssuerKeys is a JWKS file of trusted compatibility-certificate issuer
	// public keys; empty refuses certificates. --dev generates one.
	IssuerKeys string `json:"issuerKeys"`
	// Credentials is a JSON file: a list of {id, role, hash} bearer
	// credentials (see `authzd credential new`).
	Credentials string `json:"credentials"`
	// BodyLimit bounds request bodies in bytes.
	BodyLimit int64 `json:"bodyLimit"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"logLevel"`
	// PolicyDir is a directory of Rego and Cedar policies with their
	// tests; empty uses the embedded default policies. A directory is
	// watched and reloaded on change and on SIGHUP.
	PolicyDir string `json:"policyDir"`
	// PolicyPoll is how often the policy directory is checked for changes.
	PolicyPoll Duration `json:"policyPoll"`
	// FormationTTL is how long a formation may wait for approval and
	// admission.
	FormationTTL Duration `json:"formationTTL"`
	// SigningKey is the private JWK (Ed25519 or P-256, with a kid) that
	// signs dispatch tokens; --dev generates one. Without it the server
	// registers and forms but does not admit.
	SigningKey string `json:"signingKey"`
	// SigningAlg is the algorithm of the key --dev generates: EdDSA or
	// ES256.
	SigningAlg string `json:"signingAlg"`
	// Issuer is the iss claim of dispatch tokens.
	Issuer string `json:"issuer"`
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
	// Dev creates the data directory, a registrar key pair and one
	// credential per role, and writes DataDir/dev-credentials.json.
	Dev bool `json:"dev"`
}

// defaultConfig returns the configuration of `authzd serve` with no flags.
func defaultConfig() Config {
	return Config{
		Listen:                "127.0.0.1:8080",
		DataDir:               "fcd-data",
		EtcdPrefix:            "/fcd/",
		EmbeddedEtcdClientURL: "http://127.0.0.1:2379",
		EmbeddedEtcdPeerURL:   "http://127.0.0.1:2380",
		BodyLimit:             1 << 20,
		LogLevel:              "info",
		PolicyPoll:            Duration(2 * time.Second),
		FormationTTL:          Duration(15 * time.Minute),
		SigningAlg:            "EdDSA",
		Issuer:                "fcd",
		TokenLifetime:         Duration(30 * time.Second),
		ReportGrace:           Duration(5 * time.Minute),
		GatewayCaller:         string(authz.CallerPrincipal),
	}
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
	if c.BodyLimit <= 0 {
		errs = append(errs, errors.New("bodyLimit must be positive"))
	}
	if c.PolicyPoll <= 0 || c.FormationTTL <= 0 || c.ReportGrace <= 0 {
		errs = append(errs, errors.New("policyPoll, formationTTL and reportGrace must be positive"))
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
	return errors.Join(errs...)
}

// parseServeFlags builds the configuration from defaults, the --config
// file and the flags, in that order of precedence (last wins).
func parseServeFlags(args []string) (Config, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	var fl Config
	def := defaultConfig()
	configFile := fs.String("config", "", "YAML or JSON configuration file; flags override it")
	fs.StringVar(&fl.Listen, "listen", def.Listen, "HTTP listen address")
	fs.StringVar(&fl.GRPCListen, "grpc-listen", "", "listen address of the Envoy ext_authz gRPC service (empty: off)")
	fs.StringVar(&fl.TLSCert, "tls-cert", "", "PEM certificate (chain) to serve HTTPS and gRPC over TLS with (with --tls-key)")
	fs.StringVar(&fl.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&fl.DataDir, "data-dir", def.DataDir, "data directory (embedded etcd, dev keys and credentials)")
	endpoints := fs.String("etcd-endpoints", "", "comma-separated etcd client URLs of an external cluster; empty starts the embedded etcd")
	fs.StringVar(&fl.EtcdPrefix, "etcd-prefix", def.EtcdPrefix, "key prefix in etcd")
	fs.StringVar(&fl.EtcdCA, "etcd-ca", "", "PEM CA of an external etcd cluster served over TLS")
	fs.StringVar(&fl.EtcdCert, "etcd-cert", "", "PEM client certificate for an external etcd cluster that authenticates clients (with --etcd-key)")
	fs.StringVar(&fl.EtcdKey, "etcd-key", "", "PEM private key of --etcd-cert")
	fs.StringVar(&fl.EmbeddedEtcdClientURL, "embedded-etcd-client-url", def.EmbeddedEtcdClientURL, "client URL of the embedded etcd (loopback)")
	fs.StringVar(&fl.EmbeddedEtcdPeerURL, "embedded-etcd-peer-url", def.EmbeddedEtcdPeerURL, "peer URL of the embedded etcd (loopback)")
	fs.StringVar(&fl.RegistrarKeys, "registrar-keys", "", "JWKS file of trusted registrar public keys")
	fs.StringVar(&fl.IssuerKeys, "issuer-keys", "", "JWKS file of trusted compatibility-certificate issuer keys")
	fs.StringVar(&fl.Credentials, "credentials", "", "JSON file of hashed bearer credentials")
	fs.Int64Var(&fl.BodyLimit, "body-limit", def.BodyLimit, "request body limit in bytes")
	fs.StringVar(&fl.LogLevel, "log-level", def.LogLevel, "log level: debug, info, warn, error")
	fs.StringVar(&fl.PolicyDir, "policy-dir", "", "directory of Rego and Cedar policies (default: the embedded defaults)")
	fs.TextVar(&fl.PolicyPoll, "policy-poll", def.PolicyPoll, "how often to check the policy directory for changes")
	fs.TextVar(&fl.FormationTTL, "formation-ttl", def.FormationTTL, "how long a formation may wait for approval and admission")
	fs.TextVar(&fl.ReportGrace, "report-grace", def.ReportGrace, "how long after admission a token may be issued again and an outcome report is awaited (unreported leases are marked uncertain after twice this plus the token lifetime)")
	fs.StringVar(&fl.GatewayCaller, "gateway-caller", def.GatewayCaller, "bind gateway admissions to the caller the gateway authenticated (its Fcd-Caller header): principal (a formation runs only for its principal) or off")
	fs.StringVar(&fl.SigningKey, "signing-key", "", "private JWK that signs dispatch tokens (--dev generates one)")
	fs.StringVar(&fl.SigningAlg, "signing-alg", def.SigningAlg, "algorithm of the key --dev generates: EdDSA or ES256")
	fs.StringVar(&fl.Issuer, "issuer", def.Issuer, "iss claim of dispatch tokens")
	fs.TextVar(&fl.TokenLifetime, "token-lifetime", def.TokenLifetime, "dispatch token lifetime")
	fs.BoolVar(&fl.Dev, "dev", false, "development mode: generate keys and one credential per role in the data directory")
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *endpoints != "" {
		fl.EtcdEndpoints = splitList(*endpoints)
	}

	cfg := def
	if *configFile != "" {
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", *configFile, err)
		}
		// Relative paths in the file are relative to the file.
		base := filepath.Dir(*configFile)
		for _, p := range []*string{&cfg.DataDir, &cfg.RegistrarKeys, &cfg.Credentials, &cfg.PolicyDir, &cfg.SigningKey, &cfg.IssuerKeys} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(base, *p)
			}
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	override := map[string]func(){
		"listen":                   func() { cfg.Listen = fl.Listen },
		"grpc-listen":              func() { cfg.GRPCListen = fl.GRPCListen },
		"tls-cert":                 func() { cfg.TLSCert = fl.TLSCert },
		"tls-key":                  func() { cfg.TLSKey = fl.TLSKey },
		"data-dir":                 func() { cfg.DataDir = fl.DataDir },
		"etcd-endpoints":           func() { cfg.EtcdEndpoints = fl.EtcdEndpoints },
		"etcd-prefix":              func() { cfg.EtcdPrefix = fl.EtcdPrefix },
		"etcd-ca":                  func() { cfg.EtcdCA = fl.EtcdCA },
		"etcd-cert":                func() { cfg.EtcdCert = fl.EtcdCert },
		"etcd-key":                 func() { cfg.EtcdKey = fl.EtcdKey },
		"embedded-etcd-client-url": func() { cfg.EmbeddedEtcdClientURL = fl.EmbeddedEtcdClientURL },
		"embedded-etcd-peer-url":   func() { cfg.EmbeddedEtcdPeerURL = fl.EmbeddedEtcdPeerURL },
		"registrar-keys":           func() { cfg.RegistrarKeys = fl.RegistrarKeys },
		"credentials":              func() { cfg.Credentials = fl.Credentials },
		"issuer-keys":              func() { cfg.IssuerKeys = fl.IssuerKeys },
		"body-limit":               func() { cfg.BodyLimit = fl.BodyLimit },
		"log-level":                func() { cfg.LogLevel = fl.LogLevel },
		"dev":                      func() { cfg.Dev = fl.Dev },
		"policy-dir":               func() { cfg.PolicyDir = fl.PolicyDir },
		"policy-poll":              func() { cfg.PolicyPoll = fl.PolicyPoll },
		"formation-ttl":            func() { cfg.FormationTTL = fl.FormationTTL },
		"report-grace":             func() { cfg.ReportGrace = fl.ReportGrace },
		"gateway-caller":           func() { cfg.GatewayCaller = fl.GatewayCaller },
		"signing-key":              func() { cfg.SigningKey = fl.SigningKey },
		"signing-alg":              func() { cfg.SigningAlg = fl.SigningAlg },
		"issuer":                   func() { cfg.Issuer = fl.Issuer },
		"token-lifetime":           func() { cfg.TokenLifetime = fl.TokenLifetime },
	}
	for name := range set {
		if o, ok := override[name]; ok {
			o()
		}
	}
	return cfg, nil
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
		return err
	}
	*d = Duration(v)
	return nil
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
