package lease

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// TLSDir is the directory, inside an embedded member's data directory,
// that holds the credentials authzd generates for it (mode 0700, every
// file 0600): a CA certificate, the member's certificate and key, and the
// one client certificate and key the member accepts. The CA's private key
// is never written: it signs the two certificates and is forgotten, so
// no file lets anyone mint another credential.
const TLSDir = "tls"

// The files of TLSDir.
const (
	tlsCAFile     = "ca.crt"
	tlsMemberCert = "member.crt"
	tlsMemberKey  = "member.key"
	tlsClientCert = "client.crt"
	tlsClientKey  = "client.key"
)

// Common names of the generated certificates. The peer listener accepts
// only the member's own name, so that the client credential cannot speak
// raft to it.
const (
	memberCN = "fcd-embedded-etcd"
	clientCN = "authzd"
)

// credentialLifetime is how long generated certificates are valid;
// credentialRenewal is how close to their end a start replaces them.
// Renewal happens only at a start, while the member is stopped and its
// directory locked, so the lifetime is long: a server runs for years
// without a restart more rarely than it is restarted within one.
const (
	credentialLifetime = 10 * 365 * 24 * time.Hour
	credentialRenewal  = 365 * 24 * time.Hour
)

// ClientAccess is what a client needs to reach an etcd: its endpoints and
// the TLS configuration it dials them with. Every client of an embedded
// member (the server, the CLI's store commands) gets it from
// [EmbeddedAccess], so that all of them use the member's one credential.
type ClientAccess struct {
	// Endpoints are the client URLs.
	Endpoints []string
	// TLS is the client TLS configuration; nil for plain http.
	TLS *tls.Config
	// CAFile, CertFile and KeyFile are the PEM files TLS is built from
	// (etcdctl's --cacert, --cert, --key); empty when TLS is nil or was
	// not built from files of the directory.
	CAFile, CertFile, KeyFile string
}

// EmbeddedAccess returns how to reach the embedded member whose data
// directory is dir, from what its last start recorded there
// (EndpointsFile) and the credentials it generated (TLSDir). It does not
// need the member to run, nor to be the process that runs it.
func EmbeddedAccess(dir string) (ClientAccess, error) {
	path := filepath.Join(dir, EndpointsFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return ClientAccess{}, fmt.Errorf("lease: the embedded etcd's endpoints (has it started on %s?): %w", dir, err)
	}
	var rec recordedURLs
	if err := json.Unmarshal(b, &rec); err != nil {
		return ClientAccess{}, fmt.Errorf("lease: %s: %w", path, err)
	}
	if rec.ClientURL == "" {
		return ClientAccess{}, fmt.Errorf("lease: %s records no client URL", path)
	}
	acc := ClientAccess{Endpoints: []string{rec.ClientURL}}
	if rec.CA == "" {
		// A member that is not authzd's (OpenLoopback, or TLS of the
		// caller's own): nothing generated to use.
		return acc, nil
	}
	acc.CAFile, acc.CertFile, acc.KeyFile = filepath.Join(dir, rec.CA), filepath.Join(dir, rec.Cert), filepath.Join(dir, rec.Key)
	info := transport.TLSInfo{TrustedCAFile: acc.CAFile, CertFile: acc.CertFile, KeyFile: acc.KeyFile}
	if acc.TLS, err = info.ClientConfig(); err != nil {
		return ClientAccess{}, fmt.Errorf("lease: the embedded etcd's client credentials in %s: %w", filepath.Join(dir, TLSDir), err)
	}
	return acc, nil
}

// memberCredentials are the generated files a member serves with.
type memberCredentials struct {
	dir string // the TLS directory
}

func (c memberCredentials) path(name string) string { return filepath.Join(c.dir, name) }

// clientInfo is the member's client listener: its certificate, and
// clients must present one the CA signed.
func (c memberCredentials) clientInfo() transport.TLSInfo {
	return transport.TLSInfo{
		CertFile: c.path(tlsMemberCert), KeyFile: c.path(tlsMemberKey),
		TrustedCAFile: c.path(tlsCAFile), ClientCertAuth: true,
	}
}

// peerInfo is the member's peer listener: as clientInfo, and only the
// member's own certificate is accepted.
func (c memberCredentials) peerInfo() transport.TLSInfo {
	info := c.clientInfo()
	info.AllowedCNs = []string{memberCN}
	return info
}

// ensureCredentials makes sure TLSDir in dir holds a valid set of
// credentials: it keeps one that parses, chains to its CA, and is valid
// for longer than credentialRenewal after now; otherwise it writes a new
// set (new CA, new certificates) and reports created.
func ensureCredentials(dir string, now time.Time) (creds memberCredentials, created bool, err error) {
	creds = memberCredentials{dir: filepath.Join(dir, TLSDir)}
	if err := os.MkdirAll(creds.dir, 0o700); err != nil {
		return creds, false, fmt.Errorf("lease: embedded etcd credentials: %w", err)
	}
	// MkdirAll leaves an existing directory's mode: make sure.
	if err := os.Chmod(creds.dir, 0o700); err != nil {
		return creds, false, fmt.Errorf("lease: embedded etcd credentials: %w", err)
	}
	if creds.valid(now) == nil {
		return creds, false, nil
	}
	if err := creds.generate(now); err != nil {
		return creds, false, fmt.Errorf("lease: generate the embedded etcd's credentials in %s: %w", creds.dir, err)
	}
	return creds, true, nil
}

// valid reports why the credentials cannot be kept, or nil.
func (c memberCredentials) valid(now time.Time) error {
	caPEM, err := os.ReadFile(c.path(tlsCAFile))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("no CA certificate")
	}
	for _, pair := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
	}{{tlsMemberCert, tlsMemberKey, x509.ExtKeyUsageServerAuth}, {tlsClientCert, tlsClientKey, x509.ExtKeyUsageClientAuth}} {
		kp, err := tls.LoadX509KeyPair(c.path(pair.cert), c.path(pair.key))
		if err != nil {
			return err
		}
		cert, err := x509.ParseCertificate(kp.Certificate[0])
		if err != nil {
			return err
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now.Add(credentialRenewal),
			KeyUsages: []x509.ExtKeyUsage{pair.usage}}); err != nil {
			return fmt.Errorf("%s: %w", pair.cert, err)
		}
	}
	return nil
}

// generate writes a new CA certificate and the member's and the client's
// certificates and keys, each file 0600, replacing what was there.
func (c memberCredentials) generate(now time.Time) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	ca := &x509.Certificate{
		Subject: pkix.Name{CommonName: "fcd embedded etcd CA"}, IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := sign(ca, ca, &caKey.PublicKey, caKey, now)
	if err != nil {
		return err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return err
	}
	// The member's certificate is also a client certificate: etcd's
	// gRPC gateway dials the client listener with it.
	memberKey, memberDER, err := issue(ca, caKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: memberCN}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, now)
	if err != nil {
		return err
	}
	clientKey, clientDER, err := issue(ca, caKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: clientCN}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, now)
	if err != nil {
		return err
	}
	files := []struct {
		name, typ string
		der       []byte
	}{
		{tlsCAFile, "CERTIFICATE", caDER},
		{tlsMemberCert, "CERTIFICATE", memberDER}, {tlsMemberKey, "PRIVATE KEY", memberKey},
		{tlsClientCert, "CERTIFICATE", clientDER}, {tlsClientKey, "PRIVATE KEY", clientKey},
	}
	for _, f := range files {
		if err := writePrivate(c.path(f.name), pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})); err != nil {
			return err
		}
	}
	return nil
}

// issue makes a P-256 key and a certificate of tmpl for it signed by ca;
// it returns the key in PKCS #8 and the certificate, both DER.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate, now time.Time) (key, cert []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if cert, err = sign(tmpl, ca, &k.PublicKey, caKey, now); err != nil {
		return nil, nil, err
	}
	key, err = x509.MarshalPKCS8PrivateKey(k)
	return key, cert, err
}

// sign fills tmpl's serial number and validity and signs it.
func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, parentKey *ecdsa.PrivateKey, now time.Time) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(credentialLifetime)
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
}

// writePrivate writes a file only its owner can read, through a temporary
// file renamed over the old one: a crash leaves the old file or the new,
// never half of one.
func writePrivate(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
