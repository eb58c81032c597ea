"""A throwaway plugin for the fsdp tests: rollout `hf_per_prompt`, the hf rollout with per-prompt randomness.

The plain hf rollout samples a whole batch from one RNG stream, so which rank samples which rows
changes every sample, and no two world sizes can be compared token for token. This rollout samples
each prompt's group (the rows sharing a uid) on its own, from an RNG seeded by the uid, so a row's
response depends only on the weights and its prompt: a run on 2 ranks and a run in 1 process sample
the same tokens and their metrics can be compared to float precision.

NANOVERL_TEST_ROLLOUT_SLEEP=seconds sleeps after each generate call (a slow run to kill mid-way).
"""

import hashlib
import os
import time

import torch

from nanoverl_core import hookimpl, responses_to_batch


@hookimpl
def register_rollouts(register):
    register("hf_per_prompt", "nanoverl_fsdp_testkit:make_rollout",
             description="test only: hf rollout, each prompt group sampled from an RNG seeded by its uid")


class PerPromptRollout:
    def __init__(self, config, workers):
        from nanoverl_hf.rollout import HFRollout

        self.inner = HFRollout(config, workers)
        self.returns_log_probs = self.inner.returns_log_probs
        self.sleep = float(os.environ.get("NANOVERL_TEST_ROLLOUT_SLEEP", "0"))

    def sync_weights(self, actor):
        self.inner.sync_weights(actor)

    def close(self):
        self.inner.close()

    def generate(self, batch, params):
        uids, responses, start = batch["uid"], [], 0
        while start < len(batch):
            end = start
            while end < len(batch) and uids[end] == uids[start]:
                end += 1
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(hashlib.sha256(str(uids[start]).encode()).hexdigest()[:15], 16))
                group = self.inner.generate(batch.index(slice(start, end)), params)
            responses += [ids[mask.bool()].tolist() for ids, mask in zip(group["responses"], group["response_mask"])]
            start = end
        time.sleep(self.sleep)
        return responses_to_batch(responses, eos_token_id=self.inner.eos_token_ids,
                                  pad_token_id=self.inner.tokenizer.pad_token_id, max_new_tokens=params.max_new_tokens)


def make_rollout(config, workers):
    return PerPromptRollout(config, workers)
