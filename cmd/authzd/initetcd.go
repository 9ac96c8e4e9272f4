package main

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/lease"
	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// etcdUser is the etcd user fcd connects to an external cluster as: the
// common name of its client certificate, and the name of its role.
const etcdUser = "fcd"

// etcdCertLifetime is how long a client certificate init signs is valid.
const etcdCertLifetime = 365 * 24 * time.Hour

// externalEtcd are init's flags for an external cluster.
type externalEtcd struct {
	endpoints, prefix, ca, caKey, adminCert, adminKey string
	enableAuth                                        bool
}

// given reports whether init sets up an external cluster.
func (x *externalEtcd) given() bool { return x.endpoints != "" }

// validate refuses flags that do not make a setup.
func (x *externalEtcd) validate() error {
	switch {
	case !x.given() && (x.ca != "" || x.caKey != "" || x.adminCert != "" || x.enableAuth):
		return fmt.Errorf("%w: --etcd-ca, --etcd-ca-key, --etcd-admin-cert and --etcd-enable-auth are for an external cluster (--etcd-endpoints)", cli.ErrUsage)
	case !x.given():
		return nil
	case x.ca == "":
		return fmt.Errorf("%w: --etcd-endpoints needs --etcd-ca: fcd reaches an external cluster over TLS with a client certificate", cli.ErrUsage)
	case (x.adminCert == "") != (x.adminKey == ""):
		return fmt.Errorf("%w: --etcd-admin-cert and --etcd-admin-key go together", cli.ErrUsage)
	case x.enableAuth && x.adminCert == "":
		return fmt.Errorf("%w: --etcd-enable-auth needs the root user's --etcd-admin-cert", cli.ErrUsage)
	}
	if !strings.HasPrefix(x.prefix, "/") || !strings.HasSuffix(x.prefix, "/") {
		return fmt.Errorf("%w: --etcd-prefix %q: a prefix between slashes", cli.ErrUsage, x.prefix)
	}
	return nil
}

// setup writes DIR/etcd (0700): the cluster's CA (ca.crt), fcd's client
// key (fcd.key, 0600) and either its certificate (fcd.crt, CN fcd) signed
// with --etcd-ca-key, or a request for one (fcd.csr) for the cluster's CA
// to sign into fcd.crt. With the admin credential it then creates the
// user fcd and its role, readwrite on the prefix alone
// (lease.GrantPrefix), and with --etcd-enable-auth turns etcd's
// authentication on. It returns the configuration lines and what to
// report.
func (x *externalEtcd) setup(ctx context.Context, dir string) (config string, report map[string]any, err error) {
	etcdDir := filepath.Join(dir, "etcd")
	if err := os.Mkdir(etcdDir, 0o700); err != nil {
		return "", nil, fmt.Errorf("%w: %w", errInitExists, err)
	}
	caPEM, err := os.ReadFile(x.ca)
	if err != nil {
		return "", nil, fmt.Errorf("etcd CA: %w", err)
	}
	if err := writeFile(filepath.Join(etcdDir, "ca.crt"), caPEM, 0o600); err != nil {
		return "", nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", nil, err
	}
	if err := writeFile(filepath.Join(etcdDir, "fcd.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", nil, err
	}
	report = map[string]any{"etcdUser": etcdUser, "etcdPrefix": x.prefix, "etcdKey": filepath.Join(etcdDir, "fcd.key")}
	certPath := filepath.Join(etcdDir, "fcd.crt")
	if x.caKey != "" {
		der, err := signClientCert(caPEM, x.caKey, key)
		if err != nil {
			return "", nil, fmt.Errorf("sign fcd's etcd client certificate: %w", err)
		}
		if err := writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			return "", nil, err
		}
		report["etcdCert"] = certPath
	} else {
		csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: etcdUser}}, key)
		if err != nil {
			return "", nil, err
		}
		csrPath := filepath.Join(etcdDir, "fcd.csr")
		if err := writeFile(csrPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}), 0o644); err != nil {
			return "", nil, err
		}
		report["etcdCSR"] = csrPath
		report["next"] = "have the cluster's CA sign " + csrPath + " (client auth, CN " + etcdUser + ") into " + certPath + " (docs/trust.md)"
	}
	endpoints := splitList(x.endpoints)
	if x.adminCert != "" {
		info := transport.TLSInfo{TrustedCAFile: x.ca, CertFile: x.adminCert, KeyFile: x.adminKey}
		adminTLS, err := info.ClientConfig()
		if err != nil {
			return "", nil, fmt.Errorf("etcd admin TLS: %w", err)
		}
		grant, err := lease.GrantPrefix(ctx, lease.ClientAccess{Endpoints: endpoints, TLS: adminTLS}, etcdUser, x.prefix, x.enableAuth)
		if err != nil {
			return "", nil, err
		}
		report["etcdGrant"] = grant
		if !grant.AuthEnabled {
			report["warning"] = "etcd authentication is off: every client the cluster lets in may write fcd's keys until it is enabled (--etcd-enable-auth, or etcdctl auth enable: docs/trust.md)"
		}
	}
	config = fmt.Sprintf(`etcdEndpoints: [%s]
etcdPrefix: %q
etcdCA: etcd/ca.crt
etcdCert: etcd/fcd.crt
etcdKey: etcd/fcd.key
`, strings.Join(quoteAll(endpoints), ", "), x.prefix)
	return config, report, nil
}

// signClientCert signs a client certificate for key, CN etcdUser, with
// the CA of caPEM whose private key is in the PEM file caKeyPath.
func signClientCert(caPEM []byte, caKeyPath string, key *ecdsa.PrivateKey) ([]byte, error) {
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return nil, errors.New("the CA file holds no PEM certificate")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(caKeyPath)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(caPEM, keyPEM) // checks the key is the CA's
	if err != nil {
		return nil, fmt.Errorf("CA key %s: %w", caKeyPath, err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s cannot sign", caKeyPath)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: etcdUser},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(etcdCertLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, signer)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}
