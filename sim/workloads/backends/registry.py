"""A registry of layer backends by name: the one place a config's backend string is resolved.

Iterating a registry yields the registered names in registration order, so it stands in for
a tuple of allowed values (``backend in MOE_BACKENDS``, ``list(GNN_BACKENDS)``,
``pytest.mark.parametrize("backend", MOE_BACKENDS)``), and always lists what is registered
now. ``lookup`` turns a name into its backend object, or raises a ValueError that names the
config field and every registered backend.
"""

from __future__ import annotations

from typing import Generic, Iterator, Protocol, TypeVar


class NamedBackend(Protocol):
    name: str


B = TypeVar("B", bound=NamedBackend)


class BackendRegistry(Generic[B]):
    """The backends of one layer kind, by name; ``field`` is the config key that names one
    (e.g. ``moe.backend``) and ``where`` the module that registers them."""

    def __init__(self, *, field: str, where: str) -> None:
        self.field = field
        self.where = where
        self._backends: dict[str, B] = {}

    def register(self, backend: B) -> B:
        """Add ``backend`` under ``backend.name`` (a new, non-empty string); returns it."""
        name = getattr(backend, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.field} backend needs a non-empty string name, got {name!r}")
        if name in self._backends:
            raise ValueError(f"{self.field} backend {name!r} is already registered ({type(self._backends[name]).__name__})")
        self._backends[name] = backend
        return backend

    def lookup(self, name: str) -> B:
        """The backend registered as ``name``, or a ValueError naming the field and the choices."""
        backend = self._backends.get(name) if isinstance(name, str) else None
        if backend is None:
            raise ValueError(f"{self.field} must be one of {list(self._backends)} (the backends registered in "
                             f"{self.where}), got {name!r}")
        return backend

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._backends))

    def __contains__(self, name: object) -> bool:
        return name in self._backends

    def __len__(self) -> int:
        return len(self._backends)

    def __repr__(self) -> str:
        return f"BackendRegistry({self.field}: {', '.join(self._backends)})"
