"""Which images a Simulation may run, and which solvers each of them may run: the cluster
admin's allowlist as data, shared by admission (`rankpack.operator.admission`, when a
Simulation arrives) and the launch check (`rankpack.controller.launching`, the case's own
``application``).

An image prefix matches itself, or an image that continues it after ``/``, ``:`` or ``@``
(so ``registry.example/cfd`` allows ``registry.example/cfd/foam:12`` and
``registry.example/cfd:12``, never ``registry.example/cfd-other/foam``); a prefix that ends
with one of them matches whatever follows it. The admin may name the solvers an image
prefix may run (``--allow-image PREFIX=SOLVER,...``): an image under it runs only those
(the longest matching prefix decides); an image under no such prefix runs the default list
(the operator's own image's OpenFOAM applications and ``--solver`` names).
"""

from __future__ import annotations

from collections.abc import Iterable

ImageSolvers = tuple[tuple[str, frozenset[str]], ...]
"""Image prefix -> the solvers images under it may run (the admin's ``PREFIX=SOLVER,...``)."""


def _matches(image: str, prefix: str) -> bool:
    return bool(prefix) and (image == prefix or (image.startswith(prefix) and (
        prefix[-1] in "/:@" or image[len(prefix)] in "/:@")))  # fmt: skip


def image_allowed(image: str, prefixes: Iterable[str]) -> bool:
    """``image`` lies under one of ``prefixes`` (see the module doc)."""
    return any(_matches(image, p) for p in prefixes)


def solvers_for(
    image: str | None, default: frozenset[str], image_solvers: ImageSolvers = ()
) -> frozenset[str]:
    """The solvers ``image`` may run: those of the longest prefix it lies under that names
    its own, else ``default`` (None: the operator's own image)."""
    if image is None:
        return default
    named = [(p, s) for p, s in image_solvers if _matches(image, p)]
    return max(named, key=lambda ps: len(ps[0]))[1] if named else default
