"""rloo: REINFORCE Leave-One-Out post-training for language models.

    from rloo import RLOOConfig, RLOOTrainer

mirrors TRL's `RLOOConfig` and `RLOOTrainer`, so a TRL script ports by changing its import; the
script helpers TRL exports (`TrlParser`, `ScriptArguments`, `ModelConfig`, `get_peft_config`, ...) are here too.
"""

from rloo._version import __version__
from rloo.compat.script_parser import TrlParser
from rloo.compat.scripts import (
    DatasetMixtureConfig,
    ModelConfig,
    ScriptArguments,
    get_dataset,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
)
from rloo.compat.trl_config import RLOOConfig  # rloo.config's, taking TRL's names too
from rloo.config import ConfigError
from rloo.trainer import RLOOTrainer

__all__ = ["__version__", "RLOOConfig", "RLOOTrainer", "ConfigError", "TrlParser", "ScriptArguments", "ModelConfig",
           "DatasetMixtureConfig", "get_dataset", "get_peft_config", "get_quantization_config", "get_kbit_device_map"]
