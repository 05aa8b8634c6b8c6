#!/usr/bin/env bash
# Drive work items through their whole lifecycle with `crewwork ... --json | jq`, as a CI job or a bot would.
#
#   CREWWORK_API_URL=http://127.0.0.1:8080 CREWWORK_API_KEY=cw_... examples/lifecycle.sh GOOD.json BAD.json
#
# GOOD.json: a code_change whose agent fixes the repository and that needs a review; BAD.json: one that cannot pass.
# Every JSON document goes through jq: a stray line of text on stdout would break the pipeline (and this script).
# Exit codes come from crewwork (see `crewwork --help`): 0 succeeded, 10 failed, 11 rejected, 12 cancelled, 13 dead.
set -euo pipefail
good=$1
bad=$2

# 1. Submit, then wait (following the event stream) until a person must review.
id=$(crewwork submit "$good" --json | jq -er .id)
echo "submitted $id" >&2
state=$(crewwork wait "$id" --until awaiting_review --timeout 120 --json | jq -er .state)
test "$state" = awaiting_review

# 2. Look at what the agent did and what the platform measured.
crewwork diff "$id" --json | jq -e '.diff | contains("+    return a + b")' >/dev/null
crewwork evidence "$id" --json | jq -e '.[-1].verdict == "passed" and (.[-1].artifacts | has("diff"))' >/dev/null
crewwork artifacts "$id" --json | jq -e 'length >= 1 and all(.[]; .sha256 | length == 64)' >/dev/null
crewwork status "$id" --json | jq -e '.links.temporal_ui | contains("/workflows/work-item-")' >/dev/null

# 3. Approve, and wait for the landing.
crewwork review "$id" --approve --comment "looks right" --json | jq -er .message >&2
crewwork wait "$id" --timeout 120 --json | jq -e '.state == "succeeded" and (.delivery_branch | startswith("crewwork/"))' >/dev/null
crewwork events "$id" --json | jq -er '[.[] | select(.type == "state_changed") | .data.state] | join(",")'
crewwork list --state succeeded --limit 200 --json | jq -e --arg id "$id" 'any(.items[]; .id == $id)' >/dev/null

# 4. A live stream as JSON Lines: `events --follow` ends with the item's terminal state.
crewwork events "$id" --follow --json | jq -ce 'select(.type == "state_changed") | .data.state' | tail -n 1 | grep -qx '"succeeded"'

# 5. An item that fails: the exit code says so, the JSON says why.
set +e
failed_json=$(crewwork submit "$bad" --wait --timeout 120 --json)
rc=$?
set -e
test "$rc" -eq 10
echo "$failed_json" | jq -e '.state == "failed" and (.attempts | length) == 1' >/dev/null

# 6. Cancel one that waits for review.
id2=$(crewwork submit "$good" --idempotency-key "lifecycle-cancel-$id" --json | jq -er .id)
crewwork wait "$id2" --until awaiting_review --timeout 120 --json | jq -e '.state == "awaiting_review"' >/dev/null
crewwork cancel "$id2" --json | jq -er .message >&2
set +e
cancelled_json=$(crewwork wait "$id2" --timeout 120 --json)
rc=$?
set -e
test "$rc" -eq 12
echo "$cancelled_json" | jq -e '.state == "cancelled"' >/dev/null

echo "lifecycle ok: $id succeeded, the bad item failed (exit 10), $id2 was cancelled (exit 12)"
