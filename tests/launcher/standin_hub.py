"""A stand-in Hugging Face hub: a real HTTP server on loopback that answers huggingface_hub as
the hub does, for the routes the launcher uses (read in huggingface_hub's own source: its
``hf_raise_for_status`` maps ``X-Error-Code`` to its exceptions, ``get_hf_file_metadata`` needs
``X-Repo-Commit`` and ``ETag``):

- ``GET /api/models/<repo>`` and ``/api/models/<repo>/revision/<rev>``: the commit (``sha``) and
  the file list (``siblings``); a gated repository's info is public, as on the hub;
- ``GET /api/models/<repo>/tree/<rev>[/<folder>]``: one folder's entries (``?recursive=true``:
  all below it), as ``{"type": "file"|"directory", "oid", "size", "path"}`` in one page (no
  ``Link`` header, so huggingface_hub's paging stops); a folder the commit lacks is 404
  ``EntryNotFound``. transformers 5 lists ``additional_chat_templates/`` this way on every
  tokenizer load, and takes that 404 as "none";
- ``HEAD``/``GET /<repo>/resolve/<rev>/<file>``: the file, with ``X-Repo-Commit``, ``ETag`` (the
  git blob id, as the hub gives for a file kept in git, not LFS: so no ``X-Linked-Size`` /
  ``X-Linked-Etag``, which only an LFS file's redirect carries) and ``Content-Length``.

A gated repository's info and tree are public, its files are not, as on the hub.

Refusals as the hub gives them: an unknown repository is 401 without a token (the hub does not
say whether a private one exists) and 404 with one, ``X-Error-Code: RepoNotFound``; a gated one's
files are 401 without a token and 403 with a token lacking access, ``GatedRepo``; an unknown
revision 404 ``RevisionNotFound``; a missing file 404 ``EntryNotFound``. Every request is logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit sha -> file name -> content
    refs: dict[str, str]  # branch or tag -> commit sha
    gated: bool = False
    readers: frozenset[str] = frozenset()  # tokens with access to a gated repository
    lists_files: bool = True  # False: the info leaves out 'siblings', as a mirror may


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


@dataclass
class StandinHub:
    repos: dict[str, Repo]
    seen: list[Seen] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _connections: set[socket.socket] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> StandinHub:
        hub = self

        class Handler(_Handler):
            standin = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Gone, as a hub out of reach is: no new connection, and kept-alive ones cut."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]


def commit_of(label: str) -> str:
    """A 40-hex commit id, as the hub's (huggingface_hub tells commits from branches by it)."""
    return hashlib.sha1(label.encode()).hexdigest()


def blob_id(content: bytes) -> str:
    """The git blob id of a file: what the hub gives as ETag and tree ``oid`` for a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def tree_entries(files: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, Any]]:
    """The hub's tree listing of ``folder`` ('' for the root): files and folders, sorted."""
    prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
    found: dict[str, dict[str, Any]] = {}
    for name in sorted(files):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :].split("/")
        # every folder on the way down is an entry; with recursive, the files below it too
        for depth in range(1, len(rest)):
            path = prefix + "/".join(rest[:depth])
            found.setdefault(
                path, {"type": "directory", "oid": commit_of(path), "size": 0, "path": path}
            )
            if not recursive:
                break
        else:
            found[name] = {
                "type": "file",
                "oid": blob_id(files[name]),
                "size": len(files[name]),
                "path": name,
            }
    return [found[path] for path in sorted(found)]


class _Handler(BaseHTTPRequestHandler):
    standin: StandinHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads `seen`
        pass

    def setup(self) -> None:
        super().setup()
        self.standin._connections.add(self.connection)

    def finish(self) -> None:
        self.standin._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = urlsplit(self.path).path
        auth = self.headers.get("Authorization")
        self.standin.seen.append(Seen(self.command, path, auth))
        token = auth.removeprefix("Bearer ").strip() if auth else None
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) == 4:
            self._info("/".join(parts[2:4]), "main", token, body)
        elif parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
            self._info("/".join(parts[2:4]), parts[5], token, body)
        elif parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            query = parse_qs(urlsplit(self.path).query)
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            folder = "/".join(parts[6:])
            self._tree("/".join(parts[2:4]), parts[5], folder, recursive, token, body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), token, body)
        else:
            self._answer(404, b"Not Found", {}, body)

    def _repo(self, repo_id: str, token: str | None, body: bool) -> Repo | None:
        repo = self.standin.repos.get(repo_id)
        if repo is None:
            self._refuse(
                401 if token is None else 404, "RepoNotFound", "Repository not found", body
            )
        return repo

    def _commit(self, repo: Repo, rev: str, body: bool) -> str | None:
        commit = repo.refs.get(rev) or (rev if rev in repo.commits else None)
        if commit is None:
            self._refuse(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
        return commit

    def _revision(self, repo_id: str, rev: str, token: str | None,
                  body: bool) -> tuple[Repo, str] | None:
        """The repository and the commit ``rev`` names, or None once the refusal is sent."""
        repo = self._repo(repo_id, token, body)
        if repo is None:
            return None
        commit = self._commit(repo, rev, body)
        return None if commit is None else (repo, commit)

    def _info(self, repo_id: str, rev: str, token: str | None, body: bool) -> None:
        found = self._revision(repo_id, rev, token, body)
        if found is None:
            return
        repo, commit = found
        info = {
            "_id": commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": [{"rfilename": name} for name in sorted(repo.commits[commit])],
        }
        if not repo.lists_files:
            del info["siblings"]
        data = json.dumps(info).encode()
        self._answer(200, data, {"Content-Type": "application/json"}, body)

    def _tree(
        self, repo_id: str, rev: str, folder: str, recursive: bool, token: str | None, body: bool
    ) -> None:
        found = self._revision(repo_id, rev, token, body)
        if found is None:
            return
        repo, commit = found
        entries = tree_entries(repo.commits[commit], folder, recursive)
        if folder and not entries:
            self._refuse(404, "EntryNotFound", f"{folder} does not exist on {rev}", body, commit)
            return
        data = json.dumps(entries).encode()
        self._answer(200, data, {"Content-Type": "application/json"}, body)

    def _file(self, repo_id: str, rev: str, name: str, token: str | None, body: bool) -> None:
        repo = self._repo(repo_id, token, body)
        if repo is None:
            return
        if repo.gated and token not in repo.readers:
            self._refuse(
                401 if token is None else 403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
                body,
            )
            return
        commit = self._commit(repo, rev, body)
        if commit is None:
            return
        content = repo.commits[commit].get(name)
        if content is None:
            self._refuse(404, "EntryNotFound", f"{name} does not exist on {rev}", body, commit)
            return
        headers = {
            "Content-Type": "application/json",
            "X-Repo-Commit": commit,
            "ETag": f'"{blob_id(content)}"',
        }
        self._answer(200, content, headers, body)

    def _refuse(
        self, status: int, code: str, message: str, body: bool, commit: str | None = None
    ) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message}
        if commit is not None:
            headers["X-Repo-Commit"] = commit
        data = json.dumps({"error": message}).encode()
        self._answer(status, data, {"Content-Type": "application/json", **headers}, body)

    def _answer(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
