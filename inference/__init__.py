"""Trained models at work: `Ranker` scores and ranks answers with an answer-selection checkpoint."""

from inference.ranker import Ranker

__all__ = ["Ranker"]
