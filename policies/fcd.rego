# fcd default policy set: the Rego half.
#
# fcd.cedar states the same rules in Cedar under the same names (Rego rule
# names = Cedar @id values), and the combined decision is deny-overrides, so
# the two halves must agree: fcd_test.rego tests this file, fcd.cases.json
# tests fcd.cedar, and authz/policy runs the Cedar cases against this file too.
# The input document and the contract are described in README.md.
#
# Every reason below is built only from values that are always defined (or
# given defaults with object.get): if a deny's reason were undefined, the
# deny itself would silently vanish.
package fcd.authz

# The principal attribute "groups" must contain this group for a delete.
admin_group := "repo-admins"

side_effects := input.tool.sideEffects

tool_name := object.get(input, ["tool", "qualifiedName"], "this tool")

reading if side_effects in {"none", "read"}

is_admin if admin_group in input.formation.principal.attributes.groups

# An allow rule and its approval obligation share name and reason, so the
# decision records them as one rule with one reason, as Cedar does.
write_reason := "writes are allowed with one approval"

delete_reason := sprintf("deletes are allowed for members of %s with two approvals", [admin_group])

# Tools this session completed, and those it completed or still has admitted.
completed contains t if some t in input.session.completed

seen contains t if some t in input.session.completed

seen contains t if some t in input.session.admitted

# --- allow: at least one element is needed ---------------------------------

allow contains {"rule": "allow-read", "reason": "calls without side effects or that only read are allowed"} if reading

allow contains {"rule": "allow-write", "reason": write_reason} if side_effects == "write"

allow contains {"rule": "allow-delete-repo-admin", "reason": delete_reason} if {
	side_effects == "delete"
	is_admin
}

# --- approvals: the obligation is the largest count ------------------------

approvals contains {"rule": "allow-write", "count": 1, "reason": write_reason} if side_effects == "write"

approvals contains {"rule": "allow-delete-repo-admin", "count": 2, "reason": delete_reason} if {
	side_effects == "delete"
	is_admin
}

# --- recovery ----------------------------------------------------------------
#
# input.formation.recovery is present when the call recovers an earlier one
# (POST /v1/formations/{id}/recover): of, root, attempt (the first call is 1),
# outcome (how the recovered lease ended) and failureMode (the declared one the
# backend's answer matched, or null). A write recovering a call whose effect
# was uncertain (resolved no_effect, or released by a newer pool generation)
# needs two approvers; no chain runs more than max_attempts calls.

max_attempts := 3

uncertain_write_reason := "the recovered call's effect was uncertain: two approvers confirm the retry of a write"

recovering_uncertain_write if {
	side_effects == "write"
	input.formation.recovery.outcome in {"no_effect", "released"}
}

allow contains {"rule": "recover-uncertain-write", "reason": uncertain_write_reason} if recovering_uncertain_write

approvals contains {"rule": "recover-uncertain-write", "count": 2, "reason": uncertain_write_reason} if recovering_uncertain_write

deny contains {
	"rule": "deny-recovery-attempts",
	"reason": sprintf("a call is attempted at most %d times; this recovery would be attempt %d", [max_attempts, input.formation.recovery.attempt]),
} if {
	input.formation.recovery.attempt > max_attempts
}

# --- deny: any element denies, whatever allows -----------------------------

deny contains {
	"rule": "deny-delete-non-admin",
	"reason": sprintf("deletes are allowed only for members of %s", [admin_group]),
} if {
	side_effects == "delete"
	not is_admin
}

deny contains {
	"rule": "deny-requires-unmet",
	"reason": sprintf("%s requires %s to have completed earlier in this session", [tool_name, dep]),
} if {
	some dep in input.tool.requires
	not dep in completed
}

deny contains {
	"rule": "deny-exclusive-conflict",
	"reason": sprintf("%s is exclusive with %s, which this session already admitted or completed", [tool_name, other]),
} if {
	some other in input.tool.exclusiveWith
	other in seen
}

deny contains {
	"rule": "deny-artifact-unpinned",
	"reason": sprintf(
		"source epoch %s runs artifact %q, which is not pinned by digest",
		[object.get(input, ["epoch", "id"], "(unknown)"), object.get(input, ["epoch", "artifact", "image"], "")],
	),
} if {
	not input.epoch.artifactPinned
}

# --- deny_successor: refuses the candidate successor, never the call ----------
#
# input.successor is present only when the formation captured a candidate
# successor (formation.successor); without one these rules have nothing to
# refuse. A refused successor leaves the call's own verdict as it is: the call
# simply has no successor.

successor_pinned if input.successor.epoch.artifactPinned == true

deny_successor contains {
	"rule": "deny-successor-unpinned",
	"reason": sprintf(
		"successor epoch %s runs artifact %q, which is not pinned by digest",
		[
			object.get(input, ["successor", "epoch", "id"], "(unknown)"),
			object.get(input, ["successor", "epoch", "artifact", "image"], ""),
		],
	),
} if {
	is_object(input.successor)
	not successor_pinned
}

deny_successor contains {
	"rule": "deny-successor-public",
	"reason": sprintf(
		"certificate %s models a public effect on successor epoch %s",
		[
			object.get(input, ["successor", "certificate", "id"], "(unknown)"),
			object.get(input, ["successor", "epoch", "id"], "(unknown)"),
		],
	),
} if {
	input.successor.certificate.effects.visibility == "public"
}
