// Package cli is what fcd's commands (authzd, fencecheck, mcpfixture)
// share at their edge: the usage error, flag parsing that refuses stray
// arguments, and the mapping of a command's error to its exit status.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage reports a command line that could not be understood; the
// command's usage text is printed with it and the exit status is 2.
var ErrUsage = errors.New("usage")

// Parse parses a command's flags; stray arguments are a usage error. -h
// returns flag.ErrHelp (the flag set printed its help).
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	return nil
}

// ExitStatus prints err as command name reports it and returns the exit
// status: 0 for nil and flag.ErrHelp; 2 for a usage error, printed with
// usage; 1 otherwise, printed unless it is one of reported (errors whose
// verdict the command printed already).
func ExitStatus(stderr io.Writer, name, usage string, err error, reported ...error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "%s: %v\n%s", name, err, usage)
		return 2
	}
	for _, r := range reported {
		if errors.Is(err, r) {
			return 1
		}
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}
