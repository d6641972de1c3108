"""Which positions to read: ring bookkeeping and samplers (no data in here)."""

from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, Sampler, make_rng
from replaybuffer.sampling.uniform import UniformSampler

__all__ = ["Ring", "SampleIndices", "Sampler", "UniformSampler", "make_rng"]
