"""Hugging Face Hub in and out: base models and datasets down (download.py, datasets.py), a model card
and release folder (card.py) and its upload (release.py), all through huggingface_hub.

Tokens come only from where huggingface_hub looks itself (HF_TOKEN, the `hf auth login` cache); no
function here takes, logs or writes one.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmpipe.io import redact

HUB_PREFIX = "hf://"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class HubError(RuntimeError):
    """A Hub request failed for a reason the user can fix; the message is one line saying how."""


def is_hub_ref(ref: str | None) -> bool:
    """`hf://org/name[@rev]`, or `org/name[@rev]` when no such local path exists."""
    if not ref:
        return False
    if ref.startswith(HUB_PREFIX):
        return True
    return not Path(ref).exists() and bool(_REPO_ID.match(ref.split("@", 1)[0]))


def parse_ref(ref: str, revision: str | None = None) -> tuple[str, str | None]:
    """(repo id, revision) of `[hf://]org/name[@revision]`; an explicit @revision wins over `revision`."""
    body = ref[len(HUB_PREFIX) :] if ref.startswith(HUB_PREFIX) else ref
    repo_id, _, rev = body.partition("@")
    if not _REPO_ID.match(repo_id):
        raise HubError(f"not a Hub repo id: {ref!r} (expected org/name, optionally @revision, or a local folder)")
    return repo_id, (rev or revision)


def explain(exc: BaseException, repo_id: str, revision: str | None, kind: str = "model") -> str:
    """One line for a huggingface_hub error: what is wrong and what to do."""
    from huggingface_hub import errors

    page = f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo_id}"
    rev = revision or "main"
    if isinstance(exc, errors.GatedRepoError):
        return (
            f"{kind} {repo_id} is gated: request access on {page}, then log in (`hf auth login`) or set HF_TOKEN "
            "to a token of the account that was granted access"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{kind} {repo_id} has no revision {rev!r}: use an existing branch, tag or commit hash ({page}/tree/main)"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (
            f"{kind} {repo_id} not found, or private and this token cannot see it: check the id, log in "
            "(`hf auth login`) or set HF_TOKEN"
        )
    if isinstance(exc, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)) or type(exc).__name__ in (
        "IncompleteSnapshotError",
    ):
        return (
            f"{kind} {repo_id}@{rev} is not (completely) in the local Hub cache and the Hub cannot be reached "
            "(HF_HUB_OFFLINE=1 or no network): download it once with network access"
        )
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status == 401:
        return f"{kind} {repo_id}: the Hub refused the token (401): log in again (`hf auth login`) or fix HF_TOKEN"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return redact(f"{kind} {repo_id}@{rev}: {type(exc).__name__}: {first}")  # a CDN error names its presigned URL
