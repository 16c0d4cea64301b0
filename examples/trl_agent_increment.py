# TRL 1.16's agent example (docs/source/grpo_trainer.md, "Agent Training" > "Environments": IncrementEnv, the
# environment owns the data and the reward) with two changes only: the import line (rloo's classes under TRL's
# names) and the model (a local path as the first argument; TRL's Hub id otherwise). Run:
#     python examples/trl_agent_increment.py /path/to/a/local/model
# tests/rollout/test_trl_agent_example.py runs this file unchanged on a Qwen3 and a Llama 3 chat template.
import random
import sys

from rloo import RLOOConfig as GRPOConfig, RLOOTrainer as GRPOTrainer

class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter

trainer = GRPOTrainer(
    model=sys.argv[1] if len(sys.argv) > 1 else "Qwen/Qwen3-0.6B",
    args=GRPOConfig(max_steps=1000, chat_template_kwargs={"enable_thinking": False}),
    environment_factory=IncrementEnv,
)
trainer.train()
