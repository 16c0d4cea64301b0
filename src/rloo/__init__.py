"""rloo: REINFORCE Leave-One-Out post-training for language models.

    from rloo import RLOOConfig, RLOOTrainer

mirrors TRL's `RLOOConfig` and `RLOOTrainer`, so a TRL script ports by changing its import.
"""

from .config import ConfigError, RLOOConfig
from .trainer import RLOOTrainer

__all__ = ["RLOOConfig", "RLOOTrainer", "ConfigError"]
__version__ = "0.1.0"
