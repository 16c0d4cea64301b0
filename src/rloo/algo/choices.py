"""The algorithm's choices, declared once: the math modules dispatch on them and the config checks them.

Plain tuples of names; `config_checks` validates the config's fields against them.
"""

ADVANTAGE_ESTIMATORS = ("rloo", "grpo", "drgrpo", "reinforce", "reinforce_pp")
KL_PENALTIES = ("sequence", "token", "loss")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGG_MODES = ("seq-mean-token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SAMPLER_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
