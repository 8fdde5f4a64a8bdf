"""The feedback-round scenario the loopback mocks share (#33, `verify`): an agent that fixes
the task's code only when asked with the check's failure, in the same conversation.

The task's repository has `calc.sh` (an `add` that subtracts) and `test.sh`, its check, which
prints `FAILED test_add: ...` until `add` adds. The mock answers:
- a request whose last message is a tool result: the final text `FIXED` (served `fixed`);
- a request whose LAST USER MESSAGE holds `FAILED test_add` (the check's failure that
  sortie's feedback round carries): the fixing tool call, a shell command that makes `add`
  add in `calc.sh` of the agent's cwd (served `fix_call`);
- anything else: the plain text `LOOKED`, no tool call (served `looked`).
It logs `continues` (an earlier assistant turn holds `LOOKED`: the round went on in the
same conversation) and `has_failure` (the last user message holds the failure).
"""

FAILURE = "FAILED test_add"
FIX = "sed -i 's/\\$1 - \\$2/$1 + $2/' calc.sh"
LOOKED = "I looked at calc.sh; it seems fine."
FIXED = "Fixed add in calc.sh: it adds now."


def judge(assistant_texts, last_user_text, after_tool_result):
    """What to serve: (`served`, the answer's text or None for the fixing tool call, checks)."""
    checks = {
        "continues": any(LOOKED in t for t in assistant_texts),
        "has_failure": FAILURE in (last_user_text or ""),
    }
    if after_tool_result:
        return "fixed", FIXED, checks
    if checks["has_failure"]:
        return "fix_call", None, checks
    return "looked", LOOKED, checks
