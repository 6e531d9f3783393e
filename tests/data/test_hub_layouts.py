"""Hub datasets as the hub serves them, read without loading scripts: script only, the parquet conversion
(full and partial), the repository's own parquet files; local folders laid out the same way."""

import json
import os
import sys
from types import SimpleNamespace

import pytest
import yaml

from loopnet.bench.corpus import write_corpus
from loopnet.data import DataConfigError, TokenStreamDataModule
from loopnet.data.hub import CONVERSION, parquet_layout
from loopnet.data.parquet import ParquetCorpus
from loopnet.diagnostics.summary import _data_summary
from tests.helpers import run_command

OWT = "Skylion007/openwebtext"
BASE = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "../../configs/base.yaml")))["data"]


def script_only(folder):
    (folder / "openwebtext.py").write_text("import datasets\n")
    (folder / "dataset_infos.json").write_text("{}")  # as the script repository had
    (folder / "README.md").write_text("---\npretty_name: OpenWebText\n---\n")


def owt(layout, n_docs=400, shards=8):
    return lambda folder: write_corpus(folder, n_docs, shards, layout, row_group_docs=16, mean_chars=300)


def module(**kw):
    args = dict(seq_len=32, batch_size=2, seed=0, source="hub", path=OWT, shuffle_buffer=4) | kw
    return TokenStreamDataModule(**args)


def test_base_config_pins_the_parquet_conversion():
    assert BASE["revision"] == CONVERSION and BASE["name"] == "plain_text" and BASE["path"] == OWT


def test_script_only_repository_gets_one_line_naming_the_revision(hub):
    hub.add(OWT, "main", script_only)
    with pytest.raises(DataConfigError) as err:
        module().setup("fit")
    msg = str(err.value)
    assert "\n" not in msg and "holds only the loading script openwebtext.py" in msg
    assert f"fix: read the hub's parquet conversion with `data.revision: {CONVERSION}`" in msg


def test_script_only_local_folder_names_a_parquet_folder(tmp_path):
    folder = tmp_path / "openwebtext"
    folder.mkdir()
    script_only(folder)
    with pytest.raises(
        DataConfigError,
        match=r"only the loading script openwebtext.py.*fix: point `data.path` at a "
        r"folder of its parquet files.*--revision refs/convert/parquet",
    ):
        module(path=str(folder)).setup("fit")


@pytest.mark.parametrize("layout", ["conversion", "own"])
def test_full_parquet_on_the_hub_reads_every_document_once(hub, layout):
    sha = hub.add(OWT, CONVERSION if layout == "conversion" else "main", owt(layout))
    dm = module(revision=BASE["revision"] if layout == "conversion" else None, name=BASE["name"])
    dm.setup("fit")
    assert isinstance(dm.docs, ParquetCorpus) and dm.docs.n_docs == 400 and len(dm.docs.files) == 8
    assert dm.revision == sha and not dm.layout.partial
    assert all(f.startswith(f"datasets/{OWT}@{sha}/plain_text/") for f in dm.docs.files)
    texts = list(dm.docs.texts(dm.docs.range_pieces(0, dm.docs.n_docs)))
    assert len(texts) == len(set(texts)) == 400
    assert hub.opened  # read through HfFileSystem paths, not a local shortcut
    assert next(iter(dm.train_dataloader()))[0].shape == (2, 32)


def test_partial_conversion_is_named_with_its_documents_and_shards(hub, capsys):
    hub.add(OWT, CONVERSION, owt("partial", n_docs=250, shards=9))
    dm = module(revision=CONVERSION, name="plain_text")
    dm.setup("fit")
    err = capsys.readouterr().err
    assert (
        "loopnet: warning:" in err
        and "partial parquet conversion: plain_text/partial-train holds 250 documents in 9 shard(s)" in err
    )
    summary = dm.summary()
    assert summary["partial"] is True and summary["documents"] == 250 and summary["files"] == 9
    assert "250 documents in 9 shard(s)" in summary["partial_note"]
    assert _data_summary(SimpleNamespace(datamodule=dm)) == summary  # what summary.json's "data" holds


@pytest.mark.parametrize(
    "layout,folder,partial",
    [
        ("conversion", "plain_text/train", False),
        ("partial", "plain_text/partial-train", True),
        ("own", "plain_text", False),
    ],
)
def test_local_folders_laid_out_as_the_hub(tmp_path, layout, folder, partial):
    write_corpus(tmp_path, 120, 8, layout, row_group_docs=7, mean_chars=200)
    dm = module(path=str(tmp_path), val_fraction=0.05)
    dm.setup("fit")
    assert dm.docs.n_docs == 120 and dm.layout.folder == folder and dm.layout.partial is partial
    assert dm.revision is None and len(dm.val_windows()) > 0


def test_layout_rules():
    conv = [
        "README.md",
        "plain_text/train/0000.parquet",
        "plain_text/train/0001.parquet",
        "plain_text/test/0000.parquet",
    ]
    assert parquet_layout(conv, name=None, split="train", where="x", local=False).files == tuple(conv[1:3])
    assert parquet_layout(conv, name=None, split="test", where="x", local=False).folder == "plain_text/test"
    with pytest.raises(DataConfigError, match="no split 'validation'.*found: test, train.*fix: set `data.split`"):
        parquet_layout(conv, name=None, split="validation", where="x", local=False)
    with pytest.raises(DataConfigError, match="no config 'en'.*configs: plain_text.*fix: set `data.name`"):
        parquet_layout(conv, name="en", split="train", where="x", local=False)
    two = ["a/train/0000.parquet", "b/train/0000.parquet"]
    with pytest.raises(DataConfigError, match=r"several configs \(a, b\); fix: choose one with `data.name`"):
        parquet_layout(two, name=None, split="train", where="x", local=False)
    assert parquet_layout(["data/x.jsonl"], name=None, split="train", where="x", local=False) is None  # to datasets
    own = ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test-00000-of-00001.parquet"]
    assert parquet_layout(own, name=None, split="train", where="x", local=False).files == tuple(own[:2])


def test_unreachable_hub_fails_fast_before_lightning_naming_the_overlay():
    """`loopnet fit --config configs/deeploop_r6.yaml` with no hub: one line naming --config configs/cpu.yaml and a
    local folder, before Lightning is imported."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=root)
    code = (
        "import sys\nfrom loopnet.commands import main\n"
        "try:\n    main(['fit', '--config', 'configs/deeploop_r6.yaml'])\nfinally:\n"
        "    print('LIGHTNING' if 'lightning' in sys.modules else 'NO-LIGHTNING', file=sys.stderr)"
    )
    res = run_command([sys.executable, "-c", code], env=env, cwd=root)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and lines[-1] == "NO-LIGHTNING", res.stderr
    assert lines[0].startswith("loopnet: error: ") and len(lines) == 2
    assert "--config configs/cpu.yaml" in lines[0] and "data.path" in lines[0] and "fix:" in lines[0]


def test_a_fit_on_a_partial_conversion_records_it_in_summary_json(tmp_path):
    """`loopnet fit` on a local copy of a partial conversion: the warning at start, summary.json's `data`."""
    from tests.reliability.helpers import SHORT, loopnet

    write_corpus(tmp_path / "owt", 300, 8, "partial", row_group_docs=10, mean_chars=400)
    res = loopnet(
        "fit",
        *SHORT,
        "--data.source",
        "hub",
        "--data.path",
        str(tmp_path / "owt"),
        "--data.val_fraction",
        "0.05",
        "--data.cache_dir",
        str(tmp_path / "cache"),
        cwd=tmp_path,
    )
    assert res.code == 0, res.err[-2000:]
    assert "partial parquet conversion: plain_text/partial-train holds 300 documents in 8 shard(s)" in res.err
    (summary,) = (tmp_path / "runs").rglob("summary.json")
    data = json.loads(summary.read_text())["data"]
    assert data["partial"] is True and data["documents"] == 300 and data["files"] == 8
    assert data["val_rule"] == "last 15 of 300 documents" and os.path.isfile(data["val_cache"])


def test_a_fit_reads_openwebtext_as_base_yaml_pins_it_from_the_simulated_hub(hub, tmp_path):
    """The default path end to end (in process, the hub simulated): base.yaml's id, revision and config."""
    from tests.reliability.helpers import SHORT, loopnet

    hub.add(OWT, "main", script_only)  # what the main branch held: a loading script
    sha = hub.add(OWT, CONVERSION, owt("conversion", n_docs=300))
    pinned = [f"--data.{k}={BASE[k]}" for k in ("source", "path", "revision", "name")]
    res = loopnet(
        "fit", *SHORT, *pinned, "--data.val_fraction=0.02", "--data.cache_dir", str(tmp_path / "cache"), cwd=tmp_path
    )
    assert res.code == 0, res.err[-2000:]
    (summary,) = (tmp_path / "runs").rglob("summary.json")
    data = json.loads(summary.read_text())["data"]
    assert data["revision"] == sha and data["folder"] == "plain_text/train" and data["files"] == 8
    assert data["partial"] is False and data["val_rule"] == "last 6 of 300 documents"
    assert any(p.startswith(f"datasets/{OWT}@{sha}/plain_text/train/") for p in hub.opened)
