package authz

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/bounded"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// A successor is captured at formation and nowhere else (property P5 of
// docs/design.md): among the certificates registered for the call's source
// epoch and tool, valid now and covering the concrete arguments, exactly
// one is chosen by a fixed rule, offered to the policies, and written into
// the call before its digest is taken. Admission later only ever narrows:
// the certificate must still be unrevoked, unexpired and signed by a
// trusted issuer, the policy (if it changed) must not refuse it, the
// source must be STALE and the successor ACTIVE.

// candidate is a certificate eligible to give a formation its successor.
type candidate struct {
	rec    *record.Certificate
	signed *manifest.SignedCertificate
	target *record.Epoch
}

// candidate returns the certificate that gives a call of tool
// (its name within the server) formed on source with args its successor,
// or nil. A certificate is eligible when it is registered for (source,
// tool), not revoked, issued at or before now and not yet expired, still
// verifies against the configured issuer keys, its envelope accepts args,
// and its target epoch is ACTIVE, declares the tool, and accepts args
// under that tool's input schema. Among eligible certificates the one
// issued last wins; then the one that expires last; then the smallest id
// — a rule of the certificates alone, so every replica picks the same.
func (su *successors) candidate(ctx context.Context, source *record.Epoch, tool string, args json.RawMessage, now time.Time) (*candidate, error) {
	if su.issuers == nil {
		return nil, nil
	}
	recs, err := su.store.CertificatesFor(ctx, source.ID, tool)
	if err != nil {
		return nil, err
	}
	var eligible []*candidate
	for _, rec := range recs {
		c, err := su.eligible(ctx, rec, source, tool, args, now)
		if err != nil {
			return nil, err
		}
		if c != nil {
			eligible = append(eligible, c)
		}
	}
	if len(eligible) == 0 {
		return nil, nil
	}
	return slices.MinFunc(eligible, func(a, b *candidate) int {
		ca, cb := a.signed.Certificate, b.signed.Certificate
		return cmp.Or(
			cb.IssuedAt.Compare(ca.IssuedAt),
			cb.ExpiresAt.Compare(ca.ExpiresAt),
			cmp.Compare(a.rec.ID, b.rec.ID),
		)
	}), nil
}

// eligible checks one certificate record for a formation; nil means it
// does not apply, an error that the store could not answer.
func (su *successors) eligible(ctx context.Context, rec *record.Certificate, source *record.Epoch, tool string, args json.RawMessage, now time.Time) (*candidate, error) {
	if rec.Revoked || rec.Certificate == nil {
		return nil, nil
	}
	// The envelope first: most certificates of a tool do not cover most of
	// its calls, and a compiled envelope is cheap next to verifying a
	// signature. The stored copy is only a filter here; usable verifies
	// the signed one and that it is the same certificate (same id).
	env, err := su.schemas.get("certificate:"+rec.ID, rec.Certificate.Envelope)
	if err != nil {
		su.log.Warn("certificate envelope does not compile", "certificate", rec.ID, "err", err)
		return nil, nil
	}
	if manifest.ValidateArguments(env, args) != nil {
		return nil, nil
	}
	sc, why := su.usable(rec, now)
	if why != "" || sc.Certificate.Source != source.ID || sc.Certificate.Tool != tool {
		return nil, nil
	}
	target, err := su.store.EpochNow(ctx, sc.Certificate.Target)
	if errors.Is(err, record.ErrEpochNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if target.State != record.StateActive || target.Server != source.Server {
		return nil, nil
	}
	td := target.Manifest.Tool(tool)
	i := slices.IndexFunc(target.Tools, func(t record.EpochTool) bool { return t.Name == tool })
	if td == nil || i < 0 {
		return nil, nil
	}
	schema, err := su.schemas.get(target.Tools[i].Digest, td.InputSchema)
	if err != nil || manifest.ValidateArguments(schema, args) != nil {
		return nil, nil
	}
	return &candidate{rec: rec, signed: sc, target: target}, nil
}

// usable verifies a certificate record again, now: unrevoked, within its
// validity, and its JWS still verifies against the issuer keys in force
// (an issuer removed from the trust set takes its certificates with it).
// It returns the verified certificate, or why it is not usable.
func (su *successors) usable(rec *record.Certificate, now time.Time) (*manifest.SignedCertificate, string) {
	if su.issuers == nil {
		return nil, "no compatibility issuer keys are configured"
	}
	if rec.Revoked {
		return nil, "certificate " + rec.ID + " was revoked"
	}
	sc, ok := su.verified.get(rec)
	if !ok {
		var err error
		sc, err = su.issuers.VerifyCertificate([]byte(rec.JWS))
		if err != nil || sc.ID != rec.ID {
			return nil, "certificate " + rec.ID + " no longer verifies against the issuer keys"
		}
		su.verified.put(sc)
	}
	c := sc.Certificate
	switch {
	case now.Before(c.IssuedAt):
		return nil, "certificate " + rec.ID + " is not valid yet"
	case !now.Before(c.ExpiresAt):
		return nil, "certificate " + rec.ID + " expired at " + c.ExpiresAt.Format(time.RFC3339)
	}
	return sc, ""
}

// successorOf is the record's successor for a candidate.
func successorOf(c *candidate) *record.Successor {
	e, cert := c.target, c.signed.Certificate
	return &record.Successor{
		Target:      e.Target(),
		Certificate: c.rec.ID, Issuer: c.signed.KeyID, Effects: cert.Effects,
		Profile: cert.Profile, ExpiresAt: cert.ExpiresAt,
	}
}

// successorInput describes a candidate for the policies.
func (f *Formations) successorInput(c *candidate) *policy.SuccessorInput {
	return successorInput(f.inputs, c.target, c.rec.ID, c.signed.KeyID, c.signed.Certificate)
}

// successorInput is the policy input's successor member: the target epoch
// (its conversion cached) and the certificate. Formation builds it from
// the candidate it verified, an admission re-check from the store; both
// through here, so the two decisions see the same member.
func successorInput(inputs *policy.InputCache, target *record.Epoch, id, issuer string, cert *manifest.Certificate) *policy.SuccessorInput {
	return &policy.SuccessorInput{
		Epoch:       inputs.Epoch(target),
		Certificate: policy.CertificateInput{ID: id, Issuer: issuer, Certificate: *cert},
	}
}

// decide decides rec by policy. With a candidate successor the call is
// decided with it; if the policies refuse the candidate it is dropped, the
// digest taken again and the call decided once more without it, so the
// stored decision is always over the stored record. The refusal is kept in
// the decision (Successor, and each engine's answer).
func (f *Formations) decide(ctx context.Context, rec *record.Formation, in *policy.Input, cand *candidate) error {
	var err error
	if cand != nil {
		rec.Successor = successorOf(cand)
		in.Successor = f.successorInput(cand)
	}
	if rec.Digest, err = rec.Call.Digest(); err != nil {
		return err
	}
	in.Formation = f.inputs.Formation(rec.Call, rec.Digest)
	rec.Decision = f.decider.Decide(ctx, in)
	if cand == nil || (rec.Decision.Successor != nil && rec.Decision.Successor.Verdict == record.VerdictAllow) {
		return nil
	}
	refused := rec.Decision
	if refused.Successor == nil {
		// A decider that did not answer on the candidate did not allow it.
		refused.Successor = &record.SuccessorDecision{Certificate: cand.rec.ID, Epoch: cand.target.ID, Verdict: record.VerdictDeny}
	}
	rec.Successor, in.Successor = nil, nil
	if rec.Digest, err = rec.Call.Digest(); err != nil {
		return err
	}
	in.Formation = f.inputs.Formation(rec.Call, rec.Digest)
	rec.Decision = f.decider.Decide(ctx, in)
	rec.Decision.Successor = refused.Successor
	for i := range rec.Decision.Engines {
		for _, e := range refused.Engines {
			if e.Engine == rec.Decision.Engines[i].Engine {
				rec.Decision.Engines[i].Successor = e.Successor
			}
		}
	}
	f.log.Info("successor refused by policy", "formation", rec.ID, "certificate", cand.rec.ID, "epoch", cand.target.ID)
	return nil
}

// admission checks, at admission, what a formation's successor
// still needs besides what the transaction compares: its certificate is
// registered, unrevoked, unexpired and still verifies. It returns the
// certificate record as read, whose revision the transaction compares.
func (su *successors) admission(ctx context.Context, rec *record.Formation, now time.Time) (*record.Certificate, error) {
	s := rec.Successor
	if s == nil {
		return nil, ErrSourceStale
	}
	cert, err := su.store.GetCertificate(ctx, s.Certificate)
	if errors.Is(err, record.ErrCertificateNotFound) {
		return nil, fmt.Errorf("%w: certificate %s is not registered", ErrSourceStale, s.Certificate)
	}
	if err != nil {
		return nil, err
	}
	sc, why := su.usable(cert, now)
	if why != "" {
		return nil, fmt.Errorf("%w: %s", ErrSourceStale, why)
	}
	if c := sc.Certificate; c.Source != rec.Source.Epoch || c.Target != s.Epoch {
		return nil, fmt.Errorf("%w: certificate %s does not name this formation's epochs", ErrSourceStale, s.Certificate)
	}
	return cert, nil
}

// policyInput rebuilds the policy input's successor member of an
// admitted-phase re-check from the record and the store.
func (su *successors) policyInput(ctx context.Context, s *record.Successor) (*policy.SuccessorInput, error) {
	target, err := su.store.EpochNow(ctx, s.Epoch)
	if err != nil {
		return nil, err
	}
	cert, err := su.store.GetCertificate(ctx, s.Certificate)
	if err != nil {
		return nil, err
	}
	return successorInput(su.inputs, target, cert.ID, cert.KeyID, cert.Certificate), nil
}

// successors finds, verifies and re-checks certified successors: at
// formation (candidate) and at admission (admission, policyInput).
type successors struct {
	store    *lease.Store
	issuers  *manifest.Verifier
	verified verifiedCache
	schemas  *schemaCache
	inputs   *policy.InputCache
	log      *slog.Logger
}

// verifiedCache remembers certificates verified against this replica's
// issuer keys. The keys are fixed for the life of the use cases (a new
// trust set means a restart, hence an empty cache), so a JWS that
// verified once verifies again; what can change — revocation, expiry,
// the target's state — is checked on every use, never cached. Entries
// are keyed by id and kept only for the very same JWS.
type verifiedCache struct {
	entries bounded.Cache[string, *manifest.SignedCertificate]
}

const maxVerifiedCache = 4096

func (c *verifiedCache) get(rec *record.Certificate) (*manifest.SignedCertificate, bool) {
	sc, ok := c.entries.Get(rec.ID)
	if !ok || sc.JWS != rec.JWS {
		return nil, false
	}
	return sc, true
}

func (c *verifiedCache) put(sc *manifest.SignedCertificate) { c.entries.Put(sc.ID, sc) }
