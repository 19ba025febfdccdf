"""training/samples.py: per-turn samples from handmade rollouts and their padded batch."""
import math

import pytest
import torch

from orchestrator.records import Rollout, Turn
from training.losses import PPOClipLoss
from training.samples import build_turn_samples, collate_samples, token_logprobs


def turn(index, prompt, response, mask, logprobs, valid=True):
    return Turn(index=index, prompt_ids=prompt, response_ids=response, loss_mask=mask,
                logprobs=logprobs, valid=valid)


def handmade_rollouts():
    a = Rollout(task_id="a", finished=True, turns=[
        turn(0, [1, 2, 3], [10, 11], [1, 1], [-0.5, -0.25]),
        turn(1, [1, 2, 3, 9], [99, 98], [1, 1], [-0.1, -0.1], valid=False),   # bad call
        turn(2, [1, 2, 3, 4, 5], [12, 13, 14], [1, 0, 1], [-1.0, -2.0, -3.0]),
    ])
    b = Rollout(task_id="b", finished=True, turns=[
        turn(0, [7], [20], [1], [-0.75]),
        turn(1, [7, 8], [21, 22], [0, 0], [-0.2, -0.2]),                        # nothing trainable
    ])
    return [a, b]


def test_every_valid_turn_becomes_a_sample_with_its_rollouts_advantage():
    samples = build_turn_samples(handmade_rollouts(), [1.5, -0.5])
    # a: turns 0 and 2 (turn 1's call was invalid); b: turn 0 (turn 1 has an all-zero mask)
    assert [(s.task_id, s.turn_index) for s in samples] == [("a", 0), ("a", 2), ("b", 0)]
    assert [s.advantage for s in samples] == [1.5, 1.5, -0.5]
    assert samples[1].prompt_ids == [1, 2, 3, 4, 5]
    assert samples[1].response_ids == [12, 13, 14]
    assert samples[1].loss_mask == [1, 0, 1]
    assert samples[1].old_logprobs == [-1.0, -2.0, -3.0]


def test_collate_right_pads_and_places_the_response():
    batch = collate_samples(build_turn_samples(handmade_rollouts(), [1.5, -0.5]), pad_token_id=0)
    # L = max(3 + 2, 5 + 3, 1 + 1) = 8
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11, 0, 0, 0],
                                        [1, 2, 3, 4, 5, 12, 13, 14],
                                        [7, 20, 0, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0],
                                             [1, 1, 1, 1, 1, 1, 1, 1],
                                             [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 0],
                                            [0, 0, 0, 0, 0, 1, 0, 1],
                                            [0, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.old_logprobs.tolist() == [[0, 0, 0, -0.5, -0.25, 0, 0, 0],
                                           [0, 0, 0, 0, 0, -1.0, -2.0, -3.0],
                                           [0, -0.75, 0, 0, 0, 0, 0, 0]]
    assert batch.advantages.tolist() == [1.5, 1.5, -0.5]
    assert batch.num_tokens == 2 + 2 + 1


def test_missing_logprobs_give_none_and_a_mix_is_refused():
    r = Rollout(task_id="c", turns=[turn(0, [1], [2], [1], None)])
    assert collate_samples(build_turn_samples([r], [0.0])).old_logprobs is None
    mixed = build_turn_samples([r] + handmade_rollouts()[:1], [0.0, 1.0])
    with pytest.raises(ValueError, match="some samples have old log-probs"):
        collate_samples(mixed)


@pytest.mark.parametrize("bad, message", [
    (turn(3, [], [2], [1], [-1.0]), "task 'x' turn 3: prompt_ids"),
    (turn(3, [1], None, None, None), "response_ids"),
    (turn(3, [1], [2, 3], [1], [-1.0, -1.0]), "loss_mask has length 1, response_ids 2"),
    (turn(3, [1], [2], [2], [-1.0]), "only 0 and 1"),
    (turn(3, [1], [2], [1], [-1.0, -2.0]), "logprobs has length 2"),
])
def test_malformed_turns_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        build_turn_samples([Rollout(task_id="x", turns=[bad])], [1.0])


def test_advantage_count_must_match_and_empty_batches_are_refused():
    with pytest.raises(ValueError, match="2 rollouts but 1 advantages"):
        build_turn_samples(handmade_rollouts(), [1.0])
    with pytest.raises(ValueError, match="no samples"):
        collate_samples([])


def test_token_logprobs_are_aligned_to_the_token_positions():
    # input [2, 1, 0]; logits at position 0 = [0, 0, 0] -> p(token 1) = 1/3
    # position 1 = [ln 2, 0, 0] -> softmax [2/4, 1/4, 1/4] -> p(token 0) = 1/2
    logits = torch.tensor([[[0.0, 0.0, 0.0], [math.log(2), 0.0, 0.0], [5.0, 5.0, 5.0]]])
    out = token_logprobs(logits, torch.tensor([[2, 1, 0]]))
    assert out.tolist()[0] == pytest.approx([0.0, -math.log(3), math.log(0.5)])


def test_prompt_tool_and_padding_tokens_get_no_gradient_end_to_end():
    # Samples -> batch -> token log-probs -> loss: only logits that predict a trainable
    # response token (position t - 1 for mask[t] = 1) may receive gradient.
    batch = collate_samples(build_turn_samples(handmade_rollouts(), [1.5, -0.5]))
    torch.manual_seed(0)
    logits = torch.randn(*batch.input_ids.shape, 128, requires_grad=True)   # [B, L, V]
    logp = token_logprobs(logits, batch.input_ids)                            # [B, L]
    loss, _ = PPOClipLoss()(logp, batch.old_logprobs, batch.advantages, batch.response_mask,
                            ref_logprobs=logp.detach() - 0.1)
    loss.backward()
    predicts_trainable = torch.zeros_like(batch.response_mask, dtype=torch.bool)
    predicts_trainable[:, :-1] = batch.response_mask[:, 1:].bool()            # [B, L]
    grad_norm = logits.grad.abs().sum(-1)                                     # [B, L]
    assert (grad_norm[~predicts_trainable] == 0).all()
    assert (grad_norm[predicts_trainable] > 0).all()
