package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

const configurationDoc = "../../docs/configuration.md"

// TestConfigurationDocIsCurrent: docs/configuration.md's flag table is
// what the flag definitions produce now (go generate ./cmd/authzd writes
// it), so the page and `authzd serve -h` cannot drift apart.
func TestConfigurationDocIsCurrent(t *testing.T) {
	doc, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	want, err := spliceConfigurationDoc(doc)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(doc) {
		t.Fatalf("docs/configuration.md's flag table differs from the flags: run go generate ./cmd/authzd and commit it\nwant:\n%s", configurationTable())
	}
}

// TestConfigurationDocNamesEveryFlag: the generated table has one row per
// flag of serve, each with its config key (but --config, which has none),
// and the hand-written part of the page names each flag too.
func TestConfigurationDocNamesEveryFlag(t *testing.T) {
	doc, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	table := configurationTable()
	_, prose, _ := strings.Cut(string(doc), configDocEnd)
	var cfg Config
	bindServeFlags(&cfg).fs.VisitAll(func(f *flag.Flag) {
		var cells []string
		for _, line := range strings.Split(table, "\n") {
			if c := strings.Split(strings.Trim(line, "| "), " | "); len(c) == 4 && strings.Trim(strings.Fields(c[0])[0], "`") == "--"+f.Name {
				cells = c
			}
		}
		switch {
		case cells == nil:
			t.Errorf("no row for --%s", f.Name)
		case (cells[1] == "—") != commandLineOnly[f.Name]:
			t.Errorf("--%s: config key %s", f.Name, cells[1])
		}
		if !strings.Contains(prose, "`--"+f.Name+"`") {
			t.Errorf("docs/configuration.md's prose below the table does not name `--%s`", f.Name)
		}
	})
}

// TestCLIDocNamesEveryCommand: docs/cli.md has a row for every command of
// authzd's usage text.
func TestCLIDocNamesEveryCommand(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	// A command's line starts "  authzd NAME", a subcommand's name after
	// it (manifest sign, store status); continuation lines are indented
	// further.
	command := regexp.MustCompile(`^  authzd (\S+)(?: ([a-z][a-z-]*)\b)?`)
	for _, line := range strings.Split(usage, "\n") {
		m := command.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		cmd := strings.TrimSpace("authzd " + m[1] + " " + m[2])
		if !strings.Contains(string(doc), "| `"+cmd) {
			t.Errorf("docs/cli.md has no row for `%s`", cmd)
		}
	}
}
