"""A small, explicit training loop for the chapters' toys (not part of the reference API).

The loop is the textbook one — draw a batch, compute the loss, back-propagate,
optionally clip, take an optimiser step — written out once so that every chapter
trains its models the same way and records the same history.
"""

import math

import torch

from ._checks import check_int, check_positive_float

__all__ = ["train", "global_grad_norm"]


def global_grad_norm(parameters):
    """The L2 norm of all gradients together, ``sqrt(sum_p ||grad p||^2)`` (parameters without a gradient are skipped)."""
    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    if not norms:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def train(model, loss_fn, batch_fn, *, steps, lr=1e-3, weight_decay=0.0, clip=None,
          eval_fn=None, eval_every=10):
    """Train ``model`` with AdamW for ``steps`` steps and return its history.

    ``batch_fn(step)`` returns one batch (any object); ``loss_fn(model, batch)`` returns a
    scalar loss tensor; ``eval_fn(model)`` (optional) returns a float, e.g. an accuracy,
    and is called under ``torch.no_grad()`` in eval mode every ``eval_every`` steps and
    after the last one. The learning rate is constant: no warm-up, no decay.
    ``clip`` (optional) clips the global gradient norm.

    Returns a dict of lists: ``loss`` and ``grad_norm`` (one per step, the norm before
    clipping), ``eval_step`` and ``eval`` (one per evaluation). A loss that becomes
    non-finite is recorded as ``nan`` and training stops early: a diverged run is a result.
    """
    steps = check_int("steps", steps, minimum=1)
    lr = check_positive_float("lr", lr)
    eval_every = check_int("eval_every", eval_every, minimum=1)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    history = {"loss": [], "grad_norm": [], "eval_step": [], "eval": []}

    def evaluate(step):
        if eval_fn is None:
            return
        model.eval()
        with torch.no_grad():
            history["eval"].append(float(eval_fn(model)))
        history["eval_step"].append(step)
        model.train()

    model.train()
    for step in range(steps):
        loss = loss_fn(model, batch_fn(step))
        if not torch.isfinite(loss):
            history["loss"].append(math.nan)
            history["grad_norm"].append(math.nan)
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        history["loss"].append(loss.item())
        history["grad_norm"].append(global_grad_norm(params))
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            evaluate(step + 1)
    return history
