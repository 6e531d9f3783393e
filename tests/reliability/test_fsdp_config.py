"""The FSDP configuration documented in the README (multi-GPU, multi-node) parses with the real CLI
and builds the documented strategy: FULL_SHARD, one FSDP unit and one activation checkpoint per
Block. It cannot run here (FSDP needs GPUs)."""

import re
from typing import Union

import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from loopnet.model.layers import Block

from .helpers import ROOT, loopnet


def readme_fsdp_yaml() -> str:
    readme = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "FSDPStrategy" in b]
    return block


def test_readme_fsdp_config_parses_and_builds_the_strategy(tmp_path):
    (tmp_path / "fsdp.yaml").write_text(readme_fsdp_yaml())
    res = loopnet("fit", "--config", str(ROOT / "configs/deeploop_r6.yaml"), "--config", "fsdp.yaml", "--print_config",
                  cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    trainer = yaml.safe_load(res.out)["trainer"]
    assert trainer["devices"] == 8 and trainer["num_nodes"] == 2

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=Union[str, Strategy])
    strategy = parser.instantiate(parser.parse_object({"strategy": trainer["strategy"]})).strategy
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    for policy in (strategy.kwargs["auto_wrap_policy"], strategy._activation_checkpointing_kwargs["auto_wrap_policy"]):
        assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {Block}
