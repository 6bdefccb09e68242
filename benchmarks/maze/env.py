"""Procedurally generated grid mazes and a vectorized environment for them.

The maze experiment (``sera_opt.benchmarks.maze``) trains a small policy to walk from
a start cell to a goal cell. This module holds everything about the mazes
themselves, independent of the learning:

* :func:`generate_maze` carves a *perfect* maze (a spanning tree of the grid:
  every cell reachable from every other by exactly one path) with the
  randomized depth-first search ("recursive backtracker"), then draws a start
  and a goal cell.
* :func:`generate_maze_sets` draws a training set and a held-out test set from
  independent random streams and rejects every test maze that also occurs in
  the training set (same size, walls, start and goal), so the two are disjoint.
* :class:`MazeBatch` stacks mazes of different sizes into padded tensors, and
  :class:`MazeEnv` steps any number of walkers (rollouts) through them at
  once, in torch, with a local observation of the maze around each walker.

Cells are addressed ``(row, col)``; the four moves are numbered
``0 = north (row - 1), 1 = east (col + 1), 2 = south (row + 1), 3 = west (col - 1)``.
A maze is stored as ``open[row, col, move]``: True when the wall on that side
of the cell is carved away. Moving into a wall leaves the walker in place.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = [
    "MOVES",
    "Maze",
    "MazeBatch",
    "MazeEnv",
    "generate_maze",
    "generate_maze_sets",
    "distance_map",
    "maze_key",
    "is_perfect",
]

#: Row and column change of the moves north, east, south, west.
MOVES = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]], dtype=np.int64)
#: The move that undoes each move (north <-> south, east <-> west).
OPPOSITE = np.array([2, 3, 0, 1], dtype=np.int64)


@dataclass(frozen=True)
class Maze:
    """One maze: its carved walls, a start and a goal.

    Attributes
    ----------
    open : ndarray of bool, shape (height, width, 4)
        ``open[r, c, m]`` is True when move ``m`` from cell ``(r, c)`` is not
        blocked by a wall.
    start, goal : tuple of int
        Cells ``(row, col)``; they differ.
    shortest_path : int
        Number of moves on the (unique) path from start to goal.
    """

    open: np.ndarray
    start: tuple[int, int]
    goal: tuple[int, int]
    shortest_path: int

    @property
    def height(self) -> int:
        return int(self.open.shape[0])

    @property
    def width(self) -> int:
        return int(self.open.shape[1])


def _carve_dfs(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Randomized depth-first search: a uniform-ish random spanning tree of the grid.

    From a random first cell, repeatedly step to a random unvisited neighbour
    (carving the wall between), backtracking when there is none. Every cell is
    visited once and each visit carves one wall, so the carved graph has
    ``height * width - 1`` edges and is connected: a tree, i.e. a perfect maze.
    """
    open_ = np.zeros((height, width, 4), dtype=bool)
    visited = np.zeros((height, width), dtype=bool)
    r, c = int(rng.integers(height)), int(rng.integers(width))
    visited[r, c] = True
    stack = [(r, c)]
    while stack:
        r, c = stack[-1]
        choices = []
        for m in range(4):
            nr, nc = r + MOVES[m, 0], c + MOVES[m, 1]
            if 0 <= nr < height and 0 <= nc < width and not visited[nr, nc]:
                choices.append(m)
        if not choices:
            stack.pop()
            continue
        m = choices[int(rng.integers(len(choices)))]
        nr, nc = r + int(MOVES[m, 0]), c + int(MOVES[m, 1])
        open_[r, c, m] = True
        open_[nr, nc, OPPOSITE[m]] = True
        visited[nr, nc] = True
        stack.append((nr, nc))
    return open_


def distance_map(open_: np.ndarray, goal: tuple[int, int]) -> np.ndarray:
    """Breadth-first distance (in moves) from every cell to ``goal``; -1 where unreachable."""
    height, width = open_.shape[:2]
    dist = np.full((height, width), -1, dtype=np.int64)
    dist[goal] = 0
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for m in range(4):
            if open_[r, c, m]:
                nr, nc = r + int(MOVES[m, 0]), c + int(MOVES[m, 1])
                if dist[nr, nc] < 0:
                    dist[nr, nc] = dist[r, c] + 1
                    queue.append((nr, nc))
    return dist


def is_perfect(open_: np.ndarray) -> bool:
    """True when the carved maze is a spanning tree: consistent walls, connected, no loops.

    Checks that no move leaves the grid, that every opening is carved from both
    sides, that all cells are reachable from ``(0, 0)``, and that there are
    exactly ``cells - 1`` passages (a connected graph with that many edges is a tree).
    """
    height, width = open_.shape[:2]
    for r in range(height):
        for c in range(width):
            for m in range(4):
                if not open_[r, c, m]:
                    continue
                nr, nc = r + int(MOVES[m, 0]), c + int(MOVES[m, 1])
                if not (0 <= nr < height and 0 <= nc < width):
                    return False
                if not open_[nr, nc, OPPOSITE[m]]:
                    return False
    passages = int(open_.sum()) // 2
    connected = bool((distance_map(open_, (0, 0)) >= 0).all())
    return connected and passages == height * width - 1


def generate_maze(height: int, width: int, rng: np.random.Generator, *,
                  min_path: int = 1) -> Maze:
    """A perfect ``height x width`` maze with a random start and goal.

    The walls come from :func:`_carve_dfs`. The goal is a uniformly drawn cell;
    the start is drawn uniformly among the cells at least ``min_path`` moves
    from it (``min_path`` is capped at the goal's largest distance).
    """
    if height < 2 or width < 2:
        raise ValueError("a maze needs at least 2 x 2 cells")
    open_ = _carve_dfs(height, width, rng)
    cells = height * width
    while True:
        g = int(rng.integers(cells))
        goal = (g // width, g % width)
        dist = distance_map(open_, goal).ravel()
        # Every cell has another at distance >= 1, so min_path is capped at this
        # goal's eccentricity and the loop always ends.
        candidates = np.flatnonzero(dist >= min(min_path, int(dist.max())))
        candidates = candidates[candidates != g]
        s = int(candidates[int(rng.integers(len(candidates)))])
        return Maze(open=open_, start=(s // width, s % width), goal=goal,
                    shortest_path=int(dist[s]))


def maze_key(maze: Maze) -> bytes:
    """A hashable identity of a maze: size, walls, start and goal."""
    header = np.array([maze.height, maze.width, *maze.start, *maze.goal], dtype=np.int64)
    return header.tobytes() + np.packbits(maze.open.ravel()).tobytes()


def _draw_mazes(count: int, sizes: tuple[int, int], rng: np.random.Generator, *,
                min_path: int, exclude: set[bytes]) -> list[Maze]:
    lo, hi = sizes
    mazes: list[Maze] = []
    seen = set(exclude)
    attempts = 0
    while len(mazes) < count:
        attempts += 1
        if attempts > 100 * count + 1000:
            raise RuntimeError(
                f"could not draw {count} distinct mazes of sizes {sizes}: too few distinct "
                "mazes exist; use larger sizes or fewer mazes"
            )
        height = int(rng.integers(lo, hi + 1))
        width = int(rng.integers(lo, hi + 1))
        maze = generate_maze(height, width, rng, min_path=min_path)
        key = maze_key(maze)
        if key in seen:
            continue
        seen.add(key)
        mazes.append(maze)
    return mazes


def generate_maze_sets(num_train: int, num_test: int, *, sizes: tuple[int, int] = (3, 7),
                       min_path: int = 2, seed: int = 0) -> tuple[list[Maze], list[Maze]]:
    """Disjoint training and held-out test mazes, reproducible from ``seed``.

    Heights and widths are drawn uniformly from ``sizes`` (inclusive). The
    training and test sets come from two independent streams spawned from
    ``seed``; duplicates within a set and test mazes equal to a training maze
    are rejected and redrawn.
    """
    train_ss, test_ss = np.random.SeedSequence([seed, 0x6D617A65]).spawn(2)
    train = _draw_mazes(num_train, sizes, np.random.default_rng(train_ss),
                        min_path=min_path, exclude=set())
    train_keys = {maze_key(m) for m in train}
    test = _draw_mazes(num_test, sizes, np.random.default_rng(test_ss),
                       min_path=min_path, exclude=train_keys)
    return train, test


class MazeBatch:
    """Mazes of different sizes padded to one ``size x size`` grid, as torch tensors.

    Outside a maze every move is blocked, so padding cells are never entered.

    Attributes
    ----------
    open : bool tensor, shape (N, size, size, 4)
    start, goal : int64 tensor, shape (N, 2)
    dist : int64 tensor, shape (N, size, size)
        Moves from each cell to the goal (-1 on padding); used for the
        shortest-path teacher of the warm-up.
    shortest_path : int64 tensor, shape (N,)
    """

    def __init__(self, mazes: list[Maze], *, size: int | None = None, device="cpu"):
        import torch

        if not mazes:
            raise ValueError("MazeBatch needs at least one maze")
        size = size or max(max(m.height, m.width) for m in mazes)
        n = len(mazes)
        open_ = np.zeros((n, size, size, 4), dtype=bool)
        dist = np.full((n, size, size), -1, dtype=np.int64)
        for i, m in enumerate(mazes):
            if m.height > size or m.width > size:
                raise ValueError(f"maze {i} ({m.height}x{m.width}) exceeds the grid size {size}")
            open_[i, : m.height, : m.width] = m.open
            dist[i, : m.height, : m.width] = distance_map(m.open, m.goal)
        self.size = size
        self.num_mazes = n
        self.device = torch.device(device)
        self.open = torch.as_tensor(open_, device=self.device)
        self.dist = torch.as_tensor(dist, device=self.device)
        self.start = torch.as_tensor(np.array([m.start for m in mazes]), device=self.device)
        self.goal = torch.as_tensor(np.array([m.goal for m in mazes]), device=self.device)
        self.shortest_path = torch.as_tensor(
            np.array([m.shortest_path for m in mazes]), device=self.device)
        self.cells = torch.as_tensor(np.array([m.height * m.width for m in mazes]),
                                     device=self.device)
        self._padded: dict[int, tuple] = {}

    def padded(self, radius: int):
        """``open`` and the inside-the-maze mask padded by ``radius`` blocked cells on each side.

        Observation windows then never index outside the arrays. Cached per radius.
        """
        if radius not in self._padded:
            import torch

            size, k = self.size, radius
            open_pad = torch.zeros((self.num_mazes, size + 2 * k, size + 2 * k, 4),
                                   dtype=torch.bool, device=self.device)
            open_pad[:, k:k + size, k:k + size] = self.open
            inside_pad = torch.zeros((self.num_mazes, size + 2 * k, size + 2 * k),
                                     dtype=torch.bool, device=self.device)
            inside_pad[:, k:k + size, k:k + size] = self.dist >= 0
            self._padded[radius] = (open_pad, inside_pad)
        return self._padded[radius]


class MazeEnv:
    """Many walkers stepping through a :class:`MazeBatch` at once.

    Parameters
    ----------
    mazes : MazeBatch
    maze_index : int64 tensor, shape (R,)
        Which maze each walker (rollout) is in.
    horizon : int
        Moves allowed; a walker that has not reached its goal by then fails.
    view_radius : int
        The observation shows the ``(2 * view_radius + 1)^2`` cells around the walker.

    Notes
    -----
    The observation of a walker concatenates, for each cell of its window,
    the four open-side bits, whether the cell lies inside the maze, and whether
    the walker has visited it before in this episode; then the goal's offset
    ``(goal - position) / size`` with its signs, and the previous move as a
    one-hot (zeros at the first step). Visited flags and the previous move give
    a memoryless network enough memory to avoid walking in circles.
    """

    def __init__(self, mazes: MazeBatch, maze_index, *, horizon: int, view_radius: int = 2):
        import torch

        self.torch = torch
        self.mazes = mazes
        self.device = mazes.device
        self.maze_index = torch.as_tensor(maze_index, dtype=torch.int64, device=self.device)
        self.horizon = int(horizon)
        self.radius = int(view_radius)
        self.num_walkers = int(self.maze_index.numel())
        k = self.radius
        self._open_pad, self._inside_pad = mazes.padded(k)
        offsets = torch.arange(-k, k + 1, device=self.device)
        self._dr = offsets.repeat_interleave(2 * k + 1)
        self._dc = offsets.repeat(2 * k + 1)
        self._moves = torch.as_tensor(MOVES, device=self.device)
        self._rows = torch.arange(self.num_walkers, device=self.device)
        self.observation_size = (2 * k + 1) ** 2 * 6 + 4 + 4
        self.reset()

    def reset(self):
        """Put every walker on its maze's start; returns the first observation."""
        torch = self.torch
        size, k = self.mazes.size, self.radius
        self.position = self.mazes.start[self.maze_index].clone()
        self.goal = self.mazes.goal[self.maze_index]
        self.done = torch.zeros(self.num_walkers, dtype=torch.bool, device=self.device)
        self.success = torch.zeros(self.num_walkers, dtype=torch.bool, device=self.device)
        self.steps = 0
        self.prev_move = torch.full((self.num_walkers,), -1, dtype=torch.int64, device=self.device)
        self.visited = torch.zeros((self.num_walkers, size + 2 * k, size + 2 * k),
                                   dtype=torch.bool, device=self.device)
        self._mark_visited()
        return self.observe()

    def _mark_visited(self):
        k = self.radius
        self.visited[self._rows, self.position[:, 0] + k, self.position[:, 1] + k] = True

    def observe(self):
        """Float tensor, shape (R, observation_size)."""
        torch = self.torch
        k = self.radius
        rr = self.position[:, 0:1] + k + self._dr  # (R, W)
        cc = self.position[:, 1:2] + k + self._dc
        mi = self.maze_index[:, None]
        walls = self._open_pad[mi, rr, cc]  # (R, W, 4)
        inside = self._inside_pad[mi, rr, cc]  # (R, W)
        visited = self.visited[self._rows[:, None], rr, cc]
        window = torch.cat([walls, inside[..., None], visited[..., None]], dim=-1)
        offset = (self.goal - self.position).to(torch.float32) / self.mazes.size
        prev = torch.zeros((self.num_walkers, 4), dtype=torch.float32, device=self.device)
        has_prev = self.prev_move >= 0
        prev[has_prev, self.prev_move[has_prev]] = 1.0
        return torch.cat([window.flatten(1).to(torch.float32), offset, torch.sign(offset),
                          prev], dim=1)

    def step(self, move):
        """Apply one move per walker (ignored for walkers already done).

        Returns the next observation. ``self.done`` and ``self.success`` are
        updated; a walker is done when it reaches its goal or the horizon ends.
        """
        torch = self.torch
        move = torch.as_tensor(move, dtype=torch.int64, device=self.device)
        active = ~self.done
        mi = self.maze_index
        can = self.mazes.open[mi, self.position[:, 0], self.position[:, 1], move] & active
        self.position = self.position + self._moves[move] * can[:, None].to(torch.int64)
        self.prev_move = torch.where(active, move, self.prev_move)
        self._mark_visited()
        reached = (self.position == self.goal).all(dim=1) & active
        self.success |= reached
        self.steps += 1
        self.done |= reached
        if self.steps >= self.horizon:
            self.done[:] = True
        return self.observe()

    def expert_moves(self):
        """The shortest-path move of every walker (the teacher of the warm-up)."""
        torch = self.torch
        mi = self.maze_index
        r, c = self.position[:, 0], self.position[:, 1]
        here = self.mazes.dist[mi, r, c]
        best = torch.zeros(self.num_walkers, dtype=torch.int64, device=self.device)
        size = self.mazes.size
        for m in range(4):
            nr = (r + int(MOVES[m, 0])).clamp(0, size - 1)
            nc = (c + int(MOVES[m, 1])).clamp(0, size - 1)
            ok = self.mazes.open[mi, r, c, m] & (self.mazes.dist[mi, nr, nc] == here - 1)
            best = torch.where(ok, torch.full_like(best, m), best)
        return best

