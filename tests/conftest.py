import os

# The test session is offline: the hub and tiktoken's download address are never reached.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests plug their own callbacks (tests.reliability.helpers) into real runs: trusted code, so the
# session opts in (loopnet.training.trust); tests/training/test_trust.py unsets it to test the refusal.
os.environ["LOOPNET_TRUST_CONFIG"] = "1"


def pytest_runtest_teardown(item):
    """A test that calls a Trainer command in this process turns flush-to-zero on (`training/cli.flush_denormals`):
    off again after it, so that no later test's floats depend on the order the tests ran in."""
    import torch

    torch.set_flush_denormal(False)


def pytest_collection_modifyitems(config, items):
    """The modules with slow tests first, the others after them, each in collection order. Under
    `--dist loadfile --no-loadscope-reorder` (`make test`) the workers take modules in this order, so the
    long modules start early and the many short ones fill the end: the two workers finish together."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)
