"""A STAND-IN for the Hugging Face Hub (which cannot be reached here): a local HTTP server speaking the
few Hub endpoints huggingface_hub uses to download a snapshot and to upload a commit, recording every
request. The code under test is the real huggingface_hub client pointed at it (endpoint=...).

Served: repo info by revision, recursive tree listing, file resolve (HEAD/GET, Range), repo creation,
model card YAML validation, preupload (every file "regular"), commit (NDJSON with base64 files and
deletedFile / deletedFolder operations). Gated repos answer 403 GatedRepo
without a granted token; unknown revisions 404 RevisionNotFound; unknown repos 401 RepoNotFound.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    commits: dict = field(default_factory=dict)  # sha -> {path: bytes}
    refs: dict = field(default_factory=dict)  # branch/tag -> sha
    gated: bool = False
    private: bool = False

    def commit(self, files: dict, ref: str = "main") -> str:
        sha = hashlib.sha1(
            json.dumps({p: git_oid(b) for p, b in sorted(files.items())}).encode() + str(len(self.commits)).encode()
        ).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        return rev if rev in self.commits else self.refs.get(rev)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict
    body: bytes


class StandInHub:
    """`with StandInHub() as hub:` -> hub.url; hub.repos[("model", "org/name")] = Repo(); hub.requests."""

    def __init__(self, granted_tokens: tuple[str, ...] = ()):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[Recorded] = []
        self.granted = set(granted_tokens)
        self.failing: set[str] = set()  # files whose download fails (500), as an interrupted transfer would
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _record(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                hub.requests.append(Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                return body

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, status: int, data, headers: dict | None = None):
                self._send(status, json.dumps(data).encode(), headers)

            def _error(self, status: int, code: str, message: str):
                self._json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

            def _repo(self, kind: str, repo_id: str, rev: str | None):
                repo = hub.repos.get((kind, repo_id))
                if repo is None:
                    self._error(401, "RepoNotFound", "Repository not found")
                    return None, None
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                if repo.gated and token not in hub.granted:
                    self._error(403, "GatedRepo", "Access to this repo is restricted; request access")
                    return None, None
                sha = repo.resolve(rev) if rev is not None else None
                if rev is not None and sha is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                    return None, None
                return repo, sha

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                self._record()
                url = urlparse(self.path)
                path = unquote(url.path)
                m = re.match(r"^/api/(model|dataset)s/([^/]+/[^/]+)(?:/revision/(.+))?$", path)
                if m:
                    repo, sha = self._repo(m[1], m[2], m[3] or "main")  # no revision: the default branch
                    if repo:
                        files = repo.commits[sha]
                        self._json(
                            200,
                            {
                                "id": m[2],
                                "sha": sha,
                                "private": repo.private,
                                "gated": repo.gated,
                                "siblings": [{"rfilename": p} for p in sorted(files)],
                            },
                        )
                    return
                m = re.match(r"^/api/(model|dataset)s/([^/]+/[^/]+)/tree/([^/]+)(/.*)?$", path)
                if m:
                    repo, sha = self._repo(m[1], m[2], m[3])
                    if repo:
                        files = repo.commits[sha]
                        self._json(
                            200,
                            [{"type": "file", "path": p, "size": len(b), "oid": git_oid(b)} for p, b in sorted(files.items())],
                        )
                    return
                m = re.match(r"^/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if m:
                    repo, sha = self._repo("dataset" if m[1] else "model", m[2], m[3])
                    if not repo:
                        return
                    data = repo.commits[sha].get(m[4])
                    if data is None:
                        self._error(404, "EntryNotFound", f"{m[4]} not found")
                        return
                    headers = {"X-Repo-Commit": sha, "ETag": f'"{git_oid(data)}"', "Accept-Ranges": "bytes"}
                    if self.command == "GET" and m[4] in hub.failing:
                        self._error(500, "Internal", "stand-in failure")
                        return
                    rng = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                    if rng:
                        a = int(rng[1])
                        b = int(rng[2]) + 1 if rng[2] else len(data)
                        headers["Content-Range"] = f"bytes {a}-{b - 1}/{len(data)}"
                        self._send(206, data[a:b], headers, "application/octet-stream")
                    else:
                        self._send(200, data, headers, "application/octet-stream")
                    return
                self._error(404, "NotFound", f"stand-in Hub does not serve GET {path}")

            def do_POST(self):
                body = self._record()
                path = unquote(urlparse(self.path).path)
                if path == "/api/validate-yaml":  # the model card's metadata; the stand-in accepts it
                    self._json(200, {})
                    return
                if path == "/api/repos/create":
                    req = json.loads(body)
                    repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    kind = req.get("type") or "model"
                    if (kind, repo_id) not in hub.repos:  # with its first commit, as the Hub makes it
                        repo = Repo(private=bool(req.get("private")) or req.get("visibility") == "private")
                        repo.commit({".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"})
                        hub.repos[(kind, repo_id)] = repo
                    self._json(200, {"url": f"http://{self.headers['Host']}/{repo_id}", "name": repo_id})
                    return
                m = re.match(r"^/api/(model|dataset)s/([^/]+/[^/]+)/preupload/(.+)$", path)
                if m:
                    files = json.loads(body)["files"]
                    self._json(
                        200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
                    )
                    return
                m = re.match(r"^/api/(model|dataset)s/([^/]+/[^/]+)/commit/(.+)$", path)
                if m:
                    repo = hub.repos[(m[1], m[2])]
                    files = dict(repo.commits.get(repo.refs.get(m[3]), {}))
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            v = item["value"]
                            files[v["path"]] = base64.b64decode(v["content"])
                        elif item["key"] in ("deletedFile", "deletedFolder"):
                            gone = item["value"]["path"].rstrip("/")
                            files = {f: b for f, b in files.items() if f != gone and not f.startswith(gone + "/")}
                    sha = repo.commit(files, m[3])
                    self._json(
                        200,
                        {"success": True, "commitOid": sha, "commitUrl": f"http://{self.headers['Host']}/{m[2]}/commit/{sha}"},
                    )
                    return
                self._error(404, "NotFound", f"stand-in Hub does not serve POST {path}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
