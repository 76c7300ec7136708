"""Graph generators and degree statistics: pure, seeded, vectorised, O(E) memory.

Every generator takes (num_nodes, num_edges, keyword options, seed) and returns a
``[2, E]`` int64 ``torch`` edge index (row 0 source, row 1 destination, as PyG's
``edge_index``), never building an N x N intermediate:

- ``erdos_renyi``: E edges with uniform endpoints (the G(n, m) model, with multi-edges
  unless deduplicated);
- ``barabasi_albert``: preferential attachment, m = E/N edges per new node, by the
  Batagelj-Brandes edge-list method (Phys. Rev. E 71, 036113, 2005) with its sequential
  pointer resolved by vectorised pointer jumping;
- ``rmat``: recursive matrix (Chakrabarti, Zhan & Faloutsos, SDM 2004) with Graph500's
  (a, b, c, d) quadrant probabilities, one vectorised draw per level;
- ``sbm``: stochastic block model with E edges: block pairs drawn with weight
  p_ij * n_i * n_j, endpoints uniform inside the blocks;
- ``chung_lu``: expected degree w_i ~ (i+1)^(-1/(gamma-1)) (power law with exponent
  gamma, Chung & Lu 2002), endpoints drawn independently ~ w.

``finalize`` applies the common options: undirected (add reversed edges), self-loop
removal, deduplication.
"""

from __future__ import annotations

import numpy as np
import torch

from sim.workloads.routing import gini


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"graph.{name} must be a positive integer (>= 1), got {value!r}")


#: the options every generator passes to ``finalize`` (config ``graph.options``)
GRAPH_OPTIONS = ("undirected", "remove_self_loops", "dedup")


def check_graph_options(options: object) -> dict[str, bool]:
    """``graph.options``: a mapping of some of GRAPH_OPTIONS to true/false."""
    if options is None:
        return {}
    if not hasattr(options, "items"):
        raise ValueError(f"graph.options must be a mapping of {list(GRAPH_OPTIONS)} to true/false, got {options!r}")
    out = {}
    for key, value in options.items():
        if key not in GRAPH_OPTIONS:
            raise ValueError(f"graph.options: unknown option {key!r}; allowed: {list(GRAPH_OPTIONS)}")
        if not isinstance(value, bool):
            raise ValueError(f"graph.options.{key} must be true or false, got {value!r}")
        out[key] = value
    return out


def finalize(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    *,
    undirected: bool = False,
    remove_self_loops: bool = False,
    dedup: bool = False,
) -> torch.Tensor:
    """Apply the common options and return a [2, E] int64 edge index."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if undirected:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if remove_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if dedup:
        code = np.unique(src * np.int64(num_nodes) + dst)  # sorted by (src, dst)
        src, dst = code // num_nodes, code % num_nodes
    return torch.from_numpy(np.stack([src, dst]))


def erdos_renyi(num_nodes: int, num_edges: int, *, seed: int | np.random.Generator = 0, **options: bool) -> torch.Tensor:
    _check_positive(num_nodes=num_nodes, num_edges=num_edges)
    rng = _rng(seed)
    return finalize(rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges), num_nodes, **options)


def barabasi_albert(
    num_nodes: int, num_edges: int, *, seed: int | np.random.Generator = 0, **options: bool
) -> torch.Tensor:
    """Preferential attachment: each node links to m = round(E / N) earlier endpoints
    (so the graph has N * m edges)."""
    _check_positive(num_nodes=num_nodes, num_edges=num_edges)
    rng = _rng(seed)
    m = max(1, int(round(num_edges / num_nodes)))
    total = num_nodes * m
    j = np.arange(total, dtype=np.int64)
    # slot 2j holds the new node j // m; slot 2j+1 copies a uniformly chosen earlier slot
    pointer = (rng.random(total) * (2 * j + 1)).astype(np.int64)  # uniform in [0, 2j]
    target = pointer.copy()
    odd = target % 2 == 1
    while odd.any():  # resolve chains of odd slots: each jump goes strictly backwards
        target[odd] = pointer[(target[odd] - 1) // 2]
        odd = target % 2 == 1
    return finalize(j // m, (target // 2) // m, num_nodes, **options)


def rmat(
    num_nodes: int,
    num_edges: int,
    *,
    a: float = 0.57,
    b: float | None = 0.19,
    c: float | None = 0.19,
    d: float | None = 0.05,
    seed: int | np.random.Generator = 0,
    permute: bool = True,
    **options: bool,
) -> torch.Tensor:
    """R-MAT edges; ids at scale ceil(log2 N) are mapped onto [0, N) by id * N >> scale.

    Defaults are Graph500's (0.57, 0.19, 0.19, 0.05); a = b = c = d = 0.25 is uniform.
    With b, c and d all None they split 1 - a equally: one knob from uniform (a = 0.25)
    to heavily skewed (a -> 1). ``permute`` relabels nodes randomly (as Graph500 does) so
    hubs are not all at low ids.
    """
    _check_positive(num_nodes=num_nodes, num_edges=num_edges)
    if b is None and c is None and d is None:
        b = c = d = (1.0 - a) / 3.0
    if b is None or c is None or d is None:
        raise ValueError("graph.b, graph.c and graph.d must all be given, or all be null (equal split of 1 - a)")
    probs = np.array([a, b, c, d], dtype=np.float64)
    if (probs < 0).any() or abs(probs.sum() - 1.0) > 1e-6:
        raise ValueError(f"graph.(a, b, c, d) must be >= 0 and sum to 1, got {tuple(probs)}")
    rng = _rng(seed)
    scale = max(1, int(np.ceil(np.log2(num_nodes))))
    src = np.zeros(num_edges, dtype=np.int64)
    dst = np.zeros(num_edges, dtype=np.int64)
    thresholds = np.cumsum(probs)[:3]
    for level in range(scale):
        quadrant = np.searchsorted(thresholds, rng.random(num_edges), side="right")
        bit = np.int64(1) << (scale - 1 - level)
        src += bit * (quadrant >= 2)  # quadrants c, d: lower half of rows
        dst += bit * (quadrant % 2 == 1)  # quadrants b, d: right half of columns
    if (1 << scale) != num_nodes:
        src = (src * num_nodes) >> scale
        dst = (dst * num_nodes) >> scale
    if permute:
        perm = rng.permutation(num_nodes)
        src, dst = perm[src], perm[dst]
    return finalize(src, dst, num_nodes, **options)


def sbm(
    num_nodes: int,
    num_edges: int,
    *,
    num_blocks: int = 4,
    p_in: float = 0.9,
    p_out: float = 0.1,
    seed: int | np.random.Generator = 0,
    **options: bool,
) -> torch.Tensor:
    """Stochastic block model, ``num_blocks`` near-equal blocks, ``num_edges`` edges;
    p_in / p_out weight pairs inside / across blocks."""
    _check_positive(num_nodes=num_nodes, num_edges=num_edges, num_blocks=num_blocks)
    if num_blocks > num_nodes:
        raise ValueError(f"graph.num_blocks must be in [1, num_nodes={num_nodes}], got {num_blocks}")
    if not (p_in >= 0 and p_out >= 0 and p_in + p_out > 0):
        raise ValueError(f"graph.p_in and graph.p_out must be >= 0 and not both 0, got {p_in}, {p_out}")
    rng = _rng(seed)
    sizes = np.full(num_blocks, num_nodes // num_blocks, dtype=np.int64)
    sizes[: num_nodes % num_blocks] += 1
    nb = sizes.size
    prob = np.where(np.eye(nb, dtype=bool), p_in, p_out) * np.outer(sizes, sizes)
    pair = rng.choice(nb * nb, size=num_edges, p=(prob / prob.sum()).ravel())
    bs, bd = pair // nb, pair % nb
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    src = starts[bs] + (rng.random(num_edges) * sizes[bs]).astype(np.int64)
    dst = starts[bd] + (rng.random(num_edges) * sizes[bd]).astype(np.int64)
    return finalize(src, dst, num_nodes, **options)


def chung_lu(
    num_nodes: int, num_edges: int, *, exponent: float = 2.5, seed: int | np.random.Generator = 0, **options: bool
) -> torch.Tensor:
    """Power-law expected degrees with tail exponent ``exponent`` (> 2)."""
    _check_positive(num_nodes=num_nodes, num_edges=num_edges)
    if not exponent > 2:
        raise ValueError(f"graph.exponent must be > 2 (finite mean degree), got {exponent!r}")
    rng = _rng(seed)
    w = np.arange(1, num_nodes + 1, dtype=np.float64) ** (-1.0 / (exponent - 1.0))
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    perm = rng.permutation(num_nodes)
    src = perm[np.searchsorted(cdf, rng.random(num_edges), side="right").clip(max=num_nodes - 1)]
    dst = perm[np.searchsorted(cdf, rng.random(num_edges), side="right").clip(max=num_nodes - 1)]
    return finalize(src, dst, num_nodes, **options)


def check_edge_index(edge_index: torch.Tensor, num_nodes: int) -> None:
    """Clear errors for an edge index of wrong type, shape or range, or an empty graph."""
    if not isinstance(edge_index, torch.Tensor):
        raise ValueError(f"edge_index must be a torch.Tensor, got {type(edge_index).__name__}")
    if edge_index.dtype != torch.int64:
        raise ValueError(f"edge_index must have dtype torch.int64, got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"gnn.num_nodes must be a positive integer, got {num_nodes!r}")
    if edge_index.shape[1] == 0:
        raise ValueError("edge_index is empty (E = 0): an empty graph has nothing to aggregate")
    lo, hi = int(edge_index.min()), int(edge_index.max())
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"edge_index values must be in [0, num_nodes={num_nodes}), got values in [{lo}, {hi}]")


def degree_stats(edge_index: torch.Tensor, num_nodes: int) -> dict[str, float]:
    """In-degree statistics (destinations, row 1): what scatter/aggregation skew depends on."""
    deg = np.bincount(edge_index[1].numpy(), minlength=num_nodes).astype(np.float64)
    out_deg = np.bincount(edge_index[0].numpy(), minlength=num_nodes).astype(np.float64)
    mean = deg.mean()
    return {
        "num_nodes": int(num_nodes),
        "num_edges": int(edge_index.shape[1]),
        "mean_degree": float(mean),
        "max_degree": float(deg.max()),
        "max_over_mean": float(deg.max() / mean) if mean > 0 else 0.0,
        "degree_cv": float(deg.std() / mean) if mean > 0 else 0.0,
        "degree_gini": gini(deg),
        "out_degree_cv": float(out_deg.std() / out_deg.mean()) if out_deg.mean() > 0 else 0.0,
    }
