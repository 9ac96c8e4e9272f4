# Unit tests of fcd.rego: every rule, on its allow and its deny side. Run
# them with `authzd policy test policies/` or `go test ./policies`; OPA's
# `opa test policies/` runs them too.
package fcd.authz_test

import data.fcd.authz

# A read by a developer against a pinned, ACTIVE epoch, in a fresh session.
base := {
	"formation": {
		"id": "f1",
		"session": "s1",
		"tool": "github/get_repository",
		"principal": {"id": "alice", "host": "host-1", "attributes": {"groups": ["developers"]}},
		"metadata": {"sideEffects": "read", "requiresApproval": false},
	},
	"tool": {
		"name": "get_repository",
		"server": "github",
		"qualifiedName": "github/get_repository",
		"sideEffects": "read",
		"requiresApproval": false,
		"requires": [],
		"exclusiveWith": [],
		"producesInputFor": [],
	},
	"epoch": {
		"id": "sha256:epoch",
		"state": "ACTIVE",
		"artifact": {"image": "ghcr.io/github/github-mcp-server:v1.4.0", "digest": "sha256:d160"},
		"artifactPinned": true,
	},
	"session": {"session": "s1", "completed": [], "admitted": []},
}

# call returns base with the tool replaced by name/effects and patch merged.
call(name, effects, patch) := object.union(
	object.union(base, {"tool": {"name": name, "qualifiedName": concat("/", ["github", name]), "sideEffects": effects}}),
	patch,
)

admin := {"formation": {"principal": {"attributes": {"groups": ["developers", "repo-admins"]}}}}

# delete_repository as declared in examples/github: requires get_repository,
# exclusive with create_repository.
delete_tool := {"tool": {"requires": ["github/get_repository"], "exclusiveWith": ["github/create_repository"]}}

got_repo := {"session": {"completed": ["github/get_repository"]}}

rules(s) := {x.rule | some x in s}

obligation(s) := max({x.count | some x in s} | {0})

# --- allow-read --------------------------------------------------------------

test_read_allowed if {
	rules(authz.allow) == {"allow-read"} with input as base
	count(authz.deny) == 0 with input as base
	obligation(authz.approvals) == 0 with input as base
}

test_none_allowed if {
	x := call("ping", "none", {})
	rules(authz.allow) == {"allow-read"} with input as x
	count(authz.deny) == 0 with input as x
}

test_read_rule_does_not_allow_write if {
	not "allow-read" in rules(authz.allow) with input as call("create_repository", "write", {})
}

test_unknown_side_effect_not_allowed if {
	count(authz.allow) == 0 with input as call("x", "execute", {})
}

test_missing_side_effect_not_allowed if {
	count(authz.allow) == 0 with input as json.remove(base, ["tool/sideEffects"])
}

# --- allow-write ---------------------------------------------------------------

test_write_allowed_with_one_approval if {
	x := call("create_repository", "write", {})
	rules(authz.allow) == {"allow-write"} with input as x
	obligation(authz.approvals) == 1 with input as x
	count(authz.deny) == 0 with input as x
}

# --- allow-delete-repo-admin / deny-delete-non-admin ---------------------------

test_delete_by_admin_allowed_with_two_approvals if {
	x := object.union(object.union(call("delete_repository", "delete", delete_tool), got_repo), admin)
	rules(authz.allow) == {"allow-delete-repo-admin"} with input as x
	obligation(authz.approvals) == 2 with input as x
	count(authz.deny) == 0 with input as x
}

test_delete_by_non_admin_denied if {
	x := object.union(call("delete_repository", "delete", delete_tool), got_repo)
	count(authz.allow) == 0 with input as x
	rules(authz.deny) == {"deny-delete-non-admin"} with input as x
}

test_delete_without_attributes_denied if {
	x := json.remove(object.union(call("delete_repository", "delete", {}), got_repo), ["formation/principal/attributes"])
	rules(authz.deny) == {"deny-delete-non-admin"} with input as x
}

test_delete_with_groups_not_a_list_denied if {
	x := object.union(call("delete_repository", "delete", {}), {"formation": {"principal": {"attributes": {"groups": "repo-admins"}}}})
	rules(authz.deny) == {"deny-delete-non-admin"} with input as x
}

# --- deny-requires-unmet ------------------------------------------------------

test_requires_unmet_denied_naming_the_tool if {
	x := object.union(call("delete_repository", "delete", delete_tool), admin)
	rules(authz.deny) == {"deny-requires-unmet"} with input as x
	some d in authz.deny with input as x
	contains(d.reason, "github/get_repository")
}

test_requires_only_admitted_denied if {
	x := object.union(call("delete_repository", "delete", delete_tool), object.union(admin, {"session": {"admitted": ["github/get_repository"]}}))
	rules(authz.deny) == {"deny-requires-unmet"} with input as x
}

test_requires_without_session_denied if {
	x := json.remove(object.union(call("delete_repository", "delete", delete_tool), admin), ["session"])
	rules(authz.deny) == {"deny-requires-unmet"} with input as x
}

test_requires_met_not_denied if {
	x := object.union(object.union(call("delete_repository", "delete", delete_tool), got_repo), admin)
	not "deny-requires-unmet" in rules(authz.deny) with input as x
}

test_requires_every_dependency if {
	x := object.union(
		call("merge", "write", {"tool": {"requires": ["github/a", "github/b"]}}),
		{"session": {"completed": ["github/a"]}},
	)
	reasons := {d.reason | some d in authz.deny} with input as x
	reasons == {"github/merge requires github/b to have completed earlier in this session"}
}

# --- deny-exclusive-conflict ---------------------------------------------------

test_exclusive_admitted_denied if {
	x := object.union(
		object.union(call("delete_repository", "delete", delete_tool), admin),
		{"session": {"completed": ["github/get_repository"], "admitted": ["github/create_repository"]}},
	)
	rules(authz.deny) == {"deny-exclusive-conflict"} with input as x
}

test_exclusive_completed_denied if {
	x := object.union(
		object.union(call("delete_repository", "delete", delete_tool), admin),
		{"session": {"completed": ["github/get_repository", "github/create_repository"]}},
	)
	rules(authz.deny) == {"deny-exclusive-conflict"} with input as x
}

test_exclusive_other_tools_not_denied if {
	x := object.union(
		object.union(call("delete_repository", "delete", delete_tool), admin),
		{"session": {"completed": ["github/get_repository", "github/list_repositories"], "admitted": ["github/get_repository"]}},
	)
	count(authz.deny) == 0 with input as x
}

# --- deny-artifact-unpinned ----------------------------------------------------

test_unpinned_artifact_denied if {
	x := object.union(base, {"epoch": {"artifactPinned": false}})
	rules(authz.deny) == {"deny-artifact-unpinned"} with input as x
	rules(authz.allow) == {"allow-read"} with input as x
}

test_missing_pinned_flag_denied if {
	rules(authz.deny) == {"deny-artifact-unpinned"} with input as json.remove(base, ["epoch"])
}

test_pinned_artifact_not_denied if {
	not "deny-artifact-unpinned" in rules(authz.deny) with input as base
}

# --- deny_successor: deny-successor-unpinned / deny-successor-public ----------

# A write with a candidate successor: the v1.3 epoch, pinned, under a
# certificate whose modeled effect is a private repository.
with_successor := object.union(call("create_repository", "write", {}), {
	"formation": {"successor": {"epoch": "sha256:v13", "certificate": "cert-1"}},
	"successor": {
		"epoch": {
			"id": "sha256:v13",
			"state": "ACTIVE",
			"artifact": {"image": "ghcr.io/github/github-mcp-server:v1.3.0", "digest": "sha256:b87d"},
			"artifactPinned": true,
		},
		"certificate": {"id": "cert-1", "tool": "create_repository", "effects": {"visibility": "private"}},
	},
})

unpinned_successor := {"successor": {"epoch": {"artifactPinned": false}}}

public_successor := {"successor": {"certificate": {"effects": {"visibility": "public"}}}}

test_no_successor_not_refused if {
	count(authz.deny_successor) == 0 with input as call("create_repository", "write", {})
}

test_pinned_private_successor_not_refused if {
	count(authz.deny_successor) == 0 with input as with_successor
	rules(authz.allow) == {"allow-write"} with input as with_successor
}

test_unpinned_successor_refused if {
	x := object.union(with_successor, unpinned_successor)
	rules(authz.deny_successor) == {"deny-successor-unpinned"} with input as x
	some d in authz.deny_successor with input as x
	contains(d.reason, "sha256:v13")
}

test_unpinned_successor_leaves_the_call_alone if {
	x := object.union(with_successor, unpinned_successor)
	count(authz.deny) == 0 with input as x
	rules(authz.allow) == {"allow-write"} with input as x
	obligation(authz.approvals) == 1 with input as x
}

test_successor_missing_pinned_flag_refused if {
	x := json.remove(with_successor, ["successor/epoch/artifactPinned"])
	rules(authz.deny_successor) == {"deny-successor-unpinned"} with input as x
}

test_successor_pinned_flag_not_a_boolean_refused if {
	x := object.union(with_successor, {"successor": {"epoch": {"artifactPinned": "true"}}})
	rules(authz.deny_successor) == {"deny-successor-unpinned"} with input as x
}

test_public_successor_refused if {
	x := object.union(with_successor, public_successor)
	rules(authz.deny_successor) == {"deny-successor-public"} with input as x
	count(authz.deny) == 0 with input as x
	rules(authz.allow) == {"allow-write"} with input as x
}

test_unpinned_public_successor_refused_by_both if {
	x := object.union(object.union(with_successor, unpinned_successor), public_successor)
	rules(authz.deny_successor) == {"deny-successor-unpinned", "deny-successor-public"} with input as x
}

test_successor_without_effects_not_refused if {
	x := json.remove(with_successor, ["successor/certificate/effects"])
	count(authz.deny_successor) == 0 with input as x
}

test_unpinned_source_does_not_refuse_a_pinned_successor if {
	x := object.union(with_successor, {"epoch": {"artifactPinned": false}})
	rules(authz.deny) == {"deny-artifact-unpinned"} with input as x
	count(authz.deny_successor) == 0 with input as x
}

# --- recovery ----------------------------------------------------------------

recovery(attempt, outcome) := {"formation": {"recovery": {
	"of": "f0", "root": "f0", "attempt": attempt, "outcome": outcome,
	"failureMode": {"error": "rate_limited", "recovery": "retry"},
}}}

write_recovery(attempt, outcome) := object.union(call("create_repository", "write", {}), recovery(attempt, outcome))

test_recovery_of_a_read_needs_nothing_more if {
	doc := object.union(base, recovery(2, "failed"))
	rules(authz.allow) == {"allow-read"} with input as doc
	count(authz.deny) == 0 with input as doc
	obligation(authz.approvals) == 0 with input as doc
}

test_recovery_of_a_failed_write_needs_one_approval if {
	doc := write_recovery(2, "failed")
	rules(authz.allow) == {"allow-write"} with input as doc
	obligation(authz.approvals) == 1 with input as doc
}

uncertain_write_needs_two(outcome) if {
	doc := write_recovery(3, outcome)
	rules(authz.allow) == {"allow-write", "recover-uncertain-write"} with input as doc
	count(authz.deny) == 0 with input as doc
	obligation(authz.approvals) == 2 with input as doc
}

test_recovery_of_a_write_resolved_no_effect_needs_two_approvals if uncertain_write_needs_two("no_effect")

test_recovery_of_a_write_released_needs_two_approvals if uncertain_write_needs_two("released")

test_recovery_past_three_attempts_denied if {
	doc := object.union(base, recovery(4, "failed"))
	rules(authz.deny) == {"deny-recovery-attempts"} with input as doc
	some d in authz.deny with input as doc
	contains(d.reason, "attempt 4")
}

test_third_attempt_allowed if {
	doc := object.union(base, recovery(3, "rejected"))
	count(authz.deny) == 0 with input as doc
}
