"""`--config KEY=VALUE` overrides, typed by the schema.

Snakemake reads a `--config` value with YAML's BaseLoader, so every scalar inside a mapping is a string
(`--config 'train={max_steps: 160}'` gives `'160'`), and its own parser refuses a dotted key
(`train.max_steps=160`: "Config entry must start with a valid identifier"). Here the raw `KEY=VALUE`
entries are read again and each scalar is given the type the schema has at its path (integer, number,
boolean, null: the first the schema allows there that the text spells, as YAML reads it; else the
text). Only command-line values are converted: a string in a YAML file stays a string, and the schema
names its key. A dotted key (`train.lr=1e-4`, accepted by `llmpipe check-config`) is the nested key.
"""

from __future__ import annotations

import yaml

from llmpipe import config as cfgmod
from llmpipe.profiles import merge  # Snakemake's update_config rule, one place

_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))


def _kind(value) -> str:
    if value is None:
        return "null"
    return next(name for cls, name in _KINDS if isinstance(value, cls))


def _resolve(node, root: dict) -> dict:
    while isinstance(node, dict) and "$ref" in node:  # only local refs: "#/$defs/<name>"
        node = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node if isinstance(node, dict) else {}


def _branches(node: dict, root: dict) -> list[dict]:
    node = _resolve(node, root)
    subs = [s for key in ("anyOf", "oneOf", "allOf") for s in node.get(key, [])]
    return [node, *(b for s in subs for b in _branches(s, root))]


def _kinds(node: dict, root: dict) -> set[str] | None:
    """The JSON types the schema allows at `node` (type, enum, const, anyOf / oneOf); None: any."""
    kinds, known = set(), False
    for b in _branches(node, root):
        if "type" in b:
            kinds |= {b["type"]} if isinstance(b["type"], str) else set(b["type"])
            known = True
        values = list(b.get("enum", [])) + ([b["const"]] if "const" in b else [])
        kinds |= {_kind(v) for v in values}
        known = known or bool(values)
    return kinds if known else None


def _child(node: dict, key, root: dict) -> dict:
    """The schema of `key` (a name, or an int for a list item) inside `node`; {} where it has none."""
    for b in _branches(node, root):
        if isinstance(key, int):
            if isinstance(b.get("items"), dict):
                return b["items"]
            continue
        if key in b.get("properties", {}):
            return b["properties"][key]
        if isinstance(b.get("additionalProperties"), dict):
            return b["additionalProperties"]
    return {}


def _scalar(text: str, node: dict, root: dict):
    """`text` as the type the schema allows here (YAML's reading of it), else `text` itself."""
    try:
        value = yaml.load(text, Loader=cfgmod._Loader)
    except yaml.YAMLError:
        return text
    if value is not None and not isinstance(value, (bool, int, float)):
        return text  # a string, a date, a mapping: the text is what was meant
    kinds = _kinds(node, root)
    if kinds is None:
        return value  # no type here (an unknown key: the schema will name it)
    kind = _kind(value)
    return value if kind in kinds or (kind == "integer" and "number" in kinds) else text


def convert(value, node: dict | None = None, root: dict | None = None):
    """A raw override (strings, lists and mappings of them) typed by the schema at `node`."""
    if root is None:
        root = cfgmod.load_schema()
        node = root if node is None else node
    if isinstance(value, dict):
        return {k: convert(v, _child(node, k, root), root) for k, v in value.items()}
    if isinstance(value, list):
        return [convert(v, _child(node, i, root), root) for i, v in enumerate(value)]
    if isinstance(value, str):
        return _scalar(value, node, root)
    return value


def parse(entries: list[str] | None) -> dict:
    """`KEY=VALUE` entries as Snakemake's --config reads them, scalars kept as text, dotted keys nested.
    Raises ConfigError naming an entry without `=` or with an empty key part."""
    out: dict = {}
    for entry in entries or []:
        key, sep, text = entry.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise cfgmod.ConfigError(
                f"--config {entry!r}: expected KEY=VALUE (e.g. run=exp2, 'train={{lr: 1.0e-4}}' or train.lr=1.0e-4)"
            )
        if text == "":
            value = None  # as Snakemake: KEY= is null
        else:
            try:
                value = yaml.load(text, Loader=yaml.BaseLoader)
            except yaml.YAMLError:
                value = text
        for part in reversed(parts[1:]):
            value = {part: value}
        out = merge(out, {parts[0]: value})
    return out


def from_entries(entries: list[str] | None) -> dict:
    """The --config layer: parsed, then typed by the schema."""
    return convert(parse(entries))


def user_layer(merged: dict, entries: list[str] | None) -> dict:
    """Snakemake's overwrite config (your --configfile files, then --config as Snakemake parsed it) with
    every --config value replaced by its typed reading; a dotted key Snakemake passed through is nested."""
    cli = from_entries(entries)
    dotted = {e.partition("=")[0].strip() for e in entries or [] if "." in e.partition("=")[0]}
    base = {k: v for k, v in (merged or {}).items() if k not in dotted}
    return merge(base, cli)


def snakemake_form(cli: dict) -> list[str]:
    """The same overrides as Snakemake's --config takes them: one KEY=VALUE per top-level key."""
    out = []
    for key, value in cli.items():
        if value is None or isinstance(value, str):
            text = value or ""
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        out.append(f"{key}={text.removesuffix('...').strip()}")
    return out
