"""A graph partitioned over W ranks: who owns which node, which edges each rank aggregates,
and the halo each rank must receive. Pure numpy, no processes.

Setting (full-graph data parallelism by node ownership, as DistDGL, Zheng et al.,
arXiv:2010.05337, and CAGNET / DistGNN partition a graph): every node is owned by one rank,
which holds its input features and computes its output row. Rank r aggregates the in-edges
of its own (destination) nodes; a source node owned by another rank o is a *halo* node of
r: its feature row must come from o before r can aggregate. The halo is exchanged by one
``all_to_all_single`` with uneven splits. The partition is static, so every rank knows
every split from the plan (no count exchange, unlike a MoE dispatch whose routing changes
per step).

Partitioners (``PARTITIONERS``):

- ``random``: a seeded permutation of the nodes cut into W blocks of near-equal size (the
  first N mod W ranks one node more, as ``numpy.array_split``): balanced node counts, an
  expected cut of (1 - 1/W) of the edges;
- ``metis``: METIS k-way (Karypis & Kumar, SIAM J. Sci. Comput. 20(1), 1998) through
  ``pymetis`` on the symmetrised simple graph (directions merged, self-loops and duplicate
  edges dropped): node counts balanced within METIS' default 3% imbalance, fewer cut edges.
  Nothing balances the *edges* per rank: a hub-heavy graph can leave one rank with most
  in-edges, which the plan reports (``skew_share``).

Local layout of rank r (what ``gnn_partition_layer`` and the predicted trace use): its own
nodes in ascending global id, then its halo nodes grouped by owner rank ascending, each group
in ascending global id (the order ``all_to_all_single`` delivers them). A rank's local graph
is square over those ``local_nodes`` rows; only its own nodes receive edges.

Bytes: a halo row is ``feature_width`` elements of ``dtype`` (the exchanged features: the
layer's input features). ``halo_send_bytes[s, d]`` = rows rank s sends to rank d times the
row bytes; its diagonal is zero (own rows are never sent). ``balanced`` holds the same totals
spread evenly over the ranks, so a caller predicting both can say how much of a step is skew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.families.descriptor import DTYPE_BYTES

PARTITIONERS = ("random", "metis")
METIS_INSTALL = "pip install pymetis"


@dataclass(frozen=True, eq=False)
class PartitionLoads:
    """Per-rank quantities of one step, each a [W] float array."""

    nodes: np.ndarray  # owned (destination) nodes
    edges: np.ndarray  # in-edges aggregated (edges whose destination the rank owns)
    halo_rows: np.ndarray  # remote source rows received
    send_bytes: np.ndarray  # halo bytes sent to other ranks
    recv_bytes: np.ndarray  # halo bytes received from other ranks


@dataclass(frozen=True, eq=False)
class PartitionPlan:
    """A graph of ``num_nodes`` nodes and ``num_edges`` edges on ``world_size`` ranks."""

    world_size: int  # W
    partitioner: str  # random | metis
    num_nodes: int  # N
    num_edges: int  # E
    feature_width: int  # elements per exchanged row
    dtype: str
    row_bytes: int  # feature_width x element bytes
    owner: np.ndarray  # [N] rank owning each node
    local_index: np.ndarray  # [N] index of each node among its owner's own nodes
    own_nodes: tuple[np.ndarray, ...]  # per rank: owned node ids, ascending
    halo: tuple[tuple[np.ndarray, ...], ...]  # halo[r][o]: node ids rank r needs from rank o (ascending; [] for o == r)
    rank_edge_ids: tuple[np.ndarray, ...]  # per rank: ids (columns of edge_index) of its in-edges, in edge order
    halo_send_rows: np.ndarray  # [W, W] rows rank s sends to rank d (= len(halo[d][s]))
    halo_send_bytes: np.ndarray  # [W, W] halo_send_rows x row_bytes
    edge_cut: int  # edges whose source and destination have different owners
    actual: PartitionLoads
    balanced: PartitionLoads  # the same totals spread evenly over the ranks

    @property
    def rank_edges(self) -> np.ndarray:
        return self.actual.edges

    @property
    def rank_nodes(self) -> np.ndarray:
        return self.actual.nodes

    @property
    def edge_cut_share(self) -> float:
        return self.edge_cut / self.num_edges if self.num_edges else 0.0

    @property
    def skew_share(self) -> float:
        """Share of the busiest rank's aggregated edges beyond a perfectly balanced split
        (0 balanced; 1 - 1/W when one rank aggregates every edge)."""
        busiest = float(self.actual.edges.max())
        return 1.0 - float(self.balanced.edges.max()) / busiest if busiest > 0 else 0.0

    def local_nodes(self, rank: int) -> np.ndarray:
        """Global ids of rank ``rank``'s local rows: own nodes, then halo nodes by owner."""
        return np.concatenate([self.own_nodes[rank], *self.halo[rank]]).astype(np.int64)

    def local_edge_index(self, edge_index: Any, rank: int) -> np.ndarray:
        """[2, E_r] rank ``rank``'s in-edges in local row indices (``local_nodes`` order)."""
        ei = _as_numpy(edge_index)
        ids = self.rank_edge_ids[rank]
        nodes = self.local_nodes(rank)
        lookup = np.full(self.num_nodes, -1, dtype=np.int64)
        lookup[nodes] = np.arange(nodes.size)
        return np.stack([lookup[ei[0, ids]], lookup[ei[1, ids]]])

    def send_index(self, rank: int) -> np.ndarray:
        """Local (own-node) indices of the rows rank ``rank`` sends, grouped by destination
        rank ascending: the send buffer of the halo ``all_to_all_single``."""
        parts = [self.local_index[self.halo[d][rank]] for d in range(self.world_size) if d != rank]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (no per-node arrays)."""
        return {"world_size": self.world_size, "partitioner": self.partitioner, "num_nodes": self.num_nodes,
                "num_edges": self.num_edges, "edge_cut": self.edge_cut, "edge_cut_share": round(self.edge_cut_share, 4),
                "rank_nodes": self.actual.nodes.astype(int).tolist(), "rank_edges": self.actual.edges.astype(int).tolist(),
                "halo_rows": self.actual.halo_rows.astype(int).tolist(),
                "halo_send_bytes": self.halo_send_bytes.astype(int).tolist(), "skew_share": round(self.skew_share, 4)}


def _as_numpy(edge_index: Any) -> np.ndarray:
    return edge_index.numpy() if hasattr(edge_index, "numpy") else np.asarray(edge_index)


def check_partitioner(partitioner: object) -> str:
    if partitioner not in PARTITIONERS:
        raise ValueError(f"partition.partitioner must be one of {list(PARTITIONERS)}, got {partitioner!r}")
    return str(partitioner)


def check_partition_world_size(world_size: object, num_nodes: int) -> int:
    if (not isinstance(world_size, (int, np.integer)) or isinstance(world_size, bool)
            or not 1 <= world_size <= num_nodes):
        raise ValueError(f"partition.world_size must be an integer in [1, num_nodes={num_nodes}], got {world_size!r}")
    return int(world_size)


def check_feature_width(feature_width: object, field: str = "partition.feature_width") -> int:
    if not isinstance(feature_width, (int, np.integer)) or isinstance(feature_width, bool) or feature_width < 1:
        raise ValueError(f"{field} must be a positive integer (>= 1), got {feature_width!r}")
    return int(feature_width)


def random_owner(num_nodes: int, world_size: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """[N] owner ranks: a seeded permutation cut into W near-equal blocks."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    sizes = np.full(world_size, num_nodes // world_size, dtype=np.int64)
    sizes[: num_nodes % world_size] += 1
    owner = np.empty(num_nodes, dtype=np.int64)
    owner[rng.permutation(num_nodes)] = np.repeat(np.arange(world_size), sizes)
    return owner


def symmetric_csr(edge_index: Any, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(xadj, adjncy) of the simple undirected graph under ``edge_index`` (METIS' input)."""
    ei = _as_numpy(edge_index).astype(np.int64)
    src, dst = np.concatenate([ei[0], ei[1]]), np.concatenate([ei[1], ei[0]])
    keep = src != dst
    code = np.unique(src[keep] * np.int64(num_nodes) + dst[keep])  # sorted by (src, dst), deduplicated
    rows, cols = code // num_nodes, code % num_nodes
    xadj = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=num_nodes))]).astype(np.int64)
    return xadj, cols.astype(np.int64)


def metis_owner(edge_index: Any, num_nodes: int, world_size: int, seed: int = 0) -> np.ndarray:
    """[N] owner ranks from METIS k-way on the symmetrised graph (``pymetis``)."""
    try:
        import pymetis  # noqa: PLC0415 (optional at import time of this module)
    except ImportError as err:
        raise ImportError(f"partition.partitioner='metis' needs pymetis, which is not importable here ({err}); "
                          f"install it with `{METIS_INSTALL}`") from None
    if world_size == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    xadj, adjncy = symmetric_csr(edge_index, num_nodes)
    options = pymetis.Options(seed=int(seed))
    _, parts = pymetis.part_graph(world_size, pymetis.CSRAdjacency(xadj, adjncy), options=options)
    return np.asarray(parts, dtype=np.int64)


def plan_graph_partition(edge_index: Any, num_nodes: int, *, world_size: int, partitioner: str = "random",
                         feature_width: int, dtype: str = "float32", seed: int = 0,
                         owner: np.ndarray | None = None) -> PartitionPlan:
    """Partition the graph ``edge_index`` ([2, E], row 0 source, row 1 destination) of
    ``num_nodes`` nodes over ``world_size`` ranks; ``owner`` ([N] ranks) overrides the
    partitioner with a given assignment (hand cases, other partitioners)."""
    partitioner = check_partitioner(partitioner)
    if not isinstance(num_nodes, (int, np.integer)) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ValueError(f"gnn.num_nodes must be a positive integer (>= 1), got {num_nodes!r}")
    N = int(num_nodes)
    W = check_partition_world_size(world_size, N)
    width = check_feature_width(feature_width)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    ei = _as_numpy(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
        raise ValueError(f"edge_index must be an integer array of shape [2, E], got {ei.dtype} {list(ei.shape)}")
    if ei.size and (ei.min() < 0 or ei.max() >= N):
        raise ValueError(f"edge_index values must be in [0, num_nodes={N}), got values in [{ei.min()}, {ei.max()}]")
    src, dst = ei[0].astype(np.int64), ei[1].astype(np.int64)
    E = int(src.size)

    if owner is None:
        owner = random_owner(N, W, seed) if partitioner == "random" else metis_owner(ei, N, W, seed)
    owner = np.asarray(owner, dtype=np.int64)
    if owner.shape != (N,) or (owner.size and (owner.min() < 0 or owner.max() >= W)):
        raise ValueError(f"owner must hold num_nodes={N} ranks in [0, {W}), got shape {owner.shape}")

    own_nodes = tuple(np.flatnonzero(owner == r).astype(np.int64) for r in range(W))
    local_index = np.empty(N, dtype=np.int64)
    for nodes in own_nodes:
        local_index[nodes] = np.arange(nodes.size)
    dst_rank, src_rank = owner[dst], owner[src]
    rank_edge_ids = tuple(np.flatnonzero(dst_rank == r).astype(np.int64) for r in range(W))

    # halo[r][o]: distinct sources owned by o != r of edges into r's nodes (one pass over E)
    remote = src_rank != dst_rank
    pairs = np.unique(dst_rank[remote] * np.int64(N) + src[remote])  # sorted by (rank, node)
    need_rank, need_node = pairs // N, pairs % N
    need_owner = owner[need_node]
    empty = np.zeros(0, dtype=np.int64)
    halo = tuple(tuple(need_node[(need_rank == r) & (need_owner == o)] if o != r else empty for o in range(W))
                 for r in range(W))
    send_rows = np.bincount(need_owner * W + need_rank, minlength=W * W).reshape(W, W)
    row_bytes = width * DTYPE_BYTES[dtype]
    send_bytes = send_rows * row_bytes

    actual = PartitionLoads(
        nodes=np.array([n.size for n in own_nodes], dtype=np.float64),
        edges=np.array([ids.size for ids in rank_edge_ids], dtype=np.float64),
        halo_rows=send_rows.sum(axis=0).astype(np.float64),
        send_bytes=send_bytes.sum(axis=1).astype(np.float64),
        recv_bytes=send_bytes.sum(axis=0).astype(np.float64),
    )
    balanced = PartitionLoads(**{f: np.full(W, getattr(actual, f).mean()) for f in
                                 ("nodes", "edges", "halo_rows", "send_bytes", "recv_bytes")})
    return PartitionPlan(
        world_size=W, partitioner=partitioner, num_nodes=N, num_edges=E, feature_width=width, dtype=dtype,
        row_bytes=row_bytes, owner=owner, local_index=local_index, own_nodes=own_nodes, halo=halo,
        rank_edge_ids=rank_edge_ids, halo_send_rows=send_rows, halo_send_bytes=send_bytes,
        edge_cut=int(remote.sum()), actual=actual, balanced=balanced,
    )


def balanced_send_bytes(plan: PartitionPlan) -> np.ndarray:
    """[W, W] the plan's off-rank halo bytes spread evenly over every ordered pair of
    different ranks (zero diagonal): the halo exchange of a perfectly balanced partition."""
    W = plan.world_size
    if W == 1:
        return np.zeros((1, 1))
    off = 1 - np.eye(W)
    return off * float(plan.halo_send_bytes.sum()) / (W * (W - 1))
