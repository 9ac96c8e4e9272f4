package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/cli"
)

// verify prints the verdict on one token for one call: "accept" and the
// claims, or "reject", the reason and its detail.
func verify(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var vf verifierFlags
	fs := vf.newFlagSet("fencecheck verify", stderr)
	token := fs.String("token", "", "the dispatch token")
	tokenFile := fs.String("token-file", "", "a file holding the dispatch token (- for stdin)")
	tool := fs.String("tool", "", "the tool called, as server/tool (required)")
	arguments := fs.String("arguments", "{}", "the call's arguments: a JSON object, or @FILE")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if (*token == "") == (*tokenFile == "") {
		return fmt.Errorf("%w: give exactly one of --token and --token-file", cli.ErrUsage)
	}
	if *tool == "" {
		return fmt.Errorf("%w: --tool is required", cli.ErrUsage)
	}
	tok := *token
	if *tokenFile != "" {
		data, err := readFileOrStdin(*tokenFile, stdin)
		if err != nil {
			return fmt.Errorf("token: %w", err)
		}
		tok = strings.TrimSpace(string(data))
	}
	args0 := []byte(*arguments)
	if name, ok := strings.CutPrefix(*arguments, "@"); ok {
		data, err := readFileOrStdin(name, stdin)
		if err != nil {
			return fmt.Errorf("arguments: %w", err)
		}
		args0 = data
	}
	// A dry check runs no effect: a token admitted before this command
	// started is judged like any other.
	v, err := vf.verifier(nil, time.Unix(0, 0))
	if err != nil {
		return err
	}

	claims, err := v.Verify(ctx, tok, *tool, json.RawMessage(args0))
	var re *fencecheck.RejectError
	if errors.As(err, &re) {
		fmt.Fprintf(stdout, "reject %s: %s\n", re.Reason, re.Detail)
		return errRejected
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "accept jti=%s tool=%s formation=%s session=%s epoch=%s expires=%s\n",
		claims.ID, claims.Tool, claims.Formation, claims.Subject, claims.Epoch,
		time.Unix(claims.Expiry, 0).UTC().Format(time.RFC3339))
	return nil
}

func readFileOrStdin(name string, stdin io.Reader) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(io.LimitReader(stdin, 16<<20))
	}
	return os.ReadFile(name)
}
