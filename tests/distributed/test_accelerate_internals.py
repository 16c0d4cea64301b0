"""Private accelerate attributes are touched in distributed/accelerate_internals.py and nowhere else."""

import ast
from pathlib import Path

import pytest
from accelerate import Accelerator

from rloo.distributed import accelerate_internals

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "rloo"
ACCELERATE_OBJECTS = ("acc", "accelerator", "gradient_state", "AcceleratorState", "PartialState", "GradientState")


def private_accelerate_uses(text: str) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = ast.unparse(node.value)
            if any(part in ACCELERATE_OBJECTS for part in owner.replace("(", ".").replace(")", "").split(".")):
                uses.append(f"{owner}.{node.attr}")
    return uses


def test_the_checker_sees_a_private_call():
    assert private_accelerate_uses("acc.gradient_state._set_sync_gradients(True)") == [
        "acc.gradient_state._set_sync_gradients"]
    assert private_accelerate_uses("AcceleratorState._reset_state()") == ["AcceleratorState._reset_state"]
    assert private_accelerate_uses("self._signals.received") == []


def test_only_the_wrapper_touches_private_accelerate_attributes():
    found = {path.relative_to(PACKAGE).as_posix(): private_accelerate_uses(path.read_text())
             for path in PACKAGE.rglob("*.py")}
    elsewhere = {name: uses for name, uses in found.items() if uses and name != "distributed/accelerate_internals.py"}
    assert elsewhere == {}
    assert found["distributed/accelerate_internals.py"]  # the wrapper is where they are


@pytest.mark.parametrize("is_last", [False, True])
def test_mark_step_end_sets_accelerates_sync_flag(is_last):
    accelerator = Accelerator(cpu=True)
    accelerate_internals.mark_step_end(accelerator, is_last)
    assert accelerator.sync_gradients is is_last
    accelerate_internals.mark_step_end(accelerator, True)
