#!/usr/bin/env bash
# Drive work items through their whole lifecycle with `crewwork ... --json | jq`, as a CI job or a bot would.
#
#   CREWWORK_API_URL=http://127.0.0.1:8080 CREWWORK_API_KEY=cw_... examples/lifecycle.sh GOOD.json BAD.json
#
# GOOD.json: a code_change (on any repository) whose agent makes a change that passes validation and that waits for
# review (review.required true, or left to the operator's default, which is true); BAD.json: one whose every
# attempt fails validation. docs/agents.md has a complete GOOD.json for the sample repository that
# `examples/calc-repo.sh DIR` makes.
# Every JSON document goes through jq: a stray line of text on stdout would break the pipeline (and this script).
# Exit codes come from crewwork (see `crewwork --help`): 0 succeeded, 10 failed, 11 rejected, 12 cancelled, 13 dead.
# On any failure the script says which step failed and why, and cancels the items it left unfinished.
# LIFECYCLE_TIMEOUT_S (default 300) bounds each wait.
set -euo pipefail
if [ $# -ne 2 ] || [ ! -f "$1" ] || [ ! -f "$2" ]; then
    echo "usage: examples/lifecycle.sh GOOD.json BAD.json (two work item files)" >&2
    exit 2
fi
command -v jq >/dev/null || { echo "lifecycle.sh: needs jq (apt-get install -y jq)" >&2; exit 2; }
good=$1
bad=$2
timeout=${LIFECYCLE_TIMEOUT_S:-300}  # seconds each wait may take
step="start"
id=""
id2=""

fail() {
    echo "lifecycle.sh: $step: $*" >&2
    exit 1
}

cleanup() {
    rc=$?
    if [ "$rc" -ne 0 ]; then
        [ "$step" = done ] || echo "lifecycle.sh: stopped at: $step (exit $rc)" >&2
        for wid in $id $id2; do
            state=$(crewwork status "$wid" --json 2>/dev/null | jq -r .state 2>/dev/null || true)
            case "$state" in
                succeeded | failed | rejected | cancelled | dead | "") ;;
                *)
                    crewwork cancel "$wid" --json >/dev/null 2>&1 || true
                    echo "lifecycle.sh: cancelled $wid (it was $state)" >&2
                    ;;
            esac
        done
    fi
}
trap cleanup EXIT

# 1. Submit, then wait (following the event stream) until a person must review.
step="1. submit $good and wait for review"
id=$(crewwork submit "$good" --json | jq -er .id)
echo "submitted $id" >&2
set +e
waited=$(crewwork wait "$id" --until awaiting_review --timeout "$timeout" --json)
rc=$?
set -e
state=$(echo "$waited" | jq -r '.state // empty')
if [ "$rc" -ne 0 ] || [ "$state" != awaiting_review ]; then
    reason=$(echo "$waited" | jq -r '.reason // empty')
    fail "$id is ${state:-unknown}${reason:+ ($reason)}, not awaiting_review (exit $rc): GOOD.json must make a change" \
        "that passes validation and waits for review (review.required true or left out)"
fi

# 2. Look at what the agent did and what the platform measured.
step="2. read the diff, the evidence and the artifacts of $id"
crewwork diff "$id" --json | jq -e '.diff | length > 0' >/dev/null || fail "the diff of $id is empty"
crewwork evidence "$id" --json | jq -e '.[-1].verdict == "passed" and (.[-1].artifacts | has("diff"))' >/dev/null ||
    fail "the last attempt of $id has no passing evidence with a diff"
crewwork artifacts "$id" --json | jq -e 'length >= 1 and all(.[]; .sha256 | length == 64)' >/dev/null ||
    fail "the artifacts of $id are missing or lack a sha256"
crewwork status "$id" --json | jq -e '.links.temporal_ui | contains("/workflows/work-item-")' >/dev/null ||
    fail "$id has no Temporal UI link"

# 3. Approve, and wait for the landing.
step="3. approve $id and wait for it to land"
crewwork review "$id" --approve --comment "looks right" --json | jq -er .message >&2
crewwork wait "$id" --timeout "$timeout" --json | jq -e '.state == "succeeded" and (.delivery_branch | startswith("crewwork/"))' >/dev/null ||
    fail "$id did not land on a crewwork/ branch"
crewwork events "$id" --json | jq -er '[.[] | select(.type == "state_changed") | .data.state] | join(",")'
crewwork list --state succeeded --limit 200 --json | jq -e --arg id "$id" 'any(.items[]; .id == $id)' >/dev/null ||
    fail "$id is not listed as succeeded"

# 4. A live stream as JSON Lines: `events --follow` ends with the item's terminal state.
step="4. follow the events of $id"
crewwork events "$id" --follow --json | jq -ce 'select(.type == "state_changed") | .data.state' | tail -n 1 |
    grep -qx '"succeeded"' || fail "the event stream of $id did not end with succeeded"

# 5. An item that fails: the exit code says so, the JSON says why.
step="5. submit $bad, which must fail"
set +e
failed_json=$(crewwork submit "$bad" --wait --timeout "$timeout" --json)
rc=$?
set -e
echo "$failed_json" | jq -e '.state == "failed" and (.attempts | length) >= 1' >/dev/null && [ "$rc" -eq 10 ] ||
    fail "BAD.json ended $(echo "$failed_json" | jq -r '.state // "?"') (exit $rc), not failed (exit 10): its" \
        "attempts must fail validation"

# 6. Cancel one that waits for review.
step="6. cancel a second copy of $good while it waits for review"
id2=$(crewwork submit "$good" --idempotency-key "lifecycle-cancel-$id" --json | jq -er .id)
crewwork wait "$id2" --until awaiting_review --timeout "$timeout" --json | jq -e '.state == "awaiting_review"' >/dev/null ||
    fail "$id2 did not reach awaiting_review"
crewwork cancel "$id2" --json | jq -er .message >&2
set +e
cancelled_json=$(crewwork wait "$id2" --timeout "$timeout" --json)
rc=$?
set -e
[ "$rc" -eq 12 ] && echo "$cancelled_json" | jq -e '.state == "cancelled"' >/dev/null || fail "$id2 was not cancelled (exit $rc)"

step="done"
echo "lifecycle ok: $id succeeded, the bad item failed (exit 10), $id2 was cancelled (exit 12)"
