"""An imported model's own tokenizer (tokenizer.json) as loopnet's tokenizer and as the data module's ids."""

import pickle
from pathlib import Path

import numpy as np
import pytest

from loopnet.data.datamodule import TokenStreamDataModule
from loopnet.data.errors import DataConfigError
from loopnet.formats.tokenizer import HFTokenizer

FIXTURE = Path(__file__).parents[1] / "fixtures" / "huginn"
TEXT = "ROMEO: But soft, what light <|end_text|> through yonder window — breaks?"


def test_the_tokenizer_reads_the_folder_and_round_trips_text():
    tok = HFTokenizer(FIXTURE)
    eos = tok._tok.token_to_id("<|end_text|>")  # tokenizer_config.json's eos_token
    assert tok.eot_token == eos and tok.n_vocab == 259
    ids = tok.encode_ordinary(TEXT)
    assert eos not in ids and tok.decode(ids) == TEXT  # special tokens' text is ordinary text here
    assert eos in tok.encode(TEXT)  # and a special token in `encode`
    assert tok.document("ab").tolist() == [*tok.encode_ordinary("ab"), eos]
    again = pickle.loads(pickle.dumps(tok))  # data-loader workers receive it pickled
    assert again.encode_ordinary(TEXT) == ids and again.eot_token == eos


def test_a_folder_without_a_tokenizer_is_refused(tmp_path):
    with pytest.raises(DataConfigError, match="no tokenizer.json; fix: "):
        HFTokenizer(tmp_path)


def test_the_data_module_packs_the_tokenizers_ids():
    dm = TokenStreamDataModule(seq_len=16, batch_size=2, vocab="tokenizer", tokenizer=str(FIXTURE))
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 16) and int(x.max()) < dm.vocab_size == 259
    assert np.array_equal(x[:, 1:], y[:, :-1])
    assert dm.decode(dm.encode("to be, or not")) == "to be, or not"


@pytest.mark.parametrize("args", [{"vocab": "tokenizer"}, {"tokenizer": str(FIXTURE)}])
def test_vocab_tokenizer_and_its_path_go_together(args):
    with pytest.raises(DataConfigError, match="go together"):
        TokenStreamDataModule(seq_len=16, batch_size=2, **args)
