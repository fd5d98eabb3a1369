"""docs/configuration.md, written from the configuration dataclasses themselves: every
setting with its default, its environment variable and the comment above it in the code,
so the reference cannot drift from what the proxy reads.

    python -m proxy.config_doc > docs/configuration.md     (make config-doc)

tests/unit/test_config_doc.py fails when the committed file differs from what this writes.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import io
import re
import tokenize
from typing import Any

from proxy.config import ProxyConfig

_FIELD = re.compile(r"^    (\w+)\s*:")
# Defaults that depend on the machine the proxy runs on, shown as what they are made of.
_MADE_AT_START = {"proxy_id": "<hostname>-<pid>"}

HEADER = """\
# Configuration

<!-- Written by `make config-doc` (python -m proxy.config_doc) from proxy/config.py and
proxy/security/config.py; edit the comments there, not this file. -->

Settings come from the defaults below, then a TOML file (`rmq-proxy --config FILE`), then
environment variables, then command-line flags (`rmq-proxy --help`), each overriding the
one before. A top-level setting `name` is `RMQ_PROXY_<NAME>` in the environment; a setting
of a table, e.g. `[receive] mode`, is `RMQ_PROXY_RECEIVE_MODE`. Lists in the environment
are comma- or semicolon-separated; booleans are `1`, `true` or `yes`, anything else false.
`deploy/proxy.example.toml` is a file with every setting at its default.
"""


def comments(cls: type) -> dict[str, str]:
    """Each field of the dataclass ``cls`` and the comment after it on its line, or else the
    comment block right above it (a block says what its first field does)."""
    lines = inspect.getsource(cls).splitlines()
    found: dict[str, str] = {}
    block: list[str] = []
    given = False  # the comment block has gone to a field already
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith(("def ", "@")):
            break
        if stripped.startswith("#"):
            if given:
                block, given = [], False
            block.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match is None:
            continue
        name = match.group(1)
        if trailing := _trailing_comment(line):
            found[name] = trailing
        elif block and not given:
            found[name] = " ".join(block)
            given = True
        else:
            found[name] = ""
    return found


def _trailing_comment(line: str) -> str:
    tokens = tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)
    try:
        for token in tokens:
            if token.type == tokenize.COMMENT:
                return token.string.lstrip("#").strip()
    except tokenize.TokenError:
        pass
    return ""


def _default(f: dataclasses.Field[Any]) -> str:
    if f.name in _MADE_AT_START:
        return f"`{_MADE_AT_START[f.name]}`"
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    return f"`{value}`"


def _table(cls: type, env_prefix: str, skip: set[str]) -> list[str]:
    notes = comments(cls)
    rows = ["| setting | default | environment | what it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        note = notes.get(f.name, "").replace("|", "\\|")
        env = f"`{env_prefix}{f.name.upper()}`"
        rows.append(f"| `{f.name}` | {_default(f)} | {env} | {note} |")
    return rows


def render() -> str:
    tables = {
        f.name: f.default_factory
        for f in dataclasses.fields(ProxyConfig)
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
    }
    out = [HEADER, "## Top level", ""]
    out += _table(ProxyConfig, "RMQ_PROXY_", set(tables))
    for name, cls in tables.items():
        assert isinstance(cls, type)
        doc = inspect.getdoc(cls) or ""
        out += ["", f"## `[{name}]`", ""]
        if doc and not doc.startswith(cls.__name__ + "("):  # not the dataclass's own
            out += [" ".join(doc.split()), ""]
        out += _table(cls, f"RMQ_PROXY_{name.upper()}_", set())
    return "\n".join(out) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
