package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeCheck: serve --check validates the command line and the
// configuration file as serve does before it starts, and exits without
// starting: 0 and "configuration ok" when serve would start, 1 naming the
// setting, or 2 for a flag it does not know. It reads none of the files
// the settings name and writes nothing (not even --dev's data directory).
func TestServeCheck(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good.yaml", "listen: 0.0.0.0:8080\nregistrarKeys: /nonexistent/registrar-jwks.json\ncredentials: /nonexistent/credentials.json\n"+
		"etcdEndpoints: [https://etcd-0:2379]\netcdCA: ca.crt\netcdCert: fcd.crt\netcdKey: fcd.key\n")
	unknown := file("unknown.yaml", "listen: 0.0.0.0:8080\nlisten_address: x\n")
	devData := filepath.Join(dir, "dev-data")
	for _, tc := range []struct {
		name   string
		args   []string
		status int
		out    string
	}{
		{name: "file", args: []string{"--config", good}, status: 0, out: "authzd: configuration ok"},
		{name: "file and flags", args: []string{"--config", good, "--listen", ":9090", "--token-lifetime", "1m"}, status: 0, out: "configuration ok"},
		{name: "dev", args: []string{"--dev", "--data-dir", devData}, status: 0, out: "configuration ok"},
		{name: "no credentials", args: []string{"--registrar-keys", "k"}, status: 1, out: "credentials"},
		{name: "cert without key", args: []string{"--config", good, "--etcd-key", ""}, status: 1, out: "etcdCert and etcdKey go together"},
		{name: "log level", args: []string{"--config", good, "--log-level", "loud"}, status: 1, out: "log level"},
		{name: "unknown key", args: []string{"--config", unknown}, status: 1, out: "listen_address"},
		{name: "unknown flag", args: []string{"--config", good, "--listen-addr", "x"}, status: 2, out: "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			status := run(t.Context(), append([]string{"serve", "--check"}, tc.args...), nil, &out, &errb)
			if status != tc.status || !strings.Contains(errb.String(), tc.out) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", status, tc.status, errb.String(), tc.out)
			}
			if tc.status != 0 && strings.Contains(errb.String(), "configuration ok") {
				t.Fatalf("stderr %q", errb.String())
			}
		})
	}
	if _, err := os.Stat(devData); !os.IsNotExist(err) {
		t.Fatalf("serve --check --dev made its data directory: %v", err)
	}
}
