"""examples/parsl_config_swap.py: the Bursar config is the LocalProvider config with only
the provider block swapped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from parsl.providers import LocalProvider

from bursar.providers.parsl import BursarProvider

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "parsl_config_swap.py"


def test_only_the_provider_block_differs() -> None:
    spec = importlib.util.spec_from_file_location("parsl_config_swap", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    local = mod.local_config("run")
    bursar = mod.bursar_config("run", "127.0.0.1:1", "sci", "token")

    def without_provider(obj: object) -> dict[str, object]:
        # The settings the user wrote (plain values); the provider and Parsl's internals
        # (underscored, some derived from the provider's cores) aside.
        plain = (int, float, str, bool, type(None), list, tuple, set)
        return {
            k: v
            for k, v in vars(obj).items()
            if not k.startswith("_") and k != "provider" and isinstance(v, plain)
        }

    (lx,), (bx,) = local.executors, bursar.executors
    assert isinstance(lx.provider, LocalProvider) and isinstance(bx.provider, BursarProvider)
    assert without_provider(lx) == without_provider(bx)
    assert without_provider(local) == without_provider(bursar)
    for knob in ("init_blocks", "min_blocks", "max_blocks", "nodes_per_block"):
        assert getattr(lx.provider, knob) == getattr(bx.provider, knob)
