"""The FSDP configuration: configs/fsdp.yaml, which docs/scaling-out.md shows verbatim and tests/reliability/test_fsdp.py
runs (on CPU), parses with the real CLI and builds the documented strategy: SHARD_GRAD_OP, one FSDP unit and
one activation checkpoint per Block, sharded checkpoints."""

import re
from typing import Union

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from loopnet.model.layers import Block

from .fsdp_cpu import FSDP_YAML
from .helpers import ROOT, loopnet

pytestmark = pytest.mark.slow


def test_the_scaling_out_page_shows_configs_fsdp_yaml():
    page = (ROOT / "docs/scaling-out.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "FSDPStrategy" in b]
    assert block == FSDP_YAML.read_text()


def test_fsdp_config_parses_and_builds_the_strategy(tmp_path):
    res = loopnet(
        "fit",
        "--config",
        str(ROOT / "configs/deeploop_r6.yaml"),
        "--config",
        str(FSDP_YAML),
        "--print_config",
        cwd=tmp_path,
    )
    assert res.code == 0, res.err[-3000:]
    trainer = yaml.safe_load(res.out)["trainer"]
    assert trainer["devices"] == 8 and trainer["num_nodes"] == 2

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=Union[str, Strategy])
    strategy = parser.instantiate(parser.parse_object({"strategy": trainer["strategy"]})).strategy
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert strategy._state_dict_type == "sharded"
    for policy in (strategy.kwargs["auto_wrap_policy"], strategy._activation_checkpointing_kwargs["auto_wrap_policy"]):
        assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {Block}
