"""backplane.nn: the training toolkit (Linear, cross_entropy, accuracy, SGD, Adam).

Each piece is a few backplane ops on whatever device the tensors live on. The optimizers
update parameters in place from their ``.grad`` (what ``loss.backward()`` delivered), as
PyTorch's do; call ``zero_grad()`` between steps.
"""

from ._backplane.nn import Adam, Linear, Optimizer, SGD, accuracy, cross_entropy  # noqa: F401

__all__ = ["Adam", "Linear", "Optimizer", "SGD", "accuracy", "cross_entropy"]
