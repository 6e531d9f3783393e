import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loopnet.data import DataConfigError, TokenStreamDataModule, sources
from loopnet.data.sources import ValSelector, load_documents
from loopnet.data.stream import iter_texts, val_windows


def texts_of(ds, column="text"):
    return [t for _, t in iter_texts(ds, column)]


def test_shakespeare_is_38_plays_one_document_each():
    docs = load_documents("shakespeare")
    assert docs.num_shards == 38
    texts = texts_of(docs)
    assert len(texts) == 38 and texts[0].startswith("# ")


def test_txt_jsonl_parquet_files(tmp_path, txt_corpus, jsonl_corpus):
    glob_txt, texts = txt_corpus
    assert sorted(texts_of(load_documents("files", glob_txt))) == sorted(texts)
    glob_jsonl, jtexts = jsonl_corpus
    assert texts_of(load_documents("files", glob_jsonl), "body") == jtexts
    pq.write_table(pa.table({"text": jtexts[:7]}), tmp_path / "a.parquet")
    assert texts_of(load_documents("files", [str(tmp_path / "a.parquet")])) == jtexts[:7]


def test_sample_by_line(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    assert texts_of(load_documents("files", str(tmp_path / "a.txt"), sample_by="line")) == ["one", "two", "three"]


def test_local_dataset_folder_through_hub_path(tmp_path):
    # The hub code path (load_dataset(path, name, split, streaming=True)) on a local dataset folder.
    d = tmp_path / "mydata" / "data"
    d.mkdir(parents=True)
    for k in range(2):
        pq.write_table(pa.table({"text": [f"doc {k} {i}" for i in range(5)]}), d / f"train-0000{k}-of-00002.parquet")
    docs = load_documents("hub", str(tmp_path / "mydata"), split="train")
    assert sorted(texts_of(docs)) == sorted(f"doc {k} {i}" for k in range(2) for i in range(5))


def test_hub_offline_fails_fast_naming_alternatives():
    start = time.perf_counter()
    with pytest.raises(DataConfigError, match="offline mode.*source: shakespeare.*source: files"):
        load_documents("hub", "Skylion007/openwebtext")
    assert time.perf_counter() - start < 5


def test_hub_unreachable_fails_fast(monkeypatch):
    import huggingface_hub

    def unreachable(self, repo_id, timeout=None, **kw):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(sources, "hub_offline", lambda: False)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", unreachable)
    with pytest.raises(DataConfigError, match="Cannot stream 'Skylion007/openwebtext'.*source: shakespeare"):
        TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="hub").setup("fit")


def test_bad_paths(tmp_path):
    with pytest.raises(DataConfigError, match="No file matches"):
        load_documents("files", str(tmp_path / "*.txt"))
    with pytest.raises(DataConfigError, match="needs `path:`"):
        load_documents("files", None)
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(DataConfigError, match="Unsupported file type '.csv'"):
        load_documents("files", str(tmp_path / "a.csv"))
    (tmp_path / "b.txt").write_text("x")
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(DataConfigError, match="Mixed file types"):
        load_documents("files", [str(tmp_path / "b.txt"), str(tmp_path / "c.jsonl")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataConfigError, match="is empty"):
        load_documents("hub", str(tmp_path / "empty"))


def test_missing_text_column(jsonl_corpus):
    glob_jsonl, _ = jsonl_corpus
    with pytest.raises(DataConfigError, match=r"No text column 'text'.*\['body', 'id'\]"):
        texts_of(load_documents("files", glob_jsonl))
    with pytest.raises(DataConfigError, match="holds int values"):
        texts_of(load_documents("files", glob_jsonl), "id")


def test_non_utf8_file(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine text \xff\xfe then junk")
    with pytest.raises(DataConfigError, match="not valid UTF-8"):
        texts_of(load_documents("files", str(tmp_path / "bad.txt")))


def test_val_selector_is_stable_and_about_the_fraction():
    sel = ValSelector(0.1)
    texts = [f"document number {i}" for i in range(5000)]
    picked = [t for t in texts if sel(t)]
    assert 400 < len(picked) < 600
    assert picked == [t for t in texts if ValSelector(0.1)(t)]
    assert sel("document number 7") == sel("document number 7")
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(DataConfigError, match="val_fraction"):
            ValSelector(bad)


def test_empty_files_give_an_error_not_an_empty_epoch(tmp_path):
    for i in range(3):
        (tmp_path / f"e{i}.txt").write_text("")
    dm = TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="files", path=str(tmp_path / "*.txt"))
    with pytest.raises(DataConfigError, match="0 tokens per epoch"):
        next(iter(dm.train_dataloader()))
    with pytest.raises(DataConfigError, match="The corpus is empty: 3 document"):
        dm.val_dataloader()


def test_empty_documents_are_skipped(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ["", "hello there", None, "x"]))
    docs = load_documents("files", str(tmp_path / "a.jsonl"))
    sel = ValSelector(0.999999)
    w = val_windows(docs, text_column="text", seq_len=2, val=sel)
    # "hello there" + EOT + "x" + EOT, no end-of-text for the empty/null documents
    assert w.tolist() == [[31373, 612, 50256], [50256, 87, 50256]]  # windows share a token


@pytest.fixture
def fake_hub(monkeypatch):
    """A reachable hub whose dataset resolves any revision to a commit sha; load_dataset recorded."""
    import datasets
    import huggingface_hub

    seen = {"info": []}

    class Info:
        def __init__(self, revision):
            self.sha = {None: "c0ffee" * 6 + "beef", "main": "c0ffee" * 6 + "beef"}.get(revision, revision)

    def info(self, repo_id, revision=None, timeout=None, **kw):
        seen["info"].append((repo_id, revision))
        if revision == "nope":
            raise ValueError(f"Invalid rev id: {revision}")  # what the hub's 404 for a revision says
        return Info(revision)

    def listing(self, repo_id, repo_type=None, revision=None, **kw):
        return ["README.md", "data/train.jsonl"]  # not parquet: read by datasets.load_dataset

    def load(path, **kw):
        seen["load"] = (path, kw.get("revision"), kw.get("streaming"))
        return "opened"

    sources._RESOLVED.clear()
    monkeypatch.setattr(sources, "hub_offline", lambda: False)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", info)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", listing)
    monkeypatch.setattr(datasets, "load_dataset", load)
    yield seen
    sources._RESOLVED.clear()


@pytest.mark.parametrize("revision", [None, "main", "83a3d4b"])
def test_hub_revision_resolves_to_one_commit_streamed_and_checked_on_resume(fake_hub, revision):
    dm = TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="hub", revision=revision)
    dm.setup("fit")
    sha = "c0ffee" * 6 + "beef" if revision in (None, "main") else revision
    assert fake_hub["info"] == [("Skylion007/openwebtext", revision)]  # asked once (cached)
    assert fake_hub["load"] == ("Skylion007/openwebtext", sha, True)  # that commit is streamed
    assert dm._config()["revision"] == sha  # part of the stream identity checked on resume


def test_unknown_hub_revision_fails_fast_naming_it(fake_hub):
    with pytest.raises(DataConfigError, match="at revision 'nope'.*Invalid rev id"):
        load_documents("hub", "Skylion007/openwebtext", revision="nope")


def test_local_sources_keep_their_stream_identity_without_revision():
    # Checkpoints written before `revision` existed hold no such key; local sources must still match them.
    assert "revision" not in TokenStreamDataModule(seq_len=8, batch_size=2, seed=0)._config()


def test_revision_only_for_hub_datasets(tmp_path, txt_corpus):
    glob_txt, _ = txt_corpus
    with pytest.raises(DataConfigError, match="revision: main. pins a hub dataset, but source is 'files'; fix: remove"):
        TokenStreamDataModule(seq_len=8, batch_size=2, source="files", path=glob_txt, revision="main")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("x")
    with pytest.raises(DataConfigError, match="is a local folder; fix: remove `revision:`"):
        load_documents("hub", str(tmp_path / "folder"), revision="main")


def test_resume_after_an_upstream_change_names_both_commits(fake_hub):
    old = TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="hub", revision="a1" * 20)
    state = old.train_dataloader().state_dict()
    new = TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="hub")  # latest: another commit now
    with pytest.raises(DataConfigError, match=f"revision.*{'a1' * 20}.*{'c0ffee' * 6}beef"):
        new.train_dataloader().load_state_dict(state)
