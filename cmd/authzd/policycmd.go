package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/policies"
	"github.com/fcd-authz/fcd/record"
)

// errPolicyFailed makes `policy test` exit 1 after its report, and `policy
// eval` exit 1 after printing a deny.
var errPolicyFailed = errors.New("policy failed")

// policyFS returns the policy directory dir, or the embedded defaults.
func policyFS(dir string) fs.FS {
	if dir == "" {
		return policies.FS
	}
	return os.DirFS(dir)
}

// policyCommand runs `authzd policy test [dir]` and
// `authzd policy eval --input record.json [--policy-dir dir]`.
func policyCommand(ctx context.Context, sub string, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("policy "+sub, flag.ContinueOnError)
	verbose := fs.Bool("v", false, "list every test, not only failures (test)")
	input := fs.String("input", "", "policy input document, JSON; - for stdin (eval)")
	dir := fs.String("policy-dir", "", "policy directory (eval; default: the embedded defaults)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	switch sub {
	case "test":
		if fs.NArg() > 1 {
			return fmt.Errorf("%w: policy test [dir]", cli.ErrUsage)
		}
		report, err := policy.RunTests(ctx, policyFS(fs.Arg(0)))
		if err != nil {
			return err
		}
		if !report.Print(stdout, *verbose) {
			return errPolicyFailed
		}
		return nil
	case "eval":
		if *input == "" || fs.NArg() > 0 {
			return fmt.Errorf("%w: policy eval --input FILE [--policy-dir DIR]", cli.ErrUsage)
		}
		data, err := readInput(*input, stdin)
		if err != nil {
			return err
		}
		in, err := policy.DecodeInput(data)
		if err != nil {
			return err
		}
		set, err := policy.Load(ctx, policyFS(*dir))
		if err != nil {
			return err
		}
		d := set.Decide(ctx, in)
		if err := printJSON(stdout, d); err != nil {
			return err
		}
		if d.Verdict != record.VerdictAllow {
			return errPolicyFailed
		}
		return nil
	}
	return fmt.Errorf("%w: unknown policy command %q", cli.ErrUsage, sub)
}
