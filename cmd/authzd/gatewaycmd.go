package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fcd-authz/fcd/examples/gateways"
	"github.com/fcd-authz/fcd/internal/cli"
)

// gatewayCommand runs `authzd gateway config KIND [flags]`: the example
// gateway configuration of examples/gateways rendered for the flags, by
// gateways.Configure, the function internal/gatewaytest renders the
// end-to-end tests' gateways with. The credential comes from a file or
// $FCD_GATEWAY, never from a flag's value, which ps would show.
func gatewayCommand(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "config" {
		return fmt.Errorf("%w: gateway needs config KIND (KIND: %s)", cli.ErrUsage, strings.Join(gateways.Kinds(), ", "))
	}
	if len(args) < 2 || strings.HasPrefix(args[1], "-") {
		if len(args) >= 2 && (args[1] == "-h" || args[1] == "--help" || args[1] == "-help") {
			fmt.Fprint(stdout, gateways.Usage)
			return nil
		}
		return fmt.Errorf("%w: gateway config needs the gateway kind first: %s", cli.ErrUsage, strings.Join(gateways.Kinds(), ", "))
	}
	out, err := gateways.Configure(args[1], args[2:], getenv, stdout)
	if err != nil {
		if errors.Is(err, gateways.ErrFlag) {
			return fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
		return err
	}
	if err := out.Write(stdout); err != nil {
		return err
	}
	switch {
	case out.Out == "" && out.Kind == gateways.KindNginx:
		fmt.Fprintf(stderr, "authzd: nginx reads its users from %s beside nginx.conf: install your --users file there (or use --out DIR, which writes both)\n", gateways.NginxUsers)
	case out.Out != "":
		for _, f := range out.Files {
			fmt.Fprintf(stderr, "authzd: wrote %s\n", strings.TrimPrefix(out.Out+string(os.PathSeparator)+f.Name, "./"))
		}
	}
	return nil
}
