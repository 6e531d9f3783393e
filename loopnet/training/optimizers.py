"""Muon on the blocks' matrices and AdamW on the rest, as one optimiser (`OptimConfig.optimizer: muon`).

Lightning and the learning-rate schedule see one `torch.optim.Optimizer` whose param_groups are the two
inner optimisers' own group dicts, so the schedule scales both rates and gradient clipping sees every
parameter; a step is Muon's step then AdamW's; the state dict holds both states.
"""

from __future__ import annotations

import torch


class MuonWithAdamW(torch.optim.Optimizer):
    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], muon: dict, adamw: dict):
        self.muon = torch.optim.Muon(muon_groups, **muon)
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw)
        params = [p for opt in (self.muon, self.adamw) for g in opt.param_groups for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = self.muon.param_groups + self.adamw.param_groups  # the same dicts: one lr schedule

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
