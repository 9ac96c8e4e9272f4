package deploy

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const unitFile = "systemd/authzd.service"

// unitDirectives parses a systemd unit into section → directive → values
// (a directive may repeat).
func unitDirectives(data string) map[string]map[string][]string {
	units := map[string]map[string][]string{}
	var section string
	sc := bufio.NewScanner(strings.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			units[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if ok && section != "" {
				units[section][strings.TrimSpace(k)] = append(units[section][strings.TrimSpace(k)], strings.TrimSpace(v))
			}
		}
	}
	return units
}

// checkUnit returns what the unit lacks of the hardening docs/deploy.md
// promises: a user of its own, no privilege, a read-only system with one
// state directory, only IP and Unix sockets, the system-service system
// calls, and authzd serve --config as the command, checked first.
func checkUnit(data string) []string {
	s := unitDirectives(data)["Service"]
	var problems []string
	want := map[string]string{
		"DynamicUser": "yes", "StateDirectory": "fcd", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
		"ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes", "CapabilityBoundingSet": "",
		"AmbientCapabilities": "", "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"SystemCallFilter": "@system-service", "SystemCallArchitectures": "native", "RestrictSUIDSGID": "yes",
		"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes", "UMask": "0077",
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !slices.Contains(s[k], want[k]) {
			problems = append(problems, "[Service] "+k+"="+want[k]+" missing (has "+strconv.Quote(strings.Join(s[k], " | "))+")")
		}
	}
	if u := s["User"]; len(u) > 0 && (u[0] == "root" || u[0] == "0") {
		problems = append(problems, "[Service] User=root")
	}
	for _, k := range []string{"ExecStart", "ExecStartPre"} {
		if len(s[k]) != 1 || !strings.HasPrefix(s[k][0], "/usr/local/bin/authzd serve --config ") {
			problems = append(problems, "[Service] "+k+" is not authzd serve --config: "+strings.Join(s[k], " | "))
		}
	}
	if len(s["ExecStartPre"]) == 1 && len(s["ExecStart"]) == 1 && s["ExecStartPre"][0] != s["ExecStart"][0]+" --check" {
		problems = append(problems, "[Service] ExecStartPre is not ExecStart's command line with --check")
	}
	return problems
}

// TestSystemdUnit: the unit keeps its hardening (checkUnit); where
// systemd-analyze is installed (.ci/run installs it), systemd itself
// verifies the unit — every directive known, the command there — and
// rates its exposure OK (below 2.0 of 10); and the unit's command line,
// with systemd's %S and %d as directories of `authzd init`'s files, passes
// authzd serve --check.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkUnit(string(data)) {
		t.Error(p)
	}
	bin := binaries(t)
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc-fcd")
	if out, err := exec.Command(filepath.Join(bin, "authzd"), "init", "--listen", "0.0.0.0:8080", etc).CombinedOutput(); err != nil {
		t.Fatalf("authzd init: %v\n%s", err, out)
	}
	// The command line, as systemd runs it: %S the state directories' root,
	// %d the credentials directory (here the files LoadCredential names).
	exec_ := unitDirectives(string(data))["Service"]["ExecStartPre"][0]
	exec_ = strings.NewReplacer("/usr/local/bin/authzd", filepath.Join(bin, "authzd"), "/etc/fcd/", etc+"/",
		"%S", filepath.Join(dir, "state"), "%d/signing.jwk", filepath.Join(etc, "keys/signing.jwk"),
		"%d/credentials.json", filepath.Join(etc, "credentials.json")).Replace(exec_)
	args := strings.Fields(exec_)
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil || !strings.Contains(string(out), "configuration ok") {
		t.Errorf("%s: %v\n%s", exec_, err, out)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze (Debian's systemd): the unit was only parsed")
	}
	unit := filepath.Join(dir, "authzd.service")
	if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(data), "/usr/local/bin/authzd", filepath.Join(bin, "authzd"))), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err := exec.Command(analyze, "security", "--offline=yes", unit).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for authzd.service: ([0-9.]+)`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level >= 2.0 {
		t.Errorf("systemd-analyze security rates the unit's exposure %.1f, want below 2.0:\n%s", level, out)
	}
}

// TestSystemdUnitChecksCatch: checkUnit and systemd-analyze verify fail
// on a unit that breaks a rule, made from the repository's by one edit.
func TestSystemdUnitChecksCatch(t *testing.T) {
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	good := string(data)
	for _, tc := range []struct{ note, old, new, want string }{
		{"writable system", "ProtectSystem=strict\n", "", "ProtectSystem"},
		{"capabilities kept", "CapabilityBoundingSet=\n", "", "CapabilityBoundingSet"},
		{"root", "DynamicUser=yes\n", "User=root\n", "User=root"},
		{"not serve", "ExecStart=/usr/local/bin/authzd serve --config", "ExecStart=/usr/local/bin/authzd front --config", "ExecStart"},
		{"unchecked", " --check\n", "\n", "ExecStartPre"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("the unit has no %q to edit", tc.old)
			}
			problems := checkUnit(strings.Replace(good, tc.old, tc.new, 1))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Fatalf("problems %q: want one naming %q", problems, tc.want)
			}
		})
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	unit := filepath.Join(t.TempDir(), "authzd.service")
	if err := os.WriteFile(unit, []byte(strings.Replace(good, "ProtectSystem=strict", "ProtectSystem=strict\nProtectSytem=full", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); !strings.Contains(string(out), "ProtectSytem") {
		t.Errorf("systemd-analyze verify passed a misspelt directive: %v\n%s", err, out)
	}
}
