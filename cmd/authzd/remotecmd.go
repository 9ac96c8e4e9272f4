package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/cli"
)

// remoteTimeout bounds one call of the CLI to authzd.
const remoteTimeout = 30 * time.Second

// errRefused is a request authzd refused; its message names the problem.
var errRefused = errors.New("authzd refused")

// remoteFlags are the flags of every command that calls authzd as a role:
// where authzd is and the file holding the role's credential.
type remoteFlags struct {
	role     api.Role
	url      *string
	credFile *string
}

func addRemoteFlags(fs *flag.FlagSet, role api.Role) remoteFlags {
	env := "FCD_" + strings.ToUpper(string(role))
	return remoteFlags{
		role:     role,
		url:      fs.String("url", "", "authzd's base URL (default: $FCD_URL, else http://127.0.0.1:8080)"),
		credFile: fs.String("credential-file", "", fmt.Sprintf("file holding the %s's bearer credential (default: $%s; authzd init writes DIR/secrets/ID)", role, env)),
	}
}

// client returns a typed client of authzd as the flags' role.
func (f remoteFlags) client() (*client.ClientWithResponses, error) {
	credential, err := roleCredential(f.role, *f.credFile)
	if err != nil {
		return nil, err
	}
	base := serverURL(*f.url)
	c, err := client.New(base, credential)
	if err != nil {
		return nil, fmt.Errorf("%w: --url %q: %v", cli.ErrUsage, base, err)
	}
	return c, nil
}

// roleCredential reads a role's bearer credential from file, else from
// $FCD_<ROLE> (what --dev's env file exports).
func roleCredential(role api.Role, file string) (string, error) {
	env := "FCD_" + strings.ToUpper(string(role))
	credential := os.Getenv(env)
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s credential: %w", role, err)
		}
		credential = string(data)
	}
	if credential = strings.TrimSpace(credential); credential == "" {
		return "", fmt.Errorf("%w: the %s's bearer credential is needed: --credential-file FILE or $%s", cli.ErrUsage, role, env)
	}
	return credential, nil
}

// refused turns a refusal into errRefused naming the problem type; other
// errors are wrapped with what was being done.
func refused(what string, err error) error {
	if p, ok := errors.AsType[*client.Problem](err); ok {
		if p.Slug() == "" {
			return fmt.Errorf("%w: %s: %d %s: %s", errRefused, what, p.Status, p.Title, p.Detail)
		}
		return fmt.Errorf("%w: %s: %s (%d): %s", errRefused, what, p.Slug(), p.Status, p.Detail)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// printBody writes authzd's JSON answer as one line.
func printBody(stdout io.Writer, body []byte) error {
	_, err := fmt.Fprintf(stdout, "%s\n", bytes.TrimSpace(body))
	return err
}

// manifestRegister runs `authzd manifest register [--url URL]
// [--credential-file FILE] FILE.jws|-`: it registers a signed manifest as
// the registrar and prints authzd's answer (the epoch).
func manifestRegister(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("manifest register", flag.ContinueOnError)
	rf := addRemoteFlags(fs, api.RoleRegistrar)
	file, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if file == "" {
		return fmt.Errorf("%w: manifest register needs FILE (a signed manifest, from authzd manifest sign; - for stdin)", cli.ErrUsage)
	}
	if file == "-" && stdin == nil {
		return fmt.Errorf("%w: no standard input to read the manifest from", cli.ErrUsage)
	}
	jws, err := readInput(file, stdin)
	if err != nil {
		return err
	}
	c, err := rf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	resp, err := c.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(bytes.TrimSpace(jws)))
	if err != nil {
		return refused("register "+file, err)
	}
	return printBody(stdout, resp.Body)
}

// formationCommand runs `authzd formation show|pending|approve|deny`:
// what an approver does in the UI, from a shell.
//
//	formation show ID                  the record, as authzd shows it
//	formation pending                  the calls waiting for approval
//	formation approve ID --reason R    approve the record shown now
//	formation deny ID --reason R       deny it
//
// approve and deny send the digest of the record they read, so what is
// approved is exactly what was shown (--digest pins one reviewed earlier).
func formationCommand(ctx context.Context, sub string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("formation "+sub, flag.ContinueOnError)
	rf := addRemoteFlags(fs, api.RoleApprover)
	var reason, digest *string
	asJSON := new(bool)
	switch sub {
	case "show", "pending":
		asJSON = fs.Bool("json", false, "print authzd's JSON answer (for programs) instead of a table")
	case "approve", "deny":
		reason = fs.String("reason", "", "why (kept with the approval, shown to other approvers)")
		digest = fs.String("digest", "", "the digest of the record you reviewed (default: the record read now)")
	default:
		return fmt.Errorf("%w: unknown formation command %q (show, pending, approve, deny)", cli.ErrUsage, sub)
	}
	id, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch {
	case sub == "pending" && id != "":
		return fmt.Errorf("%w: formation pending takes no argument", cli.ErrUsage)
	case sub != "pending" && id == "":
		return fmt.Errorf("%w: formation %s needs one FORMATION id", cli.ErrUsage, sub)
	case reason != nil && strings.TrimSpace(*reason) == "":
		return fmt.Errorf("%w: formation %s needs --reason TEXT", cli.ErrUsage, sub)
	}
	c, err := rf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	switch sub {
	case "pending":
		status := client.FormationStatus("pending_approval")
		resp, err := c.ListFormationsWithResponse(ctx, &client.ListFormationsParams{Status: &status})
		if err != nil {
			return refused("list pending formations", err)
		}
		if *asJSON || resp.JSON200 == nil {
			return printBody(stdout, resp.Body)
		}
		return printPending(stdout, resp.JSON200, time.Now())
	case "show":
		resp, err := c.GetFormationWithResponse(ctx, id)
		if err != nil {
			return refused("formation "+id, err)
		}
		if *asJSON || resp.JSON200 == nil {
			return printBody(stdout, resp.Body)
		}
		// What differs between the releases the call may run on; a
		// formation whose source epoch is gone has none to show.
		var cmp *client.Comparison
		if cr, err := c.CompareFormationWithResponse(ctx, id); err == nil && cr.JSON200 != nil {
			cmp = cr.JSON200
		}
		return printFormation(stdout, resp.JSON200, cmp, time.Now())
	}
	d := *digest
	if d == "" {
		resp, err := c.GetFormationWithResponse(ctx, id)
		if err != nil {
			return refused("formation "+id, err)
		}
		if resp.JSON200 == nil {
			return fmt.Errorf("formation %s: authzd answered %d without a record", id, resp.StatusCode())
		}
		d = resp.JSON200.Digest
	}
	resp, err := c.ApproveFormationWithResponse(ctx, id, client.ApprovalRequest{
		Decision: client.ApprovalRequestDecision(sub), Digest: d, Reason: reason,
	})
	if err != nil {
		return refused(sub+" "+id, err)
	}
	return printBody(stdout, resp.Body)
}
