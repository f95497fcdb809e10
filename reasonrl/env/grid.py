"""``grid``: a FrozenLake-like text maze generated from the reset seed.

The board is ``size`` rows of ``size`` cells: ``S`` the start, ``G`` the goal, ``H`` holes,
``.`` ice, and ``@`` the agent when it is not on ``S``. Every observation is the board, one row
a line, then ``move:``, preceded by a note line after a move that did not go anywhere
(``wall``: off the board; ``invalid move``: no move could be read). A 4x4 board takes 25 to 38
characters. Transcript (seed 3, the scripted policy of :meth:`GridEnv.demonstration`)::

    obs    '..H.\\n.H.S\\nHG..\\n....\\nmove:'
    action 'D'
    obs    '..H.\\n.H.S\\nHG.@\\n....\\nmove:'                reward 0
    action 'L'
    obs    '..H.\\n.H.S\\nHG@.\\n....\\nmove:'                reward 0
    action 'L'
    obs    '..H.\\n.H.S\\nH@..\\n....\\ngoal'                 reward 1, terminated, success

An action is the policy's turn as text: its first non-blank character when that is one of
``U D L R`` (any case, so ``up``, ``Down``, ``r`` all count), else the first of the words up,
down, left, right in it. Reaching ``G`` ends the episode with reward 1.0 and ``success``
True; a hole ends it with reward 0 and ``success`` False; every other move, also one into a
wall or one that cannot be read (which leave the agent where it is), has reward 0 and counts
toward ``max_steps``, after which the episode is truncated (``success`` False).

The board of a seed is drawn by ``random.Random(seed)`` (start, goal and holes on distinct
cells), redrawn until the goal is reachable by a shortest path of 2 to ``max_steps`` moves
(breadth-first search), so every episode can be won in time.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from reasonrl.errors import InputError

MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
"""Row and column change of each move."""
CUE = "move:"
MAX_DRAWS = 1000
"""Boards drawn for one seed before the arguments are declared impossible."""
_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Board:
    """One seed's layout: cells are ``(row, column)``; ``path`` the moves of a shortest route
    from ``start`` to ``goal`` around the holes."""

    size: int
    start: tuple[int, int]
    goal: tuple[int, int]
    holes: frozenset[tuple[int, int]]
    path: tuple[str, ...]

    def render(self, agent: tuple[int, int]) -> str:
        """The board with the agent at ``agent``, one row a line."""
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                cell = (r, c)
                if cell == agent and cell != self.start:
                    row.append("@")
                else:
                    row.append("S" if cell == self.start else "G" if cell == self.goal else
                               "H" if cell in self.holes else ".")
            rows.append("".join(row))
        return "\n".join(rows)

    def move(self, cell: tuple[int, int], move: str) -> tuple[int, int] | None:
        """Where ``move`` from ``cell`` lands, or None when it leaves the board."""
        dr, dc = MOVES[move]
        r, c = cell[0] + dr, cell[1] + dc
        return (r, c) if 0 <= r < self.size and 0 <= c < self.size else None


def parse_move(action: str) -> str | None:
    """The move an action names (see the module), or None."""
    text = action.strip()
    if text and text[0].upper() in MOVES:
        return text[0].upper()
    word = _WORD.search(text)
    return word.group(1)[0].upper() if word else None


class GridEnv:
    """The grid game (see the module): ``size`` x ``size`` cells, ``holes`` holes, at most
    ``max_steps`` moves."""

    def __init__(self, size: int = 4, holes: int = 3, max_steps: int = 6):
        if type(size) is not int or not 2 <= size <= 8:
            raise InputError(f"env.args.size = {size!r}: expected an integer from 2 to 8")
        if type(holes) is not int or not 0 <= holes <= size * size - 2:
            raise InputError(f"env.args.holes = {holes!r}: expected an integer from 0 to {size * size - 2}")
        if type(max_steps) is not int or max_steps < 2:
            raise InputError(f"env.args.max_steps = {max_steps!r}: expected an integer >= 2")
        self.size, self.holes, self.max_steps = size, holes, max_steps
        self.board(0)  # arguments no board fits fail here, not at the first reset
        self._board: Board | None = None
        self._agent = (0, 0)
        self._steps = 0

    def board(self, seed: int) -> Board:
        """The layout of ``seed`` (see the module); an InputError naming env.args.holes when
        :data:`MAX_DRAWS` draws found none with a short enough path."""
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        for _ in range(MAX_DRAWS):
            start, goal, *holes = rng.sample(cells, self.holes + 2)
            path = _shortest_path(self.size, start, goal, frozenset(holes))
            if path is not None and 2 <= len(path) <= self.max_steps:
                return Board(self.size, start, goal, frozenset(holes), tuple(path))
        raise InputError(f"env.args.holes = {self.holes}: no {self.size}x{self.size} board with that many holes "
                         f"has a path of 2 to env.args.max_steps = {self.max_steps} moves (seed {seed}); "
                         "use fewer holes or more steps")

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """The board of ``seed`` with the agent on ``S``; ``info["optimal_steps"]`` is the
        length of its shortest path."""
        self._board = self.board(seed)
        self._agent = self._board.start
        self._steps = 0
        return _observation(self._board, self._agent, ""), {"optimal_steps": len(self._board.path)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One move (see the module); ``info["move"]`` is the move read (None: invalid)."""
        board = self._board
        if board is None:
            raise RuntimeError("GridEnv.step: no episode in progress (call reset first)")
        self._steps += 1
        move = parse_move(action)
        info: dict[str, Any] = {"move": move}
        target = board.move(self._agent, move) if move else None
        note = "invalid move" if move is None else "wall" if target is None else ""
        if target is not None:
            self._agent = target
        if self._agent == board.goal or self._agent in board.holes:
            won = self._agent == board.goal
            self._board = None
            info["success"] = won
            return f"{board.render(self._agent)}\n{'goal' if won else 'hole'}", float(won), True, False, info
        if self._steps >= self.max_steps:
            self._board = None
            info["success"] = False
            return f"{board.render(self._agent)}\nout of moves", 0.0, False, True, info
        return _observation(board, self._agent, note), 0.0, False, False, info

    def demonstration(self, seed: int) -> list[str]:
        """The moves of a shortest path to the goal of ``seed`` (an optimal policy's actions)."""
        return list(self.board(seed).path)

    def sample_action(self, rng: random.Random) -> str:
        """A uniformly random move, for ``env_check``'s random policy."""
        return rng.choice("UDLR")



def _observation(board: Board, agent: tuple[int, int], note: str) -> str:
    """The observation of a running episode: the note line (if any), the board, the cue."""
    return f"{note}\n" * bool(note) + f"{board.render(agent)}\n{CUE}"


def _shortest_path(size: int, start: tuple[int, int], goal: tuple[int, int],
                   holes: frozenset[tuple[int, int]]) -> list[str] | None:
    """The moves of a shortest path from ``start`` to ``goal`` that never enters a hole
    (breadth-first search, moves tried in the order U D L R, so the path is deterministic), or
    None when there is none."""
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while (prev := came[cell]) is not None:
                cell, move = prev
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in came:
                came[nxt] = (cell, move)
                queue.append(nxt)
    return None
