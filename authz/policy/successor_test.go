package policy

import (
	"context"
	"reflect"
	"testing"

	"github.com/fcd-authz/fcd/record"
)

// TestSuccessorVerdicts decides calls with and without a candidate
// successor over the default policies, with each engine and combined: the
// answer on the successor follows deny-successor-unpinned and
// deny-successor-public, and the verdict on the call itself never moves.
func TestSuccessorVerdicts(t *testing.T) {
	m := githubManifest(t)
	s := loadDefaults(t)
	ctx := context.Background()
	tests := []struct {
		note      string
		successor *successor
		// verdict is the expected answer on the successor; "" means none.
		verdict record.Verdict
		rules   []string
	}{
		{note: "no successor"},
		{note: "pinned target, private effects", successor: &successor{}, verdict: record.VerdictAllow, rules: []string{}},
		{note: "effects without visibility", successor: &successor{effects: map[string]any{"owner": "octo-org"}}, verdict: record.VerdictAllow, rules: []string{}},
		{note: "unpinned target", successor: &successor{unpinned: true}, verdict: record.VerdictDeny, rules: []string{"deny-successor-unpinned"}},
		{note: "public effects", successor: &successor{effects: map[string]any{"visibility": "public"}}, verdict: record.VerdictDeny, rules: []string{"deny-successor-public"}},
		{
			note: "unpinned target and public effects", successor: &successor{unpinned: true, effects: map[string]any{"visibility": "public"}},
			verdict: record.VerdictDeny, rules: []string{"deny-successor-public", "deny-successor-unpinned"},
		},
	}
	// Each row is decided for an allowed write and a denied one (an
	// unmet requirement), so "the call's verdict does not move" is checked
	// on both sides.
	calls := map[string]call{
		"allowed write": {tool: "create_repository", args: `{"name":"payroll-exports","private":true}`},
		"denied write":  {tool: "create_repository", args: `{"name":"payroll-exports","private":true}`, requires: []string{"get_repository"}},
	}
	for _, tc := range tests {
		for name, c := range calls {
			t.Run(tc.note+"/"+name, func(t *testing.T) {
				without := githubInput(t, m, c)
				c.successor = tc.successor
				in := githubInput(t, m, c)
				doc, err := NewDocument(in)
				if err != nil {
					t.Fatal(err)
				}
				base, err := NewDocument(without)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range s.Engines() {
					got, ref := e.Decide(ctx, doc), e.Decide(ctx, base)
					if ref.Successor != nil {
						t.Fatalf("%s: an input without a successor got an answer on one: %+v", e.Name(), ref.Successor)
					}
					// The call's own verdict, obligation and deciding rules
					// do not depend on the successor.
					own := got
					own.Successor = nil
					if !reflect.DeepEqual(own, ref) {
						t.Errorf("%s: the successor changed the call's decision:\n got %+v\nwant %+v", e.Name(), own, ref)
					}
					if tc.verdict == "" {
						if got.Successor != nil {
							t.Errorf("%s: successor answer %+v without a successor", e.Name(), got.Successor)
						}
						continue
					}
					gs := got.Successor
					if gs == nil {
						t.Fatalf("%s: no answer on the successor", e.Name())
					}
					if gs.Error != "" {
						t.Fatalf("%s: successor evaluation error %q", e.Name(), gs.Error)
					}
					// Cedar's forbids with an unconstrained action refuse the
					// successor of a denied call too; the rules that say
					// anything about the successor itself are checked on
					// the allowed call only.
					if got.Verdict == record.VerdictAllow || e.Name() == EngineRego {
						if gs.Verdict != tc.verdict || !reflect.DeepEqual(gs.Rules, tc.rules) {
							t.Errorf("%s: successor %s by %q, want %s by %q", e.Name(), gs.Verdict, gs.Rules, tc.verdict, tc.rules)
						}
					} else if gs.Verdict != record.VerdictDeny {
						t.Errorf("%s: the successor of a call an unconstrained forbid denies is %s, want deny", e.Name(), gs.Verdict)
					}
					if len(gs.Rules) != len(gs.Reasons) {
						t.Errorf("%s: successor rules %q and reasons %q are not aligned", e.Name(), gs.Rules, gs.Reasons)
					}
				}

				d, ref := s.Decide(ctx, in), s.Decide(ctx, without)
				if d.Verdict != ref.Verdict || d.Approvals != ref.Approvals {
					t.Errorf("combined: the successor changed the call's verdict: %s/%d, want %s/%d", d.Verdict, d.Approvals, ref.Verdict, ref.Approvals)
				}
				if ref.Successor != nil {
					t.Errorf("combined: an answer on a successor without one: %+v", ref.Successor)
				}
				if tc.verdict == "" {
					if d.Successor != nil {
						t.Errorf("combined: an answer on a successor without one: %+v", d.Successor)
					}
					return
				}
				want := &record.SuccessorDecision{Certificate: successorCertID, Epoch: in.Formation.Successor.Epoch, Verdict: tc.verdict}
				if ref.Verdict != record.VerdictAllow {
					want.Verdict = record.VerdictDeny // refused by Cedar's unconstrained forbids
				}
				if !reflect.DeepEqual(d.Successor, want) {
					t.Errorf("combined successor = %+v, want %+v", d.Successor, want)
				}
				if in.Successor.Epoch.ID != in.Formation.Successor.Epoch || d.Successor.Epoch == in.Formation.Source.Epoch {
					t.Errorf("the example successor is not a distinct target: %s", d.Successor.Epoch)
				}
			})
		}
	}
}

// TestSetDecideSuccessorDenyOverrides checks that one engine refusing the
// successor refuses it for the set, and that engines which allow the call
// keep allowing it.
func TestSetDecideSuccessorDenyOverrides(t *testing.T) {
	m := githubManifest(t)
	ctx := context.Background()
	tests := []struct {
		note, rego, cedar string
		want              record.Verdict
	}{
		{"neither refuses", "", "", record.VerdictAllow},
		{
			note: "only Rego refuses",
			rego: `deny_successor contains {"rule": "no-successors", "reason": "never"} if input.successor`,
			want: record.VerdictDeny,
		},
		{
			note:  "only Cedar refuses",
			cedar: `@id("no-successors") forbid (principal, action == Action::"substitute", resource);`,
			want:  record.VerdictDeny,
		},
		{
			note:  "a Cedar permit of substitute allows nothing extra, no permit refuses nothing",
			cedar: `@id("substitute-ok") permit (principal, action == Action::"substitute", resource);`,
			want:  record.VerdictAllow,
		},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			fsys := tinySet("A", 1)
			fsys = with(fsys, "p.rego", append(fsys["p.rego"].Data, "\n"+tc.rego+"\n"...))
			fsys = with(fsys, "p.cedar", []byte(`@id("allow-all") @reason("variant A") @approvals("1") permit (principal, action in [Action::"none", Action::"read", Action::"write", Action::"delete"], resource);`+"\n"+tc.cedar))
			s, err := Load(ctx, fsys)
			if err != nil {
				t.Fatal(err)
			}
			in := githubInput(t, m, call{tool: "create_repository", successor: &successor{}})
			d := s.Decide(ctx, in)
			if d.Verdict != record.VerdictAllow || d.Approvals != 1 {
				t.Errorf("the call: %s with %d approvals, want allow with 1", d.Verdict, d.Approvals)
			}
			if d.Successor == nil || d.Successor.Verdict != tc.want ||
				d.Successor.Certificate != successorCertID || d.Successor.Epoch != in.Formation.Successor.Epoch {
				t.Errorf("successor = %+v, want %s for %s on %s", d.Successor, tc.want, successorCertID, in.Formation.Successor.Epoch)
			}
			for _, e := range d.Engines {
				if e.Successor == nil || e.Successor.Error != "" {
					t.Errorf("%s: successor answer %+v", e.Engine, e.Successor)
				}
			}
		})
	}
}

// TestSetDecideInconsistentSuccessor: an input whose successor member and
// formation.successor disagree is refused whole, the successor with it.
func TestSetDecideInconsistentSuccessor(t *testing.T) {
	m := githubManifest(t)
	s := loadDefaults(t)
	ctx := context.Background()
	tests := []struct {
		note string
		edit func(in *Input)
		// answered: the formation names a successor, so the decision
		// answers on it (a deny).
		answered bool
	}{
		{"successor without formation.successor", func(in *Input) { in.Formation.Successor = nil }, false},
		{"formation.successor without successor", func(in *Input) { in.Successor = nil }, true},
		{"different epochs", func(in *Input) { in.Successor.Epoch.ID = in.Formation.Source.Epoch }, true},
		{"different certificates", func(in *Input) { in.Successor.Certificate.ID = "cert-other" }, true},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			in := githubInput(t, m, call{tool: "get_repository", successor: &successor{}})
			tc.edit(in)
			d := s.Decide(ctx, in)
			if d.Verdict != record.VerdictDeny || d.Approvals != 0 {
				t.Errorf("verdict %s with %d approvals, want deny", d.Verdict, d.Approvals)
			}
			for _, e := range d.Engines {
				if e.Verdict != record.VerdictDeny || e.Error == "" {
					t.Errorf("%s: %+v, want a deny with the input error", e.Engine, e)
				}
				if tc.answered && (e.Successor == nil || e.Successor.Verdict != record.VerdictDeny || e.Successor.Error == "") {
					t.Errorf("%s: successor %+v, want a deny with the input error", e.Engine, e.Successor)
				}
			}
			switch {
			case !tc.answered && d.Successor != nil:
				t.Errorf("successor = %+v, want none (the record names none)", d.Successor)
			case tc.answered && (d.Successor == nil || d.Successor.Verdict != record.VerdictDeny):
				t.Errorf("successor = %+v, want a deny", d.Successor)
			}
		})
	}
}
