"""Train one router head on `Positions`, choose its threshold, in our head format.

    split       by prompt: every fifth prompt is held out (threshold and early stopping)
    inputs      standardised with the training split's mean and deviation; the scaling is
                folded into the first Linear afterwards, so the saved head reads raw features
    model       citer, r2r: Linear(in, 128), ReLU, Linear(128, 1); collm: Linear(in, 1)
    loss        BCE with logits, pos_weight = negatives / positives (training split)
    threshold   R2R's rule: on the held-out split, the lowest large-token share whose recall
                of the positives is at least 0.95, i.e. the highest score s* that still
                routes 95% of them (route when score >= s*)

citer's head outputs a confidence (high = keep the small token; the policy escalates when
confidence < tau): its last layer is negated, so confidence = 1 - score, tau = 1 - s*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trd.policies.heads import Layers
from trd.routers.data import Positions

HIDDEN = {"citer": [128], "r2r": [128], "collm": []}
MIN_RECALL = 0.95


@dataclass
class Fitted:
    kind: str
    layers: Layers  # reads raw features
    threshold: float  # in the policy's own sense
    report: dict[str, Any]


def heldout(pos: Positions) -> torch.Tensor:
    return pos.prompt % 5 == 4


def recall_threshold(scores: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """(s*, recall, share): the highest s* routing >= MIN_RECALL of the positives."""
    positives = scores[y == 1].sort(descending=True).values
    if len(positives) == 0:
        raise SystemExit("no positive labels in the held-out split: more prompts or tokens")
    s = float(positives[math.ceil(MIN_RECALL * len(positives)) - 1])
    return s, float((positives >= s).double().mean()), float((scores >= s).double().mean())


def fit(kind: str, pos: Positions, epochs: int, seed: int = 0) -> Fitted:
    if kind == "r2r":
        pos = pos.select(pos.divergent >= 0)
    x, y, held = pos.features(kind).float(), pos.labels(kind), heldout(pos)
    xt, yt = x[~held], y[~held]
    mu, sd = xt.mean(0), xt.std(0).clamp_min(1e-6)
    torch.manual_seed(seed)
    sizes = [x.shape[1], *HIDDEN[kind], 1]
    net = nn.Sequential()
    for i in range(len(sizes) - 1):
        net.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            net.append(nn.ReLU())
    positives = float(yt.sum())
    if positives == 0:
        raise SystemExit(f"{kind}: no positive labels in the training split")
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(yt) - positives) / positives))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    z, zh = (xt - mu) / sd, (x[held] - mu) / sd
    best, best_state, best_epoch = math.inf, None, 0
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        for idx in torch.randperm(len(z), generator=gen).split(256):
            opt.zero_grad()
            loss_fn(net(z[idx]).squeeze(-1), yt[idx]).backward()
            opt.step()
        with torch.no_grad():
            val = float(loss_fn(net(zh).squeeze(-1), y[held]))
        if val < best:
            best, best_epoch = val, epoch + 1
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
    assert best_state is not None
    net.load_state_dict(best_state)
    linears = [m for m in net if isinstance(m, nn.Linear)]
    layers = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in linears]
    w0, b0 = layers[0]
    layers[0] = (w0 / sd, b0 - (w0 / sd) @ mu)  # standardisation folded in
    with torch.no_grad():
        scores = torch.sigmoid(net(zh).squeeze(-1))
    s, recall, share = recall_threshold(scores, y[held])
    base = recall_threshold(pos.entropy[held], y[held])  # the entropy rule, same labels
    if kind == "citer":
        w, b = layers[-1]
        layers[-1] = (-w, -b)
    report = {
        "rows": len(y), "positives": int(y.sum()), "heldout_rows": int(held.sum()),
        "pos_weight": (len(yt) - positives) / positives, "epochs": epochs,
        "best_epoch": best_epoch, "heldout_bce": best, "heldout_recall": recall,
        "heldout_large_share": share, "entropy_rule_share_at_same_recall": base[2],
    }  # fmt: skip
    return Fitted(kind, layers, 1.0 - s if kind == "citer" else s, report)
