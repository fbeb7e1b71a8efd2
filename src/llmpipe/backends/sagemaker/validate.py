"""Check a request against the AWS limits in botocore's service model (required members, types,
minimum sizes: botocore's ParamValidator; maximum sizes, integer maxima, enums and name
patterns: read here from the same model) before any API call, so a
bad job name or hyperparameter stops the rule locally with the offending field named."""

from __future__ import annotations

import botocore.session
import regex  # AWS patterns use \p{L} classes, which the re module lacks
from botocore.validate import ParamValidator


class RequestError(ValueError):
    """A request field breaks an AWS limit."""


_MODELS: dict = {}


def _operation(service: str, operation: str):
    if service not in _MODELS:
        _MODELS[service] = botocore.session.get_session().get_service_model(service)
    return _MODELS[service].operation_model(operation)


def check_request(service: str, operation: str, params: dict) -> None:
    """Raise RequestError listing every field of `params` that AWS would reject by its model."""
    shape = _operation(service, operation).input_shape
    problems = []
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        problems.append(report.generate_report())
    _walk(shape, params, operation, problems)
    if problems:
        raise RequestError(f"{service} {operation} request rejected locally:\n  - " + "\n  - ".join(problems))


def _walk(shape, value, path: str, problems: list) -> None:
    md = shape.metadata
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, sub in value.items():
            if name in shape.members:
                _walk(shape.members[name], sub, f"{path}.{name}", problems)
        return
    if kind == "list" and isinstance(value, list):
        _size(md, len(value), path, "items", problems)
        for i, item in enumerate(value):
            _walk(shape.member, item, f"{path}[{i}]", problems)
        return
    if kind == "map" and isinstance(value, dict):
        _size(md, len(value), path, "entries", problems)
        for k, v in value.items():
            _walk(shape.key, k, f"{path} key {k!r}", problems)
            _walk(shape.value, v, f"{path}[{k!r}]", problems)
        return
    if kind == "string" and isinstance(value, str):
        _size(md, len(value), path, "characters", problems)
        if shape.enum and value not in shape.enum:
            problems.append(f"{path}: {value!r} is not one of {', '.join(shape.enum)}")
        pattern = md.get("pattern")
        if pattern and not regex.fullmatch(pattern, value):
            problems.append(f"{path}: {value!r} does not match the pattern {pattern}")
        return
    if kind in ("integer", "long") and isinstance(value, int):
        if "max" in md and value > md["max"]:
            problems.append(f"{path}: {value} is above the maximum {md['max']}")


def _size(md: dict, n: int, path: str, unit: str, problems: list) -> None:
    if "max" in md and n > md["max"]:
        problems.append(f"{path}: {n} {unit}, at most {md['max']} allowed")
