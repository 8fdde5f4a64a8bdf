"""The structured-result scenario the loopback mocks share (issue 13): a result that is wrong
first and right only after a repair round that continues the same conversation and carries
sortie's validation error.

The test's schema wants `{"answer": <integer>}`. The first answer (no earlier assistant turn)
is `{"answer": "forty-two"}`. A later request gets `{"answer": 42}` only when BOTH hold:
- it continues the conversation: an earlier assistant turn holds the first, wrong answer;
- its last user message carries the validation error: the path `/answer` and
  `is not of type "integer"` (what sortie's jsonschema check says of it).
Otherwise it gets the wrong answer again (served `unrepaired`), so a repair round that lost
the conversation or the error leaves the task `partial`.
"""

BAD = '```json:result\n{"answer": "forty-two"}\n```'
GOOD = '```json:result\n{"answer": 42}\n```'
ERROR_MARKS = ("/answer", 'is not of type "integer"')


def judge(assistant_texts, last_user_text, stubborn=False):
    """The answer's text, what was served, and the checks made (for the mock's log).
    `stubborn`: the wrong answer every time (a repair round that does not help)."""
    if not assistant_texts:
        return "Here is the result.\n\n" + BAD, "bad_result", {}
    continues = any('"forty-two"' in t for t in assistant_texts)
    has_error = all(m in (last_user_text or "") for m in ERROR_MARKS)
    checks = {"continues": continues, "has_error": has_error}
    if continues and has_error and not stubborn:
        return "Fixed: the answer is a number now.\n\n" + GOOD, "good_result", checks
    return "Here is the result again.\n\n" + BAD, "unrepaired", checks
