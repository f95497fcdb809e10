"""The roles of a run as plain classes that own their state and speak in batches and versioned
weights: policy, reference, critic, rollout and reward workers. A worker never imports a
runtime; the controller calls it through a worker group (:mod:`reasonrl.runtime`)."""

from reasonrl.workers.critic import CriticWorker
from reasonrl.workers.policy import PolicyWorker
from reasonrl.workers.reference import ReferenceWorker
from reasonrl.workers.reward import RewardWorker
from reasonrl.workers.rollout import RolloutWorker, trainer_numerics

__all__ = ["CriticWorker", "PolicyWorker", "ReferenceWorker", "RewardWorker", "RolloutWorker", "trainer_numerics"]
