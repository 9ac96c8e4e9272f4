package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/internal/usertext"
)

// TestServeHelp: `authzd serve -h` prints exactly the flags, defaults and
// help texts in testdata/serve-help.txt.
func TestServeHelp(t *testing.T) {
	want, err := os.ReadFile("testdata/serve-help.txt")
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	fl := bindServeFlags(&cfg)
	var got bytes.Buffer
	fl.fs.SetOutput(&got)
	if err := fl.fs.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if got.String() != string(want) {
		t.Fatalf("serve -h changed:\n%s\nwant:\n%s", got.String(), want)
	}
}

// commandLineOnly are serve's flags that are no setting, hence no Config
// field and no config-file key: which file to read, and whether to only
// check it.
var commandLineOnly = map[string]bool{"config": true, "check": true}

// TestEveryFieldHasOneFlag: each Config field is set by the config-file
// key of its json tag and by the flag of the same name (its key in
// kebab-case), and the flag given on the command line wins over the file.
func TestEveryFieldHasOneFlag(t *testing.T) {
	var probe Config
	fl := bindServeFlags(&probe)
	flags := map[string]string{} // dashes removed, lower case -> flag name
	fl.fs.VisitAll(func(f *flag.Flag) {
		if !commandLineOnly[f.Name] {
			flags[strings.ReplaceAll(f.Name, "-", "")] = f.Name
		}
	})
	// The settings naming files or directories: relative in the file, they
	// are relative to the file.
	paths := map[string]bool{"DataDir": true, "RegistrarKeys": true, "IssuerKeys": true, "OperatorKeys": true, "Credentials": true, "PolicyDir": true, "PolicyBundle": true, "PolicyBundleKeys": true, "SigningKey": true, "DecisionLogCredentialFile": true, "NotifySecretFile": true,
		"EtcdCA": true, "EtcdCert": true, "EtcdKey": true}

	dir := t.TempDir()
	typ := reflect.TypeFor[Config]()
	if typ.NumField() != len(flags) {
		t.Errorf("%d Config fields, %d flags besides --config", typ.NumField(), len(flags))
	}
	for i := range typ.NumField() {
		field := typ.Field(i)
		key := strings.Split(field.Tag.Get("json"), ",")[0]
		name, ok := flags[strings.ToLower(key)]
		if !ok {
			t.Errorf("field %s (key %q) has no flag", field.Name, key)
			continue
		}
		t.Run(name, func(t *testing.T) {
			// What the file says, what the flag says, and what each must
			// make of the field.
			var fileVal, flagVal string
			var fromFile, fromFlag any
			switch reflect.Zero(field.Type).Interface().(type) {
			case string:
				fileVal, flagVal, fromFile, fromFlag = "from-file", "from-flag", "from-file", "from-flag"
				if paths[field.Name] {
					fromFile = filepath.Join(dir, "from-file")
				}
			case int64:
				fileVal, flagVal, fromFile, fromFlag = "7", "9", int64(7), int64(9)
			case float64:
				fileVal, flagVal, fromFile, fromFlag = "0.5", "9.25", 0.5, 9.25
			case Duration:
				fileVal, flagVal, fromFile, fromFlag = "7m", "9s", mustDuration(t, "7m"), mustDuration(t, "9s")
			case bool:
				fileVal, flagVal, fromFile, fromFlag = "true", "false", true, false
			case []string:
				fileVal, flagVal = "[http://f:1, http://f:2]", " http://a:1, ,http://b:2 "
				fromFile, fromFlag = []string{"http://f:1", "http://f:2"}, []string{"http://a:1", "http://b:2"}
			default:
				t.Fatalf("field %s: no sample values for type %s", field.Name, field.Type)
			}
			file := filepath.Join(dir, name+".yaml")
			if err := os.WriteFile(file, []byte(key+": "+fileVal+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				note string
				args []string
				want any
			}{
				{"file over default", []string{"--config", file}, fromFile},
				{"flag over file", []string{"--config", file, "--" + name + "=" + flagVal}, fromFlag},
				{"flag before --config still wins", []string{"--" + name + "=" + flagVal, "--config", file}, fromFlag},
			} {
				c, err := parseServeFlags(tc.args)
				if err != nil {
					t.Fatalf("%s: %v", tc.note, err)
				}
				if got := reflect.ValueOf(c).Field(i).Interface(); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("%s: %s = %#v, want %#v", tc.note, field.Name, got, tc.want)
				}
			}
		})
	}
}

func mustDuration(t *testing.T, s string) Duration {
	t.Helper()
	var d Duration
	if err := d.UnmarshalText([]byte(s)); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConfigFileErrors: a file that cannot be read, is malformed or has a
// key that is no setting is refused, naming the file.
func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		note, content, want string
	}{
		{"unknown key", "listen: x\nlisten_addr: y\n", `unknown setting "listen_addr" (did you mean "listen"?)`},
		{"flag name as key", "data-dir: x\n", `unknown setting "data-dir" (did you mean "dataDir"?)`},
		{"wrong type", "bodyLimit: lots\n", "bodyLimit"},
		{"bad duration", "policyPoll: soon\n", "soon"},
		{"not YAML", "listen: [\n", "config "},
		{"missing file", "", "config: open "},
	} {
		t.Run(tc.note, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.note, " ", "-")+".yaml")
			if tc.content != "" {
				if err := os.WriteFile(file, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := parseServeFlags([]string{"--config", file})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error saying %q", err, tc.want)
			}
			if tc.content != "" && !strings.Contains(err.Error(), file) {
				t.Errorf("%v does not name the file", err)
			}
		})
	}
}

func TestServeFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"--body-limit", "lots"}, `invalid value "lots" for flag -body-limit`},
		{[]string{"--policy-poll", "soon"}, `invalid value "soon" for flag -policy-poll`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseServeFlags(tc.args)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
}

// TestConfigErrorsNameTheSetting: a bad configuration file is explained
// by the setting's name and what it takes, never by Go's field names or
// the decoder's words, and a near miss is suggested.
func TestConfigErrorsNameTheSetting(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []string
	}{
		{"listenAddr: 1.2.3.4:80\n", []string{`unknown setting "listenAddr"`, `did you mean "listen"?`}},
		{"listen: [1\n", []string{"not valid YAML", "line 1"}},
		{"dev: yes-please\n", []string{`setting "dev" must be true or false, not string`}},
		{"formationTTL: soon\n", []string{`"soon" is not a duration like 30s or 15m`}},
		{"etcdEndpoints: http://a:2379\n", []string{`setting "etcdEndpoints" must be a list of strings, not string`}},
		{"- a\n- b\n", []string{"must be a map of settings"}},
		{"formationRate: fast\n", []string{`setting "formationRate" must be a number, not string`}},
	} {
		var c Config
		err := decodeConfig([]byte(tc.yaml), &c)
		if err == nil {
			t.Errorf("%q: accepted", tc.yaml)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want %q", tc.yaml, err, w)
			}
		}
		if p := usertext.Problems(err.Error()); len(p) > 0 || strings.Contains(err.Error(), "Config.") {
			t.Errorf("%q: %v leaks Go internals: %q", tc.yaml, err, p)
		}
	}
	var c Config
	if err := decodeConfig([]byte("listen: 127.0.0.1:9\nformationTTL: 5m\n"), &c); err != nil || c.Listen != "127.0.0.1:9" || c.FormationTTL != Duration(5*time.Minute) {
		t.Fatalf("a good file: %v %+v", err, c)
	}
}
