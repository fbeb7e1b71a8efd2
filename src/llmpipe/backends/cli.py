"""backends: the training backends there are, and what each one is made of (llmpipe.backends).

llmpipe backends
"""

from __future__ import annotations

import argparse

from llmpipe import backends


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="llmpipe backends", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    for b in backends.all_backends():
        rules = b.rules_file()
        shown = rules.relative_to(backends.REPO) if rules.is_relative_to(backends.REPO) else rules
        print(
            f"{b.name}: {b.doc}\n  config section: {b.name if b.section_schema else '(none)'}"
            f"\n  commands: {', '.join(b.commands) or '(none)'}\n  rules: {shown} ({', '.join(b.rule_names())})"
            f"\n  environment: {b.env or '(the main one)'}{f' (built by {b.setup})' if b.setup else ''}"
        )
