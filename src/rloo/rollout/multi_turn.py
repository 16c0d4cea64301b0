"""Step 1 for agents: multi-turn rollouts with tools and environments (TRL's `tools=`,
`environment_factory=`, `rollout_func=`), on top of any `Sampler`.

A trajectory is one completion: K trajectories per prompt, scored as a whole and baselined
leave-one-out like single completions. Turn 1 samples K completions of each prompt. Each
trajectory whose turn ended (EOS) with tool calls has them run (`tools.run_tool_calls`), the
tool messages' tokens appended (`tools.tool_suffix_ids`, rendered for the new messages only), and
is sampled again, with K = 1, on its whole token list (`turns.TurnSampler`: the fast sampler keeps each
trajectory's KV cache across its tool calls and runs only the tokens added since); this repeats until a turn makes no call,
`max_tool_calling_iterations` rounds of calls have run, or the completion budget is spent
(`max_completion_length` counts every completion token, the model's and the tools').

Token in, token out: a trajectory's completion ids are exactly the ids the sampler drew and the
ids appended, in order; no earlier turn is rendered or tokenized again. `tool_mask` is 1 at the
model's tokens and 0 at the tools' (TRL's `env_mask`): the tools' tokens stay in the forward pass as
context but carry no loss, KL, entropy or length (`Rollout.loss_mask`). The sampler's per-token
log-probs of the model's tokens are kept, with zeros at tool positions.

The episode reward is what the reward functions (and an environment's `get_reward`) return for the
whole trajectory; an environment giving one reward per turn returns a list, summed here
(`episode_reward`). A per-turn credit scheme (a discounted return per turn, or verl-style rewards
placed on each turn's last token) would replace that sum with (B, C) per-token rewards in
`RolloutCollector.collect`, where `token_advantages` already carries per-token advantages.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rloo.config import ConfigError
from rloo.data.dataset_rows import PLACEHOLDER_PROMPT
from rloo.data.prompts import fit_prompt_lengths, is_conversational, tokenize_prompts
from rloo.generation.base import SampledBatch, left_pad
from rloo.rewards.scoring import shorten
from rloo.rollout.rollout_func import extra_field, token_logprobs
from rloo.rollout.turn_records import TurnRecord, record_results, record_turn
from rloo.rollout.turns import TurnSampler, turn_sampler
from rloo.tools import environment_tools, prepare_tool_calls, run_tool_calls, tool_schemas, tool_suffix_ids
from rloo.tools.parsing import ToolCall

logger = logging.getLogger(__name__)
ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")  # TRL's required keys


@dataclass
class Episodes:
    """The non-tensor side of B trajectories, one entry each (row p*K + k)."""

    prompts: list  # each trajectory's prompt as the policy saw it (an environment's reset text appended)
    messages: list[list[dict[str, Any]] | None]  # the completion as chat messages; None for rollout_func rows
    turns: list[list[TurnRecord] | None] | None = None  # each trajectory turn by turn (`turn_records`); None: rollout_func rows
    environments: list[Any] | None = None  # the environment instance of each trajectory
    reward_arguments: dict[str, list] = field(default_factory=dict)  # more per-trajectory reward-function arguments
    tool_calls: int = 0
    tool_failures: int = 0
    logs_tool_metrics: bool = True  # False for a rollout_func's trajectories: rloo ran no tools

    def first(self, count: int) -> "Episodes":
        """The first `count` trajectories (evaluation drops the rows it sampled as filler)."""
        cut = {k: v and v[:count] for k, v in vars(self).items() if k in ("prompts", "messages", "turns", "environments")}
        return dataclasses.replace(self, **cut, reward_arguments={k: v[:count] for k, v in self.reward_arguments.items()})

    def reward_inputs(self, completions: list) -> tuple[list, list, dict[str, list]]:
        """What reward functions get (step 2): each prompt as the policy saw it, each completion as its messages
        where the prompt is a conversation (else as given), and rollout_func's extra fields and `environments`."""
        completions = [given if messages is None or not is_conversational(prompt) else messages
                       for given, messages, prompt in zip(completions, self.messages, self.prompts)]
        environments = {} if self.environments is None else {"environments": self.environments}
        return self.prompts, completions, {**self.reward_arguments, **environments}

    def metrics(self) -> dict[str, float]:
        """TRL's tools/call_frequency (calls per trajectory) and tools/failure_frequency (failed / calls); none for a
        rollout_func's trajectories."""
        if not self.logs_tool_metrics:
            return {}
        count = max(len(self.prompts), 1)
        return {"tools/call_frequency": self.tool_calls / count,
                "tools/failure_frequency": self.tool_failures / self.tool_calls if self.tool_calls else 0.0}


@dataclass
class Trajectory:
    """One growing completion: ids, 1 at the model's tokens, the sampler's log-probs, the messages."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ended: bool = False  # the last turn ended with an end id or stop string (not cut by the budget)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)  # what the logs show: each turn's text, calls and results

    def add(self, ids: list[int], from_model: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.tool_mask += [int(from_model)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def episode_reward(value: Any) -> float | None:
    """One trajectory's reward from what an environment returned: a number, or a list of per-turn rewards (summed)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return float(sum(value))
    return float(value)


def environment_reward_function(environment_class: type) -> Callable:
    """A reward function scoring trajectories whose environment is an `environment_class` with its
    `get_reward()` (None for the others), named after the class, as TRL adds one."""
    if inspect.iscoroutinefunction(environment_class.get_reward):
        async def reward(environments, **kwargs):
            return [episode_reward(await e.get_reward()) if type(e) is environment_class else None for e in environments]
    else:
        def reward(environments, **kwargs):
            return [episode_reward(e.get_reward()) if type(e) is environment_class else None for e in environments]
    reward.__name__ = environment_class.__name__
    return reward


@dataclass
class MultiTurnRollout:
    """Turns of sampling and tool calls; `sample` is step 1 (`prompt_stages.PromptStage`) when tools,
    environments or a rollout_func are given."""

    tokenizer: Any
    max_completion_length: int
    max_prompt_length: int | None  # None: prompts are not truncated
    chat_template_kwargs: dict[str, Any] | None
    end_ids: set[int]
    tools: list[Callable] = field(default_factory=list)
    environment_factories: dict[Any, Callable] | None = None  # {None: factory} for one, or {name: factory}
    rollout_func: Callable | None = None
    max_tool_calling_iterations: int | None = None
    tool_call_timeout: float = 30.0
    truncate_prompts: str = "left"  # over max_prompt_length: "left" keeps the end (warned once), "error" names the row
    warned_prompt_cut: bool = False  # the truncation warning was given (it is given once)
    trainer: Any = None  # what rollout_func receives as its second argument; the trainer sets itself
    event_loop: Any = None  # the run's `rloo.event_loop.EventLoop` for async tools (None: a loop per round)
    environment_pool: dict[Any, list] = field(default_factory=dict)  # instances reused across batches, per name
    schemas: dict[Any, list[dict]] = field(default_factory=dict)  # the tool schemas each environment's prompts get
    pending_calls: dict[int, list[ToolCall]] = field(default_factory=dict)  # each trajectory's calls of its last turn
    environments: list[Any] | None = None  # the last rollout's environment of each trajectory (TRL's trainer.environments)
    image_column = None  # prompts with images do not run here (`prompt_stages.check_image_prompts`)
    call_format: Any = None  # how the model's turns are parsed (tools.formats.CallFormat), read from the chat template

    def __post_init__(self) -> None:
        if self.rollout_func is not None:
            return
        for name, factory in (self.environment_factories or {None: None}).items():
            tools = list(self.tools)
            if factory is not None:  # one probe instance per environment: its methods give the schemas
                instance = factory()
                if not callable(getattr(instance, "reset", None)):
                    raise ConfigError(f"the environment {type(instance).__name__} (environment_factory"
                                      f"{'' if name is None else f'[{name!r}]'}) has no `reset` method; every "
                                      f"environment needs reset(**row), which may return text for the prompt.")
                self.environment_pool[name] = [instance]
                tools += environment_tools(instance)
            self.schemas[name] = tool_schemas(tools)
        if any(self.schemas.values()):  # an environment without methods needs no tool template
            self.call_format = prepare_tool_calls(self.tokenizer, self.schemas, self.end_ids, self.chat_template_kwargs)

    def for_sampler(self) -> "MultiTurnRollout":
        """A copy for `async_rollouts`' sampler (a thread or a forked process): the same tools and factories,
        its own environments (a fresh pool: no instance is ever used by the sampler and the trainer's own
        rollouts or evaluation at once) and its own per-rollout state."""
        return dataclasses.replace(self, environment_pool={}, schemas={}, pending_calls={}, environments=None)

    @property
    def multi_environment(self) -> bool:
        return self.environment_factories is not None and None not in self.environment_factories

    def listed_tools(self) -> list[Callable]:
        """The given tools, then each environment class's, bound to its first instance, each name once (TRL's
        `trainer.tools`)."""
        tools = {tool.__name__: tool for tool in self.tools}
        for pool in self.environment_pool.values():
            for tool in environment_tools(pool[0]):
                tools.setdefault(tool.__name__, tool)
        return list(tools.values())

    def environment_classes(self) -> list[type]:
        """The class of each environment, once, in the order given."""
        return list(dict.fromkeys(type(pool[0]) for pool in self.environment_pool.values()))

    # ------------------------------------------------------------------ the rollout

    def sample(self, rows: list[dict[str, Any]], num_generations: int,
               sample_policy: Callable[..., SampledBatch]) -> tuple[SampledBatch, Episodes]:
        """The B = len(rows) * num_generations trajectories of `rows`; `sample_policy` samples each turn
        (`prompt_stages.SamplePolicy`)."""
        if self.rollout_func is not None:
            return self.run_rollout_func(rows, num_generations, self.tokenizer.pad_token_id)
        self.pending_calls.clear()
        names = [self.environment_name(row) for row in rows for _ in range(num_generations)]
        environments, observations = self.reset_environments(rows, names, num_generations)
        self.environments = environments
        prompts = [self.observed_prompt(rows[i // num_generations]["prompt"], observation)
                   for i, observation in enumerate(observations)]
        prompt_ids = self.tokenize(prompts, names)
        toolboxes = self.toolboxes(environments, len(prompts))
        trajectories = [Trajectory(ids) for ids in prompt_ids]
        groups_alike = all(prompt_ids[i] == prompt_ids[i - i % num_generations] for i in range(len(prompt_ids)))
        turns = turn_sampler(sample_policy)  # the fast sampler keeps each trajectory's cache across its turns
        first = (turns.start(prompt_ids[::num_generations], num_generations) if groups_alike
                 else turns.start(prompt_ids, 1))
        self.take_turn(trajectories, list(range(len(trajectories))), first)
        episodes = Episodes(prompts, [t.messages for t in trajectories], [t.turns for t in trajectories], environments)
        self.call_tools(turns, trajectories, toolboxes, episodes)
        return self.batch(trajectories, self.tokenizer.pad_token_id, first), episodes

    def call_tools(self, turns: TurnSampler, trajectories: list[Trajectory],
                   toolboxes: list[dict[str, Callable]], episodes: Episodes) -> None:
        """The tool-calling rounds: run the calls, append their results, sample the next turn."""
        active = [i for i, t in enumerate(trajectories) if t.ended and t.messages[-1].get("tool_calls")]
        rounds = 0
        while active and (self.max_tool_calling_iterations is None or rounds < self.max_tool_calling_iterations):
            rounds += 1
            calls = [self.pending_calls[i] for i in active]
            results = run_tool_calls(calls, [toolboxes[i] for i in active], self.tool_call_timeout,
                                     self.event_loop)
            continuing = []
            for i, turn_calls, turn_results in zip(active, calls, results):
                episodes.tool_calls += len(turn_calls)
                episodes.tool_failures += sum(result.failed for result in turn_results)
                messages = [{"role": "tool", "name": r.name, "content": r.content} for r in turn_results]
                suffix = self.suffix_ids(messages)
                if len(trajectories[i].ids) + len(suffix) >= self.max_completion_length:
                    trajectories[i].ended = False  # no room for the results: cut by the budget (truncated), not ended
                    continue
                trajectories[i].add(suffix, from_model=False)
                trajectories[i].messages.extend(messages)
                record_results(trajectories[i].turns, turn_results)
                continuing.append(i)
            if not continuing:
                break
            budget = max(self.max_completion_length - len(trajectories[i].ids) for i in continuing)
            sampled = turns.resume(continuing, [trajectories[i].prompt_ids + trajectories[i].ids for i in continuing],
                                   max_new_tokens=budget)
            self.take_turn(trajectories, continuing, sampled)
            active = [i for i in continuing if trajectories[i].ended and trajectories[i].messages[-1].get("tool_calls")]

    def take_turn(self, trajectories: list[Trajectory], indices: list[int], sampled: SampledBatch) -> None:
        """Append each sampled row (cut to the trajectory's remaining budget) and parse its tool calls."""
        for row, i in enumerate(indices):
            trajectory = trajectories[i]
            room = self.max_completion_length - len(trajectory.ids)
            length = int(sampled.completion_mask[row].sum())
            ids = sampled.completion_ids[row, :length].tolist()[:room]
            logprobs = None if sampled.logprobs is None else sampled.logprobs[row, :len(ids)].tolist()
            trajectory.add(ids, from_model=True, logprobs=logprobs)
            trajectory.ended = bool(sampled.has_eos[row]) and len(ids) == length
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            content, calls = self.call_format.parse(self.tokenizer.decode(ids)) if self.call_format else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content if calls else text}
            if calls:
                message["tool_calls"] = [call.as_message_call() for call in calls]
            trajectory.messages.append(record_turn(trajectory.turns, message, calls))
            self.pending_calls[i] = calls

    def batch(self, trajectories: list[Trajectory], pad_id: int, first: SampledBatch) -> SampledBatch:
        """The trajectories as one padded `SampledBatch`, with `tool_mask`."""
        prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in trajectories], pad_id)
        width = max(1, max(len(t.ids) for t in trajectories))
        completion_ids = torch.full((len(trajectories), width), pad_id, dtype=torch.long)
        completion_mask = torch.zeros((len(trajectories), width), dtype=torch.long)
        tool_mask = torch.zeros((len(trajectories), width), dtype=torch.long)
        logprobs = torch.zeros((len(trajectories), width), dtype=torch.float32)
        for row, t in enumerate(trajectories):
            completion_ids[row, :len(t.ids)] = torch.tensor(t.ids, dtype=torch.long)
            completion_mask[row, :len(t.ids)] = 1
            tool_mask[row, :len(t.ids)] = torch.tensor(t.tool_mask, dtype=torch.long)
            logprobs[row, :len(t.ids)] = torch.tensor(t.logprobs, dtype=torch.float32)
        device = first.completion_ids.device
        return SampledBatch(prompt_ids.to(device), prompt_mask.to(device), completion_ids.to(device),
                            completion_mask.to(device), torch.tensor([t.ended for t in trajectories], device=device),
                            logprobs=None if first.logprobs is None else logprobs.to(device),
                            logprobs_from_policy=first.logprobs_from_policy, tool_mask=tool_mask.to(device))

    # ------------------------------------------------------------------ prompts, environments, tools

    def environment_name(self, row: dict[str, Any]) -> Any:
        if not self.multi_environment:
            return None
        name = row.get("environment")
        if name not in self.environment_factories:
            raise ValueError(f"Example has `environment={name!r}`, which is not among the environments passed to "
                             f"`environment_factory`. Expected one of: {list(self.environment_factories)}.")
        return name

    def reset_environments(self, rows: list[dict[str, Any]], names: list[Any], k: int) -> tuple[list[Any] | None, list]:
        """One environment per trajectory, drawn from the pool (more made when a batch needs more), each reset
        with its row (without the `environment` column when a dict of factories chose it); and what each
        reset returned (None without environments)."""
        if self.environment_factories is None:
            return None, [None] * len(names)
        handed_out: dict[Any, int] = {}
        environments = []
        for i, name in enumerate(names):
            pool = self.environment_pool[name]
            index = handed_out.get(name, 0)
            if index == len(pool):
                pool.append(self.environment_factories[name]())
            handed_out[name] = index + 1
            environments.append(pool[index])
        observations = []
        for i, environment in enumerate(environments):
            row = rows[i // k]
            kwargs = {key: value for key, value in row.items() if key != "environment" or not self.multi_environment}
            if kwargs.get("prompt") == PLACEHOLDER_PROMPT:
                kwargs.pop("prompt")
            observations.append(environment.reset(**kwargs))
        return environments, observations

    @staticmethod
    def observed_prompt(prompt: Any, observation: Any) -> Any:
        """The prompt with the text an environment's `reset` returned appended to its last message."""
        if observation is None:
            return prompt
        if not is_conversational(prompt):
            return prompt + str(observation)
        return prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + str(observation)}]

    def tokenize(self, prompts: list, names: list[Any]) -> list[list[int]]:
        """Each prompt rendered with its environment's tool schemas (`tools=` of the chat template)."""
        if not all(is_conversational(p) for p in prompts):
            raise ConfigError("tools and environments need conversational prompts (lists of {'role', 'content'} "
                              "messages): the chat template renders the tools and the tool messages. Convert the "
                              "'prompt' column, e.g. [{'role': 'user', 'content': text}].")
        ids: list[list[int]] = [[] for _ in prompts]
        for name in dict.fromkeys(names):
            rows = [i for i, n in enumerate(names) if n == name]
            kwargs = {**(self.chat_template_kwargs or {}), "tools": self.schemas[name] or None}
            for i, row_ids in zip(rows, tokenize_prompts([prompts[i] for i in rows], self.tokenizer, None, kwargs)):
                ids[i] = row_ids
        # The length limit sees the whole prompt: schemas and reset text included (the dataset check could not).
        ids, cut = fit_prompt_lengths(ids, self.max_prompt_length, self.truncate_prompts, lambda i: (
            f"the prompt of trajectory {i} ({shorten(prompts[i][-1]['content'], 80)!r}"
            f"{'' if names[i] is None else f', environment {names[i]!r}'})"))
        if cut and not self.warned_prompt_cut:
            self.warned_prompt_cut = True  # once per run: it repeats at every batch with such prompts
            logger.warning("%d of %d prompts (with their tool schemas and environment text) are longer than "
                           "max_prompt_length=%d tokens; they are truncated from the left, which drops the system "
                           "message and the tool schemas first (truncate_prompts='left'; warned once).", cut,
                           len(ids), self.max_prompt_length)
        return ids

    def toolboxes(self, environments: list[Any] | None, count: int) -> list[dict[str, Callable]]:
        """Each trajectory's tools by name: the standalone tools and its environment's methods."""
        boxes = []
        for i in range(count):
            tools = list(self.tools) + (environment_tools(environments[i]) if environments else [])
            boxes.append({tool.__name__: tool for tool in tools})
        return boxes

    def suffix_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        opens = bool(self.call_format and self.call_format.end_opens_next)  # GLM-4: the end is <|observation|>
        return tool_suffix_ids(self.tokenizer, messages, self.end_ids, self.chat_template_kwargs, opens)

    # ------------------------------------------------------------------ rollout_func

    def run_rollout_func(self, rows: list[dict[str, Any]], k: int, pad_id: int) -> tuple[SampledBatch, Episodes]:
        """TRL's `rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", ...}`: one prompt per
        trajectory; `env_mask` (1 model token, 0 environment token) becomes `tool_mask`, and every key past the
        required three reaches the reward functions."""
        prompts = [row["prompt"] for row in rows for _ in range(k)]
        output = self.rollout_func(prompts, self.trainer)
        missing = sorted(set(ROLLOUT_FUNC_KEYS) - set(output))
        if missing:
            raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
        completions, logprobs = output["completion_ids"], output["logprobs"]
        if len(output["prompt_ids"]) != len(prompts) or len(completions) != len(prompts):
            raise ValueError(f"rollout_func returned {len(output['prompt_ids'])} prompt_ids and {len(completions)} "
                             f"completion_ids for {len(prompts)} prompts (one per generation: {len(rows)} rows x "
                             f"num_generations={k}).")
        env_mask = output.get("env_mask")
        trajectories = []
        for i, (prompt_ids, ids) in enumerate(zip(output["prompt_ids"], completions)):
            t = Trajectory(list(prompt_ids))
            t.ids, t.tool_mask = list(ids), list(env_mask[i]) if env_mask is not None else [1] * len(ids)
            t.logprobs = token_logprobs(logprobs[i] if logprobs is not None else None, len(ids))
            if not (len(t.tool_mask) == len(t.logprobs) == len(t.ids)):
                raise ValueError(f"rollout_func row {i}: completion_ids, env_mask and logprobs must have the same length "
                                 f"(got {len(t.ids)}, {len(t.tool_mask)} and {len(t.logprobs)}).")
            t.ended = any(token in self.end_ids for token in t.ids)
            trajectories.append(t)
        has_logprobs = logprobs is not None and all(row is not None for row in logprobs)
        template = SampledBatch(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.long),
                                torch.zeros(1, 1), torch.zeros(1, dtype=torch.bool),
                                logprobs=torch.zeros(1, 1) if has_logprobs else None, logprobs_from_policy=False)
        extras = {key: extra_field(key, value, len(prompts)) for key, value in output.items() if key not in ROLLOUT_FUNC_KEYS}
        return self.batch(trajectories, pad_id, template), Episodes(prompts=prompts, messages=[None] * len(prompts),
                                                                     reward_arguments=extras, logs_tool_metrics=False)
