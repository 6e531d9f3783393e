import glob

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from loopnet.data import EOT_ID, TokenStreamDataModule, gpt2_encoding


def test_defaults_embedded_corpus_and_batches():
    dm = TokenStreamDataModule(seq_len=64, batch_size=4, seed=0)
    assert dm.hparams.source == "shakespeare" and dm.hparams.num_workers == 0
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.long
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_val_is_one_held_out_play_and_test_is_the_same():
    dm = TokenStreamDataModule(seq_len=64, batch_size=16, seed=0)
    w = dm.val_windows()
    # Henry VI part 1: 44,901 tokens with its end-of-text, which falls in the dropped final partial window.
    assert w.shape == (701, 65) and int((w == EOT_ID).sum()) == 0
    text = gpt2_encoding().decode(w[0, :12].tolist())
    assert text.startswith("# Henry VI")
    val = list(dm.val_dataloader())
    test = list(dm.test_dataloader())
    assert len(val) == len(test) == 44 and val[-1][0].shape == (13, 64)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(val, test))
    again = list(TokenStreamDataModule(seq_len=64, batch_size=16, seed=1).val_dataloader())
    assert all(torch.equal(a[0], b[0]) for a, b in zip(val, again))  # fixed order, independent of the seed


def test_yaml_switch_to_openwebtext_is_one_line():
    from jsonargparse import ArgumentParser

    p = ArgumentParser()
    p.add_class_arguments(TokenStreamDataModule, "data")
    cfg = p.parse_string("data:\n  seq_len: 1024\n  batch_size: 8\n  seed: 0\n  source: hub\n")
    assert cfg.data.source == "hub" and cfg.data.path is None and cfg.data.num_workers == 0
    assert "embedded corpus" in p.format_help()  # docstrings reach the CLI help


class Recorder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(x.clone())
        return self.w * x.float().mean()

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(tmp_path, num_workers, max_steps, ckpt_path=None, callbacks=()):
    dm = TokenStreamDataModule(seq_len=16, batch_size=2, seed=3, num_workers=num_workers, shuffle_buffer=8)
    model = Recorder()
    trainer = L.Trainer(
        max_steps=max_steps,
        val_check_interval=4,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model.seen


# The resumed fits leave the checkpoint callbacks out on purpose (they would write over the checkpoints
# resumed from); Lightning reminds of them.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create the checkpoint")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightning_resume_continues_with_the_next_batch(tmp_path, num_workers):
    ckpts = [
        ModelCheckpoint(dirpath=tmp_path / "s", every_n_train_steps=3, save_top_k=-1),  # saved on_train_batch_end
        ModelCheckpoint(dirpath=tmp_path / "v", filename="{step}", save_top_k=-1),  # saved after validation
    ]
    full = fit(tmp_path, num_workers, 10, callbacks=ckpts)
    assert len(full) == 10
    for ckpt, done in ((tmp_path / "s" / "epoch=0-step=3.ckpt", 3), (tmp_path / "v" / "step=8.ckpt", 8)):
        assert ckpt.exists(), glob.glob(str(tmp_path / "*" / "*"))
        resumed = fit(tmp_path, num_workers, 10, ckpt_path=ckpt)
        assert len(resumed) == 10 - done
        assert all(torch.equal(a, b) for a, b in zip(resumed, full[done:]))


def test_model_on_before_batch_transfer_still_runs(tmp_path):
    # The data module counts consumed batches in on_before_batch_transfer; a model's own hook must still run.
    class Hooked(Recorder):
        calls = 0

        def on_before_batch_transfer(self, batch, dataloader_idx):
            Hooked.calls += 1
            return batch

    dm = TokenStreamDataModule(seq_len=16, batch_size=2, seed=3, shuffle_buffer=8)
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    with pytest.warns(UserWarning, match="overridden `on_before_batch_transfer` in both"):  # Lightning says so
        trainer.fit(Hooked(), datamodule=dm)
    assert Hooked.calls == 3


def test_one_text_file_names_sample_by_as_the_fix(tmp_path):
    """One .txt file is one document: no per-document hold-out can pick it at val_fraction 0.0005,
    so the error says how to cut it into documents; with sample_by: paragraph it works."""
    from loopnet.data import DataConfigError

    text = "\n\n".join(f"Paragraph {i}: " + "words and more words " * 30 for i in range(400))
    (tmp_path / "notes.txt").write_text(text)
    kw = dict(seq_len=32, batch_size=2, source="files", path=str(tmp_path / "notes.txt"))
    with pytest.raises(
        DataConfigError,
        match="this corpus is 1 document.*Fix: cut the files into documents with data.sample_by: paragraph",
    ):
        TokenStreamDataModule(**kw).val_windows()
    windows = TokenStreamDataModule(**kw, sample_by="paragraph", val_fraction=0.05).val_windows()
    assert windows.shape[0] > 0
