"""MeZO: seeded perturbations regenerated per parameter, forward passes only, the SGD update."""

from __future__ import annotations

import math
import weakref

import pytest
import torch
from engine_fixtures import FAMILIES, LORA, load_with_random_lora, random_batch

from mebp_core.engine import mezo
from mebp_core.engine.model import load_engine_model

F32_EPS = torch.finfo(torch.float32).eps


def lora_params(engine) -> list[torch.Tensor]:
    return [param for _, param in mezo.named_lora_parameters(engine)]


def snapshot(engine) -> list[torch.Tensor]:
    return [param.detach().clone() for param in lora_params(engine)]


def reference_directions(engine, step_seed: int) -> list[torch.Tensor]:
    """z as the algorithm specifies it: one generator, parameters in order, drawn here anew."""
    gen = torch.Generator().manual_seed(step_seed)
    return [torch.randn(p.shape, generator=gen) for p in lora_params(engine)]


@pytest.fixture
def engine(packed_models):
    return load_with_random_lora(packed_models["llama", "none"])


def test_perturb_and_restore_is_within_rounding(engine):
    before = snapshot(engine)
    params = lora_params(engine)
    eps = 1e-3
    for scale in (eps, -2 * eps, eps):
        mezo.perturb_parameters(params, 7, scale)
    zs = reference_directions(engine, 7)
    for param, original, z in zip(params, before, zs, strict=True):
        # three roundings, each at most half an ulp of |theta| + 2 eps |z|
        bound = 2 * F32_EPS * (original.abs() + 2 * eps * z.abs())
        assert bool(((param.detach() - original).abs() <= bound).all())


def test_same_seed_same_update_other_seed_differs(engine, packed_models):
    input_ids, labels = random_batch(300, seed=2)
    start = snapshot(engine)
    first = mezo.run_mezo_step(engine, input_ids, labels, step_seed=5, lr=1e-2)
    after_first = snapshot(engine)
    again = load_with_random_lora(packed_models["llama", "none"])
    second = mezo.run_mezo_step(again, input_ids, labels, step_seed=5, lr=1e-2)
    other = load_with_random_lora(packed_models["llama", "none"])
    third = mezo.run_mezo_step(other, input_ids, labels, step_seed=6, lr=1e-2)

    assert first == second
    assert all(torch.equal(a, b) for a, b in zip(after_first, snapshot(again), strict=True))
    assert third.projected_grad != first.projected_grad
    assert not any(torch.equal(a, b) for a, b in zip(after_first, snapshot(other), strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(after_first, start, strict=True))


def test_projected_gradient_is_the_directional_derivative(engine):
    input_ids, labels = random_batch(300, seed=3)
    exact = mezo.compute_exact_gradient(engine, input_ids, labels)
    assert all(param.grad is None for param in lora_params(engine))
    zs = reference_directions(engine, 11)
    directional = sum(float((g.double() * z.double()).sum())
                      for g, z in zip(exact.values(), zs, strict=True))

    _, _, projected = mezo.measure_projected_gradient(engine, input_ids, labels,
                                                      step_seed=11, eps=1e-3)
    assert projected == pytest.approx(directional, rel=1e-2)


def test_update_is_theta_minus_lr_times_projected_grad_z(engine):
    input_ids, labels = random_batch(300, seed=4)
    eps, lr, decay = 1e-3, 1e-2, 0.1
    before = snapshot(engine)
    result = mezo.run_mezo_step(engine, input_ids, labels, step_seed=9, eps=eps, lr=lr,
                                weight_decay=decay)

    assert result.projected_grad == (result.loss_plus - result.loss_minus) / (2 * eps)
    assert result.loss == (result.loss_plus + result.loss_minus) / 2
    assert abs(result.projected_grad) > 1e-3
    for param, theta, z in zip(lora_params(engine), before, reference_directions(engine, 9),
                               strict=True):
        expected = theta - lr * (result.projected_grad * z + decay * theta)
        restore_slack = 2 * F32_EPS * (theta.abs() + 2 * eps * z.abs())
        slack = restore_slack * (1 + lr * decay) + 2 * F32_EPS * expected.abs()
        assert bool(((param.detach() - expected).abs() <= slack).all())


def test_zero_lr_step_restores_the_parameters(engine):
    input_ids, labels = random_batch(300, seed=4)
    before = snapshot(engine)
    mezo.run_mezo_step(engine, input_ids, labels, step_seed=9, eps=1e-3, lr=0.0)
    worst = max(float((p.detach() - b).abs().max())
                for p, b in zip(lora_params(engine), before, strict=True))
    assert worst <= 2 * F32_EPS * max(float(b.abs().max()) + 0.01 for b in before)


def test_mezo_runs_no_backward_and_keeps_one_z_at_a_time(engine, monkeypatch):
    """No autograd backward is reachable, no .grad appears, and each draw is one parameter's
    z, made while at most one earlier z is still referenced (peak: two parameters' z)."""
    def refuse(*args, **kwargs):
        raise AssertionError("MeZO must not run a backward pass")

    monkeypatch.setattr(torch.autograd, "backward", refuse)
    monkeypatch.setattr(torch.Tensor, "backward", refuse)
    draws, alive_at_draw = [], []
    live: list[weakref.ref] = []
    real_draw = mezo.draw_direction

    def counting_draw(param, generator):
        alive_at_draw.append(sum(ref() is not None for ref in live))
        z = real_draw(param, generator)
        draws.append(id(param))
        live.append(weakref.ref(z))
        return z

    monkeypatch.setattr(mezo, "draw_direction", counting_draw)
    input_ids, labels = random_batch(300, seed=5)
    mezo.run_mezo_step(engine, input_ids, labels, step_seed=3, lr=1e-2)

    params = lora_params(engine)
    assert draws == [id(p) for p in params] * 3  # +eps, -2 eps, restore-and-update
    assert max(alive_at_draw) <= 1
    assert all(param.grad is None for param in params)


def test_gradient_estimate_and_cosine(engine):
    input_ids, labels = random_batch(300, seed=6)
    before = snapshot(engine)
    estimate = mezo.estimate_mezo_gradient(engine, input_ids, labels, 13, 1e-3)
    names = [name for name, _ in mezo.named_lora_parameters(engine)]
    assert list(estimate) == names
    zs = reference_directions(engine, 13)
    ratios = {float((e / z).median()) for e, z in zip(estimate.values(), zs, strict=True)}
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)  # one scalar times z
    for param, original in zip(lora_params(engine), before, strict=True):
        assert float((param.detach() - original).abs().max()) <= 1e-7

    exact = mezo.compute_exact_gradient(engine, input_ids, labels)
    cosine = mezo.cosine_similarity_to_true_gradient(engine, input_ids, labels, step_seed=13)
    assert cosine == pytest.approx(mezo.cosine_similarity(exact, estimate), rel=1e-6)
    # For a one-sample estimate, cos = |<g, z>| / (|g| |z|): positive, about 1/sqrt(n).
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in exact.values()))
    z_norm = math.sqrt(sum(float(z.double().pow(2).sum()) for z in zs))
    directional = sum(float((g.double() * z.double()).sum())
                      for g, z in zip(exact.values(), zs, strict=True))
    assert cosine == pytest.approx(abs(directional) / (norm * z_norm), rel=1e-2)
    assert 0 < cosine < 10 / math.sqrt(sum(z.numel() for z in zs))


def test_derive_step_seed_is_stable_and_distinct():
    assert mezo.derive_step_seed(0, 1) == mezo.derive_step_seed(0, 1)
    seeds = {mezo.derive_step_seed(seed, step) for seed in range(3) for step in range(100)}
    assert len(seeds) == 300 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("family", FAMILIES)
def test_mezo_step_runs_on_int4_bfloat16(family, packed_models):
    engine = load_engine_model(packed_models[family, "int4"], lora_spec=LORA, seed=2,
                               compute_dtype="bfloat16")
    before = snapshot(engine)
    input_ids, labels = random_batch(300, seed=7)
    result = mezo.run_mezo_step(engine, input_ids, labels, step_seed=1, lr=1e-2)
    assert all(math.isfinite(v) for v in (result.loss_plus, result.loss_minus, result.loss))
    assert all(p.dtype == torch.float32 for p in lora_params(engine))  # float32 masters
    assert any(not torch.equal(p, b) for p, b in zip(lora_params(engine), before, strict=True))
