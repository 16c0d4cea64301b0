"""rloo: REINFORCE Leave-One-Out post-training for language models.

    from rloo import RLOOConfig, RLOOTrainer

mirrors TRL's `RLOOConfig` and `RLOOTrainer`, so a TRL script ports by changing its import; the
script helpers TRL exports (`TrlParser`, `ScriptArguments`, `ModelConfig`, `get_peft_config`, ...) are here too.
"""

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
from rloo.config import ConfigError, RLOOConfig
from rloo.trainer import RLOOTrainer

__all__ = ["RLOOConfig", "RLOOTrainer", "ConfigError", "TrlParser", "ScriptArguments", "ModelConfig",
           "DatasetMixtureConfig", "get_dataset", "get_peft_config", "get_quantization_config", "get_kbit_device_map"]
__version__ = "0.1.0"
