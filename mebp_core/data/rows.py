"""Turn one parsed JSONL row into an `Example`, or say precisely what is wrong with it.

Forms (exactly one per row; other keys are ignored):
- `{"text": str}`: BOS (if the tokenizer has one) + text + EOS (if any); every token learned.
- `{"prompt": str, "completion": str}`: the same framing; only completion tokens and EOS learned.
- `{"messages": [{"role", "content"}, ...]}`: the chat template; only assistant tokens learned.
- `{"input_ids": [int, ...], "labels"?: [int, ...]}`: used as is; -100 labels are masked,
  missing labels mean every token is learned.
"""

from __future__ import annotations

from mebp_core.data.example import IGNORE_INDEX, Example, ExampleKind
from mebp_core.data.tokenizer import CHAT_ROLES, Tokenizer, TokenizerError

_FORM_OF_KEY: dict[str, ExampleKind] = {
    "text": "text",
    "prompt": "prompt_completion",
    "completion": "prompt_completion",
    "messages": "messages",
    "input_ids": "tokens",
}
_JSON_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


class RowError(ValueError):
    """One row is malformed; the message says what is wrong, the caller adds where."""


def describe_json_type(value: object) -> str:
    """Return the JSON name of `value`'s type, for error messages."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def build_example(row: object, tokenizer: Tokenizer, vocab_size: int) -> Example:
    """Return the `Example` for one parsed JSONL row; raise `RowError` if it is malformed."""
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {describe_json_type(row)}")
    kind = detect_kind(row)
    if kind == "text":
        example = build_text(row, tokenizer)
    elif kind == "prompt_completion":
        example = build_prompt_completion(row, tokenizer)
    elif kind == "messages":
        example = build_messages(row, tokenizer)
    else:
        example = build_tokens(row, vocab_size)
    where = '"input_ids"' if kind == "tokens" else "encoded token"
    check_ids_in_vocab(example.input_ids, vocab_size, where)
    if example.count_supervised_tokens() == 0:
        raise RowError("no token to learn from (a row needs a labelled token after the first)")
    return example


def detect_kind(row: dict) -> ExampleKind:
    """Return the row's form; raise `RowError` if it has none or several."""
    kinds = sorted({_FORM_OF_KEY[key] for key in row if key in _FORM_OF_KEY})
    if "labels" in row and "input_ids" not in row:
        raise RowError('"labels" is only allowed together with "input_ids"')
    if not kinds:
        raise RowError(
            'no known form: expected "text", "prompt"+"completion", "messages" or "input_ids"'
        )
    if len(kinds) > 1:
        raise RowError(f"several forms in one row ({', '.join(kinds)}); use exactly one")
    return kinds[0]


def require_string(row: dict, key: str, *, allow_empty: bool = False) -> str:
    """Return `row[key]` if it is a (non-empty unless allowed) string, else raise `RowError`."""
    if key not in row:
        raise RowError(f'"{key}" is missing')
    value = row[key]
    if not isinstance(value, str):
        raise RowError(f'"{key}" must be a string, got {describe_json_type(value)}')
    if not allow_empty and not value.strip():
        raise RowError(f'"{key}" is empty')
    return value


def frame(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """Return the BOS prefix and EOS suffix the tokenizer has for plain text."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return bos, eos


def build_text(row: dict, tokenizer: Tokenizer) -> Example:
    text = require_string(row, "text")
    ids = tokenizer.encode(text)
    bos, eos = frame(tokenizer)
    input_ids = bos + ids + eos
    return Example(input_ids, list(input_ids), "text")


def build_prompt_completion(row: dict, tokenizer: Tokenizer) -> Example:
    prompt = tokenizer.encode(require_string(row, "prompt", allow_empty=True))
    completion = tokenizer.encode(require_string(row, "completion"))
    bos, eos = frame(tokenizer)
    input_ids = bos + prompt + completion + eos
    labels = [IGNORE_INDEX] * (len(bos) + len(prompt)) + completion + eos
    return Example(input_ids, labels, "prompt_completion")


def check_messages(messages: object) -> None:
    """Raise `RowError` unless `messages` is a conversation with an assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise RowError('"messages" must be a non-empty array')
    for i, message in enumerate(messages):
        where = f'"messages"[{i}]'
        if not isinstance(message, dict):
            raise RowError(f"{where} must be an object, got {describe_json_type(message)}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise RowError(f"{where} has unknown role {role!r}; expected one of {CHAT_ROLES}")
        if not isinstance(message.get("content"), str):
            got = describe_json_type(message.get("content"))
            raise RowError(f'{where}["content"] must be a string, got {got}')
    if not any(m["role"] == "assistant" and m["content"] for m in messages):
        raise RowError('"messages" has no non-empty assistant message to learn from')


def build_messages(row: dict, tokenizer: Tokenizer) -> Example:
    messages = row["messages"]
    check_messages(messages)
    try:
        chat = tokenizer.encode_chat(messages)
    except TokenizerError as exc:
        raise RowError(str(exc)) from None
    pairs = zip(chat.input_ids, chat.assistant_mask, strict=True)
    labels = [token if keep else IGNORE_INDEX for token, keep in pairs]
    return Example(chat.input_ids, labels, "messages")


def require_int_list(row: dict, key: str) -> list[int]:
    """Return `row[key]` if it is a non-empty array of integers, else raise `RowError`."""
    values = row[key]
    if not isinstance(values, list) or not values:
        raise RowError(f'"{key}" must be a non-empty array of integers')
    for i, value in enumerate(values):
        if type(value) is not int:
            raise RowError(f'"{key}"[{i}] must be an integer, got {describe_json_type(value)}')
    return values


def build_tokens(row: dict, vocab_size: int) -> Example:
    input_ids = require_int_list(row, "input_ids")
    if "labels" not in row:
        return Example(list(input_ids), list(input_ids), "tokens")
    labels = require_int_list(row, "labels")
    if len(labels) != len(input_ids):
        raise RowError(f'"labels" has {len(labels)} values but "input_ids" has {len(input_ids)}')
    check_ids_in_vocab(labels, vocab_size, '"labels"', masked=IGNORE_INDEX)
    return Example(list(input_ids), list(labels), "tokens")


def check_ids_in_vocab(
    ids: list[int], vocab_size: int, where: str, *, masked: int | None = None
) -> None:
    """Raise `RowError` at the first id (other than `masked`) outside [0, vocab_size)."""
    for i, token_id in enumerate(ids):
        if token_id == masked:
            continue
        if token_id < 0:
            raise RowError(f"{where}[{i}] is a negative token id ({token_id})")
        if token_id >= vocab_size:
            raise RowError(
                f"{where}[{i}] = {token_id} is outside the vocabulary (vocab_size={vocab_size})"
            )
