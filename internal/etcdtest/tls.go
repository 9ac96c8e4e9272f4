package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TLSFiles are PEM files made by WriteCerts: a CA, a server certificate
// for 127.0.0.1 and client certificates, all signed by the CA: Client
// (CN authzd), FCD (CN fcd, the user fcd's RBAC setup names) and Root (CN
// root, etcd's administrator once authentication is on).
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	FCDCert, FCDKey, RootCert, RootKey               string
	// CAKey is the CA's private key, for tests of a tool that signs.
	CAKey string
}

// FCDConfig is ClientConfig with the fcd user's certificate.
func (f TLSFiles) FCDConfig(t testing.TB) *tls.Config {
	t.Helper()
	return TLSFiles{CA: f.CA, ClientCert: f.FCDCert, ClientKey: f.FCDKey}.ClientConfig(t)
}

// RootConfig is ClientConfig with the root user's certificate.
func (f TLSFiles) RootConfig(t testing.TB) *tls.Config {
	t.Helper()
	return TLSFiles{CA: f.CA, ClientCert: f.RootCert, ClientKey: f.RootKey}.ClientConfig(t)
}

// StartTLSWithAuth is StartTLS with etcd's authentication on, as
// docs/trust.md sets up an external cluster: a user root (role root) and a
// user fcd whose role fcd may read and write the keys under prefix and
// nothing else, each authenticated by its certificate's CN, no password.
// The member's own raw operations (PutRaw) go as root.
func StartTLSWithAuth(t testing.TB, prefix string) (*Member, TLSFiles) {
	t.Helper()
	m, files := StartTLS(t)
	m.tls = files.RootConfig(t)
	cli := m.client(t)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noPassword := &clientv3.UserAddOptions{NoPassword: true}
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAddWithOptions(ctx, "root", "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "fcd"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "fcd", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAddWithOptions(ctx, "fcd", "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "fcd", "fcd"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("etcdtest: auth setup step %d: %v", i, err)
		}
	}
	return m, files
}

// ClientConfig is the client TLS configuration of the files, as an
// operator's flags would build it.
func (f TLSFiles) ClientConfig(t testing.TB) *tls.Config {
	t.Helper()
	c, err := transport.TLSInfo{TrustedCAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey}.ClientConfig()
	if err != nil {
		t.Fatalf("etcdtest: client TLS: %v", err)
	}
	return c
}

// StartTLS starts a single-node member that serves its clients over TLS
// on loopback and requires a client certificate signed by its CA, like a
// production cluster; it is stopped when the test ends.
func StartTLS(t testing.TB) (*Member, TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	files := WriteCerts(t, dir)
	clientTLS := files.ClientConfig(t)
	m := startFresh(t, func(attempt int) *Member {
		addrs := FreeAddrs(t, 2)
		return &Member{t: t, tls: clientTLS, cfg: lease.EmbedConfig{
			Dir:       filepath.Join(dir, fmt.Sprintf("etcd-%d", attempt)),
			LogFile:   filepath.Join(dir, "etcd.log"),
			ClientURL: "https://" + addrs[0],
			PeerURL:   "http://" + addrs[1],
			ClientTLS: &transport.TLSInfo{CertFile: files.ServerCert, KeyFile: files.ServerKey, TrustedCAFile: files.CA, ClientCertAuth: true},
		}}
	})
	return m, files
}

// WriteCerts writes into dir a CA, a server certificate for 127.0.0.1 and
// a client certificate, both signed by the CA, with their keys; valid for
// an hour around now.
func WriteCerts(t testing.TB, dir string) TLSFiles {
	t.Helper()
	caKey, caDER := newCert(t, nil, nil, &x509.Certificate{
		Subject: pkix.Name{CommonName: "etcdtest CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	serverKey, serverDER := newCert(t, ca, caKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "etcd"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	clientCert := func(cn string) (*ecdsa.PrivateKey, []byte) {
		return newCert(t, ca, caKey, &x509.Certificate{
			Subject: pkix.Name{CommonName: cn}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
	}
	clientKey, clientDER := clientCert("authzd")
	fcdKey, fcdDER := clientCert("fcd")
	rootKey, rootDER := clientCert("root")
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return TLSFiles{
		CA:         write("ca.crt", "CERTIFICATE", caDER),
		CAKey:      write("ca.key", "EC PRIVATE KEY", keyDER(caKey)),
		ServerCert: write("server.crt", "CERTIFICATE", serverDER),
		ServerKey:  write("server.key", "EC PRIVATE KEY", keyDER(serverKey)),
		ClientCert: write("client.crt", "CERTIFICATE", clientDER),
		ClientKey:  write("client.key", "EC PRIVATE KEY", keyDER(clientKey)),
		FCDCert:    write("fcd.crt", "CERTIFICATE", fcdDER),
		FCDKey:     write("fcd.key", "EC PRIVATE KEY", keyDER(fcdKey)),
		RootCert:   write("root.crt", "CERTIFICATE", rootDER),
		RootKey:    write("root.key", "EC PRIVATE KEY", keyDER(rootKey)),
	}
}

// newCert creates a P-256 key and a certificate of tmpl for it, signed by
// parent (self-signed when parent is nil), valid for an hour around now.
func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}
