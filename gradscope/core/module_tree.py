"""The model's module tree as plain data, and the choice of which layers to watch.

A layer is a module of ``named_modules()``, named by its dotted path (``""`` is the root)
as the user wrote it: wrappers inside the model (FSDP1, checkpoint_wrapper) are looked
through (see :func:`gradscope.core.wrappers.named_layers`).
The tree is plain Python so that the GUI can wrap it in a Qt item model and a recording can
store it without a model at hand.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from torch import nn

from gradscope.core.errors import GradScopeError
from gradscope.core.sharded import full_numel
from gradscope.core.wrappers import named_layers


@dataclass(eq=False)
class ModuleNode:
    name: str
    type_name: str
    own_params: int
    total_params: int
    parent: ModuleNode | None = field(default=None, repr=False)
    children: list[ModuleNode] = field(default_factory=list, repr=False)

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1] if self.name else "(model)"

    def walk(self) -> Iterator[ModuleNode]:
        """This node and every descendant, depth first in registration order."""
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(eq=False)
class ModuleTree:
    root: ModuleNode
    nodes: dict[str, ModuleNode]

    def __iter__(self) -> Iterator[ModuleNode]:
        return self.root.walk()

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, name: str) -> ModuleNode:
        return self.nodes[name]

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, str, int, int]]) -> ModuleTree:
        """Rebuild from ``(name, type, own_params, total_params)`` rows in depth-first order
        (what a recording stores), without a model."""
        nodes: dict[str, ModuleNode] = {}
        root: ModuleNode | None = None
        for name, type_name, own, total in rows:
            node = ModuleNode(name, type_name, int(own), int(total))
            if root is None:
                root = node
            else:
                parent = nodes.get(_parent_name(name, nodes), root)
                node.parent = parent
                parent.children.append(node)
            nodes[name] = node
        if root is None:
            raise ValueError("a module tree needs at least the root")
        return cls(root, nodes)

    def rows(self) -> list[tuple[str, str, int, int]]:
        return [(n.name, n.type_name, n.own_params, n.total_params) for n in self]


def _parent_name(name: str, known: dict[str, ModuleNode]) -> str:
    # Walk up the dotted path: with remove_duplicate a module may sit under an ancestor
    # that is not its immediate dotted parent.
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:cut])
        if candidate in known:
            return candidate
    return ""


def build_module_tree(model: nn.Module) -> ModuleTree:
    nodes: dict[str, ModuleNode] = {}
    root: ModuleNode | None = None
    for name, module in named_layers(model).items():
        own = sum(full_numel(p) for p in module.parameters(recurse=False))
        total = sum(full_numel(p) for p in module.parameters())
        node = ModuleNode(name, type(module).__name__, own, total)
        if root is None:
            root = node
        else:
            parent = nodes[_parent_name(name, nodes)]
            node.parent = parent
            parent.children.append(node)
        nodes[name] = node
    assert root is not None
    return ModuleTree(root, nodes)


def parameterised_layers(model: nn.Module) -> list[str]:
    """The default watch: every module that owns parameters, in registration order. Frozen
    ones are included (a fine-tuning run unfreezes them later, and a stable set of layers
    keeps histories and recordings the same width)."""
    return [
        name
        for name, module in named_layers(model).items()
        if next(module.parameters(recurse=False), None) is not None
    ]


def select_layers(model: nn.Module, patterns: Iterable[str] | None) -> list[str]:
    """Resolve names or glob patterns (``layer1.*``, ``*.conv1``) to module names, in
    registration order. A pattern that matches nothing is an error, so a typo is not a
    silently empty watch. Selected modules that own no parameters are watched over their
    subtree's parameters (see GradientWatch)."""
    if patterns is None:
        return parameterised_layers(model)
    patterns = list(patterns)
    modules = named_layers(model)
    names = list(modules)
    chosen: set[str] = set()
    for pattern in patterns:
        matched = [n for n in names if n == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            close = [n for n in names if n and pattern.strip("*.") in n][:5]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise GradScopeError(f"no layer matches {pattern!r}{hint}")
        chosen.update(matched)
    selected = [n for n in names if n in chosen and next(modules[n].parameters(), None) is not None]
    if not selected:
        raise GradScopeError(
            f"layers={patterns!r} match only modules without parameters "
            f"({', '.join(sorted(chosen)[:5])}); pick modules that own weights"
        )
    return selected
