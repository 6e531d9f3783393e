import os

# The test session is offline: the hub and tiktoken's download address are never reached.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests plug their own callbacks (tests.reliability.helpers) into real runs: trusted code, so the
# session opts in (loopnet.training.trust); tests/training/test_trust.py unsets it to test the refusal.
os.environ["LOOPNET_TRUST_CONFIG"] = "1"


# `make test-quick` (pytest -m "not slow") runs what takes seconds; the modules below run real fits in
# subprocesses or many in-process fits (DDP, signals, resumes, the CLI end to end, the benchmark, the
# sweep, a TensorBoard server) and are `slow` as a whole; single slow tests elsewhere carry
# @pytest.mark.slow themselves. README, "Tests", says how long each half takes.
SLOW_MODULES = {
    "bench/test_bench.py", "data/test_ddp.py", "diagnostics/test_callback.py", "study/test_sweep_report.py",
    "reliability/test_bad_input.py", "reliability/test_ddp.py", "reliability/test_interrupt.py",
    "reliability/test_interrupt_validation.py", "reliability/test_leftovers.py", "reliability/test_output.py",
    "reliability/test_resume.py", "reliability/test_run_folders.py", "reliability/test_safe_loading.py",
    "reliability/test_fsdp_config.py", "training/test_cli.py", "training/test_startup.py",
    "reliability/test_signals.py", "reliability/test_torchrun.py", "reliability/test_fsdp.py",
    "reliability/test_crashes.py", "training/test_run_name.py", "diagnostics/test_screenshot.py",
    "reliability/test_gpu_check.py",
}


def pytest_collection_modifyitems(config, items):
    import pytest

    root = config.rootpath / "tests"
    for item in items:
        try:
            module = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_teardown(item):
    """A test that calls a Trainer command in this process turns flush-to-zero on (`training/cli.flush_denormals`):
    off again after it, so that no later test's floats depend on the order the tests ran in."""
    import torch

    torch.set_flush_denormal(False)
