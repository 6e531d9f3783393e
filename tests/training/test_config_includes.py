"""A config that includes another (`config: base.yaml`) keeps every value of the included file that it
does not set itself. jsonargparse replaces a whole nested section (`model:`) of an included file when the
including file has a section of the same name, so the shipped configs set their values as dotted keys
(`model.config.residual: deeploop`); this test reads each one as the early checks read it (the parser
LightningCLI's is held equal to in test_precheck) and compares leaf by leaf."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loopnet.training.precheck import precheck

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
INCLUDING = sorted(p for p in CONFIGS.glob("*.yaml") if "config" in (yaml.safe_load(p.read_text()) or {}))


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """Dotted key -> value for every leaf of a YAML mapping; dotted keys in the file count as paths."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{name}."))
        else:
            out[name] = value
    return out


def lookup(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return list(node) if isinstance(node, tuple) else node  # a typed tuple (betas) read from a YAML list


def test_the_shipped_configs_include_base():
    assert len(INCLUDING) >= 8, INCLUDING


@pytest.mark.parametrize("path", INCLUDING, ids=lambda p: p.name)
def test_an_including_config_keeps_the_included_values(path):
    own = yaml.safe_load(path.read_text())
    base = leaves(yaml.safe_load((path.parent / own.pop("config")).read_text()))
    own = leaves(own)
    cfg = precheck(["fit", "--config", str(path)])
    kept = {key: value for key, value in base.items() if key not in own and key != "config"}
    assert kept, path
    for key, value in kept.items():
        assert lookup(cfg, key) == value, f"{path.name}: {key} is {lookup(cfg, key)!r}, base.yaml says {value!r}"
    for key, value in own.items():
        assert lookup(cfg, key) == value, f"{path.name}: {key}"
