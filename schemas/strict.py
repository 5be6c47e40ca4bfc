"""What an agent spec may hold: only the fields its models declare, and never a secret.

A spec names secrets and never holds them (a provider is a profile name, an MCP server names
its environment variables): a value written where the spec expects a name is refused with
the field's path, and so is a field the spec does not know (`stdio.env`, a top-level
`api_key`), which would otherwise be dropped without a word. Pure: no I/O, no environment.

Invariants:
- Every model of the spec derives from `SpecModel`: built or validated anywhere (a client,
  a TOML file, a workflow's input), an unknown field is refused naming it and saying where
  the value belongs instead. Data Keel wrote itself (a history replayed, state carried over
  continue-as-new) is validated with `STORED` as its context, which drops unknown fields as
  before, so no session that exists already stops decoding.
- A refusal never quotes the value it refuses (`hide_input_in_errors`, and the reasons
  here name fields and kinds of secret only).
- `secret_problem` is the one rule for "this looks like a secret": a known token shape
  (`sk-…`, `ghp_…`, `AKIA…`, a JWT, a private key, `Bearer …`), or a value given to a
  key whose name says secret (`--api-key=…`, `token=…`, `?access_token=…`). It refuses a
  value, never a name (`API_KEY` as an environment variable's name is what a spec should
  hold).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, model_validator

__all__ = ["STORED", "SpecModel", "arg_secret_problems", "names_secret", "secret_problem",
           "url_problem"]

# The validation context for data Keel wrote itself (histories, carried state).
STORED: dict[str, Any] = {"keel_stored": True}

# Where a value a spec may not hold belongs instead, by the unknown field's name.
_INSTEAD = {
    "env": "an MCP server's environment is never written in the spec: list the variables' "
           "names in env_names, and the worker passes its own values",
    "environment": "an MCP server's environment is never written in the spec: list the "
                   "variables' names in env_names, and the worker passes its own values",
    "headers": "an HTTP header's value is never written in the spec: map the header to an "
               "environment variable in header_env, and the worker sends that variable's value",
}
# A key or field whose name says it holds a secret (after `--`, `-` as `_`, any case):
# `api_key`, `--access-token`, `password`, `client_secret`; not `keyfile`, `auth_method`.
_SECRET_NAME = re.compile(
    r"(^|_)(api_?key|key|keys|token|tokens|secret|secrets|password|passwd|pwd|credentials?"
    r"|auth|authorization|bearer|cookie)$")
_SECRET_INSTEAD = ("a spec never holds a key or a secret: name a provider profile "
                   "(`provider`), which the worker maps to its own key, or an environment "
                   "variable the worker reads")

# Known shapes of credentials (the token part long enough that ordinary words never match).
_TOKEN_SHAPES: list[tuple[str, re.Pattern[str]]] = [
    ("an API key (sk-…)", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    ("an API key (sk_/rk_/pk_…)", re.compile(r"\b[srp]k_(live|test)_[A-Za-z0-9]{10,}")),
    ("a GitHub token",
     re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("an AWS access key", re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("a Google API key", re.compile(r"\bAIza[A-Za-z0-9_-]{30,}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    ("an npm or PyPI token", re.compile(r"\b(npm_[A-Za-z0-9]{20,}|pypi-[A-Za-z0-9_-]{20,})")),
    ("a JSON web token",
     re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a bearer or basic credential",
     re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")),
]
# A reference to a variable, not a value: `$TOKEN`, `${TOKEN}`, `%TOKEN%`.
_REFERENCE = re.compile(r"^(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%)$")


def first_problem(err: ValidationError, whole: str = "(the input)") -> str:
    """A validation error's first problem in one line, `where: what` (`whole` names the
    place when it is the value itself), never the value: a refusal's sentence."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or whole
    more = f" ({err.error_count()} problems)" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def secret_problem(value: str) -> str | None:
    """What kind of secret `value` holds, or None: a known token shape anywhere in it."""
    for kind, shape in _TOKEN_SHAPES:
        if shape.search(value):
            return f"it holds what looks like {kind}"
    return None


def names_secret(key: str) -> bool:
    """Whether a key's or field's name says it holds a secret (see `_SECRET_NAME`)."""
    return bool(_SECRET_NAME.search(key.lstrip("-").lower().replace("-", "_")))


def _keyed_secret(key: str, value: str) -> str | None:
    """A value given to a key whose name says secret (`--api-key=…`, `token=…`)."""
    if value and names_secret(key) and not _REFERENCE.match(value):
        return f"it gives a value to {key.lstrip('-')!r}, which names a secret"
    return None


def arg_secret_problems(args: list[str]) -> list[tuple[int, str]]:
    """(index, why) of every command-line argument that holds a secret: a token shape, a
    `--secret-key=value`, or the value after a bare `--secret-key` flag."""
    found: list[tuple[int, str]] = []
    for i, arg in enumerate(args):
        key, sep, value = arg.partition("=")
        why = secret_problem(arg) or (_keyed_secret(key, value) if sep else None)
        if why is None and i > 0 and args[i - 1].startswith("-") \
                and "=" not in args[i - 1] and not arg.startswith("-"):
            why = _keyed_secret(args[i - 1], arg)
        if why:
            found.append((i, why))
    return found


def url_problem(url: str) -> str | None:
    """Why `url` holds a secret, or None: a token in it, or a query parameter whose name
    says secret (`?api_key=…`, `&token=…`)."""
    why = secret_problem(url)
    if why:
        return why
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        why = _keyed_secret(key, value) or (
            f"its query gives a value to {key!r}, which names a secret"
            if key.lower() in ("sig", "signature", "code") and value else None)
        if why:
            return why.replace("it gives", "its query gives")
    return None


def unknown_field_problem(model: str, unknown: list[str], known: list[str]) -> str:
    """One sentence for the unknown fields of `model`: where their values belong."""
    parts = []
    for name in unknown:
        instead = _INSTEAD.get(name) or (_SECRET_INSTEAD if names_secret(name) else None)
        parts.append(f"unknown field {name!r}" + (f": {instead}" if instead else ""))
    return f"{'; '.join(parts)} ({model} takes only: {', '.join(known)})"


class SpecModel(BaseModel):
    """A model of the agent spec: refuses unknown fields (but in `STORED` data), and never
    quotes its input in an error."""

    model_config: ClassVar[ConfigDict] = ConfigDict(hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or (info.context or {}).get("keel_stored"):
            return data
        known = list(cls.model_fields)
        unknown = [str(k) for k in data if k not in cls.model_fields]
        if unknown:
            raise ValueError(unknown_field_problem(cls.__name__, unknown, known))
        return data
