"""Collecting experience: trajectories, drivers and metric observers for gymnasium envs."""

from replaybuffer.collect.actors import ActorPool
from replaybuffer.collect.driver import Driver, EpisodeDriver, PolicyStep, StepDriver
from replaybuffer.collect.metrics import AverageEpisodeLength, AverageReturn, EnvironmentSteps
from replaybuffer.collect.trajectory import (
    StepType,
    Trajectory,
    boundary,
    first,
    last,
    mid,
    single_step,
    to_transition,
    trajectory_spec,
)

__all__ = [
    "ActorPool", "AverageEpisodeLength", "AverageReturn", "Driver", "EnvironmentSteps", "EpisodeDriver",
    "PolicyStep", "StepDriver", "StepType", "Trajectory", "boundary", "first", "last", "mid",
    "single_step", "to_transition", "trajectory_spec",
]
