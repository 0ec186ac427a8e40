"""Incremental valuation (Ray-free): what a valued pool keeps for the next valuation of a larger pool
(`valuation.npz`), and how a new pool's rows map onto it.

A row is reused where the same group's vector sits in the same stored block (blocks are immutable and named by
content-independent ids, so the same file is the same vector) and the target vector is the same: its beta, K_ii,
row statistics and, in Gram space, its row of K are the prior's. A prior's w, with zeros for the new rows, is the
warm start; its residual r~ = K~ w - beta~ (the normalised space: K~ = D^-1/2 K D^-1/2 with `normalize: cosine`) stays
exact on reused rows where no row that left (or changed) carried a score. The Euclidean metric only: the diagonal
Fisher metric is a mean over all rows, so adding rows changes every entry of K.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from convalue.engine.selection.blocked import BlockRows, GramResult

STATE_FILE = "valuation.npz"
FORMAT = 1


@dataclass(frozen=True, eq=False)
class ValuationState:
    """A valued pool as the next valuation reuses it: rows, where their vectors were stored, the target, the row
    statistics, the scores and the residual r~ at them. In gradient space r~_i is exact at u = u_refs[ref_i]
    (G~^T w at some point of the solve), which bounds r~_i at any later u by ||g~_i|| ||u - u_ref||; the last of
    u_refs is G~^T w itself."""

    order: list[str]
    files: list[str]  # the stored block holding each row's vector
    target: np.ndarray  # g_tar as valued (float64)
    metric: str
    normalize: str
    space: str
    gamma: float | None
    w: np.ndarray
    beta: np.ndarray
    diag: np.ndarray  # K_ii in the metric
    norm2: np.ndarray  # raw squared row norms
    cosine: np.ndarray  # the one-step cosine of each row with the target
    residual: np.ndarray
    ref: np.ndarray | None = None  # gradient space: the index into u_refs at which residual[i] is exact
    u_refs: np.ndarray | None = None  # gradient space: k x p
    rows_at: np.ndarray | None = None  # gradient space: rows of G kept (sorted positions) ...
    rows: np.ndarray | None = None  # ... and the rows themselves (raw, float32)

    def to_bytes(self) -> bytes:
        """The .npz bytes (no pickles)."""
        files, index = np.unique(np.array(self.files, dtype=object), return_inverse=True)  # a few per thousand rows
        arrays = {"format": np.array(FORMAT), "order": np.array(self.order, dtype=str),
                  "files": files.astype(str), "file_index": index.astype(np.int32), "target": self.target,
                  "settings": np.array([self.metric, self.normalize, self.space]),
                  "gamma": np.array(np.nan if self.gamma is None else self.gamma), "w": self.w, "beta": self.beta,
                  "diag": self.diag, "norm2": self.norm2, "cosine": self.cosine, "residual": self.residual}
        if self.u_refs is not None:
            arrays |= {"ref": self.ref, "u_refs": self.u_refs}
        if self.rows is not None:
            arrays |= {"rows_at": self.rows_at, "rows": self.rows}
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ValuationState:
        """The state of `to_bytes`; ValueError where the bytes are not one."""
        try:
            z = np.load(io.BytesIO(data), allow_pickle=False)
            if int(z["format"]) != FORMAT:
                raise ValueError(f"format {int(z['format'])}, expected {FORMAT}")
            metric, normalize, space = (str(s) for s in z["settings"])
            gamma = float(z["gamma"])
            files = [str(f) for f in z["files"]]
            state = cls(order=[str(s) for s in z["order"]], files=[files[i] for i in z["file_index"]],
                        target=z["target"], metric=metric, normalize=normalize, space=space,
                        gamma=None if np.isnan(gamma) else gamma, w=z["w"], beta=z["beta"], diag=z["diag"],
                        norm2=z["norm2"], cosine=z["cosine"], residual=z["residual"],
                        ref=z["ref"] if "ref" in z else None, u_refs=z["u_refs"] if "u_refs" in z else None,
                        rows_at=z["rows_at"] if "rows_at" in z else None, rows=z["rows"] if "rows" in z else None)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a valuation state ({exc})") from None
        n = len(state.order)
        if any(len(a) != n for a in (state.files, state.w, state.beta, state.diag, state.residual)):
            raise ValueError("not a valuation state (arrays of different lengths)")
        return state


@dataclass(frozen=True, eq=False)
class Reuse:
    """How a new pool's rows map onto a prior valuation: old[i] is new row i's row in the prior (-1: new)."""

    state: ValuationState
    old: np.ndarray
    residual_exact: bool  # the prior residual holds for the reused rows (no row that left carried a score)

    @property
    def new_rows(self) -> np.ndarray:
        """The rows to compute (positions in the new order)."""
        return np.flatnonzero(self.old < 0)

    @property
    def kept(self) -> np.ndarray:
        """The reused rows (positions in the new order)."""
        return np.flatnonzero(self.old >= 0)

    def w0(self) -> np.ndarray:
        """The warm start: the prior's scores on reused rows, zeros on new rows."""
        w = np.zeros(self.old.size)
        kept = self.kept
        w[kept] = self.state.w[self.old[kept]]
        return w

    def kept_rows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows the prior kept that this pool reuses: (sorted positions in the new order, raw float32 rows)."""
        if self.state.rows_at is None:
            return None
        where = np.full(len(self.state.order), -1, dtype=np.intp)
        kept = self.kept
        where[self.old[kept]] = kept
        at = where[self.state.rows_at]
        on = at >= 0
        order = np.argsort(at[on], kind="stable")
        return at[on][order], self.state.rows[on][order]

    def carried(self, name: str, fresh: np.ndarray) -> np.ndarray:
        """The row statistic `name` (beta, diag, norm2, cosine) for all rows: the prior's on reused rows, `fresh` (a
        full-length array whose new rows are computed) elsewhere."""
        out = np.array(fresh, dtype=np.float64, copy=True)
        kept = self.kept
        out[kept] = getattr(self.state, name)[self.old[kept]]
        return out


def reuse_of(state: ValuationState, names: list[str], files: list[str], target: np.ndarray, metric: str,
             normalize: str) -> tuple[Reuse | None, str]:
    """(the reuse of `state` by a pool of `names` whose vectors sit in `files`, or None; why, in a few words)."""
    if metric != "euclidean" or state.metric != "euclidean":
        return None, "the diagonal Fisher metric changes with every row added"
    if normalize != state.normalize:
        return None, f"normalize changed ({state.normalize} -> {normalize})"
    if state.target.shape != np.shape(target) or not np.array_equal(state.target, np.asarray(target, np.float64)):
        return None, "the target vector changed"
    where = {(n, f): i for i, (n, f) in enumerate(zip(state.order, state.files))}
    old = np.array([where.get((n, f), -1) for n, f in zip(names, files)], dtype=np.intp)
    if not (old >= 0).any():
        return None, "no group of the prior valuation is in this pool with the same vector"
    gone = np.ones(len(state.order), dtype=bool)
    gone[old[old >= 0]] = False
    return Reuse(state, old, residual_exact=not np.any(state.w[gone])), f"{int((old >= 0).sum())} rows reused"


def carry_prior(result: GramResult, reuse: Reuse, on_cluster: bool = True) -> GramResult:
    """The grown pool's statistics: the new rows' as computed in `result` (on the cluster, or in the driver), the
    reused rows' from the prior."""
    for name, attr in (("beta", "beta"), ("diag", "diag"), ("norm2", "row_norm2"), ("cosine", "cosine")):
        setattr(result, attr, reuse.carried(name, getattr(result, attr)))
    result.stats["incremental"] = {"reused_rows": int(reuse.kept.size), "new_rows": int(reuse.new_rows.size),
                                   "on_cluster": on_cluster}
    return result


def place_old_gram(K: np.ndarray, old_K: np.ndarray, reuse: Reuse, rows: int = 2048) -> None:
    """K[kept, kept] = old_K[old, old], a band of `rows` rows at a time (old_K may be a memory map of gram.npy)."""
    kept = reuse.kept
    src = reuse.old[kept]
    for lo in range(0, kept.size, rows):
        band = np.asarray(old_K[np.sort(src[lo:lo + rows])])  # rows read in file order
        order = np.argsort(src[lo:lo + rows], kind="stable")
        K[np.ix_(kept[lo:lo + rows][order], kept)] = band[:, src]


def gram_residual(K: np.ndarray, beta: np.ndarray, w: np.ndarray, normalize: str) -> np.ndarray:
    """r~ = K~ w - beta~ in the normalised space, from K (reading only w's support columns)."""
    s = 1.0 / np.sqrt(np.diag(K)) if normalize == "cosine" else np.ones(len(beta))
    on = np.flatnonzero(w)
    return s * (K[:, on] @ (s[on] * w[on])) - s * beta


def files_of(blocks: list[BlockRows], n: int) -> list[str]:
    """The stored block holding each of the n rows."""
    files = [""] * n
    for b in blocks:
        for pos in b.positions:
            files[pos] = b.file
    return files


def split_blocks(blocks: list[BlockRows], new: np.ndarray) -> tuple[list[BlockRows], list[BlockRows]]:
    """(the blocks' reused rows, their new rows) as BlockRows, by the mask `new` over positions (a block can hold
    both: a group valued before beside one valued now)."""
    old_parts, new_parts = [], []
    for b in blocks:
        is_new = new[list(b.positions)]
        for parts, keep in ((old_parts, ~is_new), (new_parts, is_new)):
            if keep.any():
                rows = tuple(r for r, k in zip(b.rows, keep) if k)
                parts.append(BlockRows(b.file, rows, tuple(q for q, k in zip(b.positions, keep) if k), b.node,
                                       b.nbytes))
    return old_parts, new_parts
