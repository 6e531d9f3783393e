"""Scale-out data mistakes, each said in one line with its fix: the hub's original OpenWebText files (a loading
script and its archives) downloaded into a folder of any name, and a resume whose hub revision moved."""

import pytest

from loopnet.data import DataConfigError, TokenStreamDataModule
from loopnet.data.hub import CONVERSION, parquet_layout

from .test_hub_layouts import module, script_only
from .test_sources import fake_hub  # noqa: F401  (the fixture)


def original_files(folder):
    """Skylion007/openwebtext at main, as `huggingface-cli download ... --local-dir <folder>` lays it out."""
    script_only(folder)
    (folder / "subsets").mkdir()
    for k in range(3):
        (folder / "subsets" / f"urlsf_subset{k:02d}.tar").write_bytes(b"\0" * 512)


@pytest.mark.parametrize("name", ["owt", "openwebtext", "data"])
def test_the_original_files_in_a_folder_of_any_name_get_the_one_line_fix(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    original_files(folder)
    with pytest.raises(DataConfigError) as info:
        module(path=str(folder)).setup("fit")
    msg = str(info.value)
    assert "\n" not in msg and "holds only the loading script openwebtext.py" in msg
    assert (
        f"fix: point `data.path` at a folder of its parquet files (e.g. `huggingface-cli download <id> "
        f"--repo-type dataset --revision {CONVERSION} --local-dir <folder>`)"
    ) in msg


def test_metadata_files_are_not_data():
    listing = ["README.md", "dataset_infos.json", "openwebtext.py", "subsets/urlsf_subset00.tar"]
    with pytest.raises(DataConfigError, match="holds only the loading script openwebtext.py"):
        parquet_layout(listing, name=None, split="train", where="x", local=True, script="owt.py")
    # a folder with data beside its description is still read by `datasets`
    assert (
        parquet_layout(
            ["dataset_info.json", "state.json", "data-00000-of-00001.arrow"],
            name=None,
            split="train",
            where="x",
            local=True,
            script="x.py",
        )
        is None
    )


def test_a_resume_whose_revision_moved_names_the_commit_to_pin(fake_hub):  # noqa: F811
    trained = "a1" * 20  # the commit the branch pointed at when the run was trained
    state = (
        TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="hub", revision=trained)
        .train_dataloader()
        .state_dict()
    )
    moved = TokenStreamDataModule(seq_len=8, batch_size=2, seed=0, source="hub")  # the branch: another commit now
    with pytest.raises(DataConfigError) as info:
        moved.train_dataloader().load_state_dict(state)
    msg = str(info.value)
    assert "\n" not in msg and msg.endswith(
        f"; fix: read the commit it was trained on with `--data.revision {trained}`"
    )
