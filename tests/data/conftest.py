import json
import os

# Offline before `datasets` is imported (it reads these at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402


def make_docs(n: int, words: int = 40, tag: str = "doc") -> list[str]:
    """n distinct documents of about `words` words each."""
    return [" ".join(f"{tag}{i} word{j}" for j in range(words)) for i in range(n)]


@pytest.fixture
def txt_corpus(tmp_path):
    """12 text files, one document each, plus the list of their texts."""
    texts = make_docs(12)
    d = tmp_path / "txt"
    d.mkdir()
    for i, t in enumerate(texts):
        (d / f"f{i:02d}.txt").write_text(t, encoding="utf-8")
    return str(d / "*.txt"), texts


@pytest.fixture
def jsonl_corpus(tmp_path):
    """4 jsonl files of 10 documents each (column `body`), plus the texts."""
    texts = make_docs(40, tag="j")
    d = tmp_path / "jsonl"
    d.mkdir()
    for k in range(4):
        with open(d / f"part{k}.jsonl", "w", encoding="utf-8") as f:
            for t in texts[k * 10 : (k + 1) * 10]:
                f.write(json.dumps({"body": t, "id": 1}) + "\n")
    return str(d / "*.jsonl"), texts


@pytest.fixture(autouse=True)
def _val_cache(tmp_path, monkeypatch):
    """Held-out windows of parquet corpora are cached under the test's own folder, never ~/.cache."""
    monkeypatch.setenv("LOOPNET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The Hugging Face hub, simulated offline: `hub.add(repo, revision, writer)` lays a repository out in a
    local folder exactly as the hub serves its files at that revision (writer(folder) writes them). What is
    simulated is the transport only: `HfApi.dataset_info` (revision -> commit) and `HfApi.list_repo_files`
    answer from the folders, and `huggingface_hub.HfFileSystem` is the real class (its own parser of
    `datasets/<id>@<commit>/<file>` paths) with the repository check and `_open` served from them."""
    import hashlib

    import huggingface_hub
    from huggingface_hub import HfFileSystem

    from loopnet.data import sources
    from loopnet.data.hub import local_listing

    root = tmp_path / "hub"
    commits: dict[tuple[str, str], str] = {}  # (repo, revision name) -> commit sha
    folders: dict[tuple[str, str], str] = {}  # (repo, commit sha) -> folder

    class Hub:
        opened: list[str] = []

        def add(self, repo, revision, writer):
            sha = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
            folder = root / repo / revision.replace("/", "%2F")
            folder.mkdir(parents=True)
            writer(folder)
            commits[repo, revision], folders[repo, sha] = sha, str(folder)
            return sha

    def dataset_info(self, repo_id, revision=None, timeout=None, **kw):
        key = (repo_id, revision or "main")
        if key not in commits:
            raise huggingface_hub.errors.RevisionNotFoundError(f"Invalid rev id: {revision}")
        return type("Info", (), {"sha": commits[key]})()

    def list_repo_files(self, repo_id, repo_type=None, revision=None, **kw):
        assert repo_type == "dataset"
        return local_listing(folders[repo_id, revision])

    class LocalHubFS(HfFileSystem):
        def _repo_and_revision_exist(self, repo_type, repo_id, revision):
            return (repo_id, revision) in folders, None

        def _open(self, path, mode="rb", **kw):
            resolved = self.resolve_path(path)  # huggingface_hub's own parsing of the path
            Hub.opened.append(path)
            return open(os.path.join(folders[resolved.repo_id, resolved.revision], resolved.path_in_repo), mode)

    sources._RESOLVED.clear()
    monkeypatch.setattr(sources, "hub_offline", lambda: False)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "HfFileSystem", LocalHubFS)
    yield Hub()
    sources._RESOLVED.clear()
