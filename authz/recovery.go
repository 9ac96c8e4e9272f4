package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Errors of recovery.
var (
	// ErrRecoveryNotAllowed: the formation may not be recovered — its call
	// completed, never ran, was denied, or its declared failure mode (or
	// the absence of one) does not allow it. The error names the mode.
	ErrRecoveryNotAllowed = public.New("authz", "the formation may not be recovered")
	// ErrRecoveryBlocked: the formation's lease is still open or
	// uncertain; it may be recovered once it closes (an uncertain lease:
	// once an operator resolved it no_effect, or a newer pool generation
	// released it).
	ErrRecoveryBlocked = public.New("authz", "the formation's outcome is not known yet")
)

// MaxRecoveryAttempts bounds a recovery chain's length whatever the
// policies say, so a chain cannot grow without end.
const MaxRecoveryAttempts = 100

// RecoverRequest is a host's request to recover a formation whose call
// failed, was refused, or ended uncertain and was resolved without effect.
type RecoverRequest struct {
	// Formation is the formation recovered.
	Formation string
	// Host is the authenticated host credential id; it must be the one
	// that formed the call.
	Host string
	// Tool and Arguments are the call to make instead, where the failure
	// mode allows one: for a fallback, the alternative tool the mode names
	// ("server/tool") and its arguments (required); for prompt_user, new
	// arguments (empty: the same). A retry runs the same call: they must
	// be empty, or the same.
	Tool      string
	Arguments json.RawMessage
}

// Recover forms a new call that recovers req.Formation, linked to it
// (record.Recovery: the formation, the chain's first, the attempt, how the
// recovered lease ended and the failure mode matched) and decided afresh
// over the new record: approvals never carry over, its digest is its own.
// It is allowed only as the recovered call's outcome and the tool's
// declared failure mode say:
//
//   - failed (the tool ran and answered an error) or rejected (refused by
//     the backend): the failure the fence reported must match one of the
//     tool's failureModes (MatchFailureMode); retry re-forms the same call
//     (up to the mode's maxAttempts), fallback forms the alternative the
//     mode names, prompt_user re-forms the call (with new arguments, if
//     given) and requires an approval, abort — or no match — refuses;
//   - no_effect (uncertain, resolved by an operator) or released (uncertain,
//     released by a newer pool generation): nothing is known to have run,
//     no failure to match: the same call is formed again, and the policies
//     decide (the default ones ask more approvals of a write);
//   - still admitted, or uncertain: ErrRecoveryBlocked; completed, denied,
//     expired or never admitted: ErrRecoveryNotAllowed.
//
// A formation has at most one live recovery: of concurrent recovers one
// wins, the others get record.ErrRecoveryExists naming it. To recover
// again, recover the recovery.
func (f *Formations) Recover(ctx context.Context, req RecoverRequest) (*record.Formation, error) {
	if req.Formation == "" || len(req.Formation) > maxIDLength {
		return nil, fmt.Errorf("%w: formation id", ErrBadRequest)
	}
	orig, err := f.store.GetFormation(ctx, req.Formation)
	if err != nil {
		return nil, err
	}
	if orig.Principal.Host != req.Host {
		return nil, fmt.Errorf("%w: %s was formed by another host", ErrRecoveryNotAllowed, orig.ID)
	}
	outcome, err := recoverableOutcome(orig)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, orig.ID)
	}
	attempt, root := 2, orig.ID
	if r := orig.Recovery; r != nil {
		attempt, root = r.Attempt+1, r.Root
	}
	if attempt > MaxRecoveryAttempts {
		return nil, fmt.Errorf("%w: %s is attempt %d; a chain has at most %d", ErrRecoveryNotAllowed, orig.ID, attempt-1, MaxRecoveryAttempts)
	}
	rec := &record.Recovery{Of: orig.ID, Root: root, Attempt: attempt, Outcome: outcome}
	fr := FormRequest{Snapshot: orig.Snapshot, Session: orig.Session, Tool: orig.Tool, Arguments: orig.Arguments,
		PrincipalID: orig.Principal.ID, Attributes: orig.Principal.Attributes, Host: req.Host}
	sameCall := func(what string) error {
		if req.Tool != "" && req.Tool != orig.Tool {
			return fmt.Errorf("%w: %s recovers %s, not %s", ErrBadRequest, what, orig.Tool, req.Tool)
		}
		if a := bytes.Trim(req.Arguments, jsonSpace); len(a) > 0 && !bytes.Equal(a, []byte("null")) {
			c, err := manifest.CanonicalJSON(a)
			if err != nil || !bytes.Equal(c, orig.Arguments) {
				return fmt.Errorf("%w: %s runs the same arguments; leave them out", ErrBadRequest, what)
			}
		}
		return nil
	}
	switch outcome {
	case record.OutcomeNoEffect, record.OutcomeReleased:
		if err := sameCall("the recovery of a call whose outcome was uncertain"); err != nil {
			return nil, err
		}
	default:
		mode := MatchFailureMode(orig.Failure, orig.Metadata.FailureModes)
		if mode == nil {
			return nil, fmt.Errorf("%w: %s %s, and no declared failure mode of %s matches what the backend answered (failure mode: none)",
				ErrRecoveryNotAllowed, orig.ID, outcome, orig.Tool)
		}
		rec.FailureMode = mode
		switch mode.Recovery {
		case manifest.RecoveryRetry:
			if err := sameCall(fmt.Sprintf("failure mode %q (retry)", mode.Error)); err != nil {
				return nil, err
			}
			if mode.MaxAttempts > 0 && attempt > mode.MaxAttempts {
				return nil, fmt.Errorf("%w: failure mode %q allows %d attempts; this would be attempt %d",
					ErrRecoveryNotAllowed, mode.Error, mode.MaxAttempts, attempt)
			}
		case manifest.RecoveryFallback:
			server, _, _ := strings.Cut(orig.Tool, "/")
			alt := server + "/" + mode.Fallback
			if req.Tool != alt {
				return nil, fmt.Errorf("%w: failure mode %q (fallback) recovers only as a call to %s; name it as the tool, with its arguments",
					ErrBadRequest, mode.Error, alt)
			}
			if a := bytes.Trim(req.Arguments, jsonSpace); len(a) == 0 {
				return nil, fmt.Errorf("%w: a fallback to %s needs its arguments", ErrBadRequest, alt)
			}
			fr.Tool, fr.Arguments = alt, req.Arguments
		case manifest.RecoveryPromptUser:
			if req.Tool != "" && req.Tool != orig.Tool {
				return nil, fmt.Errorf("%w: failure mode %q (prompt_user) recovers %s, not %s", ErrBadRequest, mode.Error, orig.Tool, req.Tool)
			}
			if a := bytes.Trim(req.Arguments, jsonSpace); len(a) > 0 {
				fr.Arguments = req.Arguments
			}
		default: // abort, or a strategy this version does not know
			return nil, fmt.Errorf("%w: failure mode %q of %s declares %s", ErrRecoveryNotAllowed, mode.Error, orig.Tool, recoveryName(mode.Recovery))
		}
	}
	out, err := f.form(ctx, fr, rec)
	if err != nil {
		return nil, err
	}
	f.log.Info("recovery formed", "formation", out.ID, "of", orig.ID, "attempt", attempt, "outcome", outcome,
		"failureMode", failureModeName(rec.FailureMode), "status", out.Status)
	return out, nil
}

// recoverableOutcome is how f's lease ended, if that allows a recovery.
func recoverableOutcome(f *record.Formation) (record.Outcome, error) {
	o := f.Outcome
	if o == "" { // a record from before outcomes were kept
		switch f.Status {
		case record.StatusFailed:
			o = record.OutcomeFailed
		case record.StatusRejected:
			o = record.OutcomeRejected
		case record.StatusUncertain:
			o = record.OutcomeUncertain
		}
	}
	switch {
	case f.Status == record.StatusAdmitted:
		return "", fmt.Errorf("%w: its lease is open; wait for its outcome", ErrRecoveryBlocked)
	case o == record.OutcomeUncertain:
		return "", fmt.Errorf("%w: its outcome is uncertain until an operator resolves it or a newer pool generation releases it", ErrRecoveryBlocked)
	case o == record.OutcomeFailed, o == record.OutcomeRejected, o == record.OutcomeNoEffect, o == record.OutcomeReleased:
		return o, nil
	case o == record.OutcomeEffect:
		return "", fmt.Errorf("%w: its effect completed", ErrRecoveryNotAllowed)
	}
	return "", fmt.Errorf("%w: it is %s, and only a call that ran (or was refused by its backend) can be recovered", ErrRecoveryNotAllowed, f.Status)
}

// MatchFailureMode returns the first of a tool's declared failure modes
// that what the backend answered matches, or nil. A mode's error E
// matches when the answer states E as its error name (a JSON-RPC error's
// data.error, a tool error's structuredContent.error), when its message is
// E or begins with E followed by ":" or a space, or when E is the
// JSON-RPC error code ("-32602").
func MatchFailureMode(failure *record.Failure, modes []manifest.FailureMode) *manifest.FailureMode {
	if failure == nil {
		return nil
	}
	for i := range modes {
		e := modes[i].Error
		if e == "" {
			continue
		}
		msg := failure.Message
		switch {
		case failure.Error == e,
			msg == e,
			strings.HasPrefix(msg, e) && (msg[len(e)] == ':' || msg[len(e)] == ' '),
			failure.Code != 0 && strconv.FormatInt(failure.Code, 10) == e:
			m := modes[i]
			return &m
		}
	}
	return nil
}

func recoveryName(r manifest.Recovery) string {
	if r == "" {
		return "no recovery"
	}
	return string(r)
}

func failureModeName(m *manifest.FailureMode) string {
	if m == nil {
		return "none"
	}
	return m.Error + " (" + recoveryName(m.Recovery) + ")"
}
