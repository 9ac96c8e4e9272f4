package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/internal/gatewayconf"
)

// gatewayCommand runs `authzd gateway config KIND [flags]`: the example
// gateway configuration of examples/gateways rendered for the flags (internal/gatewayconf), by
// gatewayconf.Configure, the function internal/gatewaytest renders the
// end-to-end tests' gateways with. The credential comes from a file or
// $FCD_GATEWAY, never from a flag's value, which ps would show.
func gatewayCommand(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "user" {
		return gatewayUser(args[1:], stdin, stderr)
	}
	if len(args) == 0 || args[0] != "config" {
		return fmt.Errorf("%w: gateway needs config KIND (KIND: %s) or user NAME", cli.ErrUsage, strings.Join(gatewayconf.Kinds(), ", "))
	}
	if len(args) < 2 || strings.HasPrefix(args[1], "-") {
		if len(args) >= 2 && (args[1] == "-h" || args[1] == "--help" || args[1] == "-help") {
			fmt.Fprint(stdout, gatewayconf.Usage)
			return nil
		}
		return fmt.Errorf("%w: gateway config needs the gateway kind first: %s", cli.ErrUsage, strings.Join(gatewayconf.Kinds(), ", "))
	}
	out, err := gatewayconf.Configure(args[1], args[2:], getenv, stdout)
	if err != nil {
		if errors.Is(err, gatewayconf.ErrFlag) {
			return fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
		return err
	}
	if err := out.Write(stdout); err != nil {
		return err
	}
	switch {
	case out.Out == "" && out.Kind == gatewayconf.KindNginx:
		fmt.Fprintf(stderr, "authzd: nginx reads its users from %s beside nginx.conf: install your --users file there (or use --out DIR, which writes both)\n", gatewayconf.NginxUsers)
	case out.Out != "":
		for _, f := range out.Files {
			fmt.Fprintf(stderr, "authzd: wrote %s\n", strings.TrimPrefix(out.Out+string(os.PathSeparator)+f.Name, "./"))
		}
	}
	return nil
}

// errUserExists refuses to add a user the users file already has.
var errUserExists = errors.New("the user exists")

// gatewayUser runs `authzd gateway user --users FILE NAME`: it reads the
// user's password from the first line of standard input (never a flag,
// which ps would show) and adds NAME with its bcrypt hash to the htpasswd
// file the gateway configurations take (--users), creating it 0600. A name
// already in the file is refused: a password is changed by editing the
// file, not silently.
func gatewayUser(args []string, stdin io.Reader, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway user", flag.ContinueOnError)
	fs.SetOutput(stderr)
	users := fs.String("users", "", "the htpasswd file to add the user to (created 0600 if absent)")
	name, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch {
	case name == "":
		return fmt.Errorf("%w: gateway user needs NAME (the principal id the user's calls are formed for)", cli.ErrUsage)
	case *users == "":
		return fmt.Errorf("%w: gateway user needs --users FILE", cli.ErrUsage)
	case stdin == nil:
		return fmt.Errorf("%w: gateway user reads the password from standard input", cli.ErrUsage)
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the password: %w", err)
	}
	password := strings.TrimRight(line, "\r\n")
	if password == "" {
		return fmt.Errorf("%w: no password on standard input", cli.ErrUsage)
	}
	existing, err := os.ReadFile(*users)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, l := range strings.Split(string(existing), "\n") {
		if n, _, ok := strings.Cut(l, ":"); ok && n == name {
			return fmt.Errorf("%w: %s already has a user %q", errUserExists, *users, name)
		}
	}
	u, err := gatewayconf.NewUser(name, password, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	entry, err := gatewayconf.Htpasswd([]gatewayconf.User{u})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(*users, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(entry); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", *users, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "authzd: added %s to %s\n", name, *users)
	return nil
}
