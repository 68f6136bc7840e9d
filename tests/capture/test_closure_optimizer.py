"""Eager capture of ``optimizer.step(closure)``: the closure's ops are forward and backward ops."""

import torch
import torch.nn.functional as F

import torchdebug


def _step_records(tmp_path, model, step):
    with torchdebug.dump(tmp_path, model=model):
        step()
    return torchdebug.load(tmp_path).ranks[0].records()


def _loss(model):
    torch.manual_seed(1)
    return F.mse_loss(model(torch.randn(2, 4)), torch.zeros(2, 2))


def test_a_closure_step_is_named_like_a_loop_that_runs_the_closure_before_the_step(tmp_path, tiny):
    state = {k: v.clone() for k, v in tiny.state_dict().items()}
    optimizer = torch.optim.SGD(tiny.parameters(), lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = _loss(tiny)
        loss.backward()
        return loss

    plain = _step_records(tmp_path / "plain", tiny, lambda: (closure(), optimizer.step()))
    tiny.load_state_dict(state)
    closed = _step_records(tmp_path / "closure", tiny, lambda: optimizer.step(closure))
    assert [(r.name, r.phase, r.module) for r in closed] == [(r.name, r.phase, r.module) for r in plain]
    assert {r.phase for r in closed} == {"forward", "backward", "optimizer"}


def test_lbfgs_closure_calls_carry_module_paths_forward_and_backward(tmp_path, tiny):
    optimizer = torch.optim.LBFGS(tiny.parameters(), max_iter=2)

    def closure():
        optimizer.zero_grad()
        loss = _loss(tiny)
        loss.backward()
        return loss

    records = _step_records(tmp_path, tiny, lambda: optimizer.step(closure))
    addmm = [r for r in records if r.op == "aten.addmm.default" and r.io == "output"]
    assert {r.phase for r in addmm} == {"forward"} and {r.module for r in addmm} == {"fc1", "fc2"}
    assert len(addmm) >= 4  # the closure ran at least twice: calls are numbered on
    backward_mm = {r.module for r in records if r.phase == "backward" and r.op == "aten.mm.default"}
    assert backward_mm == {"fc1", "fc2"}
    assert any(r.phase == "optimizer" for r in records)


def test_an_optimizer_step_without_closure_is_unchanged(tmp_path, tiny):
    optimizer = torch.optim.SGD(tiny.parameters(), lr=0.1)
    _loss(tiny).backward()
    records = _step_records(tmp_path, tiny, optimizer.step)
    assert {r.phase for r in records} == {"optimizer"}
