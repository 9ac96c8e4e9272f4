package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fcd-authz/fcd/client"
)

// printPending writes the formations waiting for approval as a table a
// person reads: one line a call, oldest first as authzd lists them.
func printPending(w io.Writer, page *client.FormationList, now time.Time) error {
	if len(page.Formations) == 0 {
		_, err := fmt.Fprintln(w, "no formation waits for approval")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FORMATION\tTOOL\tPRINCIPAL\tSIDE EFFECTS\tAPPROVALS\tWAITING\tEXPIRES IN")
	for _, f := range page.Formations {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", f.Id, f.Tool, f.Principal.Id, f.Metadata.SideEffects,
			approvalsGiven(f.Approvals), f.ApprovalsRequired, age(now.Sub(f.CreatedAt)), age(f.ExpiresAt.Sub(now)))
	}
	return tw.Flush()
}

// printFormation writes one formation as a person reads it, and, when
// cmp is not nil, what differs between the releases it may run on.
func printFormation(w io.Writer, f *client.Formation, cmp *client.Comparison, now time.Time) error {
	args, _ := json.Marshal(f.Arguments)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, a...)) }
	row("formation", "%s", f.Id)
	row("tool", "%s (%s)", f.Tool, f.Metadata.SideEffects)
	row("arguments", "%s", args)
	row("principal", "%s (host %s)", f.Principal.Id, f.Principal.Host)
	row("status", "%s", f.Status)
	row("runs on", "%s %s (pool %s)", f.Source.Server, f.Source.Release, f.Source.Pool)
	if s := f.Successor; s != nil {
		row("successor", "%s (pool %s), once the source retired, by certificate %s", s.Release, s.Pool, s.Certificate)
	}
	row("approvals", "%d of %d", approvalsGiven(f.Approvals), f.ApprovalsRequired)
	for _, a := range f.Approvals {
		reason := ""
		if a.Reason != nil {
			reason = ": " + *a.Reason
		}
		row("", "%s by %s%s", a.Decision, a.Approver, reason)
	}
	row("created", "%s", f.CreatedAt.Local().Format(time.DateTime))
	row("expires", "%s (in %s)", f.ExpiresAt.Local().Format(time.DateTime), age(f.ExpiresAt.Sub(now)))
	row("digest", "%s", f.Digest)
	if err := tw.Flush(); err != nil {
		return err
	}
	if cmp == nil {
		return nil
	}
	fmt.Fprintln(w)
	if len(cmp.Omitted) > 0 {
		fmt.Fprintf(w, "omitted arguments: %s (each release applies its own default)\n", strings.Join(cmp.Omitted, ", "))
	}
	if len(cmp.Differences) == 0 {
		_, err := fmt.Fprintln(w, "no difference between the releases this call may run on")
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "WHAT DIFFERS\tSOURCE (%s)\tON\tTHERE\n", cmp.Source.Release)
	for _, d := range cmp.Differences {
		other := cmp.Active
		if d.Column == "successor" {
			other = cmp.Successor
		}
		on := string(d.Column)
		if other != nil {
			on += " " + other.Release
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.Pointer, compact(d.Source), on, compact(d.Other))
	}
	return tw.Flush()
}

func approvalsGiven(as []client.Approval) int {
	n := 0
	for _, a := range as {
		if a.Decision == "approve" {
			n++
		}
	}
	return n
}

// age is a duration rounded for a person: 45s, 12m, 3h, 2d; "-" once past.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// compact is a value on one line: JSON, cut at 60 characters; "—" for
// absent.
func compact(v any) string {
	if v == nil {
		return "—"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if s := string(b); len(s) > 60 {
		return s[:57] + "..."
	}
	return string(b)
}
