"""A classifier that plays the policy, so that the likelihood gradient is exact.

The prompts are scikit-learn's handwritten digits (1797 inputs of 8x8 pixels,
shipped inside the package, nothing downloaded). A rollout of prompt ``i``
samples a label from the classifier's softmax; it succeeds when the label is
the true one. The success probability is then ``p_i = softmax(f(x_i) / T)[y_i]``
and ``grad log p_i`` is computed exactly by autograd: docs/theory.md section 6.

How the spread of success probabilities is made (the point is a realistic
mixture of hopeless, hard, medium and solved prompts, as in RL post-training):

* 30 % of the training labels are replaced by a random wrong label. A
  one-hidden-layer tanh network (64 units) trained with full-batch Adam
  (learning rate 0.01) for 300 steps has started to memorize those wrong
  labels: the corrupted inputs become the hard and hopeless prompts (the
  policy confidently answers wrongly), the others are mostly solved.
* Rollouts are sampled at temperature 0.5, which sharpens the policy: the
  hopeless prompts move towards 0 and the solved ones towards 1.

With the defaults about 7 % of the prompts have ``p < 0.01``, 12 % have
``p < 0.05``, 55 % have ``p > 0.95`` and the rest are spread in between
(the benchmark reports the exact histogram). An earlier checkpoint of the same
run (``lag`` steps before the end) plays the policy of an earlier round, whose
rollouts feed the success tracker.

Only torch and scikit-learn are needed; both are imported here, never by
``sera_opt`` itself.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = [
    "NUM_CLASSES",
    "DigitsPolicy",
    "TrainedPolicies",
    "load_prompts",
    "train_policies",
    "single_thread",
    "log_probs",
    "success_probs",
    "weighted_log_prob_gradient",
    "per_prompt_gradients",
    "per_prompt_gradients_loop",
    "flat_parameters",
]

NUM_CLASSES = 10


def _digits_file():
    """The digits table that scikit-learn ships, located without importing sklearn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def load_prompts(*, via_sklearn: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The digits inputs scaled to [0, 1] (float64, shape (1797, 64)) and their labels.

    Reads the table that scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``,
    the file behind :func:`sklearn.datasets.load_digits`) directly, because
    importing scikit-learn costs seconds that ``sera-opt demo`` cannot spare;
    falls back to ``load_digits`` when the file is not where it is expected.
    The tests check that both give the same arrays.
    """
    path = None if via_sklearn else _digits_file()
    if path is not None:
        with gzip.open(path, mode="rt") as fh:
            table = np.loadtxt(fh, delimiter=",")
        data, target = table[:, :-1], table[:, -1]
    else:
        try:
            from sklearn.datasets import load_digits
        except ImportError as exc:
            from sera_opt.exceptions import MissingDependencyError

            raise MissingDependencyError(
                "the digits data ships with scikit-learn, which is not installed; "
                "install it with `pip install 'sera_opt[bench]'` (or `pip install scikit-learn`)."
            ) from exc
        bunch = load_digits()
        data, target = bunch.data, bunch.target
    return (data / 16.0).astype(np.float64), target.astype(np.int64)


class DigitsPolicy(nn.Module):
    """Softmax policy over the ten labels: ``softmax(f(x) / temperature)``.

    ``hidden=0`` gives a softmax regression (a single linear layer), whose
    score has the closed form ``(e_y - q) x^T / temperature``; the tests use it
    as a reference.
    """

    def __init__(self, num_features: int = 64, hidden: int = 64, temperature: float = 1.0):
        super().__init__()
        if hidden > 0:
            self.body = nn.Sequential(
                nn.Linear(num_features, hidden), nn.Tanh(), nn.Linear(hidden, NUM_CLASSES)
            )
        else:
            self.body = nn.Linear(num_features, NUM_CLASSES)
        self.temperature = float(temperature)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits of the sampling distribution (temperature included)."""
        return self.body(inputs) / self.temperature


@contextlib.contextmanager
def single_thread():
    """Run torch on one thread so that reductions, and thus results, are reproducible."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class TrainedPolicies:
    """The current policy and an earlier checkpoint of the same training run."""

    current: DigitsPolicy
    earlier: DigitsPolicy
    corrupted: np.ndarray  # bool per input: its training label was replaced


def train_policies(inputs: np.ndarray, labels: np.ndarray, *, seed: int = 0,
                   steps: int = 300, lag: int = 50, label_noise: float = 0.3,
                   hidden: int = 64, temperature: float = 0.5,
                   learning_rate: float = 1e-2) -> TrainedPolicies:
    """Train the digits policy on partly corrupted labels (see the module docstring).

    Returns the policy after ``steps`` full-batch Adam steps and the checkpoint
    after ``steps - lag`` steps, both in float64 and in evaluation mode.
    """
    if not 0 <= lag < steps:
        raise ValueError(f"lag must lie in [0, steps), got lag={lag}, steps={steps}.")
    rng = np.random.default_rng(seed)
    corrupted = rng.random(labels.shape[0]) < label_noise
    noisy = labels.copy()
    # a wrong label, uniform over the nine others
    noisy[corrupted] = (labels[corrupted] + rng.integers(1, NUM_CLASSES, corrupted.sum())) % NUM_CLASSES
    with single_thread():
        torch.manual_seed(seed)
        model = DigitsPolicy(inputs.shape[1], hidden, temperature=1.0)
        x = torch.as_tensor(inputs, dtype=torch.float32)
        target = torch.as_tensor(noisy)
        params = list(model.parameters())
        adam = _Adam(params, learning_rate)
        earlier_state = None
        for step in range(steps):
            if step == steps - lag:
                earlier_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            loss = nn.functional.cross_entropy(model(x), target)
            adam.step(torch.autograd.grad(loss, params))
        if earlier_state is None:  # lag == 0
            earlier_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def finish(state) -> DigitsPolicy:
        policy = DigitsPolicy(inputs.shape[1], hidden, temperature=temperature)
        policy.load_state_dict(state)
        return policy.double().eval()

    return TrainedPolicies(current=finish(model.state_dict()), earlier=finish(earlier_state),
                           corrupted=corrupted)


class _Adam:
    """Adam (Kingma and Ba 2015, default betas) written out.

    ``torch.optim`` imports torch's compiler stack on first use, which costs
    seconds; the demo trains one small network and does not need it.
    """

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.first = [torch.zeros_like(p) for p in params]
        self.second = [torch.zeros_like(p) for p in params]
        self.steps = 0

    @torch.no_grad()
    def step(self, grads) -> None:
        self.steps += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        for p, g, m, v in zip(self.params, grads, self.first, self.second, strict=True):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.sub_(self.lr * (m / c1) / ((v / c2).sqrt() + self.eps))


def log_probs(model: DigitsPolicy, inputs) -> torch.Tensor:
    """Log-probabilities of the ten labels, shape (M, 10), with the graph kept."""
    x = torch.as_tensor(inputs, dtype=torch.float64)
    return torch.log_softmax(model(x), dim=1)


def success_probs(model: DigitsPolicy, inputs, labels) -> np.ndarray:
    """``p_i``: the probability that a rollout of prompt ``i`` samples its true label."""
    with torch.no_grad():
        logp = log_probs(model, inputs)
        idx = torch.as_tensor(labels, dtype=torch.long)
        return logp[torch.arange(len(idx)), idx].exp().numpy()


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one flat vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def weighted_log_prob_gradient(model: DigitsPolicy, inputs, labels, weights) -> np.ndarray:
    """``sum_i weights_i grad log p_i``, flat, by one backward pass.

    ``weights = 1/M`` gives the exact likelihood gradient of docs/theory.md section 1;
    ``weights = v_i w_c(p_i, n_i)`` the expected MaxRL estimator of section 6.
    """
    logp = log_probs(model, inputs)
    idx = torch.as_tensor(labels, dtype=torch.long)
    objective = (torch.as_tensor(weights, dtype=torch.float64)
                 * logp[torch.arange(len(idx)), idx]).sum()
    grads = torch.autograd.grad(objective, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]).numpy()


def per_prompt_gradients(model: DigitsPolicy, inputs, labels) -> np.ndarray:
    """``grad log p_i`` for every prompt, shape (M, D): one forward, M backward passes.

    The tests compare it with :func:`per_prompt_gradients_loop`.
    """
    logp = log_probs(model, inputs)
    idx = torch.as_tensor(labels, dtype=torch.long)
    log_success = logp[torch.arange(len(idx)), idx]
    params = list(model.parameters())
    rows = []
    for i in range(len(idx)):
        grads = torch.autograd.grad(log_success[i], params, retain_graph=True)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows).numpy()


def per_prompt_gradients_loop(model: DigitsPolicy, inputs, labels) -> np.ndarray:
    """``grad log p_i`` for every prompt, one backward pass each.

    Slow but obviously correct: the reference for the batched computations.
    """
    rows = []
    for i in range(len(labels)):
        weights = np.zeros(len(labels))
        weights[i] = 1.0
        rows.append(weighted_log_prob_gradient(model, inputs, labels, weights))
    return np.stack(rows)
