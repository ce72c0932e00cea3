"""Trajectory trees: the shared-prefix structure of one execution's model calls (proxy writes, trainer reads)."""

from ._tree import Node, PathSequence, TrajectoryError, TrajectoryTree

__all__ = ["Node", "PathSequence", "TrajectoryError", "TrajectoryTree"]
